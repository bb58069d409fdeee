// The TCPStore client of Communicator::from_env() against a server speaking torch's protocol:
// values round-trip, a get waits for a later set, and a missing key, a silent port or a port that
// is not a store fail with coccl's errors within the deadline. The store as the launcher's table
// (store_book): what the ranks publish, count and read, and the queries that costs the server.
#include "transport/launcher.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <coccl/error.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/support/fake_store.hpp"
#include "transport/directory.hpp"

namespace coccl::test {
namespace {

using namespace std::chrono_literals;
using transport::TcpStoreClient;

errc code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().category(), error_category()) << e.what();
    return static_cast<errc>(e.code().value());
  }
  ADD_FAILURE() << "no error";
  return errc::internal;
}

TEST(TcpStoreClient, SetGetAndAddRoundTrip) {
  FakeStore store;
  TcpStoreClient c("127.0.0.1", store.port(), 5s);
  c.set("k", std::string("v\0w", 3));
  EXPECT_EQ(c.get("k"), std::string("v\0w", 3));
  c.set("k", "");
  EXPECT_EQ(c.get("k"), "");
  EXPECT_EQ(c.add("n", 5), 5);
  EXPECT_EQ(c.add("n", -2), 3);
  EXPECT_EQ(store.contents().at("n"), "3");
}

TEST(TcpStoreClient, GetWaitsForAKeySetLaterByAnotherClient) {
  FakeStore store;
  TcpStoreClient reader("127.0.0.1", store.port(), 10s);
  std::thread writer([&] {
    TcpStoreClient w("127.0.0.1", store.port(), 10s);
    std::this_thread::sleep_for(100ms);
    w.set("late", "here");
  });
  EXPECT_EQ(reader.get("late"), "here");
  writer.join();
}

TEST(TcpStoreClient, MissingKeyTimesOutAndTheClientStaysFailed) {
  FakeStore store;
  TcpStoreClient c("127.0.0.1", store.port(), 300ms);
  EXPECT_EQ(code_of([&] { c.get("never"); }), errc::timed_out);
  EXPECT_EQ(code_of([&] { c.set("x", "y"); }), errc::peer_lost);
}

TEST(TcpStoreClient, NobodyListeningTimesOut) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::address_v4::loopback(), 0});
  const auto port = a.local_endpoint().port();
  a.close();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(code_of([&] { TcpStoreClient("127.0.0.1", port, 300ms); }), errc::timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST(TcpStoreClient, APortThatIsNotAStoreIsRefused) {
  // A server that answers every connection with bytes that are not the PING echo.
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::address_v4::loopback(), 0});
  std::thread server([&] {
    auto s = a.accept();
    const char junk[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    boost::asio::write(s, boost::asio::buffer(junk));
    std::this_thread::sleep_for(200ms);
  });
  EXPECT_EQ(code_of([&] { TcpStoreClient("127.0.0.1", a.local_endpoint().port(), 2s); }),
            errc::bad_message);
  server.join();
}

TEST(TcpStoreClient, AServerThatHangsUpIsAPeerLoss) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::address_v4::loopback(), 0});
  std::thread server([&] { a.accept().close(); });
  EXPECT_EQ(code_of([&] { TcpStoreClient("127.0.0.1", a.local_endpoint().port(), 2s); }),
            errc::peer_lost);
  server.join();
}

TEST(TcpStoreClient, GetManyWaitsForEveryKeyAndAnswersInOrder) {
  FakeStore store;
  TcpStoreClient reader("127.0.0.1", store.port(), 10s);
  std::thread writer([&] {
    TcpStoreClient w("127.0.0.1", store.port(), 10s);
    w.set("b", "second");
    std::this_thread::sleep_for(100ms);
    w.set("a", "first");
    w.set("c", std::string(3000, 'x'));
  });
  const std::vector<std::string> keys = {"c", "a", "b", "a"};
  EXPECT_EQ(reader.get_many(keys),
            (std::vector<std::string>{std::string(3000, 'x'), "first", "second", "first"}));
  EXPECT_TRUE(reader.get_many({}).empty());
  writer.join();
  // One key that never appears fails the whole read.
  TcpStoreClient short_lived("127.0.0.1", store.port(), 300ms);
  const std::vector<std::string> with_missing = {"a", "never"};
  EXPECT_EQ(code_of([&] { short_lived.get_many(with_missing); }), errc::timed_out);
}

