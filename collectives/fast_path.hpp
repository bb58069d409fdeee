// The fast path of small host operations: an operation whose peers are all on polled links (shm;
// tcp, whose socket 0 the caller reads and writes itself, on either engine) and whose message to
// each peer fits one ring slot (and a tcp link's read buffer) runs to completion in the call that
// starts it, on the thread that holds the proxy thread's role (the proxy thread itself for a
// coroutine on the communicator's executor, or a caller that borrowed the role,
// runtime::ProxyThread::Borrow), with no coroutine, no handler and no queue. It puts the
// operation's header and data into each peer's ring, polls its own rings for theirs, and combines
// them, spinning at most COCCL_SPIN_US (as long as the proxy thread's loop spins before it sleeps).
//
// The fast path sends exactly what the algorithm the slow path would choose sends on each link
// (the header of op_check.hpp, then one data chunk), so a peer may run the same operation on either
// path: one round with every peer, or, for an all_reduce between a power of two ranks over the
// network, the rounds of recursive doubling one after the other. When its peers are late, or
// anything is out of the ordinary (a chunk that does not match, a link that failed), it stops where
// it is and the rest of the operation runs on the proxy thread through the ordinary coroutine waits
// (finish()), which also report the errors.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <coccl/communicator.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "collectives/op_check.hpp"
#include "runtime/config.hpp"
#include "runtime/engine.hpp"
#include "transport/connection.hpp"
#include "transport/peers.hpp"

namespace coccl::detail {

class CommImpl;

/// One communicator's fast-path operation (at most one at a time: the fast path runs only when no
/// other operation of the communicator is queued or running). Used by the holder of the proxy
/// thread's role only.
class FastOp {
 public:
  explicit FastOp(CommImpl& comm);

  /// Whether `a` (valid) can take the fast path now, every link it needs open and pollable; when
  /// true the links are resolved (used at `now`) for start(). Nothing is sent either way.
  bool prepare(const OpArgs& a, std::chrono::steady_clock::time_point now);
  /// Starts the prepared operation `a`, which the communicator has begun (sequence number,
  /// checks). `a` stays where it is until the operation ends or is adopted.
  void start(const OpArgs& a);
  /// Progress without waiting, within `budget` of spinning; true once the operation is complete
  /// (the receive buffer final, every chunk taken released). False: it stopped early (budget spent,
  /// another thread wants the role, or something only finish() can handle). `yield`: give the core
  /// away between polls (ranks outnumber cores); otherwise spin on it for some microseconds first,
  /// as the peers have cores of their own.
  bool run_for(std::chrono::nanoseconds budget, const runtime::ProxyThread& thread, bool yield);
  /// When the last run_for() began to wait for the peers, as read a few polls into the wait (a
  /// fraction of a microsecond late); nothing if it completed or stopped before that read.
  std::optional<std::chrono::steady_clock::time_point> waited_since() const noexcept {
    return waited_since_;
  }
  /// Keeps the arguments of an operation run_for() did not complete, for finish(): moved here,
  /// where they stay until end().
  OpArgs& adopt(OpArgs&& a) noexcept;
  /// The rest of an adopted operation, with the ordinary waits; on the proxy thread (the drain).
  /// Throws as run_op() does.
  boost::asio::awaitable<void> finish();
  /// The adopted operation's arguments.
  OpArgs& args() noexcept { return args_; }
  /// Ends the operation (done or failed): the links are no longer held by it, and its arguments
  /// are dropped.
  void end() noexcept;

 private:
  // What one peer is sent and sends: every peer of a one-round operation, or one round of
  // recursive doubling.
  struct Peer {
    int rank = 0;
    transport::Connection* link = nullptr;
    OpChecks::Pair* pair = nullptr;    // the communicator's checks of this peer (kept across ops)
    const OpHeader* header = nullptr;  // this operation's header to the peer, in *pair
    const std::byte* src = nullptr;    // this rank's chunk for the peer
    std::size_t send_bytes = 0;
    std::byte* dst = nullptr;  // where the peer's chunk is copied; null: reduced
    std::size_t recv_bytes = 0;
    bool joined = false;                      // the header (compact) and the data go in one chunk
    std::byte compact[compact_header_bytes];  // the compact header, when joined
    std::uint8_t sent = 0;                    // 0 nothing, 1 the header, 2 everything
    std::uint8_t got = 0;                     // 0 nothing, 1 the header, 2 everything
    transport::Chunk chunk{};                 // a chunk held for the reduction
  };
  // Fills rd_ once: the rounds of recursive doubling of this rank, a power of two ranks (as
  // algo::all_reduce_rd).
  void plan_rd();
  // Resolves the links of `entries` (false: one is not ready or too small for `block`).
  bool resolve(std::vector<Peer>& entries, std::size_t block,
               std::chrono::steady_clock::time_point now);
  // A round of recursive doubling has its chunk: reduced into the result, in rank order.
  void reduce_round(Peer& p);
  // Sends and takes what `p` can without waiting; false if the operation is stuck (stuck_).
  bool poll(Peer& p);
  bool step();
  // run_for() without the flush of the links at its end.
  bool spin(std::chrono::nanoseconds budget, const runtime::ProxyThread& thread, bool yield);
  // The reduction's last step: one round's chunks reduced in rank order, or recursive doubling's
  // result (reduced round by round) divided for avg.
  void combine();
  // Local copies that precede the exchange (own block into place).
  void copy_own();
  // The peer's data is at `data` (in its chunk, not yet released): copied out, or kept for the
  // reduction.
  void deliver(Peer& p, std::byte* data);

  CommImpl& c_;
  const OpArgs* a_ = nullptr;  // the running operation's arguments: the caller's, or args_
  OpArgs args_{};              // adopted
  // In the order the slow path sends to them. Entries are reused from one operation to the next
  // (filled by prepare() and start()): building and copying them in was a tenth of a 2-rank
  // 8-byte all_reduce. peers_: one round with every peer; rd_: recursive doubling's rounds, one
  // at a time (entry at_ and on).
  std::vector<Peer> peers_;
  std::vector<Peer> rd_;
  std::vector<Peer>* run_ = &peers_;  // the running operation's
  std::size_t at_ = 0;                // rd_: the round under way
  bool staged() const noexcept { return run_ == &rd_; }
  std::vector<const void*> srcs_;    // rank-ordered sources of a reduction
  std::vector<std::byte> own_copy_;  // this rank's contribution when it aliases the result
  std::uint32_t fp_ = 0;
  std::size_t elt_ = 0;
  bool reduces_ = false;
  bool stuck_ = false;       // a chunk finish() has to judge
  unsigned spin_limit_ = 0;  // polls spent on the core before the wait yields between polls
  std::optional<std::chrono::steady_clock::time_point> waited_since_;
  std::optional<transport::Peers::Use> use_;
};

}  // namespace coccl::detail

namespace coccl::params {

extern config::Param<std::int64_t> fast_max_bytes;  // COCCL_FAST_MAX_BYTES

}  // namespace coccl::params
