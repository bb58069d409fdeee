// Frames that authenticated once, replayed: on another connection (a capture from an earlier run
// with the same secret, or from another link), or again and out of order on their own connection.
// Each is rejected; the victim neither crashes nor returns wrong data.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <optional>

#include "attacker.hpp"
#include "collectives/comm_params.hpp"
#include "transport/bootstrap.hpp"
#include "transport/wire.hpp"

namespace coccl::test {
namespace {

using namespace std::chrono_literals;
using transport::Channel;
using transport::FrameType;

// Runs `a` and `b` on `io` until both finish; rethrows the first failure.
template <typename A, typename B>
void run_both(asio::io_context& io, A a, B b) {
  std::exception_ptr ea, eb;
  int done = 0;
  asio::co_spawn(io, std::move(a), [&](std::exception_ptr e) { ea = e, ++done; });
  asio::co_spawn(io, std::move(b), [&](std::exception_ptr e) { eb = e, ++done; });
  io.restart();
  io.run_for(10s);
  ASSERT_EQ(done, 2);
  if (ea) std::rethrow_exception(ea);
  if (eb) std::rethrow_exception(eb);
}

// A connected pair of sockets on `io` with a channel on each end, made by the real handshake.
struct ChannelPair {
  explicit ChannelPair(asio::io_context& io, const transport::Secret& secret)
      : dialler(tcp::socket(io)), listener(tcp::socket(io)) {
    tcp::acceptor a(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    dialler.tcp()->connect(a.local_endpoint());
    a.accept(*listener.tcp());
    run_both(
        io,
        [&]() -> asio::awaitable<void> { d.emplace(co_await Channel::initiate(dialler, secret)); },
        [&]() -> asio::awaitable<void> { l.emplace(co_await Channel::respond(listener, secret)); });
  }
  transport::Stream dialler, listener;
  std::optional<Channel> d, l;
};

// Reads one frame on the listener's end; returns the error code it failed with (none if read).
std::error_code read_one(asio::io_context& io, ChannelPair& p) {
  std::error_code code;
  std::exception_ptr error;
  bool done = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> { co_await transport::read_frame(p.listener, *p.l, 4096); },
      [&](std::exception_ptr e) {
        error = e;
        done = true;
      });
  io.restart();
  io.run_for(5s);
  EXPECT_TRUE(done);
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::system_error& e) {
      code = e.code();
    }
  }
  return code;
}

std::vector<std::uint8_t> bytes_of(std::string_view s) { return {s.begin(), s.end()}; }

transport::Secret random_secret() { return transport::decode(UniqueId::create()).secret; }

TEST(Replay, AFrameReplayedOnItsOwnConnectionIsRejected) {
  asio::io_context io;
  ChannelPair p(io, random_secret());
  auto frame = p.d->seal(FrameType::ctrl, bytes_of("first"));
  asio::write(*p.dialler.tcp(), asio::buffer(frame));
  EXPECT_FALSE(read_one(io, p));
  asio::write(*p.dialler.tcp(), asio::buffer(frame));
  EXPECT_EQ(read_one(io, p), errc::bad_message);
}

TEST(Replay, FramesDeliveredOutOfOrderAreRejected) {
  asio::io_context io;
  ChannelPair p(io, random_secret());
  auto first = p.d->seal(FrameType::ctrl, bytes_of("first"));
  auto second = p.d->seal(FrameType::ctrl, bytes_of("second"));
  asio::write(*p.dialler.tcp(), asio::buffer(second));
  EXPECT_EQ(read_one(io, p), errc::bad_message);
}

TEST(Replay, AFrameReflectedBackToItsSenderIsRejected) {
  asio::io_context io;
  ChannelPair p(io, random_secret());
  // The listener's first frame, sent back to the listener as if the dialler had written it.
  auto frame = p.l->seal(FrameType::ctrl, bytes_of("from the listener"));
  asio::write(*p.dialler.tcp(), asio::buffer(frame));
  EXPECT_EQ(read_one(io, p), errc::bad_message);
}

TEST(Replay, AFrameFromAnotherConnectionWithTheSameSecretIsRejected) {
  asio::io_context io;
  auto secret = random_secret();
  ChannelPair earlier(io, secret), now(io, secret);
  auto captured = earlier.d->seal(FrameType::ctrl, bytes_of("captured"));
  asio::write(*now.dialler.tcp(), asio::buffer(captured));
  EXPECT_EQ(read_one(io, now), errc::bad_message);
}

TEST(Replay, AListenerWithTheWrongSecretIsRefusedByTheDialler) {
  asio::io_context io;
  transport::Stream dialler(tcp::socket{io}), listener(tcp::socket{io});
  tcp::acceptor a(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  dialler.tcp()->connect(a.local_endpoint());
  a.accept(*listener.tcp());
  try {
    run_both(
        io,
        [&]() -> asio::awaitable<void> { co_await Channel::initiate(dialler, random_secret()); },
        [&]() -> asio::awaitable<void> { co_await Channel::respond(listener, random_secret()); });
    FAIL() << "the dialler accepted a listener with another secret";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::bad_message) << e.what();
  }
}

// A connect request rank 0 would send to rank 1 (tcp link, the job's link settings), sealed on a
// connection the attacker recorded, with the secret a reused COCCL_SECRET would give it.
std::vector<std::uint8_t> captured_connect(asio::io_context& io, const transport::Secret& secret) {
  ChannelPair recorded(io, secret);
  transport::Writer w;
  w.put<std::int32_t>(0).put<std::int32_t>(1).put<std::uint8_t>(0);
  w.put<std::uint64_t>(params::slots.get()).put<std::uint64_t>(params::slot_bytes.get());
  w.put_bytes({}).put_bytes({});
  return recorded.d->seal(FrameType::connect, w.bytes());
}

TEST(Replay, ACapturedConnectRequestReplayedToARankIsDroppedAndTheJobIsUnharmed) {
  params::transport.set_override("tcp");
  UniqueId id = UniqueId::create();
  TwoRanks job(id, 4096);
  ASSERT_FALSE(job.formed_error(1)) << job.formed_error(1).message();
  asio::io_context io;
  auto frame = captured_connect(io, transport::decode(id).secret);
  auto victims = connect_many(io, job.listener(1), 8);
  for (auto& v : victims) {
    open_handshake(*v);
    asio::write(*v, asio::buffer(frame));
  }
  std::size_t answered = 0;
  EXPECT_EQ(count_closed(io, victims, 10s, &answered), 8);
  EXPECT_EQ(answered, 0u) << "rank 1 answered a replayed connection request";
  auto results = job.all_reduce();
  params::transport.set_override(std::nullopt);
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(summed(results[r])) << "rank " << r << ": " << results[r].ec.message();
}

}  // namespace
}  // namespace coccl::test
