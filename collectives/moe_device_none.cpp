// The device side of coccl::moe in a build without CUDA: making an arena or a dispatcher's
// buffer fails with errc::unsupported, so no other function here is ever reached with one.
#include "collectives/moe_state.hpp"

namespace coccl::moe::detail {

struct DeviceArena {};
struct NetDispatch {};

void DeviceArenaDeleter::operator()(DeviceArena* a) const noexcept { delete a; }
void NetDispatchDeleter::operator()(NetDispatch* n) const noexcept { delete n; }

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
NetDispatchPtr make_net_dispatch(Communicator&, const kernels::moe::MoeShape&) { unsupported(); }
std::size_t net_dispatch_bytes(const NetDispatch&) noexcept { return 0; }
char* net_dispatch_base(NetDispatch&) noexcept { return nullptr; }
void net_dispatch(NetDispatch&, Communicator&, const void*, int, const std::int32_t*, cuda_stream) {
  unsupported();
}
void net_combine(NetDispatch&, Communicator&, const void*, const float*, void*, int, cuda_stream) {
  unsupported();
}
std::error_code take_net_dispatch_errors(NetDispatch&, Communicator&, std::string*) { return {}; }

}  // namespace coccl::moe::detail
