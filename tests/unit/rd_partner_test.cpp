// Recursive doubling's pairing (collectives/algo/common.hpp, rd_partner), in Gray-code order and
// by XOR: each round pairs every rank below the power of two with exactly one other, and the
// rounds together carry every rank's data to every rank. In Gray-code order a rank's ring
// neighbours are among its partners, which lets the fast path and the slow path leave the check of
// ring neighbours to the algorithm's own messages; by XOR the partners are r XOR 2^k, the entries
// a large communicator's directory keeps.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "collectives/algo/common.hpp"

namespace coccl::detail::algo {
namespace {

TEST(RdPartner, EachRoundPairsEveryRankWithExactlyOneOther) {
  for (bool gray : {true, false})
    for (int n = 2; n <= 1024; n *= 2)
      for (int m = 1; m < n; m <<= 1)
        for (int r = 0; r < n; ++r) {
          const int p = rd_partner(r, m, gray);
          ASSERT_GE(p, 0) << gray << " " << n << " " << m << " " << r;
          ASSERT_LT(p, n) << gray << " " << n << " " << m << " " << r;
          ASSERT_NE(p, r) << gray << " " << n << " " << m << " " << r;
          ASSERT_EQ(rd_partner(p, m, gray), r) << gray << " " << n << " " << m << " " << r;
        }
}

TEST(RdPartner, TheRoundsCarryEveryRanksDataToEveryRank) {
  for (bool gray : {true, false})
    for (int n = 2; n <= 256; n *= 2) {
      std::vector<std::set<int>> has(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) has[static_cast<std::size_t>(r)] = {r};
      for (int m = 1; m < n; m <<= 1) {
        std::vector<std::set<int>> next = has;
        for (int r = 0; r < n; ++r) {
          const auto& theirs = has[static_cast<std::size_t>(rd_partner(r, m, gray))];
          // Each round combines two disjoint halves: nothing is counted twice.
          for (int x : theirs)
            ASSERT_EQ(has[static_cast<std::size_t>(r)].count(x), 0u) << gray << " " << n;
          next[static_cast<std::size_t>(r)].insert(theirs.begin(), theirs.end());
        }
        has = std::move(next);
      }
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(has[static_cast<std::size_t>(r)].size(), static_cast<std::size_t>(n))
            << gray << " " << n << " " << r;
    }
}

TEST(RdPartner, InGrayOrderRingNeighboursArePartners) {
  for (int n = 2; n <= 1024; n *= 2)
    for (int r = 0; r < n; ++r) {
      std::set<int> partners;
      for (int m = 1; m < n; m <<= 1) partners.insert(rd_partner(r, m, true));
      EXPECT_EQ(partners.size(), static_cast<std::size_t>(__builtin_ctz(static_cast<unsigned>(n))))
          << n << " " << r;
      EXPECT_TRUE(partners.count((r + 1) % n)) << n << " " << r;
      EXPECT_TRUE(partners.count((r + n - 1) % n)) << n << " " << r;
    }
}

TEST(RdPartner, ByXorThePartnersAreTheHypercubes) {
  for (int n = 2; n <= 1024; n *= 2)
    for (int r = 0; r < n; ++r)
      for (int m = 1; m < n; m <<= 1) EXPECT_EQ(rd_partner(r, m, false), r ^ m) << n << " " << r;
}

}  // namespace
}  // namespace coccl::detail::algo
