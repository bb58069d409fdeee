// The parameters of device collectives: on one host (collectives/device.cpp) and across hosts
// (collectives/net_device.cpp). Registered only in builds with CUDA.
#pragma once

#include <cstdint>

#include "runtime/config.hpp"

namespace coccl::params {

extern config::Param<std::int64_t> device_oneshot_max;  // COCCL_DEVICE_ONESHOT_MAX
extern config::Param<bool> dependent_launch;            // COCCL_DEPENDENT_LAUNCH
extern config::Param<std::int64_t> device_comms;        // COCCL_DEVICE_COMMS
extern config::Param<std::int64_t> net_slot_bytes;      // COCCL_NET_SLOT_BYTES
extern config::Param<std::int64_t> net_lanes;           // COCCL_NET_LANES

}  // namespace coccl::params
