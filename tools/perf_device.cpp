// coccl-perf's device sweep; see perf_device.hpp.
#include "perf_device.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "nccl_runtime.hpp"
#include "perf_progress.hpp"

namespace perf {
namespace {

#define PERF_CUDA(call)                                                            \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "coccl-perf: %s: %s\n", #call, cudaGetErrorString(e_)); \
      throw std::runtime_error("CUDA error");                                      \
    }                                                                              \
  } while (0)

using coccl_tools::Nccl;
using coccl_tools::nccl_comm;
using coccl_tools::NcclId;

bool device_coll(const std::string& c) {
  return c == "allreduce" || c == "allgather" || c == "reducescatter" || c == "alltoall" ||
         c == "broadcast" || c == "reduce" || c == "gather" || c == "scatter";
}

struct Shape {
  std::size_t count, send_elems, recv_elems, bytes;
  double bus;
};

Shape shape(const std::string& c, std::size_t bytes, std::size_t elt, int n) {
  std::size_t total = bytes / elt, per = total / n;
  double nf = n;
  if (c == "allreduce") return {total, total, total, total * elt, 2 * (nf - 1) / nf};
  if (c == "allgather") return {per, per, per * n, per * n * elt, (nf - 1) / nf};
  if (c == "reducescatter") return {per, per * n, per, per * n * elt, (nf - 1) / nf};
  if (c == "broadcast" || c == "reduce") return {total, total, total, total * elt, 1};
  if (c == "gather") return {per, per, per * n, per * n * elt, (nf - 1) / nf};
  if (c == "scatter") return {per, per * n, per, per * n * elt, (nf - 1) / nf};
  return {per, per * n, per * n, per * n * elt, (nf - 1) / nf};  // alltoall
}

struct Result {
  double us = 0;
  long long wrong = 0;
};

// Enqueues one operation of library `which` (0 coccl, 1 nccl).
void enqueue(int which, const std::string& c, const Options& o, const Shape& s, const void* send,
             void* recv, coccl::Communicator& comm, Nccl& nccl, nccl_comm nc, cudaStream_t st) {
  int rc = 0;
  if (which == 0) {
    auto cs = reinterpret_cast<coccl::cuda_stream>(st);
    if (c == "allreduce")
      comm.all_reduce(send, recv, s.count, o.type, o.op, cs);
    else if (c == "allgather")
      comm.all_gather(send, recv, s.count, o.type, cs);
    else if (c == "reducescatter")
      comm.reduce_scatter(send, recv, s.count, o.type, o.op, cs);
    else if (c == "broadcast")
      comm.broadcast(send, recv, s.count, o.type, o.root, cs);
    else if (c == "reduce")
      comm.reduce(send, recv, s.count, o.type, o.op, o.root, cs);
    else if (c == "gather")
      comm.gather(send, recv, s.count, o.type, o.root, cs);
    else if (c == "scatter")
      comm.scatter(send, recv, s.count, o.type, o.root, cs);
    else
      comm.all_to_all(send, recv, s.count, o.type, cs);
    return;
  }
  int t = static_cast<int>(o.type), op = static_cast<int>(o.op);
  if (c == "allreduce")
    rc = nccl.all_reduce(send, recv, s.count, t, op, nc, st);
  else if (c == "allgather")
    rc = nccl.all_gather(send, recv, s.count, t, nc, st);
  else if (c == "reducescatter")
    rc = nccl.reduce_scatter(send, recv, s.count, t, op, nc, st);
  else if (c == "broadcast")
    rc = nccl.broadcast(send, recv, s.count, t, o.root, nc, st);
  else if (c == "reduce")
    rc = nccl.reduce(send, recv, s.count, t, op, o.root, nc, st);
  else if (c == "gather" || c == "scatter") {
    // As nccl-tests does it: the root sends or receives every slice in one group.
    const int n = comm.size();
    const std::size_t b = s.count * coccl::size_of(o.type);
    const bool root = comm.rank() == o.root;
    nccl.group_start();
    if (c == "gather") {
      nccl.send(send, s.count, t, o.root, nc, st);
      if (root) {
        for (int p = 0; p < n; ++p)
          nccl.recv(static_cast<char*>(recv) + p * b, s.count, t, p, nc, st);
      }
    } else {
      if (root) {
        for (int p = 0; p < n; ++p)
          nccl.send(static_cast<const char*>(send) + p * b, s.count, t, p, nc, st);
      }
      nccl.recv(recv, s.count, t, o.root, nc, st);
    }
    rc = nccl.group_end();
  } else {
    const int n = comm.size();
    const std::size_t b = s.count * coccl::size_of(o.type);
    nccl.group_start();
    for (int p = 0; p < n; ++p) {
      nccl.send(static_cast<const char*>(send) + p * b, s.count, t, p, nc, st);
      nccl.recv(static_cast<char*>(recv) + p * b, s.count, t, p, nc, st);
    }
    rc = nccl.group_end();
  }
  if (rc != 0) throw std::runtime_error("NCCL call failed with " + std::to_string(rc));
}

