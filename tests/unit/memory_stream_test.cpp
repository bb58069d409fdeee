// The in-memory network (transport/memory.hpp): streams behave as code written for tcp expects
// (order, partial reads, end of stream on close, broken pipe, back-pressure, close and cancel
// under a pending read), listeners accept what is dialled, and a dial where nobody listens is
// refused.
#include <gtest/gtest.h>

#include <array>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <coccl/error.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/memory.hpp"
#include "transport/net.hpp"

namespace coccl {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using transport::Stream;
using namespace std::chrono_literals;

struct Result {
  std::optional<error_code> ec;
  std::size_t n = 0;
};

// A completion handler that records what it was called with.
auto record(Result& r) {
  return [&r](error_code ec, std::size_t n) {
    r.ec = ec;
    r.n = n;
  };
}

std::vector<std::uint8_t> bytes(std::size_t n, std::uint8_t first) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(first + i * 13);
  return v;
}

TEST(MemoryStream, DeliversBytesInOrderAcrossWritesAndPartialReads) {
  asio::io_context io;
  auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 1 << 20);
  const auto first = bytes(1000, 1), second = bytes(3000, 7);
  Result w1, w2;
  asio::async_write(a, asio::buffer(first), record(w1));
  io.run();
  io.restart();
  asio::async_write(a, asio::buffer(second), record(w2));
  // A read of fewer bytes than queued takes just those.
  std::vector<std::uint8_t> got(10);
  Result r1;
  b.async_read_some(asio::buffer(got), record(r1));
  io.run();
  io.restart();
  ASSERT_EQ(w1.ec, error_code());
  ASSERT_EQ(w2.ec, error_code());
  EXPECT_EQ(w2.n, second.size());
  ASSERT_EQ(r1.ec, error_code());
  ASSERT_EQ(r1.n, 10u);
  std::vector<std::uint8_t> rest(first.size() + second.size() - 10);
  Result r2;
  asio::async_read(b, asio::buffer(rest), record(r2));
  io.run();
  ASSERT_EQ(r2.ec, error_code());
  got.insert(got.end(), rest.begin(), rest.end());
  std::vector<std::uint8_t> want = first;
  want.insert(want.end(), second.begin(), second.end());
  EXPECT_EQ(got, want);
}

TEST(MemoryStream, AReadIntoSeveralBuffersCrossesTheBoundariesOfWrites) {
  asio::io_context io;
  auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 64);
  const auto first = bytes(5, 1), second = bytes(1, 50), third = bytes(6, 90);
  error_code ec;
  for (const auto* w : {&first, &second, &third})
    ASSERT_EQ(a.write_some_now(asio::buffer(*w), ec), w->size());
  // 3 + 4 + 5 bytes: the buffers and the writes are cut in different places.
  std::array<std::uint8_t, 3> x{};
  std::array<std::uint8_t, 4> y{};
  std::array<std::uint8_t, 5> z{};
  const std::array<asio::mutable_buffer, 3> into{asio::buffer(x), asio::buffer(y), asio::buffer(z)};
  Result r;
  b.async_read_some(into, record(r));
  io.run();
  ASSERT_EQ(r.ec, error_code());
  ASSERT_EQ(r.n, 12u);
  std::vector<std::uint8_t> got(x.begin(), x.end());
  got.insert(got.end(), y.begin(), y.end());
  got.insert(got.end(), z.begin(), z.end());
  std::vector<std::uint8_t> want = first;
  want.insert(want.end(), second.begin(), second.end());
  want.insert(want.end(), third.begin(), third.end());
  EXPECT_EQ(got, want);
}

TEST(MemoryStream, CompletesNothingInsideTheInitiatingCall) {
  asio::io_context io;
  auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 64);
  std::uint8_t in[4] = {}, out[4] = {1, 2, 3, 4};
  Result r, w;
  b.async_read_some(asio::buffer(in), record(r));
  a.async_write_some(asio::buffer(out), record(w));
  EXPECT_FALSE(r.ec);
  EXPECT_FALSE(w.ec);
  io.run();
  EXPECT_EQ(r.ec, error_code());
  EXPECT_EQ(r.n, 4u);
  EXPECT_EQ(in[3], 4);
}

TEST(MemoryStream, CloseIsAnEndOfStreamAfterWhatWasQueued) {
  asio::io_context io;
  auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 64);
  const std::uint8_t out[3] = {9, 8, 7};
  Result w;
  asio::async_write(a, asio::buffer(out), record(w));
  io.run();
  io.restart();
  error_code ignored;
  a.close(ignored);
  EXPECT_FALSE(a.is_open());
  std::uint8_t in[8] = {};
  Result r1, r2;
  b.async_read_some(asio::buffer(in), record(r1));
  io.run();
  io.restart();
  EXPECT_EQ(r1.ec, error_code());
  EXPECT_EQ(r1.n, 3u);
  b.async_read_some(asio::buffer(in), record(r2));
  io.run();
  EXPECT_EQ(r2.ec, error_code(asio::error::eof));
}

