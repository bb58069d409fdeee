// coccl/moe.hpp: the token exchange of a mixture-of-experts layer.
//
//   coccl::moe::Dispatcher moe(comm, {.max_tokens = 128, .hidden = 7168,
//                                     .type = coccl::DataType::bfloat16, .top_k = 8,
//                                     .num_experts = 64});
//   auto got = moe.dispatch(x, tokens, topk_idx, stream);   // rows grouped by local expert
//   run_experts(got.x, got.rows, got.expert_offsets, y, stream);  // counts stay on the GPU
//   moe.combine(y, topk_weights, out, stream);               // weighted sum, original order
//
// Two objects, each bound to one communicator and sized once by the caller's maxima:
//  - AllToAllv: all-to-all with per-peer counts that live where the data lives. On the GPU the
//    send counts are read by the kernel and the received counts written by it; nothing goes
//    through the host, so a call captured in a CUDA graph replays with whatever counts the
//    device holds at each replay.
//  - Dispatcher: MoE dispatch (every token to the ranks of its top-k experts, received rows
//    grouped by local expert) and combine (expert outputs back to their tokens, summed with the
//    routing weights), without the caller packing or unpacking rows.
//
// Device forms (a build with CUDA; the GPU current in the calling thread): buffers are device
// memory of that GPU; the call enqueues its kernels on `stream` and returns. Among the GPUs of one
// host: The first device call of an object (or prepare()) is collective and blocking: it
// allocates the object's arena on each GPU (sized by the maxima, nothing before that call) and
// maps the peers' arenas (CUDA IPC across processes, peer access within one); make it before
// capturing a graph. Every rank must then make the same device calls on the object, in the same
// order, on one stream (or streams ordered among themselves), like the device collectives of
// Communicator. device_bytes() is what the object holds on each GPU.
//
// Across hosts (ranks with different host ids, see COCCL_HOSTID) the device forms take the
// communicator's network path instead of an arena mapped by every peer: kernels on `stream` stage
// the data through pinned host memory and the communicator's proxy moves it, with counts still
// read and written on the device only (the proxy reads them from pinned memory; nothing
// synchronises the host). Their calls are ordered with the communicator's device operations.
//  - AllToAllv holds no arena there (device_bytes() is 0).
//  - Dispatcher holds one local buffer (device_bytes_for(config, n, true)): a packing kernel puts
//    each rank's rows in the receiver's order, an all_to_allv with device counts moves them, and a
//    placing kernel writes the same Received layout as on one host; combine goes back the same
//    way. Since a rank cannot know before the exchange what its peers send, its buffer holds
//    min(max_tokens * top_k, capacity) rows from every peer. Up to 128 ranks. A rank whose rows a
//    receiver dropped for lack of capacity learns it from combine (device_status() after it).
// The first device call (or prepare()) is collective there too.
//
// Host forms: buffers and counts in host memory; the exchange runs over the communicator's host
// collectives (all_to_all/all_gather of the counts, then all_to_allv) and blocks until done.
//
// Errors: invalid arguments detectable on the host (sizes, null or misaligned pointers) throw
// std::system_error(errc::invalid_argument) with nothing enqueued. A count on the device is only
// known to the kernel, which cannot stop (its peers wait for it): it clamps the count (see each
// call), completes the exchange on every rank consistently, and records the error in host memory;
// device_status(), called after the stream is synchronised, returns it and clears it. A kernel
// that waits longer than COCCL_TIMEOUT for a peer returns instead (the CUDA context stays usable);
// device_status() then reports errc::timed_out, naming the peer and the call, every time: the
// object is out of step with its peers and must be destroyed. On host
// memory the counts are exchanged first, so a count over the maximum on any rank makes the call
// throw errc::invalid_argument on every rank, with no data sent.
//
// Destruction: once an object has made device calls, destroying it is collective (every rank
// destroys its object, after synchronising the stream, before destroying the communicator): a
// host barrier makes sure no peer still writes into the arena that is freed.
//
// Thread safety: an object is used by one thread at a time (each rank's own object). Objects
// share nothing with each other or with the communicator's device workspace, so several may
// exist per communicator (each costs its own arena).
#pragma once

