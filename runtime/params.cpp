#include "runtime/params.hpp"

#include "collectives/comm_params.hpp"
#include "runtime/deadline.hpp"
#include "runtime/engine.hpp"
#include "transport/admission.hpp"
#include "transport/shm.hpp"
#include "transport/tcp_uring.hpp"
#include "transport/wire.hpp"
#if COCCL_HAVE_IB
#include "transport/ib_verbs.hpp"
#endif
#if COCCL_HAVE_CUDA
#include "collectives/device_params.hpp"
#endif

namespace coccl::params {

config::Param<bool> shm_disable{"COCCL_SHM_DISABLE", false, "never use the shared-memory transport",
                                "NCCL_SHM_DISABLE"};
config::Param<std::int64_t> mem_budget{
    "COCCL_MEM_BUDGET", std::int64_t{1} << 30,
    "bytes of receive rings the links of one communicator may hold (0: no limit); a link that "
    "would exceed it first closes the least recently used idle link, and an operation fails when "
    "none can be closed"};
config::Param<double> link_idle_s{
    "COCCL_LINK_IDLE_S", 0.0,
    "seconds after which a link no operation used is closed (both ends agree; the next "
    "operation that needs it opens it again); 0: never"};
config::Param<std::string> hostid{
    "COCCL_HOSTID", "",
    "host identity: ranks with equal values are on one host (empty: the host name and boot id), "
    "so one machine can act as several hosts and take the network path between its ranks",
    "NCCL_HOSTID"};
config::Param<std::int64_t> ib_qps_per_peer{
    "COCCL_IB_QPS_PER_PEER", 2,
    "data queue pairs per ib connection; a large put is split across them",
    "NCCL_IB_QPS_PER_CONNECTION"};
config::Param<std::int64_t> ib_split_bytes{
    "COCCL_IB_SPLIT_BYTES", 64 << 10,
    "smallest piece of a put split across the queue pairs of an ib connection"};
config::Param<std::int64_t> ib_zcopy_min{
    "COCCL_IB_ZCOPY_MIN", 64 << 10,
    "smallest transfer an ib connection moves as a block: zero-copy when both buffers are "
    "registered (register_buffer), after a rendezvous; every rank must use the same value"};
config::Param<std::int64_t> tcp_sockets{
    "COCCL_TCP_SOCKETS", 2,
    "sockets per tcp link under the uring engine (1 to 16), puts striped over them in turn; a "
    "link takes the smaller count of its two ends (1 where one end runs the asio engine)"};

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
    &oneshot_max,
    &direct_max_ranks,
    &hostid,
    &comm_id,
    &secret,
    &bootstrap_pending_max,
    &bootstrap_auth_timeout,
    &colltrace_size,
    &ib_qps_per_peer,
    &ib_split_bytes,
    &ib_zcopy_min,
    &tcp_engine,
    &tcp_sockets,
    &tcp_zc_min,
#if COCCL_HAVE_IB
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
