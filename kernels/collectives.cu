// kernels/collectives.cu: all-gather, all-to-all and reduce-scatter between the GPUs of one host,
// staged through the peers' workspaces with one barrier per tile.
#include <cuda_runtime.h>

#include "launch.hpp"
#include "load.hpp"
#include "peer.cuh"

namespace coccl::kernels {
namespace {

using detail::PeerParams;

// All-gather (src_stride 0) and all-to-all (src_stride = nbytes): per tile of one slice, push the
// part meant for each peer into its staging, place the own part, wait, copy the peers' parts out.
__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    exchange_kernel(const char* send, char* recv, std::size_t nbytes, std::size_t src_stride,
                    PeerParams p, int gs, int gr) {
  std::uint32_t epoch = detail::load_epoch(p);
  const int n = p.nranks;
  const int r = p.rank;
  for (std::size_t base = blockIdx.x * p.tile; base < nbytes; base += gridDim.x * p.tile) {
    const std::size_t len = nbytes - base < p.tile ? nbytes - base : p.tile;
    const int h = static_cast<int>(++epoch & 1);
#pragma unroll
    for (int q = 0; q < device::max_ranks; ++q) {
      if (q < n && q != r) {
        detail::block_copy(detail::staging(p, p.ws[q], h, r), 16, send + q * src_stride + base, gs,
                           len);
      }
    }
    const char* own_src = send + r * src_stride + base;
    char* own_dst = recv + r * nbytes + base;
    if (own_src != own_dst) detail::block_copy(own_dst, gr, own_src, gs, len);
    if (!detail::peer_barrier(p, epoch)) return;
#pragma unroll
    for (int q = 0; q < device::max_ranks; ++q) {
      if (q < n && q != r) {
        detail::block_copy(recv + q * nbytes + base, gr, detail::staging(p, p.ws[r], h, q), 16,
                           len);
      }
    }
  }
  detail::store_epoch(p, epoch);
}

template <class C>
__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    reduce_scatter_kernel(const char* send, char* recv, std::size_t nbytes, ReduceOp op,
                          PeerParams p, int gs, int gr) {
  std::uint32_t epoch = detail::load_epoch(p);
  const int n = p.nranks;
  const int r = p.rank;
  for (std::size_t base = blockIdx.x * p.tile; base < nbytes; base += gridDim.x * p.tile) {
    const std::size_t len = nbytes - base < p.tile ? nbytes - base : p.tile;
    const int h = static_cast<int>(++epoch & 1);
#pragma unroll
    for (int q = 0; q < device::max_ranks; ++q) {
      if (q < n && q != r) {
        detail::block_copy(detail::staging(p, p.ws[q], h, r), 16, send + q * nbytes + base, gs,
                           len);
      }
    }
    if (!detail::peer_barrier(p, epoch)) return;
    detail::reduce_share<C>(p, send + r * nbytes + base, gs, h, recv + base, gr, false, 0, len, op);
  }
  detail::store_epoch(p, epoch);
}

bool make_params(const device::Workspace& ws, const void* send, const void* recv,
                 std::size_t nbytes, int nblocks, PeerParams& p) {
  return detail::make_peer_params(ws, p) && p.slice != 0 && nblocks >= 0 &&
         nblocks <= device::max_blocks && (nbytes == 0 || (send != nullptr && recv != nullptr));
}

int exchange(const void* send, void* recv, std::size_t count, std::size_t elem_bytes,
             bool all_to_all, const device::Workspace& ws, stream_t stream, int nblocks) {
  PeerParams p;
  const std::size_t nbytes = count * elem_bytes;
  if (!(elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8) ||
      !make_params(ws, send, recv, nbytes, nblocks, p)) {
    return cudaErrorInvalidValue;
  }
  if (nbytes == 0) return cudaSuccess;
  p.watch.op = static_cast<std::uint32_t>(all_to_all ? device::OpCode::all_to_all
                                                     : device::OpCode::all_gather);
  const unsigned grid = detail::plan_tiles(p, nbytes, 1, nblocks);
  // Every access is at a multiple of 16 from base + k * nbytes.
  const int gs = detail::granularity(send, all_to_all ? nbytes : 16);
  const int gr = detail::granularity(recv, nbytes);
  return detail::launch_peer_kernel(exchange_kernel, grid, stream, static_cast<const char*>(send),
                                    static_cast<char*>(recv), nbytes,
                                    all_to_all ? nbytes : std::size_t{0}, p, gs, gr);
}

}  // namespace

int all_gather(const void* send, void* recv, std::size_t count, std::size_t elem_bytes,
               const device::Workspace& ws, stream_t stream, int nblocks) {
  return exchange(send, recv, count, elem_bytes, false, ws, stream, nblocks);
}

int all_to_all(const void* send, void* recv, std::size_t count, std::size_t elem_bytes,
               const device::Workspace& ws, stream_t stream, int nblocks) {
  return exchange(send, recv, count, elem_bytes, true, ws, stream, nblocks);
}

int reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                   const device::Workspace& ws, stream_t stream, int nblocks) {
  PeerParams p;
  const std::size_t nbytes = count * size_of(type);
  if (!is_valid(type) || !is_valid(op) || !make_params(ws, send, recv, nbytes, nblocks, p)) {
    return cudaErrorInvalidValue;
  }
  if (nbytes == 0) return cudaSuccess;
  p.watch.op = static_cast<std::uint32_t>(device::OpCode::reduce_scatter);
  const unsigned grid = detail::plan_tiles(p, nbytes, 1, nblocks);
  const int gs = detail::granularity(send, nbytes);
  const int gr = detail::granularity(recv);
  return detail::with_codec(type, [&](auto codec) {
    return detail::launch_peer_kernel(reduce_scatter_kernel<decltype(codec)>, grid, stream,
                                      static_cast<const char*>(send), static_cast<char*>(recv),
                                      nbytes, op, p, gs, gr);
  });
}

int detail::load_collectives() {
  if (int rc = detail::load_peer_function(exchange_kernel)) return rc;
  return detail::load_for_every_type([](auto codec) {
    return detail::load_peer_function(reduce_scatter_kernel<decltype(codec)>);
  });
}

}  // namespace coccl::kernels
