// Cross-rank operation checks. In every host operation each pair of ranks that talk exchanges
// one small header per direction, sent on the link ahead of the operation's data (no extra round
// trip: neither side waits for the other's header before sending). It carries the sender's view
// of the operation: kind, type, count, root, reduction, the pair's sequence number and what the
// sender sends to and expects from the receiver. The receiver compares it with its own view
// before it takes any data from that peer, and a rank finishes an operation only once every
// peer it talked to has confirmed the same view, so a disagreement fails the operation on both
// ranks of the pair (errc::mismatch) and is never a success.
#pragma once

#include <coccl/communicator.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace coccl::detail {

/// One rank's view of an operation, as sent to one peer. Plain bytes on the link: both ends are
/// builds of this library (the link handshake checked that).
struct OpHeader {
  std::uint32_t magic;
  std::uint32_t kind;
  /// Operations this pair has checked before this one (counted by the sender).
  std::uint64_t pair_seq;
  /// The sender's sequence number of the operation on the communicator (for messages only:
  /// send/recv involve some ranks and not others, so ranks may count differently).
  std::uint64_t op_seq;
  std::uint64_t count;
  /// Signatures (hash of type and count of every transfer, in order) of what the sender sends to
  /// the receiver and expects from it; with their byte totals for messages.
  std::uint64_t send_sig, recv_sig;
  std::uint64_t send_bytes, recv_bytes;
  std::int32_t root;
  std::uint32_t type;
  std::uint32_t op;
  /// In a joined chunk (op_compact_fingerprint or op_joined_fingerprint), the fingerprint of the
  /// data that follows the header; 0 otherwise. Not compared: it describes the chunk, not the
  /// operation.
  std::uint32_t joined_fingerprint;
};

/// The chunk fingerprint that marks a header (data chunks carry fingerprint_of()).
inline constexpr std::uint32_t op_header_fingerprint = 0x0C0C4EADu;
/// The chunk fingerprint of a header joined with the sender's data for the receiver in one chunk
/// (the header, then the data: one frame and one ring slot instead of two). The fast path now
/// joins the compact form below; receivers still take this one, as they take a header alone.
inline constexpr std::uint32_t op_joined_fingerprint = 0x0C0C401Du;
/// The chunk fingerprint of a compact header (compact_header_bytes, write_compact_header())
/// joined with the sender's data: a collective's header without the fields only messages use, so
/// that with up to 16 bytes of data it fits the part of a chunk that arrives with its notice
/// (shm: the slot's first cache line), and larger data spill over by fewer lines.
inline constexpr std::uint32_t op_compact_fingerprint = 0x0C0C4C1Du;
inline constexpr std::uint32_t op_header_magic = 0x4F504843u;
inline constexpr std::size_t compact_header_bytes = 32;

/// Whether `h` travels as a compact header without losing anything: a collective (the transfer
/// signatures empty), with kind, type and op below 256 and count below 2^32.
bool compactable(const OpHeader& h) noexcept;
/// Writes `h` (compactable) as a compact header whose data carry `data_fingerprint`.
void write_compact_header(const OpHeader& h, std::uint32_t data_fingerprint,
                          std::byte (&out)[compact_header_bytes]) noexcept;

/// True when the compact header at `theirs` (a peer's, compact_header_bytes long) agrees with
/// `mine` (written by this rank for the same operation towards that peer): every field but the
/// sender's own op_seq is equal, the fingerprint of the data joined to it included. A byte
/// comparison, for the fast path; header_of() and op_headers_agree() decide every other case.
bool compact_header_agrees(const std::byte (&mine)[compact_header_bytes],
                           const std::byte* theirs) noexcept;

/// The header a chunk (`size` bytes at `data`, marked `fingerprint`) starts with: a header alone,
/// or one joined with data (`joined` set; the data follows the header's `header_bytes`), full or
/// compact (expanded: equal to the header it was written from). Nothing if the chunk is neither.
std::optional<OpHeader> header_of(const void* data, std::size_t size, std::uint32_t fingerprint,
                                  bool& joined, std::size_t& header_bytes) noexcept;

/// This rank's view of the operation `args` (sequence number `op_seq`) towards `peer`.
OpHeader make_op_header(const OpArgs& args, std::uint64_t op_seq, std::uint64_t pair_seq, int peer);
/// make_op_header() written into `h` (every field).
void write_op_header(OpHeader& h, const OpArgs& args, std::uint64_t op_seq, std::uint64_t pair_seq,
                     int peer);

/// Compares `theirs` (received from `peer`) with `mine` (what this rank sent to it for the same
/// operation). Returns an empty string when they agree, else what differs, naming both ranks.
std::string compare_op_headers(const OpHeader& mine, const OpHeader& theirs, int rank, int peer);
/// True exactly when compare_op_headers() returns an empty string (without building text).
bool op_headers_agree(const OpHeader& mine, const OpHeader& theirs) noexcept;

/// The checks of the running operation and the pairs' sequence numbers; proxy thread only.
class OpChecks {
 public:
  /// What is kept of one peer: the pair's count of checked operations and this operation's header
  /// to it. Lives as long as the OpChecks (entries are never removed), so a caller may keep a
  /// pointer to it from one operation to the next instead of looking the peer up each time.
  struct Pair {
    std::uint64_t pair_seq = 0;  // operations this pair has checked
    std::uint64_t op = 0;        // the op_seq of the operation `sent` belongs to (0: none yet)
    OpHeader sent{};
    bool taken = false;
  };

  /// Starts checking operation `args` (kept by reference until the next begin()).
  void begin(const OpArgs& args, std::uint64_t op_seq);
  /// The running operation's arguments moved to `args`: keeps referring to them there.
  void rebind(const OpArgs& args) noexcept { args_ = &args; }
  /// The entry of `peer` (made on first use).
  Pair& pair(int peer) { return peers_[peer]; }
  /// The header to send to `peer` if none was sent in this operation yet (then counts one more
  /// operation for the pair), else nothing.
  std::optional<OpHeader> to_send(int peer);
  /// to_send() for the entry of `peer`: the header (kept in the entry until the pair's next
  /// operation), or null.
  const OpHeader* to_send(Pair& pair, int peer);
  /// True the first time in this operation that `peer`'s header is to be taken; it must have
  /// been sent to first.
  bool to_take(int peer);
  /// to_take() for the entry of a peer that was sent to in this operation.
  static bool to_take(Pair& pair) noexcept {
    if (pair.taken) return false;
    pair.taken = true;
    return true;
  }
  /// What this rank sent `peer` in this operation.
  const OpHeader& sent(int peer);
  /// Peers sent a header in this operation whose own header has not been taken yet.
  std::vector<int> untaken() const;

 private:
  Pair& current(int peer);

  const OpArgs* args_ = nullptr;
  std::uint64_t op_seq_ = 0;
  // Every peer headers were exchanged with; entries stay from one operation to the next, so an
  // operation allocates nothing for a peer it has met before (the fast path's per-call cost), and
  // an unordered_map does not move them.
  std::unordered_map<int, Pair> peers_;
  std::vector<int> current_;  // the peers of this operation, in the order they were first sent to
};

}  // namespace coccl::detail
