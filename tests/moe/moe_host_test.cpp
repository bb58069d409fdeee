// The MoE exchange on host memory across real processes: each test launches one moe_worker per
// rank (through the multirank harness), which checks its results against
// tests/moe/moe_reference.hpp.
#include <gtest/gtest.h>

#include <string>

#include "tests/multirank/harness.hpp"

namespace coccl::test {
namespace {

class MoeHost : public ::testing::TestWithParam<int> {
 protected:
  void expect_passes(const std::string& scenario) {
    LaunchOptions o;
    o.scenario = scenario;
    o.nranks = GetParam();
    o.env = {"COCCL_TIMEOUT=60"};
    const LaunchResult r = launch(o);
    EXPECT_TRUE(r.all_passed()) << r.describe();
  }
};

TEST_P(MoeHost, AllToAllvRandomSkewedZeroAndMaximumCountsMatchReference) { expect_passes("a2av"); }
TEST_P(MoeHost, AllToAllvCountAboveMaximumFailsOnEveryRank) { expect_passes("a2av_over_max"); }
TEST_P(MoeHost, DispatchGroupsRowsByExpertAndCombineSumsWeightedOutputs) {
  expect_passes("dispatch_combine");
}
TEST_P(MoeHost, DispatchWithEveryTokenRoutedToOneRank) { expect_passes("dispatch_skewed"); }
TEST_P(MoeHost, DispatchOverCapacityFailsOnEveryRank) { expect_passes("dispatch_over_capacity"); }
TEST_P(MoeHost, CInterfaceExchangesAndReportsErrors) { expect_passes("c_api"); }

INSTANTIATE_TEST_SUITE_P(Ranks, MoeHost, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

}  // namespace
}  // namespace coccl::test
