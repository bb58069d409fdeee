// Faults at random moments: a random rank of a 4-rank job (on one host, or each rank a host of its
// own) is killed (SIGKILL) or stopped (SIGSTOP) at a random time after launch, which lands in
// bootstrap, in link setup or in the middle of a collective. Every trial is classified; the test
// fails on any crash, wrong result, hang beyond COCCL_TIMEOUT, or survivor that does not name the
// victim. COCCL_CHAOS_TRIALS sets the number of trials of each kind: 50 by default, as in
// docs/reliability.md (the sanitizer stage of CI runs fewer). COCCL_CHAOS_PARALLEL jobs run side by
// side (4 by default): a stopped rank's survivors spend most of a trial idle until COCCL_TIMEOUT,
// so one at a time left the cores idle for most of three minutes.
#include <gtest/gtest.h>

#include <algorithm>
#include <coccl/error.hpp>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "tests/multirank/worker.hpp"

namespace coccl::test {
namespace {

constexpr int ranks = 4;
constexpr double timeout_s = 3;
// Scheduling slack on a loaded 2-core machine (the sanitizer build runs beside other tests).
constexpr double slack_s = 6;

int env_count(const char* name, int fallback) {
  const char* t = std::getenv(name);
  const int n = t ? std::atoi(t) : fallback;
  return n > 0 ? n : fallback;
}

std::string last_error(const RankResult& r) {
  auto at = r.output.find("LAST_ERROR ");
  if (at == std::string::npos) return {};
  return r.output.substr(at, r.output.find('\n', at) - at);
}

// What happened to the survivors of one trial: "" when every rule held, else the broken rule.
std::string judge(const LaunchResult& r, int victim, int signal) {
  if (r.timed_out) return "hang: the launch deadline passed";
  if (!r.fired[0]) return "the signal never fired";
  const std::string name = "rank " + std::to_string(victim);
  for (int k = 0; k < ranks; ++k) {
    if (k == victim) continue;
    const RankResult& x = r.ranks[k];
    const std::string who = "rank " + std::to_string(k) + ": ";
    if (x.signal != 0) return who + "crash (signal " + std::to_string(x.signal) + ")";
    if (x.output.find("WRONG RESULT") != std::string::npos) return who + "wrong result";
    const int code = x.exit_code - exit_coccl_error_base;
    if (code != static_cast<int>(errc::peer_lost) && code != static_cast<int>(errc::remote_error) &&
        code != static_cast<int>(errc::timed_out))
      return who + "unexpected exit " + std::to_string(x.exit_code);
    if (r.seconds_after_signal(k, 0) > timeout_s + slack_s)
      return who + "hang: failed " + std::to_string(r.seconds_after_signal(k, 0)) +
             " s after the signal";
    const std::string why = last_error(x);
    // A stopped rank holds its links open: survivors may only see no progress from a neighbour
    // that waits for it in turn, so they must name it or have timed out waiting.
    if (why.find(name) == std::string::npos &&
        !(signal == SIGSTOP && why.find("no progress") != std::string::npos &&
          why.find("rank") != std::string::npos))
      return who + "does not name " + name + ": " + why;
  }
  return {};
}

struct Trial {
  int victim = 0;
  int delay_ms = 0;
};

// The broken rule ("" when none) and, if one broke, the launch's report.
struct Outcome {
  std::string verdict;
  std::string report;
};

// `hosts`: every rank acts as a host of its own (COCCL_HOSTID), so links are tcp and small
// all_reduce runs recursive doubling, on the fast path where it can.
Outcome run_trial(const Trial& t, int signal, bool hosts) {
  LaunchOptions o;
  o.scenario = "chaos";
  o.nranks = ranks;
  o.args = {"cold"};
  o.env = {"COCCL_TIMEOUT=3"};
  if (hosts) o.rank_env = rank_hosts(ranks, ranks, "chaos-");
  o.signals = {{t.victim, signal, "", std::chrono::milliseconds(t.delay_ms)}};
  if (signal == SIGSTOP) o.reap = {t.victim};
  o.deadline = std::chrono::seconds(60);
  const LaunchResult r = launch(o);
  Outcome out{judge(r, t.victim, signal), {}};
  if (!out.verdict.empty()) out.report = r.describe();
  return out;
}

void run_trials(int signal, bool hosts = false) {
  const int n = env_count("COCCL_CHAOS_TRIALS", 50);
  const int jobs = env_count("COCCL_CHAOS_PARALLEL", 4);
  // The trials are drawn up front, so a seed gives the same victims and moments however many
  // run side by side.
  std::mt19937 rng(static_cast<unsigned>(signal) * 7919u + static_cast<unsigned>(n));
  std::vector<Trial> plan(n);
  for (int t = 0; t < n; ++t) {
    plan[t].victim = static_cast<int>(rng() % ranks);
    // 0-600 ms after launch: process start and bootstrap take ~50-150 ms here, links are made by
    // the first operations, and the loop runs after that.
    // Every third trial lands in the first 150 ms: process start and bootstrap.
    plan[t].delay_ms = static_cast<int>(rng() % (t % 3 == 0 ? 150 : 600));
  }
  int bad = 0;
  for (int first = 0; first < n; first += jobs) {
    const int last = std::min(n, first + jobs);
    std::vector<std::future<Outcome>> outcomes;
    for (int t = first; t < last; ++t)
      outcomes.push_back(
          std::async(std::launch::async, run_trial, std::cref(plan[t]), signal, hosts));
    for (int t = first; t < last; ++t) {
      const Outcome o = outcomes[t - first].get();
      const std::string& verdict = o.verdict;
      std::printf("trial %2d: %s rank %d at %3d ms: %s\n", t,
                  signal == SIGKILL ? "SIGKILL" : "SIGSTOP", plan[t].victim, plan[t].delay_ms,
                  verdict.empty() ? "survivors failed naming it" : verdict.c_str());
      if (!verdict.empty()) {
        ++bad;
        ADD_FAILURE() << "trial " << t << ": " << verdict << "\n" << o.report;
      }
    }
  }
  std::printf("%d trials (%d side by side), %d broke a rule\n", n, jobs, bad);
}

TEST(Chaos, ARankKilledAtARandomMomentIsNamedByEverySurvivor) { run_trials(SIGKILL); }

TEST(Chaos, ARankStoppedAtARandomMomentIsNamedByEverySurvivor) { run_trials(SIGSTOP); }

TEST(Chaos, ARankKilledAtARandomMomentAmongRanksActingAsHostsIsNamedByEverySurvivor) {
  run_trials(SIGKILL, true);
}

}  // namespace
}  // namespace coccl::test
