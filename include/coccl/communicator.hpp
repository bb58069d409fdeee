// coccl/communicator.hpp: the communicator and its collective operations.
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/append.hpp>
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/recycling_allocator.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <coccl/error.hpp>
#include <coccl/status.hpp>
#include <coccl/types.hpp>
#include <coccl/unique_id.hpp>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

struct CUstream_st;

namespace coccl {

/// A CUDA stream (the same type as cudaStream_t; nullptr is the legacy default stream).
using cuda_stream = CUstream_st*;

class Communicator;
class Group;

/// One transfer of a group of sends and receives (Communicator::send_recv): `count` elements of
/// `type` to rank `peer` (a send: `buffer` is only read) or from it (a receive). Make one with
/// Transfer::send or Transfer::recv.
struct Transfer {
  bool is_send = false;
  void* buffer = nullptr;
  std::size_t count = 0;
  DataType type = DataType::float32;
  int peer = 0;

  /// A send of `count` elements of `buf` to `peer`.
  static Transfer send(const void* buf, std::size_t count, DataType type, int peer) {
    return {true, const_cast<void*>(buf), count, type, peer};
  }
  /// A receive of `count` elements from `peer` into `buf`.
  static Transfer recv(void* buf, std::size_t count, DataType type, int peer) {
    return {false, buf, count, type, peer};
  }
};

/// Settings of one communicator, in the spirit of ncclConfig_t. A field left at its default takes
/// the environment's setting, so `Options{}` behaves as the environment says.
struct CommunicatorOptions {
  /// When false, the blocking forms of operations (`x(...)`, with or without `error_code&`) never
  /// block: they fail at once with std::errc::operation_would_block, nothing sent, and the caller
  /// uses the `async_x` forms. Creation itself is not affected (create() blocks, async_create()
  /// does not).
  bool blocking = true;
  /// How long a rank waits for a peer, in creation and in every operation, before the
  /// communicator fails with errc::timed_out; zero takes COCCL_TIMEOUT.
  std::chrono::milliseconds timeout{0};
  /// The transport between ranks: "auto", "tcp", "shm" or "ib"; empty takes COCCL_TRANSPORT.
  std::string transport;
  /// A name for the communicator, shown in status() (CommStatus::name) and in log lines; empty
  /// for none.
  std::string name;
};

namespace detail {

class CommImpl;

enum class OpKind : int {
  all_reduce,
  broadcast,
  reduce,
  all_gather,
  reduce_scatter,
  all_to_all,
  all_to_allv,
  gather,
  scatter,
  p2p,
  barrier,
};

/// The proxy's record of one operation whose caller can cancel it (defined by the library).
struct OpControl;

/// The arguments of one operation, as submitted.
struct OpArgs {
  OpKind kind;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  DataType type = DataType::float32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
  std::vector<Transfer> p2p;
  /// Per-operation deadline from submission (Communicator::with_deadline); zero for none.
  std::chrono::milliseconds deadline{0};
  /// Set by the library when the caller can cancel the operation or it has a deadline.
  std::shared_ptr<OpControl> control;
};

using OpHandler = boost::asio::any_completion_handler<void(boost::system::error_code)>;
using CreateHandler =
    boost::asio::any_completion_handler<void(boost::system::error_code, Communicator)>;

/// The one initiation point of queued host operations: validates nothing here, wires `handler`'s
/// cancellation slot (if connected) and the deadline to the operation, and queues it (a single
/// operation, or a group whose members are queued together and complete `handler` once, with the
/// first error).
void initiate(const std::shared_ptr<CommImpl>& impl, OpArgs args, OpHandler handler);
void initiate_group(const std::shared_ptr<CommImpl>& impl, std::vector<OpArgs> ops,
                    std::chrono::milliseconds deadline, OpHandler handler);
/// The blocking forms: waits for the operation (or group) on the calling thread.
void run_blocking(const std::shared_ptr<CommImpl>& impl, OpArgs&& args, std::error_code& ec);
void run_blocking_group(const std::shared_ptr<CommImpl>& impl, std::vector<OpArgs> ops,
                        std::chrono::milliseconds deadline, std::error_code& ec);
/// Throws the error of a failed blocking operation, with the communicator's description.
[[noreturn]] void throw_op_error(const std::shared_ptr<CommImpl>& impl, std::error_code ec);

/// A caller's completion handler as an operation keeps it: the operation holds outstanding work
/// on the handler's associated executor until the handler has run (so `io.run()` does not return
/// before), and the handler's cancellation slot (passed on, so initiate() can wire it) is
/// cleared, on the handler's own executor, before the handler runs.
template <typename Handler>
class Tracked {
 public:
  using executor_type = boost::asio::associated_executor_t<Handler>;
  // A handler without an allocator of its own gets Asio's recycling one, as
  // any_completion_handler would give it: the operation's state is then recycled per thread
  // instead of taken from the heap each time.
  using allocator_type =
      boost::asio::associated_allocator_t<Handler, boost::asio::recycling_allocator<void>>;
  using cancellation_slot_type = boost::asio::associated_cancellation_slot_t<Handler>;

  explicit Tracked(Handler h)
      : work_(boost::asio::prefer(boost::asio::get_associated_executor(h),
                                  boost::asio::execution::outstanding_work.tracked)),
        handler_(std::move(h)) {}

  executor_type get_executor() const noexcept {
    return boost::asio::get_associated_executor(handler_);
  }
  allocator_type get_allocator() const noexcept {
    return boost::asio::get_associated_allocator(handler_,
                                                 boost::asio::recycling_allocator<void>());
  }
  cancellation_slot_type get_cancellation_slot() const noexcept {
    return boost::asio::get_associated_cancellation_slot(handler_);
  }

  template <typename... Args>
  void operator()(Args&&... args) {
    auto slot = boost::asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.clear();
    // Released once the handler has returned.
    [[maybe_unused]] auto work = std::move(work_);
    std::move(handler_)(std::forward<Args>(args)...);
  }

