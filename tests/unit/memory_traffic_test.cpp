// Traffic counters of the in-memory network (transport/traffic.hpp): a stream counts each
// message once at the writer and once at the reader however it is cut, every byte at both ends,
// and rounds grow by one per hop of a chain; a new phase counts rounds from 0 again. In virtual
// time a message is read one round after it is written, side by side with the others. A
// communicator on the in-memory network counts its rank's streams, and its root's.
#include <gtest/gtest.h>

#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <coccl/communicator.hpp>
#include <cstdint>
#include <future>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/comm.hpp"
#include "runtime/engine.hpp"
#include "transport/memory.hpp"
#include "transport/traffic.hpp"

namespace coccl {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using transport::Stream;
using transport::Traffic;

// Writes `n` bytes on `from` and reads them on `to` (both on `io`), whole.
void pass(asio::io_context& io, Stream& from, Stream& to, std::size_t n) {
  std::vector<std::uint8_t> out(n, 7), in(n);
  error_code wec, rec;
  asio::async_write(from, asio::buffer(out), [&](error_code ec, std::size_t) { wec = ec; });
  asio::async_read(to, asio::buffer(in), [&](error_code ec, std::size_t) { rec = ec; });
  io.run();
  io.restart();
  ASSERT_EQ(wec, error_code());
  ASSERT_EQ(rec, error_code());
  ASSERT_EQ(in, out);
}

TEST(MemoryTraffic, AWriteTakenInPiecesIsOneMessageAtBothEnds) {
  asio::io_context io;
  auto a = std::make_shared<Traffic>(), b = std::make_shared<Traffic>();
  // 100 bytes of buffer: the 250-byte write goes in three pieces, and is read in more.
  auto [x, y] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 100, a, b);
  pass(io, x, y, 250);
  pass(io, x, y, 10);
  pass(io, y, x, 40);
  const Traffic::Counts ca = a->counts(), cb = b->counts();
  EXPECT_EQ(ca.messages_sent, 2u);
  EXPECT_EQ(cb.messages_received, 2u);
  EXPECT_EQ(ca.bytes_sent, 260u);
  EXPECT_EQ(cb.bytes_received, 260u);
  EXPECT_EQ(cb.messages_sent, 1u);
  EXPECT_EQ(ca.messages_received, 1u);
  EXPECT_EQ(cb.bytes_sent, 40u);
  EXPECT_EQ(ca.bytes_received, 40u);
  EXPECT_EQ(ca.streams, 1u);
  EXPECT_EQ(cb.streams, 1u);
}

TEST(MemoryTraffic, RoundsGrowByOneAlongAChainOfMessages) {
  Traffic::next_phase();
  asio::io_context io;
  auto a = std::make_shared<Traffic>(), b = std::make_shared<Traffic>(),
       c = std::make_shared<Traffic>();
  auto [ab, ba] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 1 << 16, a, b);
  auto [bc, cb] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 1 << 16, b, c);
  auto [ca, ac] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 1 << 16, c, a);
  pass(io, ab, ba, 8);  // a (round 0) -> b
  EXPECT_EQ(b->counts().round, 1u);
  pass(io, bc, cb, 8);  // b (1) -> c
  EXPECT_EQ(c->counts().round, 2u);
  pass(io, ca, ac, 8);  // c (2) -> a
  EXPECT_EQ(a->counts().round, 3u);
  // A message from a party behind does not move the reader back.
  pass(io, ba, ab, 8);  // b (1) -> a (3)
  EXPECT_EQ(a->counts().round, 3u);
  EXPECT_EQ(b->counts().round, 1u);
}

TEST(MemoryTraffic, ANewPhaseCountsRoundsFromZeroAgain) {
  Traffic::next_phase();
  asio::io_context io;
  auto a = std::make_shared<Traffic>(), b = std::make_shared<Traffic>();
  auto [x, y] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 1 << 16, a, b);
  pass(io, x, y, 8);
  pass(io, y, x, 8);
  pass(io, x, y, 8);
  EXPECT_EQ(b->counts().round, 3u);
  // Written in this phase, read in the next: it counts as sent at round 0 of the new phase.
  std::vector<std::uint8_t> out(8, 1), in(8);
  asio::async_write(y, asio::buffer(out), [](error_code, std::size_t) {});
  io.run();
  io.restart();
  Traffic::next_phase();
  EXPECT_EQ(a->counts().round, 0u);
  EXPECT_EQ(b->counts().round, 0u);
  asio::async_read(x, asio::buffer(in), [](error_code, std::size_t) {});
  io.run();
  EXPECT_EQ(a->counts().round, 1u);
  EXPECT_EQ(b->counts().round, 0u);
  // Counts are not reset by a phase.
  EXPECT_EQ(a->counts().messages_received, 2u);
}

