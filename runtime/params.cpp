#include "runtime/params.hpp"

namespace coccl::params {

config::Param<double> timeout_s{
    "COCCL_TIMEOUT", 300.0,
    "seconds a communicator waits for a peer to make progress (or for bootstrap) before failing "
    "with timed_out"};
config::Param<std::string> socket_ifname{
    "COCCL_SOCKET_IFNAME", "",
    "network interface(s) for sockets: a name prefix such as eth, ^lo to exclude, =eth0 exact",
    "NCCL_SOCKET_IFNAME"};
config::Param<std::string> algo{
    "COCCL_ALGO", "",
    "force an algorithm by name (each collective takes the names it has; empty: choose by size "
    "and ranks): host all_reduce oneshot, direct, ring or rd (recursive doubling); all_gather "
    "direct, ring or bruck; reduce_scatter direct, ring or rd; broadcast and reduce chain or "
    "tree; device collectives across hosts flat or hierarchical",
    "NCCL_ALGO"};
config::Param<std::string> transport{
    "COCCL_TRANSPORT", "auto",
    "transport between ranks: auto (shm on one host, tcp across hosts), tcp, shm or ib (RDMA "
    "verbs)"};
config::Param<bool> shm_disable{"COCCL_SHM_DISABLE", false, "never use the shared-memory transport",
                                "NCCL_SHM_DISABLE"};
config::Param<std::string> shm_dir{
    "COCCL_SHM_DIR", "",
    "directory for the shm transport's segments (files there instead of POSIX shared memory in "
    "/dev/shm); every rank of a host must see the same one"};
config::Param<std::int64_t> proxy_threads{
    "COCCL_PROXY_THREADS", 1, "proxy threads of the process engine (communicators are spread)"};
config::Param<std::int64_t> spin_us{
    "COCCL_SPIN_US", 2000,
    "microseconds a proxy thread polls without progress before it sleeps on its event sources"};
config::Param<std::int64_t> slot_bytes{"COCCL_SLOT_BYTES", 256 << 10,
                                       "bytes per slot of a connection's receive ring"};
config::Param<std::int64_t> slots{
    "COCCL_SLOTS", 8,
    "slots per connection receive ring (pipelining depth); a link made for an operation of fewer "
    "bytes gets fewer, at least 2"};
config::Param<std::int64_t> mem_budget{
    "COCCL_MEM_BUDGET", std::int64_t{1} << 30,
    "bytes of receive rings the links of one communicator may hold (0: no limit); a link that "
    "would exceed it first closes the least recently used idle link, and an operation fails when "
    "none can be closed"};
config::Param<double> link_idle_s{
    "COCCL_LINK_IDLE_S", 0.0,
    "seconds after which a link no operation used is closed (both ends agree; the next "
    "operation that needs it opens it again); 0: never"};
config::Param<std::int64_t> oneshot_max{
    "COCCL_ALLREDUCE_ONESHOT_MAX", 64 << 10,
    "largest host all_reduce (bytes) run by the latency-bound one-shot algorithm"};
config::Param<std::int64_t> direct_max_ranks{
    "COCCL_DIRECT_MAX_RANKS", 8,
    "most ranks for which host collectives link every rank with every other (one-shot and direct "
    "exchanges, chains); above it they touch O(log n) peers for small messages (recursive "
    "doubling, Bruck, trees) and two for large ones (rings, pipelined trees)"};
config::Param<std::int64_t> device_oneshot_max{
    "COCCL_DEVICE_ONESHOT_MAX", 512 << 10,
    "largest device all_reduce (bytes per rank) run by the one-shot LL kernel; sizes the "
    "workspace, so every rank must use the same value"};
config::Param<bool> dependent_launch{
    "COCCL_DEPENDENT_LAUNCH", true,
    "launch device kernels with programmatic dependent launch (Hopper): a kernel starts while "
    "the previous one in the stream finishes and waits on the device for it"};
config::Param<std::int64_t> device_comms{
    "COCCL_DEVICE_COMMS", 2,
    "communicators a rank may have working on its GPU at once (data and tensor parallel: 2); "
    "each device kernel takes at most 1/(this x ranks sharing the GPU x 2) of the GPU so that "
    "all of them fit together; the count of this process's communicators on the GPU raises it"};
config::Param<std::string> hostid{
    "COCCL_HOSTID", "",
    "host identity: ranks with equal values are on one host (empty: the host name and boot id), "
    "so one machine can act as several hosts and take the network path between its ranks",
    "NCCL_HOSTID"};
config::Param<std::int64_t> net_slot_bytes{
    "COCCL_NET_SLOT_BYTES", 2 << 20,
    "device operations across hosts: bytes a round stages in pinned host memory on each side "
    "(2 x (COCCL_NET_LANES + 1) such areas per communicator); must be equal on every rank"};
config::Param<std::int64_t> net_lanes{
    "COCCL_NET_LANES", 4,
    "device operations across hosts: rounds moved at once, each over its own connections and "
    "proxy thread (1 to 15); must be equal on every rank"};
config::Param<std::string> comm_id{
    "COCCL_COMM_ID", "",
    "host:port of the bootstrap root for communicators made from the environment", "NCCL_COMM_ID"};
config::Param<std::string> secret{
    "COCCL_SECRET", "",
    "32 hex digits: bootstrap secret for communicators made from the environment"};
config::Param<std::int64_t> bootstrap_pending_max{
    "COCCL_BOOTSTRAP_PENDING_MAX", 64,
    "connections a bootstrap root or rank listener holds before they authenticate; a newer one "
    "closes the oldest, so strangers cost bounded memory and descriptors"};
config::Param<double> bootstrap_auth_timeout{
    "COCCL_BOOTSTRAP_AUTH_TIMEOUT", 10.0,
    "seconds a new connection to a bootstrap root or rank listener has to authenticate before it "
    "is closed (at most COCCL_TIMEOUT)"};
config::Param<std::int64_t> colltrace_size{"COCCL_COLLTRACE_SIZE", 64,
                                           "operations kept per communicator by CollTrace"};
config::Param<std::string> ib_hca{
    "COCCL_IB_HCA", "",
    "RDMA devices and ports for the ib transport: mlx5_0:1,mlx5_1 (name prefixes), ^ to exclude, "
    "= for exact names (empty: the first active port)",
    "NCCL_IB_HCA"};
config::Param<std::int64_t> ib_gid_index{
    "COCCL_IB_GID_INDEX", -1,
    "GID table index for RoCE (-1: the first RoCE v2 GID, IPv4-mapped preferred)",
    "NCCL_IB_GID_INDEX"};
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
config::Param<std::string> tcp_engine{
    "COCCL_TCP_ENGINE", "auto",
    "what drives tcp links: uring (io_uring: multishot receives, zero-copy sends, several "
    "sockets per peer), asio (one socket per peer on Boost.Asio) or auto (uring where the kernel "
    "allows it, else asio)"};
config::Param<std::int64_t> tcp_sockets{
    "COCCL_TCP_SOCKETS", 2,
    "sockets per tcp link under the uring engine (1 to 16), puts striped over them in turn; a "
    "link takes the smaller count of its two ends (1 where one end runs the asio engine)"};
config::Param<std::int64_t> tcp_zc_min{
    "COCCL_TCP_ZC_MIN", 1 << 20,
    "smallest put the uring engine sends zero-copy (IORING_OP_SEND_ZC) from the caller's buffer; "
    "smaller ones are copied into the socket"};

}  // namespace coccl::params
