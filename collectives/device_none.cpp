// Device-memory entry points of a build without CUDA: they fail with errc::unsupported.

#include "collectives/comm.hpp"
#include "runtime/handoff.hpp"
#include "runtime/log.hpp"

namespace coccl::detail {

std::error_code enqueue_device(const std::shared_ptr<CommImpl>& impl, const OpArgs&, cuda_stream) {
  COCCL_WARN(coll, impl ? impl->rank() : -1, "device collectives need a build with CUDA");
  return make_error_code(errc::unsupported);
}

std::error_code enqueue_device_a2av(const std::shared_ptr<CommImpl>& impl, const kernels::NetA2av&,
                                    cuda_stream) {
  COCCL_WARN(coll, impl ? impl->rank() : -1, "device collectives need a build with CUDA");
  return make_error_code(errc::unsupported);
}

std::error_code prepare_device(const std::shared_ptr<CommImpl>&) {
  return make_error_code(errc::unsupported);
}

void notify_when_done(const std::shared_ptr<CommImpl>& impl, cuda_stream, std::error_code failed,
                      OpHandler handler) {
  auto ex = impl ? impl->executor() : asio::system_executor();
  runtime::complete_later(ex, std::move(handler),
                          failed ? failed : make_error_code(errc::unsupported));
}

}  // namespace coccl::detail
