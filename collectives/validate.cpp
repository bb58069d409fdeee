#include <cstdint>
#include <limits>
#include <string>

#include "collectives/comm.hpp"

namespace coccl::detail {
namespace {

bool reduces(OpKind k) {
  return k == OpKind::all_reduce || k == OpKind::reduce || k == OpKind::reduce_scatter;
}

bool rooted(OpKind k) {
  return k == OpKind::broadcast || k == OpKind::reduce || k == OpKind::gather ||
         k == OpKind::scatter;
}

}  // namespace

const char* name_of(OpKind k) noexcept {
  switch (k) {
    case OpKind::all_reduce:
      return "all_reduce";
    case OpKind::broadcast:
      return "broadcast";
    case OpKind::reduce:
      return "reduce";
    case OpKind::all_gather:
      return "all_gather";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::all_to_all:
      return "all_to_all";
    case OpKind::all_to_allv:
      return "all_to_allv";
    case OpKind::gather:
      return "gather";
    case OpKind::scatter:
      return "scatter";
    case OpKind::p2p:
      return "send_recv";
    case OpKind::barrier:
      return "barrier";
  }
  return "unknown";
}

std::string validate(const OpArgs& a, int rank, int n) {
  const auto max = std::numeric_limits<std::size_t>::max();
  if (a.kind == OpKind::barrier) return {};
  if (a.kind == OpKind::p2p) {
    for (const auto& p : a.p2p) {
      if (!is_valid(p.type)) return "unknown data type " + std::to_string(int(p.type));
      if (p.peer < 0 || p.peer >= n)
        return "peer " + std::to_string(p.peer) + " out of range [0, " + std::to_string(n) + ")";
      if (p.count > max / size_of(p.type)) return "count overflows";
      if (p.count && !p.buffer) return "null buffer";
    }
    // Transfers to self are matched in order within the group.
    std::vector<std::size_t> self_send, self_recv;
    for (const auto& p : a.p2p)
      if (p.peer == rank) (p.is_send ? self_send : self_recv).push_back(p.count * size_of(p.type));
    if (self_send != self_recv) return "sends to self do not match receives from self";
    return {};
  }
  if (!is_valid(a.type)) return "unknown data type " + std::to_string(static_cast<int>(a.type));
  if (reduces(a.kind) && !is_valid(a.op))
    return "unknown reduction operator " + std::to_string(static_cast<int>(a.op));
  if (rooted(a.kind) && (a.root < 0 || a.root >= n))
    return "root " + std::to_string(a.root) + " out of range [0, " + std::to_string(n) + ")";
  const std::size_t elt = size_of(a.type);
  if (a.kind == OpKind::all_to_allv) {
    const std::size_t un = static_cast<std::size_t>(n);
    if (a.send_counts.size() != un || a.send_displs.size() != un || a.recv_counts.size() != un ||
        a.recv_displs.size() != un)
      return "counts and displacements need one entry per rank";
    bool any_send = false, any_recv = false;
    for (int p = 0; p < n; ++p) {
      if (a.send_counts[p] > max / elt - a.send_displs[p] || a.send_displs[p] > max / elt ||
          a.recv_displs[p] > max / elt || a.recv_counts[p] > max / elt - a.recv_displs[p])
        return "count plus displacement overflows";
      any_send |= a.send_counts[p] != 0;
      any_recv |= a.recv_counts[p] != 0;
    }
    if (a.send_counts[rank] != a.recv_counts[rank])
      return "send_counts[rank] must equal recv_counts[rank]";
    if ((any_send && !a.send) || (any_recv && !a.recv)) return "null buffer";
    if (a.send && a.send == a.recv && any_send) return "all_to_allv cannot run in place";
    return {};
  }
  // Buffers of n*count elements exist for these.
  bool scaled = a.kind == OpKind::all_gather || a.kind == OpKind::reduce_scatter ||
                a.kind == OpKind::all_to_all || a.kind == OpKind::gather ||
                a.kind == OpKind::scatter;
  // Multiplied with an overflow check rather than divided: every operation passes here.
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(a.count, elt * (scaled ? static_cast<std::size_t>(n) : 1), &bytes))
    return "count " + std::to_string(a.count) + " overflows the buffer size";
  if (a.count == 0) return {};
  bool needs_send = !(a.kind == OpKind::scatter && rank != a.root) &&
                    !(a.kind == OpKind::broadcast && rank != a.root);
  bool needs_recv = !(a.kind == OpKind::reduce && rank != a.root) &&
                    !(a.kind == OpKind::gather && rank != a.root);
  if (needs_send && !a.send) return "null send buffer";
  if (needs_recv && !a.recv) return "null receive buffer";
  if (a.kind == OpKind::all_to_all && a.send == a.recv && n > 1)
    return "all_to_all cannot run in place";
  return {};
}

std::uint32_t fingerprint_of(const OpArgs& a) {
  // A hash of the fields every rank must agree on, a whole field per step (multiply and fold):
  // every operation computes it, so its dependency chain is kept short. CommImpl reuses the last
  // result while kind, type, op, root and count stay the same: read no other field.
  std::uint64_t fields[5] = {static_cast<std::uint64_t>(a.kind), 0, 0, 0, 0};
  switch (a.kind) {
    case OpKind::p2p:
    case OpKind::barrier:
      break;
    case OpKind::all_to_allv:
      fields[1] = static_cast<std::uint64_t>(a.type);
      break;
    default:
      fields[1] = static_cast<std::uint64_t>(a.type);
      fields[2] = a.count;
      fields[3] = static_cast<std::uint64_t>(a.root);
      if (reduces(a.kind)) fields[4] = static_cast<std::uint64_t>(a.op);
  }
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (std::uint64_t f : fields) {
    h = (h ^ f) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return static_cast<std::uint32_t>(h);
}

}  // namespace coccl::detail
