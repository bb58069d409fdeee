// How many blocks one device kernel of a communicator may use, so that the kernels of every rank
// and communicator sharing a GPU fit on it together (docs/design.md, "Concurrency"). Plain host
// code: the device side (collectives/device.cpp) gathers one GpuShare per rank.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace coccl::detail {

/// What one rank tells the others about its GPU.
struct GpuShare {
  std::uint64_t host = 0;               // equal for the ranks of one host
  std::array<unsigned char, 16> gpu{};  // the GPU's UUID
  std::int32_t capacity = 0;            // peer-kernel blocks the GPU keeps resident at once
  std::int32_t comms = 0;               // communicators of the rank's process working there
};

/// The grid limit every rank of a communicator uses (equal on all, since grids must match):
/// capacity / (ranks sharing a GPU x communicators per rank x kernels per communicator), taking
/// the worst GPU of the group. Ranks share a GPU when host and UUID are equal. Communicators per
/// rank: the larger of `comms_param` (COCCL_DEVICE_COMMS) and any rank's own count. Kernels per
/// communicator: 2 with dependent launch (the next kernel of a stream is resident while the
/// previous one runs), else 1. A GPU holds `capacity` = SMs x (fewest blocks of any peer kernel
/// one SM holds) blocks, and any mix of fewer blocks fits, since each takes at most 1/(that
/// fewest) of an SM. The result is clamped to 1..device::max_blocks.
int block_budget(const std::vector<GpuShare>& ranks, int comms_param, bool dependent_launch);

}  // namespace coccl::detail
