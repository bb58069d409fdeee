// kernels/peer.cuh: the workspace layout and the device-side synchronisation between ranks.
//
// Workspace of every rank (see <coccl/device.hpp>):
//   [0, 4 KiB)          epoch[b]: block b's epoch, read and written only by this rank's block b
//   [4 KiB, 8 KiB)      flag[b][src]: the last epoch rank src's block b signalled to us
//   [8 KiB, ...)        point-to-point pair counters (kernels/p2p.cu), apart from the epochs
//   header_bytes        LL scratch: [parity 2][source rank n][slot bytes]
//   + LL bytes          staging: [block max_blocks][parity 2][source rank n][slice bytes]
//
// Epochs. Each block keeps one epoch counter per rank; every barrier and every one-shot call
// advances it by one. All ranks launch the same kernels with the same grids, so block b's epoch is
// equal on every rank at every step, and flags compare against it: no host sequence number, no
// reset, and graph replays keep counting.
//
// Reuse rule that makes one barrier per step enough: data written for epoch e goes into parity
// e & 1 and is consumed by its reader after e and before the reader signals e + 1. A writer only
// writes for e after passing e - 1, which the reader signalled after finishing epoch e - 2, the
// last use of the same parity.
#pragma once

#include <coccl/device.hpp>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "memory.cuh"

