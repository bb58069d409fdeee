// coccl-init-bench's device runs (tools/init_bench_device.cpp with CUDA, init_bench_device_none.cpp
// without): ncclCommInitRank plus a first device all_reduce of one float, through the NCCL API of
// a libnccl.so.2 given by path, so coccl's drop-in and NVIDIA's library are timed the same way.
#pragma once

#include <string>

namespace coccl_init_bench {

/// Whether this build has device runs.
bool device_runs_built();

/// One rank of a device run of the library at `lib`: makes its CUDA context (GPU rank % GPUs),
/// rank 0 writes the NCCL unique id to DIR/id, waits at the start gate, then times init and the
/// checked all_reduce (tools/init_gate.hpp). Returns the exit status.
int device_rank_main(int rank, int n, const std::string& dir, const std::string& lib);

}  // namespace coccl_init_bench
