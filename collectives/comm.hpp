// The communicator's state and its operation pipeline. Everything here runs on the
// communicator's proxy thread except submit(), last_error() and the immutable rank/size.
#pragma once

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>
#include <coccl/communicator.hpp>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "collectives/colltrace.hpp"
#include "collectives/fast_path.hpp"
#include "collectives/op_check.hpp"
#include "kernels/device.hpp"
#include "kernels/net.hpp"
#include "runtime/engine.hpp"
#include "transport/address_book.hpp"
#include "transport/peers.hpp"

namespace coccl::detail {

namespace asio = boost::asio;

/// Thrown inside algorithms once the communicator has failed; carries its error.
using transport::LinkError;

/// An operation (or a group of them) whose caller can cancel it or that has a deadline. Fields
/// are used on the proxy thread only, once initiate() has set them up.
struct OpControl {
  enum class State { queued, running, done };
  State state = State::queued;
  /// Members of a group not finished yet (1 for a single operation): done when it reaches 0.
  std::size_t pending = 1;
  /// Communicator::with_deadline: the operation fails the communicator with errc::timed_out if
  /// it is not done by `start + deadline`; `timer` waits for that on the proxy thread.
  std::chrono::milliseconds deadline{0};
  std::chrono::steady_clock::time_point start;
  std::unique_ptr<asio::steady_timer> timer;
  /// Cancellation arrived before the operation started (it may arrive before the operation
  /// reaches the queue).
  bool cancelled = false;
  /// async_create: stops the joining coroutine, emitted on `ex`.
  asio::cancellation_signal signal;
  asio::any_io_executor ex;
  /// Creation: why it failed (last_error() of the communicator that could not form), for the
  /// blocking create's exception. Written before the handler runs.
  std::string failure;
};

class CommImpl : public std::enable_shared_from_this<CommImpl> {
 public:
  /// `memory`: the communicator's root is on the in-memory network (memory_unique_id), and so
  /// are its listener and links; its streams are counted in `traffic` (the rank's, shared with
  /// the communicators split from it), or in a Traffic of its own when that is null. Made on a
  /// proxy thread of `engine` (a split's coroutine), the communicator lives on that thread and is
  /// built there at once; from any other thread it goes to the engine's next thread, which this
  /// constructor waits for.
  CommImpl(std::shared_ptr<runtime::Engine> engine, const transport::Secret& secret, int rank,
           int nranks, const CommunicatorOptions& options = {}, bool memory = false,
           std::shared_ptr<transport::Traffic> traffic = nullptr);
  ~CommImpl();

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  asio::any_io_executor executor() const { return ex_; }
  transport::Peers& peers() { return *peers_; }
  /// True on the in-memory network (memory_unique_id).
  bool on_memory() const noexcept { return memory_; }
  /// The engine whose proxy thread runs this communicator (a split's new one shares it).
  const std::shared_ptr<runtime::Engine>& engine() const noexcept { return engine_; }
  /// On the in-memory network (null elsewhere): what the bootstrap roots this rank started for
  /// communicators split from this one sent and received. The rank's own traffic is
  /// peers().traffic().
  const std::shared_ptr<transport::Traffic>& roots_traffic() const noexcept {
    return roots_traffic_;
  }
  /// A handle to this communicator.
  static Communicator handle(std::shared_ptr<CommImpl> impl) {
    return Communicator(std::move(impl));
  }
  /// Any thread: the buffers registered with register_buffer.
  std::shared_ptr<transport::UserBuffers> user_buffers() const { return peers_->user_buffers(); }

  /// Proxy thread: joins via the roots (one, or several: see Peers::rendezvous).
  asio::awaitable<void> rendezvous(std::vector<transport::RootAddress> roots);
  /// Proxy thread: forms without a root, from the frame a launcher's table gave this rank
  /// (transport/address_book.hpp; Peers::form).
  void form(const transport::DirectoryFrame& frame);

  /// Any thread: validates and queues an operation.
  void submit(OpArgs args, OpHandler handler);

