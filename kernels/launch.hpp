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
// The peer collectives follow the memory contract of <coccl/device.hpp>: they write only into
// the peers' workspaces and synchronise through flags there, with per-block epochs kept on the
// device (so they can be captured into CUDA graphs). `nblocks` = 0 picks a default; otherwise
// 1..device::max_blocks, and it must be the same on every rank.
#pragma once

#include <coccl/device.hpp>
#include <coccl/types.hpp>
#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace coccl::kernels {

using stream_t = CUstream_st*;

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
/// nranks * count elements, recv count. avg divides by nranks. recv must not overlap send.
int reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                   const device::Workspace& ws, stream_t stream, int nblocks = 0);

/// recv[r * count + i] = rank r's send[rank * count + i]: block r of the send buffer goes to rank
/// r. Both buffers hold nranks * count elements of `elem_bytes` bytes; they must not overlap.
int all_to_all(const void* send, void* recv, std::size_t count, std::size_t elem_bytes,
               const device::Workspace& ws, stream_t stream, int nblocks = 0);

}  // namespace coccl::kernels
