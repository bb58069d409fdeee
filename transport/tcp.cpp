#include "transport/tcp.hpp"

#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/error.hpp>

namespace coccl::transport {

TcpConnection::TcpConnection(int self, int peer, asio::ip::tcp::socket socket, std::size_t slots,
                             std::size_t slot_bytes, FailureHandler on_failure)
    : SocketConnection(self, peer, std::move(socket), std::move(on_failure)),
      slots_(slots),
      slot_bytes_(slot_bytes),
      ring_(new std::byte[slots * slot_bytes]),
      sizes_(slots),
      fingerprints_(slots) {}

asio::awaitable<void> TcpConnection::put(const void* src, std::size_t n, std::uint32_t fp) {
  if (n > slot_bytes_) throw LinkError(make_error_code(errc::internal), "put larger than a slot");
  co_await park_for_credit();
  if (departed_) fail_departed("was sending to it");
  if (closed_) throw_failure();
  ++sent_;
  bool failed = false;
  try {
    co_await asio::async_initiate<decltype(asio::use_awaitable), void(boost::system::error_code)>(
        [&](auto handler) {
          enqueue(LinkHeader{LinkHeader::put, fp, n}, src, n, std::move(handler));
        },
        asio::use_awaitable);
  } catch (const boost::system::system_error&) {
    failed = true;
  }
  // A failed write closes the link shortly (after the reader had a chance to deliver the peer's
  // abort notice): wait for that, so the error reported is the real one.
  while (failed && !closed_ && !departed_) {
    try {
      co_await suspend(credit_waiter_);
    } catch (const boost::system::system_error&) {
    }
  }
  if (failed && !closed_) fail_departed("was sending to it");
  if (closed_) throw_failure();
}

asio::awaitable<Chunk> TcpConnection::wait() {
  co_await park_for_data();
  // Chunks that fully arrived are delivered even after the peer left or the link closed: a peer
  // that sent everything and then destroyed its communicator did nothing wrong.
  if (filled_ == consumed_) {
    if (departed_) fail_departed("was waiting for data from it");
    throw_failure();
  }
  std::size_t slot = consumed_ % slots_;
  ++consumed_;
  co_return Chunk{ring_.get() + slot * slot_bytes_, sizes_[slot], fingerprints_[slot]};
}

void TcpConnection::release() {
  ++released_;
  if (closed_ || departed_) return;
  enqueue(LinkHeader{LinkHeader::credit, 0, 1}, nullptr, 0, {});
}

asio::awaitable<void> TcpConnection::on_put(const LinkHeader& h) {
  // The sender holds a credit for this slot, so it is free; a peer that ignores credits or
  // sends oversized frames is broken.
  if (h.length > slot_bytes_ || filled_ - released_ >= slots_)
    throw std::system_error(make_error_code(errc::bad_message), "put without credit");
  std::size_t slot = filled_ % slots_;
  co_await asio::async_read(socket_, asio::buffer(ring_.get() + slot * slot_bytes_, h.length),
                            asio::use_awaitable);
  sizes_[slot] = static_cast<std::uint32_t>(h.length);
  fingerprints_[slot] = h.fingerprint;
  ++filled_;
  resume(recv_waiter_);
}

void TcpConnection::on_credit(std::uint64_t n) {
  acked_ += n;
  resume(credit_waiter_);
}

}  // namespace coccl::transport
