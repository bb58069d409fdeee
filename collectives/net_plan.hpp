// The schedule of a device operation across hosts: which bytes of the user's device buffers each
// round stages (kernels/net.hpp), and the host operation that moves a round over the network.
// Plain C++ (no CUDA): the staging kernel and the proxy follow the same plan, and the unit tests
// check the schedule on the CPU.
#pragma once

#include <coccl/communicator.hpp>
#include <cstdint>
#include <system_error>

#include "kernels/net.hpp"

namespace coccl::detail {

/// The rounds of `a` on rank `rank` of `nranks` through staging areas of `slot` bytes (a
/// multiple of 64, at least 64 * nranks): collectives in the packed layout, send/recv groups and
/// all_to_allv in the pairs layout. errc::unsupported (logged) for more than
/// kernels::net_max_segs non-empty transfers each way. A plan of no rounds has nothing to do.
std::error_code make_net_plan(const OpArgs& a, int rank, int nranks, std::size_t slot,
                              kernels::NetPlan& p);

/// The host operation of round k of plan `p`, made for an operation of `shape`'s kind, type, op
/// and root: it reads the round from the staging area `in` and writes its result into `out`.
OpArgs net_round(const kernels::NetPlan& p, const OpArgs& shape, char* in, char* out,
                 std::uint64_t k);

}  // namespace coccl::detail
