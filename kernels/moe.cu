// kernels/moe.cu: all_to_allv with counts read on the device, and MoE dispatch/combine, between the
// GPUs of one host. Kernels write straight into the peers' arenas over NVLink and read only their
// own memory; no host round trip.
//
// Synchronisation. Every kernel keeps per-block epochs in its arena header (block b reads its
// epoch e - 1 at the start and stores e at the end; every rank runs the same calls with the same
// grid, so block b's epoch is the same on every rank). Signals carry the epoch and are compared
// wrap-safe, so graph replays keep counting and nothing is ever reset. Ranks wait only for peer
// GPUs, never for another block of their own kernel, so no kernel needs its grid co-resident.
//
// all_to_allv (grid G fixed by the arena's slot size):
//   1. block 0 publishes the count for each peer q into q's arena (a 64-bit word: epoch << 32 |
//      count, one store; parity e & 1, see below);
//   2. block b waits until every receiver's block b has signalled consumed >= e - 1, then writes
//      tiles b, b + G, ... of its data for q into q's staging slot for this rank, and signals
//      data[b] = e (release, cumulative over the block's stores);
//   3. block b reads every source's count word (waiting for epoch e), derives the displacements,
//      waits for each source's data[b] = e (acquire), copies tiles b, b + G, ... out to the user's
//      buffer and signals consumed[b] = e to the source.
//   The receiver's block b read exactly the tiles that the sender's block b writes next, so the
//   per-block consumed flag is enough to reuse the single staging slot. Count words use two
//   parities: a sender writes parity e & 1 in call e only after its call e - 1 saw every
//   receiver's consumed >= e - 2, i.e. after every receiver block had read the count of call e - 2.
//
// dispatch (grid G = max_blocks, one warp per row):
//   1. block 0 tells every peer "ready e" (this rank entered call e, so whatever its stream ran
//      before, the reading of the previous dispatch's rows included, is done);
//   2. every block counts all (token, slot) entries per expert in shared memory (and those before
//      its own chunk of tokens); block 0 publishes the histogram to every peer (64-bit words as
//      above, parity e & 1);
//   3. every block reads all ranks' histograms and computes, for each expert, where this rank's
//      rows start in the receiving rank's buffer (experts in order, then source ranks in order);
//   4. block b waits for "ready e" of every peer, then pushes its tokens' rows (and their Row
//      records) into the receivers' buffers, and adds 1 to an arrival counter in each peer's
//      arena (red.release); it then waits until every peer's counter reached e * G, i.e. every
//      block of every peer has finished pushing to this rank.
// combine (grid G): "ready e" as above (so the source's previous combine has finished reading its
// inbox), then every received row goes back into its source's inbox at (token, slot), arrivals are
// counted as in dispatch, and each rank sums its tokens' slots with the weights. Rows that stayed
// on their own rank are read from the expert output in place.
#include <cuda_runtime.h>

#include "launch.hpp"
#include "load.hpp"
#include "moe.hpp"
#include "peer.cuh"

