// coccl-init-bench: time to a working communicator on host memory, for N real processes of this
// machine: init plus a first all_reduce of one element, checked, against Open MPI (MPI_Init +
// MPI_Allreduce) and Gloo (FileStore rendezvous, connectFullMesh, allreduce) in the same run.
//
//   coccl-init-bench [--ranks N[,N...]] [--repeat R] [--baseline mpi|gloo]... [--timeout S]
//   coccl-init-bench --device [--ranks N[,N...]] [--repeat R] [--coccl-nccl PATH]
//   either with --plot FILE.svg|FILE.png: the medians against ranks, one series per library
//   (drawn by gnuplot as coccl-perf --plot draws; without gnuplot the run ends with a note)
//
// --device: each rank a host of its own (COCCL_HOSTID and NCCL_HOSTID) on the GPUs there are
// (several processes on one GPU need MPS running), timing ncclCommInitRank plus a first device
// all_reduce of one float through coccl's libnccl.so.2 (PATH; default: the build tree's) and
// NVIDIA's (the loader's libnccl.so.2), CUDA contexts made before the gate.
//
// Every process of a run waits at a start gate (tools/init_gate.hpp) until all N exist, so launch
// speed is not measured; the run's time is from the first process leaving the gate to the last
// one holding a checked all_reduce result. coccl ranks are processes of this binary, which holds
// the bootstrap root (UniqueId::create), as a launcher holds Open MPI's runtime. Prints the
// median of R runs per library and N, in milliseconds, and the ratios.
#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <coccl/coccl.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "init_bench_device.hpp"
#include "init_gate.hpp"
#include "open_files.hpp"
#include "perf_plot.hpp"

extern char** environ;

namespace {

namespace gate = coccl_init_gate;

struct Options {
  std::vector<int> ranks{2, 4, 8, 16, 32, 64};
  int repeat = 3;
  std::vector<std::string> baselines;
  double timeout_s = 300;
  bool device = false;
  std::string coccl_nccl;  // --device: coccl's libnccl.so.2
  std::string plot;        // --plot: time against ranks, one series per library
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: coccl-init-bench [--ranks N[,N...]] [--repeat R] [--baseline mpi|gloo]... "
               "[--timeout S]\n"
               "       coccl-init-bench --device [--ranks N[,N...]] [--repeat R] "
               "[--coccl-nccl PATH]\n"
               "       either with [--plot FILE.svg|FILE.png] (time against ranks, each library "
               "a series; gnuplot)\n");
  std::exit(2);
}

std::string self_dir() {
  char buf[4096];
  const ssize_t k = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string p(buf, k > 0 ? static_cast<std::size_t>(k) : 0);
  return p.substr(0, p.rfind('/') + 1);
}

// Starts `args` with the environment plus `extra`; returns the pid, or -1.
pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) envp.push_back(*e);
  for (const auto& e : extra) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  return pid;
}

int count_prefixed(const std::string& dir, const char* prefix) {
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, prefix, std::strlen(prefix)) == 0 &&
          std::strstr(e->d_name, ".tmp") == nullptr)
        ++n;
    ::closedir(d);
  }
  return n;
}

