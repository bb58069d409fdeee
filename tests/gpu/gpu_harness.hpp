// tests/gpu/gpu_harness.hpp: device buffers and a two-GPU group driven from one process, for the
// kernel tests and the benchmark.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/device.hpp"
#include "kernels/launch.hpp"

namespace coccl::gpu_test {

#define COCCL_CUDA_CHECK(expr)                                                  \
  do {                                                                          \
    const int coccl_rc_ = static_cast<int>(expr);                               \
    if (coccl_rc_ != 0) {                                                       \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(static_cast<cudaError_t>(coccl_rc_)));    \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

/// Number of usable GPUs; 0 when there is no driver or device.
inline int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

/// True when devices 0..n-1 can all reach each other; enables peer access between them (once
/// per process: enabling it again is an API error, which compute-sanitizer reports).
inline bool enable_peers(int n) {
  static int enabled_for = 0;
  if (n <= enabled_for) return true;
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      int ok = 0;
      if (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok) return false;
      COCCL_CUDA_CHECK(cudaSetDevice(a));
      const cudaError_t rc = cudaDeviceEnablePeerAccess(b, 0);
      if (rc == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else if (rc != cudaSuccess) {
        return false;
      }
    }
  }
  enabled_for = n;
  return true;
}

/// A device allocation on one GPU.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(int device, std::size_t bytes) : device_(device), bytes_(bytes) {
    COCCL_CUDA_CHECK(cudaSetDevice(device));
    COCCL_CUDA_CHECK(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    swap(o);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) {
      cudaSetDevice(device_);
      cudaFree(ptr_);
    }
  }

  char* get() const { return static_cast<char*>(ptr_); }
  std::size_t size() const { return bytes_; }

  void upload(const void* host, std::size_t bytes, std::size_t offset = 0) const {
    COCCL_CUDA_CHECK(cudaSetDevice(device_));
    COCCL_CUDA_CHECK(cudaMemcpy(get() + offset, host, bytes, cudaMemcpyHostToDevice));
  }
  std::vector<unsigned char> download(std::size_t bytes, std::size_t offset = 0) const {
    std::vector<unsigned char> out(bytes);
    COCCL_CUDA_CHECK(cudaSetDevice(device_));
    COCCL_CUDA_CHECK(cudaMemcpy(out.data(), get() + offset, bytes, cudaMemcpyDeviceToHost));
    return out;
  }
  void fill(int byte) const {
    COCCL_CUDA_CHECK(cudaSetDevice(device_));
    COCCL_CUDA_CHECK(cudaMemset(ptr_, byte, bytes_));
    // The memset runs on the legacy stream, which the groups' non-blocking streams ignore.
    COCCL_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  int device_ = 0;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

/// One rank per GPU 0..n-1, each with a stream and a zeroed workspace that every other GPU of
/// the group reaches through peer access (the same pointer is valid on every device under UVA).
class Group {
 public:
  Group(int n, std::size_t oneshot_max, std::size_t staging) : n_(n) {
    for (int r = 0; r < n; ++r) {
      workspaces_.emplace_back(r, device::workspace_bytes(n, oneshot_max, staging));
      workspaces_.back().fill(0);
      peers_.push_back(workspaces_.back().get());
      COCCL_CUDA_CHECK(cudaSetDevice(r));
      // One thread drives every rank: a lazily loaded kernel would wait for the peer kernels
      // already spinning on this device.
      COCCL_CUDA_CHECK(kernels::load_kernels());
      cudaStream_t s = nullptr;
      COCCL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams_.push_back(s);
    }
    oneshot_max_ = oneshot_max;
    staging_ = staging;
    sync();
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group() {
    for (int r = 0; r < n_; ++r) {
      cudaSetDevice(r);
      cudaStreamSynchronize(streams_[r]);
      cudaStreamDestroy(streams_[r]);
    }
  }

  int size() const { return n_; }
  cudaStream_t stream(int r) const { return streams_[r]; }
  device::Workspace workspace(int r) const {
    device::Workspace ws;
    ws.peers = peers_.data();
    ws.rank = r;
    ws.nranks = n_;
    ws.oneshot_max_bytes = oneshot_max_;
    ws.staging_bytes = staging_;
    return ws;
  }

  /// Runs f(rank) with each rank's device current: launches for all ranks go out before any
  /// waits, as the peer kernels need.
  template <class F>
  void each(F&& f) const {
    for (int r = 0; r < n_; ++r) {
      COCCL_CUDA_CHECK(cudaSetDevice(r));
      f(r);
    }
  }

  void sync() const {
    for (int r = 0; r < n_; ++r) {
      COCCL_CUDA_CHECK(cudaSetDevice(r));
      if (!streams_.empty() && r < static_cast<int>(streams_.size())) {
        COCCL_CUDA_CHECK(cudaStreamSynchronize(streams_[r]));
      }
      COCCL_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }

 private:
  int n_;
  std::size_t oneshot_max_ = 0;
  std::size_t staging_ = 0;
  std::vector<DeviceBuffer> workspaces_;
  std::vector<void*> peers_;
  std::vector<cudaStream_t> streams_;
};

}  // namespace coccl::gpu_test
