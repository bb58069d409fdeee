// coccl/device.hpp: the memory contract of coccl's intra-host GPU collectives.
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
//   each other on the device); each kernel uses at most max_blocks blocks.
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
};

}  // namespace coccl::device
