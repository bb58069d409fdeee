// CUDA runtime calls of the NCCL API layer in a build without CUDA: no GPUs, so every buffer is
// host memory and the device-only calls fail with a message.
#include <cstring>

#include "collectives/nccl/cuda.hpp"

namespace coccl::nccl {
namespace {

const char* no_cuda = "this coccl was built without CUDA";

}  // namespace

int gpu_count() noexcept { return 0; }
int current_device() noexcept { return -1; }
std::string set_device(int) { return no_cuda; }
bool is_device_memory(const void*) noexcept { return false; }

std::string read_bytes(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
  return {};
}

std::string device_alloc(void**, std::size_t) { return no_cuda; }
std::string device_free(void*) { return no_cuda; }
std::string scratch_alloc(void**, std::size_t, cuda_stream) { return no_cuda; }
std::string scratch_free(void*, cuda_stream) { return no_cuda; }
std::string copy_async(void*, const void*, std::size_t, cuda_stream) { return no_cuda; }
std::string pre_multiply(void*, const void*, std::size_t, DataType, const void*, std::uint64_t,
                         cuda_stream) {
  return no_cuda;
}
std::string load_layer_kernels() { return {}; }

}  // namespace coccl::nccl
