// tcp transport: a put is a frame header plus payload on the socket; the receiver's reader
// coroutine reads the payload into the next slot of its receive ring (a large one straight from
// the socket) and notifies the waiter; releasing a slot sends a credit frame back. A put of at
// most 4 KiB is copied and completes at once, so the small frames of an operation leave in one
// write (socket_connection.hpp).
#pragma once

#include <memory>
#include <vector>

#include "runtime/config.hpp"
#include "transport/socket_connection.hpp"

namespace coccl::transport {

class TcpConnection : public SocketConnection {
 public:
  /// `thread`: the proxy thread whose loop serves the link (told of coroutines parked on it),
  /// null where no other thread borrows its role.
  TcpConnection(int self, int peer, Stream socket, std::size_t slots, std::size_t slot_bytes,
                FailureHandler on_failure, runtime::ProxyThread* thread = nullptr);

  const char* kind() const noexcept override { return "tcp"; }
  std::size_t slot_bytes() const noexcept override { return slot_bytes_; }
  asio::awaitable<void> put(const void* src, std::size_t n, std::uint32_t fingerprint) override;
  asio::awaitable<Chunk> wait() override;
  void release() override;
  bool settled() const noexcept override {
    return !closed_ && filled_ == released_ && sent_ == acked_ && !recv_waiter_ &&
           !credit_waiter_ && idle_writer() && !credit_waits();
  }

  // The fast path, on a tcp socket (not the in-memory network, where coccl-sim's ranks keep to
  // their proxy threads): a put is held back and leaves with the operation's other frames at its
  // next peek() or flush(), in one write; peek() reads what the socket holds without waiting.
  // A peer that said goodbye after its last chunk (both may come in one read) leaves that chunk
  // to be taken; nothing can be put to it. Chunks ahead of a frame or an error that pump() left to
  // the reader are taken too; then the link waits for the reader (the operation is handed over at
  // once, not polled until its spin ends).
  bool pollable() const noexcept override {
    return socket_.tcp() && !closed_ && ((!departed_ && !reader_owed()) || filled_ != consumed_) &&
           !reader_busy() && (fast_active() || fast_writable());
  }
  bool try_put_gathered(const void* head, std::size_t head_n, const void* src, std::size_t n,
                        std::uint32_t fingerprint) override;
  std::optional<Chunk> peek() override;
  void take_peeked() override { ++consumed_; }
  std::size_t poll_bytes() const noexcept override;
  bool polls_cheaply() const noexcept override { return false; }
  void flush() override { end_fast(); }
  bool credit_may_wait(std::uint64_t n) const noexcept override { return slots_ > n; }

 protected:
  // For a link that carries puts on other sockets too (the io_uring engine's): where a put that
  // borrows its caller's buffer until written is queued (here: this socket), which slot a put
  // frame of this socket goes into (checked against the ring; a peer that ignores credits or
  // sends oversized frames is broken), and how a chunk that has arrived whole becomes visible
  // (in put order).
  virtual void enqueue_put(const LinkHeader& h, const void* src, std::size_t n, Resume done) {
    enqueue(h, src, n, std::move(done));
  }
  virtual std::size_t slot_for(const LinkHeader& h);
  virtual void land(std::size_t slot, std::uint32_t size, std::uint32_t fingerprint);
  // Where the chunk of `slot` goes, with room for `bytes` (at most slot_bytes_); its memory is
  // made if the slot has none.
  std::byte* slot_data(std::size_t slot, std::size_t bytes);
  void on_credit(std::uint64_t n) override;

  std::size_t slots_;
  std::size_t slot_bytes_;
  // Size and fingerprint of the chunk in each slot, in one vector (one allocation per link).
  struct SlotInfo {
    std::uint32_t size;
    std::uint32_t fingerprint;
  };
  std::vector<SlotInfo> filled_info_;
  // Receive side: chunks fully read, handed to wait(), released.
  std::uint64_t filled_ = 0, consumed_ = 0, released_ = 0;
  // Send side: puts issued, slots the peer has released.
  std::uint64_t sent_ = 0, acked_ = 0;

 private:
  asio::awaitable<void> on_put(const LinkHeader& h, const runtime::Gate::Pass& pass) override;
  void on_put_buffered(const LinkHeader& h, const std::byte* payload) override;
  // The chunk in slot `slot`.
  Chunk chunk(std::size_t slot) const {
    const SlotInfo info = filled_info_[slot];
    return Chunk{parts_ ? parts_[slot].get() : ring_.get() + slot * slot_bytes_, info.size,
                 info.fingerprint};
  }
  bool can_put() const noexcept override { return sent_ - acked_ < slots_; }
  bool can_recv() const noexcept override { return filled_ != consumed_; }

  // A ring up to this size is never made: each chunk gets memory of its own size when it arrives,
  // freed at its release, so that a rank of a large job, holding dozens of links with a chunk or
  // two in flight on a few, pays for those chunks and not for whole rings (coccl-sim). A larger
  // ring lives as long as the link, since faulting its pages in again would cost every
  // operation, and so does the ring of a link whose puts also land from other sockets
  // (put_index_), out of order.
  static constexpr std::size_t kept_ring_max = 64 << 10;
  bool parted() const noexcept { return !put_index_ && slots_ * slot_bytes_ <= kept_ring_max; }
  std::unique_ptr<std::byte[]> ring_;
  // The slots' own memory when parted(): null while no chunk is held.
  std::unique_ptr<std::unique_ptr<std::byte[]>[]> parts_;
  bool reading_ = false;  // a chunk is being read from the socket into its slot
};

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<std::int64_t> tcp_sockets;  // COCCL_TCP_SOCKETS

}  // namespace coccl::params
