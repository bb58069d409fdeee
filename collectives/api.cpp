// The public C++ API (include/coccl/communicator.hpp) over CommImpl.
#include <atomic>
#include <boost/asio/append.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <chrono>
#include <coccl/coccl.hpp>
#include <cstdlib>
#include <cstring>
#include <future>
#include <optional>

#include "collectives/comm.hpp"
#include "collectives/comm_params.hpp"
#include "runtime/deadline.hpp"
#include "runtime/handoff.hpp"
#include "runtime/log.hpp"
#include "transport/hmac.hpp"
#include "transport/launcher.hpp"
#include "transport/wire.hpp"

namespace coccl {

namespace asio = boost::asio;

int runtime_version() noexcept {
  return version_major * 10000 + version_minor * 100 + version_patch;
}

namespace {

// The engine lives until the process exits: roots and communicators share it, and tearing its
// threads down during static destruction would race with late users.
std::shared_ptr<runtime::Engine> engine() {
  static auto* e = new std::shared_ptr<runtime::Engine>(runtime::Engine::instance());
  return *e;
}

transport::Secret make_secret() {
  transport::Secret s;
  detail::random_bytes(s);
  return s;
}

[[noreturn]] void invalid(const std::string& why) {
  throw std::system_error(make_error_code(errc::invalid_argument), why);
}

// A secret as 32 hex digits (a launcher value), and back.
std::string secret_text(const transport::Secret& secret) { return transport::to_hex(secret); }

transport::Secret secret_from_text(const std::string& text) {
  transport::Secret secret{};
  if (text.size() != 2 * secret.size())
    throw std::system_error(make_error_code(errc::bad_message),
                            "the launcher's secret is " + std::to_string(text.size()) +
                                " characters, not " + std::to_string(2 * secret.size()));
  if (!transport::from_hex(text, secret, true)) invalid("the launcher's secret must be hex digits");
  return secret;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0') invalid(std::string(name) + " is not an integer: '" + v + "'");
  return static_cast<int>(x);
}

}  // namespace

UniqueId UniqueId::create() { return detail::unique_id_on(*engine()); }

std::string UniqueId::to_string() const { return transport::to_hex(bytes); }

UniqueId UniqueId::from_address(std::string_view host_port, std::string_view secret_hex) {
  if (secret_hex.size() != 32)
    throw std::system_error(
        make_error_code(errc::invalid_argument),
        "a secret is 32 hex digits, not " + std::to_string(secret_hex.size()) + " characters");
  transport::RootAddress root;
  root.address = transport::PeerInfo::from(transport::parse_endpoint(std::string(host_port)));
  const UniqueId digits = from_string(std::string(secret_hex) + std::string(224, '0'));
  std::memcpy(root.secret.data(), digits.bytes.data(), root.secret.size());
  return transport::encode(root);
}

UniqueId UniqueId::from_string(std::string_view text) {
  UniqueId id;
  if (text.size() != id.bytes.size() * 2) invalid("UniqueId text must be 256 hex digits");
  if (!transport::from_hex(text, id.bytes, true)) invalid("UniqueId text must be hex digits");
  return id;
}

namespace detail {

runtime::Engine& process_engine() { return *engine(); }

std::string describe_error(const std::shared_ptr<CommImpl>& impl, std::error_code ec) {
  // Taken, so that a later error of another kind never shows a stale reason.
  if (ec == errc::invalid_argument && !argument_error().empty()) {
    std::string why;
    why.swap(argument_error());
    return why;
  }
  if (ec == std::errc::operation_would_block)
    return "a blocking call on a non-blocking communicator (Options::blocking is false); use the "
           "async_ form";
  return impl ? impl->last_error() : "empty communicator";
}

namespace {

const char* const blocking_on_proxy =
    "a blocking coccl call on a proxy thread (a coroutine on the communicator's executor) would "
    "wait for the loop it blocks; co_await the async_ form there";

// From a cancellation slot (any thread): cancels the operation on its proxy thread.
void cancel_op(const std::weak_ptr<CommImpl>& impl, const std::weak_ptr<OpControl>& op,
               asio::cancellation_type type) {
  auto comm = impl.lock();
  if (!comm) return;
  asio::post(comm->executor(), [comm, op, type] {
    if (auto o = op.lock()) comm->cancel(o, type);
  });
  comm->thread().owe();
}

// The control of an operation: made when the caller's handler has a cancellation slot (wired to
// it) or the operation has a deadline; null otherwise, so plain operations pay nothing.
std::shared_ptr<OpControl> control_for(const std::shared_ptr<CommImpl>& impl, OpHandler& handler,
                                       std::chrono::milliseconds deadline) {
  if (!impl) return nullptr;
  std::shared_ptr<OpControl> control;
  auto slot = handler.get_cancellation_slot();
  if (slot.is_connected()) {
    control = std::make_shared<OpControl>();
    slot.assign([op = std::weak_ptr<OpControl>(control), comm = std::weak_ptr<CommImpl>(impl)](
                    asio::cancellation_type type) { cancel_op(comm, op, type); });
  }
  if (deadline.count() > 0) {
    if (!control) control = std::make_shared<OpControl>();
    control->deadline = deadline;
    control->start = std::chrono::steady_clock::now();
  }
  return control;
}

// A blocking caller's wait for its operation's handler.
class BlockingWait {
 public:
  OpHandler handler() {
    return OpHandler([result = result_](boost::system::error_code e) {
      result->ec = e;
      result->done.store(1, std::memory_order_release);
      result->done.notify_one();
    });
  }
  // Calls `start` (which initiates the operation with handler()) and waits for the handler. Where
  // it can, the calling thread runs the communicator's loop itself meanwhile (ProxyThread::drive):
  // the operation is queued there directly and a small one over links the loop serves (tcp) costs
  // no hand-off to the proxy thread and back. It sleeps only when the loop is busy elsewhere or
  // nothing has moved for COCCL_SPIN_US. Communicators on the in-memory network (coccl-sim) keep
  // to their proxy thread, where virtual time passes. `start` may be empty: the operation was
  // handed over already.
  void run(const std::shared_ptr<CommImpl>& impl, const std::function<void()>& start,
           std::error_code& ec) {
    const bool driven =
        impl && !impl->on_memory() &&
        impl->thread().drive(start, result_->done, impl->fast_wait(), impl->fast_wait());
    if (!driven && start) start();
    result_->done.wait(0, std::memory_order_acquire);
    ec = result_->ec;
  }

