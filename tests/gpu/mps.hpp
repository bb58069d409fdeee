// tests/gpu/mps.hpp: the CUDA Multi-Process Service (MPS) for tests that put several rank
// processes on one GPU.
//
// Why MPS: a device collective's kernel spins on the GPU until its peers' kernels have arrived.
// Without MPS, kernels of different processes never run on a GPU at the same time: the GPU
// time-slices between the processes' contexts, so every wait for a peer lasts until the next
// context switch and each operation takes 2-5 ms. Under MPS the processes are clients of one
// server and their kernels run side by side, as the kernels of one process do.
//
// A process becomes an MPS client when CUDA is initialised in it while the control daemon runs, so
// a test makes its Mps before it starts the rank processes, and the test process itself creates
// no CUDA context before that (cudaGetDeviceCount is fine: it creates none).
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace coccl::gpu_test {

/// Starts the MPS control daemon for the lifetime of the object when none runs and the program is
/// on PATH; stops on destruction only a daemon it started. Not thread-safe; one at a time.
class Mps {
 public:
  Mps() {
    control_ = on_path("nvidia-cuda-mps-control");
    if (control_.empty()) {
      why_ = "nvidia-cuda-mps-control is not on PATH";
      return;
    }
    if (daemon_running()) return;  // someone else's: use it, leave it running
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    // The default log directory (/var/log/nvidia-mps) is often not writable by the test's user;
    // the clients do not need the log directory, only the pipe directory, which stays the
    // default (or the caller's CUDA_MPS_PIPE_DIRECTORY, which the rank processes inherit).
    if (std::getenv("CUDA_MPS_LOG_DIRECTORY") == nullptr) {
      std::string dir = std::filesystem::temp_directory_path().string() + "/coccl-mps-log-XXXXXX";
      if (::mkdtemp(dir.data()) != nullptr) {
        log_dir_ = dir;
        env.push_back("CUDA_MPS_LOG_DIRECTORY=" + dir);
      }
    }
    const int rc = run({control_, "-d"}, env);
    if (rc != 0) {
      why_ = "nvidia-cuda-mps-control -d failed (status " + std::to_string(rc) + ")";
      return;
    }
    started_ = true;
    // -d returns once the daemon has forked; clients connect through its control pipe.
    if (!wait_until(
            [&] { return daemon_running() && std::filesystem::exists(pipe_dir() + "/control"); }))
      why_ = "the MPS control daemon did not come up (no " + pipe_dir() + "/control)";
  }
  Mps(const Mps&) = delete;
  Mps& operator=(const Mps&) = delete;
  ~Mps() {
    if (started_) {
      // quit stops the server (its clients, the rank processes, have exited) and the daemon.
      const std::string cmd = "echo quit | '" + control_ + "' >/dev/null 2>&1";
      if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "stopping MPS failed\n");
      // Wait for it to go, so that a next test does not find a dying daemon and rely on it.
      wait_until([] { return !daemon_running(); });
    }
    std::error_code ec;
    if (!log_dir_.empty()) std::filesystem::remove_all(log_dir_, ec);
  }

  /// True when an MPS control daemon runs (this object's or another).
  bool available() const { return why_.empty(); }
  /// Why MPS is not available (empty when it is).
  const std::string& why_unavailable() const { return why_; }

  /// True when some process of this machine (as far as /proc shows) is the control daemon.
  static bool daemon_running() {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string pid = entry.path().filename().string();
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream cmdline(entry.path() / "cmdline");
      std::string argv0;
      std::getline(cmdline, argv0, '\0');
      if (std::filesystem::path(argv0).filename() == "nvidia-cuda-mps-control") return true;
    }
    return false;
  }

 private:
  static std::string pipe_dir() {
    const char* dir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
    return dir != nullptr && *dir != 0 ? dir : "/tmp/nvidia-mps";
  }

  static std::string on_path(const std::string& program) {
    const char* path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "";
    for (std::size_t begin = 0; begin <= dirs.size();) {
      std::size_t end = dirs.find(':', begin);
      if (end == std::string::npos) end = dirs.size();
      const std::string dir = dirs.substr(begin, end - begin);
      const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      begin = end + 1;
    }
    return {};
  }

  // Runs a program to completion; its exit status, or -1 when it could not run.
  static int run(std::vector<std::string> args, std::vector<std::string> env) {
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
  }

  // Polls `done` for up to 10 s; true once it holds.
  template <class F>
  static bool wait_until(F done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  std::string control_;
  std::string why_;
  std::string log_dir_;
  bool started_ = false;
};

}  // namespace coccl::gpu_test