TEST(MemoryTraffic, AStreamWithoutTrafficCountsNothingForItsReader) {
  asio::io_context io;
  auto b = std::make_shared<Traffic>();
  auto [x, y] =
      transport::memory::make_pair(io.get_executor(), io.get_executor(), 1 << 16, nullptr, b);
  pass(io, x, y, 30);
  EXPECT_EQ(b->counts().messages_received, 1u);
  EXPECT_EQ(b->counts().bytes_received, 30u);
  EXPECT_EQ(b->counts().messages_sent, 0u);
}

// Under VirtualTime on the process engine's proxy thread: `a` writes to `b` and `c` to `d` at
// the same time, then `b` answers `a`. Returns the virtual times at which each read completed,
// relative to the first writes.
struct Times {
  std::uint64_t b_read = 0, d_read = 0, a_read = 0;
};

asio::awaitable<void> exchange(Stream* a, Stream* b, Stream* c, Stream* d, Times* t) {
  using transport::memory::VirtualTime;
  const std::uint64_t start = VirtualTime::now();
  std::array<std::uint8_t, 4> out{1, 2, 3, 4}, in{};
  co_await asio::async_write(*a, asio::buffer(out), asio::use_awaitable);
  co_await asio::async_write(*c, asio::buffer(out), asio::use_awaitable);
  co_await asio::async_read(*b, asio::buffer(in), asio::use_awaitable);
  t->b_read = VirtualTime::now() - start;
  co_await asio::async_read(*d, asio::buffer(in), asio::use_awaitable);
  t->d_read = VirtualTime::now() - start;
  co_await asio::async_write(*b, asio::buffer(in), asio::use_awaitable);
  co_await asio::async_read(*a, asio::buffer(out), asio::use_awaitable);
  t->a_read = VirtualTime::now() - start;
}

TEST(MemoryVirtualTime, AMessageIsReadOneRoundAfterItIsWrittenAndSideBySideWithOthers) {
  runtime::ProxyThread& proxy = detail::process_engine().thread(0);
  std::unique_ptr<transport::memory::VirtualTime> time;
  std::optional<std::pair<Stream, Stream>> ab, cd;
  std::promise<void> made;
  asio::post(proxy.executor(), [&] {
    time = std::make_unique<transport::memory::VirtualTime>(proxy);
    ab.emplace(transport::memory::make_pair(proxy.executor(), proxy.executor(), 1 << 16));
    cd.emplace(transport::memory::make_pair(proxy.executor(), proxy.executor(), 1 << 16));
    made.set_value();
  });
  made.get_future().get();
  Times t;
  asio::co_spawn(proxy.executor(), exchange(&ab->first, &ab->second, &cd->first, &cd->second, &t),
                 asio::use_future)
      .get();
  // Both first messages were written at time 0 and arrive together at 1; the answer, written at
  // 1, at 2.
  EXPECT_EQ(t.b_read, 1u);
  EXPECT_EQ(t.d_read, 1u);
  EXPECT_EQ(t.a_read, 2u);
  std::promise<void> gone;
  asio::post(proxy.executor(), [&] {
    ab.reset();
    cd.reset();
    time.reset();
    gone.set_value();
  });
  gone.get_future().get();
}

// Closes a stream end (on its own thread).
void drop(Stream& s) { Stream gone(std::move(s)); }

// Closes `ends`, which live on `thread`, there, and waits for it.
void drop_on(runtime::ProxyThread& thread, std::initializer_list<Stream*> ends) {
  std::promise<void> closed;
  asio::post(thread.executor(), [&] {
    for (Stream* s : ends) drop(*s);
    closed.set_value();
  });
  closed.get_future().get();
}

// `hops` messages back and forth over a stream, this end first when `first`; returns the virtual
// time the last hop took to arrive, counted from `start`.
asio::awaitable<std::uint64_t> ping_pong(Stream* s, bool first, int hops, std::uint64_t start) {
  std::array<std::uint8_t, 4> buf{1, 2, 3, 4};
  for (int hop = 0; hop < hops; ++hop) {
    if ((hop % 2 == 0) == first)
      co_await asio::async_write(*s, asio::buffer(buf), asio::use_awaitable);
    else
      co_await asio::async_read(*s, asio::buffer(buf), asio::use_awaitable);
  }
  co_return transport::memory::VirtualTime::now() - start;
}

