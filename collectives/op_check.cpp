#include "collectives/op_check.hpp"

#include <coccl/types.hpp>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <type_traits>

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

constexpr std::uint64_t fnv_basis = 14695981039346656037ull;

// FNV-1a, 64-bit, over the transfers of one direction in order.
struct Signature {
  std::uint64_t hash = fnv_basis;
  std::uint64_t bytes = 0;
  void add(DataType t, std::size_t count) {
    for (std::uint64_t f : {static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(count)})
      for (int i = 0; i < 8; ++i) {
        hash ^= static_cast<std::uint8_t>(f >> (8 * i));
        hash *= 1099511628211ull;
      }
    bytes += count * size_of(t);
  }
};

std::string view_of(const OpHeader& h) {
  return std::string(name_of(static_cast<OpKind>(h.kind))) + " #" + std::to_string(h.op_seq);
}

std::string type_name(std::uint32_t t) { return std::string(to_string(static_cast<DataType>(t))); }

}  // namespace

OpHeader make_op_header(const OpArgs& a, std::uint64_t op_seq, std::uint64_t pair_seq, int peer) {
  OpHeader h;
  write_op_header(h, a, op_seq, pair_seq, peer);
  return h;
}

// Every byte of a header is a field that write_op_header() stores (it goes on the wire as is).
static_assert(sizeof(OpHeader) == 80 && std::has_unique_object_representations_v<OpHeader>);

void write_op_header(OpHeader& h, const OpArgs& a, std::uint64_t op_seq, std::uint64_t pair_seq,
                     int peer) {
  // Worked out first and stored once a field: a header zeroed whole and then written over was
  // read back by the fast path (compact form, comparison) across the seams of those stores, which
  // stalls each load.
  std::uint32_t type = 0, op = 0;
  std::uint64_t count = 0;
  std::int32_t root = 0;
  Signature out, in;
  switch (a.kind) {
    case OpKind::barrier:
      break;
    case OpKind::p2p:
      for (const Transfer& p : a.p2p)
        if (p.peer == peer) (p.is_send ? out : in).add(p.type, p.count);
      break;
    case OpKind::all_to_allv:
      type = static_cast<std::uint32_t>(a.type);
      out.add(a.type, a.send_counts[static_cast<std::size_t>(peer)]);
      in.add(a.type, a.recv_counts[static_cast<std::size_t>(peer)]);
      break;
    default:
      type = static_cast<std::uint32_t>(a.type);
      count = a.count;
      if (rooted(a.kind)) root = a.root;
      if (reduces(a.kind)) op = static_cast<std::uint32_t>(a.op);
  }
  h.magic = op_header_magic;
  h.kind = static_cast<std::uint32_t>(a.kind);
  h.pair_seq = pair_seq;
  h.op_seq = op_seq;
  h.count = count;
  h.send_sig = out.hash;
  h.recv_sig = in.hash;
  h.send_bytes = out.bytes;
  h.recv_bytes = in.bytes;
  h.root = root;
  h.type = type;
  h.op = op;
  h.joined_fingerprint = 0;
}

void OpChecks::begin(const OpArgs& args, std::uint64_t op_seq) {
  args_ = &args;
  op_seq_ = op_seq;
  current_.clear();
}

std::optional<OpHeader> OpChecks::to_send(int peer) {
  if (const OpHeader* h = to_send(peers_[peer], peer)) return *h;
  return std::nullopt;
}

const OpHeader* OpChecks::to_send(Pair& p, int peer) {
  if (p.op == op_seq_) return nullptr;
  // In place: a header returned by value and copied in was read back before its stores had
  // drained (no store forwarding), most of this call's time on the fast path.
  write_op_header(p.sent, *args_, op_seq_, p.pair_seq++, peer);
  p.op = op_seq_;
  p.taken = false;
  current_.push_back(peer);
  return &p.sent;
}

OpChecks::Pair& OpChecks::current(int peer) {
  auto it = peers_.find(peer);
  if (it == peers_.end() || it->second.op != op_seq_)
    throw std::out_of_range("no header was sent to rank " + std::to_string(peer) +
                            " in this operation");
  return it->second;
}

const OpHeader& OpChecks::sent(int peer) { return current(peer).sent; }

bool OpChecks::to_take(int peer) { return to_take(current(peer)); }

std::vector<int> OpChecks::untaken() const {
  std::vector<int> v;
  for (int peer : current_)
    if (!peers_.at(peer).taken) v.push_back(peer);
  return v;
}

namespace {

// The compact header on the wire: 32 bytes, little-endian as the full one.
struct CompactHeader {
  std::uint8_t kind, type, op, version;
  std::int32_t root;
  std::uint32_t count;
  std::uint32_t joined_fingerprint;
  std::uint64_t pair_seq;
  std::uint64_t op_seq;
};
static_assert(sizeof(CompactHeader) == compact_header_bytes);
constexpr std::uint8_t compact_version = 1;

}  // namespace

bool compactable(const OpHeader& h) noexcept {
  return h.magic == op_header_magic && h.send_sig == fnv_basis && h.recv_sig == fnv_basis &&
         h.send_bytes == 0 && h.recv_bytes == 0 && h.kind < 256 && h.type < 256 && h.op < 256 &&
         h.count <= UINT32_MAX;
}