 private:
  struct Result {
    std::atomic<int> done{0};
    std::error_code ec;
  };
  std::shared_ptr<Result> result_ = std::make_shared<Result>();
};

// Why the calling thread may not block on `impl` (an empty code if it may): on a proxy thread it
// would wait for the loop it blocks, and a non-blocking communicator refuses.
std::error_code blocking_refused(const std::shared_ptr<CommImpl>& impl) {
  if (runtime::on_proxy_thread())
    return std::make_error_code(std::errc::resource_deadlock_would_occur);
  if (impl && !impl->blocking()) return std::make_error_code(std::errc::operation_would_block);
  return {};
}

// Waits on the calling thread for an operation that `start` initiates with the handler it is
// given.
template <typename Start>
void wait_for(const std::shared_ptr<CommImpl>& impl, std::error_code& ec, Start start) {
  if ((ec = blocking_refused(impl))) return;
  BlockingWait w;
  w.run(
      impl, [&] { start(w.handler()); }, ec);
}

// Tries the fast path (collectives/fast_path.hpp) on the calling thread: as the proxy thread
// itself, or by borrowing the proxy thread's role while it is idle. `make` gives the handler of
// an operation handed over.
CommImpl::FastResult fast_attempt(const std::shared_ptr<CommImpl>& impl, OpArgs& args,
                                  std::error_code& ec, CommImpl::HandoverSource make) {
  if (!impl->fast_candidate(args)) return CommImpl::FastResult::declined;
  runtime::ProxyThread& t = impl->thread();
  if (t.owned_here()) return impl->run_fast(args, ec, make);
  runtime::ProxyThread::Borrow borrowed(t, impl->fast_wait());
  if (!borrowed) return CommImpl::FastResult::declined;
  return impl->run_fast(args, ec, make);
}

}  // namespace

FastOutcome try_fast(const std::shared_ptr<CommImpl>& impl, OpArgs& args, std::error_code& ec,
                     HandlerSource source) {
  if (!impl) return FastOutcome::declined;
  struct Context {
    const std::shared_ptr<CommImpl>& impl;
    HandlerSource source;
  } context{impl, source};
  switch (fast_attempt(impl, args, ec,
                       {[](void* p) {
                          auto& c = *static_cast<Context*>(p);
                          OpHandler handler = c.source.make(c.source.context);
                          auto control = control_for(c.impl, handler, std::chrono::milliseconds(0));
                          // Constructed in place: an any_completion_handler is never
                          // move-assigned (Boost 1.81 recurses without end there).
                          return CommImpl::Handover{std::move(handler), std::move(control)};
                        },
                        &context})) {
    case CommImpl::FastResult::done:
      return FastOutcome::done;
    case CommImpl::FastResult::handed_over:
      return FastOutcome::handed_over;
    case CommImpl::FastResult::declined:
      break;
  }
  return FastOutcome::declined;
}

bool on_loop(const std::shared_ptr<CommImpl>& impl, const asio::any_io_executor& ex) {
  return impl->thread().in_thread() && ex == impl->executor();
}

void complete_on_loop(const std::shared_ptr<CommImpl>& impl, OpHandler handler,
                      std::error_code ec) {
  struct Completion final : runtime::Ready {
    Completion(OpHandler h, std::error_code e) : handler(std::move(h)), ec(e) {}
    void run() override { std::move(handler)(boost::system::error_code(ec)); }
    OpHandler handler;
    std::error_code ec;
  };
  impl->thread().complete_soon(std::make_unique<Completion>(std::move(handler), ec));
}

bool completes_here(const asio::any_io_executor& ex) {
  // An io_context's executor, as co_spawn and bind_executor store it, with or without a claim
  // of outstanding work.
  using Plain = asio::io_context::executor_type;
  using Counted = std::decay_t<decltype(asio::prefer(std::declval<const Plain&>(),
                                                     asio::execution::outstanding_work.tracked))>;
  if (const auto* e = ex.target<Plain>()) return e->running_in_this_thread();
  if (const auto* e = ex.target<Counted>()) return e->running_in_this_thread();
  return false;
}

void complete_done(const std::shared_ptr<CommImpl>& impl, OpHandler handler, std::error_code ec) {
  runtime::complete_later(impl->executor(), std::move(handler), ec);
  // The loop may be napping while callers borrow its role: without this the handler would wait
  // for the nap's end (up to 1 ms).
  impl->thread().owe();
}

void initiate(const std::shared_ptr<CommImpl>& impl, OpArgs args, OpHandler handler) {
  if (!impl) {
    runtime::complete_later(engine()->thread(0).executor(), std::move(handler),
                            make_error_code(errc::aborted));
    return;
  }
  args.control = control_for(impl, handler, args.deadline);
  impl->submit(std::move(args), std::move(handler));
}

void initiate_group(const std::shared_ptr<CommImpl>& impl, std::vector<OpArgs> ops,
                    std::chrono::milliseconds deadline, OpHandler handler) {
  if (!impl) {
    runtime::complete_later(engine()->thread(0).executor(), std::move(handler),
                            make_error_code(errc::aborted));
    return;
  }
  auto control = control_for(impl, handler, deadline);
  impl->submit_group(std::move(ops), std::move(control), std::move(handler));
}

void throw_op_error(const std::shared_ptr<CommImpl>& impl, std::error_code ec) {
  if (ec == std::errc::resource_deadlock_would_occur)
    throw std::system_error(ec, blocking_on_proxy);
  throw std::system_error(ec, describe_error(impl, ec));
}

void run_blocking(const std::shared_ptr<CommImpl>& impl, OpArgs&& args, std::error_code& ec) {
  if ((ec = blocking_refused(impl))) return;
  if (impl) {
    // Done on this thread, no handler and no hand-over, when the fast path takes it.
    std::optional<BlockingWait> handed;
    switch (fast_attempt(impl, args, ec,
                         {[](void* p) {
                            auto& w = *static_cast<std::optional<BlockingWait>*>(p);
                            return CommImpl::Handover{w.emplace().handler(), nullptr};
                          },
                          &handed})) {
      case CommImpl::FastResult::done:
        return;
      case CommImpl::FastResult::handed_over:
        handed->run(impl, {}, ec);
        return;
      case CommImpl::FastResult::declined:
        break;
    }
  }
  wait_for(impl, ec, [&](OpHandler h) { initiate(impl, std::move(args), std::move(h)); });
}

void run_blocking_group(const std::shared_ptr<CommImpl>& impl, std::vector<OpArgs> ops,
                        std::chrono::milliseconds deadline, std::error_code& ec) {
  wait_for(impl, ec,
           [&](OpHandler h) { initiate_group(impl, std::move(ops), deadline, std::move(h)); });
}

asio::awaitable<void> create_on_proxy(std::shared_ptr<CommImpl> impl,
                                      std::vector<transport::RootAddress> roots) {
  co_await impl->rendezvous(std::move(roots));
}

std::shared_ptr<CommImpl> impl_of(const Communicator& comm) { return comm.impl_; }

UniqueId unique_id_on(runtime::Engine& e) {
  transport::RootAddress root;
  root.secret = make_secret();
  root.address = transport::PeerInfo::from(transport::start_root(
      e.thread(0), asio::ip::tcp::endpoint(transport::local_addresses().front(), 0), root.secret));
  return transport::encode(root);
}

UniqueId memory_unique_id(std::shared_ptr<transport::Traffic> root_traffic) {
  transport::RootAddress root;
  root.secret = make_secret();
  root.address =
      transport::start_memory_root(engine()->thread(0), root.secret, std::move(root_traffic));
  return transport::encode(root);
}

std::shared_ptr<CommImpl> join_on(const std::shared_ptr<runtime::Engine>& e, const UniqueId& id,
                                  int rank, int nranks, std::error_code& ec) {
  std::shared_ptr<CommImpl> impl;
  transport::RootAddress root;
  try {
    root = transport::decode(id);
    impl = std::make_shared<CommImpl>(e, root.secret, rank, nranks, CommunicatorOptions{},
                                      transport::is_memory(root.address));
  } catch (const std::system_error& err) {
    ec = err.code();
    return nullptr;
  }
  std::promise<std::error_code> joined;
  std::vector<transport::RootAddress> roots{root};
  asio::co_spawn(impl->executor(), create_on_proxy(impl, std::move(roots)),
                 [&joined, impl](std::exception_ptr ep) {
                   std::error_code code;
                   if (ep) {
                     try {
                       std::rethrow_exception(ep);
                     } catch (const std::system_error& err) {
                       code = err.code();
                     } catch (const std::exception&) {
                       code = make_error_code(errc::peer_lost);
                     }
                     impl->fail(code, "joining failed", false);
                   }
                   joined.set_value(code);
                 });
  ec = joined.get_future().get();
  return ec ? nullptr : impl;
}

Communicator create_from_book(transport::AddressBook& book, const transport::Secret& secret,
                              int rank, int nranks, bool memory,
                              std::shared_ptr<transport::Traffic> traffic) {
  if (runtime::on_proxy_thread())
    throw std::system_error(std::make_error_code(std::errc::resource_deadlock_would_occur),
                            blocking_on_proxy);
  if (nranks <= 0) invalid("nranks must be positive, got " + std::to_string(nranks));
  if (rank < 0 || rank >= nranks)
    invalid("rank " + std::to_string(rank) + " out of range [0, " + std::to_string(nranks) + ")");
  auto impl = std::make_shared<CommImpl>(engine(), secret, rank, nranks, CommunicatorOptions{},
                                         memory, std::move(traffic));
  // The launcher's calls block: they run here, the communicator's own steps on its thread.
  auto on_proxy = [&](auto fn) { runtime::run_on(impl->thread(), fn); };
  try {
    transport::PeerInfo self{};
    on_proxy([&] { self = impl->peers().self_info(); });
    const transport::DirectoryFrame frame = transport::frame_from_book(book, self, rank, nranks);
    on_proxy([&] { impl->form(frame); });
  } catch (const std::system_error& err) {
    COCCL_WARN(init, rank, "communicator creation failed: %s", err.what());
    on_proxy([&] { impl->fail(err.code(), err.what(), false); });
    throw;
  }
  return CommImpl::handle(impl);
}

void initiate_create(std::vector<UniqueId> ids, int rank, int nranks,
                     const CommunicatorOptions& options, CreateHandler handler,
                     std::shared_ptr<std::string> failure) {
  start_create(std::move(ids), rank, nranks, options, std::move(handler), std::move(failure),
               nullptr);
}

void start_create(std::vector<UniqueId> ids, int rank, int nranks,
                  const CommunicatorOptions& options, CreateHandler handler,
                  std::shared_ptr<std::string> failure,
                  std::shared_ptr<transport::Traffic> traffic) {
  auto e = engine();
  auto fallback = e->thread(0).executor();
  std::vector<transport::RootAddress> roots;
  std::shared_ptr<CommImpl> impl;
  try {
    if (nranks <= 0) invalid("nranks must be positive, got " + std::to_string(nranks));
    if (rank < 0 || rank >= nranks)
      invalid("rank " + std::to_string(rank) + " out of range [0, " + std::to_string(nranks) + ")");
    if (options.timeout.count() < 0) invalid("Options::timeout must not be negative");
    if (ids.empty() || ids.size() > static_cast<std::size_t>(nranks))
      invalid("1 to nranks (" + std::to_string(nranks) + ") ids are usable, got " +
              std::to_string(ids.size()));
    for (std::size_t i = 0; i < ids.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j)
        if (ids[j].bytes == ids[i].bytes)
          invalid("id " + std::to_string(i) + " is the same as id " + std::to_string(j) +
                  " (each root serves one share: pass distinct ids)");
      roots.push_back(transport::decode(ids[i]));
    }
    // The first id's secret is the communicator's.
    impl =
        std::make_shared<CommImpl>(e, roots.front().secret, rank, nranks, options,
                                   transport::is_memory(roots.front().address), std::move(traffic));
  } catch (const std::system_error& err) {
    COCCL_WARN(init, rank, "communicator creation failed: %s", err.what());
    if (failure) *failure = err.what();
    runtime::complete_later(fallback, std::move(handler), err.code(), Communicator());
    return;
  }
  auto ex = impl->executor();
  // The joining coroutine stops on terminal cancellation (the caller's, or the options' timeout
  // expiring); the other ranks' joins then fail with it.
  auto control = std::make_shared<OpControl>();
  control->ex = ex;
  auto slot = handler.get_cancellation_slot();
  if (slot.is_connected()) {
    slot.assign([op = std::weak_ptr<OpControl>(control)](asio::cancellation_type type) {
      auto o = op.lock();
      if (!o || (type & asio::cancellation_type::terminal) == asio::cancellation_type::none) return;
      asio::post(o->ex, [o, type] {
        if (o->state == OpControl::State::done) return;
        o->cancelled = true;
        o->signal.emit(type);
      });
    });
  }
  struct Expiry {
    asio::steady_timer timer;
    bool fired = false;
  };
  std::shared_ptr<Expiry> expiry;
  if (options.timeout.count() > 0) {
    expiry = std::make_shared<Expiry>(Expiry{asio::steady_timer(ex, options.timeout)});
    expiry->timer.async_wait([expiry, control](boost::system::error_code ec) {
      if (ec || control->state == OpControl::State::done) return;
      expiry->fired = true;
      control->signal.emit(asio::cancellation_type::terminal);
    });
  }
  auto boxed = std::make_unique<CreateHandler>(std::move(handler));
  asio::co_spawn(
      ex, create_on_proxy(impl, std::move(roots)),
      asio::bind_cancellation_slot(
          control->signal.slot(), [impl, h = std::move(boxed), fallback, control, expiry, failure,
                                   timeout = options.timeout](std::exception_ptr ep) mutable {
            control->state = OpControl::State::done;
            if (expiry) expiry->timer.cancel();
            std::error_code ec;
            if (ep && expiry && expiry->fired) {
              ec = make_error_code(errc::timed_out);
              impl->fail(ec, "not every rank joined within the timeout of " +
                                 std::to_string(timeout.count()) + " ms (Options::timeout)");
            } else if (ep && control->cancelled) {
              ec = std::make_error_code(std::errc::operation_canceled);
              impl->fail(make_error_code(errc::aborted), "creation cancelled by the caller");
              COCCL_INFO(init, impl->rank(), "communicator creation cancelled");
            } else if (ep) {
              try {
                std::rethrow_exception(ep);
              } catch (const std::system_error& err) {
                ec = err.code();
                impl->fail(ec, err.what(), false);
              } catch (const boost::system::system_error& err) {
                ec = make_error_code(errc::peer_lost);
                impl->fail(ec, err.what(), false);
              } catch (const std::exception& err) {
                ec = make_error_code(errc::internal);
                impl->fail(ec, err.what(), false);
              }
            }
            if (ec && ec != std::errc::operation_canceled) {
              COCCL_WARN(init, impl->rank(), "communicator creation failed: %s",
                         impl->last_error().c_str());
              if (failure) *failure = impl->last_error();
            }
            Communicator c = ec ? Communicator() : CommImpl::handle(impl);
            runtime::complete_later(fallback, std::move(*h), ec, std::move(c));
          }));
}

}  // namespace detail