namespace coccl::kernels::moe {
namespace {

using detail::Vec;

constexpr int threads = detail::block_threads;
constexpr int warps = threads / 32;

// ---- all_to_allv arena header ----
constexpr std::size_t a2av_counts_at = 1024;    // [2][max_ranks] uint64
constexpr std::size_t a2av_data_at = 2048;      // [max_blocks][max_ranks] uint32
constexpr std::size_t a2av_consumed_at = 8192;  // [max_blocks][max_ranks] uint32
constexpr std::size_t a2av_header = a2av_header_bytes;
constexpr std::size_t a2av_tile = 32 * 1024;  // bytes a block moves per tile
static_assert(device::max_blocks * 4 <= a2av_counts_at);
static_assert(a2av_data_at + device::max_blocks * device::max_ranks * 4 <= a2av_consumed_at);
static_assert(a2av_consumed_at + device::max_blocks * device::max_ranks * 4 <= a2av_header);

// ---- dispatcher arena header ----
constexpr std::size_t d_epoch_at = 0;     // [max_blocks] uint32, dispatch
constexpr std::size_t c_epoch_at = 512;   // [max_blocks] uint32, combine
constexpr std::size_t d_ready_at = 1024;  // [max_ranks] uint32, written by the peer
constexpr std::size_t c_ready_at = 1088;
constexpr std::size_t d_arrive_at = 1152;  // [max_ranks] uint32, added to by the peer's blocks
constexpr std::size_t c_arrive_at = 1216;
constexpr std::size_t moe_counts_at = moe_counts_offset;
static_assert(device::max_blocks * 4 <= c_epoch_at - d_epoch_at);
static_assert(c_arrive_at + device::max_ranks * 4 <= moe_counts_at);

__device__ __forceinline__ std::uint32_t* u32_at(char* base, std::size_t off) {
  return reinterpret_cast<std::uint32_t*>(base + off);
}

__device__ __forceinline__ void store_u64_relaxed(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ std::uint64_t load_u64_relaxed(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Release-add: the peer that sees the sum also sees every store the block made before the
// __syncthreads preceding it (the release is cumulative, as in detail::peer_barrier).
__device__ __forceinline__ void red_release_add(std::uint32_t* p, std::uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Device words (in the arenas' headers, apart from every other area) that the first block to
// give up a wait claims (see detail::give_up).
constexpr std::size_t a2av_claim_at = a2av_header - 16;
constexpr std::size_t moe_claim_at = moe_counts_offset - 16;
static_assert(c_arrive_at + device::max_ranks * 4 <= moe_claim_at);

detail::Watch watch_of(const Arenas& ar, std::size_t claim_at, device::OpCode op) {
  detail::Watch w{};
  w.status = ar.status;
  w.claim = reinterpret_cast<std::uint32_t*>(ar.peer[ar.rank] + claim_at);
  w.timeout_ns = ar.timeout_ns != 0 ? ar.timeout_ns : device::default_timeout_ns;
  w.op = static_cast<std::uint32_t>(op);
  return w;
}

// One thread: waits until the count word of `peer` carries `epoch` and sets `count`; false when
// the wait gave up.
__device__ __forceinline__ bool wait_word(const detail::Watch& w, int peer, const std::uint64_t* at,
                                          std::uint32_t epoch, std::uint32_t& count) {
  std::uint64_t v = 0;
  const bool ok = detail::wait_for(w, peer, [&] {
    v = load_u64_relaxed(at);
    return static_cast<std::uint32_t>(v >> 32) == epoch;
  });
  count = static_cast<std::uint32_t>(v);
  return ok;
}

__device__ __forceinline__ void set_error(unsigned* errors, int kind) {
  if (errors != nullptr) *reinterpret_cast<volatile unsigned*>(errors + kind) = 1;
}

__device__ __forceinline__ int granularity_of(const char* p) {
  const auto bits = reinterpret_cast<std::uintptr_t>(p) | 16;
  return static_cast<int>(bits & (~bits + 1));
}

// Copies whole 16-byte vectors with the lanes of one warp, four loads in flight per lane.
__device__ __forceinline__ void warp_copy(char* dst, const char* src, std::size_t nvec, int lane) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  std::size_t i = lane;
  for (; i + 96 < nvec; i += 128) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __ldcg(s + i + 32 * k);
#pragma unroll
    for (int k = 0; k < 4; ++k) d[i + 32 * k] = v[k];
  }
  for (; i < nvec; i += 32) d[i] = __ldcg(s + i);
}

// ---------------------------------------------------------------------------------------------
// all_to_allv

struct A2avParams {
  A2av a;
  Arenas ar;
  detail::Watch watch;
  unsigned* errors;
  std::size_t slot;  // bytes of one source's staging slot
};

__device__ __forceinline__ std::int64_t read_count(const void* p, int i, bool c64) {
  return c64 ? static_cast<const std::int64_t*>(p)[i] : static_cast<const std::int32_t*>(p)[i];
}

__device__ __forceinline__ std::uint64_t* a2av_word(char* ws, int h, int src) {
  return reinterpret_cast<std::uint64_t*>(ws + a2av_counts_at) + h * device::max_ranks + src;
}

// Tiles b, b + G, ... of `bytes` bytes, copied by the whole block.
__device__ __forceinline__ void copy_tiles(char* dst, const char* src, std::size_t bytes) {
  for (std::size_t off = blockIdx.x * a2av_tile; off < bytes; off += gridDim.x * a2av_tile) {
    detail::block_copy(dst + off, granularity_of(dst + off), src + off, granularity_of(src + off),
                       detail::min_size(a2av_tile, bytes - off));
  }
}

__global__ void __launch_bounds__(threads) a2av_kernel(A2avParams P) {
  const int n = P.ar.nranks;
  const int me = P.ar.rank;
  const int t = static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.x);
  char* own = P.ar.peer[me];
  const std::size_t elem = P.a.elem_bytes;
  __shared__ std::uint32_t s_epoch;
  __shared__ std::int64_t sc[device::max_ranks], sd[device::max_ranks];
  __shared__ std::int64_t rc[device::max_ranks], rd[device::max_ranks];
  if (t == 0) {
    s_epoch = u32_at(own, 0)[b] + 1;
    std::int64_t next = 0;
    for (int q = 0; q < n; ++q) {
      std::int64_t c = read_count(P.a.send_counts, q, P.a.counts64);
      if (c < 0) {
        set_error(P.errors, count_negative);
        c = 0;
      } else if (static_cast<std::size_t>(c) > P.a.max_count) {
        set_error(P.errors, count_over_max);
        c = static_cast<std::int64_t>(P.a.max_count);
      }
      sc[q] = c;
      sd[q] = P.a.send_displs ? read_count(P.a.send_displs, q, P.a.counts64) : next;
      next += c;
    }
  }
  __syncthreads();
  const std::uint32_t e = s_epoch;
  const int h = static_cast<int>(e & 1);
  const char* send = static_cast<const char*>(P.a.send);
  char* recv = static_cast<char*>(P.a.recv);

  if (b == 0 && t < n && t != me) {
    store_u64_relaxed(a2av_word(P.ar.peer[t], h, me),
                      static_cast<std::uint64_t>(e) << 32 | static_cast<std::uint64_t>(sc[t]));
  }
  bool ok = true;
  if (t < n && t != me) {
    ok = detail::wait_at_least(P.watch, t,
                               u32_at(own, a2av_consumed_at) + b * device::max_ranks + t, e - 1);
  }
  // A wait that gave up ends the block (every thread: the barrier carries the verdict).
  if (!__syncthreads_and(ok)) return;
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    copy_tiles(P.ar.peer[q] + a2av_header + me * P.slot, send + sd[q] * elem, sc[q] * elem);
  }
  __syncthreads();
  if (t < n && t != me) {
    detail::store_release_sys(u32_at(P.ar.peer[t], a2av_data_at) + b * device::max_ranks + me, e);
  }

  if (t < n) {
    std::uint32_t c = 0;
    if (t != me) ok = wait_word(P.watch, t, a2av_word(own, h, t), e, c);
    rc[t] = t == me ? sc[me] : c;
  }
  if (!__syncthreads_and(ok)) return;
  if (t == 0) {
    std::int64_t next = 0;
    for (int q = 0; q < n; ++q) {
      rd[q] = P.a.recv_displs ? read_count(P.a.recv_displs, q, P.a.counts64) : next;
      next += rc[q];
    }
  }
  if (b == 0 && t < n) {
    if (P.a.counts64) {
      static_cast<std::int64_t*>(P.a.recv_counts)[t] = rc[t];
    } else {
      static_cast<std::int32_t*>(P.a.recv_counts)[t] = static_cast<std::int32_t>(rc[t]);
    }
  }
  __syncthreads();
  copy_tiles(recv + rd[me] * elem, send + sd[me] * elem, sc[me] * elem);
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    if (t == 0)
      ok = detail::wait_at_least(P.watch, q, u32_at(own, a2av_data_at) + b * device::max_ranks + q,
                                 e);
    if (!__syncthreads_and(ok)) return;
    copy_tiles(recv + rd[q] * elem, own + a2av_header + q * P.slot, rc[q] * elem);
  }
  // The release is cumulative over the block's reads of the slots (ordered by the barrier): the
  // sender overwrites them only after they are done.
  __syncthreads();
  if (t < n && t != me) {
    detail::store_release_sys(u32_at(P.ar.peer[t], a2av_consumed_at) + b * device::max_ranks + me,
                              e);
  }
  if (t == 0) u32_at(own, 0)[b] = e;
}

bool valid_arenas(const Arenas& ar) {
  if (ar.status == nullptr || ar.nranks < 1 || ar.nranks > device::max_ranks || ar.rank < 0 ||
      ar.rank >= ar.nranks)
    return false;
  for (int i = 0; i < ar.nranks; ++i) {
    if (ar.peer[i] == nullptr) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// dispatch and combine

struct MoeParams {
  MoeShape s;
  MoeLayout L;
  Arenas ar;
  detail::Watch watch;
  unsigned* errors;
  std::size_t row_bytes;
  int tokens;
};

struct Entry {
  std::int32_t dest;  // rank the row went to, -1 if none
  std::int32_t pos;   // its row there, -1 if none or dropped
};
static_assert(sizeof(Entry) == moe_entry_bytes);

__device__ __forceinline__ std::uint64_t* moe_word(char* ws, int h, int src, int expert) {
  return reinterpret_cast<std::uint64_t*>(ws + moe_counts_at) +
         (h * device::max_ranks + src) * max_experts + expert;
}

__device__ __forceinline__ int checked_expert(const std::int32_t* idx, int i, int experts,
                                              unsigned* errors) {
  const int x = idx[i];
  if (x < -1 || x >= experts) {
    set_error(errors, bad_expert);
    return -1;
  }
  return x;
}

__global__ void __launch_bounds__(threads)
    dispatch_kernel(MoeParams P, const char* x, const std::int32_t* topk) {
  const int n = P.ar.nranks;
  const int me = P.ar.rank;
  const int t = static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.x);
  const int G = static_cast<int>(gridDim.x);
  const int lane = t % 32;
  const int warp = t / 32;
  const int E = P.s.num_experts;
  const int El = E / n;
  const int k = P.s.top_k;
  const int cap = static_cast<int>(P.s.capacity);
  char* own = P.ar.peer[me];
  __shared__ std::uint32_t s_epoch;
  __shared__ int hist[max_experts], before[max_experts], running[max_experts];
  __shared__ int tot[max_experts], off[max_experts], seg[max_experts];
  __shared__ int round_e[threads], round_pos[threads];

  if (t == 0) s_epoch = u32_at(own, d_epoch_at)[b] + 1;
  for (int i = t; i < E; i += threads) hist[i] = before[i] = running[i] = 0;
  __syncthreads();
  const std::uint32_t e = s_epoch;
  const int h = static_cast<int>(e & 1);
  if (b == 0 && t < n && t != me)
    detail::store_release_sys(u32_at(P.ar.peer[t], d_ready_at) + me, e);

  // This block's tokens [t0, t1); every block counts all entries (cheap next to the rows) so no
  // block waits for another block of its own grid.
  const int per = (P.tokens + G - 1) / G;
  const int t0 = min(P.tokens, b * per);
  const int t1 = min(P.tokens, t0 + per);
  const int first = t0 * k;
  for (int i = t; i < P.tokens * k; i += threads) {
    const int ex = checked_expert(topk, i, E, b == 0 ? P.errors : nullptr);
    if (ex < 0) continue;
    atomicAdd(&hist[ex], 1);
    if (i < first) atomicAdd(&before[ex], 1);
  }
  __syncthreads();
  if (b == 0) {
    for (int i = t; i < n * E; i += threads) {
      const int q = i / E;
      const int ex = i % E;
      if (q != me) {
        store_u64_relaxed(
            moe_word(P.ar.peer[q], h, me, ex),
            static_cast<std::uint64_t>(e) << 32 | static_cast<std::uint32_t>(hist[ex]));
      }
    }
  }
  // tot[ex]: rows for expert ex from all ranks; off[ex]: from ranks below this one.
  bool ok = true;
  for (int ex = t; ok && ex < E; ex += threads) {
    int sum = 0;
    int below = 0;
    for (int q = 0; ok && q < n; ++q) {
      std::uint32_t c = 0;
      if (q == me)
        c = static_cast<std::uint32_t>(hist[ex]);
      else
        ok = wait_word(P.watch, q, moe_word(own, h, q, ex), e, c);
      sum += static_cast<int>(c);
      if (q < me) below += static_cast<int>(c);
    }
    tot[ex] = sum;
    off[ex] = below;
  }
  // A wait that gave up ends the block (every thread: the barrier carries the verdict).
  if (!__syncthreads_and(ok)) return;
  // seg[ex]: first row of expert ex on its rank (exclusive scan of tot within the rank's
  // experts), one warp per rank.
  if (warp < n) {
    const int base = warp * El;
    int carry = 0;
    for (int c0 = 0; c0 < El; c0 += 32) {
      const int j = c0 + lane;
      const int v = j < El ? tot[base + j] : 0;
      int incl = v;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int u = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += u;
      }
      if (j < El) seg[base + j] = carry + incl - v;
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  __syncthreads();
  for (int ex = t; ex < E; ex += threads) off[ex] += seg[ex];
  if (b == 0) {
    auto* counts = reinterpret_cast<std::int32_t*>(own + P.L.expert_counts);
    auto* offsets = reinterpret_cast<std::int32_t*>(own + P.L.expert_offsets);
    for (int j = t; j <= El; j += threads) {
      const int ex = me * El + j;
      const int start = j < El ? seg[ex] : seg[ex - 1] + tot[ex - 1];
      offsets[j] = min(start, cap);
      if (j < El) counts[j] = min(start + tot[ex], cap) - min(start, cap);
      if (j == El && start > cap) set_error(P.errors, rows_over_capacity);
    }
  }
  if (t < n && t != me) ok = detail::wait_at_least(P.watch, t, u32_at(own, d_ready_at) + t, e);
  if (!__syncthreads_and(ok)) return;

  // Rounds of `threads` entries of this block's chunk: position = the rank's start for the
  // expert + entries before the chunk + entries earlier in the chunk (token, slot order).
  auto* entries = reinterpret_cast<Entry*>(own + P.L.entries);
  const std::size_t nvec = P.row_bytes / 16;
  const int last = t1 * k;
  for (int c0 = first; c0 < last; c0 += threads) {
    const int i = c0 + t;
    const int ex = i < last ? checked_expert(topk, i, E, nullptr) : -1;
    round_e[t] = ex;
    __syncthreads();
    int pos = -1;
    if (ex >= 0) {
      int r = 0;
      for (int j = 0; j < t; ++j) r += round_e[j] == ex;
      pos = off[ex] + before[ex] + running[ex] + r;
      if (pos >= cap) {
        set_error(P.errors, rows_over_capacity);
        pos = -1;
      }
    }
    if (i < last) entries[i] = Entry{ex >= 0 ? ex / El : -1, pos};
    round_pos[t] = pos;
    __syncthreads();
    if (ex >= 0) atomicAdd(&running[ex], 1);
    const int m = min(threads, last - c0);
    for (int j = warp; j < m; j += warps) {
      const int p = round_pos[j];
      if (p < 0) continue;
      const int xe = round_e[j];
      const int d = xe / El;
      const int tok = (c0 + j) / k;
      char* dst = P.ar.peer[d];
      warp_copy(dst + P.L.recv + static_cast<std::size_t>(p) * P.row_bytes,
                x + static_cast<std::size_t>(tok) * P.row_bytes, nvec, lane);
      if (lane == 0) {
        *reinterpret_cast<int4*>(dst + P.L.rows + static_cast<std::size_t>(p) * sizeof(Row)) =
            make_int4(me, tok, (c0 + j) % k, xe);
      }
    }
    __syncthreads();
  }
  if (t < n && t != me) red_release_add(u32_at(P.ar.peer[t], d_arrive_at) + me, 1);
  if (t < n && t != me)
    ok = detail::wait_at_least(P.watch, t, u32_at(own, d_arrive_at) + t,
                               e * static_cast<std::uint32_t>(G));
  if (!__syncthreads_and(ok)) return;
  if (t == 0) u32_at(own, d_epoch_at)[b] = e;
}

template <class C>
__global__ void __launch_bounds__(threads)
    combine_kernel(MoeParams P, const char* y, const float* weights, char* out) {
  const int n = P.ar.nranks;
  const int me = P.ar.rank;
  const int t = static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.x);
  const int G = static_cast<int>(gridDim.x);
  const int lane = t % 32;
  const int warp = t / 32;
  const int k = P.s.top_k;
  const int El = P.s.num_experts / n;
  char* own = P.ar.peer[me];
  __shared__ std::uint32_t s_epoch;
  if (t == 0) s_epoch = u32_at(own, c_epoch_at)[b] + 1;
  __syncthreads();
  const std::uint32_t e = s_epoch;
  if (b == 0 && t < n && t != me)
    detail::store_release_sys(u32_at(P.ar.peer[t], c_ready_at) + me, e);
  const int total = reinterpret_cast<const std::int32_t*>(own + P.L.expert_offsets)[El];
  bool ok = true;
  if (t < n && t != me) ok = detail::wait_at_least(P.watch, t, u32_at(own, c_ready_at) + t, e);
  // A wait that gave up ends the block (every thread: the barrier carries the verdict).
  if (!__syncthreads_and(ok)) return;

  const std::size_t nvec = P.row_bytes / 16;
  const auto* rows = reinterpret_cast<const int4*>(own + P.L.rows);
  for (int r = b * warps + warp; r < total; r += G * warps) {
    const int4 row = rows[r];
    if (row.x == me) continue;
    char* dst =
        P.ar.peer[row.x] + P.L.inbox + (static_cast<std::size_t>(row.y) * k + row.z) * P.row_bytes;
    warp_copy(dst, y + static_cast<std::size_t>(r) * P.row_bytes, nvec, lane);
  }
  __syncthreads();
  if (t < n && t != me) red_release_add(u32_at(P.ar.peer[t], c_arrive_at) + me, 1);
  if (t < n && t != me)
    ok = detail::wait_at_least(P.watch, t, u32_at(own, c_arrive_at) + t,
                               e * static_cast<std::uint32_t>(G));
  if (!__syncthreads_and(ok)) return;

  const auto* entries = reinterpret_cast<const Entry*>(own + P.L.entries);
  const char* inbox = own + P.L.inbox;
  const std::size_t work = static_cast<std::size_t>(P.tokens) * nvec;
  for (std::size_t idx = static_cast<std::size_t>(b) * threads + t; idx < work;
       idx += static_cast<std::size_t>(G) * threads) {
    const std::size_t tok = idx / nvec;
    const std::size_t v = idx % nvec;
    detail::Acc<C, 4> acc;
#pragma unroll
    for (int i = 0; i < detail::Acc<C, 4>::n; ++i) acc.a[i] = 0;
    for (int s = 0; s < k; ++s) {
      const Entry en = entries[tok * k + s];
      if (en.pos < 0) continue;
      const float w = weights[tok * k + s];
      const char* src = en.dest == me ? y + static_cast<std::size_t>(en.pos) * P.row_bytes
                                      : inbox + (tok * k + s) * P.row_bytes;
      const detail::Acc<C, 4> val = detail::widen<C, 4>(detail::load_vec(src + v * 16, 16));
#pragma unroll
      for (int i = 0; i < detail::Acc<C, 4>::n; ++i) acc.a[i] = fmaf(w, val.a[i], acc.a[i]);
    }
    detail::store_vec(out + tok * P.row_bytes + v * 16, 16, detail::narrow<C, 4>(acc, 1));
  }
  if (t == 0) u32_at(own, c_epoch_at)[b] = e;
}

bool make_moe_params(const MoeShape& s, const Arenas& ar, MoeParams& P) {
  if (!valid_arenas(ar) || s.nranks != ar.nranks || !moe_layout(s, P.L)) return false;
  P.s = s;
  P.ar = ar;
  P.watch = watch_of(ar, moe_claim_at, device::OpCode::moe_dispatch);
  P.row_bytes = static_cast<std::size_t>(s.hidden) * size_of(s.type);
  return true;
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

int all_to_allv(const A2av& a, const Arenas& ar, unsigned* errors, stream_t stream) {
  if (!valid_arenas(ar) ||
      !(a.elem_bytes == 1 || a.elem_bytes == 2 || a.elem_bytes == 4 || a.elem_bytes == 8) ||
      a.send_counts == nullptr || a.recv_counts == nullptr || a.max_count >= (1ull << 31)) {
    return cudaErrorInvalidValue;
  }
  if (a.max_count > 0 && (a.send == nullptr || a.recv == nullptr)) return cudaErrorInvalidValue;
  A2avParams P{a, ar, watch_of(ar, a2av_claim_at, device::OpCode::all_to_allv), errors,
               a2av_slot_bytes(a.max_count, a.elem_bytes)};
  const std::size_t tiles = (P.slot + a2av_tile - 1) / a2av_tile;
  const unsigned grid = detail::blocks_for(tiles, 0, device::max_blocks);
  a2av_kernel<<<grid, threads, 0, stream>>>(P);
  return static_cast<int>(cudaGetLastError());
}

int dispatch(const MoeShape& s, const void* x, int tokens, const std::int32_t* topk_idx,
             const Arenas& ar, unsigned* errors, stream_t stream) {
  MoeParams P{};
  if (!make_moe_params(s, ar, P) || tokens < 0 || tokens > s.max_tokens ||
      (tokens > 0 && (x == nullptr || topk_idx == nullptr || !aligned16(x)))) {
    return cudaErrorInvalidValue;
  }
  P.errors = errors;
  P.tokens = tokens;
  dispatch_kernel<<<device::max_blocks, threads, 0, stream>>>(P, static_cast<const char*>(x),
                                                              topk_idx);
  return static_cast<int>(cudaGetLastError());
}

int combine(const MoeShape& s, const void* y, const float* weights, void* out, int tokens,
            const Arenas& ar, stream_t stream) {
  MoeParams P{};
  if (!make_moe_params(s, ar, P) || tokens < 0 || tokens > s.max_tokens || y == nullptr ||
      !aligned16(y) || (tokens > 0 && (weights == nullptr || out == nullptr || !aligned16(out)))) {
    return cudaErrorInvalidValue;
  }
  P.tokens = tokens;
  P.watch.op = static_cast<std::uint32_t>(device::OpCode::moe_combine);
  auto launch = [&](auto codec) {
    combine_kernel<decltype(codec)><<<device::max_blocks, threads, 0, stream>>>(
        P, static_cast<const char*>(y), weights, static_cast<char*>(out));
    return static_cast<int>(cudaGetLastError());
  };
  switch (s.type) {
    case DataType::float32:
      return launch(detail::float_codec<float>{});
    case DataType::float16:
      return launch(detail::half_codec{});
    default:
      return launch(detail::bf16_codec{});
  }
}

int load_moe() {
  if (int rc = detail::load_function(a2av_kernel)) return rc;
  if (int rc = detail::load_function(dispatch_kernel)) return rc;
  if (int rc = detail::load_function(combine_kernel<detail::float_codec<float>>)) return rc;
  if (int rc = detail::load_function(combine_kernel<detail::half_codec>)) return rc;
  return detail::load_function(combine_kernel<detail::bf16_codec>);
}

}  // namespace coccl::kernels::moe
