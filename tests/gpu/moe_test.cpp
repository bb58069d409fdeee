// MoE exchange on device memory (include/coccl/moe.hpp), one process per GPU (CUDA IPC) and all
// GPUs in one process (peer access): all_to_allv with device counts (random, skewed, zero and
// maximum counts, int32 and int64, packed and explicit displacements, a count over the maximum),
// dispatch and combine against tests/moe/moe_reference.hpp (random, sparse and skewed routing,
// three types, a capacity overflow), and CUDA graphs replayed with counts and routing changed
// on the device between replays. Skips without two GPUs. Across hosts (ranks acting as hosts on
// one GPU under MPS, COCCL_HOSTID): the same all_to_allv, dispatch, combine, capacity and graph
// checks through the network path.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <coccl/coccl.hpp>
#include <coccl/moe.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/gpu/mps.hpp"
#include "tests/gpu/ranks.hpp"
#include "tests/moe/moe_reference.hpp"

namespace {

using coccl::DataType;
using namespace coccl::moe_test;

struct Rank {
  int me = 0;
  int n = 0;
  bool across_hosts = false;  // no arena: device_bytes() stays 0
  cudaStream_t st = nullptr;
  int failures = 0;

  void fail(const std::string& what) {
    std::printf("FAIL rank=%d %s\n", me, what.c_str());
    std::fflush(stdout);
    ++failures;
  }
  void cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
      fail(std::string(what) + ": " + cudaGetErrorString(e));
      throw std::runtime_error("CUDA error");
    }
  }
  coccl::cuda_stream cs() const { return reinterpret_cast<coccl::cuda_stream>(st); }
};

