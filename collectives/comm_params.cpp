#include "collectives/comm_params.hpp"

namespace coccl::params {

config::Param<std::string> algo{
    "COCCL_ALGO", "",
    "force an algorithm by name (each collective takes the names it has; empty: choose by size "
    "and ranks): host all_reduce oneshot, direct, ring or rd (recursive doubling); all_gather "
    "direct, ring or bruck; reduce_scatter direct, ring or rd; all_to_all direct or bruck; "
    "broadcast and reduce chain or tree; device collectives across hosts flat or hierarchical",
    "NCCL_ALGO"};
config::Param<std::string> transport{
    "COCCL_TRANSPORT", "auto",
    "transport between ranks: auto (shm on one host, tcp across hosts), tcp, shm or ib (RDMA "
    "verbs)"};
config::Param<std::int64_t> slot_bytes{
    "COCCL_SLOT_BYTES", 256 << 10,
    "bytes per slot of a connection's receive ring, the largest chunk an operation moves; left "
    "unset, a communicator whose every rank is a host of its own (all its links cross the "
    "network) takes 512 KiB, where fewer, larger chunks move faster over tcp, unless "
    "COCCL_MEM_BUDGET is set; set both alike on every rank"};
config::Param<std::int64_t> slots{
    "COCCL_SLOTS", 8,
    "slots per connection receive ring (pipelining depth); a link made for an operation of fewer "
    "bytes gets fewer, at least 2"};
config::Param<std::int64_t> oneshot_max{
    "COCCL_ALLREDUCE_ONESHOT_MAX", 64 << 10,
    "largest host all_reduce (bytes) run by the latency-bound one-shot algorithm"};
config::Param<std::int64_t> direct_max_ranks{
    "COCCL_DIRECT_MAX_RANKS", 8,
    "most ranks for which host collectives link every rank with every other (one-shot and direct "
    "exchanges, chains); above it they touch O(log n) peers for small messages (recursive "
    "doubling, Bruck, trees) and two for large ones (rings, pipelined trees)"};
config::Param<std::int64_t> colltrace_size{"COCCL_COLLTRACE_SIZE", 64,
                                           "operations kept per communicator by CollTrace"};
config::Param<std::string> comm_id{
    "COCCL_COMM_ID", "",
    "host:port of the bootstrap root for communicators made from the environment", "NCCL_COMM_ID"};
config::Param<std::string> secret{
    "COCCL_SECRET", "",
    "32 hex digits: bootstrap secret for communicators made from the environment"};
config::Param<std::string> bootstrap{
    "COCCL_BOOTSTRAP", "auto",
    "how communicators made from the environment under torchrun or PMIx (mpirun, srun) form: "
    "launcher (from the launcher's table of addresses, without a root), root (hellos to a root "
    "that rank 0 starts) or auto (under PMIx launcher where PMIx can count the hosts or the "
    "directory is full, else root; under torchrun root, as its store is one server)"};

}  // namespace coccl::params
