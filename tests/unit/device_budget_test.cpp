// The grid limit of device kernels (collectives/device_budget): all kernels of every rank and
// communicator that can be resident on one GPU at once must fit on it together.
#include "collectives/device_budget.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/device.hpp"

namespace coccl::detail {
namespace {

GpuShare on(std::uint64_t host, unsigned char gpu, int capacity = 132, int comms = 1) {
  GpuShare s;
  s.host = host;
  s.gpu.fill(0);
  s.gpu[0] = gpu;
  s.capacity = capacity;
  s.comms = comms;
  return s;
}

TEST(DeviceBudget, OneRankPerGpuSplitsTheGpuBetweenCommunicatorsAndTheNextKernel) {
  const std::vector<GpuShare> ranks{on(1, 0), on(1, 1)};
  EXPECT_EQ(block_budget(ranks, 2, true), 132 / (1 * 2 * 2));
  EXPECT_EQ(block_budget(ranks, 2, false), 132 / (1 * 2 * 1));
  EXPECT_EQ(block_budget(ranks, 1, false), 128);  // clamped to device::max_blocks
}

TEST(DeviceBudget, RanksSharingAGpuEachGetTheirShare) {
  EXPECT_EQ(block_budget({on(1, 0), on(1, 0)}, 2, true), 132 / (2 * 2 * 2));
  EXPECT_EQ(block_budget({on(1, 0), on(1, 0), on(1, 0)}, 2, true), 132 / (3 * 2 * 2));
  EXPECT_EQ(block_budget({on(1, 0), on(1, 0), on(1, 0), on(1, 0)}, 2, true), 132 / (4 * 2 * 2));
}

TEST(DeviceBudget, TheMostCrowdedGpuOfTheGroupDecidesForEveryRank) {
  // Ranks 0-2 share GPU 0, rank 3 has GPU 1 to itself: every rank uses GPU 0's share.
  EXPECT_EQ(block_budget({on(1, 0), on(1, 1), on(1, 0), on(1, 0)}, 1, false), 132 / 3);
}

TEST(DeviceBudget, EqualUuidsOnDifferentHostsAreDifferentGpus) {
  EXPECT_EQ(block_budget({on(1, 0), on(2, 0)}, 1, false), 128);
}

TEST(DeviceBudget, MoreCommunicatorsOfAProcessThanTheParameterSayCount) {
  EXPECT_EQ(block_budget({on(1, 0, 132, 1), on(1, 1, 132, 3)}, 2, false), 132 / 3);
  EXPECT_EQ(block_budget({on(1, 0, 132, 1), on(1, 1, 132, 1)}, 0, false), 128);
}

TEST(DeviceBudget, TheSmallestGpuDecidesAndTheLimitIsNeverBelowOneBlock) {
  EXPECT_EQ(block_budget({on(1, 0, 264), on(1, 1, 66)}, 1, true), 66 / 2);
  EXPECT_EQ(block_budget({on(1, 0, 4), on(1, 0, 4), on(1, 0, 4), on(1, 0, 4)}, 8, true), 1);
  EXPECT_EQ(block_budget({}, 1, false), 1);
}

}  // namespace
}  // namespace coccl::detail
