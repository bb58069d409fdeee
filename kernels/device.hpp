// kernels/device.hpp: the memory contract of coccl's intra-host GPU collectives.
//
// The device collectives (one-shot and two-shot all-reduce, all-gather, reduce-scatter,
// all-to-all between GPUs of one host) move data through one *workspace* per rank: a device
// buffer on that rank's GPU which every other rank of the group has mapped into its own address
// space (CUDA peer access in one process, CUDA IPC handles across processes). User buffers are
// plain device memory of the rank's own GPU and need no mapping: ranks push their data into the
// peers' workspaces with NVLink stores and read only their own workspace and their own buffers.
//
// Workspace rules, for every rank of a group:
// - Size: workspace_bytes(nranks, oneshot_max_bytes, staging_bytes), the same arguments on every
//   rank. Alignment: 256 bytes (cudaMalloc gives that).
// - Zeroed once (cudaMemset) before any rank launches the first kernel on it, and never written
//   by anything but these kernels afterwards. It holds, per block, an epoch counter that the
//   kernels themselves advance, the flags peers write, and the staging areas.
// - Ordering: every rank launches the same sequence of collectives on the workspace, with the
//   same sizes and block counts (that is what keeps the per-block epochs equal on all ranks), and
//   launches on one workspace never overlap on a rank (use one stream, or order the streams).
// - Because the epochs live in device memory, no host-side sequence number is passed: captured
//   CUDA graphs replay correctly any number of times.
// - All ranks' kernels of one collective must be able to run at the same time (they wait for
//   each other on the device); each kernel uses at most Workspace::max_grid blocks (at most
//   max_blocks), so that the kernels of every rank and communicator sharing a GPU fit on it
//   together.
// - A kernel never waits for ever: a wait that lasts longer than Workspace::timeout_ns, or that
//   sees Status::abort set, ends the kernel early and records why in the Status. The workspace
//   is then out of step between ranks and must not be used again.
#pragma once

#include <cstddef>
#include <cstdint>

namespace coccl::device {

/// Most ranks one workspace group may have (peers of one host).
inline constexpr int max_ranks = 8;

/// Most blocks one collective kernel may use; each block has its own epoch and flags.
inline constexpr int max_blocks = 128;

/// Bytes of the workspace header (epochs and flags) that precedes the data areas.
inline constexpr std::size_t workspace_header_bytes = 64 * 1024;

/// Default largest message (bytes per rank) of the one-shot all-reduce (on 2 H200s one-shot beat
/// two-shot up to 1 MiB; 512 KiB keeps the LL scratch at 2 x nranks MiB per rank).
inline constexpr std::size_t default_oneshot_max_bytes = 512 * 1024;

/// Default staging area for the bulk (two-shot, gather, scatter, all-to-all) kernels.
inline constexpr std::size_t default_staging_bytes = 64 * 1024 * 1024;

/// Bytes of one rank's LL scratch for one-shot messages of up to `oneshot_max_bytes` among
/// `nranks` ranks: two parities (so consecutive calls never reuse a slot a slow peer still
/// reads) times one slot per rank, each holding the message as 8-byte LL packets (4 bytes of
/// data and a 4-byte flag), i.e. twice the message rounded up to 16 bytes.
constexpr std::size_t oneshot_scratch_bytes(std::size_t oneshot_max_bytes, int nranks) noexcept {
  return 2 * static_cast<std::size_t>(nranks) * 2 * ((oneshot_max_bytes + 15) / 16 * 16);
}

/// Bytes of one rank's workspace: header, one-shot scratch, then the staging area (rounded down
/// by the kernels to whole 16-byte slots per block and rank).
constexpr std::size_t workspace_bytes(int nranks,
                                      std::size_t oneshot_max_bytes = default_oneshot_max_bytes,
                                      std::size_t staging_bytes = default_staging_bytes) noexcept {
  return workspace_header_bytes + oneshot_scratch_bytes(oneshot_max_bytes, nranks) +
         (staging_bytes + 255) / 256 * 256;
}

/// What a rank's kernels report to its host, and the host's abort request to them. The host
/// allocates it in mapped, pinned host memory (cudaHostAlloc with cudaHostAllocMapped) so that a
/// spinning host thread sees a kernel's report in about two microseconds and a kernel sees an
/// abort without any host synchronisation. Zero-initialised; one per rank and workspace.
struct Status {
  /// Set non-zero by the host (or by a block that gave up) to make every waiting block return.
  std::uint32_t abort;
  /// 0, or why a block gave up: Status::timed_out or Status::aborted. The first block that gives
  /// up records error, peer, op, seq and block; the others leave them alone.
  std::uint32_t error;
  /// The rank the block was waiting for.
  std::int32_t peer;
  /// The operation the kernel ran (an OpCode).
  std::uint32_t op;
  /// Workspace::seq of the launch.
  std::uint64_t seq;
  /// The block that gave up, and how long it had waited (nanoseconds).
  std::uint32_t block;
  std::uint32_t reserved;
  std::uint64_t waited_ns;

  static constexpr std::uint32_t timed_out = 1;
  static constexpr std::uint32_t aborted = 2;
};

/// The operation a kernel reports in Status::op.
enum class OpCode : std::uint32_t {
  all_reduce = 1,
  all_gather,
  reduce_scatter,
  all_to_all,
  broadcast,
  reduce,
  gather,
  scatter,
  send_recv,
  all_to_allv,
  moe_dispatch,
  moe_combine,
};

/// Lower-case name of an OpCode ("all_reduce"), or "unknown operation".
constexpr const char* op_name(std::uint32_t op) noexcept {
  constexpr const char* names[] = {
      "unknown operation", "all_reduce",   "all_gather", "reduce_scatter", "all_to_all",
      "broadcast",         "reduce",       "gather",     "scatter",        "send_recv",
      "all_to_allv",       "moe_dispatch", "moe_combine"};
  return op < sizeof names / sizeof names[0] ? names[op] : names[0];
}

/// Default Workspace::timeout_ns: a peer that has not answered in this time is dead, or the
/// ranks' launch sequences diverged.
inline constexpr std::uint64_t default_timeout_ns = 300ull * 1000 * 1000 * 1000;

/// One rank's view of its group's workspaces. Plain data; the kernels copy it at launch, so the
/// `peers` array need only live for the duration of the launch call.
struct Workspace {
  /// peers[i]: rank i's workspace as mapped into this process; peers[rank] is the own one.
  void* const* peers = nullptr;
  int rank = 0;
  int nranks = 0;
  /// The sizes the workspaces were made with (identical on every rank).
  std::size_t oneshot_max_bytes = default_oneshot_max_bytes;
  std::size_t staging_bytes = default_staging_bytes;
  /// Where this rank's kernels report a wait they gave up, and where the host asks them to stop
  /// (device-accessible pointer to mapped host memory). May be null: the kernels then use a
  /// Status at the end of the own workspace's header (device memory, read with cudaMemcpy).
  Status* status = nullptr;
  /// Longest wait for a peer before a kernel gives up (0: default_timeout_ns).
  std::uint64_t timeout_ns = 0;
  /// Reported in Status::seq: the caller's number for the launch (the communicator's device
  /// operation count). A graph replays the number it was captured with.
  std::uint64_t seq = 0;
  /// Most blocks one kernel may use (1..max_blocks; 0: max_blocks). Must be equal on every
  /// rank: the grids of every rank must match.
  int max_grid = 0;
};

/// Offset of the fallback Status in the workspace header.
inline constexpr std::size_t status_offset = workspace_header_bytes - 64;
static_assert(sizeof(Status) <= 64);

}  // namespace coccl::device
