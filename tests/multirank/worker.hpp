// tests/multirank/worker.hpp: what the scenarios of coccl_worker share.
//
// A worker process is one rank. It runs one named scenario and exits 0 only if every check passed;
// each failed check prints one line "FAIL scenario=... coll=... type=... op=... count=... index=...
// got=... want=..." to stdout. Scenarios that expect an error exit with error_exit_code(ec).
#pragma once

#include <coccl/communicator.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/multirank/reference.hpp"

namespace coccl::test {

/// Exit codes of a worker.
inline constexpr int exit_ok = 0;
inline constexpr int exit_check_failed = 1;
inline constexpr int exit_exception = 2;
inline constexpr int exit_unexpected_success = 3;
/// A scenario that ends in a coccl error exits with 64 + the errc value.
inline constexpr int exit_coccl_error_base = 64;

struct Worker {
  std::string scenario;
  int rank = 0;
  int n = 0;
  std::vector<std::string> args;
  Communicator comm;
  int failures = 0;

  /// True if `flag` is among the extra arguments.
  bool has(const std::string& flag) const;

  /// Compares `count` elements of `t` bit for bit; prints up to a few mismatching elements.
  /// `what` names the collective and its arguments ("coll=all_reduce type=... op=... count=...").
  bool expect_equal(const std::string& what, DataType t, const void* got, const void* want,
                    std::size_t count);
  /// Records a failed check that is not about buffer contents.
  void fail(const std::string& what, const std::string& why);
};

/// "coll=<c> type=<t> op=<o> count=<n>" plus `extra`.
std::string describe(const char* coll, DataType t, ReduceOp op, std::size_t count,
                     const std::string& extra = {});

/// Correctness scenarios (correctness.cpp). Each returns normally; failures are counted in w.
void run_all_reduce(Worker& w);
void run_broadcast(Worker& w);
void run_reduce(Worker& w);
void run_all_gather(Worker& w);
void run_reduce_scatter(Worker& w);
void run_all_to_all(Worker& w);
// One all_to_all of `count` elements of `t` a peer, every block checked against the reference.
void check_all_to_all(Worker& w, DataType t, std::size_t count);
void run_all_to_allv(Worker& w);
void run_gather(Worker& w);
void run_scatter(Worker& w);
void run_send_recv(Worker& w);
void run_barrier(Worker& w);
/// Transfers between registered buffers (registered.cpp); flags reg=both|send|recv|none.
void run_registered(Worker& w);
/// Zero-copy puts from registered buffers over tcp on 2 ranks, counted per engine; failures are
/// counted in w.
int run_registered_uring(Worker& w);

/// Scenarios with communicators of their own or expected errors (lifecycle.cpp). Those that end
/// in an error return the process exit code; the others return exit_ok and count failures in w.
int run_loop(Worker& w);
int run_chaos(Worker& w);
int run_mismatch(Worker& w);
int run_op_mismatch(Worker& w);
int run_abort(Worker& w);
int run_cancel(Worker& w);
int run_split(Worker& w);
int run_split_members(Worker& w);
int run_async(Worker& w);

/// Links under COCCL_MEM_BUDGET and COCCL_LINK_IDLE_S (links.cpp); flags budget, idle or tiny.
int run_links(Worker& w);

/// The fast path of small operations (fast_path.cpp): "fast_path" (flag off: with it turned off)
/// and "fast_handover".
int run_fast_path(Worker& w);
int run_fast_handover(Worker& w);
int run_fast_mixed(Worker& w);
int run_fast_interleaved(Worker& w);

/// Blocking callers and late sends (blocking.cpp): "blocking_threads" (callers on several threads
/// at once; blocking calls from handlers refused) and "send_and_leave" (rank 0 sends to rank 1 and
/// destroys its communicator at once; rank 1 receives later).
int run_blocking_threads(Worker& w);
int run_send_and_leave(Worker& w);

/// Recovery scenarios (recovery.cpp): shrink after killed ranks, grow, the FTAR loop.
int run_shrink(Worker& w);
int run_shrink_mismatch(Worker& w);
int run_shrink_absent(Worker& w);
int run_shrink_excluded(Worker& w);
int run_grow(Worker& w);
int run_ftar(Worker& w);
/// The size of the first communicator (flag world=K); workers from K on are newcomers that join
/// later (grow), not at start.
int world_of(const Worker& w);

/// Prints the error of a failed collective and returns its exit code.
int report_error(Worker& w, const std::system_error& e, double seconds);

}  // namespace coccl::test
