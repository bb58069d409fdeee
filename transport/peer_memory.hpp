// Sharing a device allocation with the other ranks of a group on one host: each rank advertises
// its allocation (all_gather of PeerAdvert), then maps every peer's, through CUDA IPC across
// processes and peer access between GPUs of one process. Used by the communicator's device
// workspace (collectives/device.cpp) and by the MoE exchange arena (collectives/moe_device.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace coccl::transport {

/// What a rank tells the others about an allocation it shares.
struct PeerAdvert {
  cudaIpcMemHandle_t handle;
  std::uint64_t address;  // in the advertising process
  std::uint64_t host;     // the caller's host identity: equal for ranks of one host
  std::int32_t pid;
  std::int32_t device;
};

/// The advert of `base`, allocated on GPU `device`, from this process on `host`.
cudaError_t advertise(void* base, int device, std::uint64_t host, PeerAdvert& out);

/// Makes the allocation advertised by `theirs` reachable from this process (the caller checked
/// that it is on this host): another process's through IPC (`*ipc` set: unmap it with
/// unmap_peer), another GPU of this process through peer access, enabled once per
/// process and pair of GPUs (enabling it again is an error that compute-sanitizer reports).
cudaError_t map_peer(const PeerAdvert& mine, const PeerAdvert& theirs, void** out, bool* ipc);

/// Closes a mapping that map_peer opened through IPC (`*ipc` was set).
void unmap_peer(void* mapped);

}  // namespace coccl::transport
