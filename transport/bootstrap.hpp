// Bootstrap: forming a communicator from a UniqueId (the root, and the rendezvous that
// Peers::rendezvous runs; the rest of Peers is in peers.hpp).
//
// Rendezvous: each rank opens a listener, then sends an authenticated hello (rank, size, listener
// address, host identity) to the root: itself, or through its host's leader, which carries the
// hellos of every rank of the host on one connection (host_leader.hpp). With several ids
// (ncclCommInitRankScalable) each root takes a near-equal share of the ranks; once a root's share
// has arrived it sends each other root the entries that root's ranks keep (directory.hpp), and the
// roots run a barrier of ceil(log2 roots) rounds, all relayed by the first rank of the sender's
// share (which holds every id). Once formed, a root sends each connection that carried hellos the
// entries its ranks keep (every entry up to COCCL_DIRECTORY_FULL ranks); a leader passes each of
// its followers theirs. So a root handles O(N/roots log N) bytes, a rank O(log N), and a rank has
// its table a constant number of hops after the last hello plus the barrier. A root answers
// status queries until the first rank of its share says goodbye; when that connection ends
// without one (the rank died) it answers, naming that, for one more COCCL_TIMEOUT (and a few
// seconds).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <coccl/unique_id.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/engine.hpp"
#include "transport/bootstrap_messages.hpp"
#include "transport/net.hpp"
#include "transport/wire.hpp"

namespace coccl::transport {

/// The parts of a UniqueId.
struct RootAddress {
  PeerInfo address;  // where the root listens (tcp, or the in-memory network)
  Secret secret;
  /// The root's tcp endpoint (an address of family 4 or 6).
  asio::ip::tcp::endpoint endpoint() const { return address.endpoint(); }
};
RootAddress decode(const UniqueId& id);
UniqueId encode(const RootAddress& root);

/// Starts a bootstrap root on `thread` on the in-memory network (transport/memory.hpp); returns
/// its address. Ranks of this process that rendezvous there link over memory streams. What the
/// root sends and receives is counted in `traffic` (may be null).
PeerInfo start_memory_root(runtime::ProxyThread& thread, const Secret& secret,
                           std::shared_ptr<Traffic> traffic = nullptr);

/// Starts a bootstrap root on `thread`, listening on `endpoint` (port 0 picks one). Returns the
/// endpoint it listens on. The root serves one communicator. Throws std::system_error with
/// errc::invalid_argument naming the address when it cannot listen there (port in use).
asio::ip::tcp::endpoint start_root(runtime::ProxyThread& thread,
                                   const asio::ip::tcp::endpoint& endpoint, const Secret& secret);

/// The bootstrap root's view of a communicator, as it answers a status query. With several roots
/// (ids) each sees its share of the ranks, [first, last), and its answer holds a record for each
/// rank of that share only: its size grows with the share, not with the communicator. The
/// accessors take a rank of the communicator; outside the share they answer "not seen".
struct RootView {
  int nranks = 0;           // 0 while no hello has arrived
  int roots = 1;            // the communicator's ids
  int index = 0;            // this root's place among them
  int arrived = 0;          // hellos received, of the ranks [first, last)
  int first = 0, last = 0;  // the ranks whose hellos this root takes
  bool formed = false;      // every rank of every share arrived; the tables went out
  bool rank0_lost = false;  // formed, but the share's first rank did not take its table
  bool rank0_left = false;  // the first rank took it, then left without a goodbye
  /// The other roots this one still waits for (their entries, or a barrier token), once its own
  /// share is complete or their entries are due; ascending.
  std::vector<int> awaiting;
  /// Why ranks' set-up failed, by rank, as they told this root: any rank of the communicator (a
  /// refused share is recorded under the rank that relayed it, of another share).
  std::map<int, std::string> failed;

  /// What the root holds of one rank of its share.
  struct Record {
    bool seen = false;    // its hello arrived
    PeerInfo listener{};  // valid where seen
    /// The rank whose connection carried its hello (itself when it came directly, its host's
    /// leader otherwise, a rank of the share either way); -1 where not seen.
    int via = -1;
  };
  /// The share's records: rank first + i at i.
  std::vector<Record> records;

  /// Whether `rank`'s hello arrived (false outside the share).
  bool seen(int rank) const { return record(rank).seen; }
  /// `rank`'s listener where seen; an all-zero PeerInfo outside the share.
  const PeerInfo& listener(int rank) const { return record(rank).listener; }
  /// Whose connection carried `rank`'s hello; -1 where not seen and outside the share.
  int via(int rank) const { return record(rank).via; }

 private:
  const Record& record(int rank) const {
    static const Record none;
    const std::int64_t i = static_cast<std::int64_t>(rank) - first;
    return i >= 0 && i < static_cast<std::int64_t>(records.size()) ? records[i] : none;
  }
};

/// Reads a root's status answer (what query_root does with it). Throws std::system_error
/// (errc::bad_message) on a payload that is malformed or truncated, or that says the impossible:
/// a share that is not root `index`'s of `roots`, more records or failures than the payload holds
/// (refused before anything is allocated for them), a hello carried from outside the share, a
/// failure of a rank outside the communicator, a root awaited twice or not another root.
RootView decode_root_view(std::span<const std::uint8_t> payload);

/// Asks the root of `root` for its view (coccl-status). Throws std::system_error (errc::timed_out
/// naming the root when `until` passes, errc::bad_message for a root with another secret) or
/// boost::system::system_error on socket errors.
asio::awaitable<RootView> query_root(asio::any_io_executor ex, const RootAddress& root,
                                     std::chrono::steady_clock::time_point until);

/// Asks the rank listening at `peer` for its status (the bytes its Peers' status source gives;
/// empty while it has not joined yet). Throws as query_root.
asio::awaitable<std::vector<std::uint8_t>> query_rank(asio::any_io_executor ex,
                                                      const PeerInfo& peer, Secret secret,
                                                      std::chrono::steady_clock::time_point until);

/// Dials `root` and completes the handshake, dialling again while the root closes connections
/// before their handshake ends (it made room for newer ones, admission.hpp), until `until`; the
/// stream is counted in `traffic` on the in-memory network. Throws std::system_error
/// (errc::timed_out) when the deadline passes. `rank` is for log lines.
asio::awaitable<std::pair<std::shared_ptr<Stream>, Channel>> dial_root(
    asio::any_io_executor ex, const RootAddress& root, std::chrono::steady_clock::time_point until,
    std::shared_ptr<Traffic> traffic, int rank);

/// Largest status answer a rank sends and a query accepts.
inline constexpr std::size_t max_status_frame = 1u << 20;

/// This host's identity: hash of host name and boot id.
std::uint64_t host_hash();

/// The digest of an id list that hellos and shares carry (Hello::ids): the same for every rank
/// given the same ids in the same order, and for no other list short of a hash collision; 0 for
/// one id.
std::uint64_t ids_digest(const std::vector<RootAddress>& roots);

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<std::string> hostid;  // COCCL_HOSTID

}  // namespace coccl::params
