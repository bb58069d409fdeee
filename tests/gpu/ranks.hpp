// tests/gpu/ranks.hpp: running a test's rank body on every GPU of the machine, either as one
// process per GPU (this executable run again as `--rank R N ID`) or as one thread per GPU.
#pragma once

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <coccl/coccl.hpp>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/gpu_harness.hpp"

extern char** environ;

namespace coccl::gpu_test {

/// One rank of a test: returns 0 when every check passed.
using RankMain = int (*)(int rank, int n, const std::string& id_hex);

/// Every GPU of the machine, at most 8 (the device collectives' limit).
inline int ranks_here() { return std::min(gpu_count(), 8); }

inline std::string self_exe() {
  char buf[4096];
  const ssize_t k = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  buf[k > 0 ? k : 0] = 0;
  return buf;
}

/// Runs this executable once per rank as `--rank R N ID`; each must exit 0.
inline void expect_rank_processes_pass(int n) {
  const std::string exe = self_exe(), ns = std::to_string(n),
                    hex = coccl::UniqueId::create().to_string();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::string e = exe, rs = std::to_string(r), nn = ns, h = hex;
    std::vector<char*> argv{e.data(), const_cast<char*>("--rank"), rs.data(), nn.data(), h.data(),
                            nullptr};
    pid_t pid;
    ASSERT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), environ), 0);
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
}

/// Runs `body` for every rank on its own thread of this process; each must return 0.
inline void expect_rank_threads_pass(int n, RankMain body) {
  const std::string hex = coccl::UniqueId::create().to_string();
  std::vector<int> rc(n, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) ranks.emplace_back([&, r] { rc[r] = body(r, n, hex); });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(rc[r], 0) << "rank " << r;
}

/// main() of such a test: `--rank R N ID` runs one rank, anything else the tests.
inline int rank_or_tests_main(int argc, char** argv, RankMain body) {
  if (argc == 5 && std::string(argv[1]) == "--rank")
    return body(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace coccl::gpu_test
