// Bootstrap: forming a communicator from a UniqueId, and the per-communicator listener that
// accepts peer connections (made lazily, lower rank dials).
//
// Rendezvous: each rank opens a listener, then sends an authenticated hello (rank, size, listener
// address, host identity) to the root. When all have arrived the root sends the address table to
// rank 0 only and closes; the table then flows down a binary tree (rank r forwards it to 2r+1 and
// 2r+2), so the root does O(N) work and every rank has the table after O(log N) rounds.
#pragma once

#include <array>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <coccl/unique_id.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/deadline.hpp"
#include "runtime/engine.hpp"
#include "transport/admission.hpp"
#include "transport/connection.hpp"
#include "transport/shm.hpp"
#include "transport/tcp_uring.hpp"
#if COCCL_HAVE_IB
#include "transport/ib.hpp"
#endif
#include "transport/user_buffers.hpp"
#include "transport/wire.hpp"

namespace coccl::transport {

/// What every rank knows about every other: where it listens and which host it is on.
struct PeerInfo {
  std::array<std::uint8_t, 16> addr;  // IPv4 in the first 4 bytes when family == 4
  std::uint8_t family;                // 4 or 6
  std::uint8_t caps;                  // cap_* bits: what the rank's links can be
  std::uint16_t port;
  std::uint64_t host_hash;  // same value <=> same host (shared memory possible)
  std::int32_t pid;

  asio::ip::tcp::endpoint endpoint() const;
  static PeerInfo from(const asio::ip::tcp::endpoint& ep);

  /// The rank has a usable RDMA device (COCCL_TRANSPORT=auto then takes ib across hosts).
  static constexpr std::uint8_t cap_ib = 1;
};

/// The parts of a UniqueId.
struct RootAddress {
  asio::ip::tcp::endpoint endpoint;
  Secret secret;
};
RootAddress decode(const UniqueId& id);
UniqueId encode(const RootAddress& root);

/// Starts a bootstrap root on `thread`, listening on `endpoint` (port 0 picks one). Returns the
/// endpoint it listens on. The root serves one communicator. Throws std::system_error with
/// errc::invalid_argument naming the address when it cannot listen there (port in use).
asio::ip::tcp::endpoint start_root(runtime::ProxyThread& thread,
                                   const asio::ip::tcp::endpoint& endpoint, const Secret& secret);

/// Connects to `ep`, retrying refusals (the listener may not be up yet) until `until`. Throws
/// std::system_error: errc::timed_out naming `ep` when the deadline passes, or a system error
/// (EMFILE...) when this process is out of descriptors or socket memory.
asio::awaitable<std::shared_ptr<asio::ip::tcp::socket>> dial(
    asio::any_io_executor ex, asio::ip::tcp::endpoint ep,
    std::chrono::steady_clock::time_point until);

/// This host's identity: hash of host name and boot id.
std::uint64_t host_hash();

/// Connection settings fixed when the communicator is created.
struct LinkOptions {
  std::string transport;  // auto, tcp, shm or ib
  std::size_t slots;
  std::size_t slot_bytes;
};

/// One communicator's view of its peers: its listener, the address table and the connections,
/// made on first use. Lives on the communicator's proxy thread.
class Peers {
 public:
  Peers(runtime::ProxyThread& thread, const Secret& secret, int rank, int nranks,
        LinkOptions options, FailureHandler on_failure);
  ~Peers();

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return nranks_; }
  const Secret& secret() const noexcept { return secret_; }
  const std::vector<PeerInfo>& table() const noexcept { return table_; }
  /// This rank's entry (its listener).
  PeerInfo self_info() const;

  /// Rendezvous through the root of `root`; fills the table.
  asio::awaitable<void> rendezvous(RootAddress root);

  /// The connection to `peer`, made now if needed. Throws LinkError/system_error on failure.
  asio::awaitable<Connection*> get(int peer);

  /// Sends an abort notice on every open connection, then closes them and the listener.
  void shutdown(std::error_code ec, const std::string& why, bool notify);

