// The staging kernel of collectives across hosts (see net.hpp): one kernel per operation copies
// each round's pieces between the user's device buffers and pinned host staging, and talks to
// the rank's proxy through mapped host counters. It never waits for another rank, only for its
// own proxy, which waits for the network.
#include <cuda_runtime.h>

#include "kernels/load.hpp"
#include "kernels/net.hpp"
#include "kernels/peer.cuh"

namespace coccl::kernels {
namespace {

using detail::granularity;

__device__ __forceinline__ void store_release_sys64(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ std::uint64_t load_acquire_sys64(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ int address_granularity(const void* p) {
  const auto bits = reinterpret_cast<std::uintptr_t>(p) | 16;
  return static_cast<int>(bits & (~bits + 1));
}

// Staging written by the proxy is read with volatile loads: the data came over PCIe behind the
// caches' back, and each byte is read once.
template <class T, bool kFromHost>
__device__ __forceinline__ void copy_as(char* dst, const char* src, std::size_t units,
                                        std::size_t t, std::size_t nt) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  for (std::size_t i = t; i < units; i += nt) d[i] = kFromHost ? __ldcv(s + i) : __ldcg(s + i);
}

// The block's share of `len` bytes, in the widest accesses both addresses allow.
template <bool kFromHost>
__device__ void copy_share(char* dst, const char* src, std::size_t len) {
  const std::size_t G = gridDim.x;
  const std::size_t part = (len + 16 * G - 1) / (16 * G) * 16;
  const std::size_t begin = part * blockIdx.x;
  if (begin >= len) return;
  const std::size_t n = len - begin < part ? len - begin : part;
  dst += begin;
  src += begin;
  const int w = min(address_granularity(dst), address_granularity(src));
  const std::size_t t = threadIdx.x, nt = blockDim.x;
  std::size_t body = 0;
  if (w >= 16) {
    copy_as<uint4, kFromHost>(dst, src, n / 16, t, nt);
    body = n / 16 * 16;
  } else if (w == 8) {
    copy_as<uint2, kFromHost>(dst, src, n / 8, t, nt);
    body = n / 8 * 8;
  } else if (w == 4) {
    copy_as<unsigned, kFromHost>(dst, src, n / 4, t, nt);
    body = n / 4 * 4;
  } else if (w == 2) {
    copy_as<unsigned short, kFromHost>(dst, src, n / 2, t, nt);
    body = n / 2 * 2;
  }
  copy_as<unsigned char, kFromHost>(dst + body, src + body, n - body, t, nt);
}

// Copies round k of one side: device to staging (in) or staging to device (out).
template <bool kIn>
__device__ void copy_round(const NetPlan& p, char* area, std::uint64_t k) {
  const NetSeg* segs = kIn ? p.in : p.out;
  const std::uint32_t nsegs = kIn ? p.nin : p.nout;
  std::uint32_t index = 0;
  for (std::uint32_t s = 0; s < nsegs; ++s) {
    for (std::uint32_t j = 0; j < segs[s].repeat; ++j, ++index) {
      std::uint64_t stage_off = 0, dev_off = 0, len = 0;
      if (!net_piece(p, segs[s], index, j, k, stage_off, dev_off, len)) continue;
      if (kIn)
        copy_share<false>(area + stage_off, segs[s].dev + dev_off, len);
      else
        copy_share<true>(segs[s].dev + dev_off, area + stage_off, len);
    }
  }
}

// Thread 0 waits until the proxy has finished `target` rounds in all; false (in every thread)
// when the wait gave up.
__device__ bool wait_done(const NetChannel& ch, const detail::Watch& w, std::uint64_t target) {
  bool ok = true;
  if (threadIdx.x == 0)
    ok = detail::wait_for(w, -1, [&] { return load_acquire_sys64(&ch.box->done) >= target; });
  return __syncthreads_and(ok) != 0;
}

__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    net_kernel(const NetPlan p, const NetChannel ch) {
  const detail::Watch w{ch.status, &ch.counters->claim, ch.timeout_ns, ch.seq, ch.op};
  __shared__ std::uint64_t base;
  if (threadIdx.x == 0) {
    base = ch.counters->rounds;
    if (blockIdx.x == 0) {
      volatile NetMailbox* box = ch.box;
      box->desc = ch.desc;
      __threadfence_system();
      store_release_sys64(&ch.box->posted, ch.counters->ops + 1);
    }
  }
  __syncthreads();
  const std::uint64_t slot = 2 * ch.slot_bytes;
  const std::uint64_t N = ch.slots;
  // Round j's results: wait for the proxy, then copy them out of its slot's "out" area.
  auto finish = [&](std::uint64_t j) {
    if (!wait_done(ch, w, base + j + 1)) return false;
    copy_round<false>(p, ch.stage + (j % N) * slot + ch.slot_bytes, j);
    return true;
  };
  for (std::uint64_t k = 0; k < p.rounds; ++k) {
    copy_round<true>(p, ch.stage + (k % N) * slot, k);
    // Every block's staging writes are visible system-wide before the last one to arrive tells
    // the proxy: one system fence per block, after the block's barrier (a fence in every thread
    // costs tens of microseconds). A block stages round k only after round k - N was done, which
    // needed every block's round k - N: so blocks are fewer than N rounds apart, and one counter
    // per slot keeps the rounds apart.
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      const std::uint32_t target = static_cast<std::uint32_t>(k / N + 1) * gridDim.x;
      if (atomicAdd(&ch.counters->arrive[k % N], 1u) + 1 == target) {
        __threadfence_system();
        store_release_sys64(&ch.box->staged, base + k + 1);
      }
    }
    // The next round's slot is free once the round that used it before is out.
    if (k + 1 >= N && !finish(k + 1 - N)) return;
  }
  for (std::uint64_t j = p.rounds + 1 > N ? p.rounds + 1 - N : 0; j < p.rounds; ++j)
    if (!finish(j)) return;
  // The last block to leave moves the counters on for the next operation (which starts only
  // after this kernel has ended: the communicator orders its launches).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&ch.counters->leave, 1u) + 1 == gridDim.x) {
      for (std::uint32_t i = 0; i < ch.slots; ++i) ch.counters->arrive[i] = 0;
      ch.counters->leave = 0;
      ch.counters->rounds = base + p.rounds;
      ch.counters->ops += 1;
      __threadfence();
    }
  }
}

}  // namespace

