// kernels/moe_net.cu: the local halves of MoE dispatch and combine across hosts (see moe_net.hpp).
// None of these kernels waits for anything: the network all_to_allv between them does the
// waiting, so they need no co-residency and no epochs; stream order is their only contract.
#include <cuda_runtime.h>

#include "moe_net.hpp"
#include "peer.cuh"

namespace coccl::kernels::moe {
namespace {

constexpr int threads = detail::block_threads;
constexpr int warps = threads / 32;
// A block per 16 entries or rows, up to this many: enough warps to keep the copies busy.
constexpr unsigned max_grid = 128;

struct P {
  MoeShape s;
  NetMoeLayout L;
  int rank;
  char* base;
  unsigned* errors;
  std::size_t row_bytes;
};

__device__ __forceinline__ void set_error(unsigned* errors, int kind) {
  if (errors != nullptr) *reinterpret_cast<volatile unsigned*>(errors + kind) = 1;
}

__device__ __forceinline__ std::int64_t* counts_of(const P& p, int which) {
  return reinterpret_cast<std::int64_t*>(p.base + p.L.counts) + which * p.s.nranks;
}

__device__ __forceinline__ char* element(const P& p, std::size_t area, std::size_t i) {
  return p.base + area + i * p.L.elem;
}

// Where the rows of source q are on the receiver: B, except the own segment, which never leaves
// A (dispatch sends it nowhere, and combine's answer goes back into it).
__device__ __forceinline__ std::size_t area_of(const P& p, int q) {
  return q == p.rank ? p.L.send : p.L.recv;
}

// Copies whole 16-byte vectors with the lanes of one warp.
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

// Exclusive scan of v[0..len) into out[0..len) by one warp; returns the total.
__device__ __forceinline__ int warp_scan(const int* v, int* out, int len, int lane) {
  int carry = 0;
  for (int c0 = 0; c0 < len; c0 += 32) {
    const int j = c0 + lane;
    const int x = j < len ? v[j] : 0;
    int incl = x;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int u = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += u;
    }
    if (j < len) out[j] = carry + incl - x;
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  return carry;
}

__global__ void __launch_bounds__(threads)
    pack_kernel(P p, const char* x, int tokens, const std::int32_t* topk) {
  const int n = p.s.nranks;
  const int t = static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.x);
  const int G = static_cast<int>(gridDim.x);
  const int lane = t % 32;
  const int warp = t / 32;
  const int E = p.s.num_experts;
  const int El = E / n;
  const int k = p.s.top_k;
  const int cap = static_cast<int>(p.L.rows_per_peer);
  __shared__ int hist[max_experts], before[max_experts], running[max_experts], seg[max_experts];
  __shared__ int round_e[threads], round_pos[threads];

  for (int i = t; i < E; i += threads) hist[i] = before[i] = running[i] = 0;
  __syncthreads();
  // This block's tokens [t0, t1); every block counts all entries (cheap next to the rows), so
  // blocks never wait for each other.
  const int per = (tokens + G - 1) / G;
  const int t0 = min(tokens, b * per);
  const int t1 = min(tokens, t0 + per);
  const int first = t0 * k;
  for (int i = t; i < tokens * k; i += threads) {
    int ex = topk[i];
    if (ex < -1 || ex >= E) {
      if (b == 0) set_error(p.errors, bad_expert);
      ex = -1;
    }
    if (ex < 0) continue;
    atomicAdd(&hist[ex], 1);
    if (i < first) atomicAdd(&before[ex], 1);
  }
  __syncthreads();
  // seg[ex]: the destination rank's rows for experts before ex (its own experts only).
  for (int q = warp; q < n; q += warps) warp_scan(hist + q * El, seg + q * El, El, lane);
  __syncthreads();
  if (b == 0) {
    std::int64_t* send = counts_of(p, dispatch_send);
    for (int q = t; q < n; q += threads) {
      const int total = seg[q * El + El - 1] + hist[q * El + El - 1];
      // The own segment stays in A, where place_kernel reads it.
      send[q] = q == p.rank ? 0 : static_cast<std::int64_t>(p.L.head) + min(total, cap);
      if (total > cap) set_error(p.errors, rows_over_capacity);
    }
    // The full per-expert counts, so that the receiver can place rows exactly as if nothing had
    // been held back here.
    for (int i = t; i < E; i += threads) {
      const int q = i / El;
      reinterpret_cast<std::int32_t*>(
          element(p, p.L.send, static_cast<std::size_t>(q) * p.L.per_peer))[i % El] = hist[i];
    }
  }