void write_compact_header(const OpHeader& h, std::uint32_t data_fingerprint,
                          std::byte (&out)[compact_header_bytes]) noexcept {
  // Field by field into place: a header built aside and copied was read back in 16-byte pieces
  // of its smaller stores, which stalls (no store forwarding).
  auto put = [&out](std::size_t at, auto v) { std::memcpy(out + at, &v, sizeof v); };
  put(offsetof(CompactHeader, kind), static_cast<std::uint8_t>(h.kind));
  put(offsetof(CompactHeader, type), static_cast<std::uint8_t>(h.type));
  put(offsetof(CompactHeader, op), static_cast<std::uint8_t>(h.op));
  put(offsetof(CompactHeader, version), compact_version);
  put(offsetof(CompactHeader, root), h.root);
  put(offsetof(CompactHeader, count), static_cast<std::uint32_t>(h.count));
  put(offsetof(CompactHeader, joined_fingerprint), data_fingerprint);
  put(offsetof(CompactHeader, pair_seq), h.pair_seq);
  put(offsetof(CompactHeader, op_seq), h.op_seq);
}

bool compact_header_agrees(const std::byte (&mine)[compact_header_bytes],
                           const std::byte* theirs) noexcept {
  static_assert(offsetof(CompactHeader, op_seq) + sizeof(CompactHeader::op_seq) ==
                compact_header_bytes);
  return std::memcmp(mine, theirs, offsetof(CompactHeader, op_seq)) == 0;
}

std::optional<OpHeader> header_of(const void* data, std::size_t size, std::uint32_t fingerprint,
                                  bool& joined, std::size_t& header_bytes) noexcept {
  OpHeader h{};
  if (fingerprint == op_compact_fingerprint) {
    joined = true;
    header_bytes = compact_header_bytes;
    CompactHeader c{};
    if (size < sizeof c) return std::nullopt;
    std::memcpy(&c, data, sizeof c);
    if (c.version != compact_version) return std::nullopt;
    h.magic = op_header_magic;
    h.kind = c.kind;
    h.type = c.type;
    h.op = c.op;
    h.root = c.root;
    h.count = c.count;
    h.joined_fingerprint = c.joined_fingerprint;
    h.pair_seq = c.pair_seq;
    h.op_seq = c.op_seq;
    h.send_sig = h.recv_sig = fnv_basis;
    return h;
  }
  header_bytes = sizeof h;
  joined = fingerprint == op_joined_fingerprint && size >= sizeof h;
  if (!joined && (fingerprint != op_header_fingerprint || size != sizeof h)) return std::nullopt;
  std::memcpy(&h, data, sizeof h);
  return h;
}

bool op_headers_agree(const OpHeader& mine, const OpHeader& theirs) noexcept {
  return theirs.magic == op_header_magic && theirs.pair_seq == mine.pair_seq &&
         theirs.kind == mine.kind && theirs.type == mine.type && theirs.count == mine.count &&
         theirs.root == mine.root && theirs.op == mine.op && theirs.send_sig == mine.recv_sig &&
         theirs.recv_sig == mine.send_sig;
}

std::string compare_op_headers(const OpHeader& mine, const OpHeader& theirs, int rank, int peer) {
  // The common case, without the text.
  if (op_headers_agree(mine, theirs)) return {};
  const std::string r = "rank " + std::to_string(rank), p = "rank " + std::to_string(peer);
  if (theirs.magic != op_header_magic)
    return p + " sent data where " + r + " expected the header of its " + view_of(mine);
  std::string why;
  if (theirs.pair_seq != mine.pair_seq) {
    why = p + " is at its operation " + std::to_string(theirs.pair_seq) + " with " + r + ", " + r +
          " at " + std::to_string(mine.pair_seq) +
          " (one of them skipped an operation or ran an extra one)";
  } else if (theirs.kind != mine.kind) {
    why = "they run different operations";
  } else if (theirs.type != mine.type) {
    why = p + " uses type " + type_name(theirs.type) + ", " + r + " type " + type_name(mine.type);
  } else if (theirs.count != mine.count) {
    why = p + " has count " + std::to_string(theirs.count) + ", " + r + " count " +
          std::to_string(mine.count);
  } else if (theirs.root != mine.root) {
    why = p + " has root " + std::to_string(theirs.root) + ", " + r + " root " +
          std::to_string(mine.root);
  } else if (theirs.op != mine.op) {
    why = p + " reduces with " + std::string(to_string(static_cast<ReduceOp>(theirs.op))) + ", " +
          r + " with " + std::string(to_string(static_cast<ReduceOp>(mine.op)));
  } else if (theirs.send_sig != mine.recv_sig) {
    why = p + " sends " + std::to_string(theirs.send_bytes) + " bytes to " + r +
          ", which expects " + std::to_string(mine.recv_bytes) + " bytes" +
          (theirs.send_bytes == mine.recv_bytes ? " (of other types or counts)" : "");
  } else if (theirs.recv_sig != mine.send_sig) {
    why = r + " sends " + std::to_string(mine.send_bytes) + " bytes to " + p + ", which expects " +
          std::to_string(theirs.recv_bytes) + " bytes" +
          (theirs.recv_bytes == mine.send_bytes ? " (of other types or counts)" : "");
  } else {
    return {};
  }
  return "operation mismatch between " + r + " (" + view_of(mine) + ") and " + p + " (" +
         view_of(theirs) + "): " + why;
}

}  // namespace coccl::detail