// Two proxy threads under one virtual time: two ping-pongs, each between the threads, run side
// by side, and every hop takes exactly one round. A round that passed while either thread still
// had work of the present one (a completion in its queue, a write not yet made) would make a
// later hop arrive a round late.
TEST(MemoryVirtualTime, OnTwoThreadsEveryHopTakesOneRound) {
  runtime::Engine engine(2);
  runtime::ProxyThread& t0 = engine.thread(0);
  runtime::ProxyThread& t1 = engine.thread(1);
  for (int trial = 0; trial < 5; ++trial) {
    transport::memory::VirtualTime time({&t0, &t1});
    // Named ends rather than structured bindings, which clang 14's lambdas cannot capture.
    auto ab_ends = transport::memory::make_pair(t0.executor(), t1.executor(), 1 << 16);
    auto cd_ends = transport::memory::make_pair(t1.executor(), t0.executor(), 1 << 16);
    Stream &a = ab_ends.first, &b = ab_ends.second, &c = cd_ends.first, &d = cd_ends.second;
    constexpr int hops = 40;
    // Started while the time stands still, as coccl-sim starts its ranks. The start is read under
    // the hold: read before it, a round that passed while both threads were idle would count.
    time.hold();
    const std::uint64_t start = transport::memory::VirtualTime::now();
    auto ab = asio::co_spawn(t0.executor(), ping_pong(&a, true, hops, start), asio::use_future);
    auto ba = asio::co_spawn(t1.executor(), ping_pong(&b, false, hops, start), asio::use_future);
    auto cd = asio::co_spawn(t1.executor(), ping_pong(&c, true, hops, start), asio::use_future);
    auto dc = asio::co_spawn(t0.executor(), ping_pong(&d, false, hops, start), asio::use_future);
    time.release();
    // An even number of hops: the last one goes back to the end that started, written at round
    // hops - 1 and read at hops; the other end's last act is that write.
    EXPECT_EQ(ab.get(), static_cast<std::uint64_t>(hops)) << "trial " << trial;
    EXPECT_EQ(cd.get(), static_cast<std::uint64_t>(hops)) << "trial " << trial;
    EXPECT_EQ(ba.get(), static_cast<std::uint64_t>(hops - 1)) << "trial " << trial;
    EXPECT_EQ(dc.get(), static_cast<std::uint64_t>(hops - 1)) << "trial " << trial;
    // Each end is closed on its own thread.
    drop_on(t0, {&a, &d});
    drop_on(t1, {&b, &c});
  }
}