// wait() is one WAIT and no GET: it returns once every key exists, after the last one is set,
// and fails with timed_out when one never appears.
TEST(TcpStoreClient, WaitReturnsOnceEveryKeyExistsWithOneQuery) {
  FakeStore store;
  TcpStoreClient waiter("127.0.0.1", store.port(), 10s);
  std::atomic<bool> second_set{false};
  std::thread writer([&] {
    TcpStoreClient w("127.0.0.1", store.port(), 10s);
    w.set("flag/1", "x");
    std::this_thread::sleep_for(100ms);
    second_set = true;
    w.set("flag/2", "y");
  });
  const std::uint64_t before = waiter.requests();
  const std::vector<std::string> keys = {"flag/1", "flag/2"};
  waiter.wait(keys);
  EXPECT_TRUE(second_set.load());
  EXPECT_EQ(waiter.requests() - before, 1u);
  writer.join();
  waiter.wait({});
  EXPECT_EQ(waiter.requests() - before, 1u);
  TcpStoreClient short_lived("127.0.0.1", store.port(), 300ms);
  const std::vector<std::string> with_missing = {"flag/1", "never"};
  EXPECT_EQ(code_of([&] { short_lived.wait(with_missing); }), errc::timed_out);
}

transport::PeerInfo listener_of(int rank, int per_host) {
  transport::PeerInfo p{};
  p.family = 4;
  p.addr[0] = 127;
  p.addr[3] = 1;
  p.port = static_cast<std::uint16_t>(2000 + rank);
  p.host_hash = 0xfeed0000ull + static_cast<std::uint64_t>(rank / per_host);
  p.pid = rank;
  return p;
}

// Six ranks of three hosts, each with its own connection to the store, as torchrun's workers
// have: the store carries every entry and counts the hosts as coccl does (by host hash).
TEST(StoreBook, RanksPublishCountTheirHostsAndReadTheEntriesTheyAsk) {
  FakeStore store;
  constexpr int n = 6, per_host = 2;
  std::vector<std::vector<transport::PeerInfo>> seen(n);
  std::vector<std::optional<transport::HostCount>> before(n), after(n);
  std::vector<std::uint64_t> publish_requests(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      TcpStoreClient c("127.0.0.1", store.port(), 10s);
      auto book = transport::store_book(c, "job/0", r, n);
      EXPECT_TRUE(book->counts_hosts());
      before[r] = book->hosts();
      // VALIDATE and PING at connect; then SET, ADD for the host (and one for the hosts), ADD
      // to arrive, then a WAIT for the flag (the last rank to arrive SETs it instead); two ADDs
      // read the counts.
      EXPECT_EQ(c.requests(), 2u);
      book->publish(listener_of(r, per_host));
      after[r] = book->hosts();
      const std::uint64_t extra = c.requests() - 2 - 6;
      EXPECT_LE(extra, 1u) << c.requests();
      publish_requests[r] = c.requests() - 2;
      std::vector<int> others;
      for (int o = n - 1; o >= 0; --o)
        if (o != r) others.push_back(o);
      const std::uint64_t before_reads = c.requests();
      seen[r] = book->lookup_many(others);
      // One WAIT for every key, one GET each.
      EXPECT_EQ(c.requests() - before_reads, 1 + others.size());
      seen[r].push_back(book->lookup(r));
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(before[r].has_value()) << "counted before anyone published";
    ASSERT_TRUE(after[r].has_value());
    EXPECT_EQ(after[r]->hosts, 3u);
    EXPECT_EQ(after[r]->host_ranks, 2u);
    ASSERT_EQ(seen[r].size(), static_cast<std::size_t>(n));
    std::size_t i = 0;
    for (int o = n - 1; o >= 0; --o) {
      if (o == r) continue;
      EXPECT_EQ(seen[r][i].port, listener_of(o, per_host).port);
      EXPECT_EQ(seen[r][i].host_hash, listener_of(o, per_host).host_hash);
      ++i;
    }
    EXPECT_EQ(seen[r].back().pid, static_cast<std::uint32_t>(r));
  }
  // In all: 6 a rank, one more for the first rank of each of the 3 hosts.
  std::uint64_t total = 0;
  for (std::uint64_t x : publish_requests) total += x;
  EXPECT_EQ(total, 6u * n + 3);
  const auto kv = store.contents();
  EXPECT_EQ(kv.at("job/0/arrived"), "6");
  EXPECT_EQ(kv.at("job/0/hosts"), "3");
  EXPECT_EQ(kv.at("job/0/host/00000000feed0001"), "2");
  EXPECT_TRUE(kv.count("job/0/ready"));
}

