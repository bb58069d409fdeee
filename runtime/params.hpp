// Every COCCL_* parameter of the library, in one place, so the list is the documentation.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/config.hpp"

namespace coccl::params {

extern config::Param<double> timeout_s;                    // COCCL_TIMEOUT
extern config::Param<std::string> socket_ifname;           // COCCL_SOCKET_IFNAME
extern config::Param<std::string> algo;                    // COCCL_ALGO
extern config::Param<std::string> transport;               // COCCL_TRANSPORT
extern config::Param<bool> shm_disable;                    // COCCL_SHM_DISABLE
extern config::Param<std::string> shm_dir;                 // COCCL_SHM_DIR
extern config::Param<std::int64_t> proxy_threads;          // COCCL_PROXY_THREADS
extern config::Param<std::int64_t> spin_us;                // COCCL_SPIN_US
extern config::Param<std::int64_t> slot_bytes;             // COCCL_SLOT_BYTES
extern config::Param<std::int64_t> slots;                  // COCCL_SLOTS
extern config::Param<std::int64_t> mem_budget;             // COCCL_MEM_BUDGET
extern config::Param<double> link_idle_s;                  // COCCL_LINK_IDLE_S
extern config::Param<std::int64_t> oneshot_max;            // COCCL_ALLREDUCE_ONESHOT_MAX
extern config::Param<std::int64_t> direct_max_ranks;       // COCCL_DIRECT_MAX_RANKS
extern config::Param<std::int64_t> device_oneshot_max;     // COCCL_DEVICE_ONESHOT_MAX
extern config::Param<bool> dependent_launch;               // COCCL_DEPENDENT_LAUNCH
extern config::Param<std::int64_t> device_comms;           // COCCL_DEVICE_COMMS
extern config::Param<std::string> hostid;                  // COCCL_HOSTID
extern config::Param<std::int64_t> net_slot_bytes;         // COCCL_NET_SLOT_BYTES
extern config::Param<std::int64_t> net_lanes;              // COCCL_NET_LANES
extern config::Param<std::string> comm_id;                 // COCCL_COMM_ID
extern config::Param<std::string> secret;                  // COCCL_SECRET
extern config::Param<std::int64_t> bootstrap_pending_max;  // COCCL_BOOTSTRAP_PENDING_MAX
extern config::Param<double> bootstrap_auth_timeout;       // COCCL_BOOTSTRAP_AUTH_TIMEOUT
extern config::Param<std::int64_t> colltrace_size;         // COCCL_COLLTRACE_SIZE
extern config::Param<std::string> ib_hca;                  // COCCL_IB_HCA
extern config::Param<std::int64_t> ib_gid_index;           // COCCL_IB_GID_INDEX
extern config::Param<std::int64_t> ib_qps_per_peer;        // COCCL_IB_QPS_PER_PEER
extern config::Param<std::int64_t> ib_split_bytes;         // COCCL_IB_SPLIT_BYTES
extern config::Param<std::int64_t> ib_zcopy_min;           // COCCL_IB_ZCOPY_MIN
extern config::Param<std::string> tcp_engine;              // COCCL_TCP_ENGINE
extern config::Param<std::int64_t> tcp_sockets;            // COCCL_TCP_SOCKETS
extern config::Param<std::int64_t> tcp_zc_min;             // COCCL_TCP_ZC_MIN

}  // namespace coccl::params
