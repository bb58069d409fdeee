// tests/multirank/harness.hpp: launches one coccl_worker process per rank of a real communicator.
//
// The test process creates the UniqueId (so the bootstrap root runs inside it), spawns the workers
// with the id's hex text, collects their merged stdout/stderr through pipes and waits for all of
// them under one deadline. Fault tests can have the harness signal a rank once it prints a marker
// line, and name ranks that are expected never to exit on their own (a stopped rank).
#pragma once

#include <chrono>
#include <csignal>
#include <functional>
#include <string>
#include <vector>

namespace coccl::test {

using Clock = std::chrono::steady_clock;

/// A signal the harness sends to one rank, once: `delay` after that rank's output contains
/// `marker` (or `delay` after launch when `marker` is empty).
struct SignalAction {
  int rank = 0;
  int signal = SIGKILL;
  std::string marker;
  std::chrono::milliseconds delay{0};
  /// The rank whose output holds the marker; -1 for `rank` itself. Actions watching one marker
  /// fire together (killing several ranks at once).
  int watch = -1;
};

struct LaunchOptions {
  std::string scenario;
  int nranks = 2;
  /// What the workers get in place of a UniqueId's text: "env" makes them call
  /// Communicator::from_env(). Empty: the harness creates a UniqueId (its root runs here).
  std::string id_text;
  /// Extra arguments after the id, the same for every rank.
  std::vector<std::string> args;
  /// "NAME=value" entries added to (or replacing in) the workers' environment.
  std::vector<std::string> env;
  /// More such entries for rank i at index i (after `env`, so they win), e.g. COCCL_HOSTID to
  /// make ranks of this machine act as hosts.
  std::vector<std::vector<std::string>> rank_env;
  /// Every worker is killed and the launch reported as timed out after this long.
  std::chrono::seconds deadline{150};
  std::vector<SignalAction> signals;
  /// Ranks that will not exit by themselves (stopped ones): once every other rank has exited
  /// they get SIGKILL (and SIGCONT, so a stopped one dies at once).
  std::vector<int> reap;
  /// Called on the harness's thread right after SignalAction `a` fired; it must not block (start
  /// a thread for slow work).
  std::function<void(std::size_t a)> after_signal;
};

struct RankResult {
  int exit_code = -1;  // -1 if it was ended by a signal
  int signal = 0;      // the terminating signal, 0 if it exited
  std::string output;  // stdout and stderr, interleaved
  Clock::time_point ended;
};

struct LaunchResult {
  std::vector<RankResult> ranks;
  bool timed_out = false;
  Clock::time_point started;
  /// When each SignalAction fired (index as in LaunchOptions::signals); started if it never did.
  std::vector<Clock::time_point> signalled;
  std::vector<bool> fired;

  /// True if every rank exited with code 0 and the deadline was kept.
  bool all_passed() const;
  /// Every rank's status and output, for failure messages.
  std::string describe() const;
  double seconds_after_signal(int rank, std::size_t action) const;
};

/// Creates a UniqueId in this process (unless `id_text` is given) and runs the scenario on
/// `nranks` worker processes.
LaunchResult launch(const LaunchOptions& options);
/// launch() of `scenario` on `nranks` workers with only the environment, arguments and deadline
/// set.
LaunchResult launch(const std::string& scenario, int nranks, std::vector<std::string> env,
                    std::vector<std::string> args, std::chrono::seconds deadline);

/// LaunchOptions::rank_env that makes `nranks` ranks act as `hosts` hosts: rank r gets
/// COCCL_HOSTID=`prefix`h with h = r * hosts / nranks (as coccl-perf --hosts places them), so
/// ranks of different hosts take the network path. hosts == nranks: each rank a host of its own.
std::vector<std::vector<std::string>> rank_hosts(int nranks, int hosts, const std::string& prefix);

}  // namespace coccl::test
