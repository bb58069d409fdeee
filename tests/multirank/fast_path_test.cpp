// The fast path of small host operations (collectives/fast_path.hpp) on real processes over shm,
// over tcp, and between ranks acting as hosts (recursive doubling for all_reduce):
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
#include "transport/tcp_uring.hpp"

namespace coccl::test {
namespace {

// The proxy thread never falls asleep (so a blocking caller can always borrow its role) and the
// fast path never gives up waiting: whether an operation takes it depends on nothing but the
// operation. Over tcp (the fast path polls socket 0 of a link on either engine), the largest
// block is what a tcp link's reader holds whole, so the limit is set below it; the scenarios take
// their sizes from COCCL_FAST_MAX_BYTES. "tcp" runs the Asio engine, "tcp_uring" the io_uring
// one, whose links carry larger puts on sockets of the ring too. On "hosts" and "hosts_uring"
// every rank acts as a host of its own (COCCL_HOSTID), so the communicator spans hosts and a small
// all_reduce between a power of two ranks runs recursive doubling; on "two_hosts" the ranks form
// two hosts, shared memory within each and tcp between them.
std::vector<std::string> always(const std::string& transport) {
  const bool tcp = transport != "shm";
  std::vector<std::string> env = {"COCCL_TIMEOUT=60", "COCCL_SPIN_US=60000000"};
  if (transport == "shm" || transport.rfind("tcp", 0) == 0)
    env.push_back(std::string("COCCL_TRANSPORT=") + (tcp ? "tcp" : "shm"));
  if (tcp) {
    const bool uring = transport.find("uring") != std::string::npos;
    env.push_back(uring ? "COCCL_TCP_ENGINE=uring" : "COCCL_TCP_ENGINE=asio");
    env.push_back("COCCL_FAST_MAX_BYTES=16000");
  }
  return env;
}

// The host each rank acts as, for the transports that name them.
std::vector<std::vector<std::string>> hosts_of(const std::string& transport, int nranks) {
  if (transport.rfind("hosts", 0) == 0) return rank_hosts(nranks, nranks, "fast-host-");
  if (transport == "two_hosts") return rank_hosts(nranks, 2, "fast-host-");
  return {};
}

// "tcp3ranks" for ("tcp", 3).
std::string param_name(const ::testing::TestParamInfo<std::pair<std::string, int>>& info) {
  return info.param.first + std::to_string(info.param.second) + "ranks";
}

void skip_without_engine(const std::string& transport) {
  if (transport.find("uring") != std::string::npos && !transport::uring_unavailable().empty())
    GTEST_SKIP() << "io_uring unavailable here: " << transport::uring_unavailable();
}

LaunchResult run(const std::string& scenario, const std::string& transport, int nranks,
                 std::vector<std::string> env, std::vector<std::string> args = {}) {
  LaunchOptions o;
  o.scenario = scenario;
  o.nranks = nranks;
  o.env = std::move(env);
  o.args = std::move(args);
  o.rank_env = hosts_of(transport, nranks);
  o.deadline = std::chrono::seconds(120);
  return launch(o);
}

// (transport, ranks)
class FastPath : public ::testing::TestWithParam<std::pair<std::string, int>> {
 protected:
  void SetUp() override { skip_without_engine(GetParam().first); }
};

TEST_P(FastPath, EveryEligibleOperationTakesItAndMatchesTheReference) {
  const LaunchResult r =
      run("fast_path", GetParam().first, GetParam().second, always(GetParam().first));
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

TEST_P(FastPath, TurnedOffNothingTakesItAndTheResultsAreTheSame) {
  std::vector<std::string> env = always(GetParam().first);
  std::erase_if(env, [](const std::string& e) { return e.rfind("COCCL_FAST_MAX_BYTES=", 0) == 0; });
  env.push_back("COCCL_FAST_MAX_BYTES=0");
  const LaunchResult r = run("fast_path", GetParam().first, GetParam().second, env, {"off"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

// Small operations between large ones, the ranks out of step: a rank on the fast path meets the
// next operation's frames from a peer that is ahead.
TEST_P(FastPath, SmallOperationsBetweenLargeOnesWithRanksOutOfStep) {
  const LaunchResult r =
      run("fast_interleaved", GetParam().first, GetParam().second, always(GetParam().first));
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

// Rank 0 on the fast path, the others on the slow path: each takes what the other path sends.
TEST_P(FastPath, OneRankOnItTheOthersOnTheSlowPath) {
  const LaunchResult r =
      run("fast_mixed", GetParam().first, GetParam().second, always(GetParam().first));
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Links, FastPath,
                         ::testing::Values(std::pair<std::string, int>{"shm", 2},
                                           std::pair<std::string, int>{"shm", 3},
                                           std::pair<std::string, int>{"shm", 4},
                                           std::pair<std::string, int>{"tcp", 2},
                                           std::pair<std::string, int>{"tcp", 3},
                                           std::pair<std::string, int>{"tcp_uring", 2},
                                           std::pair<std::string, int>{"tcp_uring", 3},
                                           std::pair<std::string, int>{"hosts", 3},
                                           std::pair<std::string, int>{"hosts", 4},
                                           std::pair<std::string, int>{"hosts_uring", 4},
                                           std::pair<std::string, int>{"two_hosts", 4}),
                         param_name);

// (transport, ranks)
class FastPathHandover : public ::testing::TestWithParam<std::pair<std::string, int>> {
 protected:
  void SetUp() override { skip_without_engine(GetParam().first); }
};

TEST_P(FastPathHandover, ALatePeersOperationIsHandedOverAndWhatFollowsKeepsItsOrder) {
  std::vector<std::string> env = always(GetParam().first);
  for (std::string& e : env)
    if (e.rfind("COCCL_SPIN_US=", 0) == 0) e = "COCCL_SPIN_US=0";
  const LaunchResult r = run("fast_handover", GetParam().first, GetParam().second, env);
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Links, FastPathHandover,
                         ::testing::Values(std::pair<std::string, int>{"shm", 3},
                                           std::pair<std::string, int>{"tcp", 3},
                                           std::pair<std::string, int>{"tcp_uring", 3},
                                           std::pair<std::string, int>{"hosts", 4},
                                           std::pair<std::string, int>{"hosts_uring", 4}),
                         param_name);

// Over shm, blocking callers on three threads (small operations on the fast path, larger ones
// driving the loop) and handlers that make blocking calls, refused (tests/multirank/blocking.cpp).
TEST(BlockingCallers, SeveralThreadsOverShmAndRefusedHandlers) {
  const LaunchResult r =
      run("blocking_threads", "shm", 3, {"COCCL_TIMEOUT=60", "COCCL_TRANSPORT=shm"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

}  // namespace
}  // namespace coccl::test