  /// The fast path of small operations (fast_path.hpp).
  enum class FastResult {
    declined,     // nothing done: submit the operation as usual
    done,         // finished in the call
    handed_over,  // started; the proxy thread finishes it and completes the handler made for it
  };
  /// The handler (and the control wired to its cancellation slot, or null) of an operation the
  /// fast path hands over; made only then, at most once.
  struct Handover {
    OpHandler handler;
    std::shared_ptr<OpControl> control;
  };
  struct HandoverSource {
    Handover (*make)(void* context);
    void* context;
  };
  /// Any thread, cheap, no role needed: whether `args` may take the fast path at all (kind and
  /// size), so that a caller borrows the proxy thread's role only for such an operation.
  bool fast_candidate(const OpArgs& args) const noexcept;
  /// Holder of the proxy thread's role (runtime::ProxyThread::owned_here()): runs `args` on the
  /// fast path if the communicator is idle (nothing queued, running or on its way to the queue,
  /// healthy) and `args` is valid and eligible. `done`: `ec` is the result. `handed_over`: `args`
  /// was taken. `declined`: `args` is untouched.
  FastResult run_fast(OpArgs& args, std::error_code& ec, HandoverSource handover);
  /// COCCL_FAST_MAX_BYTES, and COCCL_SPIN_US (how long the fast path spins for its peers, and a
  /// caller for the proxy thread's role), as read at creation.
  std::size_t fast_max_bytes() const noexcept { return fast_max_; }
  std::chrono::nanoseconds fast_wait() const noexcept { return fast_wait_; }
  /// Any thread: validates every member of a group, then queues them back to back; `handler`
  /// runs once, after the last, with the first error. The members share `control` (or none).
  void submit_group(std::vector<OpArgs> ops, std::shared_ptr<OpControl> control, OpHandler handler);
  /// Options::blocking and Options::name, as given at creation.
  bool blocking() const noexcept { return blocking_; }
  const std::string& name() const noexcept { return name_; }
  /// Proxy thread: the caller cancelled `op`: removed if it has not started; a terminal
  /// cancellation of it in flight aborts the communicator.
  void cancel(const std::shared_ptr<OpControl>& op, asio::cancellation_type type);

  /// Proxy thread: fails the communicator (idempotent). `notify` tells connected peers.
  void fail(std::error_code ec, const std::string& why, bool notify = true);
  /// Proxy thread: throws LinkError with the communicator's error if it has failed.
  void check() const;

  /// Any thread. Both take in a failure the device kernels reported (set_device_status).
  std::string last_error();
  std::error_code error();

  /// Once the device workspace exists (any thread): the Status its kernels report into, and
  /// the name of the operation of a device sequence number. From then on a kernel that gave up a
  /// wait fails the communicator (seen by error() and last_error()), and a failure of the
  /// communicator raises the Status's abort flag so that its waiting kernels return.
  void set_device_status(device::Status* status,
                         std::function<const char*(std::uint64_t)> op_of_seq);

  /// Proxy thread: what this rank is doing (Communicator::status, coccl-status).
  CommStatus status();
  /// Any thread, once: where status() takes the device operations' trace from
  /// (collectives/device.cpp). It must not block on the proxy thread.
  void set_device_trace(std::function<std::vector<TraceEntry>()> trace);

  /// Any thread: stop now (errc::aborted). Returns once the proxy thread has shut it down.
  void abort();
  /// Any thread: wait for queued operations, then close without messages.
  void destroy();

  /// Proxy thread: the sequence number and fingerprint of the running operation.
  std::uint64_t seq() const noexcept { return seq_; }
  std::uint32_t fingerprint() const noexcept { return fingerprint_; }
  const char* op_name() const noexcept { return op_name_; }
  /// Proxy thread: the cross-rank checks of the running operation (op_check.hpp).
  OpChecks& checks() noexcept { return checks_; }

  /// The device side (collectives/device.cpp): state made on the first device operation, under
  /// device_mutex(); the poller of CUDA events, made and used on the proxy thread.
  std::mutex& device_mutex() noexcept { return device_mutex_; }
  std::shared_ptr<void>& device_state() noexcept { return device_state_; }
  std::unique_ptr<runtime::Poller>& event_poller() noexcept { return event_poller_; }
  /// The proxy of device operations across hosts (collectives/net_device.cpp); proxy thread.
  std::unique_ptr<runtime::Poller>& net_poller() noexcept { return net_poller_; }
  runtime::ProxyThread& thread() noexcept { return thread_; }

  /// Proxy thread: COCCL_ALGO as read at creation.
  const std::string& forced_algo() const noexcept { return algo_; }
  std::size_t oneshot_max() const noexcept { return oneshot_max_; }
  /// COCCL_DIRECT_MAX_RANKS as read at creation.
  int direct_max_ranks() const noexcept { return direct_max_ranks_; }
  /// True when every rank is on this host (known once the address table is).
  bool one_host() const noexcept { return one_host_; }
  /// True when more of its ranks share this host than this process has CPUs to run on (known
  /// once the address table is): a rank waiting for a peer then yields its core to it.
  bool crowded() const noexcept { return crowded_; }

