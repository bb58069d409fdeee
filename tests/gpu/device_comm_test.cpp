// Device collectives through the public API: one process per GPU (CUDA IPC) and several GPUs in
// one process (peer access), every collective (rooted ones from every root) against the reference
// of coccl-perf's check, all_to_allv and send/recv against exact expectations, CUDA graph capture
// of every collective (and of broadcast then reduce) replayed 100 times with new inputs each time,
// and the awaitable form of every collective. The same with several ranks on one GPU: 2, 3 and 4
// processes under MPS, and 2, 3 and 4 threads of one process. And across hosts, emulated on one
// GPU with COCCL_HOSTID (the network path: staging kernels and the proxy over tcp, shm between
// ranks of one host): 2, 3 and 4 hosts of one rank and 2 hosts of 2 ranks (hierarchical by size,
// forced hierarchical, forced flat) run the same checks,
// and a rank that dies makes the survivors' device operations fail with its rank named, while
// their GPU stays usable.
// Each collective is its own suite (DeviceAllReduce, DeviceBroadcast, ...: ctest -R
// '^DeviceAllReduce\.' runs one alone), instantiated for every way of placing the ranks above.
// The tests of one process per GPU skip without two GPUs, the others without a GPU (and the
// processes sharing a GPU without MPS).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/coccl.hpp>
#include <cstdint>
#include <cstdio>
#include <latch>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "tests/gpu/mps.hpp"
#include "tests/gpu/ranks.hpp"
#include "tools/perf_data.hpp"

namespace {

using coccl::DataType;
using coccl::ReduceOp;

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
                  std::size_t count, bool in_place, cudaStream_t st, Buffers& b, int root = 0) {
  const int n = comm.size(), rank = comm.rank();
  const std::size_t elt = coccl::size_of(type);
  perf::Options o;
  o.type = type;
  o.op = op;
  o.root = root;
  std::size_t send_elems = count, recv_elems = count;
  if (coll == "allgather" || coll == "gather") recv_elems = count * n;
  if (coll == "reducescatter" || coll == "scatter") send_elems = count * n;
  if (coll == "alltoall") send_elems = recv_elems = count * n;
  std::vector<unsigned char> hs(send_elems * elt + 1), hr(recv_elems * elt + 1, 0xcd);
  perf::fill(coll, o, count, n, rank, hs.data(), nullptr, false);
  char* recv = static_cast<char*>(b.recv);
  char* send = static_cast<char*>(b.send);
  if (in_place) {
    if (coll == "allgather" || coll == "gather")
      send = recv + rank * count * elt;
    else if (coll == "reducescatter" || coll == "scatter")
      recv = send + rank * count * elt;
    else
      send = recv;
  }
  // On the collective's stream: a plain cudaMemcpy runs on the legacy stream, which a
  // non-blocking stream does not wait for.
  cudaMemcpyAsync(recv, hr.data(), recv_elems * elt, cudaMemcpyHostToDevice, st);
  cudaMemcpyAsync(send, hs.data(), send_elems * elt, cudaMemcpyHostToDevice, st);
  auto cs = reinterpret_cast<coccl::cuda_stream>(st);
  if (coll == "allreduce")
    comm.all_reduce(send, recv, count, type, op, cs);
  else if (coll == "allgather")
    comm.all_gather(send, recv, count, type, cs);
  else if (coll == "reducescatter")
    comm.reduce_scatter(send, recv, count, type, op, cs);
  else if (coll == "broadcast")
    comm.broadcast(send, recv, count, type, root, cs);
  else if (coll == "reduce")
    comm.reduce(send, recv, count, type, op, root, cs);
  else if (coll == "gather")
    comm.gather(send, recv, count, type, root, cs);
  else if (coll == "scatter")
    comm.scatter(send, recv, count, type, root, cs);
  else
    comm.all_to_all(send, recv, count, type, cs);
  cudaStreamSynchronize(st);
  cudaMemcpy(hr.data(), recv, recv_elems * elt, cudaMemcpyDeviceToHost);
  return perf::count_wrong(coll, o, count, n, rank, hr.data());
}

// ---- One case of every collective, for the graph and awaitable checks ----

struct Case {
  const char* coll;
  std::size_t count;
};
// Sizes past the one-shot limit included.
const Case every_collective[] = {
    {"allreduce", 3001}, {"allreduce", 400000}, {"allgather", 70001},  {"reducescatter", 70001},
    {"alltoall", 70001}, {"broadcast", 70001},  {"reduce", 70001},     {"gather", 70001},
    {"scatter", 70001},  {"sendrecv", 70001},   {"broadcast", 1048583}};
// Rooted cases use the last rank as root; sendrecv sends to the next rank, receives from the
// previous one.
int root_of(int n) { return n - 1; }

struct Layout {
  std::size_t send_elems, recv_elems;
};
Layout layout(const Case& c, int n) {
  const std::string k = c.coll;
  const bool whole = k == "reducescatter" || k == "alltoall" || k == "scatter";
  const bool gathered = k == "allgather" || k == "alltoall" || k == "gather";
  return {whole ? c.count * n : c.count, gathered ? c.count * n : c.count};
}

// Rank r's float32 input element j in round k: small integers, exact in float.
float input(int r, std::size_t j, int k) {
  return static_cast<float>((r + 1) * static_cast<int>((j + static_cast<std::size_t>(k)) % 13));
}