namespace detail {

Communicator create_blocking(std::vector<UniqueId> ids, int rank, int nranks,
                             const CommunicatorOptions& options) {
  if (runtime::on_proxy_thread())
    throw std::system_error(std::make_error_code(std::errc::resource_deadlock_would_occur),
                            blocking_on_proxy);
  struct Result {
    std::atomic<int> done{0};
    std::error_code ec;
    Communicator comm;
  };
  auto result = std::make_shared<Result>();
  // Carries the reason of a failure back (the completion has only the code).
  auto failure = std::make_shared<std::string>();
  detail::initiate_create(
      std::move(ids), rank, nranks, options,
      [result](boost::system::error_code ec, Communicator c) {
        result->ec = ec;
        result->comm = std::move(c);
        result->done.store(1, std::memory_order_release);
        result->done.notify_one();
      },
      failure);
  result->done.wait(0, std::memory_order_acquire);
  if (result->ec)
    throw std::system_error(
        result->ec, "coccl: rank " + std::to_string(rank) + " could not join the communicator" +
                        (failure->empty() ? std::string() : " (" + *failure + ")"));
  return std::move(result->comm);
}

}  // namespace detail

Communicator Communicator::create(const UniqueId& id, int rank, int nranks,
                                  const Options& options) {
  return detail::create_blocking(std::vector<UniqueId>{id}, rank, nranks, options);
}