 private:
  std::decay_t<decltype(boost::asio::prefer(std::declval<executor_type>(),
                                            boost::asio::execution::outstanding_work.tracked))>
      work_;
  Handler handler_;
};

/// What the fast path of small host operations (collectives/fast_path.hpp) did with an operation.
enum class FastOutcome {
  declined,     // nothing: initiate() it
  done,         // finished in the call, `ec` its result: complete its handler later
  handed_over,  // started; the handler the HandlerSource made completes when it is done
};
/// Makes the operation's handler, only when the fast path hands the operation over.
struct HandlerSource {
  OpHandler (*make)(void* context);
  void* context;
};
/// Runs `args` on the fast path if it can, on the calling thread, before the handler is made.
FastOutcome try_fast(const std::shared_ptr<CommImpl>& impl, OpArgs& args, std::error_code& ec,
                     HandlerSource source);
/// True in `impl`'s loop (its proxy thread, or a thread running its rounds) when `ex` is the
/// communicator's executor: the loop itself may run the handler (complete_on_loop).
bool on_loop(const std::shared_ptr<CommImpl>& impl, const boost::asio::any_io_executor& ex);
/// Runs `handler` with `ec` in `impl`'s loop once the calling handler has returned, without a
/// visit to the io_context's reactor (ProxyThread::complete_soon); call where on_loop() holds.
void complete_on_loop(const std::shared_ptr<CommImpl>& impl, OpHandler handler, std::error_code ec);
/// True where a handler bound to `ex` may simply be posted to it from this thread: inside the
/// run of the io_context that `ex` belongs to (the context outlives the post, and no other thread
/// need be woken).
bool completes_here(const boost::asio::any_io_executor& ex);
/// completes_here() for an executor of another type: one that can tell it runs on this thread.
template <typename Executor>
bool completes_here(const Executor& ex) {
  if constexpr (requires { ex.running_in_this_thread(); })
    return ex.running_in_this_thread();
  else
    return false;
}
/// Completes, later and from the proxy thread, the handler of an operation the fast path finished
/// inside its initiating call (one whose executor does not run on this thread); wakes the loop
/// for it.
void complete_done(const std::shared_ptr<CommImpl>& impl, OpHandler handler, std::error_code ec);

/// Starts a host operation for an async form: the fast path first, with the handler kept as it is
/// (no type erasure, no allocation) while it may finish there; else queued through initiate().
template <typename Handler>
void start(const std::shared_ptr<CommImpl>& impl, OpArgs args, Handler handler) {
  std::error_code ec;
  const HandlerSource source{
      [](void* h) { return OpHandler(Tracked<Handler>(std::move(*static_cast<Handler*>(h)))); },
      &handler};
  switch (try_fast(impl, args, ec, source)) {
    case FastOutcome::done: {
      // Never inside the initiating call. A coroutine on the communicator's executor is resumed
      // by the loop right after; a handler whose executor runs on this thread (a coroutine
      // awaiting on its own event loop) gets its completion posted straight there: no other
      // thread takes part. A handler without an executor of its own is completed from the proxy
      // thread, as one of an operation queued there.
      using Executor = boost::asio::associated_executor_t<Handler>;
      if constexpr (std::is_same_v<Executor, boost::asio::any_io_executor>) {
        if (on_loop(impl, boost::asio::get_associated_executor(handler))) {
          complete_on_loop(impl, OpHandler(std::move(handler)), ec);
          return;
        }
      }
      if constexpr (!std::is_same_v<Executor, boost::asio::system_executor>) {
        const Executor ex = boost::asio::get_associated_executor(handler);
        if (completes_here(ex)) {
          boost::asio::post(ex,
                            boost::asio::append(std::move(handler), boost::system::error_code(ec)));
          return;
        }
      }
      complete_done(impl, OpHandler(Tracked<Handler>(std::move(handler))), ec);
      return;
    }
    case FastOutcome::handed_over:
      return;
    case FastOutcome::declined:
      break;
  }
  initiate(impl, std::move(args), OpHandler(Tracked<Handler>(std::move(handler))));
}

/// Enqueues a device operation on `stream` from the calling thread; returns the error (nothing
/// enqueued) or success.
std::error_code enqueue_device(const std::shared_ptr<CommImpl>& impl, const OpArgs& args,
                               cuda_stream stream);
/// Completes `handler` with `failed` if set, else once the work enqueued on `stream` so far has
/// finished (the proxy thread polls a CUDA event; no host callback).
void notify_when_done(const std::shared_ptr<CommImpl>& impl, cuda_stream stream,
                      std::error_code failed, OpHandler handler);
/// Joins the communicator of `ids` (every rank passing the same list; with several, as
/// ncclCommInitRankScalable, the hellos are spread over their roots); `handler`'s cancellation
/// slot (if connected) stops the joining on terminal cancellation, and `options.timeout` bounds
/// it. `failure`, when set, receives the reason of a failure before the handler runs.
void initiate_create(std::vector<UniqueId> ids, int rank, int nranks,
                     const CommunicatorOptions& options, CreateHandler handler,
                     std::shared_ptr<std::string> failure = nullptr);
/// Split (collectives/split.cpp): a coroutine on `impl`'s proxy thread runs the parent's
/// operations that spread the new communicator's id, then joins it; `handler` gets it (an empty
/// handle for a negative color). Terminal cancellation through `handler`'s slot reaches the step
/// in flight. `failure`, when set, receives the reason of a failure before the handler runs.
void initiate_split(const std::shared_ptr<CommImpl>& impl, int color, int key,
                    const CommunicatorOptions& options, CreateHandler handler,
                    std::shared_ptr<std::string> failure = nullptr);
void initiate_split_members(const std::shared_ptr<CommImpl>& impl, std::vector<int> members,
                            CreateHandler handler, std::shared_ptr<std::string> failure = nullptr);
/// Shrink (collectives/recovery.cpp): the survivors of `impl` not in `exclude` meet, then join
/// the new communicator; `handler` gets it. Errors are logged with their reason.
void submit_shrink(const std::shared_ptr<CommImpl>& impl, std::vector<int> exclude,
                   CreateHandler handler);
/// The text of `ec` from an operation this thread just started on `impl`: for
/// errc::invalid_argument the reason the arguments were refused, else the communicator's
/// last_error().
std::string describe_error(const std::shared_ptr<CommImpl>& impl, std::error_code ec);
/// The library's own view of a communicator (null for an empty one); for coccl's other parts.
std::shared_ptr<CommImpl> impl_of(const Communicator& comm);

}  // namespace detail

/// A host buffer registered with a communicator (see Communicator::register_buffer). Move-only;
/// the registration ends when it is destroyed or reset(). Keep it while operations use the
/// buffer, and end it before the buffer is freed.
class BufferRegistration {
 public:
  BufferRegistration() = default;
  BufferRegistration(BufferRegistration&&) noexcept = default;
  BufferRegistration& operator=(BufferRegistration&&) noexcept = default;
  BufferRegistration(const BufferRegistration&) = delete;
  BufferRegistration& operator=(const BufferRegistration&) = delete;
  ~BufferRegistration() = default;

  /// True while registered.
  explicit operator bool() const noexcept { return guard_ != nullptr; }
  void* data() const noexcept { return guard_ ? data_ : nullptr; }
  std::size_t size() const noexcept { return guard_ ? size_ : 0; }
  /// Ends the registration now (nothing if already ended).
  void reset() noexcept { guard_.reset(); }

 private:
  friend class Communicator;
  BufferRegistration(std::shared_ptr<void> guard, void* data, std::size_t size)
      : guard_(std::move(guard)), data_(data), size_(size) {}
  std::shared_ptr<void> guard_;  // its deleter deregisters
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A group of ranks that run collectives together.
///
/// A Communicator is a cheap handle (copies share one communicator). Its state lives on one proxy
/// thread of the process engine; every operation may be started from any thread. Operations of one
/// communicator run one after another in the order they were started, and every rank must start
/// the same collectives in the same order (a mismatch is detected and fails with errc::mismatch).
///
/// Small operations take a fast path: an all_reduce, all_gather, reduce_scatter or all_to_all whose
/// message to each peer is at most COCCL_FAST_MAX_BYTES, started while the communicator is idle
/// and its peers are on one host (shm), runs to completion inside the call that starts it, on the
/// calling thread (which borrows the proxy thread's role while the proxy thread is idle), spinning
/// at most COCCL_SPIN_US for its peers before the proxy thread takes the rest over.
/// Everything above holds on either path; CommStatus::fast_ops counts the operations it finished.
///
/// Each operation has three forms:
///  - `async_x(..., token)`: an Asio asynchronous operation with completion signature
///    `void(boost::system::error_code)`, as Asio's own operations have. It never completes inside
///    the initiating call (on the fast path its data may already have moved when that call returns;
///    the handler still runs later), and it holds outstanding work on the handler's associated
///    executor until the handler has run (so `io.run()` returns only after it). With
///    `asio::use_awaitable`, `co_await` throws boost::system::system_error on failure;
///    `asio::as_tuple(asio::use_awaitable)` and `asio::redirect_error` give the code instead. The
///    buffers must stay valid until completion. The handler's cancellation slot is honoured: an
///    operation that has not started yet is removed and completes with
///    std::errc::operation_canceled (any cancellation type); terminal cancellation of an operation
///    in flight aborts the communicator (every rank's operation fails, errc::aborted here and
///    errc::remote_error on the peers, naming this rank); partial and total cancellation of an
///    operation in flight are ignored, as its data may already be partly delivered.
///    Communicator::async_create honours terminal cancellation too.
///  - `x(...)`: blocks the calling thread; throws std::system_error on failure (the blocking
///    forms keep the standard exception, with the communicator's description as its what()).
///  - `x(..., boost::system::error_code& ec)`: blocks the calling thread and reports the error in
///    `ec`.
///  Called on a proxy thread (from a coroutine on get_executor()) a blocking form would wait for
///  the loop it blocks: it fails at once with std::errc::resource_deadlock_would_occur instead.
///
/// Error codes: coccl's codes (coccl::errc, category "coccl") travel inside
/// boost::system::error_code through Boost.System's interoperation with <system_error>, so
/// `ec == coccl::errc::peer_lost` and `ec.message()` work on either type, and a
/// boost::system::error_code converts to a std::error_code of coccl's own category without loss.
///
/// Failures are terminal: after a peer is lost, times out (COCCL_TIMEOUT) or a mismatch is found,
/// the operation in flight and every later one fail with the same error, and last_error() names
/// the rank and operation. Host-memory buffers only in this header; counts are in elements.
class Communicator {
 public:
  /// Settings of a communicator (see CommunicatorOptions); the environment by default.
  using Options = CommunicatorOptions;