TEST(MemoryStream, APendingReadSeesTheEndOfStreamWhenThePeerCloses) {
  asio::io_context io;
  auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 64);
  std::uint8_t in[8] = {};
  Result r;
  b.async_read_some(asio::buffer(in), record(r));
  io.poll();
  io.restart();
  EXPECT_FALSE(r.ec);
  error_code ignored;
  a.close(ignored);
  io.run();
  EXPECT_EQ(r.ec, error_code(asio::error::eof));
}

TEST(MemoryStream, AWriteToAClosedPeerIsABrokenPipe) {
  asio::io_context io;
  auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 64);
  error_code ignored;
  b.close(ignored);
  const std::uint8_t out[3] = {1, 2, 3};
  Result w;
  a.async_write_some(asio::buffer(out), record(w));
  io.run();
  EXPECT_EQ(w.ec, error_code(asio::error::broken_pipe));
  error_code now;
  EXPECT_EQ(a.write_some_now(asio::buffer(out), now), 0u);
  EXPECT_EQ(now, error_code(asio::error::broken_pipe));
}

TEST(MemoryStream, AWriterWaitsWhileTheQueueIsFullAndResumesAsTheReaderDrains) {
  asio::io_context io;
  constexpr std::size_t capacity = 100;
  auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), capacity);
  const auto out = bytes(350, 3);
  Result w;
  asio::async_write(a, asio::buffer(out), record(w));
  io.run();
  io.restart();
  // Only the capacity went in: the write waits for the reader.
  EXPECT_FALSE(w.ec);
  std::vector<std::uint8_t> in(out.size());
  std::size_t got = 0;
  while (got < out.size()) {
    Result r;
    b.async_read_some(asio::buffer(in.data() + got, in.size() - got), record(r));
    io.run();
    io.restart();
    ASSERT_EQ(r.ec, error_code());
    ASSERT_LE(r.n, capacity);
    ASSERT_GT(r.n, 0u);
    got += r.n;
  }
  EXPECT_EQ(w.ec, error_code());
  EXPECT_EQ(w.n, out.size());
  EXPECT_EQ(in, out);
}

TEST(MemoryStream, WriteSomeNowTakesOnlyWhatFits) {
  asio::io_context io;
  auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 5);
  const std::uint8_t out[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  error_code ec;
  EXPECT_EQ(a.write_some_now(asio::buffer(out), ec), 5u);
  EXPECT_FALSE(ec);
  EXPECT_EQ(a.write_some_now(asio::buffer(out), ec), 0u);
  EXPECT_FALSE(ec);
}

TEST(MemoryStream, ClosingAStreamAbortsItsPendingRead) {
  asio::io_context io;
  auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 64);
  std::uint8_t in[8] = {};
  Result r;
  b.async_read_some(asio::buffer(in), record(r));
  io.poll();
  io.restart();
  error_code ignored;
  b.close(ignored);
  io.run();
  EXPECT_EQ(r.ec, error_code(asio::error::operation_aborted));
  // The peer's writes now fail.
  io.restart();
  Result w;
  a.async_write_some(asio::buffer(in), record(w));
  io.run();
  EXPECT_EQ(w.ec, error_code(asio::error::broken_pipe));
}

TEST(MemoryStream, CancellingAPendingReadAbortsItAndLaterBytesStillArrive) {
  asio::io_context io;
  auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 64);
  asio::cancellation_signal signal;
  std::uint8_t in[4] = {};
  Result r;
  b.async_read_some(asio::buffer(in), asio::bind_cancellation_slot(signal.slot(), record(r)));
  io.poll();
  io.restart();
  signal.emit(asio::cancellation_type::terminal);
  io.run();
  io.restart();
  EXPECT_EQ(r.ec, error_code(asio::error::operation_aborted));
  const std::uint8_t out[2] = {5, 6};
  Result w, r2;
  a.async_write_some(asio::buffer(out), record(w));
  b.async_read_some(asio::buffer(in), record(r2));
  io.run();
  EXPECT_EQ(r2.ec, error_code());
  EXPECT_EQ(r2.n, 2u);
  EXPECT_EQ(in[1], 6);
}

TEST(MemoryStream, EndsOnTwoThreadsCarryAStreamBothWays) {
  asio::io_context one, two;
  auto [a, b] = transport::memory::make_pair(one.get_executor(), two.get_executor(), 1000);
  const auto out = bytes(100000, 5);
  std::vector<std::uint8_t> in(out.size());
  Result w, r;
  // A parked operation holds no work on its context: the guards keep both running until done.
  auto g1 = asio::make_work_guard(one);
  auto g2 = asio::make_work_guard(two);
  asio::async_write(a, asio::buffer(out), [&](error_code ec, std::size_t) {
    w.ec = ec;
    g1.reset();
  });
  asio::async_read(b, asio::buffer(in), [&](error_code ec, std::size_t) {
    r.ec = ec;
    g2.reset();
  });
  std::thread t([&] { two.run_for(20s); });
  one.run_for(20s);
  t.join();
  EXPECT_EQ(w.ec, error_code());
  EXPECT_EQ(r.ec, error_code());
  EXPECT_EQ(in, out);
}

