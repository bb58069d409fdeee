// Links under a memory budget (COCCL_MEM_BUDGET) and an idle timeout (COCCL_LINK_IDLE_S), on
// real processes over shm and tcp (both engines): closes agreed by both ends never fail the
// communicator, the next operation reopens what it needs, and every result is checked (scenario
// "links").
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/multirank/harness.hpp"
#include "tests/multirank/worker.hpp"

namespace coccl::test {
namespace {

constexpr int slot_bytes = 65536;

class Links : public ::testing::TestWithParam<const char*> {
 protected:
  LaunchOptions options(const std::string& mode, int nranks, std::vector<std::string> env) {
    LaunchOptions o;
    o.scenario = "links";
    o.nranks = nranks;
    o.args = {"cold", mode};
    o.deadline = std::chrono::seconds(120);
    // tcp_asio: tcp links on the Asio engine, where small operations take the fast path and
    // their credits wait for the next frame (or the loop's deferral).
    const std::string transport = GetParam();
    o.env = {"COCCL_TIMEOUT=60",
             "COCCL_TRANSPORT=" + (transport == "tcp_asio" ? std::string("tcp") : transport),
             "COCCL_SLOT_BYTES=" + std::to_string(slot_bytes)};
    if (transport == "tcp_asio") o.env.push_back("COCCL_TCP_ENGINE=asio");
    o.env.insert(o.env.end(), env.begin(), env.end());
    return o;
  }
};

TEST_P(Links, SmallBudgetClosesAndReopensLinksAndEveryResultIsRight) {
  // Two links of two slots: the ring collectives need both neighbours, each exchange another
  // peer, so links are closed (least recently used first) and reopened all along.
  const LaunchResult r =
      launch(options("budget", 4,
                     {"COCCL_SLOTS=2", "COCCL_ALGO=ring",
                      "COCCL_MEM_BUDGET=" + std::to_string(2 * 2 * slot_bytes)}));
  ASSERT_TRUE(r.all_passed()) << r.describe();
}

TEST_P(Links, IdleLinksCloseAndTheNextCollectiveReopensThem) {
  const LaunchResult r = launch(options("idle", 3, {"COCCL_LINK_IDLE_S=0.2"}));
  ASSERT_TRUE(r.all_passed()) << r.describe();
}

// Every rank fails naming the budget: its first operation is refused, or, where the other rank
// failed so before this one had finished joining, the join fails with the other's reason.
TEST_P(Links, BudgetBelowOneLinkIsAClearError) {
  const LaunchResult r = launch(options("tiny", 2, {"COCCL_MEM_BUDGET=100000"}));
  ASSERT_FALSE(r.timed_out) << r.describe();
  int refused = 0;
  for (const RankResult& rank : r.ranks) {
    EXPECT_NE(rank.output.find("cannot hold even one link"), std::string::npos) << r.describe();
    if (rank.exit_code == 0)
      ++refused;
    else
      EXPECT_NE(rank.output.find("could not join the communicator"), std::string::npos)
          << r.describe();
  }
  EXPECT_GE(refused, 1) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Transports, Links, ::testing::Values("shm", "tcp", "tcp_asio"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace coccl::test
