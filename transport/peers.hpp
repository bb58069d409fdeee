// One communicator's peers: its listener, which accepts peer connections (made lazily, the lower
// rank dials), and the links, held under a memory budget. The rendezvous that fills the address
// table is in bootstrap.cpp, with the root it talks to.
#pragma once

#include <algorithm>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/deadline.hpp"
#include "runtime/engine.hpp"
#include "runtime/gate.hpp"
#include "transport/admission.hpp"
#include "transport/bootstrap.hpp"
#include "transport/bootstrap_messages.hpp"
#include "transport/connection.hpp"
#include "transport/directory.hpp"
#include "transport/host_leader.hpp"
#include "transport/link_poller.hpp"
#include "transport/link_setup.hpp"
#include "transport/net.hpp"
#include "transport/traffic.hpp"
#include "transport/user_buffers.hpp"
#include "transport/wire.hpp"

namespace coccl::transport {

/// Connection settings fixed when the communicator is created.
struct LinkOptions {
  std::string transport;  // auto, tcp, shm or ib
  std::size_t slots;
  std::size_t slot_bytes;
  bool memory = false;  // listen and link on the in-memory network (transport/memory.hpp)
  // On the in-memory network: the party whose Traffic counts this rank's streams, shared by the
  // communicators one rank makes (split); null: a Traffic of its own.
  std::shared_ptr<Traffic> traffic;
  // Slot bytes instead of slot_bytes where every rank turns out to be a host of its own (every
  // link crosses the network); 0: slot_bytes throughout. Applied when the address table forms,
  // before any link, and not on the in-memory network.
  std::size_t network_slot_bytes = 0;
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
  /// Where `peer` listens, if this rank knows.
  std::optional<PeerInfo> address_of(int peer) const {
    if (const PeerInfo* p = directory_.find(peer)) return *p;
    return std::nullopt;
  }
  /// The rendezvous is over: this rank holds its entries of the address table.
  bool formed() const noexcept { return directory_.formed(); }
  /// The ids (bootstrap roots) the communicator was formed from.
  std::size_t roots() const noexcept { return roots_.size(); }
  /// Distinct hosts among the ranks, and ranks on this rank's host (0 before formed()).
  int hosts() const noexcept { return static_cast<int>(directory_.header().hosts); }
  int host_ranks() const noexcept { return static_cast<int>(directory_.host_ranks()); }
  /// Where `peer` listens: from the entries this rank holds, else asked of the ranks on the way
  /// (directory.hpp), before `until`. Throws std::system_error (errc::peer_lost) naming the ranks
  /// that did not answer.
  asio::awaitable<PeerInfo> locate(int peer, std::chrono::steady_clock::time_point until);
  /// This rank's entry (its listener).
  PeerInfo self_info() const;
  /// On the in-memory network, what this rank's streams sent and received (transport/traffic.hpp);
  /// null on tcp, shm and ib, which are not counted.
  const std::shared_ptr<Traffic>& traffic() const noexcept { return traffic_; }

  /// Rendezvous through the roots of `roots` (1 to size() of them, the same list on every
  /// rank); fills the table. With several, each takes the hellos of a near-equal share of the
  /// ranks and the first of each share passes it on to roots[0]. When it fails, this rank tells
  /// roots[0] why (for peers that find it gone).
  asio::awaitable<void> rendezvous(std::vector<RootAddress> roots);
  /// Forms without a root, from the frame a launcher's table gave this rank (address_book.hpp).
  /// Throws std::system_error (errc::bad_message) when the frame is not this communicator's or
  /// lacks an entry this rank keeps.
  void form(const DirectoryFrame& frame);

  /// The connection to `peer`, made now if needed. `bytes` (0: unknown) is the size of the
  /// operation that asks: a link made for a small one gets a ring of fewer slots. A new link that
  /// would take the receive rings past COCCL_MEM_BUDGET first closes the least recently used idle
  /// link. Throws LinkError/system_error on failure (errc::out_of_memory when the budget cannot
  /// hold the link).
  asio::awaitable<Connection*> get(int peer, std::size_t bytes = 0);

