#include <algorithm>
#include <chrono>
#include <coccl/error.hpp>

#include "runtime/deadline.hpp"

namespace coccl::params {

config::Param<double> timeout_s{
    "COCCL_TIMEOUT", 300.0,
    "seconds a communicator waits for a peer to make progress (or for bootstrap) before failing "
    "with timed_out"};

}  // namespace coccl::params

namespace coccl {
namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "coccl"; }
  std::string message(int c) const override {
    switch (static_cast<errc>(c)) {
      case errc::invalid_argument:
        return "invalid argument";
      case errc::aborted:
        return "communicator aborted or destroyed";
      case errc::peer_lost:
        return "peer rank lost";
      case errc::timed_out:
        return "timed out waiting for a peer";
      case errc::mismatch:
        return "ranks called mismatched collectives";
      case errc::bad_message:
        return "malformed or unauthenticated message";
      case errc::unsupported:
        return "not supported";
      case errc::internal:
        return "internal error";
      case errc::remote_error:
        return "a remote rank failed";
      case errc::cuda_error:
        return "CUDA error";
    }
    return "unknown coccl error";
  }
};

}  // namespace

const std::error_category& error_category() noexcept {
  static const Category c;
  return c;
}

namespace runtime {
std::chrono::steady_clock::duration seconds_to_duration(double s) noexcept {
  constexpr double max_seconds = 1e9;
  if (!(s > 0)) return std::chrono::steady_clock::duration::zero();
  // Converting a double beyond the range of the count is undefined behaviour.
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::min(s, max_seconds)));
}

std::chrono::steady_clock::duration default_timeout() {
  return seconds_to_duration(params::timeout_s.get());
}
}  // namespace runtime

}  // namespace coccl
