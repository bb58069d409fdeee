// kernels/net.hpp: the device half of collectives across hosts (collectives/net_device.cpp has
// the proxy half). Plain C++, shared by the kernel and the proxy: both derive the same chunk
// schedule from a NetPlan.
//
// An operation moves through pinned host staging in rounds. Round k: the kernel copies the
// round's pieces of the user's device buffers into staging slot k % slots ("in" area) and tells
// the proxy (NetMailbox::staged); the proxy runs the round's host operation over the network from
// the "in" area into the "out" area and answers (NetMailbox::done, counted in round order); the
// kernel copies the "out" area into the user's buffers. The kernel keeps staging while up to
// slots - 1 rounds are with the proxy, which runs them at once over its lanes, so the GPU
// copies, the network and the peers' copies overlap.
//
// Layouts:
// - packed: every piece has plan.piece_bytes bytes; round k holds bytes [k*chunk, +chunk) of
//   each, back to back in piece order (the layout a host collective of that count expects).
// - pairs: a piece is one transfer with segment.peer; its round r holds bytes
//   [(r - first_round) * chunk, +chunk) at offset peer * chunk (one area per peer), so every
//   ordered pair of ranks moves its transfers in the same rounds on both sides.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/device.hpp"

#if defined(__CUDACC__)
#define COCCL_HD __host__ __device__ __forceinline__
#else
#define COCCL_HD inline
#endif

struct CUstream_st;