#include <coccl/communicator.hpp>
#include <coccl/types.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

namespace coccl::moe {

namespace detail {
struct A2avState;
struct DispatchState;
}  // namespace detail

/// All-to-all with per-peer counts in the same memory as the data (device or host).
///
/// Counts and displacements are in elements, one entry per rank, as int32 or int64 (both
/// overloads exist; received counts are written in the same type). Rank r sends
/// send[send_displs[q] .. + send_counts[q]) to rank q, which receives it at recv[recv_displs[r]
/// ..] and finds the count in recv_counts[r]. A null displacement array means "packed": the
/// exclusive prefix sum of the counts in rank order (for recv, of the received counts, so recv
/// must then hold size() * max_count elements to be safe). Not in place.
class AllToAllv {
 public:
  AllToAllv() = default;
  /// Binds to `comm`; every count must be at most `max_count` (elements per peer, < 2^31).
  /// Allocates nothing yet.
  AllToAllv(Communicator comm, std::size_t max_count, DataType type);
  ~AllToAllv();
  AllToAllv(AllToAllv&&) noexcept;
  AllToAllv& operator=(AllToAllv&&) noexcept;

  /// Device arena bytes one rank needs for these maxima: 16 KiB + nranks * max_count *
  /// size_of(type) (rounded up to 16 bytes per peer).
  static std::size_t device_bytes_for(std::size_t max_count, DataType type, int nranks);
  /// Device memory this object holds on this rank's GPU (0 before the first device call).
  std::size_t device_bytes() const;

  /// Allocates and maps the device arena now (collective, blocking; idempotent).
  void prepare();

  /// Device form: counts, displacements and recv_counts are device memory. A send count above
  /// max_count is sent as max_count (a negative one as 0); recv_counts on the receiver report
  /// what was sent, and device_status() reports the error.
  void run(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs,
           void* recv, std::int64_t* recv_counts, const std::int64_t* recv_displs,
           cuda_stream stream);
  void run(const void* send, const std::int32_t* send_counts, const std::int32_t* send_displs,
           void* recv, std::int32_t* recv_counts, const std::int32_t* recv_displs,
           cuda_stream stream);

  /// Host form: everything in host memory; blocks until the exchange is done. Throws
  /// errc::invalid_argument on every rank if any rank's count is negative or above max_count.
  void run(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs,
           void* recv, std::int64_t* recv_counts, const std::int64_t* recv_displs);
  void run(const void* send, const std::int32_t* send_counts, const std::int32_t* send_displs,
           void* recv, std::int32_t* recv_counts, const std::int32_t* recv_displs);

  /// Errors the kernels recorded since the last call (synchronise the stream first): empty,
  /// errc::invalid_argument with a description in `what` when given, or errc::timed_out when a
  /// kernel gave up waiting for a peer (the object is then unusable).
  std::error_code device_status(std::string* what = nullptr);

