// kernels/p2p.cu: grouped sends and receives between the GPUs of one host, and all_to_allv built
// on them.
//
// Only the two ranks of a transfer take part in it, so the collective epochs (which need every
// rank to launch the same kernels) cannot order it. Each ordered pair (src -> dst) and channel
// instead keeps monotonic counters in the workspace header, read and written by the kernels only:
//   in dst's workspace:  data[ch][src]   chunks src has written into dst's staging (src writes)
//   in src's workspace:  ack[ch][dst]    chunks dst has copied out (dst writes)
//                        ready[ch][dst]  transfers dst has started receiving from src (dst writes)
//   own counters:        chunks and transfers sent per (ch, dst) and received per (ch, src)
// Chunk c of a channel goes into the receiver's staging slot (block ch, parity c & 1, source
// src). The sender writes chunk c only when
//   - ready >= k, k the transfer's number: the receiver has entered its kernel for transfer k, so
//     whatever it ran before on its stream (a collective still reading the same slot) is done;
//   - ack >= c - 2: the receiver has copied out the chunk that last used the parity;
// and ends a transfer only when ack == its last chunk, so a collective it runs next never
// overwrites a slot the receiver still reads. Counters compare wrap-safe; graphs replay fine.
#include <cuda_runtime.h>

#include "launch.hpp"
#include "load.hpp"
#include "peer.cuh"

