#include "tests/multirank/harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <coccl/unique_id.hpp>
#include <cstring>
#include <stdexcept>
#include <system_error>

extern char** environ;

namespace coccl::test {
namespace {

[[noreturn]] void fail_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

std::vector<std::string> merged_environment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  auto key_of = [](const std::string& kv) { return kv.substr(0, kv.find('=')); };
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    bool replaced = std::any_of(extra.begin(), extra.end(),
                                [&](const std::string& x) { return key_of(x) == key_of(kv); });
    if (!replaced) env.push_back(std::move(kv));
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// The launch's entries, then rank r's own.
std::vector<std::string> entries_of(const LaunchOptions& o, int r) {
  std::vector<std::string> out;
  for (const std::string& kv : o.env) {
    const std::string key = kv.substr(0, kv.find('='));
    const bool overridden =
        r < static_cast<int>(o.rank_env.size()) &&
        std::any_of(o.rank_env[r].begin(), o.rank_env[r].end(),
                    [&](const std::string& x) { return x.substr(0, x.find('=')) == key; });
    if (!overridden) out.push_back(kv);
  }
  if (r < static_cast<int>(o.rank_env.size()))
    out.insert(out.end(), o.rank_env[r].begin(), o.rank_env[r].end());
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

struct Child {
  pid_t pid = -1;
  int out_fd = -1;  // read end of the stdout/stderr pipe; -1 once at EOF
  bool exited = false;
};

}  // namespace

bool LaunchResult::all_passed() const {
  if (timed_out) return false;
  return std::all_of(ranks.begin(), ranks.end(),
                     [](const RankResult& r) { return r.signal == 0 && r.exit_code == 0; });
}

std::string LaunchResult::describe() const {
  std::string s = timed_out ? "DEADLINE PASSED, workers killed\n" : "";
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& x = ranks[r];
    s += "---- rank " + std::to_string(r) + ": ";
    s += x.signal ? "signal " + std::to_string(x.signal) + " (" + strsignal(x.signal) + ")"
                  : "exit " + std::to_string(x.exit_code);
    s += ", " + std::to_string(std::chrono::duration<double>(x.ended - started).count()) + " s\n";
    // Keep failure reports readable when a worker prints thousands of mismatches.
    s += x.output.size() > 8000 ? x.output.substr(0, 4000) + "\n[... truncated ...]\n" +
                                      x.output.substr(x.output.size() - 4000)
                                : x.output;
  }
  return s;
}

double LaunchResult::seconds_after_signal(int rank, std::size_t action) const {
  return std::chrono::duration<double>(ranks.at(rank).ended - signalled.at(action)).count();
}

LaunchResult launch(const LaunchOptions& o) {
  const std::string hex = o.id_text.empty() ? UniqueId::create().to_string() : o.id_text;

  LaunchResult result;
  result.ranks.resize(o.nranks);
  result.signalled.assign(o.signals.size(), Clock::time_point{});
  result.fired.assign(o.signals.size(), false);
  std::vector<Clock::time_point> armed(o.signals.size(), Clock::time_point::max());
  std::vector<Child> kids(o.nranks);
  result.started = Clock::now();

  for (int r = 0; r < o.nranks; ++r) {
    int fds[2];
    // Close-on-exec, so no worker inherits another's pipe and delays its EOF.
    if (pipe2(fds, O_CLOEXEC) != 0) fail_errno("pipe2");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    std::vector<std::string> args{COCCL_WORKER, o.scenario, std::to_string(r),
                                  std::to_string(o.nranks), hex};
    args.insert(args.end(), o.args.begin(), o.args.end());
    std::vector<char*> argv = c_strings(args);
    std::vector<std::string> env = merged_environment(entries_of(o, r));
    std::vector<char*> envp = c_strings(env);
    pid_t pid;
    int rc = posix_spawn(&pid, COCCL_WORKER, &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
      errno = rc;
      fail_errno("posix_spawn " COCCL_WORKER);
    }
    kids[r].pid = pid;
    kids[r].out_fd = fds[0];
  }
  for (std::size_t a = 0; a < o.signals.size(); ++a)
    if (o.signals[a].marker.empty()) armed[a] = result.started + o.signals[a].delay;

  const auto deadline = result.started + o.deadline;
  auto running = [&] {
    return std::any_of(kids.begin(), kids.end(),
                       [](const Child& c) { return !c.exited || c.out_fd >= 0; });
  };
  bool reaped = false;
  while (running()) {
    std::vector<pollfd> pfds;
    std::vector<int> which;
    for (int r = 0; r < o.nranks; ++r)
      if (kids[r].out_fd >= 0) {
        pfds.push_back({kids[r].out_fd, POLLIN, 0});
        which.push_back(r);
      }
    // Short timeout: exits, armed signals and the deadline are checked between polls.
    ::poll(pfds.data(), pfds.size(), 20);
    for (std::size_t i = 0; i < pfds.size(); ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t got = ::read(pfds[i].fd, buf, sizeof buf);
      int r = which[i];
      if (got > 0) {
        result.ranks[r].output.append(buf, static_cast<std::size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(kids[r].out_fd);
        kids[r].out_fd = -1;
      }
    }
    const auto now = Clock::now();
    for (int r = 0; r < o.nranks; ++r) {
      if (kids[r].exited) continue;
      int status = 0;
      if (waitpid(kids[r].pid, &status, WNOHANG) == kids[r].pid) {
        kids[r].exited = true;
        result.ranks[r].ended = now;
        if (WIFSIGNALED(status))
          result.ranks[r].signal = WTERMSIG(status);
        else
          result.ranks[r].exit_code = WEXITSTATUS(status);
      }
    }
    for (std::size_t a = 0; a < o.signals.size(); ++a) {
      const auto& s = o.signals[a];
      if (result.fired[a]) continue;
      if (armed[a] == Clock::time_point::max() &&
          result.ranks[s.watch >= 0 ? s.watch : s.rank].output.find(s.marker) != std::string::npos)
        armed[a] = now + s.delay;
      if (now >= armed[a] && !kids[s.rank].exited) {
        ::kill(kids[s.rank].pid, s.signal);
        result.fired[a] = true;
        result.signalled[a] = Clock::now();
        if (o.after_signal) o.after_signal(a);
      }
    }
    if (!reaped && !o.reap.empty()) {
      bool others_done = true;
      for (int r = 0; r < o.nranks; ++r)
        if (std::find(o.reap.begin(), o.reap.end(), r) == o.reap.end() && !kids[r].exited)
          others_done = false;
      if (others_done) {
        for (int r : o.reap)
          if (!kids[r].exited) {
            ::kill(kids[r].pid, SIGKILL);
            ::kill(kids[r].pid, SIGCONT);
          }
        reaped = true;
      }
    }
    if (now >= deadline) {
      result.timed_out = true;
      for (auto& k : kids)
        if (!k.exited) {
          ::kill(k.pid, SIGKILL);
          ::kill(k.pid, SIGCONT);
        }
      for (int r = 0; r < o.nranks; ++r) {
        if (!kids[r].exited) {
          int status = 0;
          waitpid(kids[r].pid, &status, 0);
          kids[r].exited = true;
          result.ranks[r].ended = Clock::now();
          result.ranks[r].signal = SIGKILL;
        }
        if (kids[r].out_fd >= 0) {
          close(kids[r].out_fd);
          kids[r].out_fd = -1;
        }
      }
    }
  }
  for (std::size_t a = 0; a < o.signals.size(); ++a)
    if (!result.fired[a]) result.signalled[a] = result.started;
  return result;
}

LaunchResult launch(const std::string& scenario, int nranks, std::vector<std::string> env,
                    std::vector<std::string> args, std::chrono::seconds deadline) {
  LaunchOptions o;
  o.scenario = scenario;
  o.nranks = nranks;
  o.env = std::move(env);
  o.args = std::move(args);
  o.deadline = deadline;
  return launch(o);
}

std::vector<std::vector<std::string>> rank_hosts(int nranks, int hosts, const std::string& prefix) {
  std::vector<std::vector<std::string>> env;
  for (int r = 0; r < nranks; ++r)
    env.push_back({"COCCL_HOSTID=" + prefix + std::to_string(r * hosts / nranks)});
  return env;
}

}  // namespace coccl::test