  /// The connection to `peer` if it is open, else null.
  Connection* existing(int peer) const noexcept { return by_peer_[peer]; }
  /// The buffers the user registered (register_buffer); set at construction, usable from any
  /// thread.
  const std::shared_ptr<UserBuffers>& user_buffers() const noexcept { return user_buffers_; }
  /// Open connections (for the watchdog).
  const std::vector<std::unique_ptr<Connection>>& connections() const { return conns_; }

 private:
  void accept_loop();
  void accept_failed(boost::system::error_code ec);
  asio::awaitable<void> handle_incoming(std::shared_ptr<asio::ip::tcp::socket> s);
  // Lower rank: dial the peer and make the link.
  asio::awaitable<void> dial(int peer);
  // Higher rank: answer a connection request at once, whatever this rank is doing, so link
  // setup never waits on the accepting rank's own progress (that could form a cycle).
  asio::awaitable<void> answer(int peer, std::shared_ptr<asio::ip::tcp::socket> s,
                               std::shared_ptr<Channel> channel, std::vector<std::uint8_t> payload);
  void add(int peer, std::unique_ptr<Connection> c);
  // What link setup made besides the socket: the shared segments (shm), the RDMA link (ib), or
  // for tcp on io_uring the ring and the link's further sockets.
  struct Made {
    std::unique_ptr<ShmSegment> own, theirs;
    UringRingPtr ring;
    std::vector<asio::ip::tcp::socket> extra;
#if COCCL_HAVE_IB
    std::unique_ptr<ib::Link> link;
#endif
  };
  // Wraps the socket and what was made in the connection of that kind and adds it.
  void add_made(int peer, asio::ip::tcp::socket s, Made made);
  // Wakes everyone waiting for the link to `peer` (made or failed).
  void announce(int peer);
  // How this rank links to `peer`; both sides decide alike from the table and the settings.
  enum class Kind : std::uint8_t { tcp = 0, shm = 1, ib = 2 };
  Kind kind_for(int peer) const;
  // tcp: makes the link's io_uring when this rank's engine is uring; returns how many sockets
  // this side wants (1 on the asio engine).
  std::uint32_t prepare_tcp(int peer, Made& made);
  asio::awaitable<void> forward_table(int child, std::vector<std::uint8_t> payload);

  runtime::ProxyThread& thread_;
  asio::any_io_executor ex_;
  Secret secret_;
  int rank_;
  int nranks_;
  LinkOptions options_;
  FailureHandler on_failure_;
  asio::ip::tcp::acceptor acceptor_;
  Admission admission_;        // connections that have not authenticated yet
  DropLog drops_;
  asio::steady_timer accept_retry_;  // pause after an accept error
  bool table_received_ = false;      // only the first table frame counts
  std::vector<PeerInfo> table_;
  runtime::Mailbox<std::vector<std::uint8_t>> table_box_;
  // A timer used as an event: cancelled once the table is here (or on shutdown). A peer that got
  // the table earlier may dial before it reaches this rank; answering waits for it.
  asio::steady_timer table_ready_;
  ShmPoller poller_;  // before the connections: they unregister from it when destroyed
#if COCCL_HAVE_IB
  IbPoller ib_poller_;
  std::shared_ptr<ib::Device> ib_device_;  // COCCL_TRANSPORT=ib, or auto with a usable device
#endif
  std::shared_ptr<UserBuffers> user_buffers_;
  std::vector<std::unique_ptr<Connection>> conns_;  // in creation order
  std::vector<Connection*> by_peer_;                // nranks entries
  // Per peer, while a link is being made or awaited: a timer used as an event (cancelled when the
  // link is ready or failed; its expiry is the deadline).
  std::vector<std::shared_ptr<asio::steady_timer>> pending_;
  // A link to the peer is being made: dialled by this rank (higher peers) or answered (lower).
  std::vector<bool> dialing_;
  std::vector<std::string> failed_;  // why the link to a peer could not be made
  // Per lower peer, while this rank answers its tcp link: the link's further sockets (index,
  // socket) as they connect.
  using Stripe = std::pair<std::uint32_t, std::shared_ptr<asio::ip::tcp::socket>>;
  std::vector<std::unique_ptr<runtime::Mailbox<Stripe>>> stripes_;
  bool shut_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace coccl::transport
