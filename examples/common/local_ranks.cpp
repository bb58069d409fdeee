// examples/common/local_ranks.cpp
#include "local_ranks.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace example {
namespace {

constexpr const char* id_var = "COCCL_EXAMPLE_ID";
constexpr const char* rank_var = "COCCL_EXAMPLE_RANK";
constexpr const char* nranks_var = "COCCL_EXAMPLE_NRANKS";

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<std::size_t>(n));
}

bool under_launcher() {
  return std::getenv("RANK") || std::getenv("OMPI_COMM_WORLD_RANK") || std::getenv("PMIX_RANK") ||
         std::getenv("SLURM_PROCID");
}

}  // namespace

coccl::Communicator join() {
  if (const char* id = std::getenv(id_var)) {
    const char* rank = std::getenv(rank_var);
    const char* n = std::getenv(nranks_var);
    if (!rank || !n) {
      std::fprintf(stderr, "%s is set without %s and %s\n", id_var, rank_var, nranks_var);
      std::exit(2);
    }
    return coccl::Communicator::create(coccl::UniqueId::from_string(id), std::atoi(rank),
                                       std::atoi(n));
  }
  if (under_launcher()) return coccl::Communicator::from_env();
  return {};
}

int run_local_ranks(char** argv, int n) {
  const std::string exe = self_exe();
  if (exe.empty()) {
    std::perror("readlink /proc/self/exe");
    return 1;
  }
  const coccl::UniqueId id = coccl::UniqueId::create();
  std::vector<char*> args{const_cast<char*>(exe.c_str())};
  for (char** a = argv + 1; *a; ++a) args.push_back(*a);
  args.push_back(nullptr);

  std::vector<pid_t> pids(static_cast<std::size_t>(n), -1);
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    env.push_back(std::string(id_var) + "=" + id.to_string());
    env.push_back(std::string(rank_var) + "=" + std::to_string(r));
    env.push_back(std::string(nranks_var) + "=" + std::to_string(n));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    if (const int rc =
            posix_spawn(&pids[r], exe.c_str(), nullptr, nullptr, args.data(), envp.data())) {
      std::fprintf(stderr, "cannot start rank %d: %s\n", r, std::strerror(rc));
      // The ranks already started fail within COCCL_TIMEOUT waiting for this one.
      pids[r] = -1;
    }
  }
  int status = 0;
  for (int r = 0; r < n; ++r) {
    int rc = 1;
    int ws = 0;
    if (pids[r] > 0 && ::waitpid(pids[r], &ws, 0) == pids[r]) {
      if (WIFEXITED(ws)) {
        rc = WEXITSTATUS(ws);
        if (rc != 0) std::fprintf(stderr, "rank %d exited with %d\n", r, rc);
      } else {
        rc = 128 + WTERMSIG(ws);
        std::fprintf(stderr, "rank %d was killed by signal %d\n", r, WTERMSIG(ws));
      }
    }
    if (rc != 0 && status == 0) status = rc;
  }
  return status;
}

}  // namespace example