namespace coccl::kernels {

/// Most segments on each side of one plan.
inline constexpr int net_max_segs = 128;

/// Most staging slots of a channel.
inline constexpr int net_max_slots = 16;

/// A run of pieces in device memory: `repeat` pieces at dev + j * piece_bytes (packed layout), or
/// one transfer of `bytes` with `peer` starting in round `first_round` (pairs layout).
struct NetSeg {
  char* dev;
  std::uint64_t bytes;
  std::uint32_t repeat;
  std::int32_t peer;
  std::uint32_t first_round;
};

enum class NetLayout : std::uint32_t { packed = 1, pairs = 2 };

/// What one operation moves, on one rank. Passed to the kernel by value (about 8 KiB: kernel
/// parameters may take up to 32 KiB since CUDA 12.1).
struct NetPlan {
  NetLayout layout;
  std::uint32_t nin, nout;    // segments used in `in` (device to staging) and `out`
  std::uint64_t chunk;        // bytes of a piece per round (multiple of 64)
  std::uint64_t rounds;       // rounds of the operation on this rank (>= 1)
  std::uint64_t piece_bytes;  // packed: bytes of every piece
  NetSeg in[net_max_segs];
  NetSeg out[net_max_segs];
};

/// Pinned host memory shared by a rank's kernels and its proxy; the counters are cumulative over
/// the communicator's life. Each on its own cache line: one writer per line.
struct NetMailbox {
  alignas(64) std::uint64_t posted;  // kernels: operations started
  std::uint64_t desc;                // kernels: the descriptor of operation `posted`
  alignas(64) std::uint64_t staged;  // kernels: rounds staged
  alignas(64) std::uint64_t done;    // proxy: rounds finished
};

/// Device memory of the kernels (zeroed once): the position they continue from, and the
/// per-round arrival counts of the blocks.
struct NetCounters {
  std::uint64_t ops;
  std::uint64_t rounds;
  std::uint32_t arrive[net_max_slots];
  std::uint32_t leave;
  std::uint32_t claim;  // the Watch claim word (see peer.cuh)
};

/// Where one rank's kernels meet its proxy.
struct NetChannel {
  char* stage;  // device pointer of the staging: [slots][in, out][slot_bytes]
  std::uint64_t slot_bytes;
  std::uint32_t slots;     // 2..net_max_slots
  NetMailbox* box;         // device pointer of the mailbox
  NetCounters* counters;   // device memory
  std::uint64_t desc;      // the proxy's descriptor of this operation
  device::Status* status;  // device pointer of the rank's Status
  std::uint64_t timeout_ns;
  std::uint64_t seq;
  std::uint32_t op;  // device::OpCode
};

/// Bytes of piece `j` (global piece index across segments) of segment `s` in round k, and where
/// it lies in the staging area and in the device buffer. False when the piece is idle in round k.
COCCL_HD bool net_piece(const NetPlan& p, const NetSeg& s, std::uint32_t index_in_area,
                        std::uint32_t j, std::uint64_t k, std::uint64_t& stage_off,
                        std::uint64_t& dev_off, std::uint64_t& len) {
  if (p.layout == NetLayout::packed) {
    const std::uint64_t start = k * p.chunk;
    if (start >= p.piece_bytes) return false;
    len = p.piece_bytes - start < p.chunk ? p.piece_bytes - start : p.chunk;
    stage_off = static_cast<std::uint64_t>(index_in_area) * len;
    dev_off = j * p.piece_bytes + start;
    return true;
  }
  if (k < s.first_round) return false;
  const std::uint64_t start = (k - s.first_round) * p.chunk;
  if (start >= s.bytes) return false;
  len = s.bytes - start < p.chunk ? s.bytes - start : p.chunk;
  stage_off = static_cast<std::uint64_t>(s.peer) * p.chunk;
  dev_off = start;
  return true;
}

/// Rounds a pairs transfer of `bytes` takes.
COCCL_HD std::uint64_t net_rounds_of(std::uint64_t bytes, std::uint64_t chunk) {
  return (bytes + chunk - 1) / chunk;
}

/// Enqueues the staging kernel of one operation on `stream` with at most `max_grid` blocks (all
/// of them must be able to run at once). Returns a cudaError_t value.
int net_stage(const NetPlan& plan, const NetChannel& ch, int max_grid, CUstream_st* stream);

// ---- all_to_allv with counts in device memory (coccl::moe::AllToAllv across hosts) ----
//
// Round 0 carries the counts: the kernel stages its send counts (clamped to [0, max_count]) as
// nranks int64 in the "in" area, the proxy runs an all_to_all of one int64 a rank, and both
// sides read the received counts from the "out" area. From them both build the same pairs plan
// (net_a2av_plan), whose transfers start in round 1.

/// What the all_to_allv kernel reads and writes.
struct NetA2av {
  const char* send;
  const void* send_counts;  // nranks counts (int32 or int64), device memory
  const void* send_displs;  // nranks displacements, or null: packed in rank order
  char* recv;
  void* recv_counts;        // written: the received counts
  const void* recv_displs;  // or null: packed in rank order
  bool counts64;
  std::uint64_t max_count;
  std::uint32_t elem_bytes;  // any size: an element may be a whole record (moe::Dispatcher)
  std::int32_t nranks;       // at most net_max_segs
  unsigned* errors;          // device pointer of host-mapped words (moe::error_kind), may be null
};

/// The pairs plan of an all_to_allv of `n` ranks from its clamped counts (elements) and element
/// displacements, with buffers at `send` and `recv`: one transfer each way per peer with a
/// non-zero count, all starting in round 1 (after the counts' round).
COCCL_HD void net_a2av_plan(NetPlan& p, int n, std::uint64_t chunk, std::uint32_t elt,
                            const char* send, char* recv, const std::int64_t* sc,
                            const std::uint64_t* sd, const std::int64_t* rc,
                            const std::uint64_t* rd) {
  p.layout = NetLayout::pairs;
  p.chunk = chunk;
  p.rounds = 1;
  p.nin = p.nout = 0;
  p.piece_bytes = 0;
  for (int q = 0; q < n; ++q) {
    const std::uint64_t sb = static_cast<std::uint64_t>(sc[q]) * elt;
    const std::uint64_t rb = static_cast<std::uint64_t>(rc[q]) * elt;
    if (sb != 0) {
      p.in[p.nin++] = NetSeg{const_cast<char*>(send) + sd[q] * elt, sb, 1, q, 1};
      const std::uint64_t end = 1 + net_rounds_of(sb, chunk);
      p.rounds = end > p.rounds ? end : p.rounds;
    }
    if (rb != 0) {
      p.out[p.nout++] = NetSeg{recv + rd[q] * elt, rb, 1, q, 1};
      const std::uint64_t end = 1 + net_rounds_of(rb, chunk);
      p.rounds = end > p.rounds ? end : p.rounds;
    }
  }
}

/// Enqueues the all_to_allv kernel (see above). Returns a cudaError_t value.
int net_all_to_allv(const NetA2av& a, const NetChannel& ch, std::uint64_t chunk, int max_grid,
                    CUstream_st* stream);

}  // namespace coccl::kernels
