// Device operations issued concurrently (GitHub issue 12): one communicator's operations spread
// over several CUDA streams complete in call order and honour the user's own cross-stream
// dependencies; two communicators used at once on two streams, issued in opposite orders by even
// and odd ranks, never deadlock; a kernel that waits past COCCL_TIMEOUT for a peer returns, fails
// its communicator with errc::timed_out and leaves the CUDA context usable.
// Ranks are processes (one GPU each where the machine has enough, else sharing GPUs under MPS) or
// threads of this process. Every result is checked exactly against a host reference (int32 data).
// Skips without a GPU, and the processes sharing a GPU without MPS.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <coccl/coccl.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "tests/gpu/mps.hpp"
#include "tests/gpu/random_ops.hpp"
#include "tests/gpu/ranks.hpp"

namespace {

using coccl::Communicator;
using coccl::DataType;
using coccl::ReduceOp;
namespace gt = coccl::gpu_test;

// A rank body that reports an exception (a failed communicator throws) as a failure.
template <gt::RankMain Body>
int guarded(int rank, int n, const std::string& id_hex) {
  try {
    return Body(rank, n, id_hex);
  } catch (const std::exception& e) {
    std::printf("FAIL rank=%d: %s\n", rank, e.what());
    return 1;
  }
}

// Checks of one rank, printed as they fail and counted.
struct Checks {
  explicit Checks(int r) : rank(r) {}
  int rank;
  int done = 0, failed = 0;
  void expect(bool ok, const std::string& what) {
    ++done;
    if (!ok) {
      ++failed;
      std::printf("FAIL rank=%d: %s\n", rank, what.c_str());
    }
  }
  int report() const {
    std::printf("rank %d: %d checks, %d failed\n", rank, done, failed);
    return failed == 0 ? 0 : 1;
  }
};

cudaStream_t new_stream(unsigned flags = cudaStreamNonBlocking, int priority = 0) {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithPriority(&s, flags, priority) != cudaSuccess) {
    std::printf("FAIL cudaStreamCreateWithPriority\n");
    std::abort();
  }
  return s;
}

coccl::cuda_stream as_coccl(cudaStream_t s) { return reinterpret_cast<coccl::cuda_stream>(s); }

// cudaMalloc of `elems` int32.
cudaError_t alloc_int32(std::int32_t** p, std::size_t elems) {
  return cudaMalloc(reinterpret_cast<void**>(p), elems * sizeof(std::int32_t));
}

// ---- One communicator, operations on random streams ----

using gt::Batch;
using gt::Op;
using gt::ops_per_batch;
using gt::pick;
using gt::plan;
using gt::total_ops;