  /// While one exists, the links that get() returns are held by the running operation: they are
  /// not closed (for the budget or idleness) under it. Held per operation: the hold of a link
  /// ends when no Use is left.
  class Use {
   public:
    explicit Use(Peers& peers) : peers_(peers) {
      if (peers_.users_++ == 0) ++peers_.period_;
    }
    ~Use() { --peers_.users_; }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    Peers& peers_;
  };

  /// The links' counts and memory (CommStatus).
  struct LinkStats {
    int open = 0;
    std::uint64_t opened = 0;         // links made, reopenings included
    std::uint64_t peers = 0;          // distinct peers ever linked
    std::uint64_t closed_budget = 0;  // closed to make room under COCCL_MEM_BUDGET
    std::uint64_t closed_idle = 0;    // closed after COCCL_LINK_IDLE_S unused
    std::uint64_t ring_bytes = 0;     // receive rings of the open links
    std::uint64_t budget = 0;         // COCCL_MEM_BUDGET (0: none)
  };
  LinkStats link_stats() const noexcept;

  /// Sends an abort notice on every open connection, then closes them (the listener stays for
  /// status queries and answers link requests with the reason).
  void shutdown(std::error_code ec, const std::string& why, bool notify);
  /// Waits (at most `most`) until no abort notice is held back behind a frame in flight, so that
  /// a process that exits on the error still tells its peers why.
  asio::awaitable<void> flush_notices(std::chrono::milliseconds most);

  /// The connection to `peer` if it is open, else null.
  Connection* existing(int peer) const noexcept { return by_peer_[peer]; }
  /// Whether an operation of this rank has used the open link to `peer` (false without one: a link
  /// the peer made for its own operation is not used until this rank's operations take it).
  bool used(int peer) const noexcept {
    const PeerState* s = find(peer);
    return by_peer_[peer] && s && s->held != 0;
  }
  /// Asks `peer`, in the background, to close the link by agreement if it is open and unused (as
  /// an idle link is closed); it is made again on demand. For links made for a one-off exchange
  /// (a split's), whose receive rings would otherwise stay until COCCL_LINK_IDLE_S.
  void let_go(int peer);
  /// Addresses this rank holds now (its own entries of the table and those it learned).
  std::size_t addresses_known() const noexcept { return directory_.known(); }
  /// What get() returns without suspending: the open connection to `peer` (used at `now`, and held
  /// by the running operation as get() holds it), or null when get() would have to wait (no link
  /// yet, or a close of it is being agreed).
  Connection* ready(int peer, std::chrono::steady_clock::time_point now) noexcept;
  /// The buffers the user registered (register_buffer); set at construction, usable from any
  /// thread.
  const std::shared_ptr<UserBuffers>& user_buffers() const noexcept { return user_buffers_; }
  /// Open connections (for the watchdog).
  const std::vector<std::unique_ptr<Connection>>& connections() const { return conns_; }