  /// An empty handle (no communicator).
  Communicator() = default;

  /// Joins communicator `id` as `rank` of `nranks`; blocks until every rank has joined (or the
  /// timeout of `options`, by default COCCL_TIMEOUT, passes). Throws std::system_error on
  /// failure (errc::timed_out when a rank did not join in time).
  static Communicator create(const UniqueId& id, int rank, int nranks, const Options& options = {});

  /// Asynchronous create; completion signature `void(boost::system::error_code, Communicator)`.
  /// Started on a proxy thread (from a coroutine on a communicator's executor), the new
  /// communicator lives on that same thread; from any other thread it goes to the engine's next
  /// one (round robin).
  template <typename Token>
  static auto async_create(const UniqueId& id, int rank, int nranks, Token&& token) {
    return async_create(id, rank, nranks, Options{}, std::forward<Token>(token));
  }
  /// The same with `options`.
  template <typename Token>
  static auto async_create(const UniqueId& id, int rank, int nranks, Options options,
                           Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, Communicator)>(
        [](auto handler, UniqueId id, int rank, int nranks, Options options) {
          detail::initiate_create(std::vector<UniqueId>{id}, rank, nranks, options,
                                  detail::CreateHandler(detail::Tracked(std::move(handler))));
        },
        token, id, rank, nranks, std::move(options));
  }

  /// Creates a communicator of every process of a launched job, the rank and size coming from
  /// the launcher. Rank 0 makes a fresh random secret and the others receive it through the
  /// launcher, so no second port and no guessable secret is involved:
  /// - torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): through the TCPStore that torchrun
  ///   already serves on MASTER_PORT, spoken to in its own protocol. Rank 0 starts a root and
  ///   puts its UniqueId there; with COCCL_BOOTSTRAP=launcher no root starts: every rank puts
  ///   its listener in the store, which counts the hosts, and reads the entries it keeps (all up
  ///   to COCCL_DIRECTORY_FULL ranks, else O(log N)), at the cost of more queries at the store;
  /// - mpirun or srun with PMIx: through PMIx (libpmix is loaded at run time), without a root in
  ///   the same way by default; COCCL_HOSTID with more than COCCL_DIRECTORY_FULL ranks takes a
  ///   root, as PMIx cannot count those hosts, and COCCL_BOOTSTRAP=root always does.
  /// - COCCL_COMM_ID=host:port with COCCL_SECRET (32 hex digits) and RANK/WORLD_SIZE (or Open
  ///   MPI's / Slurm's variables): rank 0 runs the root on that port; without the secret the call
  ///   is refused.
  /// Every rank must make its from_env() calls in the same order: the n-th call of each rank forms
  /// the same communicator. Waits up to COCCL_TIMEOUT for the launcher; throws std::system_error
  /// (errc::invalid_argument without a launcher, errc::timed_out when it does not answer).
  static Communicator from_env();

  explicit operator bool() const noexcept { return impl_ != nullptr; }
  /// This rank, 0 .. size()-1.
  int rank() const;
  /// Number of ranks.
  int size() const;
  /// The executor of this communicator's proxy thread. Coroutines that await collectives there
  /// resume without crossing threads (the lowest latency).
  boost::asio::any_io_executor executor() const;
  /// The executor type and executor of the communicator, as for any Asio I/O object: the
  /// executor() above.
  using executor_type = boost::asio::any_io_executor;
  executor_type get_executor() const { return executor(); }
  /// Description of the first error (empty if none), naming the peer rank and the operation.
  std::string last_error() const;
  /// The first error that failed this communicator (empty if none); any thread. It includes
  /// errors the device kernels report: a kernel that waited longer than COCCL_TIMEOUT for a peer
  /// returns (the CUDA context stays usable) and the communicator fails with errc::timed_out, its
  /// last_error() naming the peer and the operation. A failed communicator refuses further work.
  std::error_code error() const;
  /// What this rank is doing: the running operation and the peer it waits for, and its recent
  /// host and device operations (CollTrace, COCCL_COLLTRACE_SIZE of each). Any thread; not
  /// collective. tools/coccl-status asks every rank of a job for the same (coccl::query_job).
  /// Throws std::system_error (errc::invalid_argument) for an empty handle.
  CommStatus status() const;

  /// Registers `bytes` of host memory at `buffer` for zero-copy transfers; any thread, not
  /// collective. With the ib transport (COCCL_TRANSPORT=ib) the memory is registered with the
  /// RDMA device (pinned; registering a buffer again, or part of one, reuses the registration),
  /// and a transfer of at least COCCL_IB_ZCOPY_MIN bytes whose source and destination buffers are
  /// both registered is written by the device straight from the sender's buffer into the
  /// receiver's: send/recv, all_gather, all_to_all, all_to_allv, gather, scatter and the
  /// all-gather phase of all_reduce (between receive buffers); when only one side registered,
  /// the bytes are staged as usual. With tcp links on the io_uring engine (COCCL_TCP_ENGINE), a
  /// put of at least COCCL_TCP_ZC_MIN bytes that a link sends zero-copy (IORING_OP_SEND_ZC) from a
  /// registered buffer is sent from the link's io_uring registration of the whole buffer, made on
  /// first use: its pages are pinned once instead of on every send (where io_uring refuses the
  /// buffer, for instance above 1 GiB or past RLIMIT_MEMLOCK, such puts are sent as from an
  /// unregistered buffer and the reason is logged at INFO). Other transports record the
  /// registration and move the bytes as usual. Throws std::system_error: errc::invalid_argument
  /// for a null buffer or 0 bytes or an empty handle, or the device's refusal (for instance the
  /// locked-memory limit, RLIMIT_MEMLOCK) with its reason.
  BufferRegistration register_buffer(void* buffer, std::size_t bytes);
  /// Bytes this rank has sent zero-copy from registered buffers (see register_buffer): by the
  /// RDMA device (ib), or by io_uring zero-copy sends from a link's registered buffers (tcp; the
  /// kernel may still copy them, as it does over loopback).
  std::uint64_t zero_copy_bytes() const;