// 1,000 device operations in batches of 25, each batch with its own arena: every rank issues the
// same operations in the same order, but each on a stream of its own random choice (2 to 4
// streams of different priorities, one of them blocking), and waits (cudaStreamWaitEvent) where
// an input is produced on another stream, directly or through a cudaMemcpyAsync that only the
// user's events order, plus random waits that order nothing. The whole arena (outputs, inputs
// and the gaps) must equal the host reference after each batch.
int stream_order_main(int rank, int n, const std::string& id_hex) {
  CHECK_CUDA(cudaSetDevice(gt::gpu_of(rank)));
  auto comm = Communicator::create(coccl::UniqueId::from_string(id_hex), rank, n);
  std::mt19937_64 shared(12), mine(1000 + static_cast<unsigned>(rank));
  const std::vector<Batch> batches = plan(shared, n);
  std::size_t arena_elems = 0;
  for (const Batch& b : batches) arena_elems = std::max(arena_elems, b.elems);
  int least = 0, greatest = 0;
  CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const cudaStream_t streams[4] = {new_stream(), new_stream(cudaStreamNonBlocking, greatest),
                                   new_stream(cudaStreamDefault),
                                   new_stream(cudaStreamNonBlocking, least)};
  std::vector<cudaEvent_t> done(ops_per_batch), copied(ops_per_batch), ended(4);
  cudaEvent_t started;
  CHECK_CUDA(cudaEventCreateWithFlags(&started, cudaEventDisableTiming));
  for (auto* v : {&done, &copied, &ended})
    for (cudaEvent_t& e : *v) CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::int32_t* arena = nullptr;
  CHECK_CUDA(alloc_int32(&arena, arena_elems));
  long long wrong = 0;
  int issued = 0, crossings = 0;  // crossings: inputs produced on another stream
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const Batch& batch = batches[b];
    auto ref = initial_arenas(batch, static_cast<int>(b), n);
    const std::size_t bytes = batch.elems * sizeof(std::int32_t);
    CHECK_CUDA(cudaMemcpyAsync(arena, ref[rank].data(), bytes, cudaMemcpyHostToDevice, streams[0]));
    CHECK_CUDA(cudaEventRecord(started, streams[0]));
    for (int s = 1; s < batch.streams; ++s) CHECK_CUDA(cudaStreamWaitEvent(streams[s], started, 0));
    std::vector<int> stream_of(batch.ops.size());
    for (std::size_t i = 0; i < batch.ops.size(); ++i) {
      const Op& o = batch.ops[i];
      const int s = static_cast<int>(pick(mine, 0, batch.streams - 1));
      if (o.source >= 0) {
        int from = stream_of[o.source];
        cudaEvent_t ready = done[o.source];
        if (o.staged) {
          const int c = static_cast<int>(pick(mine, 0, batch.streams - 1));
          if (c != from) CHECK_CUDA(cudaStreamWaitEvent(streams[c], ready, 0));
          CHECK_CUDA(cudaMemcpyAsync(arena + o.in, arena + o.from, in_elems(o, n) * 4,
                                     cudaMemcpyDeviceToDevice, streams[c]));
          CHECK_CUDA(cudaEventRecord(copied[i], streams[c]));
          from = c;
          ready = copied[i];
        }
        if (from != s) {
          CHECK_CUDA(cudaStreamWaitEvent(streams[s], ready, 0));
          ++crossings;
        }
      }
      if (i > 0 && pick(mine, 0, 3) == 0)
        CHECK_CUDA(cudaStreamWaitEvent(streams[s], done[pick(mine, 0, i - 1)], 0));
      issue(comm, o, arena, streams[s]);
      CHECK_CUDA(cudaEventRecord(done[i], streams[s]));
      stream_of[i] = s;
      ++issued;
    }
    for (int s = 1; s < batch.streams; ++s) {
      CHECK_CUDA(cudaEventRecord(ended[s], streams[s]));
      CHECK_CUDA(cudaStreamWaitEvent(streams[0], ended[s], 0));
    }
    std::vector<std::int32_t> got(batch.elems);
    // Synchronised first: with ranks as threads of one process a pageable copy queued behind a
    // waiting collective blocks the peers' own pageable copies (docs/design.md, Concurrency).
    CHECK_CUDA(cudaStreamSynchronize(streams[0]));
    CHECK_CUDA(cudaMemcpyAsync(got.data(), arena, bytes, cudaMemcpyDeviceToHost, streams[0]));
    CHECK_CUDA(cudaStreamSynchronize(streams[0]));
    for (const Op& o : batch.ops) apply(o, n, ref);
    for (std::size_t i = 0; i < batch.ops.size(); ++i) {
      const Op& o = batch.ops[i];
      long long bad = 0;
      for (std::size_t e = 0; e < out_elems(o, n); ++e)
        bad += got[o.out + e] != ref[rank][o.out + e];
      if (bad)
        std::printf("FAIL rank=%d batch=%zu op=%zu %s count=%zu source=%d staged=%d wrong=%lld\n",
                    rank, b, i, name_of(o.kind), o.count, o.source, o.staged, bad);
    }
    long long bad = 0;
    for (std::size_t e = 0; e < batch.elems; ++e) bad += got[e] != ref[rank][e];
    wrong += bad;
  }
  std::printf(
      "rank %d: %d operations in %zu batches, %d inputs from another stream, %lld wrong "
      "elements\n",
      rank, issued, batches.size(), crossings, wrong);
  cudaFree(arena);
  for (auto* v : {&done, &copied, &ended})
    for (cudaEvent_t e : *v) cudaEventDestroy(e);
  cudaEventDestroy(started);
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
  comm.destroy();
  return wrong == 0 && issued == total_ops && crossings > 0 ? 0 : 1;
}

