// ib transport: a connection over RDMA verbs (InfiniBand or RoCE).
//
// A put copies the chunk into a registered send slot behind a small header (size, fingerprint)
// and writes it with RDMA_WRITE_WITH_IMM into the same slot of the peer's registered receive
// ring. A large put is split into pieces over the connection's queue pairs (the least loaded
// first); every piece carries in its immediate the put's sequence number and the piece count, and
// the receiver hands out a chunk once all its pieces are in, in sequence order, whatever order the
// queue pairs completed them in. Releasing a slot returns a credit to the sender with a SEND of
// the cumulative released count on queue pair 0, into receives posted in advance.
//
// Completions: while a coroutine waits on the connection, the proxy thread's driver loop polls
// the completion queue (IbPoller); when a poll finds nothing the completion channel is armed, and
// its file descriptor wakes the Asio loop (stream_descriptor::async_wait) once the thread sleeps.
// A completion with an error fails the connection with the peer's rank and the verbs status.
// As for shm, the TCP socket that set the link up stays open to detect a dead peer and carry
// abort and goodbye notices.
#pragma once

#include <boost/asio/posix/stream_descriptor.hpp>
#include <memory>
#include <vector>

#include "runtime/engine.hpp"
#include "transport/ib_link.hpp"
#include "transport/socket_connection.hpp"

namespace coccl::transport {

class IbConnection;

/// Polls the ib connections of one communicator that have a waiter and whose completion channel
/// is not armed. Lives on its proxy thread.
class IbPoller final : public runtime::Poller {
 public:
  bool poll() override;
  bool waiting() const override;
  void activate(IbConnection* c);
  void forget(IbConnection* c);

 private:
  std::vector<IbConnection*> active_;
  std::vector<IbConnection*> scan_;
};

class IbConnection final : public SocketConnection {
 public:
  /// `link` is connected (both sides in RTS). Starts watching the completion channel.
  IbConnection(int self, int peer, asio::ip::tcp::socket socket, std::unique_ptr<ib::Link> link,
               std::size_t split_bytes, IbPoller& poller, FailureHandler on_failure);
  ~IbConnection() override;

  const char* kind() const noexcept override { return "ib"; }
  std::size_t slot_bytes() const noexcept override { return slot_bytes_; }
  asio::awaitable<void> put(const void* src, std::size_t n, std::uint32_t fingerprint) override;
  asio::awaitable<Chunk> wait() override;
  void release() override;

  /// Called by IbPoller: processes completions, arms the channel when there were none, resumes
  /// waiters whose condition holds. True if anything progressed.
  bool check();
  bool has_waiter() const noexcept {
    return recv_waiter_.has_value() || credit_waiter_.has_value();
  }
  bool armed() const noexcept { return armed_; }
  /// Requests an event for the next completion (then drains once more), unless already armed.
  void arm();

 private:
  // Polls the completion queue dry; true if it found any completion.
  bool drain();
  // drain(); arms the channel only when nothing was found (busy: keep polling).
  bool progress();
  void watch();
  void on_completion(const ibv_wc& wc);
  void on_error(const ibv_wc& wc);
  void send_credit();
  bool can_put() const noexcept override;
  bool can_recv() const noexcept override;
  void before_park() override { poller_.activate(this); }
  void wake(bool now);
  [[noreturn]] void post_failed(const char* what);

  std::unique_ptr<ib::Link> link_;
  std::size_t slots_;
  std::size_t slot_bytes_;
  std::size_t split_bytes_;
  IbPoller& poller_;
  asio::posix::stream_descriptor events_;
  bool armed_ = false;
  unsigned unacked_events_ = 0;
  // Send side: puts posted, slots the peer released (from its credits), data writes in flight
  // per queue pair, where the next tie-break starts.
  std::uint64_t sent_ = 0, acked_ = 0;
  std::vector<std::size_t> in_flight_;
  std::size_t next_qp_ = 0;
  // Receive side: pieces arrived and expected per slot; chunks handed out and released.
  std::vector<std::uint32_t> arrived_, pieces_;
  std::uint64_t consumed_ = 0, released_ = 0;
  // Credits: the released count last sent, control sends in flight, the next control buffer.
  std::uint64_t credited_ = 0;
  std::size_t ctrl_in_flight_ = 0, ctrl_next_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace coccl::transport
