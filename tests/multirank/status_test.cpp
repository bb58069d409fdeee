// coccl::query_job, Communicator::status() and tools/coccl-status: a running job says what each
// rank does, and a hung one names the stuck rank.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <coccl/coccl.hpp>
#include <cstdio>
#include <latch>
#include <random>
#include <thread>

#include "collectives/status_codec.hpp"
#include "harness.hpp"
#include "runtime/deadline.hpp"

namespace coccl::test {
namespace {

using namespace std::chrono_literals;

#ifdef COCCL_STATUS_TOOL
// Runs `command`, returning its exit status and output.
std::pair<int, std::string> run_command(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}
#endif

// Ranks of one communicator as threads of this process, parked after `ops` all_reduces until
// release().
class ParkedJob {
 public:
  ParkedJob(const UniqueId& id, int n, int ops) : formed_(n), go_(1) {
    comms_.resize(n);
    for (int r = 0; r < n; ++r)
      threads_.emplace_back([this, id, r, n, ops] {
        try {
          comms_[r] = Communicator::create(id, r, n);
          float x = 1.0f, y = 0.0f;
          for (int i = 0; i < ops; ++i)
            comms_[r].all_reduce(&x, &y, 1, DataType::float32, ReduceOp::sum);
          if (y != static_cast<float>(n)) errors_[r] = "all_reduce gave " + std::to_string(y);
        } catch (const std::exception& e) {
          errors_[r] = e.what();
        }
        formed_.count_down();
        go_.wait();
      });
    formed_.wait();
  }
  ~ParkedJob() {
    go_.count_down();
    for (auto& t : threads_) t.join();
  }
  Communicator& comm(int r) { return comms_[r]; }
  std::string error(int r) const { return errors_.count(r) ? errors_.at(r) : std::string(); }

