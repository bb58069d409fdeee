#include "transport/tcp.hpp"

#include <algorithm>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/error.hpp>
#include <cstring>

#include "runtime/log.hpp"
#include "transport/link_setup.hpp"
#include "transport/tcp_uring.hpp"

namespace coccl::params {

config::Param<std::int64_t> tcp_sockets{
    "COCCL_TCP_SOCKETS", 2,
    "sockets per tcp link under the uring engine (1 to 16): the first carries small puts and "
    "notices as on asio, the others are driven by io_uring, and large puts go round all of them; "
    "a link takes the smaller count of its two ends (1 where one end runs the asio engine)"};

}  // namespace coccl::params

namespace coccl::transport {

TcpConnection::TcpConnection(int self, int peer, Stream socket, std::size_t slots,
                             std::size_t slot_bytes, FailureHandler on_failure,
                             runtime::ProxyThread* thread)
    : SocketConnection(self, peer, std::move(socket), std::move(on_failure), true),
      slots_(slots),
      slot_bytes_(slot_bytes),
      filled_info_(slots) {
  loop_ = thread;
}

asio::awaitable<void> TcpConnection::put(const void* src, std::size_t n, std::uint32_t fp) {
  if (n > slot_bytes_) throw LinkError(make_error_code(errc::internal), "put larger than a slot");
  co_await park_for_credit();
  if (bye_seen_) fail_departed("was sending to it");
  if (closed_) throw_failure();
  const LinkHeader header{LinkHeader::put, fp, put_length(sent_++, n)};
  // (Where poll_bytes() is below copied_put_max, a larger put is one to send zero-copy.)
  if (n <= copied_put_max && n <= poll_bytes()) {
    // A small put is copied behind the frames already queued and completes now: the operation
    // goes on to queue its next frames, and they leave together. If the write fails, the link
    // closes and whoever waits on it next learns why.
    enqueue_copy(header, src, n);
    co_return;
  }
  bool failed = false;
  try {
    co_await asio::async_initiate<decltype(asio::use_awaitable), void(boost::system::error_code)>(
        [&](auto handler) { enqueue_put(header, src, n, Resume(std::move(handler))); },
        asio::use_awaitable);
  } catch (const boost::system::system_error&) {
    failed = true;
  }
  // A failed write closes the link shortly (after the reader had a chance to deliver the peer's
  // abort notice): wait for that, so the error reported is the real one.
  while (failed && !closed_ && !bye_seen_) {
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
  co_return chunk(slot);
}

void TcpConnection::release() {
  // Chunks are released in the order they were taken. A chunk being read stays, in its slot.
  if (parts_) {
    parts_[released_ % slots_].reset();
    if (released_ + 1 == filled_ && !reading_) parts_.reset();
  }
  ++released_;
  if (closed_ || bye_seen_) return;
  // A fast operation's credits leave with its frames.
  if (fast_active()) {
    hold_credit(1);
    return;
  }
  enqueue_credit(1);
}

bool TcpConnection::try_put_gathered(const void* head, std::size_t head_n, const void* src,
                                     std::size_t n, std::uint32_t fp) {
  if (head_n + n > poll_bytes() || bye_seen_ || !pollable()) return false;
  begin_fast();
  // Credits that came since the last look are taken first.
  if (!can_put()) pump();
  if (!can_put() || !pollable()) return false;
  hold_frame(LinkHeader{LinkHeader::put, fp, put_length(sent_++, head_n + n)}, head, head_n, src,
             n);
  return true;
}

std::optional<Chunk> TcpConnection::peek() {
  if (!pollable()) return std::nullopt;
  begin_fast();
  // The operation's puts go out before it waits for the peer's; the credits for what it takes
  // wait for its end (flush()), to leave in one frame.
  if (holds_put() || credit_waits()) write_held();
  if (filled_ == consumed_) pump();
  if (filled_ == consumed_ || closed_) return std::nullopt;
  return chunk(consumed_ % slots_);
}

std::size_t TcpConnection::poll_bytes() const noexcept {
  // A put the peer's reader can hold whole, so that its fast path takes it without waiting.
  return std::min(slot_bytes_, data_read_buffer - 2 * sizeof(LinkHeader));
}

std::size_t TcpConnection::slot_for(const LinkHeader& h) {
  if (h.length > slot_bytes_ || filled_ - released_ >= slots_)
    throw std::system_error(make_error_code(errc::bad_message), "put without credit");
  return filled_ % slots_;
}

std::byte* TcpConnection::slot_data(std::size_t slot, std::size_t bytes) {
  if (!parted()) {
    if (!ring_) ring_.reset(new std::byte[slots_ * slot_bytes_]);
    return ring_.get() + slot * slot_bytes_;
  }
  if (!parts_) parts_.reset(new std::unique_ptr<std::byte[]>[slots_]);
  std::unique_ptr<std::byte[]>& part = parts_[slot];
  if (!part) part.reset(new std::byte[bytes]);
  return part.get();
}

void TcpConnection::land(std::size_t slot, std::uint32_t size, std::uint32_t fingerprint) {
  filled_info_[slot] = SlotInfo{size, fingerprint};
  ++filled_;
  resume(recv_waiter_);
}

void TcpConnection::on_put_buffered(const LinkHeader& h, const std::byte* payload) {
  const std::size_t slot = slot_for(h);
  const auto n = static_cast<std::uint32_t>(put_bytes(h));
  std::memcpy(slot_data(slot, n), payload, n);
  land(slot, n, h.fingerprint);
}

asio::awaitable<void> TcpConnection::on_put(const LinkHeader& h, const runtime::Gate::Pass& pass) {
  // The sender holds a credit for this slot, so it is free.
  const std::size_t slot = slot_for(h);
  const auto n = static_cast<std::uint32_t>(put_bytes(h));
  // The slot's memory stays while the chunk is read into it, though every earlier chunk is
  // released meanwhile.
  reading_ = true;
  // A chunk read straight from the socket may take the next frames' first bytes after it, into
  // the rest of its slot; a smaller one is copied from the reader's buffer and needs only its own
  // room.
  const std::size_t room = n < data_read_buffer ? n : slot_bytes_;
  auto ec = co_await read_body(pass, slot_data(slot, room), n, room - n);
  if (!pass.open()) co_return;
  reading_ = false;
  if (ec) throw boost::system::system_error(ec);
  land(slot, n, h.fingerprint);
}

void TcpConnection::on_credit(std::uint64_t n) {
  // A peer returning slots this side never filled is broken (or hostile).
  if (std::string why = credit_refusal(n, sent_ - acked_); !why.empty())
    throw std::system_error(make_error_code(errc::bad_message), why);
  acked_ += n;
  resume(credit_waiter_);
}

namespace {

// A tcp link: nothing to exchange but the socket count. On the uring engine the link has an
// io_uring of its own and may stripe its puts over several sockets; on the asio engine, one.
class TcpSetup final : public LinkSetup {
 public:
  TcpSetup(const LinkEnv& env, int peer, std::size_t slots)
      : env_(env), slots_(slots), sockets_(prepare(peer)) {}

  std::vector<std::uint8_t> offer() override { return {}; }
  std::uint32_t sockets() const override { return sockets_; }
  std::vector<std::uint8_t> accept(std::span<const std::uint8_t> theirs) override {
    expect_empty(theirs);
    return {};
  }
  void complete(std::span<const std::uint8_t> theirs) override { expect_empty(theirs); }
  std::unique_ptr<Connection> make(int peer, Stream control, std::vector<Stream> further) override {
    if (!ring_ && !further.empty())
      throw std::system_error(make_error_code(errc::internal),
                              "a tcp link on the asio engine has one socket");
    if (further.empty()) {
      // One socket (the other end runs on Asio, or wants one): a ring would drive nothing.
      if (ring_) {
        COCCL_INFO(net, env_.rank, "tcp link to rank %d over 1 socket, none on io_uring", peer);
        ring_.reset();
      }
      auto c = std::make_unique<TcpConnection>(env_.rank, peer, std::move(control), slots_,
                                               env_.slot_bytes, env_.on_failure, env_.thread);
      c->start();
      return c;
    }
    // A ring is made only where links run on tcp sockets (never on the in-memory network).
    std::vector<asio::ip::tcp::socket> lanes;
    for (auto& s : further) lanes.push_back(std::move(*s.tcp()));
    COCCL_INFO(net, env_.rank, "tcp link to rank %d over %zu sockets, %zu on io_uring", peer,
               lanes.size() + 1, lanes.size());
    return make_uring_connection(env_.rank, peer, std::move(control), std::move(lanes),
                                 std::move(ring_), slots_, env_.slot_bytes, *env_.thread,
                                 env_.user_buffers, env_.on_failure);
  }

 private:
  // Makes the link's io_uring when this rank's engine is uring; returns how many sockets this
  // end wants (1 on the asio engine).
  std::uint32_t prepare(int peer) {
    // Memory streams have no descriptor for io_uring.
    if (env_.memory || tcp_engine(env_.rank) == TcpEngine::asio) return 1;
    std::string why;
    ring_ = make_uring_ring(why);
    if (!ring_) {
      if (params::tcp_engine.get() == "uring")
        throw std::system_error(make_error_code(errc::unsupported),
                                "COCCL_TCP_ENGINE=uring, but the link to rank " +
                                    std::to_string(peer) + " cannot have an io_uring: " + why);
      COCCL_INFO(net, env_.rank, "link to rank %d on asio: %s", peer, why.c_str());
      return 1;
    }
    return static_cast<std::uint32_t>(std::clamp<std::int64_t>(params::tcp_sockets.get(), 1, 16));
  }
  static void expect_empty(std::span<const std::uint8_t> theirs) {
    if (!theirs.empty())
      throw std::system_error(make_error_code(errc::bad_message),
                              "a tcp link request carries no address");
  }

  LinkEnv env_;
  std::size_t slots_;
  UringRingPtr ring_;
  std::uint32_t sockets_;
};

}  // namespace

std::unique_ptr<LinkSetup> make_tcp_setup(const LinkEnv& env, int peer, std::size_t slots) {
  return std::make_unique<TcpSetup>(env, peer, slots);
}

}  // namespace coccl::transport
