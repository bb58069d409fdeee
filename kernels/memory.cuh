// kernels/memory.cuh: 16-byte loads and stores at any element alignment, block-wide copies, and
// the raw memory-model operations (release/acquire at system scope, LL packet accesses).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "codec.cuh"

namespace coccl::kernels::detail {

using Vec = Raw<4>;

inline constexpr int block_threads_elementwise = 256;

__host__ __device__ __forceinline__ constexpr std::size_t min_size(std::size_t a, std::size_t b) {
  return a < b ? a : b;
}

/// Largest power of two (at most 16) dividing every address the kernel forms from `p` plus
/// multiples of `stride` bytes; the kernels access memory in pieces of that size.
inline int granularity(const void* p, std::size_t stride = 16) {
  const auto bits = reinterpret_cast<std::uintptr_t>(p) | stride | 16;
  return static_cast<int>(bits & (~bits + 1));
}

// Loads go through L2 only (.cg): staging data arrives from peers over NVLink behind the L1's
// back, and nothing is read twice, so the L1 has nothing to offer.
__device__ __forceinline__ Vec load_vec(const char* p, int g) {
  Vec v;
  if (g >= 16) {
    const uint4 x = __ldcg(reinterpret_cast<const uint4*>(p));
    v.w[0] = x.x, v.w[1] = x.y, v.w[2] = x.z, v.w[3] = x.w;
  } else if (g == 8) {
    const uint2 a = __ldcg(reinterpret_cast<const uint2*>(p));
    const uint2 b = __ldcg(reinterpret_cast<const uint2*>(p + 8));
    v.w[0] = a.x, v.w[1] = a.y, v.w[2] = b.x, v.w[3] = b.y;
  } else if (g == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v.w[i] = __ldcg(reinterpret_cast<const unsigned*>(p) + i);
  } else {
    unsigned char b[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) b[i] = __ldcg(reinterpret_cast<const unsigned char*>(p) + i);
    std::memcpy(v.w, b, 16);
  }
  return v;
}

__device__ __forceinline__ void store_vec(char* p, int g, const Vec& v) {
  if (g >= 16) {
    *reinterpret_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
  } else if (g == 8) {
    reinterpret_cast<uint2*>(p)[0] = make_uint2(v.w[0], v.w[1]);
    reinterpret_cast<uint2*>(p)[1] = make_uint2(v.w[2], v.w[3]);
  } else if (g == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) reinterpret_cast<unsigned*>(p)[i] = v.w[i];
  } else {
    unsigned char b[16];
    std::memcpy(b, v.w, 16);
#pragma unroll
    for (int i = 0; i < 16; ++i) reinterpret_cast<unsigned char*>(p)[i] = b[i];
  }
}

/// The first `valid` (< 16) bytes at p, zero padded.
__device__ __forceinline__ Vec load_partial(const char* p, int valid) {
  unsigned char b[16] = {};
  for (int i = 0; i < valid; ++i) b[i] = __ldcg(reinterpret_cast<const unsigned char*>(p) + i);
  Vec v;
  std::memcpy(v.w, b, 16);
  return v;
}

__device__ __forceinline__ void store_partial(char* p, int valid, const Vec& v) {
  unsigned char b[16];
  std::memcpy(b, v.w, 16);
  for (int i = 0; i < valid; ++i) p[i] = static_cast<char>(b[i]);
}

__device__ __forceinline__ Vec load_any(const char* p, int g, int valid) {
  return valid == 16 ? load_vec(p, g) : load_partial(p, valid);
}

__device__ __forceinline__ void store_any(char* p, int g, int valid, const Vec& v) {
  if (valid == 16) {
    store_vec(p, g, v);
  } else {
    store_partial(p, valid, v);
  }
}

/// Copies `len` bytes with the threads of one block; four loads in flight per thread when both
/// sides are 16-byte aligned.
__device__ __forceinline__ void block_copy(char* dst, int gd, const char* src, int gs,
                                           std::size_t len) {
  const std::size_t nfull = len / 16;
  const std::size_t T = blockDim.x;
  std::size_t i = threadIdx.x;
  if (gd >= 16 && gs >= 16) {
    for (; i + 3 * T < nfull; i += 4 * T) {
      uint4 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = __ldcg(reinterpret_cast<const uint4*>(src) + i + k * T);
#pragma unroll
      for (int k = 0; k < 4; ++k) reinterpret_cast<uint4*>(dst)[i + k * T] = v[k];
    }
  }
  for (; i < nfull; i += T) store_vec(dst + i * 16, gd, load_vec(src + i * 16, gs));
  const int rest = static_cast<int>(len % 16);
  if (rest != 0 && threadIdx.x == 0) {
    store_partial(dst + nfull * 16, rest, load_partial(src + nfull * 16, rest));
  }
}

__device__ __forceinline__ void store_release_sys(std::uint32_t* p, std::uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ std::uint32_t load_acquire_sys(const std::uint32_t* p) {
  std::uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// LL packets: two (4-byte data, 4-byte flag) pairs in one 16-byte store. The hardware writes each
// aligned 8-byte half atomically, so a reader that sees the flag also sees its data.
__device__ __forceinline__ void store_ll(char* p, std::uint32_t d0, std::uint32_t d1,
                                         std::uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(flag),
               "r"(d1), "r"(flag)
               : "memory");
}

__device__ __forceinline__ uint4 load_ll(const char* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

/// Records that a loaded peer kernel fits `blocks` blocks of 512 threads per SM (see
/// resident_blocks_per_sm in launch.hpp).
void note_residency(int blocks);

/// Loads kernel `f` onto the current device (see load_kernels in launch.hpp); a CUDA error code.
template <class F>
int load_function(F* f) {
  cudaFuncAttributes attr;
  return static_cast<int>(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(f)));
}

/// load_function for a peer kernel (512-thread blocks that wait for other ranks), which also
/// notes how many of its blocks an SM holds.
template <class F>
int load_peer_function(F* f) {
  if (int rc = load_function(f)) return rc;
  int blocks = 0;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &blocks, reinterpret_cast<const void*>(f), 512, 0))
    return static_cast<int>(e);
  if (blocks > 0) note_residency(blocks);
  return 0;
}

/// Loads `Kernel<C>` for the codec of every data type; the first error, or 0.
template <class Load>
int load_for_every_type(Load&& load) {
  for (int t = 0; t < data_type_count; ++t) {
    if (int rc = with_codec(static_cast<DataType>(t), load)) return rc;
  }
  return 0;
}

__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace coccl::kernels::detail
