// kernels/rooted.cu: broadcast, scatter, gather and reduce between the GPUs of one host, staged
// through the workspaces with one barrier per tile.
//
// Every rank launches the same kernel with the same grid (the grid depends only on the message
// size), also the ranks that neither send nor receive anything of a tile: the barrier is what
// keeps block b's epoch equal on all ranks, so a rooted collective is as collective as the
// others.
#include <cuda_runtime.h>

#include "launch.hpp"
#include "load.hpp"
#include "peer.cuh"

namespace coccl::kernels {
namespace {

using detail::PeerParams;

// Broadcast (src_stride 0) and scatter (src_stride = nbytes): per tile the root pushes rank q's
// part into q's staging and places its own part; after the barrier each non-root copies its part
// out of its own staging.
__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    from_root_kernel(const char* send, char* recv, std::size_t nbytes, std::size_t src_stride,
                     int root, PeerParams p, int gs, int gr) {
  std::uint32_t epoch = detail::load_epoch(p);
  const int n = p.nranks;
  const int r = p.rank;
  for (std::size_t base = blockIdx.x * p.tile; base < nbytes; base += gridDim.x * p.tile) {
    const std::size_t len = detail::min_size(nbytes - base, p.tile);
    const int h = static_cast<int>(++epoch & 1);
    if (r == root) {
#pragma unroll
      for (int q = 0; q < device::max_ranks; ++q) {
        if (q < n && q != r) {
          detail::block_copy(detail::staging(p, p.ws[q], h, r), 16, send + q * src_stride + base,
                             gs, len);
        }
      }
      const char* own = send + r * src_stride + base;
      if (own != recv + base) detail::block_copy(recv + base, gr, own, gs, len);
    }
    if (!detail::peer_barrier(p, epoch)) return;
    if (r != root) {
      detail::block_copy(recv + base, gr, detail::staging(p, p.ws[r], h, root), 16, len);
    }
  }
  detail::store_epoch(p, epoch);
}

// Gather: per tile every non-root pushes its tile into the root's staging; after the barrier the
// root copies rank q's tile to recv[q * nbytes + base].
__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    to_root_kernel(const char* send, char* recv, std::size_t nbytes, int root, PeerParams p, int gs,
                   int gr) {
  std::uint32_t epoch = detail::load_epoch(p);
  const int n = p.nranks;
  const int r = p.rank;
  for (std::size_t base = blockIdx.x * p.tile; base < nbytes; base += gridDim.x * p.tile) {
    const std::size_t len = detail::min_size(nbytes - base, p.tile);
    const int h = static_cast<int>(++epoch & 1);
    if (r != root) {
      detail::block_copy(detail::staging(p, p.ws[root], h, r), 16, send + base, gs, len);
    } else if (send + base != recv + r * nbytes + base) {
      detail::block_copy(recv + r * nbytes + base, gr, send + base, gs, len);
    }
    if (!detail::peer_barrier(p, epoch)) return;
    if (r == root) {
#pragma unroll
      for (int q = 0; q < device::max_ranks; ++q) {
        if (q < n && q != r) {
          detail::block_copy(recv + q * nbytes + base, gr, detail::staging(p, p.ws[r], h, q), 16,
                             len);
        }
      }
    }
  }
  detail::store_epoch(p, epoch);
}

// Reduce: like gather, then the root reduces the tiles in rank order (the same order, hence the
// same bits, as all_reduce).
template <class C>
__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    reduce_root_kernel(const char* send, char* recv, std::size_t nbytes, ReduceOp op, int root,
                       PeerParams p, int gs, int gr) {
  std::uint32_t epoch = detail::load_epoch(p);
  const int r = p.rank;
  for (std::size_t base = blockIdx.x * p.tile; base < nbytes; base += gridDim.x * p.tile) {
    const std::size_t len = detail::min_size(nbytes - base, p.tile);
    const int h = static_cast<int>(++epoch & 1);
    if (r != root) {
      detail::block_copy(detail::staging(p, p.ws[root], h, r), 16, send + base, gs, len);
    }
    if (!detail::peer_barrier(p, epoch)) return;
    if (r == root) {
      detail::reduce_share<C>(p, send + base, gs, h, recv + base, gr, false, 0, len, op);
    }
  }
  detail::store_epoch(p, epoch);
}

// Validates what every rooted collective needs; `send_used` / `recv_used`: whether this rank
// touches the buffer at all.
bool rooted_params(const device::Workspace& ws, const void* send, bool send_used, const void* recv,
                   bool recv_used, std::size_t nbytes, int root, int nblocks, PeerParams& p) {
  return detail::make_peer_params(ws, p) && p.slice != 0 && root >= 0 && root < ws.nranks &&
         nblocks >= 0 && nblocks <= device::max_blocks &&
         (nbytes == 0 || ((!send_used || send != nullptr) && (!recv_used || recv != nullptr)));
}

int from_root(const void* send, void* recv, std::size_t nbytes, bool scatter, int root,
              const device::Workspace& ws, stream_t stream, int nblocks) {
  PeerParams p;
  const bool is_root = ws.rank == root;
  if (!rooted_params(ws, send, is_root, recv, true, nbytes, root, nblocks, p)) {
    return cudaErrorInvalidValue;
  }
  if (nbytes == 0) return cudaSuccess;
  p.watch.op =
      static_cast<std::uint32_t>(scatter ? device::OpCode::scatter : device::OpCode::broadcast);
  const unsigned grid = detail::plan_tiles(p, nbytes, 1, nblocks);
  const std::size_t stride = scatter ? nbytes : 0;
  const int gs = is_root ? detail::granularity(send, scatter ? nbytes : 16) : 16;
  const int gr = detail::granularity(recv);
  return detail::launch_peer_kernel(from_root_kernel, grid, stream, static_cast<const char*>(send),
                                    static_cast<char*>(recv), nbytes, stride, root, p, gs, gr);
}

}  // namespace

int broadcast(const void* send, void* recv, std::size_t bytes, int root,
              const device::Workspace& ws, stream_t stream, int nblocks) {
  return from_root(send, recv, bytes, false, root, ws, stream, nblocks);
}

int scatter(const void* send, void* recv, std::size_t count, std::size_t elem_bytes, int root,
            const device::Workspace& ws, stream_t stream, int nblocks) {
  if (!(elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8)) {
    return cudaErrorInvalidValue;
  }
  return from_root(send, recv, count * elem_bytes, true, root, ws, stream, nblocks);
}

int gather(const void* send, void* recv, std::size_t count, std::size_t elem_bytes, int root,
           const device::Workspace& ws, stream_t stream, int nblocks) {
  PeerParams p;
  const std::size_t nbytes = count * elem_bytes;
  const bool is_root = ws.rank == root;
  if (!(elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8) ||
      !rooted_params(ws, send, true, recv, is_root, nbytes, root, nblocks, p)) {
    return cudaErrorInvalidValue;
  }
  if (nbytes == 0) return cudaSuccess;
  p.watch.op = static_cast<std::uint32_t>(device::OpCode::gather);
  const unsigned grid = detail::plan_tiles(p, nbytes, 1, nblocks);
  const int gs = detail::granularity(send);
  const int gr = is_root ? detail::granularity(recv, nbytes) : 16;
  return detail::launch_peer_kernel(to_root_kernel, grid, stream, static_cast<const char*>(send),
                                    static_cast<char*>(recv), nbytes, root, p, gs, gr);
}

int reduce_to_root(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                   int root, const device::Workspace& ws, stream_t stream, int nblocks) {
  PeerParams p;
  if (!is_valid(type) || !is_valid(op)) return cudaErrorInvalidValue;
  const std::size_t nbytes = count * size_of(type);
  const bool is_root = ws.rank == root;
  if (!rooted_params(ws, send, true, recv, is_root, nbytes, root, nblocks, p)) {
    return cudaErrorInvalidValue;
  }
  if (nbytes == 0) return cudaSuccess;
  p.watch.op = static_cast<std::uint32_t>(device::OpCode::reduce);
  const unsigned grid = detail::plan_tiles(p, nbytes, 1, nblocks);
  const int gs = detail::granularity(send);
  const int gr = is_root ? detail::granularity(recv) : 16;
  return detail::with_codec(type, [&](auto codec) {
    return detail::launch_peer_kernel(reduce_root_kernel<decltype(codec)>, grid, stream,
                                      static_cast<const char*>(send), static_cast<char*>(recv),
                                      nbytes, op, root, p, gs, gr);
  });
}

int detail::load_rooted() {
  if (int rc = detail::load_peer_function(from_root_kernel)) return rc;
  if (int rc = detail::load_peer_function(to_root_kernel)) return rc;
  return detail::load_for_every_type(
      [](auto codec) { return detail::load_peer_function(reduce_root_kernel<decltype(codec)>); });
}

}  // namespace coccl::kernels
