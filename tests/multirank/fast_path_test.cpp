// The fast path of small host operations (collectives/fast_path.hpp) on real processes over shm:
// every eligible operation takes it, from blocking callers, coroutines on the proxy thread and
// several threads at once, and every result matches the reference (scenario "fast_path"); turned
// off, nothing takes it and the results are the same; with it on one rank only, the results are
// the same (scenario "fast_mixed"); an operation whose peers are late is handed
// to the proxy thread, and what is started behind it keeps its order and can be cancelled
// (scenario "fast_handover").
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/multirank/harness.hpp"
#include "tests/multirank/worker.hpp"

namespace coccl::test {
namespace {

// The proxy thread never falls asleep (so a blocking caller can always borrow its role) and the
// fast path never gives up waiting: whether an operation takes it depends on nothing but the
// operation.
const std::vector<std::string> always = {"COCCL_TIMEOUT=60", "COCCL_TRANSPORT=shm",
                                         "COCCL_SPIN_US=60000000"};

LaunchResult run(const std::string& scenario, int nranks, std::vector<std::string> env,
                 std::vector<std::string> args = {}) {
  return launch(scenario, nranks, std::move(env), std::move(args), std::chrono::seconds(120));
}

class FastPath : public ::testing::TestWithParam<int> {};

TEST_P(FastPath, EveryEligibleOperationTakesItAndMatchesTheReference) {
  const LaunchResult r = run("fast_path", GetParam(), always);
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

TEST_P(FastPath, TurnedOffNothingTakesItAndTheResultsAreTheSame) {
  std::vector<std::string> env = always;
  env.push_back("COCCL_FAST_MAX_BYTES=0");
  const LaunchResult r = run("fast_path", GetParam(), env, {"off"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

// Rank 0 on the fast path, the others on the slow path: each takes what the other path sends.
TEST_P(FastPath, OneRankOnItTheOthersOnTheSlowPath) {
  const LaunchResult r = run("fast_mixed", GetParam(), always);
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Ranks, FastPath, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(FastPathHandover, ALatePeersOperationIsHandedOverAndWhatFollowsKeepsItsOrder) {
  const LaunchResult r =
      run("fast_handover", 3, {"COCCL_TIMEOUT=60", "COCCL_TRANSPORT=shm", "COCCL_SPIN_US=0"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

// Over shm, blocking callers on three threads (small operations on the fast path, larger ones
// driving the loop) and handlers that make blocking calls, refused (tests/multirank/blocking.cpp).
TEST(BlockingCallers, SeveralThreadsOverShmAndRefusedHandlers) {
  const LaunchResult r = run("blocking_threads", 3, {"COCCL_TIMEOUT=60", "COCCL_TRANSPORT=shm"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

}  // namespace
}  // namespace coccl::test