// While held, the time stands still: a message written then is read only after the release,
// one round later.
TEST(MemoryVirtualTime, AHoldKeepsTheTimeUntilReleased) {
  runtime::Engine engine(2);
  runtime::ProxyThread& t0 = engine.thread(0);
  runtime::ProxyThread& t1 = engine.thread(1);
  transport::memory::VirtualTime time({&t0, &t1});
  auto ends = transport::memory::make_pair(t0.executor(), t1.executor(), 1 << 16);
  Stream &a = ends.first, &b = ends.second;
  const std::uint64_t start = transport::memory::VirtualTime::now();
  time.hold();
  auto read = asio::co_spawn(t1.executor(), ping_pong(&b, false, 1, start), asio::use_future);
  auto write = asio::co_spawn(t0.executor(), ping_pong(&a, true, 1, start), asio::use_future);
  EXPECT_EQ(write.get(), 0u);
  EXPECT_EQ(read.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  EXPECT_EQ(transport::memory::VirtualTime::now(), start);
  time.release();
  EXPECT_EQ(read.get(), 1u);
  drop_on(t0, {&a});
  drop_on(t1, {&b});
}

// settle() returns once the message in flight is read: one side's last act is a write that
// nobody awaits, and the counts taken after settle() already hold its read. Called twice, the
// second time with nothing in flight.
TEST(MemoryVirtualTime, SettleReturnsOnceWhatIsInFlightIsRead) {
  runtime::Engine engine(2);
  runtime::ProxyThread& t0 = engine.thread(0);
  runtime::ProxyThread& t1 = engine.thread(1);
  transport::memory::VirtualTime time({&t0, &t1});
  auto a_party = std::make_shared<Traffic>(), b_party = std::make_shared<Traffic>();
  auto ends = transport::memory::make_pair(t0.executor(), t1.executor(), 1 << 16, a_party, b_party);
  Stream &a = ends.first, &b = ends.second;
  constexpr int hops = 40;
  const std::uint64_t start = transport::memory::VirtualTime::now();
  time.hold();
  auto at_a = asio::co_spawn(t0.executor(), ping_pong(&a, true, hops, start), asio::use_future);
  auto at_b = asio::co_spawn(t1.executor(), ping_pong(&b, false, hops, start), asio::use_future);
  time.release();
  // b's last act is the write of the last hop, made at round hops - 1.
  EXPECT_EQ(at_b.get(), static_cast<std::uint64_t>(hops - 1));
  time.settle();
  ASSERT_EQ(at_a.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(at_a.get(), static_cast<std::uint64_t>(hops));
  EXPECT_EQ(transport::memory::VirtualTime::now() - start, static_cast<std::uint64_t>(hops));
  EXPECT_EQ(a_party->counts().messages_received, static_cast<std::uint64_t>(hops / 2));
  EXPECT_EQ(b_party->counts().messages_received, static_cast<std::uint64_t>(hops / 2));
  time.settle();
  EXPECT_EQ(transport::memory::VirtualTime::now() - start, static_cast<std::uint64_t>(hops));
  drop_on(t0, {&a});
  drop_on(t1, {&b});
}

// A party a rank starts is named after it: distinct from its parent, from its siblings and from
// every party named directly (below 2^40), and the same in every run.
TEST(MemoryTraffic, ASpawnedPartyIsNamedAfterItsParentAndItsPlace) {
  Traffic rank;
  rank.set_id(7);
  const auto first = rank.spawn(), second = rank.spawn();
  EXPECT_EQ(first->id(), 7 + (std::uint64_t{1} << 40));
  EXPECT_EQ(second->id(), 7 + (std::uint64_t{2} << 40));
  EXPECT_EQ(rank.next_stream(), 0u);
  EXPECT_EQ(rank.next_stream(), 1u);
  EXPECT_EQ(first->next_stream(), 0u);
}

struct Joined {
  Communicator comm;
  std::string error;
};

// Two ranks on the in-memory network with a root counted in `root`, each with an all_reduce.
std::vector<Joined> two_ranks(const std::shared_ptr<Traffic>& root) {
  const UniqueId id = detail::memory_unique_id(root);
  std::vector<Joined> out(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        out[r].comm = Communicator::create(id, r, 2);
        std::int32_t in = r + 1, sum = 0;
        out[r].comm.all_reduce(&in, &sum, 1, DataType::int32, ReduceOp::sum);
        if (sum != 3) out[r].error = "sum " + std::to_string(sum);
      } catch (const std::exception& e) {
        out[r].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

TEST(MemoryTraffic, ACommunicatorCountsItsRanksAndItsRoot) {
  Traffic::next_phase();
  auto root = std::make_shared<Traffic>();
  std::vector<Joined> ranks = two_ranks(root);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].error, "") << "rank " << r;
  const auto t0 = detail::impl_of(ranks[0].comm)->peers().traffic();
  const auto t1 = detail::impl_of(ranks[1].comm)->peers().traffic();
  ASSERT_TRUE(t0 && t1);
  ASSERT_NE(t0, t1);
  const Traffic::Counts c0 = t0->counts(), c1 = t1->counts(), croot = root->counts();
  // Each rank said hello to the root (a handshake message and the hello frame at least).
  EXPECT_GE(croot.messages_received, 4u);
  EXPECT_GE(croot.streams, 2u);
  // The root answers rank 0 after both hellos (round >= 1), rank 0 reads the table (>= 2), and
  // rank 1 gets it from rank 0 (>= 3).
  EXPECT_GE(croot.round, 1u);
  EXPECT_GE(c0.round, 2u);
  EXPECT_GE(c1.round, 3u);
  EXPECT_GE(c0.messages_sent, 3u);
  EXPECT_GE(c1.messages_received, 3u);
  // The all_reduce linked the two ranks to each other.
  for (int r = 0; r < 2; ++r) {
    std::promise<std::uint64_t> linked;
    auto impl = detail::impl_of(ranks[r].comm);
    asio::post(impl->executor(), [&] { linked.set_value(impl->peers().link_stats().peers); });
    EXPECT_EQ(linked.get_future().get(), 1u) << "rank " << r;
  }
  for (auto& j : ranks) j.comm.destroy();
}

TEST(MemoryTraffic, ATcpCommunicatorCountsNothing) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  EXPECT_EQ(detail::impl_of(c)->peers().traffic(), nullptr);
  EXPECT_EQ(detail::impl_of(c)->roots_traffic(), nullptr);
  c.destroy();
}

}  // namespace
}  // namespace coccl
