// examples/check/example_check.cpp: runs the examples as CTest's checks and compares what they
// produce.
//
//   coccl-example-check trainer TRAINER host|cuda
//     host: one rank on the whole batch, then 2 ranks (with --compare: overlapped and
//     not-overlapped runs give the same losses) and 3 ranks on shares of it; every step's loss
//     must agree with one rank's within a relative 1e-4 (float sums in another order).
//     cuda: the cuBLAS form on one GPU against the host form (relative 1e-3: cuBLAS orders its
//     sums differently), and 2 ranks on 2 GPUs against one when the machine has them (or on
//     one GPU with COCCL_EXAMPLE_SHARE_GPUS=1, the MPS daemon running). Exits 77 (skipped)
//     without a GPU.
//   coccl-example-check launchers TRAINER
//     the host form started by launchers instead of --ranks, every process a rank through
//     Communicator::from_env(): 2 ranks under a real mpirun (PMIx; skipped where /usr/bin/mpirun is
//     missing) and 2 ranks as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
//     with a TCPStore served on MASTER_PORT by tests/support/fake_store, since torchrun needs
//     PyTorch); every step's loss must agree with one rank's within a relative 1e-4. srun
//     --mpi=pmix takes the same PMIx path as mpirun.
//   coccl-example-check dead-worker PARAMETER_SERVER
//     4 ranks, 2 servers; worker 3 kills itself after 3 pushes: every other rank must exit with
//     status 3 naming rank 3 before the deadline.
//
// Every run has a deadline; its whole process group is killed when it passes.
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/fake_store.hpp"

extern char** environ;

namespace {

struct Result {
  int exit_code = -1;  // -1 when ended by a signal
  bool timed_out = false;
  std::string output;  // stdout and stderr
};

Result run(const std::vector<std::string>& args, int deadline_s) {
  std::printf("$");
  for (const auto& a : args) std::printf(" %s", a.c_str());
  std::printf("\n");
  std::fflush(stdout);
  Result r;
  int fds[2];
  if (::pipe(fds) != 0) return r;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so that the ranks it starts die with it at the deadline.
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    r.output = "cannot start " + args[0];
    return r;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(deadline_s);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          end - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      r.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    const ssize_t k = ::read(fds[0], buf, sizeof buf);
    if (k <= 0) break;  // every holder of the pipe has exited
    r.output.append(buf, static_cast<std::size_t>(k));
  }
  ::close(fds[0]);
  int ws = 0;
  ::waitpid(pid, &ws, 0);
  if (WIFEXITED(ws)) r.exit_code = WEXITSTATUS(ws);
  std::fputs(r.output.c_str(), stdout);
  if (r.timed_out) std::printf("(deadline of %d s passed; killed)\n", deadline_s);
  std::fflush(stdout);
  return r;
}

std::vector<double> read_losses(const std::string& path) {
  std::vector<double> out;
  std::ifstream f(path);
  std::size_t step;
  double loss;
  while (f >> step >> loss) {
    if (step != out.size()) return {};
    out.push_back(loss);
  }
  return out;
}

// Every step's loss within `rel` of the reference's, over the same number of steps.
bool same_curve(const std::vector<double>& ref, const std::vector<double>& got, double rel,
                const char* what) {
  if (ref.empty() || got.size() != ref.size()) {
    std::printf("FAIL %s: %zu steps against %zu\n", what, got.size(), ref.size());
    return false;
  }
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - ref[i]) / std::fabs(ref[i]));
  const bool ok = worst <= rel;
  std::printf("%s %s: largest relative difference %.2e over %zu steps (tolerance %.0e)\n",
              ok ? "ok" : "FAIL", what, worst, ref.size(), rel);
  return ok;
}

