#include "collectives/device_budget.hpp"

#include <algorithm>
#include <limits>

#include "kernels/device.hpp"

namespace coccl::detail {

int block_budget(const std::vector<GpuShare>& ranks, int comms_param, bool dependent_launch) {
  int sharing = 1;
  int comms = std::max(1, comms_param);
  int capacity = std::numeric_limits<int>::max();
  for (const GpuShare& a : ranks) {
    int same = 0;
    for (const GpuShare& b : ranks) same += b.host == a.host && b.gpu == a.gpu;
    sharing = std::max(sharing, same);
    comms = std::max(comms, static_cast<int>(a.comms));
    capacity = std::min(capacity, static_cast<int>(a.capacity));
  }
  if (ranks.empty()) capacity = 0;
  const int per_gpu = sharing * comms * (dependent_launch ? 2 : 1);
  return std::clamp(capacity / per_gpu, 1, device::max_blocks);
}

}  // namespace coccl::detail
