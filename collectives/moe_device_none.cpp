// The device side of coccl::moe in a build without CUDA: making an arena fails with
// errc::unsupported, so no other function here is ever reached with an arena.
#include "collectives/moe_state.hpp"

namespace coccl::moe::detail {

struct DeviceArena {};

void DeviceArenaDeleter::operator()(DeviceArena* a) const noexcept { delete a; }

namespace {
[[noreturn]] void unsupported() {
  throw std::system_error(make_error_code(errc::unsupported),
                          "coccl::moe: device memory needs a build with CUDA");
}
}  // namespace

DeviceArenaPtr make_arena(Communicator&, std::size_t) { unsupported(); }
std::size_t arena_bytes(const DeviceArena&) noexcept { return 0; }
char* arena_base(DeviceArena&) noexcept { return nullptr; }
void launch_a2av(DeviceArena&, kernels::moe::A2av, cuda_stream) { unsupported(); }
void launch_dispatch(DeviceArena&, const kernels::moe::MoeShape&, const void*, int,
                     const std::int32_t*, cuda_stream) {
  unsupported();
}
void launch_combine(DeviceArena&, const kernels::moe::MoeShape&, const void*, const float*, void*,
                    int, cuda_stream) {
  unsupported();
}
std::error_code take_errors(DeviceArena&, std::string*) { return {}; }
bool spans_hosts(const Communicator&) { return false; }
void prepare_a2av_net(A2avState&) { unsupported(); }
void launch_a2av_net(A2avState&, const kernels::moe::A2av&, cuda_stream) { unsupported(); }
std::error_code take_net_errors(A2avState&, std::string*) { return {}; }

}  // namespace coccl::moe::detail
