// Device collectives through the public API: one process per GPU (CUDA IPC) and several GPUs in
// one process (peer access), every supported collective against the reference of coccl-perf's
// check, CUDA graph capture replayed 100 times with new inputs each time, and the awaitable form.
// Skips without two GPUs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/coccl.hpp>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tools/perf_data.hpp"

namespace {

using coccl::DataType;
using coccl::ReduceOp;

int gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

#define CHECK_CUDA(call)                                                                    \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("FAIL %s: %s\n", #call, cudaGetErrorString(e_));                          \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

struct Buffers {
  void* send = nullptr;
  void* recv = nullptr;
  ~Buffers() {
    cudaFree(send);
    cudaFree(recv);
  }
};

// Runs one collective (device form) and counts wrong elements against the reference.
long long run_one(coccl::Communicator& comm, const std::string& coll, DataType type, ReduceOp op,
                  std::size_t count, bool in_place, cudaStream_t st, Buffers& b) {
  const int n = comm.size(), rank = comm.rank();
  const std::size_t elt = coccl::size_of(type);
  perf::Options o;
  o.type = type;
  o.op = op;
  std::size_t send_elems = count, recv_elems = count;
  if (coll == "allgather") recv_elems = count * n;
  if (coll == "reducescatter") send_elems = count * n;
  if (coll == "alltoall") send_elems = recv_elems = count * n;
  std::vector<unsigned char> hs(send_elems * elt + 1), hr(recv_elems * elt + 1, 0xcd);
  perf::fill(coll, o, count, n, rank, hs.data(), nullptr, false);
  char* recv = static_cast<char*>(b.recv);
  char* send = static_cast<char*>(b.send);
  if (in_place) send = coll == "allgather" ? recv + rank * count * elt : recv;
  // On the collective's stream: a plain cudaMemcpy runs on the legacy stream, which a
  // non-blocking stream does not wait for.
  cudaMemcpyAsync(recv, hr.data(), recv_elems * elt, cudaMemcpyHostToDevice, st);
  cudaMemcpyAsync(send, hs.data(), send_elems * elt, cudaMemcpyHostToDevice, st);
  auto cs = reinterpret_cast<coccl::cuda_stream>(st);
  if (coll == "allreduce") comm.all_reduce(send, recv, count, type, op, cs);
  else if (coll == "allgather") comm.all_gather(send, recv, count, type, cs);
  else if (coll == "reducescatter") comm.reduce_scatter(send, recv, count, type, op, cs);
  else comm.all_to_all(send, recv, count, type, cs);
  cudaStreamSynchronize(st);
  cudaMemcpy(hr.data(), recv, recv_elems * elt, cudaMemcpyDeviceToHost);
  return perf::count_wrong(coll, o, count, n, rank, hr.data());
}

int rank_main(int rank, int n, const std::string& id_hex) {
  CHECK_CUDA(cudaSetDevice(rank));
  auto comm = coccl::Communicator::create(coccl::UniqueId::from_string(id_hex), rank, n);
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Buffers b;
  const std::size_t big = 8u << 20;
  CHECK_CUDA(cudaMalloc(&b.send, big));
  CHECK_CUDA(cudaMalloc(&b.recv, big));
  long long wrong = 0;
  int cases = 0;
  auto record = [&](long long w, const char* what, DataType t, ReduceOp op, std::size_t c,
                    bool ip) {
    ++cases;
    if (w) {
      std::printf("FAIL rank=%d %s type=%s op=%s count=%zu in_place=%d wrong=%lld\n", rank, what,
                  std::string(coccl::to_string(t)).c_str(),
                  std::string(coccl::to_string(op)).c_str(), c, ip, w);
      wrong += w;
    }
  };
  // all_reduce: every type and op, one-shot and two-shot sizes, in and out of place.
  for (int t = 0; t < coccl::data_type_count; ++t)
    for (int o = 0; o < coccl::reduce_op_count; ++o)
      for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{1023},
                                std::size_t{300001}})
        for (bool ip : {false, true}) {
          auto type = static_cast<DataType>(t);
          auto op = static_cast<ReduceOp>(o);
          record(run_one(comm, "allreduce", type, op, count, ip, st, b), "allreduce", type, op,
                 count, ip);
        }
  for (const char* coll : {"allgather", "reducescatter", "alltoall"})
    for (DataType type : {DataType::float32, DataType::bfloat16, DataType::int8, DataType::float64})
      for (std::size_t count : {std::size_t{1}, std::size_t{1023}, std::size_t{70001}})
        for (bool ip : {false, true}) {
          if (ip && std::string(coll) != "allgather") continue;
          record(run_one(comm, coll, type, ReduceOp::sum, count, ip, st, b), coll, type,
                 ReduceOp::sum, count, ip);
        }
  // Graph: one all_reduce captured, replayed 100 times, new inputs before every replay.
  {
    const std::size_t count = 4099;
    std::vector<float> host(count), out(count);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    auto cs = reinterpret_cast<coccl::cuda_stream>(st);
    CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    comm.all_reduce(b.send, b.recv, count, DataType::float32, ReduceOp::sum, cs);
    CHECK_CUDA(cudaStreamEndCapture(st, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 100; ++replay) {
      for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>((rank + 1) * (replay + i % 5));
      CHECK_CUDA(cudaMemcpyAsync(b.send, host.data(), count * 4, cudaMemcpyHostToDevice, st));
      CHECK_CUDA(cudaGraphLaunch(exec, st));
      CHECK_CUDA(cudaMemcpyAsync(out.data(), b.recv, count * 4, cudaMemcpyDeviceToHost, st));
      CHECK_CUDA(cudaStreamSynchronize(st));
      long long bad = 0;
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += static_cast<float>((r + 1) * (replay + i % 5));
        bad += out[i] != want;
      }
      record(bad, "graph-replay", DataType::float32, ReduceOp::sum, count, false);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  // The awaitable form resumes once the GPU is done.
  {
    const std::size_t count = 1 << 20;
    std::vector<int> host(count, rank + 1), out(count, 0);
    CHECK_CUDA(cudaMemcpyAsync(b.send, host.data(), count * 4, cudaMemcpyHostToDevice, st));
    CHECK_CUDA(cudaStreamSynchronize(st));
    boost::asio::io_context io;
    std::error_code result = coccl::make_error_code(coccl::errc::internal);
    auto task = [&]() -> boost::asio::awaitable<void> {
      result = co_await comm.async_all_reduce(b.send, b.recv, count, DataType::int32,
                                              ReduceOp::sum,
                                              reinterpret_cast<coccl::cuda_stream>(st),
                                              boost::asio::use_awaitable);
      // No synchronisation here: completion means the data is there.
      cudaMemcpy(out.data(), b.recv, count * 4, cudaMemcpyDeviceToHost);
    };
    boost::asio::co_spawn(io, task, boost::asio::detached);
    io.run();
    long long bad = result ? 1 : 0;
    for (int v : out) bad += v != n * (n + 1) / 2;
    record(bad, "async", DataType::int32, ReduceOp::sum, count, false);
  }
  std::printf("rank %d: %d cases, %lld wrong\n", rank, cases, wrong);
  cudaStreamDestroy(st);
  comm.destroy();
  return wrong ? 1 : 0;
}

std::string self_exe() {
  char buf[4096];
  ssize_t k = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  buf[k > 0 ? k : 0] = 0;
  return buf;
}

TEST(DeviceCollectives, OneProcessPerGpuMatchReferenceReplayInGraphsAndAwait) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto id = coccl::UniqueId::create();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    std::string exe = self_exe(), rs = std::to_string(r), hex = id.to_string();
    std::vector<char*> argv{exe.data(), const_cast<char*>("--rank"), rs.data(),
                            const_cast<char*>("2"), hex.data(), nullptr};
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

TEST(DeviceCollectives, SeveralGpusInOneProcessMatchReference) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto id = coccl::UniqueId::create();
  std::vector<int> rc(2, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] { rc[r] = rank_main(r, 2, id.to_string()); });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(rc[0], 0);
  EXPECT_EQ(rc[1], 0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--rank")
    return rank_main(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
