// kernels/launch.hpp: launch functions for coccl's CUDA kernels.
//
// Plain C++ (no CUDA headers needed): every function enqueues work on `stream` and returns a
// cudaError_t value (0 = cudaSuccess); an invalid argument returns cudaErrorInvalidValue (1) and
// enqueues nothing. None synchronises with the host or allocates.
//
// Buffers are device memory of the current device, aligned to the element size. The kernels use
// 16-byte loads and stores when a buffer is 16-byte aligned and narrower ones otherwise (slower,
// still correct), so any element offset works.
//
// Semantics of the reductions (the same as collectives/reduce_cpu.hpp, the host reference):
// integer sum/prod wrap; float max/min propagate NaN; float16, bfloat16 and float8 are widened
// to float, combined across all sources in index (rank) order and rounded once; float8_e4m3
// saturates to +-448. `avg` is sum followed by divide_by (integers truncate), done inside the
// collectives and left to the caller in `reduce`.
//
// The peer collectives follow the memory contract of "kernels/device.hpp": they write only into
// the peers' workspaces and synchronise through flags there, with per-block epochs kept on the
// device (so they can be captured into CUDA graphs). `nblocks` = 0 picks a default; otherwise
// 1..device::max_blocks, and it must be the same on every rank.
#pragma once

#include <coccl/types.hpp>
#include <cstddef>
#include <cstdint>

#include "kernels/device.hpp"

struct CUstream_st;

namespace coccl::kernels {

using stream_t = CUstream_st*;

/// Loads every kernel of this library onto the current device now. With CUDA's lazy loading
/// (the default since CUDA 12.2) the first launch of a kernel from a module not yet loaded waits
/// until the device is idle; if a peer kernel is still spinning there for a rank that the same
/// thread has yet to launch (one thread driving several GPUs), that wait never ends. Call once
/// per device before the first collective (the communicator does so when it makes its
/// workspace). Returns a cudaError_t value.
int load_kernels();

/// The fewest 512-thread blocks of any peer kernel loaded by load_kernels that one SM can hold
/// at once (0 before any is loaded). With the SM count it bounds how many blocks of
/// peer kernels a GPU can keep resident together.
int resident_blocks_per_sm();

/// Turns programmatic dependent launch of the all_reduce kernels on (the default) or off. When
/// on, such a kernel may start while the previous kernel of its stream finishes, hiding its launch
/// latency; it waits on the device before it touches memory, so stream order is kept.
void set_dependent_launch(bool on);

/// Most sources of one `reduce` call.
inline constexpr int max_reduce_sources = 8;

/// dst[i] = srcs[0][i] op ... op srcs[nsrc-1][i] for i < count (avg reduces like sum).
/// 1 <= nsrc <= max_reduce_sources; `srcs` is a host array of device pointers. dst may equal
/// srcs[0]; no other source may overlap dst.
int reduce(void* dst, const void* const* srcs, int nsrc, std::size_t count, DataType type,
           ReduceOp op, stream_t stream);

/// Copies `bytes` bytes from src to dst (device memory, no overlap).
int copy(void* dst, const void* src, std::size_t bytes, stream_t stream);

/// data[i] /= divisor (divisor >= 1): integers truncate toward zero, float64 divides in double,
/// every other float type in float with one rounding.
int divide_by(void* data, std::size_t count, DataType type, int divisor, stream_t stream);

/// Largest message (bytes per rank) all_reduce_oneshot accepts with this workspace.
inline std::size_t oneshot_max_bytes(const device::Workspace& ws) { return ws.oneshot_max_bytes; }

/// All-reduce for small messages (count * size_of(type) <= ws.oneshot_max_bytes): each rank
/// writes its input as LL packets (data and flag in one 8-byte store, the flag being the block's
/// epoch) into its slot of every peer's one-shot scratch, then waits for every peer's packets in
/// its own scratch and reduces them in rank order, so all ranks get bit-identical results. One
/// NVLink latency, no barrier. send may equal recv.
int all_reduce_oneshot(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                       const device::Workspace& ws, stream_t stream, int nblocks = 0);

/// All-reduce for large messages: reduce-scatter then all-gather, in tiles through the staging
/// areas. For each tile a rank pushes the peers' shares of its input into their staging, waits
/// for their flags, reduces its share (rank order: results are identical on all ranks), pushes
/// the result into the peers' staging, waits again and copies the peers' results out. NVLink
/// carries 2 (n-1)/n of the message each way, the minimum. send may equal recv.
int all_reduce_twoshot(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                       const device::Workspace& ws, stream_t stream, int nblocks = 0);

/// recv[r * count + i] = rank r's send[i], for count elements of `elem_bytes` bytes each (1, 2, 4
/// or 8). recv holds nranks * count elements; send may be recv + rank * count (in place).
int all_gather(const void* send, void* recv, std::size_t count, std::size_t elem_bytes,
               const device::Workspace& ws, stream_t stream, int nblocks = 0);

/// recv[i] = op over ranks r (in rank order) of rank r's send[rank * count + i]. send holds
/// nranks * count elements, recv count. avg divides by nranks. In place when
/// recv == send + rank * count; any other overlap is not allowed.
int reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                   const device::Workspace& ws, stream_t stream, int nblocks = 0);

