// coccl-moe-bench: MoE dispatch + combine with coccl::moe::Dispatcher against the usual NCCL way,
// in the same processes, on the same inputs, one process per GPU.
//
//   coccl-moe-bench [--ranks N] [--hosts H] [-n ITERS] [-w WARMUP] [-R REPEATS]
//                   [--shape decode|prefill|all] [--no-nccl]
//
// --hosts H: the ranks act as H hosts (rank r on host r*H/N, through COCCL_HOSTID and
// NCCL_HOSTID), so both libraries take their network paths; ranks then share the GPUs there are
// (rank r on GPU r % GPUs; several processes on one GPU need MPS running).
//
// Shapes: decode = 128 tokens per rank, prefill = 4096; both hidden 7168 bfloat16, top-8 of 64
// experts (distinct, uniformly random), split evenly across ranks. Experts are the identity (the
// exchange is what is measured), so combine's result is sum_s w[t,s] * x[t] for every token.
//
// NCCL way (libnccl.so.2 loaded at run time, NCCL_NVLS_ENABLE=0 unless set): dispatch = count
// rows per expert and pack them by destination on the GPU, all-to-all of the per-rank counts
// (grouped ncclSend/ncclRecv), counts to the host and cudaStreamSynchronize, grouped
// ncclSend/ncclRecv of the rows; combine = grouped ncclSend/ncclRecv of the rows back and a
// weighted-sum kernel. The receiver does not regroup the rows by local expert (coccl's dispatch
// does), which favours NCCL.
//
// Time per call: host wall clock around a batch of ITERS calls ended by a stream synchronisation,
// the slowest rank's, median of REPEATS batches after WARMUP calls. coccl (graph) replays one
// captured dispatch + combine. Every library's output is checked against a host reference after
// the timed batches (#wrong = elements that differ, over all ranks).
#include <cuda_runtime_api.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <coccl/coccl.hpp>
#include <coccl/moe.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "coccl_moe_bench_kernels.hpp"
#include "nccl_runtime.hpp"

extern char** environ;

