// collectives/moe_state.hpp: the state behind coccl::moe objects, and the device side they use
// (collectives/moe_device.cpp with CUDA, moe_device_none.cpp without).
#pragma once

#include <coccl/moe.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "kernels/moe.hpp"
#include "kernels/moe_net.hpp"

namespace coccl::moe::detail {

/// One rank's arena on its GPU, mapped by every peer, plus host-mapped error words.
struct DeviceArena;
struct DeviceArenaDeleter {
  void operator()(DeviceArena* a) const noexcept;
};
using DeviceArenaPtr = std::unique_ptr<DeviceArena, DeviceArenaDeleter>;

/// Collective and blocking: allocates `bytes` zeroed bytes on the current GPU, loads the kernels,
/// exchanges mappings with every rank of `comm`. Throws std::system_error (errc::unsupported
/// without CUDA or across hosts, errc::cuda_error on a CUDA failure).
DeviceArenaPtr make_arena(Communicator& comm, std::size_t bytes);
std::size_t arena_bytes(const DeviceArena& a) noexcept;
/// The own arena's device address.
char* arena_base(DeviceArena& a) noexcept;

/// Launch the kernels; throw std::system_error on a launch error (nothing enqueued then) or when
/// the current GPU is not the arena's.
void launch_a2av(DeviceArena& a, kernels::moe::A2av args, cuda_stream stream);
void launch_dispatch(DeviceArena& a, const kernels::moe::MoeShape& shape, const void* x, int tokens,
                     const std::int32_t* topk_idx, cuda_stream stream);
void launch_combine(DeviceArena& a, const kernels::moe::MoeShape& shape, const void* y,
                    const float* weights, void* out, int tokens, cuda_stream stream);

/// Reads and clears the error words the kernels set.
std::error_code take_errors(DeviceArena& a, std::string* what);

struct A2avState {
  Communicator comm;
  std::size_t max_count = 0;
  DataType type = DataType::uint8;
  DeviceArenaPtr arena;
  // Across hosts: host-mapped error words (error_kinds) of the network path's kernel.
  std::shared_ptr<unsigned> net_errors;
};

/// True when the ranks of `comm` span hosts: the device forms then take the communicator's
/// network path instead of an arena.
bool spans_hosts(const Communicator& comm);

/// Makes what the device all_to_allv across hosts needs (the communicator's device state, the
/// error words) now: collective and blocking.
void prepare_a2av_net(A2avState& s);

/// The device all_to_allv across hosts (coccl::detail::enqueue_device_a2av); throws
/// std::system_error with nothing enqueued when the launch fails.
void launch_a2av_net(A2avState& s, const kernels::moe::A2av& args, cuda_stream stream);

/// Reads and clears the error words of the network path; a failed communicator (a kernel that
/// gave up, a lost peer) reports its error every time.
std::error_code take_net_errors(A2avState& s, std::string* what);

/// A Dispatcher's device side across hosts: one local buffer (kernels/moe_net.hpp) and
/// host-mapped error words; the rows move through the communicator's network all_to_allv.
struct NetDispatch;
struct NetDispatchDeleter {
  void operator()(NetDispatch* n) const noexcept;
};
using NetDispatchPtr = std::unique_ptr<NetDispatch, NetDispatchDeleter>;

/// Collective and blocking: makes the communicator's device state, allocates the buffer on the
/// current GPU and loads the kernels. Throws std::system_error (errc::unsupported without CUDA,
/// errc::cuda_error on a CUDA failure, the communicator's error if it failed).
NetDispatchPtr make_net_dispatch(Communicator& comm, const kernels::moe::MoeShape& shape);
std::size_t net_dispatch_bytes(const NetDispatch& n) noexcept;
/// The buffer's device address (Received points into it).
char* net_dispatch_base(NetDispatch& n) noexcept;
/// Dispatch and combine across hosts: pack kernel, network all_to_allv, place kernel (and the
/// reverse); throw std::system_error when a launch fails.
void net_dispatch(NetDispatch& n, Communicator& comm, const void* x, int tokens,
                  const std::int32_t* topk_idx, cuda_stream stream);
void net_combine(NetDispatch& n, Communicator& comm, const void* y, const float* weights, void* out,
                 int tokens, cuda_stream stream);
/// The communicator's error if it failed (every time), else the error words, cleared.
std::error_code take_net_dispatch_errors(NetDispatch& n, Communicator& comm, std::string* what);

/// Host-memory dispatch result and what combine needs to send rows back.
struct HostSide {
  std::vector<char> x;
  std::vector<Row> rows;
  std::vector<std::int32_t> expert_counts, expert_offsets;
  /// counts[s * num_experts + e]: rows rank s sent to expert e in the last dispatch.
  std::vector<std::int64_t> counts;
  /// Own (token, slot) entries in the order they were sent to each destination rank.
  std::vector<std::vector<std::int32_t>> sent;
  /// Per own entry: destination rank and row there (-1 when no expert).
  std::vector<std::int32_t> dest, pos;
  int tokens = 0;
};

struct DispatchState {
  Communicator comm;
  DispatchConfig config;
  kernels::moe::MoeShape shape{};
  kernels::moe::MoeLayout layout{};
  DeviceArenaPtr arena;
  // Across hosts, in place of the arena.
  bool across_hosts = false;
  kernels::moe::NetMoeLayout net_layout{};
  NetDispatchPtr net;
  int device_tokens = 0;  // tokens of the last device dispatch
  HostSide host;
};

}  // namespace coccl::moe::detail
