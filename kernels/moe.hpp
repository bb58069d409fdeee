// kernels/moe.hpp: launch functions of the MoE exchange kernels (kernels/moe.cu) and the layout
// of their arenas.
//
// Plain C++ (no CUDA headers). Every function enqueues on `stream`, returns a cudaError_t value
// (0 = success, cudaErrorInvalidValue = 1 for bad arguments, nothing enqueued) and never waits
// for the host, so every call can be captured in a CUDA graph and replayed.
//
// Each communicator-level object (coccl::moe::AllToAllv, coccl::moe::Dispatcher) owns one arena
// per rank, mapped by every peer (`Arenas::peer`). Arenas are zeroed once before the first
// launch and afterwards written only by these kernels. Every rank launches the same sequence of
// calls on its arena (they are collective) on one stream, with the same shape: that keeps the
// per-block epochs kept in the arena header equal on every rank, and they replace host sequence
// numbers, so graph replays keep working. The synchronisation protocol is described in moe.cu.
//
// Errors found on the device (a count above the maximum, more rows than the capacity, an expert
// id out of range) cannot stop a kernel that peers wait for: the kernel clamps (see each
// function), finishes the exchange consistently on every rank, and sets a word of `errors`
// (host memory mapped into the device, one word per error_kind), which the host reads once the
// stream has been synchronised.
#pragma once

#include <coccl/types.hpp>
#include <cstddef>
#include <cstdint>

#include "kernels/device.hpp"

struct CUstream_st;

