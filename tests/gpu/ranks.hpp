// tests/gpu/ranks.hpp: running a test's rank body as processes (this executable run again as
// `--rank R N ID GPUS BODY`) or as threads of this process. Rank r runs on GPU r % GPUS, so n
// ranks may share fewer GPUs (processes sharing a GPU need MPS: see tests/gpu/mps.hpp).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <coccl/coccl.hpp>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/gpu_harness.hpp"

extern char** environ;

/// In a rank body (returns int): a failed CUDA call prints FAIL and the rank returns 1.
#define CHECK_CUDA(call)                                           \
  do {                                                             \
    cudaError_t e_ = (call);                                       \
    if (e_ != cudaSuccess) {                                       \
      std::printf("FAIL %s: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                    \
    }                                                              \
  } while (0)

namespace coccl::gpu_test {

/// One rank of a test: returns 0 when every check passed.
using RankMain = int (*)(int rank, int n, const std::string& id_hex);

/// A rank body and the name rank processes ask for it by.
struct NamedRankMain {
  const char* name;
  RankMain body;
};

/// Every GPU of the machine, at most 8 (the device collectives' limit).
inline int ranks_here() { return std::min(gpu_count(), 8); }

/// How many GPUs the ranks of this process share (0: every GPU of the machine). Set from the
/// command line of a rank process, and around the threads of expect_rank_threads_pass.
inline int& rank_gpus() {
  static int gpus = 0;
  return gpus;
}

/// The GPU of `rank`: the ranks take the GPUs their test gave them in turn (rank r on r % GPUS).
inline int gpu_of(int rank) {
  const int gpus = rank_gpus() > 0 ? rank_gpus() : gpu_count();
  return gpus > 0 ? rank % gpus : 0;
}

inline std::string self_exe() {
  char buf[4096];
  const ssize_t k = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  buf[k > 0 ? k : 0] = 0;
  return buf;
}

/// How expect_rank_processes_pass runs its ranks.
struct RankProcesses {
  /// Rank r runs on GPU r % gpus (0: every GPU of the machine).
  int gpus = 0;
  /// "NAME=value" entries added to the ranks' environment (replacing inherited ones of that name).
  std::vector<std::string> env;
  /// The body to run, by its name given to rank_or_tests_main (empty: the first).
  std::string body;
  /// Ranks still running after this many seconds are killed and reported as hung (0: no limit).
  int deadline_s = 0;
  /// When > 0, the ranks act as hosts of this many ranks each (rank r on host r / ranks_per_host,
  /// through COCCL_HOSTID), so that ranks of different hosts take the network path.
  int ranks_per_host = 0;
};

/// This process's environment with `extra` ("NAME=value") added or replacing entries.
inline std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('=') + 1);
    const bool replaced = std::any_of(extra.begin(), extra.end(), [&](const std::string& x) {
      return x.compare(0, name.size(), name) == 0;
    });
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

/// Runs this executable once per rank as `--rank R N ID GPUS BODY`; each must exit 0.
inline void expect_rank_processes_pass(int n, const RankProcesses& how = {}) {
  const std::string exe = self_exe(), ns = std::to_string(n), gpus = std::to_string(how.gpus),
                    hex = coccl::UniqueId::create().to_string();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> extra = how.env;
    if (how.ranks_per_host > 0)
      extra.push_back("COCCL_HOSTID=test-host-" + std::to_string(r / how.ranks_per_host));
    std::vector<std::string> env = environment_with(extra);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string e = exe, rs = std::to_string(r), nn = ns, h = hex, g = gpus, body = how.body;
    std::vector<char*> argv{e.data(),    const_cast<char*>("--rank"),
                            rs.data(),   nn.data(),
                            h.data(),    g.data(),
                            body.data(), nullptr};
    pid_t pid;
    const int rc = posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), envp.data());
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn of rank " << r << " failed: " << rc;
      for (pid_t started : pids) ::kill(started, SIGKILL);
      for (pid_t started : pids) waitpid(started, nullptr, 0);
      return;
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(how.deadline_s);
  std::vector<bool> done(n, false);
  for (int left = n; left > 0;) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int status = 0;
      const pid_t w = waitpid(pids[r], &status, how.deadline_s > 0 ? WNOHANG : 0);
      if (w == 0) continue;
      done[r] = true;
      --left;
      EXPECT_TRUE(w == pids[r] && WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "rank " << r << ": "
          << (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                  : "exit status " + std::to_string(WEXITSTATUS(status)));
    }
    if (left == 0) break;
    if (how.deadline_s > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (done[r]) continue;
        ::kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        ADD_FAILURE() << "rank " << r << " still running after " << how.deadline_s << " s: killed";
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// Runs `body` for every rank on its own thread of this process, rank r on GPU r % gpus (0:
/// every GPU); each must return 0.
inline void expect_rank_threads_pass(int n, RankMain body, int gpus = 0) {
  const std::string hex = coccl::UniqueId::create().to_string();
  rank_gpus() = gpus;
  std::vector<int> rc(n, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) ranks.emplace_back([&, r] { rc[r] = body(r, n, hex); });
  for (auto& t : ranks) t.join();
  rank_gpus() = 0;
  for (int r = 0; r < n; ++r) EXPECT_EQ(rc[r], 0) << "rank " << r;
}

/// main() of such a test: `--rank R N ID [GPUS [BODY]]` runs one rank with the body named BODY
/// (the first when empty or absent), anything else the tests.
inline int rank_or_tests_main(int argc, char** argv, const std::vector<NamedRankMain>& bodies) {
  if (argc >= 5 && std::string(argv[1]) == "--rank") {
    rank_gpus() = argc > 5 ? std::atoi(argv[5]) : 0;
    const std::string want = argc > 6 ? argv[6] : "";
    for (const NamedRankMain& b : bodies)
      if (want.empty() || want == b.name)
        return b.body(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
    std::fprintf(stderr, "no rank body named '%s'\n", want.c_str());
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

inline int rank_or_tests_main(int argc, char** argv, RankMain body) {
  return rank_or_tests_main(argc, argv, {NamedRankMain{"", body}});
}

}  // namespace coccl::gpu_test