 private:
  std::latch formed_, go_;
  std::vector<Communicator> comms_;
  std::map<int, std::string> errors_;
  std::vector<std::thread> threads_;
};

TEST(Status, AnIdleJobAnswersForEveryRankWithItsOperations) {
  const UniqueId id = UniqueId::create();
  ParkedJob job(id, 3, 4);
  for (int r = 0; r < 3; ++r) ASSERT_EQ(job.error(r), "") << "rank " << r;

  const CommStatus own = job.comm(1).status();
  EXPECT_EQ(own.rank, 1);
  EXPECT_EQ(own.nranks, 3);
  EXPECT_EQ(own.started, 4u);
  EXPECT_EQ(own.finished, 4u);
  EXPECT_EQ(own.waiting_for, -1);
  ASSERT_EQ(own.trace.size(), 4u);
  for (std::size_t i = 0; i < own.trace.size(); ++i) {
    EXPECT_EQ(own.trace[i].seq, i + 1);
    EXPECT_EQ(own.trace[i].op, "all_reduce");
    EXPECT_EQ(own.trace[i].state, TraceEntry::State::done);
    EXPECT_FALSE(own.trace[i].device);
  }

  const JobStatus all = query_job(id, 2s);
  ASSERT_EQ(all.nranks, 3);
  EXPECT_EQ(all.arrived, 3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(all.ranks[r]) << "rank " << r << ": " << all.why[r];
    EXPECT_EQ(all.ranks[r]->rank, r);
    EXPECT_EQ(all.ranks[r]->finished, 4u);
    EXPECT_EQ(all.ranks[r]->error, "");
  }
  EXPECT_EQ(all.verdict(), "all 3 ranks are idle after operation #4");
}

TEST(Status, AJobThatHasNotFormedNamesTheMissingRank) {
  params::timeout_s.set_override("4");
  const UniqueId id = UniqueId::create();
  std::string error;
  std::thread only([&] {
    try {
      Communicator::create(id, 0, 2);
    } catch (const std::system_error& e) {
      error = e.what();
    }
  });
  // Rank 0's hello reaches the root within a moment; the query then sees 1 of 2.
  JobStatus job;
  for (int i = 0; i < 50 && job.arrived < 1; ++i) {
    std::this_thread::sleep_for(20ms);
    job = query_job(id, 1s);
  }
  only.join();
  params::timeout_s.set_override(std::nullopt);
  EXPECT_EQ(job.nranks, 2);
  EXPECT_EQ(job.arrived, 1);
  EXPECT_EQ(job.why[1], "never reached the bootstrap root");
  EXPECT_NE(job.verdict().find("rank 1 has not reached the bootstrap root"), std::string::npos)
      << job.verdict();
  EXPECT_NE(error, "") << "rank 0 formed a communicator of 2 alone";
}

// Rank 0 never comes: the others give up at COCCL_TIMEOUT and name it, as the root tells them.
TEST(Status, RanksWaitingForTheTableNameTheRankThatNeverCame) {
  params::timeout_s.set_override("2");
  const UniqueId id = UniqueId::create();
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int r = 1; r < 3; ++r)
    ranks.emplace_back([&, r] {
      try {
        Communicator::create(id, r, 3);
      } catch (const std::system_error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  params::timeout_s.set_override(std::nullopt);
  for (int r = 1; r < 3; ++r)
    EXPECT_NE(errors[r].find("rank 0 has not reached the bootstrap root (2 of 3 arrived)"),
              std::string::npos)
        << "rank " << r << ": " << errors[r];
}

TEST(Status, AQueryWithTheWrongSecretLearnsNothing) {
  const UniqueId id = UniqueId::create();
  ParkedJob job(id, 2, 1);
  UniqueId forged = id;
  forged.bytes[5] ^= 0x5a;  // inside the secret (after the 4-byte magic)
  try {
    query_job(forged, 1s);
    ADD_FAILURE() << "a query with the wrong secret got an answer";
  } catch (const std::system_error& e) {
    EXPECT_NE(e.code(), std::error_code()) << e.what();
  }
}

TEST(Status, MalformedAnswersAreRefusedNotTrusted) {
  CommStatus s;
  s.rank = 1;
  s.nranks = 4;
  s.pid = 99;
  s.error = "x";
  s.started = 7;
  s.finished = 6;
  s.running_op = "all_reduce";
  s.waiting_for = 2;
  s.trace.resize(3);
  s.trace[1].device = true;
  s.trace[1].op = "broadcast";
  const auto bytes = detail::encode_status(s);
  const CommStatus back = detail::decode_status(bytes);
  EXPECT_EQ(back.json(), s.json());
  // Every truncation fails cleanly.
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(detail::decode_status(std::span(bytes.data(), n)), std::system_error) << n;
  // A trace count the answer cannot hold is refused before anything is allocated for it.
  auto huge = bytes;
  const std::size_t count_at = bytes.size() - (3 * 38 + 9) - 4;  // entries of 38 bytes + op name
  huge[count_at + 3] = 0x7f;
  EXPECT_THROW(detail::decode_status(huge), std::system_error);
  // A waited-for rank outside the communicator.
  CommStatus wrong = s;
  wrong.waiting_for = 4;
  EXPECT_THROW(detail::decode_status(detail::encode_status(wrong)), std::system_error);
  // Random bytes never crash it.
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    auto junk = bytes;
    junk[rng() % junk.size()] = static_cast<std::uint8_t>(rng());
    try {
      detail::decode_status(junk);
    } catch (const std::system_error&) {
    }
  }
}

// 4 ranks loop on all_reduce; rank 2 is stopped. Asked while the others wait for it, the job names
// rank 2 as not answering and the ranks that wait for it.
TEST(Status, AStoppedRankOfAFourRankJobIsNamed) {
  const UniqueId id = UniqueId::create();
  LaunchOptions o;
  o.scenario = "loop";
  o.nranks = 4;
  o.id_text = id.to_string();
  o.env = {"COCCL_TIMEOUT=6", "COCCL_TRANSPORT=shm"};
  o.signals = {{2, SIGSTOP, "looping", std::chrono::milliseconds(300)}};
  o.reap = {2};
  o.deadline = std::chrono::seconds(60);
  JobStatus seen;
  std::string query_error;
#ifdef COCCL_STATUS_TOOL
  std::string tool_output;
  int tool_exit = -1;
#endif
  double seconds_taken = 0;
  std::thread asker;
  o.after_signal = [&](std::size_t) {
    asker = std::thread([&] {
      // Wait until every survivor is inside the operation rank 2 never joins (asked with a short
      // wait for the silent rank; within COCCL_TIMEOUT, after which they fail): a loaded machine
      // may take longer than any fixed pause to get them there.
      const auto give_up = std::chrono::steady_clock::now() + 4s;
      while (std::chrono::steady_clock::now() < give_up) {
        bool inside = true;
        try {
          const JobStatus early = query_job(id, 300ms);
          inside = early.ranks.size() == 4;
          for (int rank : {0, 1, 3})
            inside = inside && early.ranks[rank] && early.ranks[rank]->running_op == "all_reduce" &&
                     early.ranks[rank]->started == early.ranks[rank]->finished + 1;
        } catch (const std::exception&) {
          inside = false;
        }
        if (inside) break;
        std::this_thread::sleep_for(50ms);
      }
      const auto t0 = std::chrono::steady_clock::now();
      try {
        seen = query_job(id, 1500ms);
      } catch (const std::exception& e) {
        query_error = e.what();
      }
      seconds_taken = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#ifdef COCCL_STATUS_TOOL
      std::tie(tool_exit, tool_output) =
          run_command(std::string(COCCL_STATUS_TOOL) + " --wait 1.5 " + id.to_string());
#endif
    });
  };
  const LaunchResult r = launch(o);
  if (asker.joinable()) asker.join();
  ASSERT_TRUE(r.fired[0]) << r.describe();
  ASSERT_EQ(query_error, "");
  std::printf("query_job answered in %.2f s: %s\n", seconds_taken, seen.verdict().c_str());
  ASSERT_EQ(seen.nranks, 4);
  EXPECT_FALSE(seen.ranks[2]) << "a stopped rank answered";
  int waiting_for_2 = 0;
  for (int rank : {0, 1, 3}) {
    ASSERT_TRUE(seen.ranks[rank]) << "rank " << rank << ": " << seen.why[rank];
    const CommStatus& s = *seen.ranks[rank];
    EXPECT_EQ(s.error, "") << "rank " << rank;
    EXPECT_EQ(s.running_op, "all_reduce") << "rank " << rank;
    EXPECT_EQ(s.started, s.finished + 1) << "rank " << rank;
    if (s.waiting_for == 2) ++waiting_for_2;
  }
  EXPECT_GE(waiting_for_2, 1);
  const std::string v = seen.verdict();
  EXPECT_EQ(v.rfind("rank 2 does not answer", 0), 0u) << v;
  EXPECT_NE(v.find("wait for rank 2 in all_reduce #"), std::string::npos) << v;
#ifdef COCCL_STATUS_TOOL
  std::printf("%s", tool_output.c_str());
  EXPECT_EQ(tool_exit, 1) << tool_output;
  EXPECT_NE(tool_output.find("verdict: rank 2 does not answer"), std::string::npos) << tool_output;
#endif
}

#ifdef COCCL_STATUS_TOOL
TEST(Status, TheToolRefusesBadArgumentsAndAnUnknownJob) {
  auto [code, out] = run_command(std::string(COCCL_STATUS_TOOL) + " --wait -1 abc");
  EXPECT_EQ(code, 2) << out;
  std::tie(code, out) = run_command(std::string(COCCL_STATUS_TOOL) + " not-an-id");
  EXPECT_EQ(code, 2) << out;
  // A well-formed id whose root is gone (port 1 on loopback refuses).
  const UniqueId gone = UniqueId::from_address("127.0.0.1:1", "00112233445566778899aabbccddeeff");
  std::tie(code, out) =
      run_command(std::string(COCCL_STATUS_TOOL) + " --wait 0.3 " + gone.to_string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("bootstrap root"), std::string::npos) << out;
}
#endif

}  // namespace
}  // namespace coccl::test