TEST(MemoryNetwork, AListenerAcceptsWhatIsDialled) {
  asio::io_context io;
  transport::Acceptor acceptor(io.get_executor());
  acceptor.listen_memory();
  const transport::PeerInfo where = acceptor.local_info();
  EXPECT_TRUE(transport::is_memory(where));
  std::optional<Stream> accepted;
  acceptor.async_accept([&](error_code ec, Stream s) {
    EXPECT_FALSE(ec);
    accepted.emplace(std::move(s));
  });
  auto dialled = asio::co_spawn(
      io, transport::dial(io.get_executor(), where, std::chrono::steady_clock::now() + 5s, true),
      asio::use_future);
  io.run_for(5s);
  ASSERT_TRUE(accepted);
  auto mine = dialled.get();
  const std::uint8_t out[3] = {1, 2, 3};
  std::uint8_t in[3] = {};
  io.restart();
  Result w, r;
  asio::async_write(*mine, asio::buffer(out), record(w));
  asio::async_read(*accepted, asio::buffer(in), record(r));
  io.run_for(5s);
  EXPECT_EQ(r.ec, error_code());
  EXPECT_EQ(in[2], 3);
}

TEST(MemoryNetwork, DialsWaitingForAnAcceptAreAcceptedInTheOrderDialled) {
  asio::io_context io;
  auto listener = transport::memory::Listener::open(io.get_executor());
  // Three dials before any accept, then one after the first three were accepted.
  std::vector<Stream> dialled;
  const auto dial = [&](std::uint8_t tag) {
    auto s = transport::memory::Listener::connect(listener->number(), io.get_executor());
    ASSERT_TRUE(s);
    error_code ec;
    ASSERT_EQ(s->write_some_now(asio::buffer(&tag, 1), ec), 1u);
    dialled.push_back(std::move(*s));
  };
  std::vector<std::uint8_t> tags;
  const auto accept = [&] {
    std::optional<Stream> accepted;
    listener->async_accept([&](error_code ec, Stream s) {
      EXPECT_FALSE(ec);
      accepted.emplace(std::move(s));
    });
    io.run();
    io.restart();
    ASSERT_TRUE(accepted);
    std::uint8_t tag = 0;
    Result r;
    asio::async_read(*accepted, asio::buffer(&tag, 1), record(r));
    io.run();
    io.restart();
    ASSERT_EQ(r.ec, error_code());
    tags.push_back(tag);
  };
  for (std::uint8_t tag : {1, 2, 3}) dial(tag);
  for (int i = 0; i < 3; ++i) accept();
  dial(4);
  accept();
  EXPECT_EQ(tags, (std::vector<std::uint8_t>{1, 2, 3, 4}));
}

TEST(MemoryNetwork, ADialWhereNobodyListensIsRefused) {
  asio::io_context io;
  transport::PeerInfo where;
  {
    transport::Acceptor acceptor(io.get_executor());
    acceptor.listen_memory();
    where = acceptor.local_info();
  }
  // A peer of the address table that has gone: refused at once.
  auto lost = asio::co_spawn(
      io, transport::dial(io.get_executor(), where, std::chrono::steady_clock::now() + 5s, true),
      asio::use_future);
  // Not known to have listened: retried until the deadline.
  auto late = asio::co_spawn(
      io, transport::dial(io.get_executor(), where, std::chrono::steady_clock::now() + 50ms),
      asio::use_future);
  io.run_for(10s);
  try {
    lost.get();
    ADD_FAILURE() << "dialled a closed listener";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::peer_lost)) << e.what();
  }
  try {
    late.get();
    ADD_FAILURE() << "dialled a closed listener";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::timed_out)) << e.what();
    EXPECT_NE(std::string(e.what()).find("memory:"), std::string::npos) << e.what();
  }
}

TEST(MemoryNetwork, ClosingAListenerAbortsItsAccept) {
  asio::io_context io;
  transport::Acceptor acceptor(io.get_executor());
  acceptor.listen_memory();
  std::optional<error_code> got;
  acceptor.async_accept([&](error_code ec, Stream) { got = ec; });
  io.poll();
  io.restart();
  EXPECT_FALSE(got);
  error_code ignored;
  acceptor.close(ignored);
  io.run();
  EXPECT_EQ(got, error_code(asio::error::operation_aborted));
}

}  // namespace
}  // namespace coccl