/// recv[r * count + i] = rank r's send[rank * count + i]: block r of the send buffer goes to rank
/// r. Both buffers hold nranks * count elements of `elem_bytes` bytes; they must not overlap.
int all_to_all(const void* send, void* recv, std::size_t count, std::size_t elem_bytes,
               const device::Workspace& ws, stream_t stream, int nblocks = 0);

// ---- Rooted collectives ----
//
// Collective like the ones above: every rank of the group launches the same call with the same
// size, root and nblocks, also ranks whose buffers the call does not touch (the per-tile barrier
// keeps the block epochs equal on every rank). A buffer the rank does not use may be null.

/// Every rank's recv[0, bytes) = root's send[0, bytes). send is read on root only; in place when
/// root's send == recv. Type-free.
int broadcast(const void* send, void* recv, std::size_t bytes, int root,
              const device::Workspace& ws, stream_t stream, int nblocks = 0);

/// root's recv[i] = op over ranks r (in rank order) of rank r's send[i], i < count; avg divides
/// by nranks. recv is used on root only and may equal send there (in place). Bit-identical to
/// the all-reduces' result.
int reduce_to_root(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                   int root, const device::Workspace& ws, stream_t stream, int nblocks = 0);

/// root's recv[r * count + i] = rank r's send[i], elements of `elem_bytes` (1, 2, 4 or 8) bytes.
/// recv is used on root only; in place when root's send == recv + root * count.
int gather(const void* send, void* recv, std::size_t count, std::size_t elem_bytes, int root,
           const device::Workspace& ws, stream_t stream, int nblocks = 0);

/// Rank r's recv[i] = root's send[r * count + i]. send is read on root only; in place when
/// root's recv == send + root * count.
int scatter(const void* send, void* recv, std::size_t count, std::size_t elem_bytes, int root,
            const device::Workspace& ws, stream_t stream, int nblocks = 0);

// ---- Point-to-point ----
//
// Only the ranks named by a transfer take part in it, so these do not use the collective epochs
// and a rank with nothing to send or receive need not launch anything. Instead each ordered pair
// of ranks keeps its own sequence counters in the workspace header (see kernels/p2p.cu): the
// sender writes a chunk into the receiver's staging only after the receiver has started that
// transfer and freed the slot, and a transfer ends on the sender only once the receiver has
// copied everything out. So p2p calls may be freely interleaved with collectives on the same
// workspace (still one stream per rank, or ordered streams), as long as every pair of ranks
// issues its transfers in matching order, and graphs replay them like the collectives.
// The sender's kernel therefore also waits for its receiver (a send completes when received).

/// Most transfers in one send_recv call.
inline constexpr int max_p2p_ops = 32;

/// One transfer of a send_recv group.
struct P2p {
  bool is_send;
  void* buffer;  // device memory; only read for sends
  std::size_t bytes;
  int peer;  // rank in the workspace group; may be the own rank (a local copy)
};

/// Runs the transfers of `ops` (host array, at most max_p2p_ops) together: transfers between
/// one ordered pair of ranks are matched in order (the k-th send from a to b with the k-th
/// receive on b from a) and must have equal sizes; transfers with different peers or directions
/// progress concurrently, so any exchange pattern is free of deadlock. Sends to self pair with
/// receives from self in order, as device copies.
int send_recv(const P2p* ops, int nops, const device::Workspace& ws, stream_t stream);

/// Per-peer element counts and displacements of all_to_allv (entries >= nranks are ignored).
struct AllToAllvLayout {
  std::size_t send_counts[device::max_ranks];
  std::size_t send_displs[device::max_ranks];
  std::size_t recv_counts[device::max_ranks];
  std::size_t recv_displs[device::max_ranks];
};

/// Rank r sends send[send_displs[q], + send_counts[q]) to rank q, which places it at
/// recv[recv_displs[r], + recv_counts[r]); recv_counts[q] here must equal send_counts[r] on q.
/// Elements of `elem_bytes` (1, 2, 4 or 8) bytes. Every rank calls it (it is a send_recv group
/// with every peer, zero-sized transfers included). Not in place.
int all_to_allv(const void* send, void* recv, const AllToAllvLayout& layout, std::size_t elem_bytes,
                const device::Workspace& ws, stream_t stream);

}  // namespace coccl::kernels
