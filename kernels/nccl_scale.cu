// kernels/nccl_scale.cu: the pre-multiply of the NCCL API's PreMulSum operators
// (collectives/nccl/cuda.hpp declares the launch functions).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "codec.cuh"

namespace coccl::kernels {
namespace {

// The scalar is read on the device when `scalar_device` is set (ncclScalarDevice: it may change
// between launches of a captured graph), else taken from the launch argument.
template <class C>
__global__ void pre_multiply_kernel(typename C::storage* dst, const typename C::storage* src,
                                    std::size_t count, const typename C::storage* scalar_device,
                                    typename C::storage scalar_value) {
  const typename C::acc s = C::widen(scalar_device ? *scalar_device : scalar_value);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    dst[i] = C::narrow(static_cast<typename C::acc>(C::widen(src[i]) * s));
  }
}

constexpr unsigned block_threads = 256;

}  // namespace

int nccl_pre_multiply(void* dst, const void* src, std::size_t count, DataType type,
                      const void* scalar_device, std::uint64_t scalar_bits, CUstream_st* stream) {
  if (count == 0) return 0;
  return detail::with_codec(type, [&](auto codec) -> int {
    using C = decltype(codec);
    using S = typename C::storage;
    S value;
    std::memcpy(&value, &scalar_bits, sizeof value);
    const std::size_t blocks =
        std::clamp<std::size_t>((count + block_threads - 1) / block_threads, 1, 1024);
    pre_multiply_kernel<C><<<static_cast<unsigned>(blocks), block_threads, 0, stream>>>(
        static_cast<S*>(dst), static_cast<const S*>(src), count,
        static_cast<const S*>(scalar_device), value);
    return static_cast<int>(cudaGetLastError());
  });
}

int nccl_load_pre_multiply() {
  for (int t = 0; t < data_type_count; ++t) {
    int rc = detail::with_codec(static_cast<DataType>(t), [](auto codec) -> int {
      cudaFuncAttributes attr;
      return static_cast<int>(cudaFuncGetAttributes(&attr, pre_multiply_kernel<decltype(codec)>));
    });
    if (rc) return rc;
  }
  return 0;
}

}  // namespace coccl::kernels