// One run of `lib` with n ranks: the time in ms, or a negative value when it failed.
double run_once(const std::string& lib, int n, const Options& o) {
  char tmpl[] = "/tmp/coccl-init-XXXXXX";
  if (!::mkdtemp(tmpl)) return -1;
  const std::string dir = tmpl;
  const std::string tools = self_dir();
  // Gloo's FileStore lives here; it must exist before any rank opens it.
  if (lib == "gloo" && ::mkdir((dir + "/store").c_str(), 0700) != 0) return -1;
  if (::mkfifo((dir + "/go").c_str(), 0600) != 0) return -1;
  std::vector<pid_t> pids;
  if (o.device) {
    const std::string path = lib == "coccl" ? o.coccl_nccl : "libnccl.so.2";
    for (int r = 0; r < n; ++r) {
      const std::string host = "coccl-init-host-" + std::to_string(r);
      pids.push_back(
          spawn({tools + "coccl-init-bench"},
                {"COCCL_INIT_BENCH_RANK=" + std::to_string(r),
                 "COCCL_INIT_BENCH_NRANKS=" + std::to_string(n), "COCCL_INIT_BENCH_DIR=" + dir,
                 "COCCL_INIT_BENCH_LIB=" + path, "COCCL_HOSTID=" + host, "NCCL_HOSTID=" + host}));
    }
  } else if (lib == "coccl") {
    const std::string id = coccl::UniqueId::create().to_string();
    for (int r = 0; r < n; ++r)
      pids.push_back(spawn({tools + "coccl-init-bench"},
                           {"COCCL_INIT_BENCH_RANK=" + std::to_string(r),
                            "COCCL_INIT_BENCH_NRANKS=" + std::to_string(n),
                            "COCCL_INIT_BENCH_DIR=" + dir, "COCCL_INIT_BENCH_ID=" + id}));
  } else if (lib == "mpi") {
    pids.push_back(
        spawn({COCCL_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
               std::to_string(n), tools + "coccl-perf-mpi", "--init", dir},
              {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"}));
  } else {
    for (int r = 0; r < n; ++r)
      pids.push_back(spawn(
          {tools + "coccl-perf-gloo", "--init", dir, std::to_string(r), std::to_string(n)}, {}));
  }
  bool ok = std::none_of(pids.begin(), pids.end(), [](pid_t p) { return p < 0; });
  const double until = gate::now_us() + o.timeout_s * 1e6;
  while (ok && count_prefixed(dir, "ready.") < n) {
    if (gate::now_us() > until) ok = false;
    ::usleep(1000);
  }
  // Opening the FIFO for writing releases every rank blocked opening it; it stays open until they
  // exit, so a rank that opens it late passes too.
  const int go = ok ? ::open((dir + "/go").c_str(), O_WRONLY) : -1;
  if (go < 0) ok = false;
  for (pid_t p : pids) {
    if (p < 0) continue;
    if (!ok) ::kill(p, SIGKILL);
    int status = 0;
    ::waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = false;
  }
  if (go >= 0) ::close(go);
  double first = 0, last = 0;
  for (int r = 0; ok && r < n; ++r) {
    std::ifstream f(dir + "/result." + std::to_string(r));
    double t0 = 0, t1 = 0;
    int good = 0;
    if (!(f >> t0 >> t1 >> good) || !good) {
      ok = false;
      break;
    }
    first = r == 0 ? t0 : std::min(first, t0);
    last = r == 0 ? t1 : std::max(last, t1);
  }
  std::error_code removed;
  std::filesystem::remove_all(dir, removed);
  if (removed)
    std::fprintf(stderr, "cannot remove %s: %s\n", dir.c_str(), removed.message().c_str());
  if (!ok) std::fprintf(stderr, "coccl-init-bench: %s with %d ranks failed\n", lib.c_str(), n);
  return ok ? (last - first) / 1e3 : -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? -1 : v[v.size() / 2];
}

// A rank of a coccl run.
int rank_main(int rank, int n, const std::string& dir, const std::string& id) {
  gate::wait_for_go(dir, rank);
  const double t0 = gate::now_us();
  auto comm = coccl::Communicator::create(coccl::UniqueId::from_string(id), rank, n);
  float x = 1;
  comm.all_reduce(&x, &x, 1, coccl::DataType::float32, coccl::ReduceOp::sum);
  const double t1 = gate::now_us();
  gate::write_result(dir, rank, t0, t1, x == static_cast<float>(n));
  comm.destroy();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* r = std::getenv("COCCL_INIT_BENCH_RANK")) {
    if (const char* lib = std::getenv("COCCL_INIT_BENCH_LIB"))
      return coccl_init_bench::device_rank_main(std::atoi(r),
                                                std::atoi(std::getenv("COCCL_INIT_BENCH_NRANKS")),
                                                std::getenv("COCCL_INIT_BENCH_DIR"), lib);
    try {
      return rank_main(std::atoi(r), std::atoi(std::getenv("COCCL_INIT_BENCH_NRANKS")),
                       std::getenv("COCCL_INIT_BENCH_DIR"), std::getenv("COCCL_INIT_BENCH_ID"));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "coccl-init-bench rank %s: %s\n", r, e.what());
      return 1;
    }
  }
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--ranks") {
      o.ranks.clear();
      const std::string v = val();
      for (std::size_t at = 0; at <= v.size();) {
        const std::size_t comma = std::min(v.find(',', at), v.size());
        o.ranks.push_back(std::atoi(v.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
    } else if (a == "--repeat") {
      o.repeat = std::atoi(val().c_str());
    } else if (a == "--baseline") {
      const std::string b = val();
      if (b != "mpi" && b != "gloo") usage();
      o.baselines.push_back(b);
    } else if (a == "--timeout") {
      o.timeout_s = std::atof(val().c_str());
    } else if (a == "--device") {
      o.device = true;
    } else if (a == "--coccl-nccl") {
      o.coccl_nccl = val();
    } else if (a == "--plot") {
      o.plot = val();
      const std::size_t dot = o.plot.rfind('.');
      const std::string ext = dot == std::string::npos ? "" : o.plot.substr(dot);
      if (ext != ".svg" && ext != ".png") usage();
    } else {
      usage();
    }
  }
  if (o.repeat < 1 || o.ranks.empty() ||
      std::any_of(o.ranks.begin(), o.ranks.end(), [](int n) { return n < 1; }))
    usage();
  for (const std::string& b : o.baselines) {
    if ((b == "mpi" && !COCCL_HAVE_MPI) || (b == "gloo" && !COCCL_HAVE_GLOO)) {
      std::fprintf(stderr, "coccl-init-bench: the %s baseline was not built\n", b.c_str());
      return 2;
    }
  }
  // Every rank holds sockets to its peers (Gloo: one to each); let them have what the system
  // allows.
  raise_open_file_limit();
  std::vector<std::string> libs{"coccl"};
  for (const std::string& b : o.baselines) libs.push_back(b);
  if (o.device) {
    if (!coccl_init_bench::device_runs_built()) {
      std::fprintf(stderr, "coccl-init-bench: built without CUDA, no --device runs\n");
      return 2;
    }
    if (o.coccl_nccl.empty()) o.coccl_nccl = self_dir() + "../collectives/nccl/libnccl.so.2";
    libs = {"coccl", "nccl"};
    std::printf(
        "# coccl-init-bench --device: ncclCommInitRank + first device all_reduce (1 float, "
        "checked), each rank a host; coccl = %s, nccl = the loader's libnccl.so.2; median "
        "of %d runs; ms\n",
        o.coccl_nccl.c_str(), o.repeat);
  } else {
    std::printf(
        "# coccl-init-bench: init + first all_reduce (1 float, checked) on host memory, "
        "%u cores; median of %d runs; ms\n",
        std::thread::hardware_concurrency(), o.repeat);
  }
  std::printf("# %6s", "ranks");
  for (const std::string& l : libs) std::printf(" %10s", l.c_str());
  for (std::size_t i = 1; i < libs.size(); ++i) std::printf(" %10s", (libs[i] + "/coccl").c_str());
  std::printf("\n");
  int status = 0;
  std::vector<perf::PlotSeries> series;
  for (const std::string& l : libs) series.push_back({l, {}});
  for (int n : o.ranks) {
    std::vector<double> ms;
    for (const std::string& lib : libs) {
      std::vector<double> runs;
      for (int k = 0; k < o.repeat; ++k) {
        const double t = run_once(lib, n, o);
        if (t < 0) {
          status = 1;
          break;
        }
        runs.push_back(t);
      }
      ms.push_back(runs.size() == static_cast<std::size_t>(o.repeat) ? median(runs) : -1);
    }
    std::printf("  %6d", n);
    for (double t : ms) std::printf(" %10.1f", t);
    for (std::size_t i = 1; i < ms.size(); ++i)
      std::printf(" %10.2f", ms[0] > 0 && ms[i] > 0 ? ms[i] / ms[0] : 0.0);
    std::printf("\n");
    std::fflush(stdout);
    for (std::size_t i = 0; i < ms.size(); ++i)
      if (ms[i] > 0) series[i].points.push_back({static_cast<double>(n), ms[i], 0.0});
  }
  if (!o.plot.empty()) {
    std::erase_if(series, [](const perf::PlotSeries& s) { return s.points.empty(); });
    perf::PlotAxes axes;
    axes.x_label = "ranks";
    axes.x_in_bytes = false;
    axes.time_label = "init + first allreduce (ms)";
    const std::string title = std::string("coccl-init-bench: ") +
                              (o.device ? "device" : "host memory") + ", median of " +
                              std::to_string(o.repeat) + " runs";
    const std::string why = series.empty() ? std::string("no run finished; no plot written")
                                           : perf::plot(o.plot, title, axes, series);
    if (!why.empty()) std::fprintf(stderr, "coccl-init-bench: %s\n", why.c_str());
  }
  return status;
}
