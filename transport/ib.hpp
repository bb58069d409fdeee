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
//
// Blocks (transfers of at least COCCL_IB_ZCOPY_MIN bytes, see Connection) use a rendezvous: the
// receiver SENDs an offer naming its buffer (address and rkey when the user registered it, else
// "staged"); the sender, when its own buffer is registered too, RDMA-writes straight from it into
// the receiver's, split over the queue pairs like a put, with a block flag and the block's id in
// the immediates; otherwise it SENDs a decline (for a registered offer) and the bytes go through
// the ring as ordinary puts. A receiver keeps at most ib::block_window offers outstanding beyond
// the one it waits for, and a sender at most block_window + 1 blocks of writes in flight, which
// bounds the receives and send slots they use (see Link).
#pragma once

#include <boost/asio/posix/stream_descriptor.hpp>
#include <deque>
#include <memory>
#include <vector>

#include "transport/ib_link.hpp"
#include "transport/link_poller.hpp"
#include "transport/socket_connection.hpp"
#include "transport/user_buffers.hpp"

namespace coccl::transport {

/// The poller of a communicator's ib connections. A connection stays in its list while someone
/// waits on it; the proxy thread may sleep while every listed connection has its completion
/// channel armed.
using IbPoller = LinkPoller;

class IbConnection final : public SocketConnection, public PolledLink {
 public:
  /// `link` is connected (both sides in RTS). `buffers` are the communicator's registered user
  /// buffers (blocks in them move zero-copy). Starts watching the completion channel.
  IbConnection(int self, int peer, Stream socket, std::unique_ptr<ib::Link> link,
               std::size_t split_bytes, IbPoller& poller, std::shared_ptr<UserBuffers> buffers,
               FailureHandler on_failure);
  ~IbConnection() override;

  const char* kind() const noexcept override { return "ib"; }
  std::size_t slot_bytes() const noexcept override { return slot_bytes_; }
  asio::awaitable<void> put(const void* src, std::size_t n, std::uint32_t fingerprint) override;
  asio::awaitable<Chunk> wait() override;
  void release() override;

  bool uses_blocks(std::size_t n) const noexcept override;
  std::uint64_t offer(void* dst, std::size_t n, std::uint32_t fingerprint) override;
  asio::awaitable<bool> landed(std::uint64_t id) override;
  asio::awaitable<BlockOffer> next_offer() override;
  asio::awaitable<bool> write_block(const void* src, std::size_t n) override;
  asio::awaitable<void> flush_blocks() override;

  /// Called by the poller: processes completions, arms the channel when there were none, resumes
  /// waiters whose condition holds. True if anything progressed.
  bool check() override;
  bool has_waiter() const noexcept override {
    return recv_waiter_.has_value() || credit_waiter_.has_value();
  }
  /// Leaving the poller's list armed: completions (credits, send completions) must still be
  /// processed when nobody waits on the connection.
  void idle() override { arm(); }
  /// An armed connection wakes the event loop through its channel.
  bool wakes_thread() const noexcept override { return armed_; }
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
  // Copies `msg` into the next control buffer and SENDs it on queue pair 0; on failure closes the
  // connection (naming `what`) and returns false.
  bool post_control(const void* msg, std::size_t n, const char* what);
  // Control messages other than credits (offers, declines): sent in order as control buffers
  // free up.
  // An offer or a decline on the wire (a credit is a bare 8-byte count).
  struct Control {
    enum Type : std::uint32_t { offer_registered = 1, offer_staged = 2, decline = 3 };
    std::uint32_t type;
    std::uint32_t fingerprint;
    std::uint64_t id;
    std::uint64_t addr;
    std::uint64_t size;
    std::uint32_t rkey;
    std::uint32_t reserved;
  };
  static_assert(sizeof(Control) <= ib::ctrl_bytes && sizeof(Control) != sizeof(std::uint64_t));
  void send_control(const Control& m);
  void flush_control();
  void on_control(const Control& m);
  void on_block_write(std::uint32_t imm);
  void send_offers();
  void protocol_error(const char* what);
  // Splits `total` bytes at `from` into pieces over the least loaded queue pairs and posts them as
  // RDMA writes with immediate `imm` (its low bits get the piece count). Returns the count.
  std::size_t post_writes(std::uintptr_t from, std::uint32_t lkey, std::size_t total,
                          std::uint64_t remote, std::uint32_t rkey, std::uint32_t imm,
                          std::uint64_t wr_id);
  bool can_put() const noexcept override;
  bool can_recv() const noexcept override;
  void before_park() override { poller_.activate(this); }
  void wake(bool now);
  [[noreturn]] void post_failed(const char* what);

  // What the sending / receiving coroutine is parked for when it is not a slot or a chunk.
  enum class SendWait { slot, offer, write_room, flushed };
  enum class RecvWait { chunk, block };
  SendWait send_wait_ = SendWait::slot;
  RecvWait recv_wait_ = RecvWait::chunk;

  std::unique_ptr<ib::Link> link_;
  std::shared_ptr<UserBuffers> buffers_;
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
  std::deque<Control> control_queue_;
  // Receive side of blocks: offers made and not yet landed (oldest first), their ids, how many
  // offers have been sent, and the id landed() was last called for plus one.
  struct Offered {
    std::uint64_t id;
    std::uint64_t addr;
    std::size_t size;
    std::uint32_t fingerprint;
    std::shared_ptr<const ib::Registration> reg;  // null: staged
    std::uint32_t pieces = 0, arrived = 0;
    bool declined = false;
    bool settled() const noexcept { return !reg || declined || (pieces && arrived == pieces); }
  };
  std::deque<Offered> offered_;
  std::uint64_t next_offer_id_ = 0, offers_sent_ = 0, landing_ = 0;
  // Send side: offers received and not yet answered (in id order), the id expected next, and the
  // blocks whose writes are in flight (each holds its source's registration until done).
  struct Grant {
    std::uint64_t id;
    std::uint64_t addr;
    std::uint64_t size;
    std::uint32_t rkey;
    std::uint32_t fingerprint;
    bool direct;
  };
  std::deque<Grant> grants_;
  std::uint64_t next_grant_id_ = 0;
  struct Flight {
    std::uint64_t id;
    std::size_t left;
    std::shared_ptr<const ib::Registration> reg;
  };
  std::deque<Flight> flights_;
  runtime::Gate gate_;  // closed by the destructor: handlers still queued then do nothing
};

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<std::int64_t> ib_qps_per_peer;  // COCCL_IB_QPS_PER_PEER
extern config::Param<std::int64_t> ib_split_bytes;   // COCCL_IB_SPLIT_BYTES
extern config::Param<std::int64_t> ib_zcopy_min;     // COCCL_IB_ZCOPY_MIN

}  // namespace coccl::params
