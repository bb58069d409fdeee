// coccl-perf on GPUs: one process per GPU, CUDA-event timing, optional CUDA graphs, and NCCL
// (loaded at run time) measured in the same processes.
#pragma once

#include <coccl/coccl.hpp>

#include "perf_data.hpp"

namespace perf {

/// Number of usable CUDA devices (0 without CUDA support or GPUs).
int gpu_count();

/// Runs the device sweep as one rank on GPU rank % gpu_count(); rank 0 prints the table. With
/// "nccl" among o.baselines, NCCL runs the same sweep in the same processes. Returns the exit
/// status (non-zero if a buffer was wrong or something failed).
int run_device(coccl::Communicator comm, const Options& o);

}  // namespace perf