  /// What this rank answers a status query with (coccl-status); called on the proxy thread. The
  /// listener keeps answering status queries after shutdown(), until the Peers is destroyed.
  using StatusSource = std::function<std::vector<std::uint8_t>()>;
  void set_status_source(StatusSource source) { status_source_ = std::move(source); }
  /// One line about another rank's status answer (for errors that name what holds a peer up).
  using StatusReader = std::function<std::string(std::span<const std::uint8_t>)>;
  void set_status_reader(StatusReader reader) { status_reader_ = std::move(reader); }
  /// "rank P reports: ..." from the status answer of `peer` listening at `where` (read with
  /// `reader`), or "rank P does not answer ..." when none comes by `until`. Holds nothing of a
  /// Peers, so a caller may outlive the one it took `where` and `secret` from.
  static asio::awaitable<std::string> describe_rank(asio::any_io_executor ex, int peer,
                                                    PeerInfo where, Secret secret,
                                                    StatusReader reader,
                                                    std::chrono::steady_clock::time_point until);
  /// The peer this rank is making a link to (dialling, or waiting for it to dial), -1 if none.
  int linking_to() const noexcept {
    int first = -1;
    for (const auto& [p, s] : peer_state_)
      if (!by_peer_[p] && (s.dialing || s.pending) && (first < 0 || p < first)) first = p;
    return first;
  }
  /// A shrink request another rank sent to this rank's listener (collectives/recovery.cpp),
  /// authenticated with this communicator's secret; answer it on `channel`.
  struct RecoveryRequest {
    std::shared_ptr<Stream> socket;
    std::shared_ptr<Channel> channel;
    std::vector<std::uint8_t> payload;
  };
  /// Shrink requests, queued until this rank's own shrink takes them. The listener stays open
  /// after the communicator fails (until it is destroyed), so that survivors can meet here.
  runtime::Mailbox<RecoveryRequest>& recovery_requests() noexcept { return recovery_box_; }
  /// Starts a shrink attempt: its number (1, 2, ...), or 0 while another attempt of this rank is
  /// still running (the requests have one reader).
  std::uint64_t begin_shrink() noexcept {
    if (shrinking_) return 0;
    shrinking_ = true;
    return ++shrink_attempts_;
  }
  void end_shrink() noexcept { shrinking_ = false; }
  /// Recovery frame kinds (first payload byte of FrameType::recover).
  static constexpr std::uint8_t recover_probe = 1;
  static constexpr std::uint8_t recover_shrink = 2;