int net_stage(const NetPlan& plan, const NetChannel& ch, int max_grid, CUstream_st* stream) {
  if (plan.rounds == 0 || plan.chunk == 0 || plan.chunk % 64 != 0 || ch.stage == nullptr ||
      ch.slots < 2 || ch.slots > static_cast<std::uint32_t>(net_max_slots) ||
      ch.box == nullptr || ch.counters == nullptr || ch.status == nullptr ||
      plan.nin > static_cast<std::uint32_t>(net_max_segs) ||
      plan.nout > static_cast<std::uint32_t>(net_max_segs) || max_grid < 1)
    return cudaErrorInvalidValue;
  // A block per 256 KiB of the largest round, up to the budget: enough to keep PCIe busy, and a
  // small message gets one block.
  auto side = [&](const NetSeg* segs, std::uint32_t n) {
    std::uint64_t bytes = 0;
    for (std::uint32_t s = 0; s < n; ++s) {
      const std::uint64_t piece = plan.layout == NetLayout::packed ? plan.piece_bytes : segs[s].bytes;
      bytes += min(plan.chunk, piece) * (plan.layout == NetLayout::packed ? segs[s].repeat : 1);
    }
    return bytes;
  };
  const std::uint64_t round_bytes = max(side(plan.in, plan.nin), side(plan.out, plan.nout));
  const std::uint64_t want = (round_bytes + (256u << 10) - 1) / (256u << 10);
  const unsigned grid =
      static_cast<unsigned>(want < 1 ? 1 : (want > static_cast<std::uint64_t>(max_grid)
                                                ? static_cast<std::uint64_t>(max_grid)
                                                : want));
  net_kernel<<<grid, detail::block_threads, 0, stream>>>(plan, ch);
  return static_cast<int>(cudaGetLastError());
}

int detail::load_net() { return detail::load_peer_function(net_kernel); }

}  // namespace coccl::kernels
