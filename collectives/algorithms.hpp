// Host-memory collective algorithms, written once against the connection model (put + notify).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <coccl/communicator.hpp>

namespace coccl::detail {

class CommImpl;

/// Runs one validated operation on the communicator's proxy thread. Fails the communicator and
/// throws LinkError on any error.
boost::asio::awaitable<void> run_op(CommImpl& comm, const OpArgs& args);

/// The all_reduce algorithm chosen for `bytes` on this communicator ("oneshot", "direct", "ring"
/// or "rd"): with at most COCCL_DIRECT_MAX_RANKS ranks, one-shot for small sizes and direct (one
/// host) or ring for large ones; with more, recursive doubling for small sizes and ring for large.
/// COCCL_ALGO overrides it.
const char* choose_all_reduce(CommImpl& comm, std::size_t bytes);

/// Whether all_reduce's recursive doubling pairs ranks in Gray-code order (algo::rd_partner):
/// with at most COCCL_DIRECT_MAX_RANKS ranks. Many ranks pair r with r XOR 2^k, whose addresses a
/// large communicator's directory keeps.
bool rd_in_gray_order(CommImpl& comm);

/// all_gather ("direct", "ring" or "bruck") and reduce_scatter ("direct", "ring" or "rd") for
/// `total_bytes` (all ranks' blocks): direct with at most COCCL_DIRECT_MAX_RANKS ranks, else
/// Bruck or recursive doubling for small totals and ring for large ones.
const char* choose_all_gather(CommImpl& comm, std::size_t total_bytes);
const char* choose_reduce_scatter(CommImpl& comm, std::size_t total_bytes);

/// all_to_all ("direct" or "bruck") for `total_bytes` (all ranks' blocks of one rank): direct
/// with at most COCCL_DIRECT_MAX_RANKS ranks or a large total, else Bruck (O(log n) peers and
/// rounds). COCCL_ALGO overrides it.
const char* choose_all_to_all(CommImpl& comm, std::size_t total_bytes);

/// broadcast and reduce: "chain" with at most COCCL_DIRECT_MAX_RANKS ranks, else "tree".
const char* choose_rooted(CommImpl& comm);

}  // namespace coccl::detail
