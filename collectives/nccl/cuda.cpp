// CUDA runtime calls of the NCCL API layer (build with CUDA).
#include "collectives/nccl/cuda.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

namespace coccl::nccl {
namespace {

std::string text(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return std::string(what) + ": " + cudaGetErrorString(e);
}

}  // namespace

int gpu_count() noexcept {
  // Asked once: a machine without a driver answers slowly and never changes its mind.
  static const int n = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return count;
  }();
  return n;
}

int current_device() noexcept {
  if (gpu_count() == 0) return -1;
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

std::string set_device(int device) { return text(cudaSetDevice(device), "cudaSetDevice"); }

bool is_device_memory(const void* p) noexcept {
  if (!p || gpu_count() == 0) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

std::string read_bytes(void* dst, const void* src, std::size_t bytes) {
  if (!is_device_memory(src)) {
    std::memcpy(dst, src, bytes);
    return {};
  }
  return text(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy of the scalar");
}

std::string device_alloc(void** p, std::size_t bytes) {
  return text(cudaMalloc(p, bytes), "cudaMalloc");
}

std::string device_free(void* p) { return text(cudaFree(p), "cudaFree"); }

std::string scratch_alloc(void** p, std::size_t bytes, cuda_stream stream) {
  return text(cudaMallocAsync(p, bytes, stream), "cudaMallocAsync");
}

std::string scratch_free(void* p, cuda_stream stream) {
  return text(cudaFreeAsync(p, stream), "cudaFreeAsync");
}

std::string copy_async(void* dst, const void* src, std::size_t bytes, cuda_stream stream) {
  return text(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync");
}

std::string pre_multiply(void* dst, const void* src, std::size_t count, DataType type,
                         const void* scalar_device, std::uint64_t scalar_bits, cuda_stream stream) {
  return text(static_cast<cudaError_t>(kernels::nccl_pre_multiply(
                  dst, src, count, type, scalar_device, scalar_bits, stream)),
              "pre-multiply kernel");
}

std::string load_layer_kernels() {
  return text(static_cast<cudaError_t>(kernels::nccl_load_pre_multiply()),
              "loading the pre-multiply kernels");
}

}  // namespace coccl::nccl
