// The payloads of the bootstrap and link-setup frames: what ranks tell the root and each other.
//
// Every decoder here reads bytes a peer sent (after the frame authenticated, so from a holder of
// the secret, but possibly a confused one) and throws std::system_error(errc::bad_message) on a
// payload that is truncated or malformed; it never reads past the payload and allocates only what
// the payload itself holds.
#pragma once

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coccl::transport {

/// What every rank knows about every other: where it listens and which host it is on.
struct PeerInfo {
  std::array<std::uint8_t, 16> addr;  // IPv4 in the first 4 bytes when family == 4
  std::uint8_t family;                // 4 or 6
  std::uint8_t caps;                  // cap_* bits: what the rank's links can be
  std::uint16_t port;
  std::uint64_t host_hash;  // same value <=> same host (shared memory possible)
  std::int32_t pid;

  boost::asio::ip::tcp::endpoint endpoint() const;
  static PeerInfo from(const boost::asio::ip::tcp::endpoint& ep);

  /// The rank has a usable RDMA device (COCCL_TRANSPORT=auto then takes ib across hosts).
  static constexpr std::uint8_t cap_ib = 1;
};

/// Largest hello, connection request or small answer a reader accepts.
inline constexpr std::size_t max_small_frame = 4096;
/// Largest frame of the bootstrap (an address table is 32 bytes a rank).
inline constexpr std::size_t max_table_frame = 64u << 20;

/// Throws std::system_error(errc::bad_message) with `what`.
[[noreturn]] void bad_message(const std::string& what);
/// A peer's text (a refusal or notice) fit for a log line or error: control bytes become spaces.
std::string printable(std::span<const std::uint8_t> text);
/// "address:port", for messages.
std::string endpoint_text(const boost::asio::ip::tcp::endpoint& ep);
/// Why a connection was dropped before it authenticated, without Boost's source locations.
std::string drop_reason(const std::exception& e);

/// A failed rank -> a peer, or to the root: why its set-up or its communicator failed. The
/// decoded text names the rank ("rank P has failed: ..."); notice_sender reads only the rank.
std::vector<std::uint8_t> encode_notice(int from, const std::string& why);
std::string decode_notice(std::span<const std::uint8_t> payload);
int notice_sender(std::span<const std::uint8_t> payload);

/// rank -> root: who the rank is and where it listens. The root checks the ranks. A communicator
/// made from several ids (ncclCommInitRankScalable) has `roots` of them: rank r says hello to
/// root_of(r), and `ids` is a digest of the whole list, the same on every rank given the same ids.
struct Hello {
  std::int32_t rank;
  std::int32_t nranks;
  PeerInfo info;
  std::uint32_t roots = 1;
  std::uint64_t ids = 0;
};
std::vector<std::uint8_t> encode_hello(const Hello& h);
Hello decode_hello(std::span<const std::uint8_t> payload);

/// A host's leader -> root: the hellos of ranks of its host (its own, then those that reached it
/// over the host's local listener), several to a frame; the root takes each as a hello.
inline constexpr std::size_t max_hellos_per_frame = 1024;
std::vector<std::uint8_t> encode_hellos(std::span<const Hello> hellos);
/// Throws on an empty list, more than max_hellos_per_frame, or a malformed hello.
std::vector<Hello> decode_hellos(std::span<const std::uint8_t> payload);

/// With `roots` roots, the root that rank `rank` of `nranks` says hello to, and the first rank of
/// root `index`'s share (share_begin(roots) == nranks): ranks are split into near-equal
/// consecutive shares.
int root_of(int rank, int nranks, int roots);
int share_begin(int index, int nranks, int roots);

/// One rank's entry as the roots hand it out: its listener and how many ranks share its host (as
/// the root of its share counts them).
struct DirectoryEntry {
  std::int32_t rank;
  PeerInfo info;
  std::uint32_t host_ranks;
};

/// What the roots of a communicator made from several ids tell each other (through the first
/// rank of the sender's share, which holds every id; roots hold only their own). Two kinds:
/// - entries (round == no_round): the ranks of the sender's share whose addresses the receiver's
///   share needs (directory.hpp), once every rank of the sender's share has arrived;
/// - a token of a dissemination barrier: in round j root s tells root (s + 2^j) mod roots that
///   it and every root it heard from so far are complete, with what they know of the hosts.
///   After every round a root knows that every rank of the communicator has arrived.
struct Share {
  static constexpr std::uint32_t no_round = 0xffffffffu;
  std::int32_t nranks = 0;
  std::uint32_t roots = 0;
  std::uint32_t from = 0;  // the sending root's index
  std::uint32_t to = 0;    // the receiving root's index
  std::uint64_t ids = 0;   // the digest of the id list (Hello::ids)
  std::uint32_t full = 0;  // 1: every rank keeps every entry (the sender's setting)
  std::uint32_t round = no_round;
  // A token's aggregate of the shares heard from: the lowest and highest host identity, and the
  // most distinct hosts in any one share.
  std::uint64_t low_host = 0;
  std::uint64_t high_host = 0;
  std::uint32_t hosts = 0;
  std::vector<DirectoryEntry> entries;  // sorted by rank, all in the sender's share
};
std::vector<std::uint8_t> encode_share(const Share& s);
/// Checks the settings (two roots at least, both indexes in range and different, a round below
/// the barrier's count), that a token carries no entries, and that every entry is of the
/// sender's share, in order, with a possible count of ranks on its host.
Share decode_share(std::span<const std::uint8_t> payload);
/// The rounds of the roots' barrier: ceil(log2(roots)).
int barrier_rounds(int roots);

/// Lower rank -> higher rank: open a link of `kind` with these settings. `address` is the
/// dialler's end as its transport describes it (LinkSetup::offer: a shared segment's name, an RDMA
/// address, nothing for tcp), `sockets` the number of sockets the dialler would use.
struct LinkRequest {
  std::int32_t from;
  std::int32_t to;
  std::uint8_t kind;
  std::uint64_t slots;
  std::uint64_t slot_bytes;
  std::vector<std::uint8_t> address;
  std::uint32_t sockets = 1;
  PeerInfo info{};  // the dialler's listener: the answerer may not hold its entry
};
std::vector<std::uint8_t> encode_link_request(const LinkRequest& r);
/// The ranks of a request (from, to), read first: they decide whether it is answered at all.
std::pair<std::int32_t, std::int32_t> link_request_ranks(std::span<const std::uint8_t> payload);
LinkRequest decode_link_request(std::span<const std::uint8_t> payload);

/// Higher rank -> lower rank: the link request accepted, with the answering rank's end
/// (LinkSetup::accept) and the link's socket count (at most the request's).
struct LinkReply {
  std::vector<std::uint8_t> address;
  std::uint32_t sockets = 1;
};
std::vector<std::uint8_t> encode_link_reply(const LinkReply& r);
LinkReply decode_link_reply(std::span<const std::uint8_t> payload);

}  // namespace coccl::transport
