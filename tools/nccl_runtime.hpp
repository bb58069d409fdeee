// tools/nccl_runtime.hpp: NCCL's C API resolved from libnccl.so.2 at run time, for the tools'
// side-by-side baselines (coccl-perf --baseline nccl, coccl-moe-bench), so neither needs NCCL's
// header or library to build. Only the calls the tools make; values of NCCL's enums are passed as
// int.
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace coccl_tools {

struct NcclId {
  char internal[128];
};
using nccl_comm = void*;

struct Nccl {
  int (*get_unique_id)(NcclId*) = nullptr;
  int (*init_rank)(nccl_comm*, int, NcclId, int) = nullptr;
  int (*destroy)(nccl_comm) = nullptr;
  int (*all_reduce)(const void*, void*, std::size_t, int, int, nccl_comm, cudaStream_t) = nullptr;
  int (*all_gather)(const void*, void*, std::size_t, int, nccl_comm, cudaStream_t) = nullptr;
  int (*reduce_scatter)(const void*, void*, std::size_t, int, int, nccl_comm,
                        cudaStream_t) = nullptr;
  int (*broadcast)(const void*, void*, std::size_t, int, int, nccl_comm, cudaStream_t) = nullptr;
  int (*reduce)(const void*, void*, std::size_t, int, int, int, nccl_comm, cudaStream_t) = nullptr;
  int (*send)(const void*, std::size_t, int, int, nccl_comm, cudaStream_t) = nullptr;
  int (*recv)(void*, std::size_t, int, int, nccl_comm, cudaStream_t) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  int (*get_version)(int*) = nullptr;

  /// Opens the library (`path`: a file name the loader searches for, or a path) and resolves every
  /// call; false if either fails.
  bool load(const char* path = "libnccl.so.2") {
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    return sym(get_unique_id, "ncclGetUniqueId") && sym(init_rank, "ncclCommInitRank") &&
           sym(destroy, "ncclCommDestroy") && sym(all_reduce, "ncclAllReduce") &&
           sym(all_gather, "ncclAllGather") && sym(reduce_scatter, "ncclReduceScatter") &&
           sym(broadcast, "ncclBroadcast") && sym(reduce, "ncclReduce") && sym(send, "ncclSend") &&
           sym(recv, "ncclRecv") && sym(group_start, "ncclGroupStart") &&
           sym(group_end, "ncclGroupEnd") && sym(get_version, "ncclGetVersion");
  }

  /// Throws when an NCCL call returned an error.
  static void ok(int rc, const char* what) {
    if (rc != 0) throw std::runtime_error(std::string(what) + " failed with " + std::to_string(rc));
  }
};

}  // namespace coccl_tools