namespace {

using coccl::DataType;

#define BENCH_CUDA(call)                                                            \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess)                                                          \
      throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

struct Options {
  int ranks = 0, hosts = 0, iters = 20, warmup = 5, repeat = 5;
  std::vector<std::string> shapes{"decode", "prefill"};
  bool nccl = true;
};

using coccl_tools::Nccl;
using coccl_tools::nccl_comm;
using coccl_tools::NcclId;

constexpr int nccl_int64 = 4;
constexpr int nccl_bfloat16 = 9;

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float bf16_to_float(std::uint16_t v) {
  std::uint32_t u = static_cast<std::uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint16_t float_to_bf16(float f) {  // round to nearest even; inputs here are finite
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<std::uint16_t>(u >> 16);
}

struct Shape {
  std::string name;
  int tokens, hidden = 7168, k = 8, experts = 64;
};

struct Inputs {
  std::vector<std::uint16_t> x;
  std::vector<std::int32_t> idx;
  std::vector<float> w;
  std::vector<std::uint16_t> want;  // combine's result
};

Inputs make_inputs(const Shape& s, int rank) {
  Inputs in;
  in.x.resize(static_cast<std::size_t>(s.tokens) * s.hidden);
  for (int t = 0; t < s.tokens; ++t)
    for (int h = 0; h < s.hidden; ++h)
      in.x[static_cast<std::size_t>(t) * s.hidden + h] =
          float_to_bf16(static_cast<float>((rank * 37 + t * 11 + h * 5) % 64 - 32) / 8);
  in.idx.resize(static_cast<std::size_t>(s.tokens) * s.k);
  in.w.resize(in.idx.size());
  for (int t = 0; t < s.tokens; ++t) {
    const std::uint64_t h = mix((static_cast<std::uint64_t>(rank) << 32) ^ t);
    const int start = static_cast<int>(h % s.experts);
    const int stride = static_cast<int>((h >> 16) % s.experts) | 1;  // odd: distinct experts
    for (int j = 0; j < s.k; ++j) {
      in.idx[static_cast<std::size_t>(t) * s.k + j] = (start + j * stride) % s.experts;
      in.w[static_cast<std::size_t>(t) * s.k + j] = static_cast<float>(1 + mix(h + j) % 16) / 16;
    }
  }
  in.want.resize(in.x.size());
  for (int t = 0; t < s.tokens; ++t)
    for (int h = 0; h < s.hidden; ++h) {
      float acc = 0;
      const float v = bf16_to_float(in.x[static_cast<std::size_t>(t) * s.hidden + h]);
      for (int j = 0; j < s.k; ++j)
        acc = std::fma(in.w[static_cast<std::size_t>(t) * s.k + j], v, acc);
      in.want[static_cast<std::size_t>(t) * s.hidden + h] = float_to_bf16(acc);
    }
  return in;
}

struct Dev {
  void* p = nullptr;
  explicit Dev(std::size_t bytes) { BENCH_CUDA(cudaMalloc(&p, bytes < 16 ? 16 : bytes)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// The NCCL baseline's state for one shape.
struct Baseline {
  const Nccl& nccl;
  nccl_comm comm;
  int n, rank;
  Shape s;
  std::size_t row;
  Dev send, recv, back, scratch, pos, counts;
  std::int64_t* host_counts = nullptr;  // [0, n) rows sent to each rank, [n, 2n) received
  std::vector<std::size_t> soff, roff;

  Baseline(const Nccl& nc, nccl_comm c, int nranks, int r, const Shape& shape)
      : nccl(nc),
        comm(c),
        n(nranks),
        rank(r),
        s(shape),
        row(static_cast<std::size_t>(shape.hidden) * 2),
        send(static_cast<std::size_t>(shape.tokens) * shape.k * row),
        recv(static_cast<std::size_t>(nranks) * shape.tokens * shape.k * row),
        back(static_cast<std::size_t>(shape.tokens) * shape.k * row),
        scratch(3 * shape.experts * sizeof(int)),
        pos(static_cast<std::size_t>(shape.tokens) * shape.k * sizeof(int)),
        counts(2 * nranks * sizeof(std::int64_t)),
        soff(nranks + 1),
        roff(nranks + 1) {
    BENCH_CUDA(
        cudaMallocHost(reinterpret_cast<void**>(&host_counts), 2 * n * sizeof(std::int64_t)));
  }
  ~Baseline() { cudaFreeHost(host_counts); }

  void dispatch(const void* x, const std::int32_t* idx, cudaStream_t st) {
    bench::Pack pk{idx,
                   s.tokens,
                   s.k,
                   s.experts,
                   n,
                   x,
                   send.p,
                   static_cast<int>(row),
                   scratch.as<int>(),
                   scratch.as<int>() + s.experts,
                   scratch.as<int>() + 2 * s.experts,
                   pos.as<int>(),
                   counts.as<std::int64_t>()};
    BENCH_CUDA(static_cast<cudaError_t>(bench::pack(pk, st)));
    auto* c = counts.as<std::int64_t>();
    nccl.ok(nccl.group_start(), "ncclGroupStart");
    for (int d = 0; d < n; ++d) {
      nccl.ok(nccl.send(c + d, 1, nccl_int64, d, comm, st), "ncclSend");
      nccl.ok(nccl.recv(c + n + d, 1, nccl_int64, d, comm, st), "ncclRecv");
    }
    nccl.ok(nccl.group_end(), "ncclGroupEnd");
    BENCH_CUDA(
        cudaMemcpyAsync(host_counts, c, 2 * n * sizeof(std::int64_t), cudaMemcpyDeviceToHost, st));
    BENCH_CUDA(cudaStreamSynchronize(st));
    for (int d = 0; d < n; ++d) {
      soff[d + 1] = soff[d] + static_cast<std::size_t>(host_counts[d]);
      roff[d + 1] = roff[d] + static_cast<std::size_t>(host_counts[n + d]);
    }
    exchange(send.as<char>(), soff, recv.as<char>(), roff, st);
  }

  void combine(const float* w, void* out, cudaStream_t st) {
    exchange(recv.as<char>(), roff, back.as<char>(), soff, st);
    BENCH_CUDA(static_cast<cudaError_t>(
        bench::unpack(pos.as<int>(), w, s.tokens, s.k, back.p, out, s.hidden, st)));
  }

  void exchange(const char* from, const std::vector<std::size_t>& fo, char* to,
                const std::vector<std::size_t>& to_off, cudaStream_t st) {
    const std::size_t h = static_cast<std::size_t>(s.hidden);
    nccl.ok(nccl.group_start(), "ncclGroupStart");
    for (int d = 0; d < n; ++d) {
      nccl.ok(nccl.send(from + fo[d] * row, (fo[d + 1] - fo[d]) * h, nccl_bfloat16, d, comm, st),
              "ncclSend");
      nccl.ok(nccl.recv(to + to_off[d] * row, (to_off[d + 1] - to_off[d]) * h, nccl_bfloat16, d,
                        comm, st),
              "ncclRecv");
    }
    nccl.ok(nccl.group_end(), "ncclGroupEnd");
  }
};

// Median over repeats of the slowest rank's microseconds per call of `op`.
double measure(coccl::Communicator& comm, const Options& o, cudaStream_t st,
               const std::function<void()>& op) {
  for (int i = 0; i < o.warmup; ++i) op();
  BENCH_CUDA(cudaStreamSynchronize(st));
  std::vector<double> batches;
  for (int r = 0; r < o.repeat; ++r) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) op();
    BENCH_CUDA(cudaStreamSynchronize(st));
    double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        o.iters;
    comm.all_reduce(&us, &us, 1, DataType::float64, coccl::ReduceOp::max);
    batches.push_back(us);
  }
  std::sort(batches.begin(), batches.end());
  return batches[batches.size() / 2];
}

// Runs `op` once on zeroed output and counts wrong elements over all ranks.
long long verify(coccl::Communicator& comm, cudaStream_t st, const Inputs& in, void* out,
                 const std::function<void()>& op) {
  BENCH_CUDA(cudaMemsetAsync(out, 0, in.want.size() * 2, st));
  op();
  std::vector<std::uint16_t> got(in.want.size());
  BENCH_CUDA(cudaMemcpyAsync(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost, st));
  BENCH_CUDA(cudaStreamSynchronize(st));
  long long wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != in.want[i];
  comm.all_reduce(&wrong, &wrong, 1, DataType::int64, coccl::ReduceOp::sum);
  return wrong;
}

int rank_main(int rank, int n, const std::string& id_hex, const Options& o) {
  int status = 0;
  int gpus = 1;
  BENCH_CUDA(cudaGetDeviceCount(&gpus));
  BENCH_CUDA(cudaSetDevice(rank % gpus));
  auto comm = coccl::Communicator::create(coccl::UniqueId::from_string(id_hex), rank, n);
  try {
    cudaStream_t st;
    BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const auto cs = reinterpret_cast<coccl::cuda_stream>(st);
    Nccl nccl;
    nccl_comm nc = nullptr;
    int version = 0;
    bool with_nccl = o.nccl;
    if (with_nccl) {
      setenv("NCCL_NVLS_ENABLE", "0", 0);
      int loaded = nccl.load() ? 1 : 0;
      comm.all_reduce(&loaded, &loaded, 1, DataType::int32, coccl::ReduceOp::min);
      with_nccl = loaded == 1;
      if (with_nccl) {
        NcclId id{};
        if (rank == 0) nccl.ok(nccl.get_unique_id(&id), "ncclGetUniqueId");
        comm.broadcast(&id, &id, sizeof id, DataType::uint8, 0);
        nccl.ok(nccl.init_rank(&nc, n, id, rank), "ncclCommInitRank");
        nccl.get_version(&version);
      } else if (rank == 0) {
        std::printf("# libnccl.so.2 not loadable: coccl only\n");
      }
    }
    if (rank == 0) {
      std::printf(
          "# coccl-moe-bench: %d ranks (%s), bfloat16, hidden 7168, top-8 of 64 "
          "experts; %d calls per batch, %d warm-up, median of %d batches%s\n",
          n,
          o.hosts > 0 ? (std::to_string(o.hosts) + " emulated hosts, " + std::to_string(gpus) +
                         " GPU(s) shared")
                            .c_str()
                      : "one GPU each",
          o.iters, o.warmup, o.repeat,
          with_nccl ? (", NCCL " + std::to_string(version) + " in the same run").c_str() : "");
      std::printf("# times in us per call (slowest rank); speedup = NCCL / coccl\n");
      std::printf("# %-8s %7s %12s %10s %10s %10s %12s %10s %10s %10s %9s %7s %7s\n", "shape",
                  "tokens", "coccl_MiB", "c_disp", "c_comb", "c_d+c", "c_d+c_graph", "n_disp",
                  "n_comb", "n_d+c", "speedup", "c_wrong", "n_wrong");
    }
    for (const std::string& name : o.shapes) {
      Shape s{name, name == "decode" ? 128 : 4096};
      const Inputs in = make_inputs(s, rank);
      Dev x(in.x.size() * 2), idx(in.idx.size() * 4), w(in.w.size() * 4), out(in.x.size() * 2);
      BENCH_CUDA(cudaMemcpy(x.p, in.x.data(), in.x.size() * 2, cudaMemcpyHostToDevice));
      BENCH_CUDA(cudaMemcpy(idx.p, in.idx.data(), in.idx.size() * 4, cudaMemcpyHostToDevice));
      BENCH_CUDA(cudaMemcpy(w.p, in.w.data(), in.w.size() * 4, cudaMemcpyHostToDevice));

      coccl::moe::Dispatcher moe(comm, {s.tokens, s.hidden, DataType::bfloat16, s.k, s.experts, 0});
      moe.prepare();
      coccl::moe::Received got{};
      auto c_disp = [&] { got = moe.dispatch(x.p, s.tokens, idx.as<std::int32_t>(), cs); };
      auto c_comb = [&] { moe.combine(got.x, w.as<float>(), out.p, cs); };
      auto c_both = [&] {
        c_disp();
        c_comb();
      };
      const double cd = measure(comm, o, st, c_disp);
      const double cc = measure(comm, o, st, c_comb);
      const double cb = measure(comm, o, st, c_both);
      const long long c_wrong = verify(comm, st, in, out.p, c_both);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      BENCH_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      c_both();
      BENCH_CUDA(cudaStreamEndCapture(st, &graph));
      BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      auto c_graph = [&] { BENCH_CUDA(cudaGraphLaunch(exec, st)); };
      const double cg = measure(comm, o, st, c_graph);
      const long long g_wrong = verify(comm, st, in, out.p, c_graph);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      std::string why;
      if (moe.device_status(&why)) throw std::runtime_error("coccl device error: " + why);

      double nd = 0, ncm = 0, nb = 0;
      long long n_wrong = 0;
      if (with_nccl) {
        Baseline base(nccl, nc, n, rank, s);
        auto n_disp = [&] { base.dispatch(x.p, idx.as<std::int32_t>(), st); };
        auto n_comb = [&] { base.combine(w.as<float>(), out.p, st); };
        auto n_both = [&] {
          n_disp();
          n_comb();
        };
        nd = measure(comm, o, st, n_disp);
        ncm = measure(comm, o, st, n_comb);
        nb = measure(comm, o, st, n_both);
        n_wrong = verify(comm, st, in, out.p, n_both);
      }
      status |= (c_wrong || g_wrong || n_wrong) ? 1 : 0;
      if (rank == 0) {
        std::printf("  %-8s %7d %12.1f %10.2f %10.2f %10.2f %12.2f", s.name.c_str(), s.tokens,
                    static_cast<double>(moe.device_bytes()) / (1 << 20), cd, cc, cb, cg);
        if (with_nccl) {
          std::printf(" %10.2f %10.2f %10.2f %9.2f", nd, ncm, nb, nb / cb);
        } else {
          std::printf(" %10s %10s %10s %9s", "-", "-", "-", "-");
        }
        std::printf(" %7lld %7lld\n", c_wrong + g_wrong, n_wrong);
        std::fflush(stdout);
      }
    }
    if (nc) nccl.destroy(nc);
    cudaStreamDestroy(st);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coccl-moe-bench rank %d: %s (%s)\n", rank, e.what(),
                 comm.last_error().c_str());
    status = 1;
  }
  comm.destroy();
  return status;
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: coccl-moe-bench [--ranks N] [--hosts H] [-n ITERS] [-w WARMUP] [-R REPEATS] "
               "[--shape decode|prefill|all] [--no-nccl]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int rank = -1;
  std::string id;
  bool shape_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--ranks")
      o.ranks = std::atoi(val().c_str());
    else if (a == "--hosts")
      o.hosts = std::atoi(val().c_str());
    else if (a == "-n")
      o.iters = std::atoi(val().c_str());
    else if (a == "-w")
      o.warmup = std::atoi(val().c_str());
    else if (a == "-R")
      o.repeat = std::atoi(val().c_str());
    else if (a == "--no-nccl")
      o.nccl = false;
    else if (a == "--shape") {
      // The first --shape replaces the default list, later ones add to it.
      if (!shape_given) o.shapes.clear();
      shape_given = true;
      const std::string v = val();
      if (v == "all")
        o.shapes = {"decode", "prefill"};
      else if (v == "decode" || v == "prefill")
        o.shapes.push_back(v);
      else
        usage();
    } else if (a == "--rank" && i + 2 < argc) {
      rank = std::atoi(argv[++i]);
      id = argv[++i];
    } else {
      usage();
    }
  }
  if (o.iters < 1 || o.repeat < 1 || o.warmup < 0 || o.hosts < 0) usage();
  if (rank >= 0) {
    try {
      return rank_main(rank, o.ranks, id, o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "coccl-moe-bench rank %d: %s\n", rank, e.what());
      return 1;
    }
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  if (o.ranks == 0) o.ranks = o.hosts > 0 ? o.hosts : std::min(gpus, 8);
  if (o.hosts > o.ranks) usage();
  if (o.hosts > 0 ? gpus < 1 : (o.ranks < 2 || o.ranks > gpus)) {
    std::printf("# coccl-moe-bench: needs %s (found %d GPUs); skipped\n",
                o.hosts > 0 ? "a GPU" : "2..8 GPUs", gpus);
    return 0;
  }
  // One process per GPU: this binary again, with --rank.
  const auto uid = coccl::UniqueId::create();
  char self[4096];
  const ssize_t k = ::readlink("/proc/self/exe", self, sizeof self - 1);
  self[k > 0 ? k : 0] = 0;
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    std::vector<std::string> args{self,
                                  "--ranks",
                                  std::to_string(o.ranks),
                                  "--hosts",
                                  std::to_string(o.hosts),
                                  "-n",
                                  std::to_string(o.iters),
                                  "-w",
                                  std::to_string(o.warmup),
                                  "-R",
                                  std::to_string(o.repeat),
                                  "--rank",
                                  std::to_string(r),
                                  uid.to_string()};
    for (const auto& sh : o.shapes) {
      args.push_back("--shape");
      args.push_back(sh);
    }
    if (!o.nccl) args.push_back("--no-nccl");
    std::vector<char*> av;
    for (auto& s : args) av.push_back(s.data());
    av.push_back(nullptr);
    // The environment, with this rank's host identity for both libraries.
    std::vector<std::string> env_own;
    if (o.hosts > 0) {
      const std::string host = "coccl-moe-host-" + std::to_string(r * o.hosts / o.ranks);
      env_own = {"COCCL_HOSTID=" + host, "NCCL_HOSTID=" + host};
    }
    std::vector<char*> ev;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      if (o.hosts > 0 && (kv.rfind("COCCL_HOSTID=", 0) == 0 || kv.rfind("NCCL_HOSTID=", 0) == 0))
        continue;
      ev.push_back(*e);
    }
    for (auto& kv : env_own) ev.push_back(kv.data());
    ev.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, self, nullptr, nullptr, av.data(), ev.data()) != 0) {
      std::perror("posix_spawn");
      return 1;
    }
    pids.push_back(pid);
  }
  int status = 0;
  for (pid_t pid : pids) {
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) status = 1;
  }
  return status;
}