 private:
  void accept_loop();
  void accept_failed(boost::system::error_code ec);
  asio::awaitable<void> handle_incoming(std::shared_ptr<Stream> s, Admission::Ticket ticket);
  // Lower rank: dial the peer and make the link.
  asio::awaitable<void> dial(int peer, std::size_t slots);
  // Before a link of `kind` is set up: a tcp link may bind to the thread that makes it (io_uring),
  // so it is made on the proxy thread itself, never by a caller running the loop
  // (ProxyThread::drive). Pins the loop in `pinned` (held until the link is made) and resumes on
  // the proxy thread.
  asio::awaitable<void> stay_on_proxy_thread(LinkKind kind,
                                             std::optional<runtime::ProxyThread::Pin>& pinned);
  // Higher rank: answer a connection request at once, whatever this rank is doing, so link
  // setup never waits on the accepting rank's own progress (that could form a cycle).
  asio::awaitable<void> answer(int peer, std::shared_ptr<Stream> s,
                               std::shared_ptr<Channel> channel, std::vector<std::uint8_t> payload);
  void add(int peer, std::unique_ptr<Connection> c, std::size_t ring_bytes);
  // Adds the link just made (its ring of `slots` slots); finished after shutdown(), it is aborted
  // at once with shutdown()'s reason.
  void add_made(int peer, std::unique_ptr<Connection> c, std::size_t slots);
  // Why a link is closed by agreement (counted at both ends).
  enum class CloseReason : std::uint8_t { budget = 1, idle = 2 };
  // Ring bytes promised to a link being made, given back when its making ends (the link, once
  // added, counts in ring_bytes_).
  struct Reservation {
    Peers* peers = nullptr;
    std::size_t bytes = 0;
    std::optional<runtime::Gate::Pass> pass;  // of the Peers: the bytes go back while it lives
    Reservation() = default;
    Reservation(Reservation&& o) noexcept
        : peers(std::exchange(o.peers, nullptr)), bytes(o.bytes), pass(std::move(o.pass)) {}
    Reservation& operator=(Reservation&& o) noexcept {
      if (this != &o) {
        give_back();
        peers = std::exchange(o.peers, nullptr);
        bytes = o.bytes;
        pass = std::move(o.pass);
      }
      return *this;
    }
    ~Reservation() { give_back(); }
    void give_back() noexcept {
      if (peers && pass && pass->open()) peers->reserved_ -= bytes;
      peers = nullptr;
    }
  };
  // Slots of a link made for an operation of `bytes` (0: unknown, the full ring).
  std::size_t slots_for(std::size_t bytes) const noexcept;
  // Makes room under the budget for a link to `peer` of `bytes` ring bytes, closing least recently
  // used idle links (waiting for busy peers to let go, until the deadline). `answering`: the link
  // is the peer's request (for an operation of its own, which may be ahead of this rank's), so
  // links that this rank's running operation holds are waited for too. Throws LinkError naming
  // COCCL_MEM_BUDGET when it cannot.
  asio::awaitable<Reservation> make_room(int peer, std::size_t bytes, bool answering);
  // The link to `peer` is open and not held by the running operation.
  bool held(int peer) const noexcept {
    const PeerState* s = find(peer);
    return users_ > 0 && s && s->held == period_;
  }
  // Asks `peer` to close the link by agreement; true once it is closed (at both ends).
  // `settle_first`: this end must be settled to ask. let_go asks right after the link's last
  // use, while the credits for what this end sent may still be on their way back: the peer agrees
  // only when its end is settled (all it sent was released here, all it took it released), and
  // then nothing but those credits is still on its way here, which the closed link drops.
  asio::awaitable<bool> try_close(int peer, CloseReason why, bool settle_first = true);
  // A peer's request to close the link: agreed when this end is settled and not using it.
  asio::awaitable<void> serve_close(std::shared_ptr<Stream> s, std::shared_ptr<Channel> channel,
                                    Frame f);
  // Closes the (agreed) link to `peer` here, without failing anything.
  void retire(int peer, CloseReason why);
  // Waits while a close of the link to `peer` is being agreed.
  asio::awaitable<void> await_close(int peer);
  // COCCL_LINK_IDLE_S: closes links unused that long, checked periodically.
  void arm_idle_timer();
  // The address table is in: settles the slot size (LinkOptions::network_slot_bytes), then wakes
  // the link requests and address queries that waited for the table.
  void table_formed();
  // Wakes everyone waiting for the link to `peer` (made or failed).
  void announce(int peer);
  // How this rank links to `peer`; both sides decide alike from the table and the settings.
  LinkKind kind_for(int peer) const;
  // The rendezvous itself (rendezvous() adds telling the root on failure).
  asio::awaitable<void> join(std::vector<RootAddress> roots);
  // The first rank of share `at`: relays to the other roots (roots[to]) what its root sends them,
  // until its own table comes on `sock`, and until those relays end. Empty when `until` passes
  // or the root goes; throws when a relay fails or is refused.
  asio::awaitable<std::vector<std::uint8_t>> relay_until_table(
      std::shared_ptr<Stream> sock, Channel& channel, const std::vector<RootAddress>& roots, int at,
      std::chrono::steady_clock::time_point until);
  // Why the address table has not reached `target`, as its root sees it: the ranks that never
  // arrived (there, or at a root it waits for), else the host's leader that did not pass it on.
  asio::awaitable<std::string> why_no_table(int target);
  // Best effort, within a second: a notice frame with `why` to the ranks that may wait for this
  // one (every rank up to 64, else the tree neighbours).
  asio::awaitable<void> tell_everyone(std::string why);
  // "rank P reports: ..." from P's status answer, or "rank P does not answer ...", within 0.5 s.
  asio::awaitable<std::string> ask_about(int peer, std::optional<PeerInfo> where = std::nullopt);
  // A lookup's question from another rank: answered from the entries this rank holds.
  asio::awaitable<void> serve_whois(std::shared_ptr<Stream> s, std::shared_ptr<Channel> channel,
                                    Frame f);
  // Within a second, best effort: tells the root why this rank's set-up failed.
  asio::awaitable<void> tell_root(std::string why);
  // The first rank of a root's share: says goodbye on its connection to that root and lets it go
  // (no-op elsewhere, or when done already). Without the goodbye the root takes the end of the
  // connection for the rank's death and keeps answering status queries for one more COCCL_TIMEOUT.
  void leave_root();
  // "; <why>" when the root holds a failure notice of `peer`, else "".
  asio::awaitable<std::string> gone_because(int peer);
  // A recovery frame: probes are answered here, shrink requests queued.
  asio::awaitable<void> serve_recovery(std::shared_ptr<Stream> s, std::shared_ptr<Channel> channel,
                                       Frame f);

