// tests/gpu/bench_kernels.cpp: gpu_kernels_bench, coccl's all-reduce kernels against NCCL on the
// first N GPUs of one process (argv[2], default 2), float32 sum, 8 B .. 1 GiB, eager launches and
// CUDA graphs; first a two-shot sweep of blocks x staging.
//
// NCCL is loaded at run time (dlopen("libnccl.so.2"), or $COCCL_BENCH_NCCL), through our own
// declarations of its C API. Every configuration is verified before it is timed. Times are the
// median over 5 batches (after a warm-up batch) of the per-operation time of a batch, measured
// with CUDA events on both GPUs (the slower GPU counts). busbw = algbw * 2 (n - 1) / n.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/launch.hpp"
#include "tests/gpu/gpu_harness.hpp"

namespace {

using coccl::gpu_test::DeviceBuffer;
using coccl::gpu_test::Group;

// The part of NCCL's C API the benchmark uses (values from nccl.h: ncclFloat32 = 7, ncclSum = 0).
using nccl_comm_t = struct nccl_comm_opaque*;
struct Nccl {
  int (*comm_init_all)(nccl_comm_t*, int, const int*) = nullptr;
  int (*all_reduce)(const void*, void*, std::size_t, int, int, nccl_comm_t, cudaStream_t) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  int (*comm_destroy)(nccl_comm_t) = nullptr;
  int (*get_version)(int*) = nullptr;
  const char* (*error_string)(int) = nullptr;