  auto* entries = reinterpret_cast<std::int32_t*>(p.base + p.L.entries);
  const std::size_t nvec = p.row_bytes / 16;
  const int last = t1 * k;
  for (int c0 = first; c0 < last; c0 += threads) {
    const int i = c0 + t;
    int ex = i < last ? topk[i] : -1;
    if (ex < -1 || ex >= E) ex = -1;
    round_e[t] = ex;
    __syncthreads();
    int at = -1;
    if (ex >= 0) {
      int r = 0;
      for (int j = 0; j < t; ++j) r += round_e[j] == ex;
      const int pos = seg[ex] + before[ex] + running[ex] + r;
      // Rows past `cap` for one rank are past its capacity wherever the others' rows go.
      if (pos < cap)
        at = static_cast<int>(static_cast<std::size_t>(ex / El) * p.L.per_peer + p.L.head + pos);
    }
    if (i < last) entries[i] = at;
    round_pos[t] = at;
    __syncthreads();
    if (ex >= 0) atomicAdd(&running[ex], 1);
    const int m = min(threads, last - c0);
    for (int j = warp; j < m; j += warps) {
      const int a = round_pos[j];
      if (a < 0) continue;
      const int tok = (c0 + j) / k;
      char* dst = element(p, p.L.send, static_cast<std::size_t>(a));
      if (lane == 0)
        *reinterpret_cast<int4*>(dst) = make_int4(p.rank, tok, (c0 + j) % k, round_e[j]);
      warp_copy(dst + 16, x + static_cast<std::size_t>(tok) * p.row_bytes, nvec, lane);
    }
    __syncthreads();
  }
}

// Rows a source sent, from its count (which includes the head).
__device__ __forceinline__ int staged_of(const P& p, const std::int64_t* counts, int q) {
  const std::int64_t r = counts[q] - static_cast<std::int64_t>(p.L.head);
  return static_cast<int>(r < 0 ? 0
                                : (r > static_cast<std::int64_t>(p.L.rows_per_peer)
                                       ? static_cast<std::int64_t>(p.L.rows_per_peer)
                                       : r));
}

__global__ void __launch_bounds__(threads) place_kernel(P p) {
  const int n = p.s.nranks;
  const int me = p.rank;
  const int t = static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.x);
  const int G = static_cast<int>(gridDim.x);
  const int lane = t % 32;
  const int warp = t / 32;
  const int El = p.s.num_experts / n;
  const int cap = static_cast<int>(p.s.capacity);
  // c[q * El + j]: rows source q has for local expert j; start: where they begin among q's rows;
  // at: where they begin in x.
  __shared__ int c[max_experts], start[max_experts], at[max_experts];
  __shared__ int tot[max_experts], seg[max_experts];
  __shared__ int staged[net_moe_max_ranks];

  std::int64_t* recv = counts_of(p, dispatch_recv);
  for (int i = t; i < n * El; i += threads) {
    const int q = i / El;
    c[i] = max(0, reinterpret_cast<const std::int32_t*>(element(
                      p, area_of(p, q), static_cast<std::size_t>(q) * p.L.per_peer))[i % El]);
  }
  __syncthreads();
  for (int q = t; q < n; q += threads) {
    if (q == me) {
      int own = 0;
      for (int j = 0; j < El; ++j) own += c[q * El + j];
      staged[q] = min(own, static_cast<int>(p.L.rows_per_peer));
    } else {
      staged[q] = staged_of(p, recv, q);
    }
  }
  __syncthreads();
  // combine_pack reads every segment's rows from the counts (after this kernel: stream order).
  if (b == 0 && t == 0) recv[me] = static_cast<std::int64_t>(p.L.head) + staged[me];
  for (int j = t; j < El; j += threads) {
    int sum = 0;
    for (int q = 0; q < n; ++q) sum += c[q * El + j];
    tot[j] = sum;
  }
  for (int q = warp; q < n; q += warps) warp_scan(c + q * El, start + q * El, El, lane);
  __syncthreads();
  if (warp == 0) warp_scan(tot, seg, El, lane);
  __syncthreads();
  for (int j = t; j < El; j += threads) {
    int run = seg[j];
    for (int q = 0; q < n; ++q) {
      at[q * El + j] = run;
      run += c[q * El + j];
    }
  }
  if (b == 0) {
    auto* counts = reinterpret_cast<std::int32_t*>(p.base + p.L.expert_counts);
    auto* offsets = reinterpret_cast<std::int32_t*>(p.base + p.L.expert_offsets);
    for (int j = t; j <= El; j += threads) {
      const int s0 = j < El ? seg[j] : seg[El - 1] + tot[El - 1];
      offsets[j] = min(s0, cap);
      if (j < El) counts[j] = min(s0 + tot[j], cap) - min(s0, cap);
      if (j == El && s0 > cap) set_error(p.errors, rows_over_capacity);
    }
  }
  __syncthreads();