// Device buffer of `bytes` (at least 16).
struct Buf {
  void* p = nullptr;
  explicit Buf(std::size_t bytes) {
    if (cudaMalloc(&p, bytes < 16 ? 16 : bytes) != cudaSuccess)
      throw std::runtime_error("cudaMalloc");
  }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  template <class T = void>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// ---- all_to_allv ----

template <class Count>
struct A2avIo {
  std::vector<Count> sc, sd, rd;
  std::vector<std::int32_t> send;
};

template <class Count>
A2avIo<Count> a2av_inputs(const Rank& R, Counts kind, std::int64_t max, int round, bool spread) {
  A2avIo<Count> io;
  io.sc.resize(R.n);
  io.sd.resize(R.n);
  io.rd.resize(R.n);
  std::int64_t so = 0;
  for (int q = 0; q < R.n; ++q) {
    io.sc[q] = static_cast<Count>(a2av_count(kind, R.me, q, round, max));
    io.sd[q] = static_cast<Count>(so);
    so += io.sc[q] + (spread ? 5 : 0);
    io.rd[q] = static_cast<Count>((R.n - 1 - q) * (max + 3));
  }
  io.send.assign(so + 1, 0);
  for (int q = 0; q < R.n; ++q)
    for (Count i = 0; i < io.sc[q]; ++i) io.send[io.sd[q] + i] = a2av_value(R.me, q, i, round);
  return io;
}

// Checks recv (host copy) and recv_counts against the reference.
template <class Count>
void a2av_check(Rank& R, Counts kind, std::int64_t max, int round, bool spread,
                const std::vector<Count>& rc, const std::vector<Count>& rd,
                const std::vector<std::int32_t>& recv, const char* what) {
  std::int64_t at = 0;
  for (int q = 0; q < R.n; ++q) {
    const std::int64_t want = a2av_count(kind, q, R.me, round, max);
    if (rc[q] != want) {
      R.fail(std::string(what) + " round=" + std::to_string(round) + " recv_counts[" +
             std::to_string(q) + "]=" + std::to_string(rc[q]) + " want " + std::to_string(want));
      return;
    }
    const std::int64_t base = spread ? rd[q] : at;
    for (std::int64_t i = 0; i < want; ++i) {
      if (recv[base + i] != a2av_value(q, R.me, i, round)) {
        R.fail(std::string(what) + " round=" + std::to_string(round) + " from rank " +
               std::to_string(q) + " element " + std::to_string(i));
        return;
      }
    }
    at += want;
  }
}

template <class Count>
void a2av_once(Rank& R, coccl::moe::AllToAllv& a2a, Counts kind, std::int64_t max, int round,
               bool spread) {
  const A2avIo<Count> io = a2av_inputs<Count>(R, kind, max, round, spread);
  const std::size_t recv_elems = R.n * (max + 3) + 1;
  Buf send(io.send.size() * 4), recv(recv_elems * 4), counts(4 * R.n * sizeof(Count));
  Count* sc = counts.as<Count>();
  Count* sd = sc + R.n;
  Count* rc = sd + R.n;
  Count* rd = rc + R.n;
  std::vector<std::int32_t> host(recv_elems, -1);
  std::vector<Count> rch(R.n, -1);
  R.cuda(cudaMemcpyAsync(send.p, io.send.data(), io.send.size() * 4, cudaMemcpyHostToDevice, R.st),
         "upload");
  R.cuda(cudaMemcpyAsync(recv.p, host.data(), recv_elems * 4, cudaMemcpyHostToDevice, R.st),
         "upload");
  R.cuda(cudaMemcpyAsync(sc, io.sc.data(), R.n * sizeof(Count), cudaMemcpyHostToDevice, R.st),
         "upload");
  R.cuda(cudaMemcpyAsync(sd, io.sd.data(), R.n * sizeof(Count), cudaMemcpyHostToDevice, R.st),
         "upload");
  R.cuda(cudaMemcpyAsync(rd, io.rd.data(), R.n * sizeof(Count), cudaMemcpyHostToDevice, R.st),
         "upload");
  a2a.run(send.p, sc, spread ? sd : nullptr, recv.p, rc, spread ? rd : nullptr, R.cs());
  R.cuda(cudaMemcpyAsync(host.data(), recv.p, recv_elems * 4, cudaMemcpyDeviceToHost, R.st),
         "download");
  R.cuda(cudaMemcpyAsync(rch.data(), rc, R.n * sizeof(Count), cudaMemcpyDeviceToHost, R.st),
         "download");
  R.cuda(cudaStreamSynchronize(R.st), "sync");
  a2av_check(R, kind, max, round, spread, rch, io.rd, host, "a2av");
  std::string why;
  if (a2a.device_status(&why)) R.fail("a2av reported a device error: " + why);
}

void run_a2av(Rank& R, coccl::Communicator& comm) {
  for (std::int64_t max : {std::int64_t{1}, std::int64_t{777}, std::int64_t{100003}}) {
    coccl::moe::AllToAllv a2a(comm, static_cast<std::size_t>(max), DataType::int32);
    if (a2a.device_bytes() != 0) R.fail("arena allocated before the first call");
    for (int round = 0; round < 4; ++round) {
      a2av_once<std::int64_t>(R, a2a, Counts::random, max, round, round % 2 == 1);
      a2av_once<std::int32_t>(R, a2a, Counts::random, max, round, round % 2 == 0);
    }
    for (int round = 0; round < R.n; ++round)
      a2av_once<std::int64_t>(R, a2a, Counts::skewed, max, round, false);
    a2av_once<std::int64_t>(R, a2a, Counts::at_max, max, 0, true);
    a2av_once<std::int32_t>(R, a2a, Counts::zeros, max, 0, false);
    const std::size_t want = coccl::moe::AllToAllv::device_bytes_for(max, DataType::int32, R.n);
    if (a2a.device_bytes() != (R.across_hosts ? 0 : want))
      R.fail("device_bytes differs from device_bytes_for");
  }
}

// A count above the maximum is clamped on the device, reported by device_status, and the
// receiver's recv_counts say what arrived; the next call works normally.
void run_a2av_over(Rank& R, coccl::Communicator& comm) {
  const std::int64_t max = 100;
  coccl::moe::AllToAllv a2a(comm, max, DataType::int32);
  Buf send(4 * R.n * (max + 50)), recv(4 * R.n * max), counts(2 * R.n * 8);
  auto* sc = counts.as<std::int64_t>();
  auto* rc = sc + R.n;
  std::vector<std::int64_t> c(R.n, max + 50), got(R.n);
  R.cuda(cudaMemcpyAsync(sc, c.data(), R.n * 8, cudaMemcpyHostToDevice, R.st), "upload");
  a2a.run(send.p, sc, nullptr, recv.p, rc, nullptr, R.cs());
  R.cuda(cudaMemcpyAsync(got.data(), rc, R.n * 8, cudaMemcpyDeviceToHost, R.st), "download");
  R.cuda(cudaStreamSynchronize(R.st), "sync");
  for (int q = 0; q < R.n; ++q)
    if (got[q] != max) R.fail("over-max count not clamped: " + std::to_string(got[q]));
  std::string why;
  if (a2a.device_status(&why) != coccl::make_error_code(coccl::errc::invalid_argument))
    R.fail("a count over the maximum was not reported");
  else if (why.find("max_count") == std::string::npos)
    R.fail("unexpected description: " + why);
  if (a2a.device_status()) R.fail("device_status did not clear the error");
  a2av_once<std::int64_t>(R, a2a, Counts::random, max, 7, false);
}

// One all_to_allv captured in a graph, replayed with counts rewritten on the device before every
// replay (random, skewed, zero, maximum).
void run_a2av_graph(Rank& R, coccl::Communicator& comm) {
  const std::int64_t max = 5003;
  coccl::moe::AllToAllv a2a(comm, max, DataType::int32);
  a2a.prepare();
  const std::size_t recv_elems = R.n * max;
  Buf send(4 * R.n * max + 16), recv(4 * recv_elems), counts(2 * R.n * 8);
  auto* sc = counts.as<std::int64_t>();
  auto* rc = sc + R.n;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  R.cuda(cudaStreamBeginCapture(R.st, cudaStreamCaptureModeThreadLocal), "capture");
  a2a.run(send.p, sc, nullptr, recv.p, rc, nullptr, R.cs());
  R.cuda(cudaStreamEndCapture(R.st, &graph), "end capture");
  R.cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int replay = 0; replay < 40; ++replay) {
    const Counts kind = replay % 10 == 3   ? Counts::skewed
                        : replay % 10 == 5 ? Counts::zeros
                        : replay % 10 == 7 ? Counts::at_max
                                           : Counts::random;
    const A2avIo<std::int64_t> io = a2av_inputs<std::int64_t>(R, kind, max, replay, false);
    std::vector<std::int32_t> host(recv_elems, -1);
    std::vector<std::int64_t> rch(R.n, -1);
    R.cuda(
        cudaMemcpyAsync(send.p, io.send.data(), io.send.size() * 4, cudaMemcpyHostToDevice, R.st),
        "upload");
    R.cuda(cudaMemcpyAsync(sc, io.sc.data(), R.n * 8, cudaMemcpyHostToDevice, R.st), "upload");
    R.cuda(cudaGraphLaunch(exec, R.st), "graph launch");
    R.cuda(cudaMemcpyAsync(host.data(), recv.p, recv_elems * 4, cudaMemcpyDeviceToHost, R.st),
           "download");
    R.cuda(cudaMemcpyAsync(rch.data(), rc, R.n * 8, cudaMemcpyDeviceToHost, R.st), "download");
    R.cuda(cudaStreamSynchronize(R.st), "sync");
    a2av_check(R, kind, max, replay, false, rch, io.rd, host, "a2av graph replay");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// ---- dispatch and combine ----

struct MoeBufs {
  Buf x, idx, w, y, out;
  MoeBufs(const MoeCase& c, std::size_t capacity)
      : x(c.max_tokens * row_bytes(c)),
        idx(c.max_tokens * c.top_k * 4),
        w(c.max_tokens * c.top_k * 4),
        y(capacity * row_bytes(c)),
        out(c.max_tokens * row_bytes(c)) {}
};

void upload_inputs(Rank& R, const MoeCase& c, MoeBufs& b) {
  const std::vector<char> x = tokens_x(c, R.me);
  const std::vector<std::int32_t> idx = routing_of(c, R.me);
  const std::vector<float> w = weights_of(c, R.me);
  R.cuda(cudaMemcpyAsync(b.x.p, x.data(), x.size(), cudaMemcpyHostToDevice, R.st), "upload x");
  R.cuda(cudaMemcpyAsync(b.idx.p, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice, R.st),
         "upload idx");
  R.cuda(cudaMemcpyAsync(b.w.p, w.data(), w.size() * 4, cudaMemcpyHostToDevice, R.st), "upload w");
  R.cuda(cudaStreamSynchronize(R.st), "sync");
}

// Downloads the dispatch result; compares it with the reference; returns rows and data.
bool check_received(Rank& R, const MoeCase& c, const coccl::moe::Received& got,
                    std::vector<coccl::moe::Row>& rows, std::vector<char>& x) {
  const Expected want = expected_dispatch(c, R.me);
  const int El = got.local_experts;
  std::vector<std::int32_t> counts(El), offsets(El + 1);
  R.cuda(cudaMemcpy(counts.data(), got.expert_counts, El * 4, cudaMemcpyDeviceToHost), "download");
  R.cuda(cudaMemcpy(offsets.data(), got.expert_offsets, (El + 1) * 4, cudaMemcpyDeviceToHost),
         "download");
  const std::string tag =
      "round=" + std::to_string(c.round) + " type=" + std::string(coccl::to_string(c.type)) + " ";
  if (counts != want.counts || offsets != want.offsets) {
    R.fail(tag + "expert counts/offsets differ (rows " + std::to_string(offsets[El]) + ", want " +
           std::to_string(want.offsets[El]) + ")");
    return false;
  }
  const std::size_t nrows = want.rows.size(), row = row_bytes(c);
  rows.resize(nrows);
  x.resize(nrows * row);
  R.cuda(cudaMemcpy(rows.data(), got.rows, nrows * sizeof(coccl::moe::Row), cudaMemcpyDeviceToHost),
         "download");
  R.cuda(cudaMemcpy(x.data(), got.x, nrows * row, cudaMemcpyDeviceToHost), "download");
  std::vector<std::vector<char>> xs(c.nranks);
  for (int q = 0; q < c.nranks; ++q) xs[q] = tokens_x(c, q);
  for (std::size_t r = 0; r < nrows; ++r) {
    const auto& g = rows[r];
    const auto& w = want.rows[r];
    if (g.rank != w.rank || g.token != w.token || g.slot != w.slot || g.expert != w.expert) {
      R.fail(tag + "row " + std::to_string(r) + " metadata (" + std::to_string(g.rank) + "," +
             std::to_string(g.token) + "," + std::to_string(g.slot) + "," +
             std::to_string(g.expert) + ") want (" + std::to_string(w.rank) + "," +
             std::to_string(w.token) + "," + std::to_string(w.slot) + "," +
             std::to_string(w.expert) + ")");
      return false;
    }
    if (std::memcmp(x.data() + r * row, xs[w.rank].data() + w.token * row, row) != 0) {
      R.fail(tag + "row " + std::to_string(r) + " data");
      return false;
    }
  }
  return true;
}

void dispatch_combine_round(Rank& R, coccl::moe::Dispatcher& moe, const MoeCase& c, MoeBufs& b) {
  upload_inputs(R, c, b);
  const int tokens = tokens_of(c, R.me);
  const coccl::moe::Received got = moe.dispatch(b.x.p, tokens, b.idx.as<std::int32_t>(), R.cs());
  R.cuda(cudaStreamSynchronize(R.st), "sync dispatch");
  std::vector<coccl::moe::Row> rows;
  std::vector<char> x;
  if (!check_received(R, c, got, rows, x)) return;
  // The experts, on the host.
  const std::size_t row = row_bytes(c);
  std::vector<char> y(x.size());
  for (std::size_t r = 0; r < rows.size(); ++r)
    expert_apply(c.type, rows[r].expert, x.data() + r * row, y.data() + r * row, c.hidden);
  // On the stream of the combine: a cudaMemcpy from pageable memory may return before its DMA
  // lands, and the non-blocking stream would not wait for it.
  if (!y.empty())
    R.cuda(cudaMemcpyAsync(b.y.p, y.data(), y.size(), cudaMemcpyHostToDevice, R.st), "upload y");
  moe.combine(b.y.p, b.w.as<float>(), b.out.p, R.cs());
  std::vector<char> out(tokens * row);
  R.cuda(cudaMemcpyAsync(out.data(), b.out.p, out.size(), cudaMemcpyDeviceToHost, R.st),
         "download");
  R.cuda(cudaStreamSynchronize(R.st), "sync combine");
  if (out != expected_combine(c, R.me, false))
    R.fail("combine round=" + std::to_string(c.round) +
           " type=" + std::string(coccl::to_string(c.type)));
  std::string why;
  if (moe.device_status(&why)) R.fail("dispatch reported a device error: " + why);
}

void run_dispatch(Rank& R, coccl::Communicator& comm) {
  // hidden 7168 bf16 is the decode shape's row; the smaller ones check odd token counts and types.
  struct Shape {
    int tokens, hidden;
    DataType type;
    int k, experts;
    Routing routing;
  };
  const Shape shapes[] = {
      {128, 7168, DataType::bfloat16, 8, 64, Routing::random},
      {37, 72, DataType::bfloat16, 8, 64, Routing::sparse},
      {50, 36, DataType::float32, 4, 8 * R.n, Routing::random},
      {19, 24, DataType::float16, 2, 2 * R.n, Routing::random},
      {64, 64, DataType::bfloat16, 6, 16 * R.n, Routing::skewed},
      {700, 8, DataType::bfloat16, 8, 32 * R.n, Routing::random},
  };
  for (const Shape& s : shapes) {
    if (s.experts % R.n != 0) continue;  // 64 experts do not split over 3 ranks
    MoeCase c{R.n, s.tokens, s.hidden, s.type, s.k, s.experts, s.routing, 0};
    coccl::moe::Dispatcher moe(comm, {c.max_tokens, c.hidden, c.type, c.top_k, c.num_experts, 0});
    MoeBufs b(c, moe.capacity());
    for (int round = 0; round < 4; ++round) {
      c.round = round;
      dispatch_combine_round(R, moe, c, b);
    }
    if (moe.device_bytes() !=
        coccl::moe::Dispatcher::device_bytes_for(
            {c.max_tokens, c.hidden, c.type, c.top_k, c.num_experts, 0}, R.n, R.across_hosts))
      R.fail("dispatcher device_bytes differs from device_bytes_for");
  }
}

// With a capacity below what one rank receives, dispatch drops the excess, reports it, keeps
// counts and offsets within the capacity, and combine still runs.
void run_dispatch_over_capacity(Rank& R, coccl::Communicator& comm) {
  MoeCase c{R.n, 32, 16, DataType::float32, 4, 4 * R.n, Routing::skewed, 1};
  const std::size_t cap = 10;
  coccl::moe::Dispatcher moe(comm, {c.max_tokens, c.hidden, c.type, c.top_k, c.num_experts, cap});
  MoeBufs b(c, cap);
  upload_inputs(R, c, b);
  const auto got = moe.dispatch(b.x.p, tokens_of(c, R.me), b.idx.as<std::int32_t>(), R.cs());
  moe.combine(got.x, b.w.as<float>(), b.out.p, R.cs());
  R.cuda(cudaStreamSynchronize(R.st), "sync");
  std::vector<std::int32_t> offsets(got.local_experts + 1);
  R.cuda(cudaMemcpy(offsets.data(), got.expert_offsets, offsets.size() * 4, cudaMemcpyDeviceToHost),
         "download");
  if (offsets.back() > static_cast<std::int32_t>(cap)) R.fail("offsets beyond the capacity");
  std::string why;
  const std::error_code ec = moe.device_status(&why);
  // Every rank dropped rows it sent to rank 0, so every rank reports it.
  if (ec != coccl::make_error_code(coccl::errc::invalid_argument) ||
      why.find("capacity") == std::string::npos)
    R.fail("capacity overflow not reported (" + why + ")");
}

// dispatch + combine (experts = identity, y = the received rows in place) captured once and
// replayed with new routing, weights and inputs written to the device before every replay.
void run_dispatch_graph(Rank& R, coccl::Communicator& comm) {
  MoeCase c{R.n, 96, 512, DataType::bfloat16, 8, 16 * R.n, Routing::random, 0};
  coccl::moe::Dispatcher moe(comm, {c.max_tokens, c.hidden, c.type, c.top_k, c.num_experts, 0});
  moe.prepare();
  MoeBufs b(c, 1);
  // The graph replays the token count of the capture, so every round uses max_tokens (round % 3
  // == 0 in tokens_of).
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  R.cuda(cudaStreamBeginCapture(R.st, cudaStreamCaptureModeThreadLocal), "capture");
  const auto got = moe.dispatch(b.x.p, c.max_tokens, b.idx.as<std::int32_t>(), R.cs());
  moe.combine(got.x, b.w.as<float>(), b.out.p, R.cs());
  R.cuda(cudaStreamEndCapture(R.st, &graph), "end capture");
  R.cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int replay = 0; replay < 20; ++replay) {
    c.round = replay * 3;
    c.routing = replay % 4 == 1   ? Routing::skewed
                : replay % 4 == 2 ? Routing::sparse
                                  : Routing::random;
    upload_inputs(R, c, b);
    R.cuda(cudaGraphLaunch(exec, R.st), "graph launch");
    std::vector<char> out(c.max_tokens * row_bytes(c));
    R.cuda(cudaMemcpyAsync(out.data(), b.out.p, out.size(), cudaMemcpyDeviceToHost, R.st),
           "download");
    R.cuda(cudaStreamSynchronize(R.st), "sync");
    std::vector<coccl::moe::Row> rows;
    std::vector<char> x;
    check_received(R, c, got, rows, x);
    if (out != expected_combine(c, R.me, true))
      R.fail("graph replay " + std::to_string(replay) + " combine");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

int rank_main(int rank, int n, const std::string& id_hex) {
  Rank R;
  R.me = rank;
  R.n = n;
  try {
    R.cuda(cudaSetDevice(rank), "cudaSetDevice");
    auto comm = coccl::Communicator::create(coccl::UniqueId::from_string(id_hex), rank, n);
    R.cuda(cudaStreamCreateWithFlags(&R.st, cudaStreamNonBlocking), "stream");
    run_a2av(R, comm);
    run_a2av_over(R, comm);
    run_a2av_graph(R, comm);
    run_dispatch(R, comm);
    run_dispatch_over_capacity(R, comm);
    run_dispatch_graph(R, comm);
    cudaStreamDestroy(R.st);
    comm.destroy();
  } catch (const std::exception& e) {
    std::printf("EXCEPTION rank=%d: %s\n", rank, e.what());
    return 2;
  }
  std::printf("rank %d: %s\n", rank, R.failures ? "FAILED" : "all checks passed");
  return R.failures ? 1 : 0;
}

// Ranks of different hosts on one GPU: all_to_allv, dispatch and combine through the network
// path, checked as on one host.
int across_hosts_main(int rank, int n, const std::string& id_hex) {
  Rank R;
  R.me = rank;
  R.n = n;
  R.across_hosts = true;
  try {
    R.cuda(cudaSetDevice(coccl::gpu_test::gpu_of(rank)), "cudaSetDevice");
    auto comm = coccl::Communicator::create(coccl::UniqueId::from_string(id_hex), rank, n);
    R.cuda(cudaStreamCreateWithFlags(&R.st, cudaStreamNonBlocking), "stream");
    run_a2av(R, comm);
    run_a2av_over(R, comm);
    run_a2av_graph(R, comm);
    run_dispatch(R, comm);
    run_dispatch_over_capacity(R, comm);
    run_dispatch_graph(R, comm);
    cudaStreamDestroy(R.st);
    comm.destroy();
  } catch (const std::exception& e) {
    std::printf("EXCEPTION rank=%d: %s\n", rank, e.what());
    return 2;
  }
  std::printf("rank %d: %s\n", rank, R.failures ? "FAILED" : "all checks passed");
  return R.failures ? 1 : 0;
}

void expect_hosts_pass(int n, int per_host) {
  if (coccl::gpu_test::gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  coccl::gpu_test::Mps mps;
  if (!mps.available())
    GTEST_SKIP() << n << " processes on one GPU need MPS: " << mps.why_unavailable();
  coccl::gpu_test::RankProcesses how;
  how.gpus = 1;
  how.deadline_s = 400;
  how.ranks_per_host = per_host;
  how.body = "across_hosts";
  coccl::gpu_test::expect_rank_processes_pass(n, how);
}

TEST(MoeAcrossHosts, TwoHostsMatchReferenceAndReplayGraphs) { expect_hosts_pass(2, 1); }

TEST(MoeAcrossHosts, ThreeHostsMatchReferenceAndReplayGraphs) { expect_hosts_pass(3, 1); }

TEST(MoeAcrossHosts, TwoHostsOfTwoRanksMatchReferenceAndReplayGraphs) { expect_hosts_pass(4, 2); }

TEST(MoeDevice, OneProcessPerGpuMatchesReferenceAndReplaysGraphs) {
  const int n = coccl::gpu_test::ranks_here();
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs";
  coccl::gpu_test::expect_rank_processes_pass(n);
}

TEST(MoeDevice, AllGpusInOneProcessMatchReference) {
  const int n = coccl::gpu_test::ranks_here();
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs";
  coccl::gpu_test::expect_rank_threads_pass(n, rank_main);
}

}  // namespace

int main(int argc, char** argv) {
  return coccl::gpu_test::rank_or_tests_main(
      argc, argv, {{"", rank_main}, {"across_hosts", across_hosts_main}});
}
