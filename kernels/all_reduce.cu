// kernels/all_reduce.cu: one-shot (LL packets) and two-shot (staged reduce-scatter + all-gather)
// all-reduce between the GPUs of one host.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "launch.hpp"
#include "load.hpp"
#include "peer.cuh"

namespace coccl::kernels {
namespace {

using detail::PeerParams;
using detail::Raw;

// 8 data bytes of an LL packet pair, at granularity g (pointer alignment, at most 8 used).
__device__ __forceinline__ Raw<2> load8(const char* p, int g, int valid) {
  Raw<2> d{};
  if (valid == 8 && g >= 8) {
    const uint2 x = __ldcg(reinterpret_cast<const uint2*>(p));
    d.w[0] = x.x, d.w[1] = x.y;
  } else if (valid == 8 && g == 4) {
    d.w[0] = __ldcg(reinterpret_cast<const unsigned*>(p));
    d.w[1] = __ldcg(reinterpret_cast<const unsigned*>(p) + 1);
  } else {
    unsigned char b[8] = {};
    for (int i = 0; i < valid; ++i) b[i] = __ldcg(reinterpret_cast<const unsigned char*>(p) + i);
    std::memcpy(d.w, b, 8);
  }
  return d;
}

__device__ __forceinline__ void store8(char* p, int g, int valid, const Raw<2>& d) {
  if (valid == 8 && g >= 8) {
    *reinterpret_cast<uint2*>(p) = make_uint2(d.w[0], d.w[1]);
  } else if (valid == 8 && g == 4) {
    reinterpret_cast<unsigned*>(p)[0] = d.w[0];
    reinterpret_cast<unsigned*>(p)[1] = d.w[1];
  } else {
    unsigned char b[8];
    std::memcpy(b, d.w, 8);
    for (int i = 0; i < valid; ++i) p[i] = static_cast<char>(b[i]);
  }
}

// Waits for rank `peer`'s packet pair at `at`; false when the wait gave up.
__device__ __forceinline__ bool wait_ll(const PeerParams& p, int peer, const char* at,
                                        std::uint32_t epoch, Raw<2>& out) {
  uint4 v;
  const bool ok = detail::wait_for(p.watch, peer, [&] {
    v = detail::load_ll(at);
    return v.y == epoch && v.w == epoch;
  });
  out = Raw<2>{{v.x, v.z}};
  return ok;
}

// Element i*8 .. i*8+7 of the message travels as packet pair i (16 bytes) of the sender's slot.
// Every rank uses the same grid, so block b of each rank writes and reads the same pairs and
// block b's epoch is the flag value on both sides.
template <class C>
__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    oneshot_kernel(const char* send, char* recv, std::size_t nbytes, ReduceOp op, PeerParams p,
                   int gs, int gr) {
  const std::uint32_t epoch = detail::load_epoch(p) + 1;
  const int h = static_cast<int>(epoch & 1);
  const int n = p.nranks;
  const int r = p.rank;
  const std::size_t npairs = (nbytes + 7) / 8;
  const std::size_t first = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;

  for (std::size_t i = first; i < npairs; i += stride) {
    const int valid = static_cast<int>(detail::min_size(8, nbytes - i * 8));
    const Raw<2> d = load8(send + i * 8, gs, valid);
#pragma unroll
    for (int q = 0; q < device::max_ranks; ++q) {
      if (q < n && q != r) {
        detail::store_ll(p.ws[q] + p.ll_offset + (h * n + r) * p.ll_slot + i * 16, d.w[0], d.w[1],
                         epoch);
      }
    }
  }

  const char* inbox = p.ws[r] + p.ll_offset + h * n * p.ll_slot;
  const int avg_divisor = op == ReduceOp::avg ? n : 1;
  for (std::size_t i = first; i < npairs; i += stride) {
    const int valid = static_cast<int>(detail::min_size(8, nbytes - i * 8));
    Raw<2> v[device::max_ranks];
    bool ok = true;
#pragma unroll
    for (int q = 0; q < device::max_ranks; ++q) {
      if (q < n) {
        if (q == r)
          v[q] = load8(send + i * 8, gs, valid);
        else
          ok = ok && wait_ll(p, q, inbox + q * p.ll_slot + i * 16, epoch, v[q]);
      }
    }
    // A wait that gave up leaves the workspace out of step: the thread stops (no barrier
    // follows, so the block's other threads need not agree).
    if (!ok) return;
    detail::Acc<C, 2> acc = detail::widen<C, 2>(v[0]);
#pragma unroll
    for (int q = 1; q < device::max_ranks; ++q) {
      if (q < n) detail::combine<C, 2>(acc, v[q], op);
    }
    store8(recv + i * 8, gr, valid, detail::narrow<C, 2>(acc, avg_divisor));
  }
  detail::store_epoch(p, epoch);
}

// Per iteration a block takes a chunk of n slices; rank q owns share q of it. Push the peers'
// shares into their staging (epoch e), reduce the own share and push the result (epoch e + 1),
// then copy the peers' results out. Both pushes cross NVLink once: 2 (n-1)/n of the message.
template <class C>
__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    twoshot_kernel(const char* send, char* recv, std::size_t nbytes, ReduceOp op, PeerParams p,
                   int gs, int gr) {
  std::uint32_t epoch = detail::load_epoch(p);
  const int n = p.nranks;
  const int r = p.rank;
  const std::size_t chunk = n * p.tile;
  for (std::size_t base = blockIdx.x * chunk; base < nbytes; base += gridDim.x * chunk) {
    const std::size_t len = detail::min_size(chunk, nbytes - base);
    std::size_t start = 0;
    std::size_t size = 0;

    const int h = static_cast<int>(++epoch & 1);
#pragma unroll
    for (int q = 0; q < device::max_ranks; ++q) {
      if (q < n && q != r) {
        detail::share_of(len, n, q, start, size);
        detail::block_copy(detail::staging(p, p.ws[q], h, r), 16, send + base + start, gs, size);
      }
    }
    if (!detail::peer_barrier(p, epoch)) return;

    const int h2 = static_cast<int>(++epoch & 1);
    detail::share_of(len, n, r, start, size);
    detail::reduce_share<C>(p, send + base + start, gs, h, recv + base + start, gr, true, h2, size,
                            op);
    if (!detail::peer_barrier(p, epoch)) return;

#pragma unroll
    for (int q = 0; q < device::max_ranks; ++q) {
      if (q < n && q != r) {
        detail::share_of(len, n, q, start, size);
        detail::block_copy(recv + base + start, gr, detail::staging(p, p.ws[r], h2, q), 16, size);
      }
    }
  }
  detail::store_epoch(p, epoch);
}

bool valid_args(const void* send, const void* recv, std::size_t count, DataType type, ReduceOp op,
                int nblocks) {
  return is_valid(type) && is_valid(op) && nblocks >= 0 && nblocks <= device::max_blocks &&
         (count == 0 || (send != nullptr && recv != nullptr));
}

}  // namespace

int all_reduce_oneshot(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                       const device::Workspace& ws, stream_t stream, int nblocks) {
  PeerParams p;
  if (!valid_args(send, recv, count, type, op, nblocks) || !detail::make_peer_params(ws, p)) {
    return cudaErrorInvalidValue;
  }
  p.watch.op = static_cast<std::uint32_t>(device::OpCode::all_reduce);
  const std::size_t nbytes = count * size_of(type);
  if (nbytes > ws.oneshot_max_bytes) return cudaErrorInvalidValue;
  if (nbytes == 0) return cudaSuccess;
  const std::size_t npairs = (nbytes + 7) / 8;
  const unsigned grid = detail::blocks_for(
      (npairs + detail::block_threads - 1) / detail::block_threads, nblocks, p.max_grid);
  const int gs = detail::granularity(send);
  const int gr = detail::granularity(recv);
  return detail::with_codec(type, [&](auto codec) {
    return detail::launch_peer_kernel(oneshot_kernel<decltype(codec)>, grid, stream,
                                      static_cast<const char*>(send), static_cast<char*>(recv),
                                      nbytes, op, p, gs, gr);
  });
}

int all_reduce_twoshot(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                       const device::Workspace& ws, stream_t stream, int nblocks) {
  PeerParams p;
  if (!valid_args(send, recv, count, type, op, nblocks) || !detail::make_peer_params(ws, p) ||
      p.slice == 0) {
    return cudaErrorInvalidValue;
  }
  p.watch.op = static_cast<std::uint32_t>(device::OpCode::all_reduce);
  const std::size_t nbytes = count * size_of(type);
  if (nbytes == 0) return cudaSuccess;
  const unsigned grid = detail::plan_tiles(p, nbytes, p.nranks, nblocks);
  const int gs = detail::granularity(send);
  const int gr = detail::granularity(recv);
  return detail::with_codec(type, [&](auto codec) {
    return detail::launch_peer_kernel(twoshot_kernel<decltype(codec)>, grid, stream,
                                      static_cast<const char*>(send), static_cast<char*>(recv),
                                      nbytes, op, p, gs, gr);
  });
}

namespace {
std::atomic<bool> dependent_launch_on{true};
}  // namespace

bool detail::dependent_launch() { return dependent_launch_on.load(std::memory_order_relaxed); }

void set_dependent_launch(bool on) { dependent_launch_on.store(on, std::memory_order_relaxed); }

int detail::load_all_reduce() {
  return detail::load_for_every_type([](auto codec) {
    using C = decltype(codec);
    if (int rc = detail::load_peer_function(oneshot_kernel<C>)) return rc;
    return detail::load_peer_function(twoshot_kernel<C>);
  });
}

}  // namespace coccl::kernels
