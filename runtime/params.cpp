#include "runtime/params.hpp"

#include "collectives/comm_params.hpp"
#include "collectives/fast_path.hpp"
#include "runtime/deadline.hpp"
#include "runtime/engine.hpp"
#include "transport/admission.hpp"
#include "transport/bootstrap.hpp"
#include "transport/host_leader.hpp"
#include "transport/memory.hpp"
#include "transport/peers.hpp"
#include "transport/shm.hpp"
#include "transport/tcp.hpp"
#include "transport/tcp_uring.hpp"
#include "transport/wire.hpp"
#if COCCL_HAVE_IB
#include "transport/ib.hpp"
#include "transport/ib_verbs.hpp"
#endif
#if COCCL_HAVE_CUDA
#include "collectives/device_params.hpp"
#endif

namespace coccl::params {

std::span<const config::ParamBase* const> library() {
  static const config::ParamBase* const all[] = {
    &timeout_s,
    &socket_ifname,
    &algo,
    &transport,
    &shm_disable,
    &shm_dir,
    &proxy_threads,
    &spin_us,
    &slot_bytes,
    &slots,
    &mem_budget,
    &link_idle_s,
    &directory_full,
    &host_leaders,
    &memory_stream_bytes,
    &oneshot_max,
    &direct_max_ranks,
    &fast_max_bytes,
    &hostid,
    &comm_id,
    &secret,
    &bootstrap,
    &bootstrap_pending_max,
    &bootstrap_auth_timeout,
    &bootstrap_pending_grace,
    &bootstrap_silent_grace,
    &colltrace_size,
    &tcp_engine,
    &tcp_sockets,
    &tcp_zc_min,
#if COCCL_HAVE_IB
    &ib_qps_per_peer,
    &ib_split_bytes,
    &ib_zcopy_min,
    &ib_hca,
    &ib_gid_index,
#endif
#if COCCL_HAVE_CUDA
    &device_oneshot_max,
    &dependent_launch,
    &device_comms,
    &net_slot_bytes,
    &net_lanes,
#endif
  };
  return all;
}

}  // namespace coccl::params