// ---- Two communicators at once ----

// Rank r's input element j of communicator c in round q (0: the first all_reduce).
std::int32_t input(int c, int r, int q, std::size_t j) {
  const std::size_t k = static_cast<std::size_t>(r * 13 + q * 5 + c * 11) + j * 7;
  return static_cast<std::int32_t>(k % 61) - 30;
}

// Communicators A and B over the same ranks (B split from A), A used on stream 1 and B on
// stream 2. In each of 50 rounds every rank issues 4 all_reduces of 8 MiB on each, even ranks A
// then B, odd ranks B then A, each iteration k reading its input from element k on (so that every
// result differs), then checks all 8 results.
int two_communicators_main(int rank, int n, const std::string& id_hex) {
  Checks checks{rank};
  CHECK_CUDA(cudaSetDevice(gt::gpu_of(rank)));
  Communicator a = Communicator::create(coccl::UniqueId::from_string(id_hex), rank, n);
  Communicator comms[2] = {a, a.split(0, rank)};
  constexpr std::size_t count = 2u << 20;  // int32: 8 MiB per rank
  constexpr int per_round = 4, rounds = 50;
  const cudaStream_t streams[2] = {new_stream(), new_stream()};
  std::int32_t *in[2], *out[2];
  for (int c = 0; c < 2; ++c) {
    CHECK_CUDA(alloc_int32(&in[c], count + per_round));
    CHECK_CUDA(alloc_int32(&out[c], per_round * count));
  }
  std::vector<std::int32_t> host_in(count + per_round), host_out(per_round * count),
      want(count + per_round);
  auto upload = [&](int c, int q) {
    for (std::size_t j = 0; j < host_in.size(); ++j) host_in[j] = input(c, rank, q, j);
    return cudaMemcpyAsync(in[c], host_in.data(), host_in.size() * 4, cudaMemcpyHostToDevice,
                           streams[c]);
  };
  // What iteration k of communicator c in round q must produce: element i is want[k + i].
  auto expected = [&](int c, int q) {
    for (std::size_t j = 0; j < want.size(); ++j) {
      want[j] = 0;
      for (int r = 0; r < n; ++r) want[j] += input(c, r, q, j);
    }
  };
  // The first device call of a communicator is collective and blocking (it sets up the
  // workspaces): every rank makes A's, then B's.
  for (int c = 0; c < 2; ++c) {
    CHECK_CUDA(upload(c, 0));
    comms[c].all_reduce(in[c], out[c], 1024, DataType::int32, ReduceOp::sum, as_coccl(streams[c]));
    CHECK_CUDA(cudaStreamSynchronize(streams[c]));
    CHECK_CUDA(
        cudaMemcpyAsync(host_out.data(), out[c], 1024 * 4, cudaMemcpyDeviceToHost, streams[c]));
    CHECK_CUDA(cudaStreamSynchronize(streams[c]));
    expected(c, 0);
    checks.expect(std::equal(want.begin(), want.begin() + 1024, host_out.begin()),
                  "first all_reduce of communicator " + std::to_string(c));
  }
  const int order[2][2] = {{0, 1}, {1, 0}};
  for (int q = 1; q <= rounds; ++q) {
    for (int c = 0; c < 2; ++c) CHECK_CUDA(upload(c, q));
    for (int k = 0; k < per_round; ++k)
      for (int c : order[rank % 2])
        comms[c].all_reduce(in[c] + k, out[c] + k * count, count, DataType::int32, ReduceOp::sum,
                            as_coccl(streams[c]));
    for (int c = 0; c < 2; ++c) {
      CHECK_CUDA(cudaStreamSynchronize(streams[c]));
      CHECK_CUDA(cudaMemcpyAsync(host_out.data(), out[c], host_out.size() * 4,
                                 cudaMemcpyDeviceToHost, streams[c]));
      CHECK_CUDA(cudaStreamSynchronize(streams[c]));
      expected(c, q);
      for (int k = 0; k < per_round; ++k) {
        long long bad = 0;
        for (std::size_t i = 0; i < count; ++i) bad += host_out[k * count + i] != want[k + i];
        checks.expect(bad == 0, "round " + std::to_string(q) + " iteration " + std::to_string(k) +
                                    " communicator " + std::to_string(c) + ": " +
                                    std::to_string(bad) + " wrong");
      }
    }
  }
  for (int c = 0; c < 2; ++c) {
    cudaFree(in[c]);
    cudaFree(out[c]);
    cudaStreamDestroy(streams[c]);
  }
  comms[1].destroy();
  comms[0].destroy();
  return checks.report();
}

