// Fuzz target: the argument checks every operation passes before it is queued
// (detail::validate), and the operation headers ranks exchange and compare before any data
// (detail::make_op_header, compare_op_headers, the compact form's round trip and decoding: the
// peer's header is the fuzzed part). Buffers are addresses that are never dereferenced: the checks
// look only at null-ness and identity. An operation that validate() accepts must have buffer sizes
// that fit in size_t, and a header must agree with itself.
#include "collectives/comm.hpp"
#include "collectives/op_check.hpp"
#include "tests/fuzz/fuzz_input.hpp"

using namespace coccl;
using namespace coccl::detail;

namespace {

// One of a few distinct fake buffers, or null.
void* buffer(std::uint8_t pick) {
  static std::uint64_t places[3];
  return pick % 4 == 0 ? nullptr : &places[pick % 4 - 1];
}

std::size_t count(fuzz::Input& in) {
  // Mostly small counts; a set top bit asks for a full 64-bit one (overflow territory).
  const auto small = in.get<std::uint8_t>();
  return small & 0x80 ? in.get<std::uint64_t>() : small;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const int n = 1 + in.get<std::uint8_t>() % 8;
  const int rank = in.get<std::uint8_t>() % n;
  OpArgs a;
  // Kinds, types and operators arrive as raw integers through the C API: any value.
  a.kind = static_cast<OpKind>(in.get<std::int8_t>());
  a.type = static_cast<DataType>(in.get<std::int8_t>());
  a.op = static_cast<ReduceOp>(in.get<std::int8_t>());
  a.root = in.get<std::int8_t>();
  a.count = count(in);
  a.send = buffer(in.get<std::uint8_t>());
  a.recv = buffer(in.get<std::uint8_t>());
  const auto shape = in.get<std::uint8_t>();
  if (a.kind == OpKind::all_to_allv) {
    // Usually one entry per rank; sometimes one too few or too many.
    const std::size_t entries = static_cast<std::size_t>(n) + (shape % 8 == 0) - (shape % 8 == 1);
    for (auto* v : {&a.send_counts, &a.send_displs, &a.recv_counts, &a.recv_displs})
      for (std::size_t i = 0; i < entries; ++i) v->push_back(count(in));
  }
  if (a.kind == OpKind::p2p) {
    for (int i = 0; i < shape % 8; ++i) {
      const auto flags = in.get<std::uint8_t>();
      a.p2p.push_back(Transfer{(flags & 1) != 0, buffer(flags >> 1), count(in),
                               static_cast<DataType>(in.get<std::int8_t>()),
                               in.get<std::int8_t>()});
    }
  }
  const std::string why = validate(a, rank, n);
  fingerprint_of(a);
  if (!why.empty()) return 0;
  // What was accepted has a size in bytes that fits.
  if (a.kind != OpKind::p2p && a.kind != OpKind::barrier && a.kind != OpKind::all_to_allv &&
      a.count > SIZE_MAX / size_of(a.type))
    fuzz::violated("validate accepted a count whose bytes overflow");
  const int peer = in.get<std::uint8_t>() % n;
  const OpHeader mine = make_op_header(a, in.get<std::uint8_t>(), in.get<std::uint8_t>(), peer);
  // Collectives send and expect the same from every peer: the peer's header equals this one.
  // (Messages and all_to_allv are directional: a header is compared with the mirror one.)
  if (a.kind != OpKind::p2p && a.kind != OpKind::all_to_allv &&
      !compare_op_headers(mine, mine, rank, peer).empty())
    fuzz::violated("a collective's header disagrees with itself");
  // A header that travels compact comes back whole.
  if (compactable(mine)) {
    std::byte head[compact_header_bytes];
    write_compact_header(mine, 0x5eedu, head);
    bool joined = false;
    std::size_t header_bytes = 0;
    const auto back = header_of(head, sizeof head, op_compact_fingerprint, joined, header_bytes);
    OpHeader want = mine;
    want.joined_fingerprint = 0x5eedu;
    if (!back || !joined || header_bytes != compact_header_bytes ||
        std::memcmp(&*back, &want, sizeof want) != 0)
      fuzz::violated("a compact header does not come back whole");
  }
  // Whatever a peer sends as a compact chunk is read within its bytes and compared.
  {
    auto c = in.take(in.get<std::uint8_t>() % (compact_header_bytes + 8));
    bool joined = false;
    std::size_t header_bytes = 0;
    if (const auto h =
            header_of(c.data(), c.size(), op_compact_fingerprint, joined, header_bytes)) {
      if (header_bytes > c.size()) fuzz::violated("a compact header longer than its chunk");
      compare_op_headers(mine, *h, rank, peer);
    }
  }
  OpHeader theirs;
  auto b = in.take(sizeof theirs);
  std::memcpy(&theirs, &mine, sizeof theirs);
  if (!b.empty()) std::memcpy(&theirs, b.data(), b.size());
  compare_op_headers(mine, theirs, rank, peer);
  return 0;
}