  /// A handle to this communicator whose operations each carry a deadline of `limit` from their
  /// start (the initiating call): an operation not finished by then fails with errc::timed_out
  /// and, as terminal cancellation does, aborts the communicator, so that every rank's operation
  /// fails (errc::remote_error on the peers, naming this rank and the deadline). Beside the
  /// communicator's timeout (Options::timeout, COCCL_TIMEOUT), which bounds each wait for a peer
  /// rather than a whole operation. Host operations and groups; zero removes the deadline.
  /// `comm.with_deadline(100ms).all_reduce(...)`.
  Communicator with_deadline(std::chrono::milliseconds limit) const {
    Communicator c(*this);
    c.deadline_ = limit;
    return c;
  }

  // ---- Collectives. `send` may equal `recv` (in place) where both exist. ----

  /// recv[i] = op over all ranks of send[i], for i < count.
  template <typename Token>
  auto async_all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                        Token&& token) {
    return run(make(detail::OpKind::all_reduce, send, recv, count, type, op, 0), token);
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
    block(make(detail::OpKind::all_reduce, send, recv, count, type, op, 0));
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                  boost::system::error_code& ec) {
    block(make(detail::OpKind::all_reduce, send, recv, count, type, op, 0), ec);
  }

  /// Copies root's `send` (count elements) into every rank's `recv`; `send` is read on root only.
  template <typename Token>
  auto async_broadcast(const void* send, void* recv, std::size_t count, DataType type, int root,
                       Token&& token) {
    return run(make(detail::OpKind::broadcast, send, recv, count, type, ReduceOp::sum, root),
               token);
  }
  void broadcast(const void* send, void* recv, std::size_t count, DataType type, int root) {
    block(make(detail::OpKind::broadcast, send, recv, count, type, ReduceOp::sum, root));
  }
  void broadcast(const void* send, void* recv, std::size_t count, DataType type, int root,
                 boost::system::error_code& ec) {
    block(make(detail::OpKind::broadcast, send, recv, count, type, ReduceOp::sum, root), ec);
  }