 private:
  struct Queued {
    OpArgs args;
    OpHandler handler;
    // Started by the fast path, which holds its arguments (FastOp::args()): finished by it.
    bool fast = false;
  };
  // Proxy thread (role held): the running operation begins / has ended.
  void begin_op(const OpArgs& args,
                std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());
  void end_op(bool ok, std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now());
  asio::awaitable<void> drain();
  // The watchdog fails the communicator when a link has been blocked for longer than
  // COCCL_TIMEOUT. Links block only inside operations, so it ticks only while watched(): an
  // operation drains, or kernels run that may fail without one (the device workspace exists).
  // Proxy thread.
  void arm_watchdog();
  bool watched() const noexcept;
  // The watchdog found no progress from `peer` (blocked since `since`): asks the peer what it
  // waits for (a peer held up by another rank, one that died before linking to it, names that
  // rank) and fails the communicator with `what` and the answer, unless the peer moved meanwhile.
  // Proxy thread.
  void blame(int peer, std::chrono::steady_clock::time_point since, std::string what);
  // Any thread: records the communicator's first failure; its text, or nothing if it had
  // failed already.
  std::optional<std::string> record_failure(std::error_code ec, const std::string& why);
  // Proxy thread: what follows recording a failure (log, peers told, kernels aborted).
  void after_failure(std::error_code ec, const std::string& text, bool notify);
  // Any thread: records a failure the device kernels reported, if any.
  void take_device_failure();
  void complete(OpHandler& h, std::error_code ec);
  // Proxy thread: queues an operation that passed validation and starts the drain.
  void enqueue(OpArgs args, OpHandler handler);
  // Proxy thread: an operation (or group member) of `op` has ended.
  void finished(OpControl& op);
  // Proxy thread: starts the deadline timer of `op` (once).
  void arm_deadline(const std::shared_ptr<OpControl>& op);

  std::shared_ptr<runtime::Engine> engine_;
  runtime::ProxyThread& thread_;
  bool memory_;
  std::shared_ptr<transport::Traffic> roots_traffic_;
  asio::any_io_executor ex_;
  int rank_;
  int size_;
  std::unique_ptr<transport::Peers> peers_;
  // A list: taking a cancelled operation out from between others must not move them, because
  // Boost 1.81's any_completion_handler recurses without end in its move assignment.
  std::list<Queued> queue_;
  bool draining_ = false;
  // Operations submitted from other threads and posted here, not queued yet: the fast path must
  // not overtake them.
  std::atomic<int> in_transit_{0};
  std::function<void()> after_drain_;  // destroy()'s close, once the queue has drained
  bool closed_ = false;                // destroyed or aborted: no new operations
  std::uint64_t seq_ = 0;
  std::uint64_t finished_ = 0;  // seq_ of the last operation that ended
  std::uint32_t fingerprint_ = 0;
  // The fields fingerprint_of() reads, as of the operation fingerprint_ was computed for: a run
  // of alike operations (a loop of small ones) reuses it (the hash was 4% of a small one).
  struct FingerprintKey {
    OpKind kind{};
    DataType type{};
    ReduceOp op{};
    int root = 0;
    std::size_t count = 0;
    bool operator==(const FingerprintKey&) const = default;
  };
  std::optional<FingerprintKey> fingerprint_key_;
  const char* op_name_ = "";
  OpChecks checks_;
  asio::steady_timer watchdog_;
  bool watchdog_armed_ = false;  // a tick is pending
  CollTrace trace_;
  std::string algo_;
  std::size_t oneshot_max_;
  int direct_max_ranks_;
  FastOp fast_{*this};
  std::size_t fast_max_;
  std::chrono::nanoseconds fast_wait_;
  std::uint64_t fast_done_ = 0;    // operations the fast path finished in their call
  std::uint64_t fast_handed_ = 0;  // operations it started and handed to the proxy thread
  bool one_host_ = false;
  bool crowded_ = false;
  void learn_topology();
  // Answers status queries once formed (both ways of forming).
  void serve_status();
  std::chrono::steady_clock::duration timeout_;
  bool blocking_ = true;
  std::string name_;

