// kernels/peer.cuh: the workspace layout and the device-side synchronisation between ranks.
//
// Workspace of every rank (see "kernels/device.hpp"):
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

#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/device.hpp"
#include "memory.cuh"

namespace coccl::kernels::detail {

inline constexpr std::size_t flags_offset = 4096;
inline constexpr int block_threads = 512;
// Peer kernels are compiled to fit two blocks per SM (at most 64 registers a thread): the grid
// limit is proportional to the blocks a GPU keeps resident (collectives/device_budget). On one
// H100 shared by 2 ranks this doubled the limit from 16 to 33 blocks: all_reduce busbw at 256 MiB
// went from 159 to 215 GB/s and all_gather from 176 to 198, while all_reduce of 1-4 MiB lost
// 10-17%.
inline constexpr int min_blocks_per_sm = 2;
// Every rank must use the same grid, so grids depend only on the message, the group and the
// agreed Workspace::max_grid, never on the local device.
// Smallest per-block, per-rank tile the default grid is sized by (one 16-byte vector a thread).
inline constexpr std::size_t min_tile = 16 * block_threads;
// How often a waiting thread looks at the host's abort flag and its deadline: the flag is in
// mapped host memory, so reading it on every spin would load the PCIe link for nothing.
inline constexpr std::uint64_t abort_poll_ns = 20 * 1000;

static_assert(device::max_blocks * sizeof(std::uint32_t) <= flags_offset);
static_assert(flags_offset + device::max_blocks * device::max_ranks * sizeof(std::uint32_t) <=
              device::workspace_header_bytes);

/// How a kernel's waits end when a peer does not answer (see give_up and wait_for).
struct Watch {
  device::Status* status;  // where a wait that gives up is reported (never null)
  std::uint32_t* claim;    // device word: the first block that gives up takes it
  std::uint64_t timeout_ns;
  std::uint64_t seq;
  std::uint32_t op;  // device::OpCode, set by the launch function
};

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
  Watch watch;
  int max_grid;  // most blocks a kernel may use (agreed by every rank)
};

// Bytes before device::status_offset holding the claim word (device memory).
inline constexpr std::size_t claim_offset = device::status_offset - 16;
static_assert(claim_offset >= flags_offset + device::max_blocks * device::max_ranks * 4);

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
  p.watch.status = ws.status != nullptr
                       ? ws.status
                       : reinterpret_cast<device::Status*>(p.ws[ws.rank] + device::status_offset);
  p.watch.claim = reinterpret_cast<std::uint32_t*>(p.ws[ws.rank] + claim_offset);
  p.watch.timeout_ns = ws.timeout_ns != 0 ? ws.timeout_ns : device::default_timeout_ns;
  p.watch.seq = ws.seq;
  p.max_grid = ws.max_grid;
  if (p.max_grid < 0 || p.max_grid > device::max_blocks) return false;
  if (p.max_grid == 0) p.max_grid = device::max_blocks;
  // The staging is cut for the largest grid allowed: fewer blocks get larger slots (fewer
  // barriers per byte).
  p.slice = ws.staging_bytes / (static_cast<std::size_t>(p.max_grid) * 2 * ws.nranks) / 16 * 16;
  return true;
}

/// `requested` blocks if given, else one per unit of work; at most max_grid either way (the
/// staging slots are cut for it).
inline unsigned blocks_for(std::size_t units, int requested, int max_grid) {
  if (requested > 0) return static_cast<unsigned>(requested < max_grid ? requested : max_grid);
  const std::size_t m = static_cast<std::size_t>(max_grid);
  return static_cast<unsigned>(units < 1 ? 1 : (units > m ? m : units));
}

/// Grid and tile for `nbytes` split into tiles of `parts` shares (parts * tile bytes a step):
/// enough blocks to spread mid-sized messages (at most p.max_grid unless `requested`), tiles as
/// large as the staging allows. Depends only on arguments that are equal on every rank.
inline unsigned plan_tiles(PeerParams& p, std::size_t nbytes, std::size_t parts, int requested) {
  const std::size_t per = parts * min_tile;
  const unsigned grid = blocks_for((nbytes + per - 1) / per, requested, p.max_grid);
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

/// A wait for `peer` ends without its answer (why: Status::timed_out or Status::aborted). The
/// first block of this rank to give up records the reason in the Status (the claim is a device
/// atomic: atomics on mapped host memory are not atomic over PCIe) and raises the abort flag so
/// that every other waiting block of the rank returns within abort_poll_ns instead of waiting out
/// its own deadline. The host reads error last, so the fields are written before it.
inline __device__ __noinline__ void give_up(const Watch& w, std::uint32_t why, int peer,
                                            std::uint64_t waited) {
  volatile device::Status* s = w.status;
  if (atomicCAS(w.claim, 0u, 1u) == 0u) {
    s->peer = peer;
    s->op = w.op;
    s->seq = w.seq;
    s->block = blockIdx.x;
    s->waited_ns = waited;
    __threadfence_system();
    s->error = why;
  }
  __threadfence_system();
  s->abort = 1;
}

/// Spins (one thread) until ready() holds and returns true; returns false when it gave up
/// instead: w.timeout_ns passed, or the abort flag was raised (by the host, or by another block
/// that gave up). The abort flag and the clock are read every abort_poll_ns.
template <class Ready>
__device__ __forceinline__ bool wait_for(const Watch& w, int peer, Ready ready) {
  if (ready()) return true;
  const std::uint64_t start = global_timer_ns();
  std::uint64_t polled = start;
  while (!ready()) {
    const std::uint64_t now = global_timer_ns();
    if (now - polled < abort_poll_ns) continue;
    polled = now;
    if (*reinterpret_cast<volatile const std::uint32_t*>(&w.status->abort) != 0) {
      give_up(w, device::Status::aborted, peer, now - start);
      return false;
    }
    if (now - start > w.timeout_ns) {
      give_up(w, device::Status::timed_out, peer, now - start);
      return false;
    }
  }
  return true;
}

/// Waits (one thread) until the counter *c, written by `peer`, reaches v (wrap-safe).
__device__ __forceinline__ bool wait_at_least(const Watch& w, int peer, const std::uint32_t* c,
                                              std::uint32_t v) {
  return wait_for(w, peer, [&] { return static_cast<std::int32_t>(load_acquire_sys(c) - v) >= 0; });
}

/// Barrier of block blockIdx.x across all ranks at `epoch`. Thread t < nranks signals rank t and
/// waits for rank t's signal. The release store is cumulative over everything the block wrote
/// before the __syncthreads (so peers see our pushed data before the flag), and the acquire load
/// followed by __syncthreads orders the peers' data before the block's subsequent reads.
/// Returns false, in every thread of the block, when a wait gave up: the kernel must return.
__device__ __forceinline__ bool peer_barrier(const PeerParams& p, std::uint32_t epoch) {
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  bool ok = true;
  if (t < p.nranks) {
    store_release_sys(flag_slot(p.ws[t], p.rank), epoch);
    // Wrap-safe >=: a peer may already have signalled the next epoch.
    ok = wait_at_least(p.watch, t, flag_slot(p.ws[p.rank], t), epoch);
  }
  return __syncthreads_and(ok) != 0;
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