namespace coccl::kernels::detail {

inline constexpr std::size_t flags_offset = 4096;
inline constexpr int block_threads = 512;
// Default grid of the bulk kernels. Every rank must use the same grid, so it depends only on the
// message and the group, never on the local device.
inline constexpr int default_bulk_blocks = device::max_blocks;
// Smallest per-block, per-rank tile the default grid is sized by (one 16-byte vector a thread).
inline constexpr std::size_t min_tile = 16 * block_threads;
// A peer that has not answered within this time is dead or the launch sequence diverged: trap
// (the launch fails with an error) rather than hang the GPU forever.
inline constexpr std::uint64_t spin_timeout_ns = 20ull * 1000 * 1000 * 1000;

static_assert(device::max_blocks * sizeof(std::uint32_t) <= flags_offset);
static_assert(flags_offset + device::max_blocks * device::max_ranks * sizeof(std::uint32_t) <=
              device::workspace_header_bytes);

/// What a peer kernel needs of the workspaces, passed by value at launch.
struct PeerParams {
  char* ws[device::max_ranks];
  int rank;
  int nranks;
  std::size_t ll_offset;
  std::size_t ll_slot;
  std::size_t staging_offset;
  std::size_t slice;  // bytes of one staging slot (multiple of 16, may be 0 if staging is tiny)
  std::size_t tile;   // bytes a block moves per rank and step: <= slice, multiple of 16
};

/// Validates ws and lays out its areas; returns false on a malformed descriptor.
inline bool make_peer_params(const device::Workspace& ws, PeerParams& p) {
  if (ws.peers == nullptr || ws.nranks < 1 || ws.nranks > device::max_ranks || ws.rank < 0 ||
      ws.rank >= ws.nranks) {
    return false;
  }
  p = PeerParams{};
  for (int i = 0; i < ws.nranks; ++i) {
    if (ws.peers[i] == nullptr) return false;
    p.ws[i] = static_cast<char*>(ws.peers[i]);
  }
  p.rank = ws.rank;
  p.nranks = ws.nranks;
  p.ll_offset = device::workspace_header_bytes;
  p.ll_slot = 2 * ((ws.oneshot_max_bytes + 15) / 16 * 16);
  p.staging_offset = device::workspace_header_bytes +
                     device::oneshot_scratch_bytes(ws.oneshot_max_bytes, ws.nranks);
  p.slice = ws.staging_bytes / (std::size_t{device::max_blocks} * 2 * ws.nranks) / 16 * 16;
  return true;
}

/// `requested` blocks if given, else one per unit of work, at most default_max.
inline unsigned blocks_for(std::size_t units, int requested, int default_max) {
  if (requested > 0) return static_cast<unsigned>(requested);
  const std::size_t m = static_cast<std::size_t>(default_max);
  return static_cast<unsigned>(units < 1 ? 1 : (units > m ? m : units));
}

/// Grid and tile for `nbytes` split into tiles of `parts` shares (parts * tile bytes a step):
/// enough blocks to spread mid-sized messages, tiles as large as the staging allows. Depends
/// only on arguments that are equal on every rank.
inline unsigned plan_tiles(PeerParams& p, std::size_t nbytes, std::size_t parts, int requested) {
  const std::size_t per = parts * min_tile;
  const unsigned grid = blocks_for((nbytes + per - 1) / per, requested, default_bulk_blocks);
  const std::size_t want = (nbytes + parts * grid - 1) / (parts * grid);
  const std::size_t tile = (want + 15) / 16 * 16;
  p.tile = tile < p.slice ? tile : p.slice;
  return grid;
}

/// Whether peer kernels are launched with programmatic dependent launch (set_dependent_launch).
bool dependent_launch();

/// Launches a peer kernel of `grid` blocks on `stream`. With dependent launch on, the kernel may
/// start while the previous kernel of the stream is still running (its launch latency is hidden
/// behind that kernel) and must call begin_after_prior_grid() before touching memory.
template <typename... Params, typename... Args>
int launch_peer_kernel(void (*kernel)(Params...), unsigned grid, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block_threads);
  cfg.stream = stream;
  if (dependent_launch()) {
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return static_cast<int>(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

/// First statement of a kernel launched by launch_peer_kernel: waits until the previous kernel
/// of the stream has finished and its writes are visible (a no-op when it was launched plainly),
/// then lets the next kernel of the stream be scheduled, so its launch overlaps this one.
__device__ __forceinline__ void begin_after_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ std::uint32_t* epoch_slot(const PeerParams& p) {
  return reinterpret_cast<std::uint32_t*>(p.ws[p.rank]) + blockIdx.x;
}

__device__ __forceinline__ std::uint32_t* flag_slot(char* ws, int src) {
  return reinterpret_cast<std::uint32_t*>(ws + flags_offset) + blockIdx.x * device::max_ranks + src;
}

/// Block b's staging slot for data from rank `src`, parity `h`, in the workspace `ws`.
__device__ __forceinline__ char* staging(const PeerParams& p, char* ws, int h, int src) {
  return ws + p.staging_offset +
         ((static_cast<std::size_t>(blockIdx.x) * 2 + h) * p.nranks + src) * p.slice;
}

/// Reads this block's epoch (all threads get it); pair with store_epoch at the end. Every
/// collective peer kernel starts here, so this is also where a dependent launch waits for the
/// previous kernel of the stream (begin_after_prior_grid).
__device__ __forceinline__ std::uint32_t load_epoch(const PeerParams& p) {
  begin_after_prior_grid();
  __shared__ std::uint32_t e;
  if (threadIdx.x == 0) e = *epoch_slot(p);
  __syncthreads();
  return e;
}

__device__ __forceinline__ void store_epoch(const PeerParams& p, std::uint32_t e) {
  if (threadIdx.x == 0) *epoch_slot(p) = e;
}

[[noreturn]] __device__ __forceinline__ void peer_timeout() { __trap(); }

/// Barrier of block blockIdx.x across all ranks at `epoch`. Thread t < nranks signals rank t and
/// waits for rank t's signal. The release store is cumulative over everything the block wrote
/// before the __syncthreads (so peers see our pushed data before the flag), and the acquire load
/// followed by __syncthreads orders the peers' data before the block's subsequent reads.
__device__ __forceinline__ void peer_barrier(const PeerParams& p, std::uint32_t epoch) {
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  if (t < p.nranks) {
    store_release_sys(flag_slot(p.ws[t], p.rank), epoch);
    const std::uint32_t* mine = flag_slot(p.ws[p.rank], t);
    // Wrap-safe >=: a peer may already have signalled the next epoch.
    if (static_cast<std::int32_t>(load_acquire_sys(mine) - epoch) < 0) {
      const std::uint64_t start = global_timer_ns();
      while (static_cast<std::int32_t>(load_acquire_sys(mine) - epoch) < 0) {
        if (global_timer_ns() - start > spin_timeout_ns) peer_timeout();
      }
    }
  }
  __syncthreads();
}

/// Start and length of rank q's share when `len` bytes are split into n parts of whole 16-byte
/// vectors (identical on all ranks).
__device__ __forceinline__ void share_of(std::size_t len, int n, int q, std::size_t& start,
                                         std::size_t& size) {
  const std::size_t part = (len + 16 * n - 1) / (16 * n) * 16;
  const std::size_t s = part * q;
  start = s < len ? s : len;
  const std::size_t e = s + part < len ? s + part : len;
  size = e - start;
}

}  // namespace coccl::kernels::detail

namespace coccl::kernels::detail {

/// Reduces `size` bytes of this rank's share in rank order: rank q's contribution is `mine` (this
/// rank's buffer, granularity gm) for q == rank, else this block's staging slot of q in parity h.
/// The result goes to `dst` (granularity gd) and, when `push` is set, into every peer's staging
/// slot for this rank in parity h_push.
template <class C>
__device__ __forceinline__ void reduce_share(const PeerParams& p, const char* mine, int gm, int h,
                                             char* dst, int gd, bool push, int h_push,
                                             std::size_t size, ReduceOp op) {
  const int n = p.nranks;
  const int r = p.rank;
  const int avg_divisor = op == ReduceOp::avg ? n : 1;
  const char* src[device::max_ranks];
  char* out[device::max_ranks];
#pragma unroll
  for (int q = 0; q < device::max_ranks; ++q) {
    src[q] = q == r ? mine : staging(p, p.ws[r], h, q);
    out[q] = q < n ? staging(p, p.ws[q], h_push, r) : nullptr;
  }
  for (std::size_t off = threadIdx.x * std::size_t{16}; off < size; off += blockDim.x * 16) {
    const int valid = static_cast<int>(size - off < 16 ? size - off : 16);
    Vec v[device::max_ranks];
#pragma unroll
    for (int q = 0; q < device::max_ranks; ++q) {
      if (q < n) v[q] = load_any(src[q] + off, q == r ? gm : 16, valid);
    }
    Acc<C, 4> acc = widen<C, 4>(v[0]);
#pragma unroll
    for (int q = 1; q < device::max_ranks; ++q) {
      if (q < n) combine<C, 4>(acc, v[q], op);
    }
    const Vec res = narrow<C, 4>(acc, avg_divisor);
    store_any(dst + off, gd, valid, res);
    if (push) {
#pragma unroll
      for (int q = 0; q < device::max_ranks; ++q) {
        if (q < n && q != r) store_any(out[q] + off, 16, valid, res);
      }
    }
  }
}

}  // namespace coccl::kernels::detail
