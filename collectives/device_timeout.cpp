#include "collectives/device_timeout.hpp"

#include <chrono>

#include "kernels/device.hpp"
#include "runtime/deadline.hpp"

namespace coccl::detail {

std::uint64_t kernel_timeout_ns() {
  const double s = params::timeout_s.get();
  if (!(s > 0)) return device::default_timeout_ns;
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(runtime::default_timeout()).count());
}

}  // namespace coccl::detail
