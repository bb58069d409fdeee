// coccl-moe-bench's GPU helpers: the packing and unpacking kernels of the NCCL baseline (the usual
// way: count per destination, permute rows into a send buffer, exchange, weighted sum back), and
// the input generator. See coccl_moe_bench_kernels.hpp.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "coccl_moe_bench_kernels.hpp"

namespace bench {
namespace {

constexpr int threads = 512;

__global__ void histogram_kernel(const std::int32_t* idx, int entries, int* hist) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < entries; i += gridDim.x * blockDim.x) {
    if (idx[i] >= 0) atomicAdd(&hist[idx[i]], 1);
  }
}

// One block: expert bases (experts of one destination are consecutive, so this is also
// destination-major), rows per destination, and zeroed cursors.
__global__ void scan_kernel(const int* hist, int* base, int* cursor, int experts, int nranks,
                            std::int64_t* send_rows) {
  if (threadIdx.x != 0) return;
  const int local = experts / nranks;
  int run = 0;
  for (int d = 0; d < nranks; ++d) {
    const int start = run;
    for (int j = 0; j < local; ++j) {
      const int e = d * local + j;
      base[e] = run;
      run += hist[e];
      cursor[e] = 0;
    }
    send_rows[d] = run - start;
  }
}

// One warp per entry: position = expert base + arrival order (atomic), copy the row.
__global__ void pack_kernel(const std::int32_t* idx, int entries, int k, const int* base,
                            int* cursor, int* pos, const uint4* x, uint4* send, int vecs) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int nwarps = gridDim.x * blockDim.x / 32;
  for (int i = warp; i < entries; i += nwarps) {
    const int e = idx[i];
    int p = -1;
    if (lane == 0 && e >= 0) p = base[e] + atomicAdd(&cursor[e], 1);
    p = __shfl_sync(0xffffffffu, p, 0);
    if (lane == 0) pos[i] = p;
    if (p < 0) continue;
    const uint4* src = x + static_cast<std::size_t>(i / k) * vecs;
    uint4* dst = send + static_cast<std::size_t>(p) * vecs;
    for (int v = lane; v < vecs; v += 32) dst[v] = src[v];
  }
}

// out[t] = sum over slots of w * back[pos], float accumulation, bf16 rounding.
__global__ void unpack_kernel(const int* pos, const float* w, int tokens, int k,
                              const __nv_bfloat16* back, __nv_bfloat16* out, int hidden) {
  const std::size_t work = static_cast<std::size_t>(tokens) * hidden;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < work;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t t = i / hidden, h = i % hidden;
    float acc = 0;
    for (int s = 0; s < k; ++s) {
      const int p = pos[t * k + s];
      if (p < 0) continue;
      acc =
          fmaf(w[t * k + s], __bfloat162float(back[static_cast<std::size_t>(p) * hidden + h]), acc);
    }
    out[i] = __float2bfloat16_rn(acc);
  }
}

}  // namespace

int pack(const Pack& a, cudaStream_t st) {
  const int entries = a.tokens * a.k;
  cudaMemsetAsync(a.hist, 0, a.experts * sizeof(int), st);
  histogram_kernel<<<64, threads, 0, st>>>(a.idx, entries, a.hist);
  scan_kernel<<<1, 32, 0, st>>>(a.hist, a.base, a.cursor, a.experts, a.nranks, a.send_rows);
  pack_kernel<<<132, threads, 0, st>>>(a.idx, entries, a.k, a.base, a.cursor, a.pos,
                                       static_cast<const uint4*>(a.x), static_cast<uint4*>(a.send),
                                       a.row_bytes / 16);
  return static_cast<int>(cudaGetLastError());
}

int unpack(const int* pos, const float* w, int tokens, int k, const void* back, void* out,
           int hidden, cudaStream_t st) {
  unpack_kernel<<<264, threads, 0, st>>>(pos, w, tokens, k, static_cast<const __nv_bfloat16*>(back),
                                         static_cast<__nv_bfloat16*>(out), hidden);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace bench
