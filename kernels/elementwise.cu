// kernels/elementwise.cu: reduce, copy and divide_by over local device buffers.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "codec.cuh"
#include "launch.hpp"
#include "load.hpp"
#include "memory.cuh"

namespace coccl::kernels {
namespace {

using detail::Vec;

struct Sources {
  const char* p[max_reduce_sources];
};

// Grid-stride loops with one block per SM's worth of work at most: enough to saturate HBM.
unsigned grid_for(std::size_t nvec) {
  const std::size_t blocks =
      (nvec + detail::block_threads_elementwise - 1) / detail::block_threads_elementwise;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, 1024));
}

template <class C>
__global__ void __launch_bounds__(detail::block_threads_elementwise)
    reduce_kernel(char* dst, Sources srcs, int nsrc, std::size_t nbytes, ReduceOp op, int g) {
  const std::size_t nvec = (nbytes + 15) / 16;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < nvec;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t off = i * 16;
    const int valid = static_cast<int>(detail::min_size(16, nbytes - off));
    auto acc = detail::widen<C, 4>(detail::load_any(srcs.p[0] + off, g, valid));
    for (int s = 1; s < nsrc; ++s) {
      detail::combine<C, 4>(acc, detail::load_any(srcs.p[s] + off, g, valid), op);
    }
    detail::store_any(dst + off, g, valid, detail::narrow<C, 4>(acc, 1));
  }
}

template <class C>
__global__ void __launch_bounds__(detail::block_threads_elementwise)
    divide_kernel(char* data, std::size_t nbytes, int divisor, int g) {
  using S = typename C::storage;
  constexpr int per = 16 / sizeof(S);
  const std::size_t nvec = (nbytes + 15) / 16;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < nvec;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t off = i * 16;
    const int valid = static_cast<int>(detail::min_size(16, nbytes - off));
    Vec v = detail::load_any(data + off, g, valid);
    S s[per];
    std::memcpy(s, v.w, 16);
#pragma unroll
    for (int k = 0; k < per; ++k) s[k] = detail::divide_one<C>(s[k], divisor);
    std::memcpy(v.w, s, 16);
    detail::store_any(data + off, g, valid, v);
  }
}

__global__ void __launch_bounds__(detail::block_threads_elementwise)
    copy_kernel(char* dst, const char* src, std::size_t nbytes, int gd, int gs) {
  const std::size_t nvec = (nbytes + 15) / 16;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < nvec;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t off = i * 16;
    const int valid = static_cast<int>(detail::min_size(16, nbytes - off));
    detail::store_any(dst + off, gd, valid, detail::load_any(src + off, gs, valid));
  }
}

}  // namespace

int reduce(void* dst, const void* const* srcs, int nsrc, std::size_t count, DataType type,
           ReduceOp op, stream_t stream) {
  if (!is_valid(type) || !is_valid(op) || nsrc < 1 || nsrc > max_reduce_sources ||
      srcs == nullptr || (count != 0 && dst == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) return cudaSuccess;
  const std::size_t nbytes = count * size_of(type);
  Sources s{};
  int g = detail::granularity(dst);
  for (int i = 0; i < nsrc; ++i) {
    if (srcs[i] == nullptr) return cudaErrorInvalidValue;
    s.p[i] = static_cast<const char*>(srcs[i]);
    g = std::min(g, detail::granularity(srcs[i]));
  }
  return detail::with_codec(type, [&](auto codec) {
    using C = decltype(codec);
    reduce_kernel<C>
        <<<grid_for((nbytes + 15) / 16), detail::block_threads_elementwise, 0, stream>>>(
            static_cast<char*>(dst), s, nsrc, nbytes, op, g);
    return static_cast<int>(cudaGetLastError());
  });
}

int copy(void* dst, const void* src, std::size_t bytes, stream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  copy_kernel<<<grid_for((bytes + 15) / 16), detail::block_threads_elementwise, 0, stream>>>(
      static_cast<char*>(dst), static_cast<const char*>(src), bytes, detail::granularity(dst),
      detail::granularity(src));
  return static_cast<int>(cudaGetLastError());
}

int divide_by(void* data, std::size_t count, DataType type, int divisor, stream_t stream) {
  if (!is_valid(type) || divisor < 1 || (count != 0 && data == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (count == 0 || divisor == 1) return cudaSuccess;
  const std::size_t nbytes = count * size_of(type);
  return detail::with_codec(type, [&](auto codec) {
    using C = decltype(codec);
    divide_kernel<C>
        <<<grid_for((nbytes + 15) / 16), detail::block_threads_elementwise, 0, stream>>>(
            static_cast<char*>(data), nbytes, divisor, detail::granularity(data));
    return static_cast<int>(cudaGetLastError());
  });
}

int detail::load_elementwise() {
  if (int rc = detail::load_function(copy_kernel)) return rc;
  return detail::load_for_every_type([](auto codec) {
    using C = decltype(codec);
    if (int rc = detail::load_function(reduce_kernel<C>)) return rc;
    return detail::load_function(divide_kernel<C>);
  });
}

namespace {
std::atomic<int> min_resident{0};
}  // namespace

void detail::note_residency(int blocks) {
  int cur = min_resident.load(std::memory_order_relaxed);
  while ((cur == 0 || blocks < cur) &&
         !min_resident.compare_exchange_weak(cur, blocks, std::memory_order_relaxed)) {
  }
}

int resident_blocks_per_sm() { return min_resident.load(std::memory_order_relaxed); }

int load_kernels() {
  for (int (*load)() : {detail::load_elementwise, detail::load_all_reduce, detail::load_collectives,
                        detail::load_rooted, detail::load_p2p, detail::load_net}) {
    if (int rc = load()) return rc;
  }
  return 0;
}

}  // namespace coccl::kernels
