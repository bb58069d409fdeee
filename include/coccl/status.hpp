// What a communicator is doing: its recent operations (CollTrace) and, for the operation that is
// running, the peer it waits for. Communicator::status() gives it for the calling rank;
// coccl::query_job (and tools/coccl-status, built on it) asks every rank of a running job over the
// network, so that a hung job names the stuck rank and operation.
#pragma once

#include <chrono>
#include <coccl/unique_id.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace coccl {

/// One operation in a communicator's trace.
struct TraceEntry {
  enum class State : std::uint8_t {
    /// Device operations only: launched on its stream, the work before it not finished yet.
    enqueued,
    /// Host: running on the proxy thread. Device: the coccl operation before it on the same
    /// stream has finished (the kernel may be waiting for peers).
    started,
    done,
    failed,
    /// Device operations recorded into a CUDA graph: they run when the graph is launched.
    captured,
  };
  /// Host operations: the communicator's sequence number (1, 2, ...; the same on every rank for
  /// the same operation). Device operations: the device sequence number (numbered separately,
  /// also the same on every rank).
  std::uint64_t seq = 0;
  /// Launched on a GPU stream (device memory) rather than run by the proxy on host memory.
  bool device = false;
  /// "all_reduce", "send_recv", ...
  std::string op;
  /// Elements (0 for send/recv groups and all_to_allv, whose sizes are per transfer).
  std::uint64_t count = 0;
  /// The DataType value and root as passed.
  int type = 0;
  int root = 0;
  State state = State::enqueued;
  /// Host operations: microseconds it has been running (started) or ran (done, failed). Device
  /// operations: microseconds since it was launched.
  std::uint64_t us = 0;
};

/// Lower-case name of a state ("started").
const char* to_string(TraceEntry::State state) noexcept;

/// One rank's view of its communicator.
struct CommStatus {
  int rank = -1;
  int nranks = 0;
  /// Process id of the rank.
  int pid = 0;
  /// Options::name of the communicator (empty when none was given).
  std::string name;
  /// last_error(): empty while the communicator is healthy.
  std::string error;
  /// Sequence numbers of the last host operation started and of the last one finished (done or
  /// failed); started > finished while one runs.
  std::uint64_t started = 0;
  std::uint64_t finished = 0;
  /// The running host operation ("" when none) and how long it has been running.
  std::string running_op;
  std::uint64_t running_us = 0;
  /// The peer whose data (or buffer credit) the running operation has waited for longest, and for
  /// how long; -1 when it waits for nobody.
  int waiting_for = -1;
  std::uint64_t waiting_us = 0;
  /// Host operations queued behind the running one.
  std::uint64_t queued = 0;
  /// Host operations that took the fast path of small operations (COCCL_FAST_MAX_BYTES): finished
  /// in the call that started them, on the calling thread; and those it started but handed to
  /// the proxy thread to finish, because a peer was late (counted in neither form otherwise).
  std::uint64_t fast_ops = 0;
  std::uint64_t fast_handed_over = 0;
  /// Links to peers: open now; made so far (reopenings included); closed to stay under
  /// COCCL_MEM_BUDGET, and closed after COCCL_LINK_IDLE_S unused (both ends count an agreed
  /// close); the bytes of the open links' receive rings, and the budget they stay under (0: none).
  int links_open = 0;
  std::uint64_t links_opened = 0;
  std::uint64_t links_closed_budget = 0;
  std::uint64_t links_closed_idle = 0;
  std::uint64_t ring_bytes = 0;
  std::uint64_t mem_budget = 0;
  /// Recent operations, oldest first: host operations, then device ones (COCCL_COLLTRACE_SIZE of
  /// each at most).
  std::vector<TraceEntry> trace;

  /// The status as one JSON object.
  std::string json() const;
};

/// Every rank's status, as query_job found it.
struct JobStatus {
  int nranks = 0;
  /// Ranks whose hello the bootstrap root has: all of them once the communicator has formed.
  int arrived = 0;
  /// Per rank: its status, or nothing when it did not answer in time (stopped, hung in a system
  /// call, dead, or not yet arrived).
  std::vector<std::optional<CommStatus>> ranks;
  /// Per rank without an answer: why ("no answer within 1.0 s", "connection refused", ...).
  std::vector<std::string> why;

  /// A one-line judgement naming the stuck rank(s) and operation: ranks that did not answer,
  /// else ranks the others wait for, else the rank that is behind, else "all ranks idle at #N"
  /// or "every rank failed: ...".
  std::string verdict() const;
};

/// Asks the running communicator `id` what each rank is doing: the address table from the id's
/// bootstrap root, then each rank's listener, all within `wait`. The root serves these queries
/// while the communicator's rank 0 holds its connection to it (until rank 0 destroys or aborts
/// the communicator, or dies). Any thread; blocking. Throws std::system_error: errc::timed_out
/// when the root does not answer within `wait`, errc::bad_message when it does not know the id's
/// secret.
JobStatus query_job(const UniqueId& id, std::chrono::milliseconds wait);

}  // namespace coccl
