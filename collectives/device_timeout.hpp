// How long the device kernels of a communicator or MoE arena wait for a peer.
#pragma once

#include <cstdint>

namespace coccl::detail {

/// How long a device kernel waits for a peer before it gives up (COCCL_TIMEOUT; see
/// device::Workspace::timeout_ns).
std::uint64_t kernel_timeout_ns();

}  // namespace coccl::detail
