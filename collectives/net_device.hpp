// Device operations of a communicator whose ranks span hosts: a staging kernel on the caller's
// stream (kernels/net.hpp) and this proxy on the communicator's proxy thread, which runs each
// staged round as a host operation over the communicator's links (shm within a host, ib or tcp
// across). No host callback and no host synchronisation: the kernel and the proxy meet in pinned
// host memory.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <system_error>

#include "collectives/comm.hpp"

namespace coccl::detail {

class NetDevice;

/// Makes the staging, the mailbox and the kernels' counters and starts the proxy on the
/// communicator's proxy thread, which stops serving once `status->abort` is raised. Any thread
/// but the proxy thread; not collective.
std::error_code make_net_device(const std::shared_ptr<CommImpl>& comm, device::Status* status,
                                std::shared_ptr<NetDevice>& out);

/// Enqueues `a` on `s` (already ordered after the communicator's previous launch). `graph` is
/// the graph being captured on `s`, or null for an eager launch. `ws` gives the Status, the
/// deadline, the sequence number and the grid limit.
std::error_code net_launch(NetDevice& net, CommImpl& c, const OpArgs& a, cudaStream_t s,
                           cudaGraph_t graph, const device::Workspace& ws);

/// The all_to_allv kernel with device counts (kernels/net.hpp), like net_launch.
std::error_code net_launch_a2av(NetDevice& net, CommImpl& c, const kernels::NetA2av& args,
                                cudaStream_t s, cudaGraph_t graph, const device::Workspace& ws);

}  // namespace coccl::detail