namespace coccl::kernels::moe {

using stream_t = CUstream_st*;

/// Words of the error array; each is set to 1 by a kernel that found the error.
enum error_kind : int {
  count_over_max = 0,      // an all_to_allv send count above max_count (sent clamped)
  count_negative = 1,      // a negative all_to_allv send count (sent as 0)
  rows_over_capacity = 2,  // a dispatch with more rows for a rank than its capacity (dropped)
  bad_expert = 3,          // an expert id >= num_experts or < -1 (treated as -1, not routed)
  error_kinds = 4,
};

/// Every rank's arena as mapped in this process; peer[rank] is the own one.
struct Arenas {
  char* peer[device::max_ranks];
  int rank;
  int nranks;
  /// Where a wait that gives up is reported, and the host's abort flag (mapped host memory; see
  /// device::Status). Required.
  device::Status* status;
  /// Longest wait for a peer (0: device::default_timeout_ns).
  std::uint64_t timeout_ns;
};

// ---- all_to_allv with counts in device memory ----

/// Bytes of the all_to_allv arena header (epochs, count words, flags).
inline constexpr std::size_t a2av_header_bytes = 16384;

/// Bytes of one source rank's staging slot: max_count elements, rounded up to 16 bytes.
inline std::size_t a2av_slot_bytes(std::size_t max_count, std::size_t elem_bytes) {
  return (max_count * elem_bytes + 15) / 16 * 16;
}

/// Bytes of one rank's arena for all_to_allv of at most `max_count` elements of `elem_bytes`
/// per peer among `nranks` ranks: the header and one staging slot per source rank.
inline std::size_t a2av_arena_bytes(std::size_t max_count, std::size_t elem_bytes, int nranks) {
  return a2av_header_bytes +
         static_cast<std::size_t>(nranks) * a2av_slot_bytes(max_count, elem_bytes);
}

struct A2av {
  const void* send;
  const void* send_counts;  // nranks counts (int32 or int64, see counts64), device memory
  const void* send_displs;  // nranks displacements, or null: packed in rank order
  void* recv;
  void* recv_counts;        // written: nranks counts, device memory
  const void* recv_displs;  // nranks displacements, or null: packed in rank order
  bool counts64;            // counts and displacements are int64 (else int32)
  std::size_t max_count;    // as the arena was sized
  std::size_t elem_bytes;   // 1, 2, 4 or 8
};

/// Rank r sends send[send_displs[q] .. + send_counts[q]) to rank q, which receives it at
/// recv[recv_displs[r] ..] and writes recv_counts[r] = that count. Counts are read on the device
/// when the kernel runs. A count above max_count is sent as max_count (a negative one as 0), and
/// the error is set; every rank's recv_counts reports what was actually sent.
int all_to_allv(const A2av& args, const Arenas& arenas, unsigned* errors, stream_t stream);

// ---- MoE dispatch and combine ----

/// Most experts in total, and most top-k slots per token.
inline constexpr int max_experts = 512;
inline constexpr int max_top_k = 16;

/// One received row's origin (16 bytes, one vector store).
struct Row {
  std::int32_t rank;    // source rank
  std::int32_t token;   // token index on the source rank
  std::int32_t slot;    // top-k slot (0 .. top_k-1) of that token
  std::int32_t expert;  // global expert id
};

/// The fixed shape of a dispatcher; equal on every rank.
struct MoeShape {
  int nranks;
  int max_tokens;        // tokens per rank and call, at most
  int hidden;            // elements per row; hidden * size_of(type) is a multiple of 16
  DataType type;         // float32, float16 or bfloat16
  int top_k;             // 1 .. max_top_k
  int num_experts;       // nranks .. max_experts, a multiple of nranks
  std::size_t capacity;  // rows one rank can receive per dispatch
};

/// Byte offsets of the areas of one rank's dispatcher arena.
struct MoeLayout {
  std::size_t counts;          // [2 parity][max_ranks][max_experts] uint64 (epoch << 32 | count)
  std::size_t expert_counts;   // int32 [local experts]: rows received per local expert
  std::size_t expert_offsets;  // int32 [local experts + 1]: first row of each; last = total
  std::size_t entries;         // int2 [max_tokens * top_k]: where each own (token, slot) went
  std::size_t rows;            // Row [capacity]
  std::size_t recv;            // [capacity][row bytes]: the dispatched rows, grouped by expert
  std::size_t inbox;           // [max_tokens * top_k][row bytes]: expert outputs coming back
  std::size_t total;           // bytes of the arena
};

/// Where the dispatcher arena's count words start (epochs, ready flags and arrival counters
/// come before), and their size.
inline constexpr std::size_t moe_counts_offset = 4096;
inline constexpr std::size_t moe_counts_bytes =
    std::size_t{2} * device::max_ranks * max_experts * sizeof(std::uint64_t);
/// Bytes of one (token, slot) record: destination rank and row, int32 each.
inline constexpr std::size_t moe_entry_bytes = 8;

/// Validates the shape and lays out the arena; false if the shape is invalid.
inline bool moe_layout(const MoeShape& s, MoeLayout& L) {
  if (s.nranks < 1 || s.nranks > device::max_ranks || s.max_tokens < 1 || s.hidden < 1 ||
      s.top_k < 1 || s.top_k > max_top_k || s.num_experts < s.nranks ||
      s.num_experts > max_experts || s.num_experts % s.nranks != 0 || s.capacity < 1 ||
      s.capacity >= (std::size_t{1} << 31) ||
      !(s.type == DataType::float32 || s.type == DataType::float16 ||
        s.type == DataType::bfloat16)) {
    return false;
  }
  const std::size_t row = static_cast<std::size_t>(s.hidden) * size_of(s.type);
  const std::size_t entries = static_cast<std::size_t>(s.max_tokens) * s.top_k;
  if (row % 16 != 0 || entries >= (std::size_t{1} << 31)) return false;
  const std::size_t local = static_cast<std::size_t>(s.num_experts / s.nranks);
  auto up = [](std::size_t v) { return (v + 255) / 256 * 256; };
  L.counts = moe_counts_offset;
  L.expert_counts = up(L.counts + moe_counts_bytes);
  L.expert_offsets = up(L.expert_counts + local * 4);
  L.entries = up(L.expert_offsets + (local + 1) * 4);
  L.rows = up(L.entries + entries * moe_entry_bytes);
  L.recv = up(L.rows + s.capacity * sizeof(Row));
  L.inbox = up(L.recv + s.capacity * row);
  L.total = up(L.inbox + entries * row);
  return true;
}

/// Sends row t of x (tokens rows of `hidden` elements, 16-byte aligned) to the rank of every
/// expert in topk_idx[t * top_k + slot] (int32, -1 = no expert), into that rank's arena at a
/// position grouped by local expert (expert j's rows start at expert_offsets[j]; within an expert,
/// source ranks in order, then tokens and slots in order), with its Row. Also writes the own
/// arena's expert_counts/expert_offsets and remembers per (token, slot) where it went, for
/// combine. Rows past a rank's capacity are dropped (the error is set; counts and offsets are
/// clamped to the capacity, so readers stay in bounds).
int dispatch(const MoeShape& shape, const void* x, int tokens, const std::int32_t* topk_idx,
             const Arenas& arenas, unsigned* errors, stream_t stream);

/// Sends row r of y (the expert outputs, in the layout of the last dispatch's received rows) back
/// to the source of received row r, then writes out[t] = sum over slots s (in slot order, float
/// accumulation, one rounding) of weights[t * top_k + s] * (expert output of (t, s)), for the
/// `tokens` of the last dispatch; slots with no expert (or dropped rows) contribute nothing.
int combine(const MoeShape& shape, const void* y, const float* weights, void* out, int tokens,
            const Arenas& arenas, stream_t stream);

/// Loads the MoE kernels onto the current device (see kernels::load_kernels).
int load_moe();

}  // namespace coccl::kernels::moe
