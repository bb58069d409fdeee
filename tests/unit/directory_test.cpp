// The spread address table (transport/directory.hpp): which entries a rank keeps, what a root
// sends each connection that carried hellos, the way a lookup takes, the frames' checks, and
// communicators of many ranks on the in-memory network that find each other's addresses by asking.
#include "transport/directory.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <coccl/communicator.hpp>
#include <coccl/error.hpp>
#include <cstdint>
#include <future>
#include <latch>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "collectives/comm.hpp"
#include "tests/support/param_override.hpp"
#include "transport/peers.hpp"

namespace coccl::transport {
namespace {

std::vector<int> needs_one(int rank, int n) {
  std::vector<int> v;
  directory_needs(rank, n, v);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

int log2_ceil(int n) { return n <= 1 ? 0 : std::bit_width(static_cast<unsigned>(n - 1)); }

PeerInfo info_of(int rank) {
  PeerInfo p{};
  p.family = 4;
  p.port = static_cast<std::uint16_t>(1000 + rank);
  p.host_hash = static_cast<std::uint64_t>(rank / 8);
  p.pid = rank;
  return p;
}

DirectoryFrame whole(int n, bool full) {
  DirectoryFrame f;
  f.header = {static_cast<std::uint32_t>(n), static_cast<std::uint32_t>((n + 7) / 8),
              full ? 1u : 0u};
  for (int r = 0; r < n; ++r)
    f.entries.push_back({r, info_of(r), static_cast<std::uint32_t>(std::min(8, n - r / 8 * 8))});
  return f;
}

const std::vector<int> sizes{1, 2, 3, 5, 7, 8, 9, 31, 33, 64, 65, 100, 257, 1000};

TEST(Directory, EveryLookupReachesItsTargetInAsManyHopsAsTheRanksDifferInBits) {
  for (int n : sizes) {
    for (int from = 0; from < n; ++from)
      for (int to = 0; to < n; ++to) {
        if (from == to) continue;
        // Every candidate of every hop is a partner the asked rank keeps, and lies below n.
        int at = from, hops = 0;
        while (at != to) {
          const auto next = next_hops(at, to);
          ASSERT_FALSE(next.empty()) << n << ": " << at << " -> " << to;
          const auto kept = needs_one(at, n);
          for (int h : next) {
            ASSERT_LT(h, n) << n << ": " << at << " -> " << to;
            ASSERT_EQ(std::popcount(static_cast<unsigned>(h ^ at)), 1);
            ASSERT_TRUE(std::binary_search(kept.begin(), kept.end(), h))
                << "rank " << at << " of " << n << " does not keep hop " << h;
          }
          // Any candidate will do: take the last, the lowest bit, to vary from the first.
          at = next.back();
          ++hops;
        }
        EXPECT_EQ(hops, std::popcount(static_cast<unsigned>(from ^ to)));
        EXPECT_LE(hops, log2_ceil(n));
      }
    if (n > 100) break;  // the pairs of the larger sizes are sampled below
  }
  for (int n : {257, 1000, 98304})
    for (int from : {0, 1, n / 3, n - 2, n - 1})
      for (int to : {0, 5, n / 2 + 1, n - 1}) {
        if (from == to) continue;
        int at = from, hops = 0;
        while (at != to) {
          const auto next = next_hops(at, to);
          for (int h : next) ASSERT_LT(h, n);
          at = next.front();
          ++hops;
        }
        EXPECT_LE(hops, log2_ceil(n));
      }
}

// Two roots work out alone what each sends the other: that needs a rank a keeps to keep a.
TEST(Directory, ARankThatAKeepsKeepsA) {
  for (int n : sizes)
    for (int r = 0; r < n; ++r)
      for (int y : needs_one(r, n)) {
        const auto theirs = needs_one(y, n);
        ASSERT_TRUE(std::binary_search(theirs.begin(), theirs.end(), r))
            << "rank " << r << " keeps " << y << " of " << n << " but not the other way";
      }
}

TEST(Directory, TheNeedsOfSeveralRanksAreTheUnionOfEach) {
  for (int n : sizes) {
    const int first = n / 3, last = std::min(n, first + 9);
    std::set<int> expected;
    std::vector<int> ranks;
    for (int r = first; r < last; ++r) {
      ranks.push_back(r);
      for (int y : needs_one(r, n)) expected.insert(y);
    }
    const std::vector<int> want(expected.begin(), expected.end());
    EXPECT_EQ(needs_of(ranks, n), want) << n;
    EXPECT_EQ(range_needs(first, last, n), want) << n;
  }
}

TEST(Directory, ARankKeepsLogNEntriesAndTheRootsSendAboutNLogN) {
  for (int n : {1024, 16384}) {
    const int l = log2_ceil(n);
    std::size_t most = 0;
    for (int r = 0; r < n; ++r) most = std::max(most, needs_one(r, n).size());
    // Itself, l partners, two ring neighbours, a parent and two children.
    EXPECT_LE(most, static_cast<std::size_t>(l + 6)) << n;
    // What the roots send: each host of 8 ranks gets what its ranks keep, on one connection.
    std::size_t sent = 0;
    for (int host = 0; host < n; host += 8) sent += range_needs(host, host + 8, n).size();
    EXPECT_LE(sent, static_cast<std::size_t>(n) * (l + 6)) << n;
    // Against the N^2 of every rank holding the whole table.
    EXPECT_LT(sent, static_cast<std::size_t>(n) * n / 8) << n;
  }
}

TEST(Directory, AConnectionIsSentExactlyWhatItsRanksKeepAndEachRankTakesItsOwn) {
  const int n = 100;
  const DirectoryFrame root = whole(n, false);
  const std::vector<std::vector<int>> carriers{{1}, {37}, {99}, {8, 9, 10, 11, 12, 13, 14, 15}};
  for (const std::vector<int>& ranks : carriers) {
    const auto bytes = directory_for(root, needs_of(ranks, n));
    const DirectoryFrame got = decode_directory(bytes, n);
    std::vector<int> sent;
    for (const auto& e : got.entries) {
      sent.push_back(e.rank);
      EXPECT_EQ(e.info.port, info_of(e.rank).port);
    }
    EXPECT_EQ(sent, needs_of(ranks, n));
    for (int c : ranks) {
      // A leader passes each follower its own part of what came.
      const int one[] = {c};
      const DirectoryFrame own = decode_directory(directory_for(got, needs_of(one, n)), n);
      Directory d;
      d.assign(own, c);
      EXPECT_TRUE(d.formed());
      EXPECT_EQ(d.known(), needs_one(c, n).size());
      for (int r : needs_one(c, n)) ASSERT_NE(d.find(r), nullptr) << r;
      EXPECT_EQ(d.host_ranks(), c >= 96 ? 4u : 8u);  // ranks 96-99 are the last host's 4
      EXPECT_EQ(d.header().hosts, 13u);
      // Learning keeps what it holds.
      PeerInfo other = info_of(3);
      other.port = 1;
      d.learn(c, other);
      EXPECT_EQ(d.find(c)->port, info_of(c).port);
    }
  }
  // A full table goes whole to everyone.
  const DirectoryFrame full = whole(10, true);
  const int four[] = {4};
  const DirectoryFrame passed = decode_directory(directory_for(full, needs_of(four, 10)), 10);
  EXPECT_EQ(passed.entries.size(), 10u);
  Directory d;
  d.assign(passed, 4);
  EXPECT_EQ(d.known(), 10u);
}

TEST(Directory, FramesThatLieAreRefused) {
  const int n = 20;
  DirectoryFrame f = whole(n, true);
  const auto good = encode_directory(f.header, f.entries);
  EXPECT_NO_THROW(decode_directory(good, n));
  auto refused = [&](std::vector<std::uint8_t> bytes, int ranks) {
    try {
      decode_directory(bytes, ranks);
    } catch (const std::system_error& e) {
      return e.code() == make_error_code(errc::bad_message);
    }
    return false;
  };
  EXPECT_TRUE(refused(good, n + 1));  // for another size
  auto cut = good;
  cut.pop_back();
  EXPECT_TRUE(refused(cut, n));  // short
  auto longer = good;
  longer.push_back(0);
  EXPECT_TRUE(refused(longer, n));  // trailing bytes
  {
    auto swapped = f.entries;
    std::swap(swapped[3], swapped[4]);
    EXPECT_TRUE(refused(encode_directory(f.header, swapped), n));  // out of order
  }
  {
    auto missing = f.entries;
    missing.pop_back();
    EXPECT_TRUE(refused(encode_directory(f.header, missing), n));  // "full" without every rank
  }
  {
    auto out_of_range = f.entries;
    out_of_range.back().rank = n;
    EXPECT_TRUE(refused(encode_directory(f.header, out_of_range), n));
  }
  {
    DirectoryHeader h = f.header;
    h.hosts = 0;
    EXPECT_TRUE(refused(encode_directory(h, f.entries), n));
  }
  {
    auto zero_hosts = f.entries;
    zero_hosts[0].host_ranks = 0;
    EXPECT_TRUE(refused(encode_directory(f.header, zero_hosts), n));
  }
  // A root or leader that lacks what a rank keeps (here rank 2's child 5) says so rather than
  // passing too little.
  DirectoryFrame sparse = whole(n, false);
  sparse.entries.erase(sparse.entries.begin() + 5);
  const int two[] = {2};
  EXPECT_THROW(directory_for(sparse, needs_of(two, n)), std::system_error);
  // Lookups: a rank out of range, an empty or oversized answer.
  EXPECT_THROW(decode_whois(encode_whois(n), n), std::system_error);
  EXPECT_EQ(decode_whois(encode_whois(n - 1), n), n - 1);
  EXPECT_THROW(decode_whois_answer(encode_whois_answer({}), n), std::system_error);
  std::vector<Located> hops{{3, info_of(3)}, {n, info_of(0)}};
  EXPECT_THROW(decode_whois_answer(encode_whois_answer(hops), n), std::system_error);
}

struct Outcome {
  std::size_t known_at_start = 0;
  std::vector<std::int32_t> reduced;
  std::vector<std::int32_t> exchanged;
  std::string error;
};

// n ranks on the in-memory network: an all_reduce, then an all_to_all, which links every pair and
// so makes every rank find the addresses it was not given.
void many_ranks_find_each_other(int n, std::size_t count) {
  const UniqueId id = detail::memory_unique_id();
  std::vector<Outcome> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator c = Communicator::create(id, r, n);
        out[r].known_at_start = detail::impl_of(c)->peers().addresses_known();
        std::vector<std::int32_t> mine(count, r + 1);
        out[r].reduced.resize(count);
        c.all_reduce(mine.data(), out[r].reduced.data(), count, DataType::int32, ReduceOp::sum);
        std::vector<std::int32_t> send(static_cast<std::size_t>(n) * count);
        for (int p = 0; p < n; ++p)
          for (std::size_t i = 0; i < count; ++i)
            send[p * count + i] = static_cast<std::int32_t>(r * 100000 + p * 10 + i);
        out[r].exchanged.resize(send.size());
        c.all_to_all(send.data(), out[r].exchanged.data(), count, DataType::int32);
        c.destroy();
      } catch (const std::exception& e) {
        out[r].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  const std::int32_t sum = n * (n + 1) / 2;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(out[r].error, "") << "rank " << r;
    EXPECT_LE(out[r].known_at_start, static_cast<std::size_t>(log2_ceil(n) + 6)) << "rank " << r;
    EXPECT_EQ(out[r].reduced, std::vector<std::int32_t>(count, sum)) << "rank " << r;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(out[r].exchanged[p * count + i],
                  static_cast<std::int32_t>(p * 100000 + r * 10 + i))
            << "rank " << r << " from " << p;
  }
}

TEST(SpreadDirectory, FortyRanksAboveTheFullTableLimitFindEveryAddressByAsking) {
  // Above COCCL_DIRECTORY_FULL (lowered from 64: the lookups take up to six hops at 40 ranks as
  // at 64, and the all_to_all links every pair, which at 96 ranks took 19 s under ASan).
  const test::ParamOverride limit(params::directory_full, "16");
  many_ranks_find_each_other(40, 3);
}

TEST(SpreadDirectory, EightRanksWithoutTheWholeTableStillLinkEveryPair) {
  const test::ParamOverride sparse(params::directory_full, "0");
  many_ranks_find_each_other(8, 5);
}

// Ranks of several ids on the in-memory network, rank r on host host_of(r): whether each rank's
// communicator sees every rank on one host ("" where it formed, else why not). A root sees only
// its share; the roots' barrier tells every root about the others' hosts.
std::vector<std::string> one_host_seen(int n, int ids, int (*host_of)(int)) {
  std::vector<UniqueId> list;
  for (int k = 0; k < ids; ++k) list.push_back(detail::memory_unique_id());
  std::vector<std::string> seen(n);
  std::latch formed(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto party = std::make_shared<Traffic>();
      party->set_host(0x7e57000000000000ull + static_cast<std::uint64_t>(host_of(r)));
      std::promise<Communicator> made;
      auto made_future = made.get_future();
      detail::start_create(
          list, r, n, CommunicatorOptions{},
          [&made](boost::system::error_code ec, Communicator c) {
            if (ec)
              made.set_exception(std::make_exception_ptr(boost::system::system_error(ec)));
            else
              made.set_value(std::move(c));
          },
          nullptr, party);
      Communicator c;
      try {
        c = made_future.get();
        seen[r] = detail::impl_of(c)->one_host() ? "one host" : "several hosts";
      } catch (const std::exception& e) {
        seen[r] = e.what();
      }
      formed.arrive_and_wait();
    });
  for (auto& t : threads) t.join();
  return seen;
}

TEST(SeveralRoots, EveryRankLearnsWhetherAllAreOnOneHost) {
  // Three shares of three ranks, every rank on one host.
  for (const std::string& s : one_host_seen(9, 3, [](int) { return 1; })) EXPECT_EQ(s, "one host");
  // Ranks 0-4 on one host, 5-8 on another: the first share (ranks 0-2) holds one host only, and
  // learns of the other through the barrier.
  for (const std::string& s : one_host_seen(9, 3, [](int r) { return r < 5 ? 1 : 2; }))
    EXPECT_EQ(s, "several hosts");
  // Above the full table's limit, with 5 ids for 70 ranks on 9 hosts.
  const test::ParamOverride sparse(params::directory_full, "16");
  for (const std::string& s : one_host_seen(70, 5, [](int r) { return r / 8; }))
    EXPECT_EQ(s, "several hosts");
}

}  // namespace
}  // namespace coccl::transport
