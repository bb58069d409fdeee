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

// Tells the proxy that round k is staged, once every block has staged its share: one system
// fence per block, after the block's barrier (a fence in every thread costs tens of
// microseconds). A block stages round k only after round k - slots was done, which needed every
// block's round k - slots: so blocks are fewer than `slots` rounds apart, and one arrival
// counter per slot keeps the rounds apart.
__device__ void arrive(const NetChannel& ch, std::uint64_t base, std::uint64_t k) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence_system();
  const std::uint32_t target = static_cast<std::uint32_t>(k / ch.slots + 1) * gridDim.x;
  if (atomicAdd(&ch.counters->arrive[k % ch.slots], 1u) + 1 == target) {
    __threadfence_system();
    store_release_sys64(&ch.box->staged, base + k + 1);
  }
}

// Block 0 posts the operation (its descriptor first); every block learns where the
// communicator's rounds stand.
__device__ std::uint64_t begin(const NetChannel& ch) {
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
  return base;
}

// Rounds k0 .. p.rounds - 1 of plan p (the rounds before k0 are done and out).
__device__ bool run_rounds(const NetPlan& p, const NetChannel& ch, const detail::Watch& w,
                           std::uint64_t base, std::uint64_t k0) {
  const std::uint64_t slot = 2 * ch.slot_bytes;
  const std::uint64_t N = ch.slots;
  // Round j's results: wait for the proxy, then copy them out of its slot's "out" area.
  auto finish = [&](std::uint64_t j) {
    if (!wait_done(ch, w, base + j + 1)) return false;
    copy_round<false>(p, ch.stage + (j % N) * slot + ch.slot_bytes, j);
    return true;
  };
  for (std::uint64_t k = k0; k < p.rounds; ++k) {
    copy_round<true>(p, ch.stage + (k % N) * slot, k);
    arrive(ch, base, k);
    // The next round's slot is free once the round that used it before is out.
    if (k + 1 >= N + k0 && !finish(k + 1 - N)) return false;
  }
  for (std::uint64_t j = p.rounds + 1 > N + k0 ? p.rounds + 1 - N : k0; j < p.rounds; ++j)
    if (!finish(j)) return false;
  return true;
}

// The last block to leave moves the counters on for the next operation (which starts only after
// this kernel has ended: the communicator orders its launches).
__device__ void leave(const NetChannel& ch, std::uint64_t base, std::uint64_t rounds) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(&ch.counters->leave, 1u) + 1 == gridDim.x) {
    for (std::uint32_t i = 0; i < ch.slots; ++i) ch.counters->arrive[i] = 0;
    ch.counters->leave = 0;
    ch.counters->rounds = base + rounds;
    ch.counters->ops += 1;
    __threadfence();
  }
}

__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    net_kernel(const NetPlan p, const NetChannel ch) {
  const detail::Watch w{ch.status, &ch.counters->claim, ch.timeout_ns, ch.seq, ch.op};
  const std::uint64_t base = begin(ch);
  if (run_rounds(p, ch, w, base, 0)) leave(ch, base, p.rounds);
}

__device__ std::int64_t count_at(const void* counts, bool wide, int q) {
  return wide ? static_cast<const std::int64_t*>(counts)[q]
              : static_cast<const std::int32_t*>(counts)[q];
}

__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    net_a2av_kernel(const NetA2av a, const NetChannel ch, std::uint64_t chunk) {
  const detail::Watch w{ch.status, &ch.counters->claim, ch.timeout_ns, ch.seq, ch.op};
  __shared__ NetPlan plan;
  __shared__ std::int64_t sc[net_max_segs], rc[net_max_segs];
  __shared__ std::uint64_t sd[net_max_segs], rd[net_max_segs];
  const std::uint64_t base = begin(ch);
  const int n = a.nranks;
  const int t = static_cast<int>(threadIdx.x);
  // Round 0: the send counts, clamped to [0, max_count] (the error noted, the exchange kept in
  // step on every rank).
  if (t < n) {
    std::int64_t c = count_at(a.send_counts, a.counts64, t);
    int error = -1;
    if (c < 0) {
      c = 0;
      error = 1;  // moe::count_negative
    } else if (static_cast<std::uint64_t>(c) > a.max_count) {
      c = static_cast<std::int64_t>(a.max_count);
      error = 0;  // moe::count_over_max
    }
    sc[t] = c;
    if (blockIdx.x == 0) {
      reinterpret_cast<volatile std::int64_t*>(ch.stage)[t] = c;
      if (error >= 0 && a.errors != nullptr)
        reinterpret_cast<volatile unsigned*>(a.errors)[error] = 1;
    }
  }
  arrive(ch, base, 0);
  if (!wait_done(ch, w, base + 1)) return;
  if (t < n) rc[t] = __ldcv(reinterpret_cast<const long long*>(ch.stage + ch.slot_bytes) + t);
  __syncthreads();
  if (t == 0) {
    std::uint64_t so = 0, ro = 0;
    for (int q = 0; q < n; ++q) {
      sd[q] =
          a.send_displs ? static_cast<std::uint64_t>(count_at(a.send_displs, a.counts64, q)) : so;
      rd[q] =
          a.recv_displs ? static_cast<std::uint64_t>(count_at(a.recv_displs, a.counts64, q)) : ro;
      so += static_cast<std::uint64_t>(sc[q]);
      ro += static_cast<std::uint64_t>(rc[q]);
    }
    net_a2av_plan(plan, n, chunk, a.elem_bytes, a.send, a.recv, sc, sd, rc, rd);
  }
  if (blockIdx.x == 0 && t < n) {
    if (a.counts64)
      static_cast<std::int64_t*>(a.recv_counts)[t] = rc[t];
    else
      static_cast<std::int32_t*>(a.recv_counts)[t] = static_cast<std::int32_t>(rc[t]);
  }
  __syncthreads();
  if (run_rounds(plan, ch, w, base, 1)) leave(ch, base, plan.rounds);
}

}  // namespace