// Wrong elements of this rank's recv after case c in round k (recv was filled with -1 before).
long long count_wrong_output(const Case& c, int rank, int n, int k, const std::vector<float>& out) {
  const std::string coll = c.coll;
  const std::size_t count = c.count;
  const int root = root_of(n), prev = (rank + n - 1) % n;
  long long bad = 0;
  for (std::size_t e = 0; e < out.size(); ++e) {
    const std::size_t q = e / count, i = e % count;  // source block and offset
    float want = 0;
    if (coll == "allreduce" || (coll == "reduce" && rank == root)) {
      for (int r = 0; r < n; ++r) want += input(r, e, k);
    } else if (coll == "reducescatter") {
      for (int r = 0; r < n; ++r) want += input(r, rank * count + e, k);
    } else if (coll == "allgather" || (coll == "gather" && rank == root)) {
      want = input(static_cast<int>(q), i, k);
    } else if (coll == "alltoall") {
      want = input(static_cast<int>(q), rank * count + i, k);
    } else if (coll == "broadcast") {
      want = input(root, e, k);
    } else if (coll == "scatter") {
      want = input(root, rank * count + e, k);
    } else if (coll == "sendrecv") {
      want = input(prev, e, k);
    } else {
      continue;  // reduce and gather promise nothing about a non-root's recv
    }
    bad += out[e] != want;
  }
  return bad;
}

void enqueue(coccl::Communicator& comm, const Case& c, Buffers& b, coccl::cuda_stream cs) {
  const std::string coll = c.coll;
  const std::size_t count = c.count;
  const int n = comm.size(), root = root_of(n);
  const DataType f = DataType::float32;
  if (coll == "allreduce")
    comm.all_reduce(b.send, b.recv, count, f, ReduceOp::sum, cs);
  else if (coll == "allgather")
    comm.all_gather(b.send, b.recv, count, f, cs);
  else if (coll == "reducescatter")
    comm.reduce_scatter(b.send, b.recv, count, f, ReduceOp::sum, cs);
  else if (coll == "alltoall")
    comm.all_to_all(b.send, b.recv, count, f, cs);
  else if (coll == "broadcast")
    comm.broadcast(b.send, b.recv, count, f, root, cs);
  else if (coll == "reduce")
    comm.reduce(b.send, b.recv, count, f, ReduceOp::sum, root, cs);
  else if (coll == "gather")
    comm.gather(b.send, b.recv, count, f, root, cs);
  else if (coll == "scatter")
    comm.scatter(b.send, b.recv, count, f, root, cs);
  else
    comm.send_recv({coccl::Communicator::send_op(b.send, count, f, (comm.rank() + 1) % n),
                    coccl::Communicator::recv_op(b.recv, count, f, (comm.rank() + n - 1) % n)},
                   cs);
}

boost::asio::awaitable<std::error_code> enqueue_async(coccl::Communicator& comm, const Case& c,
                                                      Buffers& b, coccl::cuda_stream cs) {
  const std::string coll = c.coll;
  const std::size_t count = c.count;
  const int n = comm.size(), root = root_of(n);
  const DataType f = DataType::float32;
  const auto tok = boost::asio::as_tuple(boost::asio::use_awaitable);
  if (coll == "allreduce")
    co_return std::get<0>(
        co_await comm.async_all_reduce(b.send, b.recv, count, f, ReduceOp::sum, cs, tok));
  if (coll == "allgather")
    co_return std::get<0>(co_await comm.async_all_gather(b.send, b.recv, count, f, cs, tok));
  if (coll == "reducescatter")
    co_return std::get<0>(
        co_await comm.async_reduce_scatter(b.send, b.recv, count, f, ReduceOp::sum, cs, tok));
  if (coll == "alltoall")
    co_return std::get<0>(co_await comm.async_all_to_all(b.send, b.recv, count, f, cs, tok));
  if (coll == "broadcast")
    co_return std::get<0>(co_await comm.async_broadcast(b.send, b.recv, count, f, root, cs, tok));
  if (coll == "reduce")
    co_return std::get<0>(
        co_await comm.async_reduce(b.send, b.recv, count, f, ReduceOp::sum, root, cs, tok));
  if (coll == "gather")
    co_return std::get<0>(co_await comm.async_gather(b.send, b.recv, count, f, root, cs, tok));
  if (coll == "scatter")
    co_return std::get<0>(co_await comm.async_scatter(b.send, b.recv, count, f, root, cs, tok));
  std::vector<coccl::Transfer> ops;
  ops.push_back(coccl::Communicator::send_op(b.send, count, f, (comm.rank() + 1) % n));
  ops.push_back(coccl::Communicator::recv_op(b.recv, count, f, (comm.rank() + n - 1) % n));
  co_return std::get<0>(co_await comm.async_send_recv(std::move(ops), cs, tok));
}