  runtime::ProxyThread& thread_;
  asio::any_io_executor ex_;
  Secret secret_;
  int rank_;
  int nranks_;
  LinkOptions options_;
  std::shared_ptr<Traffic> traffic_;  // on the in-memory network only
  FailureHandler on_failure_;
  Acceptor acceptor_;
  Admission admission_;  // connections that have not authenticated yet
  DropLog drops_;
  asio::steady_timer accept_retry_;  // pause after an accept error
  Directory directory_;
  // The connection the table is awaited on during the rendezvous: shutdown() closes it.
  std::shared_ptr<Stream> table_link_;
  // A timer used as an event: cancelled once the table is here (or on shutdown). A peer that got
  // the table earlier may dial before it reaches this rank; answering waits for it.
  asio::steady_timer table_ready_;
  LinkPoller poller_;     // shm rings; before the connections, which unregister when destroyed
  LinkPoller ib_poller_;  // verbs completion queues
  std::shared_ptr<ib::Device> ib_device_;  // COCCL_TRANSPORT=ib, or auto with a usable device
  std::shared_ptr<UserBuffers> user_buffers_;
  LinkEnv env_;                                       // what every link's set-up shares
  std::vector<std::unique_ptr<Connection>> conns_;    // in creation order
  std::vector<std::unique_ptr<Connection>> retired_;  // closed by agreement, freed soon
  // Open links by peer, sorted: a rank links to O(log N) of its N peers, so a flat vector
  // searched by halves beats N pointers.
  struct PeerState;
  class LinkIndex {
   public:
    /// A peer's open link and its entry in peer_state_ (kept with it so that the fast path's
    /// per-operation lookup, ready(), is one search of this small vector and no hash).
    struct Entry {
      int peer;
      Connection* link;
      PeerState* state;
    };
    const Entry* find(int peer) const noexcept {
      auto it = lower(peer);
      return it != links_.end() && it->peer == peer ? &*it : nullptr;
    }
    Connection* operator[](int peer) const noexcept {
      const Entry* e = find(peer);
      return e ? e->link : nullptr;
    }
    void set(int peer, Connection* c, PeerState* state) {
      auto it = lower(peer);
      if (it != links_.end() && it->peer == peer)
        *it = Entry{peer, c, state};
      else
        links_.insert(it, Entry{peer, c, state});
    }
    void erase(int peer) {
      auto it = lower(peer);
      if (it != links_.end() && it->peer == peer) links_.erase(it);
    }
    std::size_t size() const noexcept { return links_.size(); }
    /// The peers with an open link, in order (a copy: closing one changes the index).
    std::vector<int> peers() const {
      std::vector<int> out;
      out.reserve(links_.size());
      for (const Entry& e : links_) out.push_back(e.peer);
      return out;
    }