int check_trainer(const std::string& exe, const std::string& device) {
  char dir[] = "/tmp/coccl-trainer-check-XXXXXX";
  if (!::mkdtemp(dir)) return 1;
  const std::string d = dir;
  auto train = [&](int ranks, const std::string& dev, const std::string& out,
                   std::vector<std::string> extra) {
    std::vector<std::string> args{exe,           "--ranks",     std::to_string(ranks),
                                  "--steps",     "20",          "--hidden",
                                  "128",         "--layers",    "3",
                                  "--bucket-kb", "8",           "--device",
                                  dev,           "--loss-file", d + "/" + out};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args, 240);
  };
  bool ok = true;
  auto ran = [&](const Result& r) {
    const bool good = !r.timed_out && r.exit_code == 0;
    if (!good) std::printf("FAIL: the trainer exited with %d\n", r.exit_code);
    ok = ok && good;
    return good;
  };
  if (device == "host") {
    if (ran(train(1, "host", "1", {})) && ran(train(2, "host", "2", {"--compare"})) &&
        ran(train(3, "host", "3", {}))) {
      const auto one = read_losses(d + "/1");
      ok = same_curve(one, read_losses(d + "/2"), 1e-4, "2 ranks against 1") && ok;
      ok = same_curve(one, read_losses(d + "/3"), 1e-4, "3 ranks against 1") && ok;
    }
  } else {
    const Result first = train(1, "cuda", "gpu1", {});
    if (first.exit_code == 77) {
      std::printf("skipped: no GPU\n");
      return 77;
    }
    if (ran(first) && ran(train(1, "host", "host1", {}))) {
      const auto gpu = read_losses(d + "/gpu1");
      ok = same_curve(read_losses(d + "/host1"), gpu, 1e-3, "1 GPU against the host form");
      // COCCL_EXAMPLE_SHARE_GPUS=1 (MPS running) lets the 2 ranks share one GPU.
      const char* share = std::getenv("COCCL_EXAMPLE_SHARE_GPUS");
      const bool shared = share && std::string(share) == "1";
      std::vector<std::string> args{"--compare"};
      if (shared) args.push_back("--share-gpus");
      const Result two = train(2, "cuda", "gpu2", args);
      if (two.exit_code == 77)
        std::printf(
            "the 2-rank form needs 2 GPUs (or COCCL_EXAMPLE_SHARE_GPUS=1 under MPS); "
            "checked 1 rank only\n");
      else if (ran(two))
        ok = same_curve(gpu, read_losses(d + "/gpu2"), 1e-4,
                        shared ? "2 ranks on the GPUs against 1" : "2 GPUs against 1") &&
             ok;
    }
  }
  for (const char* f : {"1", "2", "3", "gpu1", "gpu2", "host1"}) ::unlink((d + "/" + f).c_str());
  ::rmdir(dir);
  return ok ? 0 : 1;
}

// The host trainer's arguments shared by every run of a comparison.
std::vector<std::string> trainer_args(const std::string& exe, const std::string& loss_file) {
  return {exe,           "--steps", "20",       "--hidden", "128",         "--layers", "3",
          "--bucket-kb", "8",       "--device", "host",     "--loss-file", loss_file};
}

