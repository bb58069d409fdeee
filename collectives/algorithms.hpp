// Host-memory collective algorithms, written once against the connection model (put + notify).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <coccl/communicator.hpp>

namespace coccl::detail {

class CommImpl;

/// Runs one validated operation on the communicator's proxy thread. Fails the communicator and
/// throws LinkError on any error.
boost::asio::awaitable<void> run_op(CommImpl& comm, const OpArgs& args);

/// The all_reduce algorithm chosen for `bytes` on this communicator ("oneshot", "direct" or
/// "ring"); COCCL_ALGO overrides it.
const char* choose_all_reduce(CommImpl& comm, std::size_t bytes);

}  // namespace coccl::detail