int net_stage(const NetPlan& plan, const NetChannel& ch, int max_grid, CUstream_st* stream) {
  if (plan.rounds == 0 || plan.chunk == 0 || plan.chunk % 64 != 0 || ch.stage == nullptr ||
      ch.slots < 2 || ch.slots > static_cast<std::uint32_t>(net_max_slots) || ch.box == nullptr ||
      ch.counters == nullptr || ch.status == nullptr ||
      plan.nin > static_cast<std::uint32_t>(net_max_segs) ||
      plan.nout > static_cast<std::uint32_t>(net_max_segs) || max_grid < 1)
    return cudaErrorInvalidValue;
  // A block per 256 KiB of the largest round, up to the budget: enough to keep PCIe busy, and a
  // small message gets one block.
  auto side = [&](const NetSeg* segs, std::uint32_t n) {
    std::uint64_t bytes = 0;
    for (std::uint32_t s = 0; s < n; ++s) {
      const std::uint64_t piece =
          plan.layout == NetLayout::packed ? plan.piece_bytes : segs[s].bytes;
      bytes += min(plan.chunk, piece) * (plan.layout == NetLayout::packed ? segs[s].repeat : 1);
    }
    return bytes;
  };
  const std::uint64_t round_bytes = max(side(plan.in, plan.nin), side(plan.out, plan.nout));
  const std::uint64_t want = (round_bytes + (256u << 10) - 1) / (256u << 10);
  const unsigned grid = static_cast<unsigned>(
      want < 1 ? 1
               : (want > static_cast<std::uint64_t>(max_grid) ? static_cast<std::uint64_t>(max_grid)
                                                              : want));
  net_kernel<<<grid, detail::block_threads, 0, stream>>>(plan, ch);
  return static_cast<int>(cudaGetLastError());
}

int net_all_to_allv(const NetA2av& a, const NetChannel& ch, std::uint64_t chunk, int max_grid,
                    CUstream_st* stream) {
  if (a.nranks < 1 || a.nranks > net_max_segs || chunk == 0 || chunk % 64 != 0 ||
      ch.stage == nullptr || ch.box == nullptr || ch.counters == nullptr || ch.status == nullptr ||
      ch.slots < 2 || ch.slots > static_cast<std::uint32_t>(net_max_slots) || max_grid < 1 ||
      a.send_counts == nullptr || a.recv_counts == nullptr || a.elem_bytes == 0 ||
      static_cast<std::uint64_t>(a.nranks) * 8 > ch.slot_bytes)
    return cudaErrorInvalidValue;
  // The counts are known only on the device: a block per 256 KiB of the most a round can carry.
  const std::uint64_t most = chunk * static_cast<std::uint64_t>(a.nranks);
  const std::uint64_t want = (most + (256u << 10) - 1) / (256u << 10);
  const unsigned grid = static_cast<unsigned>(
      want > static_cast<std::uint64_t>(max_grid) ? static_cast<std::uint64_t>(max_grid) : want);
  net_a2av_kernel<<<grid, detail::block_threads, 0, stream>>>(a, ch, chunk);
  return static_cast<int>(cudaGetLastError());
}

int detail::load_net() {
  if (int rc = detail::load_peer_function(net_kernel)) return rc;
  return detail::load_peer_function(net_a2av_kernel);
}

}  // namespace coccl::kernels
