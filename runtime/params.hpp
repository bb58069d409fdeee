// The parameter registry's index, and the parameters read by transport/bootstrap.cpp only.
//
// Each parameter is declared beside the code that reads it (the header of its module) and defined
// at the top of the source that reads it. The ones that only transport/bootstrap.cpp reads are
// still declared here: they move beside their readers with the rewrite of the bootstrap.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "runtime/config.hpp"

namespace coccl::params {

/// Every parameter of the library in this build (those of device collectives with CUDA only, those
/// of the ib transport with the verbs headers only). A static library keeps only the objects that
/// a program refers to; config::all_parameters() refers to this list, so that a program listing
/// the registry sees every parameter, also of modules it never calls.
std::span<const config::ParamBase* const> library();

// Read by transport/bootstrap.cpp only.

extern config::Param<bool> shm_disable;              // COCCL_SHM_DISABLE
extern config::Param<std::int64_t> mem_budget;       // COCCL_MEM_BUDGET
extern config::Param<double> link_idle_s;            // COCCL_LINK_IDLE_S
extern config::Param<std::string> hostid;            // COCCL_HOSTID
extern config::Param<std::int64_t> ib_qps_per_peer;  // COCCL_IB_QPS_PER_PEER
extern config::Param<std::int64_t> ib_split_bytes;   // COCCL_IB_SPLIT_BYTES
extern config::Param<std::int64_t> ib_zcopy_min;     // COCCL_IB_ZCOPY_MIN
extern config::Param<std::int64_t> tcp_sockets;      // COCCL_TCP_SOCKETS

}  // namespace coccl::params