  /// root's recv[i] = op over all ranks of send[i]; `recv` is used on root only.
  template <typename Token>
  auto async_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                    int root, Token&& token) {
    return run(make(detail::OpKind::reduce, send, recv, count, type, op, root), token);
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
              int root) {
    block(make(detail::OpKind::reduce, send, recv, count, type, op, root));
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
              boost::system::error_code& ec) {
    block(make(detail::OpKind::reduce, send, recv, count, type, op, root), ec);
  }

  /// recv[r*count .. (r+1)*count) = rank r's send[0 .. count). In place when
  /// send == recv + rank*count.
  template <typename Token>
  auto async_all_gather(const void* send, void* recv, std::size_t count, DataType type,
                        Token&& token) {
    return run(make(detail::OpKind::all_gather, send, recv, count, type, ReduceOp::sum, 0), token);
  }
  void all_gather(const void* send, void* recv, std::size_t count, DataType type) {
    block(make(detail::OpKind::all_gather, send, recv, count, type, ReduceOp::sum, 0));
  }
  void all_gather(const void* send, void* recv, std::size_t count, DataType type,
                  boost::system::error_code& ec) {
    block(make(detail::OpKind::all_gather, send, recv, count, type, ReduceOp::sum, 0), ec);
  }

  /// recv[0 .. count) = op over ranks of their send[rank*count .. (rank+1)*count). `send` holds
  /// size()*count elements. In place when recv == send + rank*count.
  template <typename Token>
  auto async_reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                            ReduceOp op, Token&& token) {
    return run(make(detail::OpKind::reduce_scatter, send, recv, count, type, op, 0), token);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
    block(make(detail::OpKind::reduce_scatter, send, recv, count, type, op, 0));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                      boost::system::error_code& ec) {
    block(make(detail::OpKind::reduce_scatter, send, recv, count, type, op, 0), ec);
  }

  /// Rank r's recv[p*count ..] = rank p's send[r*count ..], `count` elements per peer.
  template <typename Token>
  auto async_all_to_all(const void* send, void* recv, std::size_t count, DataType type,
                        Token&& token) {
    return run(make(detail::OpKind::all_to_all, send, recv, count, type, ReduceOp::sum, 0), token);
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DataType type) {
    block(make(detail::OpKind::all_to_all, send, recv, count, type, ReduceOp::sum, 0));
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DataType type,
                  boost::system::error_code& ec) {
    block(make(detail::OpKind::all_to_all, send, recv, count, type, ReduceOp::sum, 0), ec);
  }

  /// All-to-all with per-peer counts and displacements (elements); each vector has size()
  /// entries. recv_counts[p] on rank r must equal send_counts[r] on rank p. Not in place.
  template <typename Token>
  auto async_all_to_allv(const void* send, std::vector<std::size_t> send_counts,
                         std::vector<std::size_t> send_displs, void* recv,
                         std::vector<std::size_t> recv_counts, std::vector<std::size_t> recv_displs,
                         DataType type, Token&& token) {
    return run(make_v(send, std::move(send_counts), std::move(send_displs), recv,
                      std::move(recv_counts), std::move(recv_displs), type),
               token);
  }
  void all_to_allv(const void* send, std::vector<std::size_t> send_counts,
                   std::vector<std::size_t> send_displs, void* recv,
                   std::vector<std::size_t> recv_counts, std::vector<std::size_t> recv_displs,
                   DataType type) {
    block(make_v(send, std::move(send_counts), std::move(send_displs), recv, std::move(recv_counts),
                 std::move(recv_displs), type));
  }
  void all_to_allv(const void* send, std::vector<std::size_t> send_counts,
                   std::vector<std::size_t> send_displs, void* recv,
                   std::vector<std::size_t> recv_counts, std::vector<std::size_t> recv_displs,
                   DataType type, boost::system::error_code& ec) {
    block(make_v(send, std::move(send_counts), std::move(send_displs), recv, std::move(recv_counts),
                 std::move(recv_displs), type),
          ec);
  }

  /// root's recv[r*count ..] = rank r's send[0 .. count); `recv` is used on root only.
  template <typename Token>
  auto async_gather(const void* send, void* recv, std::size_t count, DataType type, int root,
                    Token&& token) {
    return run(make(detail::OpKind::gather, send, recv, count, type, ReduceOp::sum, root), token);
  }
  void gather(const void* send, void* recv, std::size_t count, DataType type, int root) {
    block(make(detail::OpKind::gather, send, recv, count, type, ReduceOp::sum, root));
  }
  void gather(const void* send, void* recv, std::size_t count, DataType type, int root,
              boost::system::error_code& ec) {
    block(make(detail::OpKind::gather, send, recv, count, type, ReduceOp::sum, root), ec);
  }

  /// Rank r's recv[0 .. count) = root's send[r*count ..]; `send` is used on root only.
  template <typename Token>
  auto async_scatter(const void* send, void* recv, std::size_t count, DataType type, int root,
                     Token&& token) {
    return run(make(detail::OpKind::scatter, send, recv, count, type, ReduceOp::sum, root), token);
  }
  void scatter(const void* send, void* recv, std::size_t count, DataType type, int root) {
    block(make(detail::OpKind::scatter, send, recv, count, type, ReduceOp::sum, root));
  }
  void scatter(const void* send, void* recv, std::size_t count, DataType type, int root,
               boost::system::error_code& ec) {
    block(make(detail::OpKind::scatter, send, recv, count, type, ReduceOp::sum, root), ec);
  }

  // ---- Device memory, stream-ordered (needs a build with CUDA). ----
  //
  // Buffers are device memory of the GPU that is current (cudaSetDevice) in the calling thread;
  // every rank of the communicator must be a GPU of this host. The call enqueues kernels on
  // `stream` and returns: the collective happens in stream order, never waiting for the host, so
  // it can be captured in a CUDA graph and replayed. The first device call of a communicator is
  // collective and blocking (it allocates a workspace on each GPU and maps the peers' over NVLink);
  // make it before capturing a graph. Errors (invalid arguments, CUDA failures) throw
  // std::system_error with nothing enqueued. Every collective of the host section exists here
  // with the same semantics (barrier excepted); reduce_scatter runs in place too. Rooted
  // collectives are collective: every rank calls them, also ranks whose buffers they do not use.
  // send_recv, send and recv are not: only the ranks named take part (they may not be the first
  // device call of a communicator, which must be made by every rank).
  //
  // Order and concurrency: the device operations of one communicator run one at a time in call
  // order, whatever streams they are issued on: an operation on another stream than the previous
  // one waits for it on the device (inside one graph capture too), besides everything its own
  // stream orders before it. So one communicator may be driven from several streams (FSDP's
  // all_gather and reduce_scatter streams), and several threads may issue on it (their calls are
  // serialised). Several communicators may work at once on different streams and several ranks
  // may share one GPU (one process each under MPS, or threads of one process): kernels use few
  // enough blocks that all of them fit on the GPU together (COCCL_DEVICE_COMMS communicators per
  // rank, default 2; see docs/design.md). A kernel that waits longer than COCCL_TIMEOUT for a
  // peer returns (the CUDA context stays usable) and fails the communicator: error() is
  // errc::timed_out and last_error() names the peer and the operation.

  /// Stream-ordered all_reduce of device buffers.
  void all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                  cuda_stream stream) {
    device(make(detail::OpKind::all_reduce, send, recv, count, type, op, 0), stream);
  }
  void all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                  cuda_stream stream, boost::system::error_code& ec) {
    device(make(detail::OpKind::all_reduce, send, recv, count, type, op, 0), stream, ec);
  }
  /// Stream-ordered all_gather of device buffers.
  void all_gather(const void* send, void* recv, std::size_t count, DataType type,
                  cuda_stream stream) {
    device(make(detail::OpKind::all_gather, send, recv, count, type, ReduceOp::sum, 0), stream);
  }
  void all_gather(const void* send, void* recv, std::size_t count, DataType type,
                  cuda_stream stream, boost::system::error_code& ec) {
    device(make(detail::OpKind::all_gather, send, recv, count, type, ReduceOp::sum, 0), stream, ec);
  }
  /// Stream-ordered reduce_scatter of device buffers.
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                      cuda_stream stream) {
    device(make(detail::OpKind::reduce_scatter, send, recv, count, type, op, 0), stream);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                      cuda_stream stream, boost::system::error_code& ec) {
    device(make(detail::OpKind::reduce_scatter, send, recv, count, type, op, 0), stream, ec);
  }
  /// Stream-ordered all_to_all of device buffers.
  void all_to_all(const void* send, void* recv, std::size_t count, DataType type,
                  cuda_stream stream) {
    device(make(detail::OpKind::all_to_all, send, recv, count, type, ReduceOp::sum, 0), stream);
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DataType type,
                  cuda_stream stream, boost::system::error_code& ec) {
    device(make(detail::OpKind::all_to_all, send, recv, count, type, ReduceOp::sum, 0), stream, ec);
  }
  /// Stream-ordered broadcast of device buffers: every rank's recv = root's send (read on root
  /// only; in place when root's send == recv).
  void broadcast(const void* send, void* recv, std::size_t count, DataType type, int root,
                 cuda_stream stream) {
    device(make(detail::OpKind::broadcast, send, recv, count, type, ReduceOp::sum, root), stream);
  }
  void broadcast(const void* send, void* recv, std::size_t count, DataType type, int root,
                 cuda_stream stream, boost::system::error_code& ec) {
    device(make(detail::OpKind::broadcast, send, recv, count, type, ReduceOp::sum, root), stream,
           ec);
  }
  /// Stream-ordered reduce of device buffers: root's recv = op over ranks of send (avg divides by
  /// size()); recv is used on root only and may equal send there.
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
              cuda_stream stream) {
    device(make(detail::OpKind::reduce, send, recv, count, type, op, root), stream);
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
              cuda_stream stream, boost::system::error_code& ec) {
    device(make(detail::OpKind::reduce, send, recv, count, type, op, root), stream, ec);
  }
  /// Stream-ordered gather of device buffers: root's recv[r*count ..] = rank r's send; recv is
  /// used on root only (in place when send == recv + root*count there).
  void gather(const void* send, void* recv, std::size_t count, DataType type, int root,
              cuda_stream stream) {
    device(make(detail::OpKind::gather, send, recv, count, type, ReduceOp::sum, root), stream);
  }
  void gather(const void* send, void* recv, std::size_t count, DataType type, int root,
              cuda_stream stream, boost::system::error_code& ec) {
    device(make(detail::OpKind::gather, send, recv, count, type, ReduceOp::sum, root), stream, ec);
  }
  /// Stream-ordered scatter of device buffers: rank r's recv = root's send[r*count ..]; send is
  /// read on root only (in place when recv == send + root*count there).
  void scatter(const void* send, void* recv, std::size_t count, DataType type, int root,
               cuda_stream stream) {
    device(make(detail::OpKind::scatter, send, recv, count, type, ReduceOp::sum, root), stream);
  }
  void scatter(const void* send, void* recv, std::size_t count, DataType type, int root,
               cuda_stream stream, boost::system::error_code& ec) {
    device(make(detail::OpKind::scatter, send, recv, count, type, ReduceOp::sum, root), stream, ec);
  }
  /// Stream-ordered all_to_allv of device buffers (counts and displacements in elements, size()
  /// entries each, read at the call: a captured graph replays the sizes of the capture).
  void all_to_allv(const void* send, std::vector<std::size_t> send_counts,
                   std::vector<std::size_t> send_displs, void* recv,
                   std::vector<std::size_t> recv_counts, std::vector<std::size_t> recv_displs,
                   DataType type, cuda_stream stream) {
    device(make_v(send, std::move(send_counts), std::move(send_displs), recv,
                  std::move(recv_counts), std::move(recv_displs), type),
           stream);
  }
  void all_to_allv(const void* send, std::vector<std::size_t> send_counts,
                   std::vector<std::size_t> send_displs, void* recv,
                   std::vector<std::size_t> recv_counts, std::vector<std::size_t> recv_displs,
                   DataType type, cuda_stream stream, boost::system::error_code& ec) {
    device(make_v(send, std::move(send_counts), std::move(send_displs), recv,
                  std::move(recv_counts), std::move(recv_displs), type),
           stream, ec);
  }
  /// Stream-ordered group of sends and receives of device buffers (at most 32 transfers on one
  /// host; across hosts at most 128 non-empty ones each way), matched like the host send_recv. A
  /// send's kernel finishes once its receiver has the data. Ranks not named need not call it;
  /// transfers between two ranks must be issued in the same order on both.
  void send_recv(std::vector<Transfer> transfers, cuda_stream stream) {
    device(make_p2p(std::move(transfers)), stream);
  }
  void send_recv(std::vector<Transfer> transfers, cuda_stream stream,
                 boost::system::error_code& ec) {
    device(make_p2p(std::move(transfers)), stream, ec);
  }
  /// Stream-ordered single send (a device group of one).
  void send(const void* buf, std::size_t count, DataType type, int peer, cuda_stream stream) {
    send_recv({Transfer::send(buf, count, type, peer)}, stream);
  }
  void send(const void* buf, std::size_t count, DataType type, int peer, cuda_stream stream,
            boost::system::error_code& ec) {
    send_recv({Transfer::send(buf, count, type, peer)}, stream, ec);
  }
  /// Stream-ordered single receive (a device group of one).
  void recv(void* buf, std::size_t count, DataType type, int peer, cuda_stream stream) {
    send_recv({Transfer::recv(buf, count, type, peer)}, stream);
  }
  void recv(void* buf, std::size_t count, DataType type, int peer, cuda_stream stream,
            boost::system::error_code& ec) {
    send_recv({Transfer::recv(buf, count, type, peer)}, stream, ec);
  }

  /// Enqueues the all_reduce on `stream` now (as the stream-ordered form), then completes with
  /// `void(boost::system::error_code)` once the GPU has finished it: `co_await
  /// comm.async_all_reduce(..., stream, asio::use_awaitable)` resumes when the result is in `recv`.
  /// The proxy thread polls a CUDA event; no host callback is used.
  template <typename Token>
  auto async_all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                        cuda_stream stream, Token&& token) {
    return async_device(make(detail::OpKind::all_reduce, send, recv, count, type, op, 0), stream,
                        token);
  }

  /// The same for the other device collectives: each enqueues as its stream-ordered form and
  /// completes once the GPU has finished it.
  template <typename Token>
  auto async_all_gather(const void* send, void* recv, std::size_t count, DataType type,
                        cuda_stream stream, Token&& token) {
    return async_device(make(detail::OpKind::all_gather, send, recv, count, type, ReduceOp::sum, 0),
                        stream, token);
  }
  template <typename Token>
  auto async_reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                            ReduceOp op, cuda_stream stream, Token&& token) {
    return async_device(make(detail::OpKind::reduce_scatter, send, recv, count, type, op, 0),
                        stream, token);
  }
  template <typename Token>
  auto async_all_to_all(const void* send, void* recv, std::size_t count, DataType type,
                        cuda_stream stream, Token&& token) {
    return async_device(make(detail::OpKind::all_to_all, send, recv, count, type, ReduceOp::sum, 0),
                        stream, token);
  }
  template <typename Token>
  auto async_broadcast(const void* send, void* recv, std::size_t count, DataType type, int root,
                       cuda_stream stream, Token&& token) {
    return async_device(
        make(detail::OpKind::broadcast, send, recv, count, type, ReduceOp::sum, root), stream,
        token);
  }
  template <typename Token>
  auto async_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                    int root, cuda_stream stream, Token&& token) {
    return async_device(make(detail::OpKind::reduce, send, recv, count, type, op, root), stream,
                        token);
  }
  template <typename Token>
  auto async_gather(const void* send, void* recv, std::size_t count, DataType type, int root,
                    cuda_stream stream, Token&& token) {
    return async_device(make(detail::OpKind::gather, send, recv, count, type, ReduceOp::sum, root),
                        stream, token);
  }
  template <typename Token>
  auto async_scatter(const void* send, void* recv, std::size_t count, DataType type, int root,
                     cuda_stream stream, Token&& token) {
    return async_device(make(detail::OpKind::scatter, send, recv, count, type, ReduceOp::sum, root),
                        stream, token);
  }
  template <typename Token>
  auto async_all_to_allv(const void* send, std::vector<std::size_t> send_counts,
                         std::vector<std::size_t> send_displs, void* recv,
                         std::vector<std::size_t> recv_counts, std::vector<std::size_t> recv_displs,
                         DataType type, cuda_stream stream, Token&& token) {
    return async_device(make_v(send, std::move(send_counts), std::move(send_displs), recv,
                               std::move(recv_counts), std::move(recv_displs), type),
                        stream, token);
  }
  template <typename Token>
  auto async_send_recv(std::vector<Transfer> transfers, cuda_stream stream, Token&& token) {
    return async_device(make_p2p(std::move(transfers)), stream, token);
  }
  template <typename Token>
  auto async_send(const void* buf, std::size_t count, DataType type, int peer, cuda_stream stream,
                  Token&& token) {
    return async_send_recv(std::vector<Transfer>{Transfer::send(buf, count, type, peer)}, stream,
                           std::forward<Token>(token));
  }
  template <typename Token>
  auto async_recv(void* buf, std::size_t count, DataType type, int peer, cuda_stream stream,
                  Token&& token) {
    return async_send_recv(std::vector<Transfer>{Transfer::recv(buf, count, type, peer)}, stream,
                           std::forward<Token>(token));
  }

  /// Completes on every rank once all ranks have entered it.
  template <typename Token>
  auto async_barrier(Token&& token) {
    return run(
        make(detail::OpKind::barrier, nullptr, nullptr, 0, DataType::uint8, ReduceOp::sum, 0),
        token);
  }
  void barrier() {
    block(make(detail::OpKind::barrier, nullptr, nullptr, 0, DataType::uint8, ReduceOp::sum, 0));
  }
  void barrier(boost::system::error_code& ec) {
    block(make(detail::OpKind::barrier, nullptr, nullptr, 0, DataType::uint8, ReduceOp::sum, 0),
          ec);
  }

  /// A group of sends and receives that progress together, so any exchange pattern is free of
  /// deadlock (like ncclGroupStart/End around ncclSend/ncclRecv). Transfers between one pair of
  /// ranks in one direction are matched in order; a send's count must equal the matching
  /// receive's. Ranks not named by any transfer need not call it.
  template <typename Token>
  auto async_send_recv(std::vector<Transfer> transfers, Token&& token) {
    return run(make_p2p(std::move(transfers)), token);
  }
  void send_recv(std::vector<Transfer> transfers) { block(make_p2p(std::move(transfers))); }
  void send_recv(std::vector<Transfer> transfers, boost::system::error_code& ec) {
    block(make_p2p(std::move(transfers)), ec);
  }
  /// The same as Transfer::send (kept for existing callers).
  static Transfer send_op(const void* buf, std::size_t count, DataType type, int peer) {
    return Transfer::send(buf, count, type, peer);
  }
  /// The same as Transfer::recv (kept for existing callers).
  static Transfer recv_op(void* buf, std::size_t count, DataType type, int peer) {
    return Transfer::recv(buf, count, type, peer);
  }
  /// Single send and receive (a group of one).
  template <typename Token>
  auto async_send(const void* buf, std::size_t count, DataType type, int peer, Token&& token) {
    return async_send_recv(std::vector<Transfer>{Transfer::send(buf, count, type, peer)},
                           std::forward<Token>(token));
  }
  template <typename Token>
  auto async_recv(void* buf, std::size_t count, DataType type, int peer, Token&& token) {
    return async_send_recv(std::vector<Transfer>{Transfer::recv(buf, count, type, peer)},
                           std::forward<Token>(token));
  }
  void send(const void* buf, std::size_t count, DataType type, int peer) {
    send_recv({Transfer::send(buf, count, type, peer)});
  }
  void send(const void* buf, std::size_t count, DataType type, int peer,
            boost::system::error_code& ec) {
    send_recv({Transfer::send(buf, count, type, peer)}, ec);
  }
  void recv(void* buf, std::size_t count, DataType type, int peer) {
    send_recv({Transfer::recv(buf, count, type, peer)});
  }
  void recv(void* buf, std::size_t count, DataType type, int peer, boost::system::error_code& ec) {
    send_recv({Transfer::recv(buf, count, type, peer)}, ec);
  }

  /// Operations issued together and completed together, as ncclGroupStart/End gives C users:
  /// the group's operations (collected in a Group, see there) enter this communicator's queue
  /// back to back, so no operation started from another thread falls between them, and the
  /// group completes once, after its last operation, with the first error of any (later members
  /// still run, or fail with the communicator's error). Every rank must issue the same
  /// collectives in the same order, as outside a group; sends and receives added one after
  /// another form one send_recv, so they progress together. Arguments are checked for every
  /// operation before any is queued: a bad one fails the whole group with
  /// errc::invalid_argument, nothing sent. Cancellation and with_deadline() apply to the group
  /// as one operation (cancelling it before it starts removes every member). An empty group
  /// completes at once with success.
  template <typename Token>
  auto async_group(Group group, Token&& token);
  void group(Group group);
  void group(Group group, boost::system::error_code& ec);
  /// Fills a Group with `fill(Group&)` and runs it blocking:
  /// `comm.group([&](coccl::Group& g) { g.all_reduce(...); g.send(...); });`.
  template <typename Fill>
  requires std::invocable<Fill&, Group&>
  void group(Fill&& fill);

  /// Collective over this communicator: ranks passing the same `color` (>= 0) form a new
  /// communicator, ordered by `key` then by rank. A negative color joins none and returns an empty
  /// handle. Throws std::system_error on failure. (Two all_gathers of this communicator share the
  /// colors and the new ids: O(size()) bytes for every rank.)
  Communicator split(int color, int key, const Options& options = {});

  /// Asynchronous split; completion signature `void(boost::system::error_code, Communicator)`
  /// (an empty handle for a negative color). It runs on this communicator's proxy thread, in this
  /// communicator's order of operations (its all_gathers are queued as if the caller had started
  /// them), then joins the new communicator as async_create does. Cancellation: terminal
  /// cancellation reaches the step in flight, with that step's meaning (an all_gather not started
  /// yet is removed and the split completes with std::errc::operation_canceled; one in flight
  /// aborts this communicator; the joining stops as async_create's). Partial and total
  /// cancellation are ignored. The reason of a failure is this communicator's last_error() when
  /// one of its operations failed, else logged.
  template <typename Token>
  auto async_split(int color, int key, Token&& token) {
    return async_split(color, key, Options{}, std::forward<Token>(token));
  }
  /// The same with `options` for the new communicator.
  template <typename Token>
  auto async_split(int color, int key, Options options, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, Communicator)>(
        [](auto handler, std::shared_ptr<detail::CommImpl> impl, int color, int key,
           Options options) {
          detail::initiate_split(impl, color, key, options,
                                 detail::CreateHandler(detail::Tracked(std::move(handler))));
        },
        token, impl_, color, key, std::move(options));
  }

  /// Makes a communicator of the ranks `members` of this one, new rank i being members[i]. Every
  /// member passes the same list; the other ranks do not call it (collective over the members
  /// only, and no exchange with the whole communicator: members[0] starts the new root and its id
  /// travels down a binomial tree of the members over this communicator's point-to-point links,
  /// so a member links to at most log2(members) + 1 others). Throws std::system_error:
  /// errc::invalid_argument (nothing sent) for an empty list, a rank out of range or repeated, or a
  /// list without this rank; errc::mismatch when the members' lists differ (found when the id
  /// arrives: members whose list differs from members[0]'s throw, and the others' setup then times
  /// out).
  Communicator split_members(const std::vector<int>& members);

  /// Asynchronous split_members; completion signature `void(boost::system::error_code,
  /// Communicator)`. A bad list completes with errc::invalid_argument, nothing sent. It runs on
  /// this communicator's proxy thread, in this communicator's order of operations (the id's
  /// receive and sends are queued as if the caller had started them), then joins the new
  /// communicator as async_create does. Cancellation as async_split's.
  template <typename Token>
  auto async_split_members(std::vector<int> members, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, Communicator)>(
        [](auto handler, std::shared_ptr<detail::CommImpl> impl, std::vector<int> members) {
          detail::initiate_split_members(
              impl, std::move(members), detail::CreateHandler(detail::Tracked(std::move(handler))));
        },
        token, impl_, std::move(members));
  }

  // ---- Recovery: shrink after lost ranks, grow with new ones (docs/reliability.md). ----

  /// The ranks of this communicator that are gone, as this rank finds them now: it asks every
  /// other rank's listener of this communicator (one authenticated round trip each, in parallel).
  /// A rank whose listener refuses the connection (its process died, or it destroyed or released
  /// the communicator) or does not answer within COCCL_TIMEOUT (a stopped or unreachable process)
  /// is lost. Works on a healthy or failed communicator: a rank keeps its listener open after a
  /// failure, until the communicator is destroyed. Blocking, sorted ascending; any thread but a
  /// proxy thread. Every survivor must pass the same list to shrink(): when survivors ask at
  /// different times, or a rank is slow rather than dead, their answers can differ, and shrink()
  /// then fails with errc::mismatch (agree on the list another way, as with NCCL, if in doubt).
  /// Throws std::system_error (errc::invalid_argument for an empty handle).
  std::vector<int> lost_ranks();

  /// Makes a new communicator of the ranks of this one not in `exclude` (parent ranks), new rank
  /// i being the i-th of them in parent order. Works on a healthy, failed or aborted parent (an
  /// aborted one through a copy of its handle, as abort() empties the handle it is called on): the
  /// survivors do not use the parent's links, which a failure closed. The lowest rank not
  /// excluded gathers them on its listener of the parent, authenticated with the parent's
  /// secret; once all have come with the same list it hands out the id of a fresh communicator,
  /// which they then join (COCCL_TIMEOUT for each step). Called by every survivor with the same
  /// list; excluded ranks do not call it, and every survivor keeps the parent (its listener)
  /// until the others' shrink has returned too. One shrink at a time per communicator. The
  /// parent is left as it was (still failed, if it had). Device operations on the new communicator
  /// work as after split(). Blocking; throws std::system_error: errc::invalid_argument (nothing
  /// sent) for an empty handle, a rank out of range, or when this rank is in `exclude`;
  /// errc::mismatch, naming the ranks, when survivors pass different lists (or tries: a survivor's
  /// second shrink after a failed first meets only the others' second); errc::timed_out naming the
  /// survivors that did not come, or the gathering rank when it cannot be reached (lists that
  /// disagree on the lowest survivor end this way too).
  Communicator shrink(std::span<const int> exclude);
  /// As above; on failure sets `ec` and returns an empty handle (the reason is logged).
  Communicator shrink(std::span<const int> exclude, boost::system::error_code& ec);
  /// Asynchronous shrink; completion signature `void(boost::system::error_code, Communicator)`. Not
  /// cancellable (the other survivors wait for this one). The reason of a failure is logged.
  template <typename Token>
  auto async_shrink(std::vector<int> exclude, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, Communicator)>(
        [](auto handler, std::shared_ptr<detail::CommImpl> impl, std::vector<int> exclude) {
          detail::submit_shrink(impl, std::move(exclude),
                                detail::CreateHandler(detail::Tracked(std::move(handler))));
        },
        token, impl_, std::move(exclude));
  }

  /// Collective over this (healthy) communicator: rank 0 makes the id of a larger communicator
  /// and every rank gets it (a broadcast). Rank 0 then hands it to the newcomers out of band,
  /// as for create(), and everyone joins within COCCL_TIMEOUT of this call: members with
  /// grow(), newcomers with Communicator::create(id, rank, new_nranks), taking the ranks
  /// size() .. new_nranks-1. Throws std::system_error as the broadcast does.
  UniqueId grow_id();
  /// Joins the larger communicator `id` (from grow_id()) of `new_nranks` ranks, keeping this
  /// rank's number; blocks until every member and newcomer has joined. This communicator is left
  /// as it was. Throws std::system_error: errc::invalid_argument when `new_nranks` is below
  /// size(), else as create().
  Communicator grow(const UniqueId& id, int new_nranks);

  /// Waits for this rank's operations in flight to finish, then releases the communicator. Other
  /// handles to it become unusable (operations fail with errc::aborted). Sends no message.
  void destroy();

  /// Stops the communicator now: operations in flight and queued fail with errc::aborted, peers
  /// are told, connections close. Returns promptly even if a peer is dead or silent.
  void abort();

 private:
  explicit Communicator(std::shared_ptr<detail::CommImpl> impl) : impl_(std::move(impl)) {}
  friend std::shared_ptr<detail::CommImpl> detail::impl_of(const Communicator&);
  friend class detail::CommImpl;
  friend class Group;

  static detail::OpArgs make(detail::OpKind k, const void* send, void* recv, std::size_t count,
                             DataType type, ReduceOp op, int root) {
    detail::OpArgs a;
    a.kind = k;
    a.send = send;
    a.recv = recv;
    a.count = count;
    a.type = type;
    a.op = op;
    a.root = root;
    return a;
  }
  static detail::OpArgs make_v(const void* send, std::vector<std::size_t> sc,
                               std::vector<std::size_t> sd, void* recv, std::vector<std::size_t> rc,
                               std::vector<std::size_t> rd, DataType type) {
    detail::OpArgs a = make(detail::OpKind::all_to_allv, send, recv, 0, type, ReduceOp::sum, 0);
    a.send_counts = std::move(sc);
    a.send_displs = std::move(sd);
    a.recv_counts = std::move(rc);
    a.recv_displs = std::move(rd);
    return a;
  }
  static detail::OpArgs make_p2p(std::vector<Transfer> transfers) {
    detail::OpArgs a;
    a.kind = detail::OpKind::p2p;
    a.p2p = std::move(transfers);
    return a;
  }
  template <typename Token>
  auto run(detail::OpArgs args, Token& token) {
    args.deadline = deadline_;
    return boost::asio::async_initiate<Token, void(boost::system::error_code)>(
        [](auto handler, std::shared_ptr<detail::CommImpl> impl, detail::OpArgs args) {
          detail::start(impl, std::move(args), std::move(handler));
        },
        token, impl_, std::move(args));
  }
  void device(const detail::OpArgs& args, cuda_stream stream) {
    if (auto ec = detail::enqueue_device(impl_, args, stream))
      throw std::system_error(ec, detail::describe_error(impl_, ec));
  }
  void device(const detail::OpArgs& args, cuda_stream stream, boost::system::error_code& ec) {
    ec = detail::enqueue_device(impl_, args, stream);
  }
  template <typename Token>
  auto async_device(detail::OpArgs args, cuda_stream stream, Token& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code)>(
        [](auto handler, std::shared_ptr<detail::CommImpl> impl, detail::OpArgs args,
           cuda_stream stream) {
          std::error_code ec = detail::enqueue_device(impl, args, stream);
          // Enqueued work cannot be withdrawn from the stream: only the handler is tracked.
          detail::notify_when_done(impl, stream, ec,
                                   detail::OpHandler(detail::Tracked(std::move(handler))));
        },
        token, impl_, std::move(args), stream);
  }
  void block(detail::OpArgs args) {
    std::error_code ec;
    args.deadline = deadline_;
    detail::run_blocking(impl_, std::move(args), ec);
    if (ec) detail::throw_op_error(impl_, ec);
  }
  void block(detail::OpArgs args, boost::system::error_code& ec) {
    std::error_code e;
    args.deadline = deadline_;
    detail::run_blocking(impl_, std::move(args), e);
    // Converting a std::error_code costs Boost.System a dynamic_cast: success needs none.
    if (e)
      ec = e;
    else
      ec.clear();
  }

  std::shared_ptr<detail::CommImpl> impl_;
  std::chrono::milliseconds deadline_{0};
};