// ---- A kernel waiting past COCCL_TIMEOUT ----

// Where rank 0 says it has finished (the rank processes' COCCL_TEST_SIGNAL_DIR).
std::filesystem::path rank0_done() {
  const char* dir = std::getenv("COCCL_TEST_SIGNAL_DIR");
  return std::filesystem::path(dir != nullptr ? dir : ".") / "rank0-done";
}

// Polls for the file `path` for up to `seconds`; true once it exists.
bool appears(const std::filesystem::path& path, int seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The CUDA context of this thread works: an allocation, a memset and a copy there and back.
void expect_context_usable(Checks& checks, cudaStream_t st) {
  constexpr std::size_t bytes = 1 << 20, head = 4096;
  std::vector<unsigned char> pattern(head), back(bytes, 0);
  for (std::size_t i = 0; i < head; ++i) pattern[i] = static_cast<unsigned char>(i * 7 + 1);
  void* p = nullptr;
  checks.expect(cudaMalloc(&p, bytes) == cudaSuccess, "cudaMalloc after the timeout");
  if (p == nullptr) return;
  checks.expect(cudaMemsetAsync(p, 0x5a, bytes, st) == cudaSuccess, "cudaMemsetAsync");
  checks.expect(cudaMemcpyAsync(p, pattern.data(), head, cudaMemcpyHostToDevice, st) == cudaSuccess,
                "cudaMemcpyAsync to the device");
  checks.expect(cudaMemcpyAsync(back.data(), p, bytes, cudaMemcpyDeviceToHost, st) == cudaSuccess,
                "cudaMemcpyAsync from the device");
  checks.expect(cudaStreamSynchronize(st) == cudaSuccess, "cudaStreamSynchronize of the copies");
  checks.expect(
      std::equal(pattern.begin(), pattern.end(), back.begin()) &&
          std::all_of(back.begin() + head, back.end(), [](unsigned char x) { return x == 0x5a; }),
      "bytes copied back after the timeout");
  checks.expect(cudaFree(p) == cudaSuccess, "cudaFree");
}

// Both ranks make a first all_reduce (which sets up the workspaces); then rank 0 makes a second
// one that rank 1 never makes, its kernel waits for rank 1 past COCCL_TIMEOUT (3 s) and returns.
// Rank 0: the stream synchronises without error (no trap, no sticky error), the communicator
// fails with timed_out naming rank 1 and all_reduce, a further call throws, and the context still
// copies bytes. `awaited`: the second all_reduce is the awaitable form, a two-shot size, which
// resumes with timed_out. Rank 1 issues nothing until rank 0 has finished (an operation of its
// own in flight could time out first and abort rank 0's kernel), then finds its communicator
// failed: a barrier throws instead of hanging.
int timeout_main(int rank, int n, const std::string& id_hex, bool awaited) {
  Checks checks{rank};
  CHECK_CUDA(cudaSetDevice(gt::gpu_of(rank)));
  // The context now: the bootstrap, which COCCL_TIMEOUT (3 s) bounds too, should not wait for a
  // peer's context creation.
  CHECK_CUDA(cudaFree(nullptr));
  Communicator comm = Communicator::create(coccl::UniqueId::from_string(id_hex), rank, n);
  cudaStream_t st = new_stream();
  const coccl::cuda_stream cs = as_coccl(st);
  const std::size_t count = awaited ? 1u << 20 : 1024;
  std::int32_t *send = nullptr, *recv = nullptr;
  CHECK_CUDA(alloc_int32(&send, count));
  CHECK_CUDA(alloc_int32(&recv, count));
  std::vector<std::int32_t> host(count, rank + 1);
  CHECK_CUDA(cudaMemcpyAsync(send, host.data(), count * 4, cudaMemcpyHostToDevice, st));
  comm.all_reduce(send, recv, count, DataType::int32, ReduceOp::sum, cs);
  CHECK_CUDA(cudaStreamSynchronize(st));
  CHECK_CUDA(cudaMemcpyAsync(host.data(), recv, count * 4, cudaMemcpyDeviceToHost, st));
  CHECK_CUDA(cudaStreamSynchronize(st));
  checks.expect(
      std::all_of(host.begin(), host.end(), [&](std::int32_t x) { return x == n * (n + 1) / 2; }),
      "the all_reduce both ranks make");
  if (rank == 0) {
    const auto start = std::chrono::steady_clock::now();
    std::error_code completion;
    if (awaited) {
      boost::asio::io_context io;
      auto task = [&]() -> boost::asio::awaitable<void> {
        std::tie(completion) =
            co_await comm.async_all_reduce(send, recv, count, DataType::int32, ReduceOp::sum, cs,
                                           boost::asio::as_tuple(boost::asio::use_awaitable));
      };
      boost::asio::co_spawn(io, task, boost::asio::detached);
      io.run();
      checks.expect(
          completion == coccl::errc::timed_out,
          "the awaited all_reduce completes with timed_out, not '" + completion.message() + "'");
    } else {
      comm.all_reduce(send, recv, count, DataType::int32, ReduceOp::sum, cs);
    }
    const cudaError_t synced = cudaStreamSynchronize(st);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank 0: the lone all_reduce returned after %.1f s\n", waited);
    checks.expect(synced == cudaSuccess, std::string("cudaStreamSynchronize after the timeout: ") +
                                             cudaGetErrorString(synced));
    checks.expect(cudaGetLastError() == cudaSuccess, "no CUDA error pending");
    // The proxy thread reads the kernel's report asynchronously: give it a moment (the awaited
    // form completed with the error, so there it is already recorded).
    for (int i = 0; i < 1000 && !comm.error(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    checks.expect(comm.error() == coccl::errc::timed_out,
                  "comm.error() is timed_out, not '" + comm.error().message() + "'");
    const std::string why = comm.last_error();
    checks.expect(
        why.find("rank 1") != std::string::npos && why.find("all_reduce") != std::string::npos,
        "last_error() names rank 1 and all_reduce: '" + why + "'");
    std::error_code refused;
    try {
      comm.all_reduce(send, recv, count, DataType::int32, ReduceOp::sum, cs);
    } catch (const std::system_error& e) {
      refused = e.code();
    }
    checks.expect(refused == coccl::errc::timed_out,
                  "a further all_reduce throws timed_out, not '" + refused.message() + "'");
    checks.expect(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
    expect_context_usable(checks, st);
    std::ofstream(rank0_done()).put('\n');
  } else {
    checks.expect(appears(rank0_done(), 60), "rank 0 finished within 60 s");
    std::error_code failed;
    try {
      comm.barrier();
    } catch (const std::system_error& e) {
      failed = e.code();
    }
    std::printf("rank 1: barrier failed with '%s'\n", failed.message().c_str());
    checks.expect(static_cast<bool>(failed), "a barrier after rank 0 failed throws");
    checks.expect(static_cast<bool>(comm.error()), "rank 1's communicator has failed");
  }
  comm.abort();
  cudaFree(send);
  cudaFree(recv);
  cudaStreamDestroy(st);
  return checks.report();
}

int timeout_sync_main(int rank, int n, const std::string& id_hex) {
  return timeout_main(rank, n, id_hex, false);
}
int timeout_await_main(int rank, int n, const std::string& id_hex) {
  return timeout_main(rank, n, id_hex, true);
}

// ---- The tests ----

// Runs the rank body `body` as n processes: one GPU each where the machine has n (or one_gpu is
// false and it has fewer: then they share them), under MPS where they share a GPU. Processes
// still running after `deadline_s` fail the test (a hang would otherwise outlast MPS's stop).
void expect_processes_pass(int n, const char* body, bool one_gpu, std::vector<std::string> env,
                           int deadline_s) {
  const int gpus = gt::gpu_count();
  if (gpus < 1) GTEST_SKIP() << "needs a GPU";
  gt::RankProcesses how;
  how.gpus = one_gpu ? 1 : std::min(gpus, n);
  how.body = body;
  how.env = std::move(env);
  how.deadline_s = deadline_s;
  std::optional<gt::Mps> mps;
  if (how.gpus < n) {
    mps.emplace();
    if (!mps->available())
      GTEST_SKIP() << n << " processes on " << how.gpus
                   << " GPU(s) need MPS: " << mps->why_unavailable();
  }
  gt::expect_rank_processes_pass(n, how);
}

// A device hang shows as a timed_out failure (after 60 s) rather than as a killed process.
const std::vector<std::string> hang_timeout = {"COCCL_TIMEOUT=60"};

TEST(StreamOrder, TwoRankProcessesCompleteOperationsOnRandomStreamsInCallOrder) {
  expect_processes_pass(2, "stream_order", false, hang_timeout, 480);
}

TEST(StreamOrder, ThreeRankProcessesCompleteOperationsOnRandomStreamsInCallOrder) {
  expect_processes_pass(3, "stream_order", false, hang_timeout, 480);
}

TEST(StreamOrder, TwoRankThreadsCompleteOperationsOnRandomStreamsInCallOrder) {
  if (gt::gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  gt::expect_rank_threads_pass(2, guarded<stream_order_main>, std::min(gt::gpu_count(), 2));
}

TEST(TwoCommunicators, UsedAtOnceInOppositeOrdersByTwoRankProcessesComplete) {
  if (gt::gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs (on one GPU: the OnOneGpu test)";
  expect_processes_pass(2, "two_communicators", false, hang_timeout, 480);
}

TEST(TwoCommunicators, UsedAtOnceInOppositeOrdersByTwoRankProcessesOnOneGpuComplete) {
  expect_processes_pass(2, "two_communicators", true, hang_timeout, 480);
}

TEST(TwoCommunicators, UsedAtOnceInOppositeOrdersByTwoRankThreadsOnOneGpuComplete) {
  if (gt::gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  gt::expect_rank_threads_pass(2, guarded<two_communicators_main>, 1);
}

// A temporary directory for the rank processes' signal file.
struct SignalDir {
  std::string path;
  SignalDir() {
    path = std::filesystem::temp_directory_path().string() + "/coccl-signal-XXXXXX";
    if (::mkdtemp(path.data()) == nullptr) path.clear();
  }
  ~SignalDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

TEST(DeviceTimeout, KernelWaitingPastTimeoutReturnsAndFailsTheCommunicator) {
  SignalDir dir;
  ASSERT_FALSE(dir.path.empty());
  expect_processes_pass(2, "timeout_sync", false,
                        {"COCCL_TIMEOUT=3", "COCCL_TEST_SIGNAL_DIR=" + dir.path}, 120);
}

TEST(DeviceTimeout, AwaitedOperationCompletesWithTimedOut) {
  SignalDir dir;
  ASSERT_FALSE(dir.path.empty());
  expect_processes_pass(2, "timeout_await", false,
                        {"COCCL_TIMEOUT=3", "COCCL_TEST_SIGNAL_DIR=" + dir.path}, 120);
}

}  // namespace

int main(int argc, char** argv) {
  return gt::rank_or_tests_main(argc, argv,
                                {{"stream_order", guarded<stream_order_main>},
                                 {"two_communicators", guarded<two_communicators_main>},
                                 {"timeout_sync", guarded<timeout_sync_main>},
                                 {"timeout_await", guarded<timeout_await_main>}});
}