  bool load() {
    const char* path = std::getenv("COCCL_BENCH_NCCL");
    void* h = dlopen(path != nullptr ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      std::printf("# NCCL not loaded: %s\n", dlerror());
      return false;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      return fn != nullptr;
    };
    return sym(comm_init_all, "ncclCommInitAll") && sym(all_reduce, "ncclAllReduce") &&
           sym(group_start, "ncclGroupStart") && sym(group_end, "ncclGroupEnd") &&
           sym(comm_destroy, "ncclCommDestroy") && sym(get_version, "ncclGetVersion") &&
           sym(error_string, "ncclGetErrorString");
  }
};

#define NCCL_CHECK(nccl, expr)                                                  \
  do {                                                                          \
    const int rc_ = (expr);                                                     \
    if (rc_ != 0) {                                                             \
      std::fprintf(stderr, "%s failed: %s\n", #expr, (nccl).error_string(rc_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

// GPUs taking part: argv[2], default 2.
int nranks = 2;
constexpr int batches = 5;

float input_value(std::size_t i, int r) { return static_cast<float>((i * 7 + r * 3) % 64); }

// The all_reduce of element i over every rank (exact: small integers).
float sum_value(std::size_t i) {
  float s = 0;
  for (int r = 0; r < nranks; ++r) s += input_value(i, r);
  return s;
}

struct Buffers {
  std::vector<DeviceBuffer> send;
  std::vector<DeviceBuffer> recv;
};

// Enqueues one all-reduce of `count` floats for rank r on its stream (device already current).
using Op = std::function<void(int r, std::size_t count, cudaStream_t s)>;
// Enqueues one all-reduce for all ranks (device switching inside).
using GroupOp = std::function<void(std::size_t count)>;

class Bench {
 public:
  Bench(Group& g, Buffers& b) : g_(g), b_(b) {
    for (int r = 0; r < nranks; ++r) {
      COCCL_CUDA_CHECK(cudaSetDevice(r));
      COCCL_CUDA_CHECK(cudaEventCreate(&start_[r]));
      COCCL_CUDA_CHECK(cudaEventCreate(&stop_[r]));
    }
  }

  /// Poisons recv, runs once, checks a sample of every rank's result (every element up to 1M).
  bool verify(const GroupOp& op, std::size_t count) {
    for (int r = 0; r < nranks; ++r) b_.recv[r].fill(0xff);
    op(count);
    g_.sync();
    const std::size_t step = count <= (1u << 20) ? 1 : 997;
    const std::size_t n = (count + step - 1) / step;
    std::vector<float> got(n);
    for (int r = 0; r < nranks; ++r) {
      COCCL_CUDA_CHECK(cudaSetDevice(r));
      COCCL_CUDA_CHECK(cudaMemcpy2D(got.data(), sizeof(float), b_.recv[r].get(),
                                    step * sizeof(float), sizeof(float), n,
                                    cudaMemcpyDeviceToHost));
      for (std::size_t k = 0; k < n; ++k) {
        const std::size_t i = k * step;
        const float want = sum_value(i);
        if (got[k] != want) {
          std::printf("# VERIFY FAILED rank %d element %zu: %g != %g\n", r, i, got[k], want);
          return false;
        }
      }
      float last = 0;
      COCCL_CUDA_CHECK(
          cudaMemcpy(&last, b_.recv[r].get() + (count - 1) * 4, 4, cudaMemcpyDeviceToHost));
      if (last != sum_value(count - 1)) {
        std::printf("# VERIFY FAILED rank %d last element\n", r);
        return false;
      }
    }
    return true;
  }

  /// Median microseconds per operation; graph = capture `iters` operations per rank first.
  double time(const GroupOp& op, std::size_t count, bool graph, bool relaxed_capture) {
    const int iters = iterations(count);
    std::vector<cudaGraphExec_t> exec(nranks, nullptr);
    if (graph) {
      const auto mode =
          relaxed_capture ? cudaStreamCaptureModeRelaxed : cudaStreamCaptureModeThreadLocal;
      g_.each([&](int r) { COCCL_CUDA_CHECK(cudaStreamBeginCapture(g_.stream(r), mode)); });
      for (int k = 0; k < iters; ++k) op(count);
      // Every capture ends before the first instantiation: instantiating is not allowed while
      // this thread still captures another stream.
      std::vector<cudaGraph_t> graphs(nranks, nullptr);
      g_.each([&](int r) { COCCL_CUDA_CHECK(cudaStreamEndCapture(g_.stream(r), &graphs[r])); });
      g_.each([&](int r) {
        COCCL_CUDA_CHECK(cudaGraphInstantiate(&exec[r], graphs[r], 0));
        COCCL_CUDA_CHECK(cudaGraphDestroy(graphs[r]));
      });
    }
    auto batch = [&] {
      g_.sync();
      g_.each([&](int r) { COCCL_CUDA_CHECK(cudaEventRecord(start_[r], g_.stream(r))); });
      if (graph) {
        g_.each([&](int r) { COCCL_CUDA_CHECK(cudaGraphLaunch(exec[r], g_.stream(r))); });
      } else {
        for (int k = 0; k < iters; ++k) op(count);
      }
      g_.each([&](int r) { COCCL_CUDA_CHECK(cudaEventRecord(stop_[r], g_.stream(r))); });
      g_.sync();
      float worst = 0;
      for (int r = 0; r < nranks; ++r) {
        float ms = 0;
        COCCL_CUDA_CHECK(cudaEventElapsedTime(&ms, start_[r], stop_[r]));
        worst = std::max(worst, ms);
      }
      return worst * 1000.0 / iters;
    };
    batch();
    std::vector<double> t;
    for (int i = 0; i < batches; ++i) t.push_back(batch());
    std::sort(t.begin(), t.end());
    if (graph) g_.each([&](int r) { COCCL_CUDA_CHECK(cudaGraphExecDestroy(exec[r])); });
    return t[batches / 2];
  }

 private:
  static int iterations(std::size_t count) {
    const double bytes = static_cast<double>(count) * 4;
    // About 20 ms per batch at ~300 GB/s, between 5 and 200 operations.
    return static_cast<int>(std::clamp(20e-3 * 300e9 / std::max(bytes, 1.0), 5.0, 200.0));
  }

  Group& g_;
  Buffers& b_;
  std::vector<cudaEvent_t> start_ = std::vector<cudaEvent_t>(nranks);
  std::vector<cudaEvent_t> stop_ = std::vector<cudaEvent_t>(nranks);
};

GroupOp ours(Group& g, Buffers& b, bool oneshot, int nblocks) {
  return [&g, &b, oneshot, nblocks](std::size_t count) {
    g.each([&](int r) {
      auto s = reinterpret_cast<coccl::kernels::stream_t>(g.stream(r));
      const int rc = oneshot
                         ? coccl::kernels::all_reduce_oneshot(
                               b.send[r].get(), b.recv[r].get(), count, coccl::DataType::float32,
                               coccl::ReduceOp::sum, g.workspace(r), s, nblocks)
                         : coccl::kernels::all_reduce_twoshot(
                               b.send[r].get(), b.recv[r].get(), count, coccl::DataType::float32,
                               coccl::ReduceOp::sum, g.workspace(r), s, nblocks);
      COCCL_CUDA_CHECK(rc);
    });
  };
}

std::string human(std::size_t bytes) {
  char buf[32];
  if (bytes >= (1u << 30)) {
    std::snprintf(buf, sizeof buf, "%zuG", bytes >> 30);
  } else if (bytes >= (1u << 20)) {
    std::snprintf(buf, sizeof buf, "%zuM", bytes >> 20);
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%zuK", bytes >> 10);
  } else {
    std::snprintf(buf, sizeof buf, "%zu", bytes);
  }
  return buf;
}

double busbw(std::size_t bytes, double us) {
  return us > 0 ? static_cast<double>(bytes) / (us * 1e3) * 2.0 * (nranks - 1) / nranks : 0;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // never NVLink multicast on shared machines
  std::size_t max_bytes = std::size_t{1} << 30;
  if (argc > 1) max_bytes = std::strtoull(argv[1], nullptr, 0);
  if (argc > 2) nranks = std::atoi(argv[2]);
  if (nranks < 2 || nranks > coccl::device::max_ranks) {
    std::fprintf(stderr, "usage: gpu_kernels_bench [MAX_BYTES [NRANKS (2..8)]]\n");
    return 2;
  }
  if (coccl::gpu_test::gpu_count() < nranks || !coccl::gpu_test::enable_peers(nranks)) {
    std::printf("gpu_kernels_bench: needs %d GPUs with peer access; skipped\n", nranks);
    return 0;
  }
  Group g(nranks, coccl::device::default_oneshot_max_bytes, coccl::device::default_staging_bytes);
  Group g_small(nranks, coccl::device::default_oneshot_max_bytes, 32u << 20);
  Group g_big(nranks, coccl::device::default_oneshot_max_bytes, 128u << 20);
  Group g_huge(nranks, coccl::device::default_oneshot_max_bytes, 256u << 20);

  Buffers b;
  {
    std::vector<float> host(max_bytes / 4);
    for (int r = 0; r < nranks; ++r) {
      for (std::size_t i = 0; i < host.size(); ++i) host[i] = input_value(i, r);
      b.send.emplace_back(r, max_bytes);
      b.send.back().upload(host.data(), max_bytes);
      b.recv.emplace_back(r, max_bytes);
    }
  }

  Nccl nccl;
  const bool have_nccl = nccl.load();
  std::vector<nccl_comm_t> comms(nranks);
  if (have_nccl) {
    int version = 0;
    nccl.get_version(&version);
    std::vector<int> devs(nranks);
    for (int r = 0; r < nranks; ++r) devs[r] = r;
    NCCL_CHECK(nccl, nccl.comm_init_all(comms.data(), nranks, devs.data()));
    std::printf("# NCCL %d loaded, NCCL_NVLS_ENABLE=%s\n", version,
                std::getenv("NCCL_NVLS_ENABLE"));
  }
  GroupOp nccl_op = [&](std::size_t count) {
    NCCL_CHECK(nccl, nccl.group_start());
    for (int r = 0; r < nranks; ++r) {
      COCCL_CUDA_CHECK(cudaSetDevice(r));
      NCCL_CHECK(nccl, nccl.all_reduce(b.send[r].get(), b.recv[r].get(), count, 7, 0, comms[r],
                                       g.stream(r)));
    }
    NCCL_CHECK(nccl, nccl.group_end());
  };

  Bench bench(g, b);
  Bench bench_small(g_small, b);
  Bench bench_big(g_big, b);
  Bench bench_huge(g_huge, b);
  bool ok = true;

  // Two-shot tuning sweep: blocks x staging (slice = staging / (128 blocks * 2 * nranks)).
  std::printf("\n# two-shot sweep, %d GPUs, eager, busbw GB/s (slice = staging / (256 x %d))\n",
              nranks, nranks);
  std::printf("%8s %8s %7s %7s %7s %7s\n", "size", "staging", "b=32", "b=64", "b=96", "b=128");
  for (std::size_t bytes : {std::size_t{32} << 20, std::size_t{256} << 20, std::size_t{1} << 30}) {
    if (bytes > max_bytes) continue;
    for (int which = 0; which < 4; ++which) {
      Group* groups[] = {&g_small, &g, &g_big, &g_huge};
      Bench* benches[] = {&bench_small, &bench, &bench_big, &bench_huge};
      const char* names[] = {"32M", "64M", "128M", "256M"};
      std::printf("%8s %8s", human(bytes).c_str(), names[which]);
      for (int nb : {32, 64, 96, 128}) {
        auto op = ours(*groups[which], b, false, nb);
        if (!benches[which]->verify(op, bytes / 4)) ok = false;
        std::printf(" %7.1f", busbw(bytes, benches[which]->time(op, bytes / 4, false, false)));
        std::fflush(stdout);
      }
      std::printf("\n");
    }
  }

  for (int graph = 0; graph < 2; ++graph) {
    std::printf("\n# all_reduce float32 sum, %d GPUs, %s; times in us, busbw in GB/s\n", nranks,
                graph ? "CUDA graphs" : "eager launches");
    std::printf("%8s %9s %9s %9s %9s %8s %8s %8s %8s\n", "size", "1shot", "2shot", "2shot-128M",
                "nccl", "ours_bw", "nccl_bw", "best_bw", "speedup");
    for (std::size_t bytes :
         {std::size_t{8}, std::size_t{32}, std::size_t{128}, std::size_t{512}, std::size_t{2} << 10,
          std::size_t{8} << 10, std::size_t{32} << 10, std::size_t{128} << 10,
          std::size_t{256} << 10, std::size_t{512} << 10, std::size_t{2} << 20,
          std::size_t{8} << 20, std::size_t{32} << 20, std::size_t{128} << 20,
          std::size_t{256} << 20, std::size_t{512} << 20, std::size_t{1} << 30}) {
      if (bytes > max_bytes) continue;
      const std::size_t count = bytes / 4;
      double t1 = 0;
      if (bytes <= coccl::device::default_oneshot_max_bytes) {
        auto op = ours(g, b, true, 0);
        if (!bench.verify(op, count)) ok = false;
        t1 = bench.time(op, count, graph, false);
      }
      auto op2 = ours(g, b, false, 0);
      if (!bench.verify(op2, count)) ok = false;
      const double t2 = bench.time(op2, count, graph, false);
      auto op3 = ours(g_big, b, false, 0);
      if (!bench_big.verify(op3, count)) ok = false;
      const double t3 = bench_big.time(op3, count, graph, false);
      double tn = 0;
      if (have_nccl) {
        if (!bench.verify(nccl_op, count)) ok = false;
        tn = bench.time(nccl_op, count, graph, true);
      }
      const double mine = t1 > 0 ? std::min(t1, t2) : t2;
      const double best = std::min(mine, t3);
      std::printf("%8s %9.2f %9.2f %9.2f %9.2f %8.1f %8.1f %8.1f %8.2f\n", human(bytes).c_str(), t1,
                  t2, t3, tn, busbw(bytes, mine), busbw(bytes, tn), busbw(bytes, best),
                  tn > 0 ? tn / mine : 0.0);
      std::fflush(stdout);
    }
  }
  if (have_nccl) {
    for (int r = 0; r < nranks; ++r) nccl.comm_destroy(comms[r]);
  }
  std::printf("\n# verification %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