// One rank of the checks of one collective, named as coccl-perf names it ("allreduce",
// "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "gather", "scatter"), or
// "alltoallv" or "sendrecv".
int collective_main(const std::string& coll, int rank, int n, const std::string& id_hex) {
  CHECK_CUDA(cudaSetDevice(coccl::gpu_test::gpu_of(rank)));
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
  for (int t = 0; coll == "allreduce" && t < coccl::data_type_count; ++t)
    for (int o = 0; o < coccl::reduce_op_count; ++o)
      for (std::size_t count :
           {std::size_t{1}, std::size_t{7}, std::size_t{1023}, std::size_t{300001}})
        for (bool ip : {false, true}) {
          auto type = static_cast<DataType>(t);
          auto op = static_cast<ReduceOp>(o);
          record(run_one(comm, "allreduce", type, op, count, ip, st, b), "allreduce", type, op,
                 count, ip);
        }
  if (coll == "allgather" || coll == "reducescatter" || coll == "alltoall")
    for (DataType type : {DataType::float32, DataType::bfloat16, DataType::int8, DataType::float64})
      for (std::size_t count : {std::size_t{1}, std::size_t{1023}, std::size_t{70001}})
        for (bool ip : {false, true}) {
          if (ip && coll == "alltoall") continue;
          record(run_one(comm, coll, type, ReduceOp::sum, count, ip, st, b), coll.c_str(), type,
                 ReduceOp::sum, count, ip);
        }
  // Rooted collectives: every root, odd sizes, in and out of place; reduce with every op.
  const bool rooted =
      coll == "broadcast" || coll == "reduce" || coll == "gather" || coll == "scatter";
  for (int root = 0; rooted && root < n; ++root)
    for (DataType type : {DataType::float32, DataType::bfloat16, DataType::int8, DataType::float64})
      for (std::size_t count : {std::size_t{1}, std::size_t{1023}, std::size_t{70001}})
        for (bool ip : {false, true})
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
            if (op != ReduceOp::sum && coll != "reduce") continue;
            const long long w = run_one(comm, coll, type, op, count, ip, st, b, root);
            record(w, (coll + " root=" + std::to_string(root)).c_str(), type, op, count, ip);
          }
  // Broadcasts from 4 MiB up: among more than 2 GPUs a scatter then an all_gather, with a
  // remainder under one 16-byte vector per rank.
  for (int root = 0; coll == "broadcast" && root < n; ++root)
    for (auto [type, count] : {std::pair{DataType::float32, std::size_t{1048583}},
                               std::pair{DataType::bfloat16, std::size_t{2097169}},
                               std::pair{DataType::int8, std::size_t{4194319}}})
      for (bool ip : {false, true})
        record(run_one(comm, "broadcast", type, ReduceOp::sum, count, ip, st, b, root),
               ("broadcast root=" + std::to_string(root)).c_str(), type, ReduceOp::sum, count, ip);
  // all_to_allv with uneven counts (rank r sends r + 2q + 1 elements, scaled, to rank q) and
  // blocks placed in reverse order with gaps.
  for (std::size_t scale : {std::size_t{1}, std::size_t{1000}, std::size_t{30011}}) {
    if (coll != "alltoallv") break;
    auto cnt = [&](int from, int to) { return (from + 2 * to + 1) * scale; };
    std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
    std::size_t so = 0, ro = 0;
    for (int q = n - 1; q >= 0; --q) {
      sc[q] = cnt(rank, q), sd[q] = so, so += sc[q] + 3;
      rc[q] = cnt(q, rank), rd[q] = ro, ro += rc[q] + 5;
    }
    std::vector<std::int32_t> hs(so), hr(ro, -1);
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < sc[q]; ++i)
        hs[sd[q] + i] = static_cast<std::int32_t>(rank * 1000003 + q * 10007 + i);
    CHECK_CUDA(cudaMemcpyAsync(b.send, hs.data(), so * 4, cudaMemcpyHostToDevice, st));
    CHECK_CUDA(cudaMemcpyAsync(b.recv, hr.data(), ro * 4, cudaMemcpyHostToDevice, st));
    comm.all_to_allv(b.send, sc, sd, b.recv, rc, rd, DataType::int32,
                     reinterpret_cast<coccl::cuda_stream>(st));
    CHECK_CUDA(cudaStreamSynchronize(st));
    CHECK_CUDA(cudaMemcpyAsync(hr.data(), b.recv, ro * 4, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaStreamSynchronize(st));
    long long bad = 0;
    for (int q = 0; q < n; ++q) {
      for (std::size_t i = 0; i < rc[q]; ++i)
        bad += hr[rd[q] + i] != static_cast<std::int32_t>(q * 1000003 + rank * 10007 + i);
      for (std::size_t i = 0; i < 5; ++i) bad += hr[rd[q] + rc[q] + i] != -1;
    }
    record(bad, "alltoallv", DataType::int32, ReduceOp::sum, scale, false);
  }
  // send/recv: a ring exchange as one group, then single sends and receives (rank 0 to the
  // others), each checked exactly.
  for (std::size_t count : {std::size_t{3}, std::size_t{4097}, std::size_t{500001}}) {
    if (coll != "sendrecv") break;
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    std::vector<std::int64_t> hs(count), hr(count, -1);
    for (std::size_t i = 0; i < count; ++i) hs[i] = rank * 100000007ll + static_cast<long long>(i);
    auto cs = reinterpret_cast<coccl::cuda_stream>(st);
    CHECK_CUDA(cudaMemcpyAsync(b.send, hs.data(), count * 8, cudaMemcpyHostToDevice, st));
    CHECK_CUDA(cudaMemcpyAsync(b.recv, hr.data(), count * 8, cudaMemcpyHostToDevice, st));
    comm.send_recv({coccl::Communicator::send_op(b.send, count, DataType::int64, next),
                    coccl::Communicator::recv_op(b.recv, count, DataType::int64, prev)},
                   cs);
    CHECK_CUDA(cudaStreamSynchronize(st));
    CHECK_CUDA(cudaMemcpyAsync(hr.data(), b.recv, count * 8, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaStreamSynchronize(st));
    long long bad = 0;
    for (std::size_t i = 0; i < count; ++i)
      bad += hr[i] != prev * 100000007ll + static_cast<long long>(i);
    record(bad, "send_recv ring", DataType::int64, ReduceOp::sum, count, false);
    std::fill(hr.begin(), hr.end(), -1);
    CHECK_CUDA(cudaMemcpyAsync(b.recv, hr.data(), count * 8, cudaMemcpyHostToDevice, st));
    if (rank == 0) {
      for (int q = 1; q < n; ++q) comm.send(b.send, count, DataType::int64, q, cs);
    } else {
      comm.recv(b.recv, count, DataType::int64, 0, cs);
    }
    CHECK_CUDA(cudaStreamSynchronize(st));
    CHECK_CUDA(cudaMemcpyAsync(hr.data(), b.recv, count * 8, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaStreamSynchronize(st));
    bad = 0;
    if (rank != 0)
      for (std::size_t i = 0; i < count; ++i) bad += hr[i] != static_cast<long long>(i);
    record(bad, "send/recv", DataType::int64, ReduceOp::sum, count, false);
  }
  // Graph: broadcast from rank 0 then reduce to rank n-1, captured once, replayed 100 times with
  // new inputs on the root before every replay (with the reduce checks).
  if (coll == "reduce") {
    const std::size_t count = 70001;
    std::vector<float> host(count), out(count);
    char* mid = static_cast<char*>(b.recv) + (4u << 20);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    auto cs = reinterpret_cast<coccl::cuda_stream>(st);
    CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    comm.broadcast(b.send, mid, count, DataType::float32, 0, cs);
    comm.reduce(mid, b.recv, count, DataType::float32, ReduceOp::sum, n - 1, cs);
    CHECK_CUDA(cudaStreamEndCapture(st, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 100; ++replay) {
      for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(replay * 3 + i % 7);
      if (rank == 0)
        CHECK_CUDA(cudaMemcpyAsync(b.send, host.data(), count * 4, cudaMemcpyHostToDevice, st));
      CHECK_CUDA(cudaGraphLaunch(exec, st));
      // Synchronised before the copy out: with ranks as threads on one GPU, a pageable copy queued
      // behind a collective that waits for a peer holds the process's staging path, and the
      // peer's own pageable copy before its launch would then wait for ever.
      CHECK_CUDA(cudaStreamSynchronize(st));
      CHECK_CUDA(cudaMemcpyAsync(out.data(), mid, count * 4, cudaMemcpyDeviceToHost, st));
      CHECK_CUDA(cudaStreamSynchronize(st));
      long long bad = 0;
      for (std::size_t i = 0; i < count; ++i) bad += out[i] != host[i];
      if (rank == n - 1) {
        CHECK_CUDA(cudaMemcpy(out.data(), b.recv, count * 4, cudaMemcpyDeviceToHost));
        for (std::size_t i = 0; i < count; ++i) bad += out[i] != host[i] * static_cast<float>(n);
      }
      record(bad, "graph-replay broadcast+reduce", DataType::float32, ReduceOp::sum, count, false);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  // Graphs of every collective: each captured once (sizes past the one-shot limit included),
  // replayed 100 times with new inputs before every replay, every replay checked.
  for (const Case& c : every_collective) {
    if (c.coll != coll) continue;
    const Layout l = layout(c, n);
    std::vector<float> host(l.send_elems), out(l.recv_elems);
    auto cs = reinterpret_cast<coccl::cuda_stream>(st);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    enqueue(comm, c, b, cs);
    CHECK_CUDA(cudaStreamEndCapture(st, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int k = 0; k < 100; ++k) {
      for (std::size_t j = 0; j < l.send_elems; ++j) host[j] = input(rank, j, k);
      std::fill(out.begin(), out.end(), -1.0f);
      CHECK_CUDA(
          cudaMemcpyAsync(b.send, host.data(), l.send_elems * 4, cudaMemcpyHostToDevice, st));
      CHECK_CUDA(cudaMemcpyAsync(b.recv, out.data(), l.recv_elems * 4, cudaMemcpyHostToDevice, st));
      CHECK_CUDA(cudaGraphLaunch(exec, st));
      // Synchronised before the copy out: with ranks as threads on one GPU, a pageable copy queued
      // behind a collective that waits for a peer holds the process's staging path, and the
      // peer's own pageable copy before its launch would then wait for ever.
      CHECK_CUDA(cudaStreamSynchronize(st));
      CHECK_CUDA(cudaMemcpyAsync(out.data(), b.recv, l.recv_elems * 4, cudaMemcpyDeviceToHost, st));
      CHECK_CUDA(cudaStreamSynchronize(st));
      record(count_wrong_output(c, rank, n, k, out),
             ("graph-replay " + std::string(c.coll)).c_str(), DataType::float32, ReduceOp::sum,
             c.count, false);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  // The awaitable device form of every collective: resumes once the GPU is done, so the result
  // is read with no synchronisation.
  for (const Case& c : every_collective) {
    if (c.coll != coll) continue;
    const Layout l = layout(c, n);
    std::vector<float> host(l.send_elems), out(l.recv_elems, -1.0f);
    for (std::size_t j = 0; j < l.send_elems; ++j) host[j] = input(rank, j, 5);
    // On the collective's stream: a cudaMemcpy from pageable memory may return before its DMA
    // lands, and the non-blocking stream would not wait for it.
    CHECK_CUDA(cudaMemcpyAsync(b.send, host.data(), l.send_elems * 4, cudaMemcpyHostToDevice, st));
    CHECK_CUDA(cudaMemcpyAsync(b.recv, out.data(), l.recv_elems * 4, cudaMemcpyHostToDevice, st));
    boost::asio::io_context io;
    std::error_code result = coccl::make_error_code(coccl::errc::internal);
    auto task = [&]() -> boost::asio::awaitable<void> {
      result = co_await enqueue_async(comm, c, b, reinterpret_cast<coccl::cuda_stream>(st));
      cudaMemcpy(out.data(), b.recv, l.recv_elems * 4, cudaMemcpyDeviceToHost);
    };
    boost::asio::co_spawn(io, task, boost::asio::detached);
    io.run();
    record((result ? 1 : 0) + count_wrong_output(c, rank, n, 5, out),
           ("async " + std::string(c.coll)).c_str(), DataType::float32, ReduceOp::sum, c.count,
           false);
  }
  std::printf("rank %d: %s: %d cases, %lld wrong\n", rank, coll.c_str(), cases, wrong);
  if (cases == 0) {
    std::printf("FAIL rank %d: no checks of a collective named '%s'\n", rank, coll.c_str());
    return 1;
  }
  cudaStreamDestroy(st);
  comm.destroy();
  return wrong ? 1 : 0;
}

// One send/recv group of 122 transfers across hosts (60 to the next rank, 60 from the previous
// one, one to self and back; 1 byte to 1.5 MiB): more than a group may hold on one host.
int many_transfers_main(int rank, int n, const std::string& id_hex) {
  CHECK_CUDA(cudaSetDevice(coccl::gpu_test::gpu_of(rank)));
  auto comm = coccl::Communicator::create(coccl::UniqueId::from_string(id_hex), rank, n);
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int pieces = 60;
  auto size_of_piece = [](int from, int i) -> std::size_t {
    return i % 20 == 7 ? (3u << 19) + from
                       : static_cast<std::size_t>(1 + (i * 7919 + from) % 40000);
  };
  auto value = [](int from, int i, std::size_t j) {
    return static_cast<std::int8_t>(from * 31 + i * 7 + static_cast<int>(j % 101));
  };
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  std::size_t send_total = 0, recv_total = 0;
  for (int i = 0; i < pieces; ++i)
    send_total += size_of_piece(rank, i), recv_total += size_of_piece(prev, i);
  Buffers b;
  CHECK_CUDA(cudaMalloc(&b.send, send_total + 2 * 64));
  CHECK_CUDA(cudaMalloc(&b.recv, recv_total + 2 * 64));
  std::vector<std::int8_t> hs(send_total + 2 * 64), hr(recv_total + 2 * 64, -1);
  std::vector<coccl::Transfer> ops;
  std::size_t so = 0, ro = 0;
  char* send = static_cast<char*>(b.send);
  char* recv = static_cast<char*>(b.recv);
  for (int i = 0; i < pieces; ++i) {
    const std::size_t sn = size_of_piece(rank, i), rn = size_of_piece(prev, i);
    for (std::size_t j = 0; j < sn; ++j) hs[so + j] = value(rank, i, j);
    ops.push_back(coccl::Communicator::send_op(send + so, sn, DataType::int8, next));
    ops.push_back(coccl::Communicator::recv_op(recv + ro, rn, DataType::int8, prev));
    so += sn;
    ro += rn;
  }
  // Two transfers to self at the end, matched in order.
  for (int i = 0; i < 64; ++i) hs[so + i] = static_cast<std::int8_t>(i - rank);
  ops.push_back(coccl::Communicator::send_op(send + so, 64, DataType::int8, rank));
  ops.push_back(coccl::Communicator::recv_op(recv + ro, 64, DataType::int8, rank));
  CHECK_CUDA(cudaMemcpyAsync(b.send, hs.data(), hs.size(), cudaMemcpyHostToDevice, st));
  CHECK_CUDA(cudaMemcpyAsync(b.recv, hr.data(), hr.size(), cudaMemcpyHostToDevice, st));
  comm.send_recv(ops, reinterpret_cast<coccl::cuda_stream>(st));
  CHECK_CUDA(cudaStreamSynchronize(st));
  CHECK_CUDA(cudaMemcpy(hr.data(), b.recv, hr.size(), cudaMemcpyDeviceToHost));
  long long bad = 0;
  ro = 0;
  for (int i = 0; i < pieces; ++i) {
    const std::size_t rn = size_of_piece(prev, i);
    for (std::size_t j = 0; j < rn; ++j) bad += hr[ro + j] != value(prev, i, j);
    ro += rn;
  }
  for (int i = 0; i < 64; ++i) bad += hr[ro + i] != static_cast<std::int8_t>(i - rank);
  for (std::size_t j = ro + 64; j < hr.size(); ++j) bad += hr[j] != -1;
  std::printf("rank %d: %zu transfers, %lld wrong bytes\n", rank, ops.size(), bad);
  cudaStreamDestroy(st);
  comm.destroy();
  return bad ? 1 : 0;
}

// The last rank leaves (exits without a word) after one all_reduce; the others' next all_reduce
// must fail naming it, their waiting kernels must return, the GPU must still work, and the
// survivors' shrunk communicator must run device collectives.
int dead_rank_main(int rank, int n, const std::string& id_hex) {
  CHECK_CUDA(cudaSetDevice(coccl::gpu_test::gpu_of(rank)));
  auto comm = coccl::Communicator::create(coccl::UniqueId::from_string(id_hex), rank, n);
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const std::size_t count = 1 << 20;
  Buffers b;
  CHECK_CUDA(cudaMalloc(&b.send, count * 4));
  CHECK_CUDA(cudaMalloc(&b.recv, count * 4));
  std::vector<float> host(count, static_cast<float>(rank + 1)), out(count);
  CHECK_CUDA(cudaMemcpy(b.send, host.data(), count * 4, cudaMemcpyHostToDevice));
  auto cs = reinterpret_cast<coccl::cuda_stream>(st);
  comm.all_reduce(b.send, b.recv, count, DataType::float32, ReduceOp::sum, cs);
  CHECK_CUDA(cudaStreamSynchronize(st));
  CHECK_CUDA(cudaMemcpy(out.data(), b.recv, count * 4, cudaMemcpyDeviceToHost));
  const float want = static_cast<float>(n * (n + 1) / 2);
  if (std::count(out.begin(), out.end(), want) != static_cast<long>(count)) {
    std::printf("FAIL rank %d: all_reduce before the death is wrong\n", rank);
    return 1;
  }
  if (rank == n - 1) std::_Exit(0);
  // Until the survivors notice, an operation may still be accepted (it then ends with the
  // communicator failed) or refused (a throw). Either way the error names the dead rank.
  for (int i = 0; i < 50 && !comm.error(); ++i) {
    try {
      comm.all_reduce(b.send, b.recv, count, DataType::float32, ReduceOp::sum, cs);
    } catch (const std::system_error&) {
    }
    CHECK_CUDA(cudaStreamSynchronize(st));
  }
  const std::error_code ec = comm.error();
  const std::string why = comm.last_error();
  if (!ec || why.find("rank " + std::to_string(n - 1)) == std::string::npos) {
    std::printf("FAIL rank %d: error '%s' (%s) does not name rank %d\n", rank, why.c_str(),
                ec.message().c_str(), n - 1);
    return 1;
  }
  bool refused = false;
  try {
    comm.all_reduce(b.send, b.recv, count, DataType::float32, ReduceOp::sum, cs);
  } catch (const std::system_error& e) {
    refused = e.code() == ec;
  }
  if (!refused) {
    std::printf("FAIL rank %d: a device operation after the failure was not refused\n", rank);
    return 1;
  }
  // The context is not trapped: plain work on the same stream still runs.
  CHECK_CUDA(cudaMemsetAsync(b.recv, 0, count * 4, st));
  CHECK_CUDA(cudaMemcpyAsync(b.recv, b.send, count * 4, cudaMemcpyDeviceToDevice, st));
  CHECK_CUDA(cudaStreamSynchronize(st));
  CHECK_CUDA(cudaMemcpy(out.data(), b.recv, count * 4, cudaMemcpyDeviceToHost));
  if (out != host) {
    std::printf("FAIL rank %d: the GPU does not work after the failure\n", rank);
    return 1;
  }
  // NCCL's abort-then-shrink flow: the survivors' new communicator works on the same GPU, in the
  // same process, through device kernels.
  const int dead = n - 1;
  coccl::Communicator survivors = comm.shrink(std::span<const int>(&dead, 1));
  if (survivors.size() != n - 1 || survivors.rank() != rank) {
    std::printf("FAIL rank %d: the shrunk communicator is rank %d of %d\n", rank, survivors.rank(),
                survivors.size());
    return 1;
  }
  CHECK_CUDA(cudaMemsetAsync(b.recv, 0, count * 4, st));
  survivors.all_reduce(b.send, b.recv, count, DataType::float32, ReduceOp::sum, cs);
  CHECK_CUDA(cudaStreamSynchronize(st));
  CHECK_CUDA(cudaMemcpy(out.data(), b.recv, count * 4, cudaMemcpyDeviceToHost));
  const float survivors_want = static_cast<float>((n - 1) * n / 2);
  if (std::count(out.begin(), out.end(), survivors_want) != static_cast<long>(count)) {
    std::printf("FAIL rank %d: all_reduce of the survivors gave %g, want %g\n", rank, out[0],
                survivors_want);
    return 1;
  }
  std::printf("rank %d: failed as expected: %s; the survivors' communicator works\n", rank,
              why.c_str());
  survivors.destroy();
  comm.abort();
  cudaStreamDestroy(st);
  return 0;
}

// The checks of each collective as a rank body that rank processes ask for by its name.
#define COCCL_COLLECTIVE_BODY(name)                        \
  coccl::gpu_test::NamedRankMain {                         \
    name, [](int rank, int n, const std::string& id_hex) { \
      return collective_main(name, rank, n, id_hex);       \
    }                                                      \
  }
const coccl::gpu_test::NamedRankMain collective_bodies[] = {
    COCCL_COLLECTIVE_BODY("allreduce"),     COCCL_COLLECTIVE_BODY("allgather"),
    COCCL_COLLECTIVE_BODY("reducescatter"), COCCL_COLLECTIVE_BODY("alltoall"),
    COCCL_COLLECTIVE_BODY("alltoallv"),     COCCL_COLLECTIVE_BODY("broadcast"),
    COCCL_COLLECTIVE_BODY("reduce"),        COCCL_COLLECTIVE_BODY("gather"),
    COCCL_COLLECTIVE_BODY("scatter"),       COCCL_COLLECTIVE_BODY("sendrecv")};
#undef COCCL_COLLECTIVE_BODY

coccl::gpu_test::RankMain body_of(const std::string& coll) {
  for (const auto& b : collective_bodies)
    if (coll == b.name) return b.body;
  return nullptr;
}

// Where a test's ranks run.
struct Placement {
  enum class Where {
    process_per_gpu,  // one process per GPU (CUDA IPC), every GPU
    thread_per_gpu,   // one thread per GPU in one process (peer access), every GPU
    processes,        // `ranks` processes on GPU 0, under MPS
    threads,          // `ranks` threads of one process on GPU 0
    hosts,            // `ranks` processes on GPU 0 under MPS, hosts of `per_host` ranks each
  };
  const char* name;
  Where where;
  int ranks;        // processes, threads, hosts: how many ranks
  int per_host;     // hosts: ranks per host
  const char* env;  // one VAR=value for the rank processes, or null
};

// How GoogleTest names a placement in the test list (and so in CTest).
void PrintTo(const Placement& p, std::ostream* os) { *os << p.name; }

using W = Placement::Where;
const Placement placements[] = {
    {"OneProcessPerGpu", W::process_per_gpu, 0, 1, nullptr},
    {"SeveralGpusInOneProcess", W::thread_per_gpu, 0, 1, nullptr},
    {"TwoProcessesOnOneGpu", W::processes, 2, 1, nullptr},
    {"ThreeProcessesOnOneGpu", W::processes, 3, 1, nullptr},
    {"FourProcessesOnOneGpu", W::processes, 4, 1, nullptr},
    {"TwoThreadsOnOneGpu", W::threads, 2, 1, nullptr},
    {"ThreeThreadsOnOneGpu", W::threads, 3, 1, nullptr},
    {"FourThreadsOnOneGpu", W::threads, 4, 1, nullptr},
    {"TwoHosts", W::hosts, 2, 1, nullptr},
    {"ThreeHosts", W::hosts, 3, 1, nullptr},
    {"FourHosts", W::hosts, 4, 1, nullptr},
    {"TwoHostsOfTwoRanks", W::hosts, 4, 2, nullptr},
    // Every size through the hierarchical algorithms (by default only from 64 KiB), and none.
    {"TwoHostsOfTwoRanksForcedHierarchical", W::hosts, 4, 2, "COCCL_ALGO=hierarchical"},
    {"TwoHostsOfTwoRanksForcedFlat", W::hosts, 4, 2, "COCCL_ALGO=flat"},
};

// n rank processes on GPU 0, under MPS (started here unless it runs), running the body named
// `body`, as hosts of `per_host` ranks each. A hang ends in a failure before the test's TIMEOUT,
// so that MPS is still stopped.
void expect_processes_on_one_gpu_pass(int n, const char* body, int per_host = 1,
                                      std::vector<std::string> env = {}) {
  if (coccl::gpu_test::gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  coccl::gpu_test::Mps mps;
  if (!mps.available())
    GTEST_SKIP() << n << " processes on one GPU need MPS: " << mps.why_unavailable();
  coccl::gpu_test::RankProcesses how;
  how.gpus = 1;
  how.deadline_s = 540;
  how.ranks_per_host = per_host;
  how.body = body;
  how.env = std::move(env);
  coccl::gpu_test::expect_rank_processes_pass(n, how);
}

// A collective's suite: its checks, once per placement.
class DeviceCollective : public ::testing::TestWithParam<Placement> {
 protected:
  void expect_pass(const char* coll) {
    const Placement& p = GetParam();
    const coccl::gpu_test::RankMain body = body_of(coll);
    ASSERT_NE(body, nullptr) << coll;
    switch (p.where) {
      case W::process_per_gpu:
      case W::thread_per_gpu: {
        const int n = coccl::gpu_test::ranks_here();
        if (n < 2) GTEST_SKIP() << "needs 2 GPUs";
        if (p.where == W::thread_per_gpu) {
          coccl::gpu_test::expect_rank_threads_pass(n, body);
        } else {
          coccl::gpu_test::RankProcesses how;
          how.body = coll;
          coccl::gpu_test::expect_rank_processes_pass(n, how);
        }
        return;
      }
      case W::threads:
        if (coccl::gpu_test::gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
        coccl::gpu_test::expect_rank_threads_pass(p.ranks, body, 1);
        return;
      case W::processes:
      case W::hosts: {
        std::vector<std::string> env;
        if (p.env) env.push_back(p.env);
        expect_processes_on_one_gpu_pass(p.ranks, coll, p.where == W::hosts ? p.per_host : 1,
                                         std::move(env));
        return;
      }
    }
  }
};

std::string placement_name(const ::testing::TestParamInfo<Placement>& info) {
  return info.param.name;
}

#define COCCL_DEVICE_COLLECTIVE_SUITE(Suite, coll)       \
  class Suite : public DeviceCollective {};              \
  TEST_P(Suite, MatchesReference) { expect_pass(coll); } \
  INSTANTIATE_TEST_SUITE_P(, Suite, ::testing::ValuesIn(placements), placement_name)

COCCL_DEVICE_COLLECTIVE_SUITE(DeviceAllReduce, "allreduce");
COCCL_DEVICE_COLLECTIVE_SUITE(DeviceAllGather, "allgather");
COCCL_DEVICE_COLLECTIVE_SUITE(DeviceReduceScatter, "reducescatter");
COCCL_DEVICE_COLLECTIVE_SUITE(DeviceAllToAll, "alltoall");
COCCL_DEVICE_COLLECTIVE_SUITE(DeviceAllToAllv, "alltoallv");
COCCL_DEVICE_COLLECTIVE_SUITE(DeviceBroadcast, "broadcast");
COCCL_DEVICE_COLLECTIVE_SUITE(DeviceReduce, "reduce");
COCCL_DEVICE_COLLECTIVE_SUITE(DeviceGather, "gather");
COCCL_DEVICE_COLLECTIVE_SUITE(DeviceScatter, "scatter");
COCCL_DEVICE_COLLECTIVE_SUITE(DeviceSendRecv, "sendrecv");
#undef COCCL_DEVICE_COLLECTIVE_SUITE

TEST(DeviceSendRecvAcrossHosts, GroupOf122TransfersIsExact) {
  expect_processes_on_one_gpu_pass(2, "many_transfers");
  expect_processes_on_one_gpu_pass(3, "many_transfers");
}

TEST(DeviceFailureAcrossHosts, DeadRankFailsSurvivorsAndTheirShrunkCommunicatorWorks) {
  expect_processes_on_one_gpu_pass(3, "dead_rank");
}

// CollTrace of device operations. Two ranks as threads: rank 1 launches the last all_reduce only
// after rank 0 has seen its own launch of it as started and not done (its kernel waits for rank 1).
std::latch trace_seen(1);

int trace_main(int rank, int n, const std::string& id_hex) {
  CHECK_CUDA(cudaSetDevice(coccl::gpu_test::gpu_of(rank)));
  auto comm = coccl::Communicator::create(coccl::UniqueId::from_string(id_hex), rank, n);
  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto cs = reinterpret_cast<coccl::cuda_stream>(st);
  float* buf = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&buf), 1024 * 4));
  for (int i = 0; i < 3; ++i) comm.all_reduce(buf, buf, 1024, DataType::float32, ReduceOp::sum, cs);
  CHECK_CUDA(cudaStreamSynchronize(st));
  auto device_ops = [&] {
    std::vector<coccl::TraceEntry> d;
    for (const auto& e : comm.status().trace)
      if (e.device) d.push_back(e);
    return d;
  };
  auto d = device_ops();
  if (d.size() != 3) {
    std::printf("FAIL rank %d: %zu device entries after 3 all_reduces\n", rank, d.size());
    return 1;
  }
  for (std::size_t i = 0; i < d.size(); ++i)
    if (d[i].op != "all_reduce" || d[i].state != coccl::TraceEntry::State::done ||
        d[i].count != 1024 || (i && d[i].seq != d[i - 1].seq + 1)) {
      std::printf("FAIL rank %d: entry %zu is %s #%llu %s\n", rank, i, d[i].op.c_str(),
                  static_cast<unsigned long long>(d[i].seq), coccl::to_string(d[i].state));
      return 1;
    }
  if (rank == 1) trace_seen.wait();
  comm.all_reduce(buf, buf, 1024, DataType::float32, ReduceOp::sum, cs);
  if (rank == 0) {
    d = device_ops();
    const auto state = d.back().state;
    trace_seen.count_down();
    if (d.size() != 4 || state != coccl::TraceEntry::State::started) {
      std::printf("FAIL rank 0: the all_reduce waiting for rank 1 shows as %s\n",
                  coccl::to_string(state));
      return 1;
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(st));
  d = device_ops();
  if (d.back().state != coccl::TraceEntry::State::done) {
    std::printf("FAIL rank %d: the last all_reduce shows as %s after the stream finished\n", rank,
                coccl::to_string(d.back().state));
    return 1;
  }
  std::printf("rank %d: device trace %s\n", rank, comm.status().json().c_str());
  CHECK_CUDA(cudaFree(buf));
  cudaStreamDestroy(st);
  return 0;
}

TEST(DeviceTrace, ShowsDeviceOperationsStartedAndDone) {
  if (coccl::gpu_test::gpu_count() < 1) GTEST_SKIP() << "needs a GPU";
  coccl::gpu_test::expect_rank_threads_pass(2, trace_main, 1);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<coccl::gpu_test::NamedRankMain> bodies(std::begin(collective_bodies),
                                                     std::end(collective_bodies));
  bodies.push_back({"dead_rank", dead_rank_main});
  bodies.push_back({"many_transfers", many_transfers_main});
  return coccl::gpu_test::rank_or_tests_main(argc, argv, bodies);
}