std::string joined(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

int check_launchers(const std::string& exe) {
  char dir[] = "/tmp/coccl-trainer-launch-XXXXXX";
  if (!::mkdtemp(dir)) return 1;
  const std::string d = dir;
  bool ok = true;
  auto ran = [&](const Result& r, const char* what) {
    const bool good = !r.timed_out && r.exit_code == 0;
    if (!good) std::printf("FAIL %s: exited with %d\n", what, r.exit_code);
    ok = ok && good;
    return good;
  };
  auto one_args = trainer_args(exe, d + "/1");
  one_args.insert(one_args.begin() + 1, {"--ranks", "1"});
  std::vector<double> one;
  if (ran(run(one_args, 120), "one rank")) one = read_losses(d + "/1");
  // No launcher variable of the caller's may leak into the runs below.
  const std::string clean =
      "env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE -u COCCL_COMM_ID -u COCCL_SECRET "
      "-u PMIX_RANK -u PMIX_NAMESPACE";
  if (::access("/usr/bin/mpirun", X_OK) == 0) {
    const std::string cmd = clean +
                            " OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                            "OMPI_MCA_rmaps_base_oversubscribe=1 /usr/bin/mpirun -n 2 " +
                            joined(trainer_args(exe, d + "/mpirun"));
    if (ran(run({"/bin/sh", "-c", cmd}, 120), "mpirun"))
      ok =
          same_curve(one, read_losses(d + "/mpirun"), 1e-4, "2 ranks under mpirun against 1") && ok;
  } else {
    std::printf("no /usr/bin/mpirun: the mpirun form is not checked\n");
  }
  {
    coccl::test::FakeStore store;
    const std::string common =
        clean + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(store.port()) +
        " WORLD_SIZE=2 ";
    const std::string train = joined(trainer_args(exe, d + "/torchrun"));
    // Both ranks at once; the exit status is nonzero when either rank's is.
    const std::string cmd = common + "RANK=0 LOCAL_RANK=0 " + train + " & a=$!; " + common +
                            "RANK=1 LOCAL_RANK=1 " + train +
                            " & b=$!; wait $a; ra=$?; wait $b; rb=$?; exit $((ra | rb))";
    if (ran(run({"/bin/sh", "-c", cmd}, 120), "torchrun's environment"))
      ok = same_curve(one, read_losses(d + "/torchrun"), 1e-4,
                      "2 ranks started as torchrun starts them against 1") &&
           ok;
    if (store.validated_clients() < 2) {
      std::printf("FAIL: %d ranks spoke to the TCPStore, expected 2\n", store.validated_clients());
      ok = false;
    }
  }
  for (const char* f : {"1", "mpirun", "torchrun"}) ::unlink((d + "/" + f).c_str());
  ::rmdir(dir);
  return ok ? 0 : 1;
}

int check_dead_worker(const std::string& exe) {
  ::setenv("COCCL_TIMEOUT", "10", 1);
  const Result r = run({exe, "--ranks", "4", "--servers", "2", "--rounds", "1000", "--kill-worker",
                        "3", "--after", "3"},
                       60);
  bool ok = !r.timed_out && r.exit_code != 0;
  if (!ok) std::printf("FAIL: the job must stop by itself with a failure\n");
  if (r.output.find("rank 3 was killed by signal 9") == std::string::npos) {
    std::printf("FAIL: rank 3 was not killed\n");
    ok = false;
  }
  for (int rank : {0, 1, 2}) {
    // The rank's own report, and the launcher's line with its exit status.
    const std::string prefix = "parameter_server rank " + std::to_string(rank) + ": stopping: ";
    std::istringstream in(r.output);
    std::string line;
    bool named = false;
    while (std::getline(in, line))
      if (line.rfind(prefix, 0) == 0 && line.find("rank 3", prefix.size()) != std::string::npos)
        named = true;
    const bool exited =
        r.output.find("rank " + std::to_string(rank) + " exited with 3") != std::string::npos;
    std::printf("%s rank %d: %s the dead rank, %s\n", named && exited ? "ok" : "FAIL", rank,
                named ? "named" : "did not name", exited ? "exited with 3" : "did not exit with 3");
    ok = ok && named && exited;
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 2 ? argv[1] : "";
  if (mode == "trainer" && argc == 4) return check_trainer(argv[2], argv[3]);
  if (mode == "launchers" && argc == 3) return check_launchers(argv[2]);
  if (mode == "dead-worker" && argc == 3) return check_dead_worker(argv[2]);
  std::fprintf(stderr,
               "usage: coccl-example-check trainer TRAINER host|cuda\n"
               "       coccl-example-check launchers TRAINER\n"
               "       coccl-example-check dead-worker PARAMETER_SERVER\n");
  return 2;
}
