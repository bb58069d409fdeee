// Communicators of many ranks in one process on the in-memory network (memory_unique_id): the
// real rendezvous, link handshake and algorithms run over memory streams, on the process engine's
// proxy thread, and give the results a reference computed here. Destroying them is clean (the
// sanitizer build checks it).
#include <gtest/gtest.h>

#include <boost/asio/post.hpp>
#include <chrono>
#include <coccl/communicator.hpp>
#include <cstdint>
#include <future>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "collectives/comm.hpp"
#include "tests/support/param_override.hpp"
#include "transport/admission.hpp"
#include "transport/memory.hpp"
#include "transport/net.hpp"
#include "transport/peers.hpp"

namespace coccl {
namespace {

struct RankResult {
  std::vector<std::int32_t> small;  // all_reduce of a few elements (latency algorithms)
  std::vector<float> large;         // all_reduce of more than one slot (bandwidth algorithms)
  std::vector<std::int32_t> gathered;
  bool on_memory = false;  // the rank listened on the in-memory network
  std::string error;
};

std::int32_t small_in(int rank, std::size_t i) {
  return static_cast<std::int32_t>(rank * 31 + static_cast<int>(i % 97));
}
float large_in(int rank, std::size_t i) { return static_cast<float>((rank + 1) * (i % 13)); }
std::int32_t gather_in(int rank, std::size_t i) {
  return static_cast<std::int32_t>(rank * 1000 + static_cast<int>(i));
}

void run_ranks(int n) {
  constexpr std::size_t small_count = 1000;    // 4 KB
  constexpr std::size_t large_count = 150000;  // 600 KB: several slots, past a stream's buffer
  constexpr std::size_t gather_count = 100;
  const UniqueId id = detail::memory_unique_id();
  std::vector<RankResult> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      RankResult& out = results[r];
      try {
        Communicator c = Communicator::create(id, r, n);
        out.on_memory = transport::is_memory(detail::impl_of(c)->peers().self_info());
        std::vector<std::int32_t> small(small_count);
        for (std::size_t i = 0; i < small_count; ++i) small[i] = small_in(r, i);
        out.small.resize(small_count);
        c.all_reduce(small.data(), out.small.data(), small_count, DataType::int32, ReduceOp::sum);
        std::vector<float> large(large_count);
        for (std::size_t i = 0; i < large_count; ++i) large[i] = large_in(r, i);
        out.large.resize(large_count);
        c.all_reduce(large.data(), out.large.data(), large_count, DataType::float32, ReduceOp::sum);
        std::vector<std::int32_t> mine(gather_count);
        for (std::size_t i = 0; i < gather_count; ++i) mine[i] = gather_in(r, i);
        out.gathered.resize(gather_count * n);
        c.all_gather(mine.data(), out.gathered.data(), gather_count, DataType::int32);
        c.destroy();
      } catch (const std::exception& e) {
        out.error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  std::vector<std::int32_t> small_want(small_count, 0);
  std::vector<float> large_want(large_count, 0.0f);
  std::vector<std::int32_t> gather_want(gather_count * n);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < small_count; ++i) small_want[i] += small_in(r, i);
    for (std::size_t i = 0; i < large_count; ++i) large_want[i] += large_in(r, i);
    for (std::size_t i = 0; i < gather_count; ++i)
      gather_want[r * gather_count + i] = gather_in(r, i);
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(results[r].error, "") << "rank " << r;
    EXPECT_TRUE(results[r].on_memory) << "rank " << r;
    EXPECT_EQ(results[r].small, small_want) << "rank " << r;
    // Small integers in float32: every order of summation is exact.
    EXPECT_EQ(results[r].large, large_want) << "rank " << r;
    EXPECT_EQ(results[r].gathered, gather_want) << "rank " << r;
  }
}

TEST(MemoryCommunicator, EightRanksInOneProcessReduceAndGather) { run_ranks(8); }

TEST(MemoryCommunicator, SixtyFourRanksInOneProcessReduceAndGather) { run_ranks(64); }

// Every rank is created on the proxy thread in one go, in virtual time, so every hello reaches the
// root before any handshake ends: far beyond its cap on connections that have not authenticated (2
// here, as thousands of ranks starting together would be at the default). The root takes them as
// room frees and every rank joins; a root that closed the oldest to make room failed those ranks.
TEST(MemoryCommunicator, HellosAllAtOnceBeyondTheRootsPendingCapAllJoin) {
  // The cap, not the graces, is under test.
  const auto cap = test::pending_cap_only("2");
  constexpr int n = 16;
  const UniqueId id = detail::memory_unique_id();
  std::vector<Communicator> comms(n);
  std::vector<std::string> errors(n);
  std::promise<void> all_done;
  int left = n;
  // In virtual time every message takes a round (transport/memory.hpp), so no handshake ends
  // before every hello has reached the root.
  runtime::ProxyThread& proxy = detail::process_engine().thread(0);
  std::unique_ptr<transport::memory::VirtualTime> time;
  boost::asio::post(proxy.executor(), [&] {
    time = std::make_unique<transport::memory::VirtualTime>(proxy);
    for (int r = 0; r < n; ++r)
      Communicator::async_create(id, r, n, [&, r](boost::system::error_code ec, Communicator c) {
        if (ec)
          errors[r] = ec.message();
        else
          comms[r] = std::move(c);
        if (--left == 0) all_done.set_value();
      });
  });
  all_done.get_future().get();
  std::promise<void> real_time;
  boost::asio::post(proxy.executor(), [&] {
    time.reset();
    real_time.set_value();
  });
  real_time.get_future().get();
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  std::vector<std::int32_t> out(n);
  std::latch reduced(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::int32_t in = r + 1;
      comms[r].all_reduce(&in, &out[r], 1, DataType::int32, ReduceOp::sum);
      // Every rank finishes before any destroys (destroy_test.cpp says why).
      reduced.arrive_and_wait();
      comms[r].destroy();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], n * (n + 1) / 2) << "rank " << r;
}

