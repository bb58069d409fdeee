// Specification of the ib transport across real processes, run inside the Soft-RoCE guest (see
// run_guest.sh): every collective over COCCL_TRANSPORT=ib with 2, 3 and 4 ranks against the
// multirank reference, the split of puts over several queue pairs, small rings, a rank killed
// in the middle of an operation, and COCCL_TRANSPORT=auto taking ib across emulated hosts. Each
// test launches one coccl_worker per rank (tests/multirank).
#include <gtest/gtest.h>

#include <coccl/error.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/multirank/harness.hpp"
#include "tests/multirank/worker.hpp"

namespace coccl::test {
namespace {

using std::chrono::seconds;

// Emulated: generous, so a hang shows up as timed_out rather than as the harness deadline.
const std::string ib = "COCCL_TRANSPORT=ib";
const std::string timeout = "COCCL_TIMEOUT=120";

LaunchResult run(const std::string& scenario, int nranks, std::vector<std::string> env,
                 std::vector<std::string> args = {}) {
  env.push_back(ib);
  env.push_back(timeout);
  return launch(scenario, nranks, std::move(env), std::move(args), seconds(300));
}

bool every_link_is_ib(const LaunchResult& r) {
  // COCCL_DEBUG=INFO makes each rank log "connected to rank N over <kind>".
  for (const RankResult& x : r.ranks)
    if (x.output.find(" over ib") == std::string::npos ||
        x.output.find(" over tcp") != std::string::npos ||
        x.output.find(" over shm") != std::string::npos)
      return false;
  return true;
}

class EveryCollectiveOverIb : public ::testing::TestWithParam<int> {};

TEST_P(EveryCollectiveOverIb, MatchesTheReference) {
  const LaunchResult r =
      run("every_collective", GetParam(), {"COCCL_DEBUG=INFO", "COCCL_DEBUG_SUBSYS=NET"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
  EXPECT_TRUE(every_link_is_ib(r)) << r.describe();
}

// Two ranks: every collective over one ib link. Several peers on one completion queue come in
// AutoTransport below (each rank has two ib peers, on the other host), and rank counts that are
// not powers of two run every algorithm over shm and tcp in the multi-rank tests, which the
// transport does not change. Under the guest's emulation the three-rank run took 24 s and the
// four-rank one 41 s of the test's 188 s.
INSTANTIATE_TEST_SUITE_P(Ranks, EveryCollectiveOverIb, ::testing::Values(2),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// Two hosts of two ranks (COCCL_HOSTID) with COCCL_TRANSPORT=auto: ib between the hosts (the
// guest's rxe device is usable), shm inside each, and every collective right.
TEST(AutoTransport, TakesIbAcrossHostsAndShmWithin) {
  LaunchOptions o;
  o.scenario = "every_collective";
  o.nranks = 4;
  // Small sizes only: what is tested here is the choice of transport and two ib peers on one
  // completion queue; large messages over ib run in EveryCollectiveOverIb (with them this test
  // took 40 s of the guest's 145).
  o.args = {"nolarge"};
  // No zero-copy blocks: the scenario's registered-buffer counters expect them on every link or
  // on none (COCCL_TRANSPORT=ib or not), and here only the links across hosts are ib.
  o.env = {"COCCL_TRANSPORT=auto", timeout, "COCCL_DEBUG=INFO", "COCCL_DEBUG_SUBSYS=NET",
           "COCCL_IB_ZCOPY_MIN=1073741824"};
  for (const char* h : {"a", "a", "b", "b"})
    o.rank_env.push_back({std::string("COCCL_HOSTID=") + h});
  o.deadline = seconds(300);
  const LaunchResult r = launch(o);
  EXPECT_TRUE(r.all_passed()) << r.describe();
  int ib_links = 0, shm_links = 0, tcp_links = 0;
  for (const RankResult& x : r.ranks) {
    for (const auto& [kind, count] :
         {std::pair{" over ib", &ib_links}, {" over shm", &shm_links}, {" over tcp", &tcp_links}})
      for (auto at = x.output.find(kind); at != std::string::npos; at = x.output.find(kind, at + 1))
        ++*count;
  }
  EXPECT_EQ(ib_links, 4 * 2) << r.describe();  // each rank reports its 2 links to the other host
  EXPECT_EQ(shm_links, 4 * 1) << r.describe();
  EXPECT_EQ(tcp_links, 0) << r.describe();
}

TEST(IbQueuePairs, PutsSplitOverFourQueuePairsArriveInOrder) {
  // 4 KiB pieces: every put of a large all_reduce is split over all four queue pairs.
  const LaunchResult r =
      run("all_reduce", 3, {"COCCL_IB_QPS_PER_PEER=4", "COCCL_IB_SPLIT_BYTES=4096"}, {"quick"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

TEST(IbQueuePairs, OneQueuePairAndTwoSmallSlotsKeepCreditsFlowing) {
  // Every large message becomes hundreds of 16 KiB puts, each waiting for a credit.
  const LaunchResult r =
      run("all_reduce", 3, {"COCCL_IB_QPS_PER_PEER=1", "COCCL_SLOTS=2", "COCCL_SLOT_BYTES=16384"},
          {"quick"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

// Zero-copy of registered buffers: the worker checks every result and that zero_copy_bytes()
// equals the bytes it sent between registered buffers from COCCL_IB_ZCOPY_MIN up (none when only
// one side registered), then deregisters and checks that nothing more goes zero-copy.
struct RegCase {
  const char* mode;
  int nranks;
};

void PrintTo(const RegCase& c, std::ostream* os) { *os << c.mode << " " << c.nranks; }

class RegisteredBuffersOverIb : public ::testing::TestWithParam<RegCase> {};

TEST_P(RegisteredBuffersOverIb, MoveZeroCopyOnlyWhenBothSidesRegistered) {
  const LaunchResult r =
      run("registered", GetParam().nranks, {}, {std::string("reg=") + GetParam().mode});
  EXPECT_TRUE(r.all_passed()) << r.describe();
  for (const RankResult& x : r.ranks)
    EXPECT_NE(x.output.find("ZERO_COPY_BYTES"), std::string::npos) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Modes, RegisteredBuffersOverIb,
                         // One side registered: two ranks suffice (8 s each at three).
                         ::testing::Values(RegCase{"both", 2}, RegCase{"both", 3},
                                           RegCase{"send", 2}, RegCase{"recv", 2},
                                           RegCase{"none", 2}),
                         [](const auto& info) {
                           return std::string(info.param.mode) + "_" +
                                  std::to_string(info.param.nranks) + "ranks";
                         });

TEST(RegisteredBuffersOverIb, RingAllReduceGathersZeroCopy) {
  const LaunchResult r = run("registered", 3, {"COCCL_ALGO=ring"}, {"reg=both"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

TEST(RegisteredBuffersOverIb, OneQueuePairAndALowThresholdStillMatch) {
  const LaunchResult r = run("registered", 3,
                             {"COCCL_IB_QPS_PER_PEER=1", "COCCL_IB_ZCOPY_MIN=4096", "COCCL_SLOTS=2",
                              "COCCL_SLOT_BYTES=16384"},
                             {"reg=both"});
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

int coccl_exit(errc e) { return exit_coccl_error_base + static_cast<int>(e); }

std::string last_error_line(const RankResult& r) {
  auto at = r.output.find("LAST_ERROR ");
  if (at == std::string::npos) return {};
  return r.output.substr(at, r.output.find('\n', at) - at);
}

class IbFaults : public ::testing::TestWithParam<const char*> {};

// Plain: all_reduce through the rings; zcopy: all_to_all between registered buffers.
TEST_P(IbFaults, KilledRankFailsEverySurvivorNamingIt) {
  LaunchOptions o;
  o.scenario = "loop";
  o.nranks = 4;
  o.env = {ib, "COCCL_TIMEOUT=30"};
  if (std::string(GetParam()) == "zcopy") o.args = {"zcopy"};
  o.signals = {{2, SIGKILL, "looping", std::chrono::milliseconds(500)}};
  o.deadline = seconds(240);
  const LaunchResult r = launch(o);
  ASSERT_FALSE(r.timed_out) << r.describe();
  ASSERT_TRUE(r.fired[0]) << r.describe();
  EXPECT_EQ(r.ranks[2].signal, SIGKILL) << r.describe();
  for (int rank : {0, 1, 3}) {
    const RankResult& x = r.ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank));
    std::printf("rank %d: exit %d, %s\n", rank, x.exit_code, last_error_line(x).c_str());
    EXPECT_EQ(x.signal, 0) << r.describe();
    EXPECT_TRUE(x.exit_code == coccl_exit(errc::peer_lost) ||
                x.exit_code == coccl_exit(errc::remote_error))
        << r.describe();
    EXPECT_NE(last_error_line(x).find("rank 2"), std::string::npos) << r.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Transfers, IbFaults, ::testing::Values("rings", "zcopy"),
                         [](const auto& info) { return std::string(info.param); });

TEST(IbBlockMismatch, AnOfferOfAnotherOperationFailsWithMismatch) {
  LaunchOptions o;
  o.scenario = "mismatch";
  o.nranks = 3;
  o.env = {ib, "COCCL_TIMEOUT=30"};
  o.args = {"blocks"};
  o.deadline = seconds(120);
  const LaunchResult r = launch(o);
  ASSERT_FALSE(r.timed_out) << r.describe();
  bool seen = false;
  for (const RankResult& x : r.ranks) {
    EXPECT_EQ(x.signal, 0) << r.describe();
    EXPECT_TRUE(x.exit_code == coccl_exit(errc::mismatch) ||
                x.exit_code == coccl_exit(errc::remote_error) ||
                x.exit_code == coccl_exit(errc::peer_lost))
        << r.describe();
    if (x.exit_code == coccl_exit(errc::mismatch)) {
      seen = true;
      // Either check may see it first: the ib block offer or the op_check header exchange.
      const std::string line = last_error_line(x);
      EXPECT_TRUE(line.find("offered to receive") != std::string::npos ||
                  line.find("operation mismatch") != std::string::npos)
          << r.describe();
    }
  }
  EXPECT_TRUE(seen) << r.describe();
}

}  // namespace
}  // namespace coccl::test
