// The schedule of device operations across hosts (see net_plan.hpp).
#include "collectives/net_plan.hpp"

#include <algorithm>
#include <vector>

#include "collectives/comm.hpp"
#include "runtime/log.hpp"

namespace coccl::detail {

std::error_code make_net_plan(const OpArgs& a, int me, int n, std::size_t slot,
                              kernels::NetPlan& p) {
  const std::size_t elt = size_of(a.type);
  p = kernels::NetPlan{};
  auto seg = [](const void* dev, std::uint64_t bytes, int repeat, int peer) {
    return kernels::NetSeg{static_cast<char*>(const_cast<void*>(dev)), bytes,
                           static_cast<std::uint32_t>(repeat), peer, 0};
  };
  if (a.kind == OpKind::p2p || a.kind == OpKind::all_to_allv) {
    p.layout = kernels::NetLayout::pairs;
    p.chunk = slot / static_cast<std::size_t>(n) / 64 * 64;
    std::vector<std::uint64_t> next_in(n, 0), next_out(n, 0);
    auto add = [&](bool send, const void* buf, std::uint64_t bytes, int peer) -> bool {
      if (bytes == 0) return true;  // skipped alike by both sides
      std::uint32_t& used = send ? p.nin : p.nout;
      if (used == kernels::net_max_segs) return false;
      kernels::NetSeg s = seg(buf, bytes, 1, peer);
      std::uint64_t& next = (send ? next_in : next_out)[peer];
      if (next > UINT32_MAX) return false;
      s.first_round = static_cast<std::uint32_t>(next);
      next += kernels::net_rounds_of(bytes, p.chunk);
      p.rounds = std::max(p.rounds, next);
      (send ? p.in : p.out)[used++] = s;
      return true;
    };
    bool fits = true;
    if (a.kind == OpKind::p2p) {
      for (const Transfer& o : a.p2p)
        fits = fits && add(o.is_send, o.buffer, o.count * size_of(o.type), o.peer);
    } else {
      for (int q = 0; q < n; ++q) {
        fits = fits && add(true, static_cast<const char*>(a.send) + a.send_displs[q] * elt,
                           a.send_counts[q] * elt, q);
        fits = fits && add(false, static_cast<char*>(a.recv) + a.recv_displs[q] * elt,
                           a.recv_counts[q] * elt, q);
      }
    }
    if (!fits) {
      COCCL_WARN(coll, me,
                 "%s across hosts takes at most %d non-empty transfers each way (and fewer than "
                 "2^32 rounds a peer)",
                 name_of(a.kind), kernels::net_max_segs);
      return make_error_code(errc::unsupported);
    }
    return {};
  }
  p.layout = kernels::NetLayout::packed;
  const std::uint64_t L = a.count * elt;
  p.piece_bytes = L;
  const bool elementwise =
      a.kind == OpKind::all_reduce || a.kind == OpKind::broadcast || a.kind == OpKind::reduce;
  p.chunk = (elementwise ? slot : slot / static_cast<std::size_t>(n)) / 64 * 64;
  p.rounds = (L + p.chunk - 1) / p.chunk;
  const bool root = me == a.root;
  auto in = [&](const void* dev, int repeat) { p.in[p.nin++] = seg(dev, L, repeat, -1); };
  auto out = [&](void* dev, int repeat) { p.out[p.nout++] = seg(dev, L, repeat, -1); };
  switch (a.kind) {
    case OpKind::all_reduce:
      in(a.send, 1), out(a.recv, 1);
      break;
    case OpKind::broadcast:
      if (root) in(a.send, 1);
      out(a.recv, 1);
      break;
    case OpKind::reduce:
      in(a.send, 1);
      if (root) out(a.recv, 1);
      break;
    case OpKind::all_gather:
      in(a.send, 1), out(a.recv, n);
      break;
    case OpKind::reduce_scatter:
      in(a.send, n), out(a.recv, 1);
      break;
    case OpKind::all_to_all:
      in(a.send, n), out(a.recv, n);
      break;
    case OpKind::gather:
      in(a.send, 1);
      if (root) out(a.recv, n);
      break;
    case OpKind::scatter:
      if (root) in(a.send, n);
      out(a.recv, 1);
      break;
    default:
      return make_error_code(errc::unsupported);
  }
  return {};
}

OpArgs net_round(const kernels::NetPlan& p, const OpArgs& op, char* in, char* out,
                 std::uint64_t k) {
  OpArgs a;
  a.kind = op.kind == OpKind::all_to_allv ? OpKind::p2p : op.kind;
  a.type = op.type;
  a.op = op.op;
  a.root = op.root;
  if (p.layout == kernels::NetLayout::pairs) {
    a.type = DataType::uint8;
    auto add = [&](const kernels::NetSeg* segs, std::uint32_t nsegs, bool send, char* area) {
      for (std::uint32_t s = 0; s < nsegs; ++s) {
        std::uint64_t stage_off = 0, dev_off = 0, len = 0;
        if (!kernels::net_piece(p, segs[s], s, 0, k, stage_off, dev_off, len)) continue;
        a.p2p.push_back(Transfer{send, area + stage_off, len, DataType::uint8, segs[s].peer});
      }
    };
    add(p.in, p.nin, true, in);
    add(p.out, p.nout, false, out);
    return a;
  }
  const std::uint64_t start = k * p.chunk;
  const std::uint64_t len = std::min<std::uint64_t>(p.chunk, p.piece_bytes - start);
  a.send = in;
  a.recv = out;
  a.count = len / size_of(op.type);
  return a;
}

}  // namespace coccl::detail
