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

class TcpConnection final : public SocketConnection {
 public:
  TcpConnection(int self, int peer, Stream socket, std::size_t slots, std::size_t slot_bytes,
                FailureHandler on_failure);

  const char* kind() const noexcept override { return "tcp"; }
  std::size_t slot_bytes() const noexcept override { return slot_bytes_; }
  asio::awaitable<void> put(const void* src, std::size_t n, std::uint32_t fingerprint) override;
  asio::awaitable<Chunk> wait() override;
  void release() override;
  bool settled() const noexcept override {
    return !closed_ && filled_ == released_ && sent_ == acked_ && !recv_waiter_ &&
           !credit_waiter_ && idle_writer();
  }

 private:
  asio::awaitable<void> on_put(const LinkHeader& h, const runtime::Gate::Pass& pass) override;
  void on_credit(std::uint64_t n) override;
  bool can_put() const noexcept override { return sent_ - acked_ < slots_; }
  bool can_recv() const noexcept override { return filled_ != consumed_; }

  // Rings up to this size are allocated when a chunk arrives and freed when every chunk is
  // released; larger ones live as long as the link.
  static constexpr std::size_t kept_ring_max = 64 << 10;
  std::size_t slots_;
  std::size_t slot_bytes_;
  std::unique_ptr<std::byte[]> ring_;  // null while no chunk is held (small rings only)
  bool reading_ = false;               // a chunk is being read into ring_
  std::vector<std::uint32_t> sizes_;
  std::vector<std::uint32_t> fingerprints_;
  // Receive side: chunks fully read, handed to wait(), released.
  std::uint64_t filled_ = 0, consumed_ = 0, released_ = 0;
  // Send side: puts issued, slots the peer has released.
  std::uint64_t sent_ = 0, acked_ = 0;
};

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<std::int64_t> tcp_sockets;  // COCCL_TCP_SOCKETS

}  // namespace coccl::params
