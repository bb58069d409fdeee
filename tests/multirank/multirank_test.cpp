// Specification of coccl's collectives across real processes: every test launches one coccl_worker
// per rank (see harness.hpp), each of which checks its results against an independent reference
// (reference.hpp) and exits 0 only if all of them matched.
#include <gtest/gtest.h>

#include <algorithm>
#include <coccl/error.hpp>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "tests/multirank/harness.hpp"
#include "tests/multirank/worker.hpp"
#include "transport/tcp_uring.hpp"

namespace coccl::test {
namespace {

using std::chrono::seconds;

// Long enough for eight oversubscribed ranks; a hang shows up as timed_out well before the
// harness deadline.
const std::string generous_timeout = "COCCL_TIMEOUT=60";

LaunchResult run_scenario(const std::string& scenario, int nranks,
                          std::vector<std::string> env = {}, std::vector<std::string> args = {}) {
  LaunchOptions o;
  o.scenario = scenario;
  o.nranks = nranks;
  o.env = std::move(env);
  if (std::none_of(o.env.begin(), o.env.end(),
                   [](const std::string& kv) { return kv.starts_with("COCCL_TIMEOUT="); }))
    o.env.insert(o.env.begin(), generous_timeout);
  o.args = std::move(args);
  return launch(o);
}

int coccl_exit(errc e) { return exit_coccl_error_base + static_cast<int>(e); }

std::string last_error_line(const RankResult& r) {
  auto at = r.output.find("LAST_ERROR ");
  if (at == std::string::npos) return {};
  return r.output.substr(at, r.output.find('\n', at) - at);
}

// The error each rank reported, in the test's output (fault tests assert on these texts).
void print_errors(const LaunchResult& r) {
  for (std::size_t rank = 0; rank < r.ranks.size(); ++rank)
    if (auto line = last_error_line(r.ranks[rank]); !line.empty())
      std::printf("rank %zu: exit %d, %s\n", rank, r.ranks[rank].exit_code, line.c_str());
}

// ---- Correctness, by rank count -------------------------------------------------------------

class Collectives : public ::testing::TestWithParam<int> {
 protected:
  void expect_scenario_passes(const std::string& scenario) {
    const LaunchResult r = run_scenario(scenario, GetParam());
    EXPECT_TRUE(r.all_passed()) << r.describe();
  }
};

TEST_P(Collectives, AllReduceEveryTypeAndOpInAndOutOfPlace) {
  expect_scenario_passes("all_reduce");
}
TEST_P(Collectives, BroadcastFromEveryRoot) { expect_scenario_passes("broadcast"); }
TEST_P(Collectives, ReduceEveryTypeAndOpToRotatingRoots) { expect_scenario_passes("reduce"); }
TEST_P(Collectives, AllGatherInAndOutOfPlace) { expect_scenario_passes("all_gather"); }
TEST_P(Collectives, ReduceScatterEveryTypeAndOp) { expect_scenario_passes("reduce_scatter"); }
TEST_P(Collectives, AllToAll) { expect_scenario_passes("all_to_all"); }
TEST_P(Collectives, AllToAllvUnevenCountsWithZeros) { expect_scenario_passes("all_to_allv"); }
TEST_P(Collectives, GatherToEveryRoot) { expect_scenario_passes("gather"); }
TEST_P(Collectives, ScatterFromEveryRoot) { expect_scenario_passes("scatter"); }
TEST_P(Collectives, SendRecvRingAndAllPairsGroups) { expect_scenario_passes("send_recv"); }
TEST_P(Collectives, BarrierReleasesNoRankBeforeTheLastEnters) { expect_scenario_passes("barrier"); }
TEST_P(Collectives, SplitByParityAndLeaveWithNegativeColor) { expect_scenario_passes("split"); }
TEST_P(Collectives, SplitMembersCalledByTheMembersOnlyAndInvalidListsRefused) {
  expect_scenario_passes("split_members");
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(2, 3, 4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// ---- all_reduce under forced algorithms, transports and small slots ------------------------

struct Variant {
  const char* name;
  std::vector<std::string> env;
  int nranks;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class AllReduceVariants : public ::testing::TestWithParam<Variant> {};

TEST_P(AllReduceVariants, AllReduceMatchesReference) {
  const LaunchResult r = run_scenario("all_reduce", GetParam().nranks, GetParam().env, {"quick"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

const std::string small_slots = "COCCL_SLOT_BYTES=4096";
const std::string two_slots = "COCCL_SLOTS=2";

INSTANTIATE_TEST_SUITE_P(
    Forced, AllReduceVariants,
    ::testing::Values(
        Variant{"oneshot_3ranks", {"COCCL_ALGO=oneshot"}, 3},
        Variant{"oneshot_4ranks", {"COCCL_ALGO=oneshot"}, 4},
        Variant{"direct_3ranks", {"COCCL_ALGO=direct"}, 3},
        Variant{"direct_4ranks", {"COCCL_ALGO=direct"}, 4},
        Variant{"ring_3ranks", {"COCCL_ALGO=ring"}, 3},
        Variant{"ring_2ranks", {"COCCL_ALGO=ring"}, 2},
        Variant{"ring_8ranks", {"COCCL_ALGO=ring"}, 8},
        Variant{"ring_small_slots_5ranks", {"COCCL_ALGO=ring", small_slots, two_slots}, 5},
        Variant{"oneshot_8ranks", {"COCCL_ALGO=oneshot"}, 8},
        Variant{"direct_8ranks", {"COCCL_ALGO=direct"}, 8},
        Variant{"tcp_8ranks", {"COCCL_TRANSPORT=tcp"}, 8},
        Variant{"tcp_3ranks", {"COCCL_TRANSPORT=tcp"}, 3},
        Variant{"tcp_4ranks", {"COCCL_TRANSPORT=tcp"}, 4},
        Variant{"small_slots_3ranks", {small_slots, two_slots}, 3},
        Variant{"oneshot_small_slots_4ranks", {"COCCL_ALGO=oneshot", small_slots, two_slots}, 4},
        Variant{"direct_small_slots_3ranks", {"COCCL_ALGO=direct", small_slots, two_slots}, 3},
        Variant{"ring_tcp_small_slots_3ranks",
                {"COCCL_ALGO=ring", "COCCL_TRANSPORT=tcp", small_slots},
                3},
        Variant{"direct_tcp_4ranks", {"COCCL_ALGO=direct", "COCCL_TRANSPORT=tcp"}, 4},
        Variant{"rd_2ranks", {"COCCL_ALGO=rd"}, 2}, Variant{"rd_3ranks", {"COCCL_ALGO=rd"}, 3},
        Variant{"rd_5ranks", {"COCCL_ALGO=rd"}, 5}, Variant{"rd_8ranks", {"COCCL_ALGO=rd"}, 8},
        Variant{"rd_small_slots_6ranks", {"COCCL_ALGO=rd", small_slots, two_slots}, 6},
        Variant{"rd_tcp_5ranks", {"COCCL_ALGO=rd", "COCCL_TRANSPORT=tcp"}, 5},
        Variant{"nccl_algo_ring_3ranks", {"NCCL_ALGO=Ring"}, 3}),
    [](const auto& info) { return std::string(info.param.name); });

// ---- Algorithms for many ranks ------------------------------------------------------------------

// COCCL_DIRECT_MAX_RANKS=1 makes even a few ranks take the algorithms of large communicators:
// recursive doubling, Bruck and rings for all_reduce, all_gather and reduce_scatter (small and
// large sizes), Bruck for all_to_all's small blocks, binary trees for broadcast and reduce.
struct ScaleCase {
  const char* scenario;
  int nranks;
};

void PrintTo(const ScaleCase& c, std::ostream* os) { *os << c.scenario << "_" << c.nranks; }

class ManyRankAlgorithms : public ::testing::TestWithParam<ScaleCase> {};

TEST_P(ManyRankAlgorithms, MatchReference) {
  const LaunchResult r =
      run_scenario(GetParam().scenario, GetParam().nranks, {"COCCL_DIRECT_MAX_RANKS=1"}, {"quick"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(
    DirectMaxOne, ManyRankAlgorithms,
    ::testing::Values(ScaleCase{"all_reduce", 3}, ScaleCase{"all_reduce", 6},
                      ScaleCase{"all_gather", 3}, ScaleCase{"all_gather", 5},
                      ScaleCase{"reduce_scatter", 3}, ScaleCase{"reduce_scatter", 5},
                      ScaleCase{"all_to_all", 2}, ScaleCase{"all_to_all", 5},
                      ScaleCase{"all_to_all", 6}, ScaleCase{"broadcast", 3},
                      ScaleCase{"broadcast", 6}, ScaleCase{"reduce", 3}, ScaleCase{"reduce", 6}),
    [](const auto& info) {
      return std::string(info.param.scenario) + "_" + std::to_string(info.param.nranks) + "ranks";
    });

// Distinct peers each rank reports linking to ("connected to rank P over ...").
std::vector<int> peers_linked(const LaunchResult& r) {
  std::vector<int> counts;
  for (const RankResult& rank : r.ranks) {
    std::vector<bool> seen(r.ranks.size(), false);
    const std::string key = "connected to rank ";
    for (std::size_t at = rank.output.find(key); at != std::string::npos;
         at = rank.output.find(key, at + 1))
      seen.at(static_cast<std::size_t>(std::stoi(rank.output.substr(at + key.size())))) = true;
    counts.push_back(static_cast<int>(std::count(seen.begin(), seen.end(), true)));
  }
  return counts;
}

// 16 ranks, above COCCL_DIRECT_MAX_RANKS (8): small all_reduce, all_gather, reduce_scatter,
// all_to_all and barrier link each rank with ranks r +- 2^k and r ^ 2^k only, 7 of its 15 peers.
TEST(ManyRanks, SmallCollectivesOfSixteenRanksLinkEachRankWithAtMostSevenPeers) {
  LaunchOptions o;
  o.scenario = "log_peers";
  o.nranks = 16;
  o.env = {generous_timeout, "COCCL_DEBUG=INFO", "COCCL_DEBUG_SUBSYS=net"};
  const LaunchResult r = launch(o);
  ASSERT_TRUE(r.all_passed()) << r.describe();
  const std::vector<int> peers = peers_linked(r);
  for (std::size_t rank = 0; rank < peers.size(); ++rank) {
    EXPECT_GE(peers[rank], 4) << "rank " << rank;
    EXPECT_LE(peers[rank], 7) << "rank " << rank;
  }
}

// ---- Every collective over the other transport settings --------------------------------------

TEST(EveryCollective, OverTcpWithThreeRanks) {
  const LaunchResult r = run_scenario("every_collective", 3, {"COCCL_TRANSPORT=tcp"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

TEST(EveryCollective, OverTcpWithFourRanksAndSmallSlots) {
  const LaunchResult r =
      run_scenario("every_collective", 4, {"COCCL_TRANSPORT=tcp", small_slots, two_slots});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

TEST(EveryCollective, OverShmWithThreeRanksAndSmallSlots) {
  const LaunchResult r =
      run_scenario("every_collective", 3, {"COCCL_TRANSPORT=shm", small_slots, two_slots});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

// ---- Topology: COCCL_HOSTID makes ranks of one machine act as hosts -------------------------

// Links as each rank's INFO log reports them ("connected to rank P over KIND"), by kind.
int links_over(const LaunchResult& r, const std::string& kind) {
  int n = 0;
  for (const RankResult& rank : r.ranks)
    for (std::size_t at = rank.output.find(" over " + kind); at != std::string::npos;
         at = rank.output.find(" over " + kind, at + 1))
      ++n;
  return n;
}

// Runs every_collective with rank r on host hosts[r] (COCCL_HOSTID), logging its links.
LaunchResult on_hosts(const std::vector<std::string>& hosts) {
  LaunchOptions o;
  o.scenario = "every_collective";
  o.nranks = static_cast<int>(hosts.size());
  o.env = {generous_timeout, "COCCL_TRANSPORT=auto", "COCCL_DEBUG=INFO", "COCCL_DEBUG_SUBSYS=net"};
  for (const std::string& h : hosts) o.rank_env.push_back({"COCCL_HOSTID=" + h});
  return launch(o);
}

TEST(Topology, RanksWithDistinctHostIdsLinkOverTcpAndGetEveryCollectiveRight) {
  const LaunchResult r = on_hosts({"host0", "host1", "host2"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
  EXPECT_EQ(links_over(r, "shm"), 0) << r.describe();
  EXPECT_EQ(links_over(r, "tcp"), 3 * 2) << r.describe();  // each rank reports its 2 links
}

TEST(Topology, RanksWithOneHostIdLinkOverShm) {
  const LaunchResult r = on_hosts({"rack7-node3", "rack7-node3", "rack7-node3"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
  EXPECT_EQ(links_over(r, "tcp"), 0) << r.describe();
  EXPECT_EQ(links_over(r, "shm"), 3 * 2) << r.describe();
}

TEST(Topology, TwoHostsOfTwoRanksMixShmInsideAndTcpAcross) {
  const LaunchResult r = on_hosts({"a", "a", "b", "b"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
  EXPECT_EQ(links_over(r, "shm"), 4 * 1) << r.describe();
  EXPECT_EQ(links_over(r, "tcp"), 4 * 2) << r.describe();
}

// Without the whole address table (COCCL_DIRECTORY_FULL=0): a rank of 8 holds 6 of the 8 entries
// and finds the rest by asking, and still links over shm inside a host and tcp across, since the
// entries it learns carry the host identity.
TEST(Topology, TwoHostsOfFourRanksWithoutTheWholeAddressTable) {
  LaunchOptions o;
  o.scenario = "every_collective";
  o.nranks = 8;
  o.env = {generous_timeout, "COCCL_TRANSPORT=auto", "COCCL_DIRECTORY_FULL=0", "COCCL_DEBUG=INFO",
           "COCCL_DEBUG_SUBSYS=net"};
  for (int r = 0; r < 8; ++r) o.rank_env.push_back({r < 4 ? "COCCL_HOSTID=a" : "COCCL_HOSTID=b"});
  const LaunchResult r = launch(o);
  EXPECT_TRUE(r.all_passed()) << r.describe();
  // every_collective links every pair (all_to_all): 3 peers inside each rank's host, 4 across.
  EXPECT_EQ(links_over(r, "shm"), 8 * 3) << r.describe();
  EXPECT_EQ(links_over(r, "tcp"), 8 * 4) << r.describe();
}

// ---- Registered buffers (register_buffer) ----------------------------------------------------

// Without the ib transport a registration is recorded and changes nothing: every transfer is
// staged (zero_copy_bytes stays 0) and right; bad registrations are refused.
TEST(RegisteredBuffers, OverShmAndTcpAreMovedAsUsual) {
  for (const char* transport : {"COCCL_TRANSPORT=shm", "COCCL_TRANSPORT=tcp"}) {
    const LaunchResult r = run_scenario("registered", 3, {transport});
    EXPECT_TRUE(r.all_passed()) << transport << "\n" << r.describe();
  }
}

// ---- Link setup by the first operation of a fresh communicator ------------------------------

// Every other test starts with a warm-up that links all peers; here each collective is the first
// operation, so it must make its own links without a wait cycle between ranks.
struct ColdCase {
  const char* name;
  const char* scenario;
  std::vector<std::string> env;
};

void PrintTo(const ColdCase& c, std::ostream* os) { *os << c.name; }

class ColdStart : public ::testing::TestWithParam<ColdCase> {};

TEST_P(ColdStart, FirstOperationOnAFreshCommunicatorLinksItsPeers) {
  std::vector<std::string> env = GetParam().env;
  env.push_back("COCCL_TIMEOUT=5");  // a wait cycle shows up as timed_out after 5 s
  const LaunchResult r = run_scenario(GetParam().scenario, 3, env, {"cold", "quick", "nolarge"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(
    ThreeRanks, ColdStart,
    ::testing::Values(ColdCase{"all_reduce", "all_reduce", {}},
                      ColdCase{"all_reduce_ring", "all_reduce", {"COCCL_ALGO=ring"}},
                      ColdCase{"broadcast", "broadcast", {}}, ColdCase{"reduce", "reduce", {}},
                      ColdCase{"all_gather", "all_gather", {}},
                      ColdCase{"reduce_scatter", "reduce_scatter", {}},
                      ColdCase{"all_to_all", "all_to_all", {}},
                      ColdCase{"all_to_allv", "all_to_allv", {}}, ColdCase{"gather", "gather", {}},
                      ColdCase{"scatter", "scatter", {}}, ColdCase{"send_recv", "send_recv", {}},
                      ColdCase{"barrier", "barrier", {}}),
    [](const auto& info) { return std::string(info.param.name); });

// ---- The asynchronous interface -------------------------------------------------------------

class Async : public ::testing::TestWithParam<int> {};

TEST_P(Async, CoroutinesOnAnIoContextAndOnTheProxyThreadGetEveryResult) {
  const LaunchResult r = run_scenario("async", GetParam());
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Ranks, Async, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// ---- Faults ---------------------------------------------------------------------------------

constexpr double timeout_s = 5;
// Allowed beyond the deadline the test sets: detection, process exit and a loaded machine.
constexpr double margin_s = 6;

class KilledRank : public ::testing::TestWithParam<const char*> {};

TEST_P(KilledRank, EverySurvivorFailsNamingTheDeadRankWithinTheTimeout) {
  LaunchOptions o;
  o.scenario = "loop";
  o.nranks = 4;
  o.env = {"COCCL_TIMEOUT=5", std::string("COCCL_TRANSPORT=") + GetParam()};
  o.signals = {{2, SIGKILL, "looping", std::chrono::milliseconds(200)}};
  o.deadline = seconds(60);
  const LaunchResult r = launch(o);
  print_errors(r);
  ASSERT_FALSE(r.timed_out) << r.describe();
  ASSERT_TRUE(r.fired[0]) << r.describe();
  EXPECT_EQ(r.ranks[2].signal, SIGKILL) << r.describe();
  for (int rank : {0, 1, 3}) {
    const RankResult& x = r.ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(x.signal, 0) << r.describe();
    EXPECT_TRUE(x.exit_code == coccl_exit(errc::peer_lost) ||
                x.exit_code == coccl_exit(errc::remote_error))
        << r.describe();
    EXPECT_NE(last_error_line(x).find("rank 2"), std::string::npos) << r.describe();
    EXPECT_LE(r.seconds_after_signal(rank, 0), timeout_s + margin_s) << r.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, KilledRank, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return std::string(info.param); });

class StoppedRank : public ::testing::TestWithParam<const char*> {};

TEST_P(StoppedRank, SurvivorsTimeOutNamingTheSilentRank) {
  LaunchOptions o;
  o.scenario = "loop";
  o.nranks = 4;
  o.env = {"COCCL_TIMEOUT=3", std::string("COCCL_TRANSPORT=") + GetParam()};
  o.signals = {{1, SIGSTOP, "looping", std::chrono::milliseconds(200)}};
  o.reap = {1};
  o.deadline = seconds(60);
  const LaunchResult r = launch(o);
  print_errors(r);
  ASSERT_FALSE(r.timed_out) << r.describe();
  ASSERT_TRUE(r.fired[0]) << r.describe();
  for (int rank : {0, 2, 3}) {
    const RankResult& x = r.ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(x.signal, 0) << r.describe();
    EXPECT_TRUE(x.exit_code == coccl_exit(errc::timed_out) ||
                x.exit_code == coccl_exit(errc::peer_lost) ||
                x.exit_code == coccl_exit(errc::remote_error))
        << r.describe();
    const std::string why = last_error_line(x);
    EXPECT_TRUE(why.find("rank 1") != std::string::npos ||
                why.find("no progress") != std::string::npos)
        << r.describe();
    EXPECT_LE(r.seconds_after_signal(rank, 0), 3 + margin_s) << r.describe();
  }
  const bool some_timed_out = r.ranks[0].exit_code == coccl_exit(errc::timed_out) ||
                              r.ranks[2].exit_code == coccl_exit(errc::timed_out) ||
                              r.ranks[3].exit_code == coccl_exit(errc::timed_out);
  EXPECT_TRUE(some_timed_out) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Transports, StoppedRank, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return std::string(info.param); });

TEST(Mismatch, AllReduceAgainstBroadcastFailsEveryRankAndOneSeesMismatch) {
  LaunchOptions o;
  o.scenario = "mismatch";
  o.nranks = 3;
  o.env = {"COCCL_TIMEOUT=5"};
  o.deadline = seconds(60);
  const LaunchResult r = launch(o);
  print_errors(r);
  ASSERT_FALSE(r.timed_out) << r.describe();
  bool seen = false;
  for (int rank = 0; rank < o.nranks; ++rank) {
    const RankResult& x = r.ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(x.signal, 0) << r.describe();
    EXPECT_TRUE(x.exit_code == coccl_exit(errc::mismatch) ||
                x.exit_code == coccl_exit(errc::remote_error) ||
                x.exit_code == coccl_exit(errc::peer_lost))
        << r.describe();
    seen |= x.exit_code == coccl_exit(errc::mismatch);
    EXPECT_LE(std::chrono::duration<double>(x.ended - r.started).count(), 5 + margin_s)
        << r.describe();
  }
  EXPECT_TRUE(seen) << r.describe();
}

TEST(Cancellation, QueuedOperationIsRemovedAndTerminalCancellationInFlightAbortsEveryRank) {
  LaunchOptions o;
  o.scenario = "cancel";
  o.nranks = 2;
  o.env = {"COCCL_TIMEOUT=60"};
  o.deadline = seconds(90);
  const LaunchResult r = launch(o);
  print_errors(r);
  ASSERT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.ranks[0].exit_code, 0) << r.describe();
  // Rank 1 learns of the abort from rank 0, long before COCCL_TIMEOUT.
  EXPECT_TRUE(r.ranks[1].exit_code == coccl_exit(errc::remote_error) ||
              r.ranks[1].exit_code == coccl_exit(errc::peer_lost) ||
              r.ranks[1].exit_code == coccl_exit(errc::aborted))
      << r.describe();
  EXPECT_NE(r.ranks[1].output.find("rank 0"), std::string::npos) << r.describe();
  EXPECT_LE(std::chrono::duration<double>(r.ranks[1].ended - r.started).count(), 30.0)
      << r.describe();
}

// ---- Operation checks: ranks that disagree on an operation ----------------------------------

// Runs the op_mismatch scenario with `flag`. The ranks in `involved` must fail that operation
// with errc::mismatch and a message naming the operation and both ranks of a disagreeing pair;
// every rank fails (the mismatch, or the operation after it) and none reads wrong data.
void expect_op_mismatch(const std::string& flag, int nranks, const std::vector<int>& involved,
                        const std::string& op_name, std::vector<std::string> env = {},
                        std::vector<std::vector<std::string>> rank_env = {}) {
  LaunchOptions o;
  o.scenario = "op_mismatch";
  o.nranks = nranks;
  o.args = {flag};
  o.env = {"COCCL_TIMEOUT=20"};
  o.env.insert(o.env.end(), env.begin(), env.end());
  o.rank_env = std::move(rank_env);
  o.deadline = seconds(60);
  const LaunchResult r = launch(o);
  print_errors(r);
  ASSERT_FALSE(r.timed_out) << r.describe();
  for (int rank = 0; rank < nranks; ++rank) {
    const RankResult& x = r.ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(x.exit_code, coccl_exit(errc::mismatch)) << r.describe();
    EXPECT_EQ(x.output.find("FAIL"), std::string::npos) << r.describe();
    EXPECT_EQ(x.output.find("NEXT_RESULT ok"), std::string::npos) << r.describe();
  }
  for (int rank : involved) {
    const RankResult& x = r.ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_NE(x.output.find("OP_RESULT error"), std::string::npos) << r.describe();
    const std::string line = last_error_line(x);
    EXPECT_NE(line.find("operation mismatch between rank"), std::string::npos) << line;
    EXPECT_NE(line.find(op_name), std::string::npos) << line;
  }
}

TEST(OpMismatch, SendOfTwoAgainstReceiveOfOneFailsBothRanks) {
  expect_op_mismatch("send2recv1", 2, {0, 1}, "send_recv");
}

TEST(OpMismatch, SendAndReceiveOfDifferentTypesFailBothRanks) {
  expect_op_mismatch("type", 2, {0, 1}, "send_recv");
}

TEST(OpMismatch, AllToAllvCountsThatDisagreeFailTheRanksOfThatPair) {
  expect_op_mismatch("a2av", 4, {0, 2}, "all_to_allv");
}

// The fast path takes both ranks' all_reduce (links open, the proxy thread never asleep). Over
// tcp (the Asio engine) each header rides in one chunk with its data, and the peer's chunk is
// then of the wrong size; the description still names the operation.
TEST(OpMismatch, AllReduceCountsThatDisagreeOnTheFastPathFailBothRanksOverShm) {
  expect_op_mismatch("count", 2, {0, 1}, "all_reduce",
                     {"COCCL_TRANSPORT=shm", "COCCL_SPIN_US=60000000"});
}

TEST(OpMismatch, AllReduceCountsThatDisagreeOnTheFastPathFailBothRanksOverTcp) {
  expect_op_mismatch("count", 2, {0, 1}, "all_reduce",
                     {"COCCL_TRANSPORT=tcp", "COCCL_TCP_ENGINE=asio", "COCCL_SPIN_US=60000000"});
}

// Four ranks, each a host of its own: the fast path runs recursive doubling, and rank 0's
// header reaches its first partner, rank 1, with the wrong count. Ranks 2 and 3 wait in their
// second round for ranks 1 and 0, which fail: they learn it from the abort notices, on both
// engines.
TEST(OpMismatch, AllReduceCountsThatDisagreeInRecursiveDoublingOnTheFastPathFailEveryRank) {
  const auto hosts = rank_hosts(4, 4, "mismatch-host-");
  for (const char* engine : {"asio", "uring"}) {
    SCOPED_TRACE(engine);
    if (std::string(engine) == "uring" && !transport::uring_unavailable().empty()) continue;
    expect_op_mismatch("count", 4, {0, 1}, "all_reduce",
                       {std::string("COCCL_TCP_ENGINE=") + engine, "COCCL_SPIN_US=60000000"},
                       hosts);
  }
}

TEST(OpMismatch, BroadcastRootsThatDisagreeFailInsteadOfMovingNothing) {
  expect_op_mismatch("root", 3, {0, 2}, "broadcast");
}

TEST(Abort, PeersInsideACollectiveFailPromptly) {
  LaunchOptions o;
  o.scenario = "abort";
  o.nranks = 4;
  o.env = {"COCCL_TIMEOUT=60"};
  // Signal 0 sends nothing: it records when rank 1 announced its abort.
  o.signals = {{1, 0, "aborting", std::chrono::milliseconds(0)}};
  o.deadline = seconds(90);
  const LaunchResult r = launch(o);
  print_errors(r);
  ASSERT_FALSE(r.timed_out) << r.describe();
  ASSERT_TRUE(r.fired[0]) << r.describe();
  EXPECT_EQ(r.ranks[1].exit_code, 0) << r.describe();
  for (int rank : {0, 2, 3}) {
    const RankResult& x = r.ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(x.signal, 0) << r.describe();
    EXPECT_TRUE(x.exit_code == coccl_exit(errc::remote_error) ||
                x.exit_code == coccl_exit(errc::peer_lost) ||
                x.exit_code == coccl_exit(errc::aborted))
        << r.describe();
    // Far below COCCL_TIMEOUT: the abort is announced, not discovered by a deadline.
    EXPECT_LE(r.seconds_after_signal(rank, 0), 5.0) << r.describe();
  }
}

}  // namespace
}  // namespace coccl::test