 private:
  std::unique_ptr<detail::A2avState> s_;
};

/// The fixed shape of a Dispatcher; the same on every rank.
struct DispatchConfig {
  /// Most tokens a rank dispatches per call.
  int max_tokens = 0;
  /// Elements per token row; hidden * size_of(type) must be a multiple of 16 bytes.
  int hidden = 0;
  /// float32, float16 or bfloat16.
  DataType type = DataType::bfloat16;
  /// Experts per token, 1..16.
  int top_k = 0;
  /// All experts, split evenly across ranks: rank r owns experts [r*E/n, (r+1)*E/n). At most
  /// 512 and a multiple of the number of ranks.
  int num_experts = 0;
  /// Rows one rank can receive per dispatch; 0 means the worst case, size() * max_tokens *
  /// top_k. A smaller bound (a capacity factor) saves memory; rows beyond it are dropped (see
  /// dispatch).
  std::size_t max_recv_rows = 0;
};

/// Where one received row came from (16 bytes).
struct Row {
  std::int32_t rank;    ///< source rank
  std::int32_t token;   ///< token index on the source rank
  std::int32_t slot;    ///< top-k slot of that token (0 .. top_k-1)
  std::int32_t expert;  ///< global expert id (this rank's experts only)
};

/// A dispatch's result on the receiving rank. Device form: device pointers into the arena, the
/// same on every call (so a captured graph can use them); host form: host memory. Valid until
/// the next dispatch on this object.
struct Received {
  /// Rows of `hidden` elements; local expert j's rows are x[expert_offsets[j] ..
  /// expert_offsets[j+1]), within an expert ordered by source rank, then token, then slot.
  void* x = nullptr;
  /// rows[i] describes x's row i, for i < expert_offsets[local_experts].
  const Row* rows = nullptr;
  /// local_experts counts and local_experts + 1 offsets (the last is the number of rows).
  const std::int32_t* expert_counts = nullptr;
  const std::int32_t* expert_offsets = nullptr;
  /// The rows x and rows can hold.
  std::size_t capacity = 0;
  int local_experts = 0;
  /// Global id of local expert 0.
  int first_expert = 0;
};

/// MoE dispatch and combine over one communicator.
class Dispatcher {
 public:
  Dispatcher() = default;
  /// Binds to `comm` with the given maxima; throws errc::invalid_argument for an invalid config.
  /// Allocates nothing yet.
  Dispatcher(Communicator comm, const DispatchConfig& config);
  ~Dispatcher();
  Dispatcher(Dispatcher&&) noexcept;
  Dispatcher& operator=(Dispatcher&&) noexcept;

  /// Device bytes one rank needs. On one host (the arena): about max_recv_rows * (row bytes + 16)
  /// for received rows, max_tokens * top_k * (row bytes + 8) for combine's inbox, and 68 KiB of
  /// counts and flags. Across hosts (`across_hosts`): the same received rows, plus twice
  /// nranks * min(max_tokens * top_k, capacity) elements of (row bytes + 16) for the exchange.
  static std::size_t device_bytes_for(const DispatchConfig& config, int nranks,
                                      bool across_hosts = false);
  /// Device memory this object holds on this rank's GPU (0 before the first device call).
  std::size_t device_bytes() const;
  /// Rows one rank can receive per dispatch.
  std::size_t capacity() const;

  /// Allocates and maps the device arena now (collective, blocking; idempotent).
  void prepare();

  /// Device form. x: `tokens` rows (<= max_tokens) of `hidden` elements, 16-byte aligned;
  /// topk_idx: int32 [tokens, top_k] expert ids, -1 for an unused slot. Every (token, slot)
  /// with an expert sends the token's row to the expert's rank (one row per slot). Rows beyond a
  /// rank's capacity are dropped and an id outside [-1, num_experts) is treated as -1; both are
  /// reported by device_status(), and the counts and offsets stay within the capacity.
  Received dispatch(const void* x, int tokens, const std::int32_t* topk_idx, cuda_stream stream);
  /// Device form. y: the expert outputs, one row per received row in the layout of the last
  /// dispatch's Received::x (y may be that buffer); weights: float [tokens, top_k] of the last
  /// dispatch. out[t] = sum over slots s with an expert, in slot order, of weights[t, s] * (the
  /// expert output for (t, s)), accumulated in float and rounded once; rows for t are 16-byte
  /// aligned, out may alias x. Dropped rows contribute nothing.
  void combine(const void* y, const float* weights, void* out, cuda_stream stream);

  /// Host forms, same semantics on host memory; block until done. More rows for a rank than its
  /// capacity, a bad expert id or tokens > max_tokens on any rank throws errc::invalid_argument
  /// on every rank.
  Received dispatch(const void* x, int tokens, const std::int32_t* topk_idx);
  void combine(const void* y, const float* weights, void* out);

  /// Errors the kernels recorded since the last call (synchronise the stream first); see
  /// AllToAllv::device_status.
  std::error_code device_status(std::string* what = nullptr);

 private:
  std::unique_ptr<detail::DispatchState> s_;
};

}  // namespace coccl::moe