namespace {

// The key under which rank 0 publishes the n-th from_env() communicator of this job. Every rank
// makes the same from_env() calls in the same order, so the n-th call names the same
// communicator everywhere; the elastic run id and restart count keep a restarted job from
// reading the id of an earlier attempt out of a store that outlived it.
std::string launcher_key(int call) {
  std::string key = "coccl/from_env";
  for (const char* v : {"TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"})
    if (const char* x = std::getenv(v)) key += std::string("/") + x;
  return key + "/" + std::to_string(call);
}

std::chrono::milliseconds launcher_timeout() {
  const double s = params::timeout_s.get();
  return s > 0 ? std::chrono::duration_cast<std::chrono::milliseconds>(runtime::default_timeout())
               : std::chrono::milliseconds(300000);
}

}  // namespace

Communicator Communicator::from_env() {
  static std::atomic<int> calls{0};
  const int call = calls++;
  int rank = env_int("RANK", env_int("OMPI_COMM_WORLD_RANK", env_int("SLURM_PROCID", -1)));
  int size = env_int("WORLD_SIZE", env_int("OMPI_COMM_WORLD_SIZE", env_int("SLURM_NTASKS", -1)));
  const std::string where = params::comm_id.get();
  const char* master_addr = std::getenv("MASTER_ADDR");
  const char* master_port = std::getenv("MASTER_PORT");

  if (!where.empty()) {
    // An agreed address: rank 0 hosts the root there. Nothing public may stand in for the
    // secret, so it must be given.
    if (rank < 0 || size <= 0)
      invalid(
          "COCCL_COMM_ID is set but the rank is unknown: set RANK and WORLD_SIZE, or run "
          "under mpirun or srun");
    const std::string secret_hex = params::secret.get();
    if (secret_hex.size() != 32)
      invalid(
          "COCCL_COMM_ID needs COCCL_SECRET (32 random hex digits shared by every rank); "
          "under torchrun, leave COCCL_COMM_ID unset and the launcher's store is used");
    const UniqueId id = UniqueId::from_address(where, secret_hex);
    const transport::RootAddress root = transport::decode(id);
    if (rank == 0) {
      // Rank 0 hosts the root on the agreed port, on every interface.
      asio::ip::tcp::endpoint any(root.endpoint().address().is_v4()
                                      ? asio::ip::address(asio::ip::address_v4::any())
                                      : asio::ip::address(asio::ip::address_v6::any()),
                                  root.endpoint().port());
      transport::start_root(engine()->thread(0), any, root.secret);
    }
    return create(id, rank, size);
  }

  const std::string how = params::bootstrap.get();
  if (how != "auto" && how != "root" && how != "launcher")
    invalid("COCCL_BOOTSTRAP is auto, root or launcher, not '" + how + "'");

  if (master_addr && master_port) {
    // torchrun: its TCPStore already listens on MASTER_PORT.
    if (rank < 0 || size <= 0) invalid("MASTER_ADDR is set but RANK or WORLD_SIZE is not");
    const int port = env_int("MASTER_PORT", -1);
    if (port <= 0 || port > 65535)
      invalid(std::string("MASTER_PORT is not a port: ") + master_port);
    transport::TcpStoreClient store(master_addr, static_cast<std::uint16_t>(port),
                                    launcher_timeout());
    const std::string key = launcher_key(call);
    if (how == "launcher") {
      // No root: rank 0's random secret, then every rank's listener, through the store, which
      // also counts the hosts. Not the default: the store is one server, and it then serves
      // O(log N) queries a rank where the root path asks two (docs/design.md, "Bootstrap").
      transport::Secret secret{};
      if (rank == 0) {
        secret = make_secret();
        store.set(key + "/secret", secret_text(secret));
      } else {
        secret = secret_from_text(store.get(key + "/secret"));
      }
      const std::unique_ptr<transport::AddressBook> book =
          transport::store_book(store, key, rank, size);
      return detail::create_from_book(*book, secret, rank, size);
    }
    // Through a root (auto, root): rank 0 publishes a fresh random id (root address and
    // secret); the others read it.
    UniqueId id;
    if (rank == 0) {
      id = UniqueId::create();
      store.set(key, id.to_string());
    } else {
      id = UniqueId::from_string(store.get(key));
    }
    return create(id, rank, size);
  }

  // One PMIx client for the life of the process: a launcher counts a process that initialised
  // PMIx but exits without finalising it as failed, and PMIx may not initialise twice.
  static const std::unique_ptr<transport::PmixClient> pmix = transport::PmixClient::open();
  if (pmix) {
    // mpirun or srun with PMIx: the same exchange through the launcher's key-value space.
    if (rank >= 0 && rank != pmix->rank())
      invalid("the launcher's rank variables disagree with PMIx's rank");
    rank = pmix->rank();
    size = pmix->size();
    const std::string key = launcher_key(call);
    const std::unique_ptr<transport::AddressBook> book =
        transport::pmix_book(*pmix, key, launcher_timeout());
    if (how != "root" && transport::can_form_from(*book, size)) {
      // No root: rank 0's secret, then every rank's listener, through the launcher's table.
      transport::Secret secret{};
      if (rank == 0) {
        secret = make_secret();
        pmix->put(key + "/secret", secret_text(secret));
      }
      pmix->fence(launcher_timeout());
      if (rank != 0) secret = secret_from_text(pmix->get(0, key + "/secret"));
      return detail::create_from_book(*book, secret, rank, size);
    }
    if (how == "launcher")
      invalid("COCCL_BOOTSTRAP=launcher, but the launcher cannot count the hosts of " +
              std::to_string(size) +
              " ranks (COCCL_HOSTID is set, or PMIx lacks pmix.num.nodes) and the directory is "
              "not full (COCCL_DIRECTORY_FULL)");
    UniqueId id;
    if (rank == 0) {
      id = UniqueId::create();
      pmix->put(key, id.to_string());
    }
    pmix->fence(launcher_timeout());
    if (rank != 0) id = UniqueId::from_string(pmix->get(0, key));
    return create(id, rank, size);
  }

  invalid(
      "no launcher found: run under torchrun (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), "
      "under mpirun or srun with PMIx, or set COCCL_COMM_ID=host:port and COCCL_SECRET with "
      "RANK and WORLD_SIZE");
}

