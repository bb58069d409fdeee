// The wire form of a CommStatus, as a rank answers coccl-status (transport::query_rank).
#pragma once

#include <coccl/status.hpp>
#include <cstdint>
#include <span>
#include <vector>

namespace coccl::detail {

std::vector<std::uint8_t> encode_status(const CommStatus& status);
/// Throws std::system_error(errc::bad_message) on a malformed answer; allocates no more than the
/// answer's own size.
CommStatus decode_status(std::span<const std::uint8_t> bytes);

}  // namespace coccl::detail
