#include "transport/peer_memory.hpp"

#include <unistd.h>

#include <mutex>
#include <set>
#include <utility>

namespace coccl::transport {

namespace {

// Peer access this process has enabled, from GPU a to GPU b: several communicators (and MoE
// arenas) over the same GPUs of one process would otherwise enable it again.
std::mutex peer_access_mutex;
std::set<std::pair<int, int>> peer_access;

cudaError_t enable_peer_access(int from, int to) {
  std::lock_guard lock(peer_access_mutex);
  if (peer_access.count({from, to})) return cudaSuccess;
  cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    e = cudaSuccess;
  }
  if (e == cudaSuccess) peer_access.insert({from, to});
  return e;
}

}  // namespace

cudaError_t advertise(void* base, int device, std::uint64_t host, PeerAdvert& out) {
  out = PeerAdvert{};
  if (cudaError_t e = cudaIpcGetMemHandle(&out.handle, base)) return e;
  out.address = reinterpret_cast<std::uintptr_t>(base);
  out.host = host;
  out.pid = ::getpid();
  out.device = device;
  return cudaSuccess;
}

cudaError_t map_peer(const PeerAdvert& mine, const PeerAdvert& theirs, void** out, bool* ipc) {
  *ipc = false;
  if (theirs.pid == mine.pid) {
    // Another GPU driven by this process: peer access instead of IPC (a process cannot open its
    // own IPC handles).
    if (theirs.device != mine.device)
      if (cudaError_t e = enable_peer_access(mine.device, theirs.device)) return e;
    *out = reinterpret_cast<void*>(theirs.address);
    return cudaSuccess;
  }
  if (cudaError_t e = cudaIpcOpenMemHandle(out, theirs.handle, cudaIpcMemLazyEnablePeerAccess))
    return e;
  *ipc = true;
  return cudaSuccess;
}

void unmap_peer(void* mapped) { cudaIpcCloseMemHandle(mapped); }

}  // namespace coccl::transport