int Communicator::rank() const {
  if (!impl_) invalid("empty communicator");
  return impl_->rank();
}

int Communicator::size() const {
  if (!impl_) invalid("empty communicator");
  return impl_->size();
}

boost::asio::any_io_executor Communicator::executor() const {
  if (!impl_) invalid("empty communicator");
  return impl_->executor();
}

BufferRegistration Communicator::register_buffer(void* buffer, std::size_t bytes) {
  if (!impl_) invalid("register_buffer on an empty communicator");
  std::shared_ptr<transport::UserBuffers> buffers = impl_->user_buffers();
  const std::uint64_t handle = buffers->add(buffer, bytes);
  // The guard owns no object: its deleter ends the registration, with the table kept alive.
  std::shared_ptr<void> guard(nullptr, [buffers, handle](void*) { buffers->remove(handle); });
  return BufferRegistration(std::move(guard), buffer, bytes);
}

std::uint64_t Communicator::zero_copy_bytes() const {
  if (!impl_) invalid("empty communicator");
  return impl_->user_buffers()->zero_copy_bytes();
}

std::string Communicator::last_error() const {
  return impl_ ? impl_->last_error() : "empty communicator";
}

CommStatus Communicator::status() const {
  if (!impl_)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "status() of an empty communicator");
  CommStatus status;
  runtime::run_on(impl_->thread(), [&] { status = impl_->status(); });
  return status;
}
std::error_code Communicator::error() const {
  return impl_ ? impl_->error() : make_error_code(errc::aborted);
}

void Communicator::destroy() {
  if (!impl_) return;
  impl_->destroy();
  impl_.reset();
}

void Communicator::abort() {
  if (!impl_) return;
  impl_->abort();
  impl_.reset();
}

}  // namespace coccl
