// kernels/moe_net.hpp: the local kernels of MoE dispatch and combine across hosts
// (kernels/moe_net.cu). The rows themselves cross hosts through the communicator's network
// all_to_allv (kernels/net.hpp, elements of one row plus a 16-byte record); these kernels pack
// the rows before it and put them in place after it, on the caller's stream, never waiting for
// the host or a peer.
//
// One device buffer per object and rank (NetMoeLayout). Dispatch:
//   1. net_dispatch_pack: every (token, slot) with an expert goes to the expert's rank, into that
//      rank's segment of the send area (A) in the receiver's order (its experts in order, then
//      tokens and slots in order), after `head` elements holding this rank's full per-expert
//      counts for that rank. At most `rows_per_peer` rows go to one rank: those past it could
//      never be kept (see below).
//   2. the network all_to_allv of A into the receive area (B), counts in elements. The own
//      segment is not sent (count 0): it stays in A, where step 3 reads it.
//   3. net_dispatch_place: from every source's counts, the receiver computes the layout the
//      one-host kernel makes (experts in order, then source ranks, then the source's tokens and
//      slots; rows at or past the capacity dropped) and copies each row and its Row record there.
// Combine:
//   4. net_combine_pack: every row received from a source goes back into the same place in B with
//      the expert's output (or a "dropped" mark); the own rows straight into A;
//   5. the network all_to_allv of B back into A (the own segment again not sent);
//   6. net_combine_sum: out[t] = sum over slots in order of weights * returned row, float
//      accumulation and one rounding, as the one-host combine.
//
// Launch functions return a cudaError_t value (0 = success, cudaErrorInvalidValue = 1 for bad
// arguments, nothing enqueued).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/moe.hpp"

struct CUstream_st;

namespace coccl::kernels::moe {

/// Most ranks of a dispatcher across hosts (one network transfer each way per peer).
inline constexpr int net_moe_max_ranks = 128;

/// Byte offsets and sizes of one rank's buffer for dispatch and combine across hosts.
struct NetMoeLayout {
  std::size_t elem;           // bytes of one exchanged element: a 16-byte record, then the row
  std::size_t head;           // elements at the start of each peer's segment holding the counts
  std::size_t rows_per_peer;  // most rows one rank sends another: min(max_tokens*top_k, capacity)
  std::size_t per_peer;       // elements of one peer's segment: head + rows_per_peer
  std::size_t send;           // A: [nranks][per_peer] elements
  std::size_t recv;           // B: [nranks][per_peer] elements
  std::size_t counts;         // int64 [counts_arrays][nranks], see count_array
  std::size_t entries;        // int32 [max_tokens * top_k]: element of A for each own (token, slot)
  std::size_t arrival;        // int32 [nranks * rows_per_peer]: row of x for each received row
  std::size_t expert_counts;  // int32 [local experts]
  std::size_t expert_offsets;  // int32 [local experts + 1]
  std::size_t rows;            // Row [capacity]
  std::size_t x;               // [capacity][row bytes]: the received rows, grouped by expert
  std::size_t total;
};

/// The int64 count arrays of the buffer (each nranks long), in elements.
enum count_array : int {
  dispatch_send = 0,  // written by net_dispatch_pack
  dispatch_recv = 1,  // written by the network all_to_allv
  segment_start = 2,  // q * per_peer: where each peer's segment starts (set once by the host)
  combine_send = 3,   // written by net_combine_pack
  combine_recv = 4,   // written by the network all_to_allv
  rows_start = 5,     // q * per_peer + head: where each peer's rows start (set once by the host)
  counts_arrays = 6,
};

/// Validates the shape (as moe_layout, but up to net_moe_max_ranks ranks) and lays out the
/// buffer; false if the shape is invalid.
inline bool net_moe_layout(const MoeShape& s, NetMoeLayout& L) {
  MoeShape one = s;
  one.nranks = 1;  // moe_layout checks everything but the rank limit of one host
  one.num_experts = s.num_experts / (s.nranks > 0 ? s.nranks : 1);
  MoeLayout unused{};
  if (s.nranks < 1 || s.nranks > net_moe_max_ranks || s.num_experts < s.nranks ||
      s.num_experts > max_experts || s.num_experts % s.nranks != 0 || !moe_layout(one, unused))
    return false;
  const std::size_t n = static_cast<std::size_t>(s.nranks);
  const std::size_t row = static_cast<std::size_t>(s.hidden) * size_of(s.type);
  const std::size_t entries = static_cast<std::size_t>(s.max_tokens) * s.top_k;
  const std::size_t local = static_cast<std::size_t>(s.num_experts) / n;
  auto up = [](std::size_t v) { return (v + 255) / 256 * 256; };
  L.elem = row + 16;
  L.head = (local * sizeof(std::int32_t) + L.elem - 1) / L.elem;
  L.rows_per_peer = entries < s.capacity ? entries : s.capacity;
  L.per_peer = L.head + L.rows_per_peer;
  // Element indices are int32 in the kernels.
  if (n * L.per_peer >= (std::size_t{1} << 31)) return false;
  L.send = 0;
  L.recv = up(L.send + n * L.per_peer * L.elem);
  L.counts = up(L.recv + n * L.per_peer * L.elem);
  L.entries = up(L.counts + counts_arrays * n * sizeof(std::int64_t));
  L.arrival = up(L.entries + entries * sizeof(std::int32_t));
  L.expert_counts = up(L.arrival + n * L.rows_per_peer * sizeof(std::int32_t));
  L.expert_offsets = up(L.expert_counts + local * sizeof(std::int32_t));
  L.rows = up(L.expert_offsets + (local + 1) * sizeof(std::int32_t));
  L.x = up(L.rows + s.capacity * sizeof(Row));
  L.total = up(L.x + s.capacity * row);
  return true;
}

/// One rank's buffer on its GPU and the host-mapped error words (moe::error_kind).
struct NetMoe {
  MoeShape shape;
  NetMoeLayout L;
  int rank;
  char* base;
  unsigned* errors;
};

/// Step 1: packs x's rows (`tokens` rows, 16-byte aligned) by topk_idx into A and writes the send
/// counts. An expert id outside [-1, num_experts) is treated as -1 (error bad_expert); rows past
/// rows_per_peer for one rank are dropped (error rows_over_capacity).
int net_dispatch_pack(const NetMoe& m, const void* x, int tokens, const std::int32_t* topk_idx,
                      CUstream_st* stream);
/// Step 3: places the rows received in B into x, rows, expert_counts and expert_offsets (clamped
/// to the capacity; error rows_over_capacity when rows are dropped).
int net_dispatch_place(const NetMoe& m, CUstream_st* stream);
/// Step 4: puts y's rows (the layout of x) back into B for their sources.
int net_combine_pack(const NetMoe& m, const void* y, CUstream_st* stream);
/// Step 6: sums the returned rows of the last dispatch's `tokens` into out; a row the receiver
/// dropped sets rows_over_capacity here, on its sender.
int net_combine_sum(const NetMoe& m, const float* weights, void* out, int tokens,
                    CUstream_st* stream);

/// Loads these kernels onto the current device (see kernels::load_kernels).
int load_net_moe();

}  // namespace coccl::kernels::moe