/// The operations of one group (Communicator::group, async_group), collected in call order; each
/// has the arguments and meaning of the Communicator operation of its name. Adding an operation
/// only records it (nothing is checked or sent until the group runs); the buffers must stay
/// valid until the group completes. Move-only, like the operations it holds.
class Group {
 public:
  Group() = default;
  Group(Group&&) noexcept = default;
  Group& operator=(Group&&) noexcept = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group() = default;

  void all_reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
    add(Communicator::make(detail::OpKind::all_reduce, send, recv, count, type, op, 0));
  }
  void broadcast(const void* send, void* recv, std::size_t count, DataType type, int root) {
    add(Communicator::make(detail::OpKind::broadcast, send, recv, count, type, ReduceOp::sum,
                           root));
  }
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
              int root) {
    add(Communicator::make(detail::OpKind::reduce, send, recv, count, type, op, root));
  }
  void all_gather(const void* send, void* recv, std::size_t count, DataType type) {
    add(Communicator::make(detail::OpKind::all_gather, send, recv, count, type, ReduceOp::sum, 0));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op) {
    add(Communicator::make(detail::OpKind::reduce_scatter, send, recv, count, type, op, 0));
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DataType type) {
    add(Communicator::make(detail::OpKind::all_to_all, send, recv, count, type, ReduceOp::sum, 0));
  }
  void all_to_allv(const void* send, std::vector<std::size_t> send_counts,
                   std::vector<std::size_t> send_displs, void* recv,
                   std::vector<std::size_t> recv_counts, std::vector<std::size_t> recv_displs,
                   DataType type) {
    add(Communicator::make_v(send, std::move(send_counts), std::move(send_displs), recv,
                             std::move(recv_counts), std::move(recv_displs), type));
  }
  void gather(const void* send, void* recv, std::size_t count, DataType type, int root) {
    add(Communicator::make(detail::OpKind::gather, send, recv, count, type, ReduceOp::sum, root));
  }
  void scatter(const void* send, void* recv, std::size_t count, DataType type, int root) {
    add(Communicator::make(detail::OpKind::scatter, send, recv, count, type, ReduceOp::sum, root));
  }
  void barrier() {
    add(Communicator::make(detail::OpKind::barrier, nullptr, nullptr, 0, DataType::uint8,
                           ReduceOp::sum, 0));
  }
  /// Sends and receives added one after another join one send_recv.
  void send(const void* buf, std::size_t count, DataType type, int peer) {
    transfer(Transfer::send(buf, count, type, peer));
  }
  void recv(void* buf, std::size_t count, DataType type, int peer) {
    transfer(Transfer::recv(buf, count, type, peer));
  }
  void send_recv(std::vector<Transfer> transfers) {
    for (auto& t : transfers) transfer(t);
  }
  /// Number of operations (a run of sends and receives counts once).
  std::size_t size() const noexcept { return ops_.size(); }
  bool empty() const noexcept { return ops_.empty(); }

 private:
  friend class Communicator;
  void add(detail::OpArgs a) { ops_.push_back(std::move(a)); }
  void transfer(const Transfer& t) {
    if (ops_.empty() || ops_.back().kind != detail::OpKind::p2p)
      ops_.push_back(Communicator::make_p2p({}));
    ops_.back().p2p.push_back(t);
  }
  std::vector<detail::OpArgs> ops_;
};

template <typename Token>
auto Communicator::async_group(Group group, Token&& token) {
  return boost::asio::async_initiate<Token, void(boost::system::error_code)>(
      [](auto handler, std::shared_ptr<detail::CommImpl> impl, std::vector<detail::OpArgs> ops,
         std::chrono::milliseconds deadline) {
        detail::initiate_group(impl, std::move(ops), deadline,
                               detail::OpHandler(detail::Tracked(std::move(handler))));
      },
      token, impl_, std::move(group.ops_), deadline_);
}

inline void Communicator::group(Group group) {
  std::error_code ec;
  detail::run_blocking_group(impl_, std::move(group.ops_), deadline_, ec);
  if (ec) detail::throw_op_error(impl_, ec);
}

inline void Communicator::group(Group group, boost::system::error_code& ec) {
  std::error_code e;
  detail::run_blocking_group(impl_, std::move(group.ops_), deadline_, e);
  ec = e;
}

template <typename Fill>
requires std::invocable<Fill&, Group&>
void Communicator::group(Fill&& fill) {
  Group g;
  fill(g);
  group(std::move(g));
}

}  // namespace coccl
