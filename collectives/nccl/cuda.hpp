// The CUDA runtime calls of the NCCL API layer (collectives/nccl/), kept behind plain
// functions so that the layer also builds without CUDA (cuda_none.cpp: no GPUs, host memory
// only).
#pragma once

#include <coccl/communicator.hpp>
#include <coccl/types.hpp>
#include <cstddef>
#include <cstdint>
#include <string>

namespace coccl::kernels {

/// dst[i] = src[i] * scalar for i < count (kernels/nccl_scale.cu), computed in the type's
/// accumulation type (float for the narrow floats) and rounded once. The scalar is read on the
/// device from `scalar_device` when it is not null, else it is the first size_of(type) bytes of
/// `scalar_bits`. dst may equal src. Returns a cudaError_t value.
int nccl_pre_multiply(void* dst, const void* src, std::size_t count, DataType type,
                      const void* scalar_device, std::uint64_t scalar_bits, cuda_stream stream);

/// Loads the pre-multiply kernels onto the current device (see kernels::load_kernels for why
/// this is done before the first collective). Returns a cudaError_t value.
int nccl_load_pre_multiply();

}  // namespace coccl::kernels

namespace coccl::nccl {

/// Number of GPUs this process can use; 0 without CUDA.
int gpu_count() noexcept;

/// The calling thread's current GPU, or -1 when there is none.
int current_device() noexcept;

/// Makes `device` current for the calling thread; returns an error text ("" on success).
std::string set_device(int device);

/// True when `p` is device (or managed) memory; false for host memory and without GPUs.
bool is_device_memory(const void* p) noexcept;

/// Copies `bytes` bytes from `src` (host or device memory) to host memory at `dst`.
std::string read_bytes(void* dst, const void* src, std::size_t bytes);

/// Device memory for ncclMemAlloc/ncclMemFree. Error text, "" on success.
std::string device_alloc(void** p, std::size_t bytes);
std::string device_free(void* p);

/// Stream-ordered scratch (cudaMallocAsync/cudaFreeAsync). Error text, "" on success.
std::string scratch_alloc(void** p, std::size_t bytes, cuda_stream stream);
std::string scratch_free(void* p, cuda_stream stream);

/// Enqueues a device-to-device copy on `stream`. Error text, "" on success.
std::string copy_async(void* dst, const void* src, std::size_t bytes, cuda_stream stream);

/// Enqueues dst = src * scalar (kernels::nccl_pre_multiply). Error text, "" on success.
std::string pre_multiply(void* dst, const void* src, std::size_t count, DataType type,
                         const void* scalar_device, std::uint64_t scalar_bits, cuda_stream stream);

/// Loads the layer's own kernels onto the current device. Error text, "" on success.
std::string load_layer_kernels();

}  // namespace coccl::nccl