  auto* arrival = reinterpret_cast<std::int32_t*>(p.base + p.L.arrival);
  const std::size_t nvec = p.row_bytes / 16;
  const int per = static_cast<int>(p.L.rows_per_peer);
  const long long work = static_cast<long long>(n) * per;
  for (long long w = static_cast<long long>(b) * warps + warp; w < work;
       w += static_cast<long long>(G) * warps) {
    const int q = static_cast<int>(w / per);
    const int r = static_cast<int>(w % per);
    if (r >= staged[q]) continue;
    const char* src =
        element(p, area_of(p, q), static_cast<std::size_t>(q) * p.L.per_peer + p.L.head + r);
    const int4 rec = *reinterpret_cast<const int4*>(src);
    const int j = rec.w - me * El;
    int pos = -1;
    if (j >= 0 && j < El && r >= start[q * El + j] && r < start[q * El + j] + c[q * El + j])
      pos = at[q * El + j] + (r - start[q * El + j]);
    if (pos >= cap) pos = -1;
    if (lane == 0) arrival[w] = pos;
    if (pos < 0) continue;
    char* dst = p.base + p.L.x + static_cast<std::size_t>(pos) * p.row_bytes;
    if (lane == 0)
      *reinterpret_cast<int4*>(p.base + p.L.rows + static_cast<std::size_t>(pos) * sizeof(Row)) =
          rec;
    warp_copy(dst, src + 16, nvec, lane);
  }
}

__global__ void __launch_bounds__(threads) combine_pack_kernel(P p, const char* y) {
  const int n = p.s.nranks;
  const int t = static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.x);
  const int G = static_cast<int>(gridDim.x);
  const int lane = t % 32;
  const int warp = t / 32;
  __shared__ int staged[net_moe_max_ranks];
  const std::int64_t* recv = counts_of(p, dispatch_recv);
  for (int q = t; q < n; q += threads) {
    staged[q] = staged_of(p, recv, q);
    if (b == 0) counts_of(p, combine_send)[q] = q == p.rank ? 0 : staged[q];
  }
  __syncthreads();
  const auto* arrival = reinterpret_cast<const std::int32_t*>(p.base + p.L.arrival);
  const std::size_t nvec = p.row_bytes / 16;
  const int per = static_cast<int>(p.L.rows_per_peer);
  const long long work = static_cast<long long>(n) * per;
  for (long long w = static_cast<long long>(b) * warps + warp; w < work;
       w += static_cast<long long>(G) * warps) {
    const int q = static_cast<int>(w / per);
    const int r = static_cast<int>(w % per);
    if (r >= staged[q]) continue;
    const int pos = arrival[w];
    // The own rows go straight to where combine_sum reads them.
    char* dst =
        element(p, area_of(p, q), static_cast<std::size_t>(q) * p.L.per_peer + p.L.head + r);
    if (lane == 0) *reinterpret_cast<int4*>(dst) = make_int4(pos >= 0 ? 1 : 0, 0, 0, 0);
    if (pos >= 0) warp_copy(dst + 16, y + static_cast<std::size_t>(pos) * p.row_bytes, nvec, lane);
  }
}

template <class C>
__global__ void __launch_bounds__(threads)
    combine_sum_kernel(P p, const float* weights, char* out, int tokens) {
  const int k = p.s.top_k;
  const auto* entries = reinterpret_cast<const std::int32_t*>(p.base + p.L.entries);
  const std::size_t nvec = p.row_bytes / 16;
  const std::size_t work = static_cast<std::size_t>(tokens) * nvec;
  for (std::size_t idx = static_cast<std::size_t>(blockIdx.x) * threads + threadIdx.x; idx < work;
       idx += static_cast<std::size_t>(gridDim.x) * threads) {
    const std::size_t tok = idx / nvec;
    const std::size_t v = idx % nvec;
    detail::Acc<C, 4> acc;
#pragma unroll
    for (int i = 0; i < detail::Acc<C, 4>::n; ++i) acc.a[i] = 0;
    for (int s = 0; s < k; ++s) {
      const int a = entries[tok * k + s];
      if (a < 0) continue;
      const char* src = element(p, p.L.send, static_cast<std::size_t>(a));
      if (__ldcg(reinterpret_cast<const int*>(src)) == 0) {
        // Dropped by the receiver: the sender learns it here, as it would on one host.
        if (v == 0) set_error(p.errors, rows_over_capacity);
        continue;
      }
      const float w = weights[tok * k + s];
      const detail::Acc<C, 4> val = detail::widen<C, 4>(detail::load_vec(src + 16 + v * 16, 16));
#pragma unroll
      for (int i = 0; i < detail::Acc<C, 4>::n; ++i) acc.a[i] = fmaf(w, val.a[i], acc.a[i]);
    }
    detail::store_vec(out + tok * p.row_bytes + v * 16, 16, detail::narrow<C, 4>(acc, 1));
  }
}