// More arrivals than ranks: two jobs, or two ranks of one number, write under one key. The rank
// that sees it refuses rather than forming from a table it cannot trust; so does a rank whose
// entry is not an address.
TEST(StoreBook, MoreArrivalsThanRanksAndEntriesThatAreNotAddressesAreRefused) {
  FakeStore store;
  TcpStoreClient c("127.0.0.1", store.port(), 2s);
  c.add("job/1/arrived", 2);
  auto book = transport::store_book(c, "job/1", 1, 2);
  EXPECT_EQ(code_of([&] { book->publish(listener_of(1, 1)); }), errc::bad_message);

  TcpStoreClient d("127.0.0.1", store.port(), 2s);
  d.set("job/2/addr/0", "not hex at all");
  auto other = transport::store_book(d, "job/2", 1, 2);
  d.add("job/2/arrived", 1);
  other->publish(listener_of(1, 1));
  EXPECT_EQ(code_of([&] { other->lookup(0); }), errc::bad_message);
}

// coccl-store-load against a server of the store's protocol: every rank's frame is checked by
// the tool, which exits 0 only when each entry read is the one published; its table gives the
// queries of the busiest rank, a constant plus the entries it reads.
TEST(StoreLoadTool, RanksFormTheirFramesThroughAStoreAndTheToolCountsTheirQueries) {
#ifndef COCCL_STORE_LOAD
  GTEST_SKIP() << "coccl-store-load is not built in this tree";
#else
  FakeStore store;
  const std::string cmd = std::string(COCCL_STORE_LOAD) +
                          " --store 127.0.0.1:" + std::to_string(store.port()) +
                          " --ranks 8,100 --per-host 4 --repeat 1";
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  // ranks, path, queries in all, the busiest rank's, ms, us per query, #wrong.
  auto row = [&](int n, const std::string& want_path = "table") {
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream cells(line);
      long long ranks = 0, all = 0, max = 0, wrong = -1;
      std::string path;
      double ms = 0, us = 0;
      if (cells >> ranks >> path >> all >> max >> ms >> us >> wrong && ranks == n &&
          path == want_path)
        return std::vector<long long>{all, max, wrong};
    }
    return std::vector<long long>{};
  };
  // 8 ranks, a full directory: the secret (1 SET or WAIT + GET), 4 to publish and arrive (SET,
  // two ADDs, and the WAIT for the flag or the last rank's SET of it), one WAIT and 7 GETs, one
  // more for the first rank of each host.
  const auto small = row(8);
  ASSERT_EQ(small.size(), 3u) << out;
  EXPECT_EQ(small[2], 0) << out;
  EXPECT_EQ(small[0], 1 + 7 * 2 + 4 * 8 + 8 * 8 + 2) << out;
  // 100 ranks, above COCCL_DIRECTORY_FULL: a rank reads only the O(log N) entries it keeps, and
  // two ADDs read the host counts.
  // Through a root the store serves one SET and a WAIT and a GET a rank.
  const auto id = row(100, "id");
  ASSERT_EQ(id.size(), 3u) << out;
  EXPECT_EQ(id[0], 1 + 2 * 99) << out;
  EXPECT_EQ(id[1], 2) << out;
  EXPECT_EQ(id[2], 0) << out;
  const auto large = row(100);
  ASSERT_EQ(large.size(), 3u) << out;
  EXPECT_EQ(large[2], 0) << out;
  std::size_t most = 0;
  for (int r = 0; r < 100; ++r)
    most = std::max(most, transport::needs_of(std::span<const int>(&r, 1), 100).size());
  ASSERT_LT(most, 50u);
  // The busiest rank: its needs but itself as GETs, one WAIT, the secret (1 or 2), 4 to publish
  // and arrive, one more if first of its host, 2 ADDs for the counts.
  EXPECT_GE(large[1], static_cast<long long>(most) - 1 + 1 + 1 + 4 + 2) << out;
  EXPECT_LE(large[1], static_cast<long long>(most) - 1 + 1 + 2 + 4 + 1 + 2) << out;
#endif
}

}  // namespace
}  // namespace coccl::test