  std::mutex device_mutex_;
  std::shared_ptr<void> device_state_;
  std::atomic<device::Status*> device_status_{nullptr};
  std::function<const char*(std::uint64_t)> op_of_seq_;  // set before device_status_
  std::mutex device_trace_mutex_;  // not device_mutex_: that is held while peers are awaited
  std::function<std::vector<TraceEntry>()> device_trace_;
  std::unique_ptr<runtime::Poller> event_poller_;
  std::unique_ptr<runtime::Poller> net_poller_;

  mutable std::mutex error_mutex_;  // error_/error_text_ are read from user threads
  std::error_code error_;
  std::string error_text_;
  // Set once error_ is: error() answers a healthy communicator (every fast-path call asks) without
  // the lock.
  std::atomic<bool> failed_{false};
};

/// coccl::moe::AllToAllv across hosts: the all_to_allv kernel with counts in device memory
/// (kernels/net.hpp) on `stream`, in the communicator's order of device operations.
/// errc::unsupported when every rank is on one host (the moe arena serves that case) or for
/// more ranks than kernels::net_max_segs.
std::error_code enqueue_device_a2av(const std::shared_ptr<CommImpl>& impl,
                                    const kernels::NetA2av& args, cuda_stream stream);

/// Makes the communicator's device state now, as its first device operation would (collective,
/// blocking): for objects that must be ready before a graph is captured.
std::error_code prepare_device(const std::shared_ptr<CommImpl>& impl);

/// Communicator::create from one id, or from several (ncclCommInitRankScalable: the hellos are
/// spread over their roots; every rank passes the same ids in the same order); throws as create.
Communicator create_blocking(std::vector<UniqueId> ids, int rank, int nranks,
                             const CommunicatorOptions& options = {});

/// The engine of the process's communicators and roots; it lives until the process exits.
runtime::Engine& process_engine();

/// A new UniqueId whose root listens on `engine`'s first proxy thread.
UniqueId unique_id_on(runtime::Engine& engine);

/// A new UniqueId whose root is on the in-memory network of this process (transport/memory.hpp),
/// on the process engine's first proxy thread. Communicators created from it
/// (Communicator::create, async_create) run the real rendezvous, link handshake and algorithms
/// over memory streams instead of sockets: many ranks in one process (coccl-sim, tests). The id
/// means nothing to another process. What the root sends and receives is counted in
/// `root_traffic` (may be null).
UniqueId memory_unique_id(std::shared_ptr<transport::Traffic> root_traffic = nullptr);

/// initiate_create, the new communicator's streams on the in-memory network counted in `traffic`
/// (a split passes its parent's, so that one rank's communicators count together; null: a
/// Traffic of its own).
void start_create(std::vector<UniqueId> ids, int rank, int nranks,
                  const CommunicatorOptions& options, CreateHandler handler,
                  std::shared_ptr<std::string> failure,
                  std::shared_ptr<transport::Traffic> traffic);

/// Joins the communicator `id` as `rank` of `nranks`, its proxy on a thread of `engine`
/// (blocking; not on that engine's threads). Null, with `ec` set, on failure.
std::shared_ptr<CommImpl> join_on(const std::shared_ptr<runtime::Engine>& engine,
                                  const UniqueId& id, int rank, int nranks, std::error_code& ec);

/// Forms `rank` of `nranks` from a launcher's table (transport/address_book.hpp), without a
/// root, its links authenticated with `secret`: the book's calls block on this thread (not a
/// proxy thread). `memory`: it listens and links on the in-memory network, its streams counted in
/// `traffic` (as start_create). Throws std::system_error with the book's error or the frame's.
Communicator create_from_book(transport::AddressBook& book, const transport::Secret& secret,
                              int rank, int nranks, bool memory = false,
                              std::shared_ptr<transport::Traffic> traffic = nullptr);

/// Checks an operation's arguments against the communicator; returns an empty string when they
/// are valid, else the reason.
std::string validate(const OpArgs& a, int rank, int nranks);

/// The calling thread's text of its latest operation refused with errc::invalid_argument
/// (submit() and enqueue_device() set it, on the thread that called them).
std::string& argument_error() noexcept;

/// Fingerprint of an operation (kind, type, op, count, root) that every rank must agree on; its
/// data chunks carry it. The full check is the header exchange of op_check.hpp.
std::uint32_t fingerprint_of(const OpArgs& a);

/// Name of an operation kind ("all_reduce", ...).
const char* name_of(OpKind k) noexcept;

}  // namespace coccl::detail