namespace coccl::kernels {
namespace {

using detail::PeerParams;

// Blocks (channels) per peer and direction: enough to keep NVLink busy (between two H200s 8
// blocks moved about 190 GB/s and 16 about 260), few enough that the 2 (nranks - 1) directions of
// a full all_to_allv stay within the grid limit. It depends only on the group size and the
// agreed limit, so both sides of every transfer agree on it. Below 2 (nranks - 1) blocks of limit
// the grid exceeds it: every direction needs a block of its own to progress.
constexpr int max_channels = 32;
__host__ __device__ constexpr int channels_for(int nranks, int max_grid) {
  int c = max_channels;
  while (c > 1 && 2 * (nranks - 1) * c > max_grid) c /= 2;
  return c;
}
constexpr std::size_t counters_offset = 8192;

enum Counter : int {
  data_in,
  ack_in,
  ready_in,
  sent_chunks,
  sent_xfers,
  recv_chunks,
  recv_xfers,
  counter_kinds
};

static_assert(counters_offset >= detail::flags_offset + device::max_blocks * device::max_ranks * 4);
static_assert(counters_offset + counter_kinds * max_channels * device::max_ranks * 4 <=
              device::workspace_header_bytes);
// A full all_to_allv: 2 (max_ranks - 1) directions of channels_for(max_ranks, ...) blocks each.
static_assert(2 * (device::max_ranks - 1) * channels_for(device::max_ranks, device::max_blocks) <=
              device::max_blocks);

struct Op {
  char* buffer;
  std::size_t bytes;
  int peer;
  int is_send;
  int g;  // granularity of buffer
};

struct OpList {
  Op ops[max_p2p_ops];
  int nops;
  int channels;                     // blocks per direction
  int dirs[2 * device::max_ranks];  // peer * 2 + is_send, one entry per block group
};

__device__ __forceinline__ std::uint32_t* counter(char* ws, int kind, int ch, int peer) {
  return reinterpret_cast<std::uint32_t*>(ws + counters_offset) +
         (kind * max_channels + ch) * device::max_ranks + peer;
}

__device__ __forceinline__ char* slot(const PeerParams& p, char* ws, int ch, int h, int src) {
  return ws + p.staging_offset +
         ((static_cast<std::size_t>(ch) * 2 + h) * p.nranks + src) * p.slice;
}

// Both sides cut a transfer into the same tiles: the tile depends only on its size and the
// (equal) slice.
__host__ __device__ __forceinline__ std::size_t tile_of(std::size_t bytes, std::size_t slice,
                                                        int channels) {
  std::size_t t = (bytes + channels - 1) / channels;
  t = (t + 15) / 16 * 16;
  if (t < detail::min_tile) t = detail::min_tile;
  return t < slice ? t : slice;
}

// Block group blockIdx.x / channels serves one peer in one direction, channel blockIdx.x %
// channels; it runs that direction's transfers in order, the chunks of channel ch being tiles ch,
// ch + channels, ... Different directions run in different blocks, so a group that sends to and
// receives from the same peer cannot deadlock.
__global__ void __launch_bounds__(detail::block_threads, detail::min_blocks_per_sm)
    p2p_kernel(OpList list, PeerParams p) {
  detail::begin_after_prior_grid();
  const int channels = list.channels;
  const int dir = list.dirs[blockIdx.x / channels];
  const int ch = static_cast<int>(blockIdx.x % channels);
  const int peer = dir / 2;
  const bool sending = dir % 2 != 0;
  const int r = p.rank;
  char* own = p.ws[r];
  char* remote = p.ws[peer];
  const bool lead = threadIdx.x == 0;
  __shared__ std::uint32_t start_chunks, start_xfers;
  if (lead) {
    start_chunks = *counter(own, sending ? sent_chunks : recv_chunks, ch, peer);
    start_xfers = *counter(own, sending ? sent_xfers : recv_xfers, ch, peer);
  }
  __syncthreads();
  std::uint32_t chunks = start_chunks;
  std::uint32_t xfers = start_xfers;
  bool failed = false;
  for (int i = 0; i < list.nops; ++i) {
    const Op op = list.ops[i];
    if (op.peer != peer || (op.is_send != 0) != sending) continue;
    const std::uint32_t k = ++xfers;
    const std::size_t tile = tile_of(op.bytes, p.slice, channels);
    const std::size_t ntiles = (op.bytes + tile - 1) / tile;
    if (sending) {
      bool first = true;
      for (std::size_t t = ch; t < ntiles; t += channels) {
        const std::uint32_t c = ++chunks;
        bool ok = true;
        if (lead) {
          ok = (!first ||
                detail::wait_at_least(p.watch, peer, counter(own, ready_in, ch, peer), k)) &&
               detail::wait_at_least(p.watch, peer, counter(own, ack_in, ch, peer), c - 2);
        }
        first = false;
        // A wait that gave up ends the block (every thread: the barrier carries the verdict).
        if (!__syncthreads_and(ok)) return;
        const std::size_t base = t * tile;
        detail::block_copy(slot(p, remote, ch, static_cast<int>(c & 1), r), 16, op.buffer + base,
                           op.g, detail::min_size(tile, op.bytes - base));
        __syncthreads();
        if (lead) detail::store_release_sys(counter(remote, data_in, ch, r), chunks);
      }
      if (lead && !first &&
          !detail::wait_at_least(p.watch, peer, counter(own, ack_in, ch, peer), chunks))
        failed = true;
    } else {
      if (lead) detail::store_release_sys(counter(remote, ready_in, ch, r), k);
      for (std::size_t t = ch; t < ntiles; t += channels) {
        const std::uint32_t c = ++chunks;
        const bool ok =
            !lead || detail::wait_at_least(p.watch, peer, counter(own, data_in, ch, peer), c);
        if (!__syncthreads_and(ok)) return;
        const std::size_t base = t * tile;
        detail::block_copy(op.buffer + base, op.g, slot(p, own, ch, static_cast<int>(c & 1), peer),
                           16, detail::min_size(tile, op.bytes - base));
        // The release below is cumulative over the block's reads of the slot (ordered by the
        // barrier), so the sender reuses the slot only after they are done.
        __syncthreads();
        if (lead) detail::store_release_sys(counter(remote, ack_in, ch, r), c);
      }
    }
    if (__syncthreads_or(failed)) return;
  }
  if (lead) {
    *counter(own, sending ? sent_chunks : recv_chunks, ch, peer) = chunks;
    *counter(own, sending ? sent_xfers : recv_xfers, ch, peer) = xfers;
  }
}

}  // namespace

int send_recv(const P2p* ops, int nops, const device::Workspace& ws, stream_t stream) {
  PeerParams p;
  if (nops < 0 || nops > max_p2p_ops || (nops > 0 && ops == nullptr) ||
      !detail::make_peer_params(ws, p) || p.slice == 0) {
    return cudaErrorInvalidValue;
  }
  OpList list{};
  p.watch.op = static_cast<std::uint32_t>(device::OpCode::send_recv);
  list.channels = channels_for(ws.nranks, p.max_grid);
  bool used[2 * device::max_ranks] = {};
  // Transfers to self pair up in order: k-th send with k-th receive, equal sizes.
  const P2p* self_sends[max_p2p_ops];
  const P2p* self_recvs[max_p2p_ops];
  int nself_send = 0;
  int nself_recv = 0;
  for (int i = 0; i < nops; ++i) {
    const P2p& o = ops[i];
    if (o.peer < 0 || o.peer >= ws.nranks || (o.bytes != 0 && o.buffer == nullptr)) {
      return cudaErrorInvalidValue;
    }
    if (o.peer == ws.rank) {
      (o.is_send ? self_sends[nself_send++] : self_recvs[nself_recv++]) = &o;
      continue;
    }
    used[o.peer * 2 + (o.is_send ? 1 : 0)] = true;
    Op& d = list.ops[list.nops++];
    d.buffer = static_cast<char*>(o.buffer);
    d.bytes = o.bytes;
    d.peer = o.peer;
    d.is_send = o.is_send ? 1 : 0;
    d.g = detail::granularity(o.buffer);
  }
  if (nself_send != nself_recv) return cudaErrorInvalidValue;
  for (int i = 0; i < nself_send; ++i) {
    if (self_sends[i]->bytes != self_recvs[i]->bytes) return cudaErrorInvalidValue;
  }
  int ndirs = 0;
  for (int d = 0; d < 2 * device::max_ranks; ++d) {
    if (used[d]) list.dirs[ndirs++] = d;
  }
  for (int i = 0; i < nself_send; ++i) {
    if (self_sends[i]->buffer == self_recvs[i]->buffer || self_sends[i]->bytes == 0) continue;
    if (int rc = copy(self_recvs[i]->buffer, self_sends[i]->buffer, self_sends[i]->bytes, stream)) {
      return rc;
    }
  }
  if (ndirs == 0) return cudaSuccess;
  return detail::launch_peer_kernel(p2p_kernel, static_cast<unsigned>(ndirs * list.channels),
                                    stream, list, p);
}

int all_to_allv(const void* send, void* recv, const AllToAllvLayout& layout, std::size_t elem_bytes,
                const device::Workspace& ws, stream_t stream) {
  if (!(elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8) ||
      ws.nranks < 1 || ws.nranks > device::max_ranks) {
    return cudaErrorInvalidValue;
  }
  P2p ops[2 * device::max_ranks];
  int nops = 0;
  for (int q = 0; q < ws.nranks; ++q) {
    const std::size_t sb = layout.send_counts[q] * elem_bytes;
    const std::size_t rb = layout.recv_counts[q] * elem_bytes;
    if ((sb != 0 && send == nullptr) || (rb != 0 && recv == nullptr)) return cudaErrorInvalidValue;
    // Zero-sized transfers still count on both sides, which agree on them (recv_counts[q] here
    // is send_counts[rank] there), so every pair's counters stay in step.
    ops[nops++] =
        P2p{true,
            const_cast<char*>(static_cast<const char*>(send)) + layout.send_displs[q] * elem_bytes,
            sb, q};
    ops[nops++] = P2p{false, static_cast<char*>(recv) + layout.recv_displs[q] * elem_bytes, rb, q};
  }
  return send_recv(ops, nops, ws, stream);
}

int detail::load_p2p() { return detail::load_peer_function(p2p_kernel); }

}  // namespace coccl::kernels