   private:
    std::vector<Entry>::const_iterator lower(int peer) const noexcept {
      return std::lower_bound(links_.begin(), links_.end(), peer,
                              [](const Entry& e, int p) { return e.peer < p; });
    }
    std::vector<Entry>::iterator lower(int peer) noexcept {
      return std::lower_bound(links_.begin(), links_.end(), peer,
                              [](const Entry& e, int p) { return e.peer < p; });
    }
    std::vector<Entry> links_;
  };
  LinkIndex by_peer_;
  using Stripe = std::pair<std::uint32_t, std::shared_ptr<Stream>>;
  // What this rank keeps of a peer it has linked, or tried or been asked to link: only such peers
  // have an entry (at 4096 ranks a rank touches about 30), so a rank's memory does not grow by
  // this much per rank of the communicator. Entries stay once made; references to them stay
  // valid (an unordered_map does not move its elements).
  struct PeerState {
    // While a link is being made or awaited: a timer used as an event (cancelled when the link
    // is ready or failed; its expiry is the deadline).
    std::shared_ptr<asio::steady_timer> pending;
    // A link to the peer is being made: dialled by this rank (higher peers) or answered (lower).
    bool dialing = false;
    bool closing = false;  // this rank asks the peer to close the link
    std::string failed;    // why the link to the peer could not be made
    // A lower peer, while this rank answers its tcp link: the link's further sockets (index,
    // socket) as they connect.
    std::unique_ptr<runtime::Mailbox<Stripe>> stripes;
    std::size_t ring_of = 0;  // its open link's ring bytes
    std::chrono::steady_clock::time_point last_used{};
    std::uint64_t held = 0;  // the span of users (period_) that last used the link
    // While closing: a timer used as an event, cancelled when the close is settled.
    std::shared_ptr<asio::steady_timer> close_done;
    std::uint64_t link_gen = 0;  // counts the links made and closed with the peer
  };
  std::unordered_map<int, PeerState> peer_state_;
  PeerState& at(int peer) { return peer_state_[peer]; }
  const PeerState* find(int peer) const {
    auto it = peer_state_.find(peer);
    return it == peer_state_.end() ? nullptr : &it->second;
  }
  bool shut_ = false;
  StatusSource status_source_;
  StatusReader status_reader_;
  std::string shut_why_;  // shutdown()'s reason, for peers that still ask for a link
  std::error_code shut_ec_;
  // Notices on their way to unlinked peers (shutdown); shared: they may outlive this object.
  std::shared_ptr<int> telling_ = std::make_shared<int>(0);
  // The first rank of a root's share: its connection to that root, held open until shutdown() (or
  // destruction) so that the root keeps answering status queries for the communicator;
  // leave_root() says goodbye on it.
  std::shared_ptr<Stream> root_link_;
  std::optional<Channel> root_channel_;
  std::optional<RootAddress> root_;  // the first root, from rendezvous()
  // While this rank leads its host's meeting (host_leader.hpp): until its table arrives.
  std::shared_ptr<HostLeader> leader_;
  std::vector<RootAddress> roots_;  // every root, from rendezvous()
  runtime::Mailbox<RecoveryRequest> recovery_box_;
  std::uint64_t shrink_attempts_ = 0;
  bool shrinking_ = false;
  // Links under a memory budget, and closed when idle.
  std::size_t budget_;                          // COCCL_MEM_BUDGET bytes, 0: none
  std::chrono::steady_clock::duration idle_{};  // COCCL_LINK_IDLE_S, 0: never
  std::size_t ring_bytes_ = 0;                  // receive rings of the open links
  std::size_t reserved_ = 0;                    // promised to links being made
  int users_ = 0;                               // Use objects alive
  std::uint64_t period_ = 0;  // counts the spans with users; PeerState::held names the span
  LinkStats stats_;
  asio::steady_timer idle_timer_;
  // Handlers that may run after this Peers began to close carry a pass and check it (the
  // destructor closes the gate).
  runtime::Gate gate_;
};

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<bool> shm_disable;         // COCCL_SHM_DISABLE
extern config::Param<std::int64_t> mem_budget;  // COCCL_MEM_BUDGET
extern config::Param<double> link_idle_s;       // COCCL_LINK_IDLE_S

}  // namespace coccl::params