// The watchdog ticks only while an operation drains, and lapses while the communicator is idle:
// an operation started long after the last one still fails on a peer that never joins it, within
// its timeout and a watchdog period, and names what the peer says it is doing.
TEST(MemoryCommunicator, AnOperationAfterAnIdleSpellStillTimesOutOnASilentPeer) {
  constexpr int n = 2;
  const UniqueId id = detail::memory_unique_id();
  Communicator::Options options;
  options.timeout = std::chrono::milliseconds(1000);
  std::vector<std::string> errors(n);
  std::error_code silent_code;
  std::string silent_what;
  double silent_s = 0;
  std::latch warmed(n), failed(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator c = Communicator::create(id, r, n, options);
        std::int32_t in = r + 1, out = 0;
        c.all_reduce(&in, &out, 1, DataType::int32, ReduceOp::sum);
        warmed.arrive_and_wait();
        if (r == 0) {
          // Many watchdog periods (timeout / 8) with nothing queued.
          std::this_thread::sleep_for(std::chrono::milliseconds(600));
          const auto start = std::chrono::steady_clock::now();
          try {
            c.all_reduce(&in, &out, 1, DataType::int32, ReduceOp::sum);
          } catch (const std::system_error& e) {
            silent_code = e.code();
            silent_what = e.what();
          }
          silent_s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
        failed.arrive_and_wait();
        c.destroy();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  EXPECT_EQ(silent_code, make_error_code(errc::timed_out)) << silent_what;
  EXPECT_NE(silent_what.find("no progress from rank 1"), std::string::npos) << silent_what;
  // The silent peer was asked what it waits for before it was named: nothing, it is idle.
  EXPECT_NE(silent_what.find("rank 1 reports: idle after operation #1"), std::string::npos)
      << silent_what;
  EXPECT_GE(silent_s, 1.0);
  EXPECT_LT(silent_s, 10.0);
}

}  // namespace
}  // namespace coccl