bool params_of(const NetMoe& m, P& p) {
  NetMoeLayout L{};
  if (m.base == nullptr || m.rank < 0 || m.rank >= m.shape.nranks || !net_moe_layout(m.shape, L) ||
      L.total != m.L.total)
    return false;
  p.s = m.shape;
  p.L = m.L;
  p.rank = m.rank;
  p.base = m.base;
  p.errors = m.errors;
  p.row_bytes = static_cast<std::size_t>(m.shape.hidden) * size_of(m.shape.type);
  return true;
}

bool aligned16(const void* q) { return reinterpret_cast<std::uintptr_t>(q) % 16 == 0; }

unsigned grid_for(std::size_t units) {
  return detail::blocks_for((units + 15) / 16, 0, static_cast<int>(max_grid));
}

}  // namespace

int net_dispatch_pack(const NetMoe& m, const void* x, int tokens, const std::int32_t* topk_idx,
                      CUstream_st* stream) {
  P p{};
  if (!params_of(m, p) || tokens < 0 || tokens > m.shape.max_tokens ||
      (tokens > 0 && (x == nullptr || topk_idx == nullptr || !aligned16(x))))
    return cudaErrorInvalidValue;
  const unsigned grid = grid_for(static_cast<std::size_t>(tokens) * m.shape.top_k);
  pack_kernel<<<grid, threads, 0, stream>>>(p, static_cast<const char*>(x), tokens, topk_idx);
  return static_cast<int>(cudaGetLastError());
}

int net_dispatch_place(const NetMoe& m, CUstream_st* stream) {
  P p{};
  if (!params_of(m, p)) return cudaErrorInvalidValue;
  place_kernel<<<grid_for(m.shape.nranks * m.L.rows_per_peer), threads, 0, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

int net_combine_pack(const NetMoe& m, const void* y, CUstream_st* stream) {
  P p{};
  if (!params_of(m, p) || y == nullptr || !aligned16(y)) return cudaErrorInvalidValue;
  combine_pack_kernel<<<grid_for(m.shape.nranks * m.L.rows_per_peer), threads, 0, stream>>>(
      p, static_cast<const char*>(y));
  return static_cast<int>(cudaGetLastError());
}

int net_combine_sum(const NetMoe& m, const float* weights, void* out, int tokens,
                    CUstream_st* stream) {
  P p{};
  if (!params_of(m, p) || tokens < 0 || tokens > m.shape.max_tokens ||
      (tokens > 0 && (weights == nullptr || out == nullptr || !aligned16(out))))
    return cudaErrorInvalidValue;
  const std::size_t work = static_cast<std::size_t>(tokens) * (p.row_bytes / 16);
  const unsigned grid =
      detail::blocks_for((work + threads - 1) / threads, 0, static_cast<int>(4 * max_grid));
  auto launch = [&](auto codec) {
    combine_sum_kernel<decltype(codec)>
        <<<grid, threads, 0, stream>>>(p, weights, static_cast<char*>(out), tokens);
    return static_cast<int>(cudaGetLastError());
  };
  switch (m.shape.type) {
    case DataType::float32:
      return launch(detail::float_codec<float>{});
    case DataType::float16:
      return launch(detail::half_codec{});
    default:
      return launch(detail::bf16_codec{});
  }
}

int load_net_moe() {
  if (int rc = detail::load_function(pack_kernel)) return rc;
  if (int rc = detail::load_function(place_kernel)) return rc;
  if (int rc = detail::load_function(combine_pack_kernel)) return rc;
  if (int rc = detail::load_function(combine_sum_kernel<detail::float_codec<float>>)) return rc;
  if (int rc = detail::load_function(combine_sum_kernel<detail::half_codec>)) return rc;
  return detail::load_function(combine_sum_kernel<detail::bf16_codec>);
}

}  // namespace coccl::kernels::moe
