// tests/gpu/random_ops.hpp: random batches of device operations over one arena per rank, and
// their host reference, for tests/gpu/concurrency_test. Every rank plans the same batches from
// the same seed; an operation's input is fresh data or the output of an earlier operation of its
// batch (so the order the ranks' streams give the operations matters), and all data are small
// int32 values whose sums are exact.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <coccl/coccl.hpp>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace coccl::gpu_test {

inline std::size_t pick(std::mt19937_64& rng, std::size_t lo, std::size_t hi) {
  return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
}

enum class Kind { all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, ring, pair };
inline constexpr int kinds = 7;

// One operation of a batch, identical on every rank. Offsets are in int32 elements of the batch's
// arena (one device buffer per rank, the same layout on every rank).
struct Op {
  Kind kind;
  std::size_t count;     // elements per rank, as passed to the call
  int root = 0;          // broadcast: the root; pair: the sender
  int peer = 0;          // pair: the receiver (the other ranks do not take part)
  int source = -1;       // earlier op whose output is this op's input; -1: a fresh input
  bool staged = false;   // the input is a copy of the source's output, made by a cudaMemcpyAsync
  std::size_t from = 0;  // staged: where the copy is read (the source's output)
  std::size_t in = 0, out = 0;
  int depth = 0;  // chained reductions behind the input, which bound its magnitude
};

inline std::size_t in_elems(const Op& o, int n) {
  return o.kind == Kind::reduce_scatter || o.kind == Kind::all_to_all ? o.count * n : o.count;
}
inline std::size_t out_elems(const Op& o, int n) {
  return o.kind == Kind::all_gather || o.kind == Kind::all_to_all ? o.count * n : o.count;
}

struct Batch {
  std::vector<Op> ops;
  int streams = 2;        // streams used: 2 to 4
  std::size_t elems = 0;  // arena size
};

inline constexpr int total_ops = 1000, ops_per_batch = 25, max_depth = 5;

// The batches, from `rng` seeded alike on every rank: all ranks plan the same operations with the
// same inputs. The first op is a collective: the first device call may not be a send or recv.
inline std::vector<Batch> plan(std::mt19937_64& rng, int n) {
  std::vector<Batch> batches(total_ops / ops_per_batch);
  for (std::size_t b = 0; b < batches.size(); ++b) {
    Batch& batch = batches[b];
    batch.streams = static_cast<int>(pick(rng, 2, 4));
    auto alloc = [&](std::size_t elems) {
      const std::size_t at = batch.elems;
      batch.elems += (elems + 63) / 64 * 64;  // 256-byte aligned, like cudaMalloc's
      return at;
    };
    for (int i = 0; i < ops_per_batch; ++i) {
      Op o;
      o.kind = b == 0 && i == 0 ? Kind::all_reduce : static_cast<Kind>(pick(rng, 0, kinds - 1));
      // Up to 64 elements, up to 16 KiB, up to 280 KiB; all_reduce also past the one-shot
      // limit of 512 KiB.
      const std::size_t size_class = pick(rng, 0, o.kind == Kind::all_reduce ? 3 : 2);
      o.count = size_class == 0   ? pick(rng, 1, 64)
                : size_class == 1 ? pick(rng, 65, 4096)
                : size_class == 2 ? pick(rng, 4097, 70000)
                                  : pick(rng, 131073, 262144);
      o.root = static_cast<int>(pick(rng, 0, n - 1));
      o.peer = (o.root + static_cast<int>(pick(rng, 1, n - 1))) % n;
      if (i > 0 && pick(rng, 0, 1) == 1) {
        const int src = static_cast<int>(pick(rng, 0, i - 1));
        const Op& s = batch.ops[src];
        const std::size_t per = in_elems(o, n) / o.count;
        if (s.depth < max_depth && out_elems(s, n) >= per) {
          o.count = std::min(o.count, out_elems(s, n) / per);
          o.source = src;
          o.depth = s.depth + 1;
          o.staged = pick(rng, 0, 2) == 0;
          o.from = s.out;
        }
      }
      o.in = o.source >= 0 && !o.staged ? batch.ops[o.source].out : alloc(in_elems(o, n));
      o.out = alloc(out_elems(o, n));
      batch.ops.push_back(o);
    }
  }
  return batches;
}

