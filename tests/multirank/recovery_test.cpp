// Recovery across real processes: shrink after killed ranks, grow with newcomers, and a
// fault-tolerant all_reduce loop (the worker's scenarios are in recovery.cpp).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <coccl/error.hpp>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "tests/multirank/harness.hpp"
#include "tests/multirank/worker.hpp"

namespace coccl::test {
namespace {

using std::chrono::seconds;

int coccl_exit(errc e) { return exit_coccl_error_base + static_cast<int>(e); }

std::string last_error_line(const RankResult& r) {
  auto at = r.output.find("ERROR rank=");
  if (at == std::string::npos) return {};
  return r.output.substr(at, r.output.find('\n', at) - at);
}

// FIFOs through which newcomers get the grow id (one per newcomer, named by its worker rank).
class FifoDir {
 public:
  explicit FifoDir(const std::vector<int>& newcomers) {
    char tmpl[] = "/tmp/coccl-grow-XXXXXX";
    path_ = ::mkdtemp(tmpl);
    for (int r : newcomers) {
      files_.push_back(path_ + "/" + std::to_string(r));
      ::mkfifo(files_.back().c_str(), 0600);
    }
  }
  ~FifoDir() {
    for (const auto& f : files_) ::unlink(f.c_str());
    ::rmdir(path_.c_str());
  }
  std::string flag() const { return "fifo=" + path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

LaunchOptions recovery_launch(const std::string& scenario, int nranks,
                              std::vector<std::string> args) {
  LaunchOptions o;
  o.scenario = scenario;
  o.nranks = nranks;
  o.env = {"COCCL_TIMEOUT=5"};
  o.args = std::move(args);
  o.deadline = seconds(60);
  return o;
}

// Kills `victims` together once the first of them is waiting for it.
void kill_together(LaunchOptions& o, const std::vector<int>& victims, const std::string& marker) {
  for (int v : victims)
    o.signals.push_back({v, SIGKILL, marker, std::chrono::milliseconds(0), victims.front()});
}

void expect_survivors_pass(const LaunchResult& r, const std::vector<int>& victims) {
  ASSERT_FALSE(r.timed_out) << r.describe();
  for (std::size_t rank = 0; rank < r.ranks.size(); ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    if (std::find(victims.begin(), victims.end(), static_cast<int>(rank)) != victims.end())
      EXPECT_EQ(r.ranks[rank].signal, SIGKILL) << r.describe();
    else
      EXPECT_EQ(r.ranks[rank].exit_code, exit_ok) << r.describe();
  }
}

std::string text_of(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(v[i]);
  }
  return s;
}

void shrink_after_killing(const std::vector<int>& victims) {
  LaunchOptions o = recovery_launch("shrink", 4, {"victims=" + text_of(victims)});
  kill_together(o, victims, "doomed");
  expect_survivors_pass(launch(o), victims);
}

TEST(Shrink, AfterRankZeroIsKilledTheOthersAgreeOnItAndGoOnWithoutIt) {
  // Rank 0 is where a healthy communicator's first member would make the new id: the survivors
  // must meet at rank 1.
  shrink_after_killing({0});
}

TEST(Shrink, AfterAMiddleRankIsKilledTheOthersGoOnWithoutIt) { shrink_after_killing({2}); }

TEST(Shrink, AfterTwoRanksAreKilledTheTwoOthersGoOn) { shrink_after_killing({1, 2}); }

TEST(Shrink, DisagreeingExcludeListsFailEverySurvivorWithMismatchNamingTheRanks) {
  const LaunchResult r = launch(recovery_launch("shrink_mismatch", 4, {}));
  ASSERT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.ranks[3].exit_code, exit_ok) << r.describe();
  for (int rank : {0, 1, 2}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(r.ranks[rank].exit_code, coccl_exit(errc::mismatch)) << r.describe();
    EXPECT_NE(last_error_line(r.ranks[rank]).find("rank 2 excludes {1, 3}, rank 0 excludes {3}"),
              std::string::npos)
        << r.describe();
  }
}

TEST(Shrink, ASurvivorThatNeverComesFailsTheOthersWithTimedOutNamingIt) {
  LaunchOptions o = recovery_launch("shrink_absent", 3, {});
  o.env = {"COCCL_TIMEOUT=1"};
  const LaunchResult r = launch(o);
  ASSERT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.ranks[2].exit_code, exit_ok) << r.describe();
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(r.ranks[rank].exit_code, coccl_exit(errc::timed_out)) << r.describe();
    EXPECT_NE(last_error_line(r.ranks[rank]).find("rank 2 did not come to rank 0"),
              std::string::npos)
        << r.describe();
  }
}

TEST(Shrink, AnExcludedRankIsRefusedAndALoneSurvivorGetsACommunicatorOfOne) {
  const LaunchResult r = launch(recovery_launch("shrink_excluded", 2, {}));
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

TEST(Grow, TwoRanksAdmitTwoNewcomersThatTakeRanksTwoAndThree) {
  FifoDir fifos({2, 3});
  const LaunchResult r = launch(recovery_launch("grow", 4, {"world=2", fifos.flag()}));
  EXPECT_TRUE(r.all_passed()) << r.describe();
}

TEST(Grow, ThreeSurvivorsOfAKillAdmitAReplacement) {
  FifoDir fifos({4});
  LaunchOptions o = recovery_launch("grow", 5, {"world=4", "victims=1", fifos.flag()});
  kill_together(o, {1}, "doomed");
  expect_survivors_pass(launch(o), {1});
}

TEST(Ftar, ARankKilledAtARandomStepIsShrunkAwayAndReplacedWithoutLosingAnyResult) {
  std::random_device seed;
  std::mt19937 pick(seed());
  const int victim = std::uniform_int_distribution<int>(0, 3)(pick);
  const int kill_step = std::uniform_int_distribution<int>(1, 8)(pick);
  std::printf("victim rank %d, killed before step %d\n", victim, kill_step);
  FifoDir fifos({4});
  LaunchOptions o = recovery_launch("ftar", 5,
                                    {"world=4", "victim=" + std::to_string(victim),
                                     "kill_step=" + std::to_string(kill_step), fifos.flag()});
  kill_together(o, {victim}, "paused at step " + std::to_string(kill_step));
  expect_survivors_pass(launch(o), {victim});
}

}  // namespace
}  // namespace coccl::test