Result measure(int which, const std::string& c, const Options& o, const Shape& s, void* send,
               void* recv, coccl::Communicator& comm, Nccl& nccl, nccl_comm nc, cudaStream_t st) {
  Result r;
  const int n = comm.size(), rank = comm.rank();
  const std::size_t elt = coccl::size_of(o.type);
  if (o.check) {
    std::vector<unsigned char> hs(std::max<std::size_t>(1, s.send_elems * elt)),
        hr(std::max<std::size_t>(1, s.recv_elems * elt), 0xcd);
    fill(c, o, s.count, n, rank, hs.data(), nullptr, false);
    // On the benchmark's stream: it is non-blocking, so it would not wait for a plain cudaMemcpy.
    PERF_CUDA(cudaMemcpyAsync(send, hs.data(), s.send_elems * elt, cudaMemcpyHostToDevice, st));
    PERF_CUDA(cudaMemcpyAsync(recv, hr.data(), s.recv_elems * elt, cudaMemcpyHostToDevice, st));
    enqueue(which, c, o, s, send, recv, comm, nccl, nc, st);
    PERF_CUDA(cudaStreamSynchronize(st));
    PERF_CUDA(cudaMemcpy(hr.data(), recv, s.recv_elems * elt, cudaMemcpyDeviceToHost));
    long long wrong = count_wrong(c, o, s.count, n, rank, hr.data());
    comm.all_reduce(&wrong, &wrong, 1, coccl::DataType::int64, coccl::ReduceOp::sum);
    r.wrong = wrong;
  }
  for (int i = 0; i < o.warmup; ++i) enqueue(which, c, o, s, send, recv, comm, nccl, nc, st);
  cudaGraphExec_t exec = nullptr;
  if (o.graph) {
    cudaGraph_t graph;
    PERF_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < o.iters; ++i) enqueue(which, c, o, s, send, recv, comm, nccl, nc, st);
    PERF_CUDA(cudaStreamEndCapture(st, &graph));
    PERF_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    PERF_CUDA(cudaGraphDestroy(graph));
    PERF_CUDA(cudaGraphLaunch(exec, st));
  }
  PERF_CUDA(cudaStreamSynchronize(st));
  cudaEvent_t start, stop;
  PERF_CUDA(cudaEventCreate(&start));
  PERF_CUDA(cudaEventCreate(&stop));
  std::vector<double> batches;
  for (int b = 0; b < o.repeat; ++b) {
    comm.barrier();
    PERF_CUDA(cudaEventRecord(start, st));
    if (exec) {
      PERF_CUDA(cudaGraphLaunch(exec, st));
    } else {
      for (int i = 0; i < o.iters; ++i) enqueue(which, c, o, s, send, recv, comm, nccl, nc, st);
    }
    PERF_CUDA(cudaEventRecord(stop, st));
    PERF_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    PERF_CUDA(cudaEventElapsedTime(&ms, start, stop));
    double us = ms * 1e3 / o.iters;
    comm.all_reduce(&us, &us, 1, coccl::DataType::float64, coccl::ReduceOp::max);
    batches.push_back(us);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (exec) cudaGraphExecDestroy(exec);
  std::sort(batches.begin(), batches.end());
  r.us = batches[batches.size() / 2];
  return r;
}

}  // namespace

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int run_device(coccl::Communicator comm, const Options& o) {
  const int n = comm.size(), rank = comm.rank();
  int status = 0;
  try {
    PERF_CUDA(cudaSetDevice(rank % gpu_count()));
    cudaStream_t st;
    PERF_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    Nccl nccl;
    nccl_comm nc = nullptr;
    bool with_nccl = std::find(o.baselines.begin(), o.baselines.end(), "nccl") != o.baselines.end();
    int nccl_version = 0;
    if (with_nccl) {
      if (!nccl.load()) throw std::runtime_error("cannot load libnccl.so.2");
      NcclId id{};
      if (rank == 0 && nccl.get_unique_id(&id) != 0) throw std::runtime_error("ncclGetUniqueId");
      comm.broadcast(&id, &id, sizeof id, coccl::DataType::uint8, 0);
      if (nccl.init_rank(&nc, n, id, rank) != 0) throw std::runtime_error("ncclCommInitRank");
      nccl.get_version(&nccl_version);
    }
    const std::size_t elt = coccl::size_of(o.type);
    std::size_t most = o.max_bytes + 4096;
    void *send = nullptr, *recv = nullptr;
    PERF_CUDA(cudaMalloc(&send, most));
    PERF_CUDA(cudaMalloc(&recv, most));
    if (rank == 0) {
      std::printf(
          "# coccl-perf: %d ranks, device memory (one GPU per process)%s, %s, %s, iters "
          "%d, warmup %d, median of %d%s\n",
          n, o.graph ? ", CUDA graphs" : "", std::string(coccl::to_string(o.type)).c_str(),
          std::string(coccl::to_string(o.op)).c_str(), o.iters, o.warmup, o.repeat,
          with_nccl ? (", NCCL " + std::to_string(nccl_version) + " in the same run").c_str() : "");
    }
    // For --plot and --json in the process that started the ranks: coccl's rows, and NCCL's as
    // collective "nccl/COLL".
    const char* results_path = std::getenv("COCCL_PERF_RESULTS");
    std::ofstream results;
    if (rank == 0 && results_path) results.open(results_path);
    double bus_sum = 0;
    int bus_n = 0;
    for (const std::string& c : o.colls) {
      if (!device_coll(c)) {
        if (rank == 0) std::printf("#\n# %s: not available on device memory yet\n", c.c_str());
        continue;
      }
      if (rank == 0) {
        std::printf("#\n# %s (out-of-place)\n", c.c_str());
        std::printf("# %12s %12s %10s %8s %8s %6s", "size(B)", "count", "time(us)", "algbw",
                    "busbw", "#wrong");
        if (with_nccl) std::printf(" %10s %8s %6s %8s", "nccl(us)", "busbw", "#wrong", "speedup");
        std::printf("\n");
      }
      for (double b = static_cast<double>(o.min_bytes); b <= static_cast<double>(o.max_bytes);
           b = std::max(b * o.factor, b + 1)) {
        Shape s = shape(c, static_cast<std::size_t>(b), elt, n);
        if (s.count == 0) continue;
        if (rank == 0) progress(c + " " + std::to_string(s.bytes) + " B");
        Result mine = measure(0, c, o, s, send, recv, comm, nccl, nc, st);
        Result theirs;
        if (with_nccl) theirs = measure(1, c, o, s, send, recv, comm, nccl, nc, st);
        status |= (mine.wrong || theirs.wrong) ? 1 : 0;
        if (rank == 0) {
          progress_done();
          double algbw = s.bytes / mine.us / 1e3, busbw = algbw * s.bus;
          bus_sum += busbw;
          ++bus_n;
          std::printf("  %12zu %12zu %10.2f %8.2f %8.2f %6lld", s.bytes, s.count, mine.us, algbw,
                      busbw, mine.wrong);
          if (with_nccl)
            std::printf(" %10.2f %8.2f %6lld %8.2f", theirs.us, s.bytes / theirs.us / 1e3 * s.bus,
                        theirs.wrong, theirs.us / mine.us);
          std::printf("\n");
          std::fflush(stdout);
          results << c << ' ' << s.bytes << ' ' << s.count << ' ' << mine.us << " 0 " << mine.wrong
                  << " 0\n";
          if (with_nccl)
            results << "nccl/" << c << ' ' << s.bytes << ' ' << s.count << ' ' << theirs.us << " 0 "
                    << theirs.wrong << " 0\n";
        }
      }
    }
    if (rank == 0) progress_done();
    if (rank == 0) std::printf("# Avg bus bandwidth    : %g\n#\n", bus_n ? bus_sum / bus_n : 0.0);
    if (nc) nccl.destroy(nc);
    cudaFree(send);
    cudaFree(recv);
    cudaStreamDestroy(st);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coccl-perf rank %d: %s (%s)\n", rank, e.what(),
                 comm.last_error().c_str());
    status = 1;
  }
  comm.destroy();
  return status;
}

}  // namespace perf