// A fresh input element: small, so that sums stay exact and far from overflow.
inline std::int32_t fresh(int rank, int batch, int op, std::size_t i) {
  const std::size_t k = static_cast<std::size_t>(rank * 31 + batch * 7 + op * 13) + i;
  return static_cast<std::int32_t>(k % 17) - 8;
}

// The arenas of every rank before a batch: fresh inputs, -1 everywhere else.
inline std::vector<std::vector<std::int32_t>> initial_arenas(const Batch& batch, int b, int n) {
  std::vector<std::vector<std::int32_t>> m(n, std::vector<std::int32_t>(batch.elems, -1));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < batch.ops.size(); ++i) {
      const Op& o = batch.ops[i];
      if (o.source >= 0) continue;
      for (std::size_t e = 0; e < in_elems(o, n); ++e)
        m[r][o.in + e] = fresh(r, b, static_cast<int>(i), e);
    }
  return m;
}

// What op `o` does to every rank's arena: the host reference.
inline void apply(const Op& o, int n, std::vector<std::vector<std::int32_t>>& m) {
  const std::size_t c = o.count;
  if (o.staged)
    for (int r = 0; r < n; ++r)
      std::copy_n(m[r].begin() + o.from, in_elems(o, n), m[r].begin() + o.in);
  for (int r = 0; r < n; ++r) {
    std::int32_t* out = m[r].data() + o.out;
    auto in = [&](int q, std::size_t e) { return m[q][o.in + e]; };
    for (std::size_t i = 0; i < c; ++i) {
      switch (o.kind) {
        case Kind::all_reduce:
          out[i] = 0;
          for (int q = 0; q < n; ++q) out[i] += in(q, i);
          break;
        case Kind::reduce_scatter:
          out[i] = 0;
          for (int q = 0; q < n; ++q) out[i] += in(q, r * c + i);
          break;
        case Kind::all_gather:
          for (int q = 0; q < n; ++q) out[q * c + i] = in(q, i);
          break;
        case Kind::all_to_all:
          for (int q = 0; q < n; ++q) out[q * c + i] = in(q, r * c + i);
          break;
        case Kind::broadcast:
          out[i] = in(o.root, i);
          break;
        case Kind::ring:
          out[i] = in((r + n - 1) % n, i);
          break;
        case Kind::pair:
          if (r == o.peer) out[i] = in(o.root, i);
          break;
      }
    }
  }
}

inline void issue(Communicator& comm, const Op& o, std::int32_t* arena, cudaStream_t st) {
  const int rank = comm.rank(), n = comm.size();
  const DataType t = DataType::int32;
  const std::size_t c = o.count;
  std::int32_t *in = arena + o.in, *out = arena + o.out;
  const auto cs = reinterpret_cast<coccl::cuda_stream>(st);
  switch (o.kind) {
    case Kind::all_reduce:
      comm.all_reduce(in, out, c, t, ReduceOp::sum, cs);
      break;
    case Kind::all_gather:
      comm.all_gather(in, out, c, t, cs);
      break;
    case Kind::reduce_scatter:
      comm.reduce_scatter(in, out, c, t, ReduceOp::sum, cs);
      break;
    case Kind::broadcast:
      comm.broadcast(in, out, c, t, o.root, cs);
      break;
    case Kind::all_to_all:
      comm.all_to_all(in, out, c, t, cs);
      break;
    case Kind::ring:
      comm.send_recv({Communicator::send_op(in, c, t, (rank + 1) % n),
                      Communicator::recv_op(out, c, t, (rank + n - 1) % n)},
                     cs);
      break;
    case Kind::pair:
      if (rank == o.root) comm.send(in, c, t, o.peer, cs);
      if (rank == o.peer) comm.recv(out, c, t, o.root, cs);
      break;
  }
}

inline const char* name_of(Kind k) {
  constexpr const char* names[kinds] = {"all_reduce",    "all_gather", "reduce_scatter",
                                        "broadcast",     "all_to_all", "send_recv ring",
                                        "send/recv pair"};
  return names[static_cast<int>(k)];
}

}  // namespace coccl::gpu_test
