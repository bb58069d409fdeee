#include "collectives/comm.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cctype>
#include <cstdio>
#include <exception>

#include "collectives/algorithms.hpp"
#include "collectives/comm_params.hpp"
#include "collectives/status_codec.hpp"
#include "runtime/deadline.hpp"
#include "runtime/gate.hpp"
#include "runtime/handoff.hpp"
#include "runtime/log.hpp"

namespace coccl::detail {

namespace {
// COCCL_ALGO (or NCCL_ALGO, whose values are capitalised: "Ring", "Tree") matched without case.
std::string lower_case(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}
}  // namespace

namespace {
// A communicator made on a proxy thread (by a coroutine there: a split) stays on it: waiting on
// another proxy thread from there could close a cycle of threads waiting on each other.
runtime::ProxyThread& thread_for(runtime::Engine& engine) {
  runtime::ProxyThread* here = runtime::current_proxy_thread();
  return here && engine.owns(*here) ? *here : engine.next_thread();
}

// What a peer's status answer says, for error texts.
std::string status_text(std::span<const std::uint8_t> bytes) {
  try {
    const CommStatus s = decode_status(bytes);
    if (!s.error.empty()) return s.error;
    if (s.started == s.finished && s.running_op == "bootstrap" && s.waiting_for >= 0)
      return "still forming the communicator: passing the address table to rank " +
             std::to_string(s.waiting_for);
    if (s.started > s.finished)
      return s.running_op + " #" + std::to_string(s.started) + " running" +
             (s.waiting_for >= 0 ? ", waiting for rank " + std::to_string(s.waiting_for)
                                 : std::string());
    return "idle after operation #" + std::to_string(s.finished);
  } catch (const std::exception& e) {
    return std::string("an unreadable status (") + e.what() + ")";
  }
}

}  // namespace

CommImpl::CommImpl(std::shared_ptr<runtime::Engine> engine, const transport::Secret& secret,
                   int rank, int nranks, const CommunicatorOptions& options, bool memory,
                   std::shared_ptr<transport::Traffic> traffic)
    : engine_(std::move(engine)),
      thread_(thread_for(*engine_)),
      memory_(memory),
      roots_traffic_(!memory   ? nullptr
                     : traffic ? traffic->spawn()
                               : std::make_shared<transport::Traffic>()),
      ex_(thread_.executor()),
      rank_(rank),
      size_(nranks),
      watchdog_(ex_),
      trace_(static_cast<std::size_t>(std::max<std::int64_t>(1, params::colltrace_size.get()))),
      algo_(lower_case(params::algo.get())),
      oneshot_max_(static_cast<std::size_t>(std::max<std::int64_t>(0, params::oneshot_max.get()))),
      direct_max_ranks_(
          static_cast<int>(std::clamp<std::int64_t>(params::direct_max_ranks.get(), 1, 1 << 30))),
      fast_max_(static_cast<std::size_t>(std::max<std::int64_t>(0, params::fast_max_bytes.get()))),
      fast_wait_(std::chrono::microseconds(std::max<std::int64_t>(0, params::spin_us.get()))),
      timeout_(options.timeout.count() > 0 ? std::chrono::steady_clock::duration(options.timeout)
                                           : runtime::default_timeout()),
      blocking_(options.blocking),
      name_(options.name) {
  transport::LinkOptions opts{
      options.transport.empty() ? params::transport.get() : options.transport,
      static_cast<std::size_t>(std::max<std::int64_t>(2, params::slots.get())),
      static_cast<std::size_t>(std::max<std::int64_t>(4096, params::slot_bytes.get())) / 64 * 64,
      memory, std::move(traffic)};
  // Left at its default, the slot size grows where every link turns out to cross the network
  // (Peers decides once the address table says so): a tcp chunk costs a frame, a credit and
  // wake-ups whatever its size, and 512 KiB chunks moved the same bytes up to 15% faster than
  // 256 KiB ones over tcp from 4 MiB up (docs/performance.md). Shared memory keeps 256 KiB: its
  // 2-rank all_reduce of 1 MiB pipelines two chunks a segment and slowed by a quarter with one. A
  // budget set for the rings (COCCL_MEM_BUDGET) keeps the slots it was set for.
  if (!params::slot_bytes.is_set() && !params::mem_budget.is_set())
    opts.network_slot_bytes = 512 << 10;
  if (opts.transport != "auto" && opts.transport != "tcp" && opts.transport != "shm" &&
      opts.transport != "ib")
    throw std::system_error(
        make_error_code(errc::invalid_argument),
        "the transport (COCCL_TRANSPORT or Options::transport) must be auto, tcp, shm or ib, "
        "not '" +
            opts.transport + "'");
  // Peers registers a poller on the proxy thread, so it is built there.
  auto build = [&] {
    peers_ = std::make_unique<transport::Peers>(
        thread_, secret, rank, nranks, opts,
        [this](int peer, std::error_code ec, const std::string& why) {
          (void)peer;
          fail(ec, why);
        });
  };
  runtime::run_on(thread_, build);
}

CommImpl::~CommImpl() {
  // The sockets, timers and pollers belong to the proxy thread: release them there.
  auto release = [this] {
    fast_.end();  // its hold on the links goes before them
    watchdog_.cancel();
    if (event_poller_) thread_.remove_poller(event_poller_.get());
    event_poller_.reset();
    if (net_poller_) thread_.remove_poller(net_poller_.get());
    net_poller_.reset();
    peers_.reset();
  };
  runtime::run_on(thread_, release);
}

void CommImpl::serve_status() {
  peers_->set_status_source([w = weak_from_this()]() -> std::vector<std::uint8_t> {
    auto self = w.lock();
    // Nothing until the table is here: the asker reads that as "has not formed".
    if (!self || !self->peers().formed()) return {};
    return encode_status(self->status());
  });
  peers_->set_status_reader(status_text);
}

asio::awaitable<void> CommImpl::rendezvous(std::vector<transport::RootAddress> roots) {
  serve_status();
  co_await peers_->rendezvous(std::move(roots));
  learn_topology();
}

void CommImpl::form(const transport::DirectoryFrame& frame) {
  serve_status();
  peers_->form(frame);
  learn_topology();
}

void CommImpl::learn_topology() {
  one_host_ = peers_->hosts() == 1;
  const int local = peers_->host_ranks();
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int usable = ::sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  crowded_ = local > usable;
}

bool CommImpl::watched() const noexcept {
  return draining_ || device_status_.load(std::memory_order_relaxed) != nullptr;
}

void CommImpl::blame(int peer, std::chrono::steady_clock::time_point since, std::string what) {
  const std::optional<transport::PeerInfo> where = peers_->address_of(peer);
  if (!where) {
    fail(make_error_code(errc::timed_out), what);
    return;
  }
  // Copies only: the communicator may be destroyed while the question is out.
  asio::co_spawn(
      ex_,
      [self = shared_from_this(), where = *where, secret = peers_->secret(), peer, since,
       what = std::move(what)]() -> asio::awaitable<void> {
        const std::string about = co_await transport::Peers::describe_rank(
            self->ex_, peer, where, secret, status_text,
            std::chrono::steady_clock::now() + std::chrono::milliseconds(500));
        if (self->closed_ || !self->peers_ || self->error()) co_return;
        // The peer moved meanwhile: nothing to blame, the watch goes on.
        bool still = false;
        for (const auto& c : self->peers_->connections())
          if (c->peer() == peer && c->blocked_since() && *c->blocked_since() <= since) still = true;
        if (!still) {
          if (self->watched()) self->arm_watchdog();
          co_return;
        }
        self->fail(make_error_code(errc::timed_out), what + "; " + about);
      },
      asio::detached);
}

void CommImpl::arm_watchdog() {
  // A drain starting while the last tick is still pending keeps that tick: its check is as good
  // as a new one, and the drain costs no timer.
  if (watchdog_armed_) return;
  watchdog_armed_ = true;
  auto period = std::clamp<std::chrono::steady_clock::duration>(
      timeout_ / 8, std::chrono::milliseconds(10), std::chrono::seconds(1));
  watchdog_.expires_after(period);
  watchdog_.async_wait([w = weak_from_this()](boost::system::error_code ec) {
    auto self = w.lock();
    if (!self) return;
    // Cancelled only once the communicator has failed or is being destroyed, when nothing needs
    // watching any more: a drain that found the flag still set meanwhile loses nothing.
    self->watchdog_armed_ = false;
    if (ec || self->error() || !self->peers_) return;
    auto now = std::chrono::steady_clock::now();
    for (const auto& c : self->peers_->connections()) {
      auto since = c->blocked_since();
      if (since && now - *since > self->timeout_) {
        double s = std::chrono::duration<double>(now - *since).count();
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "no progress from rank %d for %.1f s (COCCL_TIMEOUT) in %s #%llu", c->peer(),
                      s, self->op_name_, static_cast<unsigned long long>(self->seq_));
        self->blame(c->peer(), *since, buf);
        return;
      }
    }
    // Idle, the communicator lets the watchdog lapse (with hundreds of thousands of them on one
    // proxy thread, ticks of idle ones would be most of its work); the next drain arms it again.
    if (self->watched()) self->arm_watchdog();
  });
}

std::string& argument_error() noexcept {
  thread_local std::string text;
  return text;
}

void CommImpl::submit(OpArgs args, OpHandler handler) {
  if (std::string why = validate(args, rank_, size_); !why.empty()) {
    COCCL_WARN(coll, rank_, "%s: %s", name_of(args.kind), why.c_str());
    argument_error() = std::string(name_of(args.kind)) + ": " + why;
    // Nothing was sent; the handler still runs outside this call, on its own executor.
    runtime::complete_later(ex_, std::move(handler), make_error_code(errc::invalid_argument));
    return;
  }
  // The handler travels boxed: a lambda holding an any_completion_handler by value looks
  // copyable to Asio, and copying one wraps it in itself.
  if (thread_.in_thread()) {
    // Already on the proxy thread (a coroutine awaiting on the communicator's executor): queue
    // directly. Completion still happens later, from the drain coroutine.
    if (closed_ || !peers_) {
      runtime::complete_later(ex_, std::move(handler), make_error_code(errc::aborted));
      return;
    }
    enqueue(std::move(args), std::move(handler));
    return;
  }
  auto boxed = std::make_unique<OpHandler>(std::move(handler));
  in_transit_.fetch_add(1, std::memory_order_relaxed);
  asio::post(ex_,
             [self = shared_from_this(), args = std::move(args), h = std::move(boxed)]() mutable {
               self->in_transit_.fetch_sub(1, std::memory_order_relaxed);
               if (self->closed_ || !self->peers_) {
                 self->complete(*h, make_error_code(errc::aborted));
                 return;
               }
               self->enqueue(std::move(args), std::move(*h));
             });
  // A caller waits for it: a thread holding the proxy thread's role gives it back soon.
  thread_.owe();
}

bool CommImpl::fast_candidate(const OpArgs& a) const noexcept {
  if (fast_max_ == 0 || a.count == 0 || a.deadline.count() > 0 || !is_valid(a.type)) return false;
  if (a.kind != OpKind::all_reduce && a.kind != OpKind::all_gather &&
      a.kind != OpKind::reduce_scatter && a.kind != OpKind::all_to_all)
    return false;
  // A product, not a quotient: a division was 7% of a small blocking all_reduce on one rank.
  std::size_t bytes = 0;
  return !__builtin_mul_overflow(a.count, size_of(a.type), &bytes) && bytes <= fast_max_;
}

CommImpl::FastResult CommImpl::run_fast(OpArgs& args, std::error_code& ec,
                                        HandoverSource handover) {
  // Idle: nothing queued or running here, nothing on its way from another thread (the role
  // orders this read after the increment of a submit that this caller made earlier), healthy.
  if (closed_ || !peers_ || !queue_.empty() || seq_ != finished_ ||
      in_transit_.load(std::memory_order_relaxed) != 0 || error())
    return FastResult::declined;
  // Coarse: the links' last use counts in seconds, and the trace's start is provisional (below).
  // A precise read (about 20 ns) was a fifth of a blocking call on one rank, before the first put.
  const auto now = runtime::coarse_now();
  if (!fast_candidate(args) || !validate(args, rank_, size_).empty() || !fast_.prepare(args, now))
    return FastResult::declined;
  begin_op(args, now);
  fast_.start(args);
  const bool done = fast_.run_for(fast_wait_, thread_, crowded_);
  // An operation that waited starts in the trace when its wait began (read while it waits, a
  // fraction of a microsecond after it started); one handed over before that reads the clock now;
  // one done before that (at its first step or within a few polls) took no time the trace's
  // microseconds can show, and keeps its provisional start as its end.
  const auto waited_since = fast_.waited_since();
  if (waited_since)
    trace_.restart(seq_, *waited_since);
  else if (!done)
    trace_.restart(seq_, std::chrono::steady_clock::now());
  if (done) {
    fast_.end();
    // A time point, not an optional one: the optional's flag, stored as a byte and loaded back
    // as part of a word, stalled the call (no store forwarding) for a tenth of its time.
    end_op(true, waited_since ? std::chrono::steady_clock::now() : now);
    ++fast_done_;
    ec.clear();
    return FastResult::done;
  }
  // The rest runs first on the proxy thread, ahead of anything submitted after it.
  Handover h = handover.make(handover.context);
  if (h.control) h.control->state = OpControl::State::running;
  // The caller's arguments go with the operation; the checks follow them there.
  OpArgs& kept = fast_.adopt(std::move(args));
  checks_.rebind(kept);
  kept.control = std::move(h.control);
  queue_.push_front(Queued{OpArgs{}, std::move(h.handler), true});
  ++fast_handed_;
  if (!draining_) {
    draining_ = true;
    asio::co_spawn(ex_, drain(), asio::detached);
  }
  // The caller waits for the proxy thread's loop now: the next thread to borrow the role must not
  // keep it from that loop (it could be waiting for a peer that waits for this operation).
  thread_.owe();
  return FastResult::handed_over;
}

void CommImpl::begin_op(const OpArgs& args, std::chrono::steady_clock::time_point now) {
  ++seq_;
  const FingerprintKey key{args.kind, args.type, args.op, args.root, args.count};
  if (fingerprint_key_ != key) {
    fingerprint_ = fingerprint_of(args);
    fingerprint_key_ = key;
  }
  checks_.begin(args, seq_);
  op_name_ = name_of(args.kind);
  trace_.begin(seq_, op_name_, args.count, static_cast<int>(args.type), args.root, now);
}

void CommImpl::end_op(bool ok, std::chrono::steady_clock::time_point at) {
  trace_.end(seq_, ok, at);
  finished_ = seq_;
}

void CommImpl::enqueue(OpArgs args, OpHandler handler) {
  if (args.control && args.control->cancelled) {
    finished(*args.control);
    runtime::complete_later(ex_, std::move(handler),
                            std::make_error_code(std::errc::operation_canceled));
    return;
  }
  if (args.control) arm_deadline(args.control);
  queue_.push_back(Queued{std::move(args), std::move(handler)});
  if (!draining_) {
    draining_ = true;
    asio::co_spawn(ex_, drain(), asio::detached);
  }
}

void CommImpl::cancel(const std::shared_ptr<OpControl>& op, asio::cancellation_type type) {
  if (op->state == OpControl::State::done) return;
  if (op->state == OpControl::State::queued) {
    op->cancelled = true;
    // Every member of a group shares `op`: all leave the queue. Members still on their way to
    // the queue are dropped by enqueue().
    std::vector<OpHandler> removed;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->args.control != op) {
        ++it;
        continue;
      }
      removed.push_back(std::move(it->handler));
      it = queue_.erase(it);
    }
    if (removed.empty()) return;
    COCCL_INFO(coll, rank_, "an operation cancelled before it started was removed");
    for (auto& h : removed) {
      finished(*op);
      runtime::complete_later(ex_, std::move(h),
                              std::make_error_code(std::errc::operation_canceled));
    }
    return;
  }
  // In flight: its data may be partly delivered, so only terminal cancellation acts, by
  // aborting the communicator; every rank's operation then fails.
  if ((type & asio::cancellation_type::terminal) == asio::cancellation_type::none) return;
  closed_ = true;
  char text[160];
  std::snprintf(text, sizeof text,
                "%s #%llu cancelled by the caller (terminal cancellation); communicator aborted",
                op_name_, static_cast<unsigned long long>(seq_));
  fail(make_error_code(errc::aborted), text);
}

void CommImpl::finished(OpControl& op) {
  if (op.pending > 0 && --op.pending > 0) return;
  op.state = OpControl::State::done;
  if (op.timer) op.timer->cancel();
}

void CommImpl::arm_deadline(const std::shared_ptr<OpControl>& op) {
  if (op->deadline.count() <= 0 || op->timer) return;
  op->timer = std::make_unique<asio::steady_timer>(ex_, op->start + op->deadline);
  op->timer->async_wait([w = weak_from_this(),
                         o = std::weak_ptr<OpControl>(op)](boost::system::error_code ec) {
    auto self = w.lock();
    auto op = o.lock();
    if (ec || !self || !op || op->state == OpControl::State::done) return;
    // As terminal cancellation: the operation may be partly delivered, so the communicator
    // stops, and every rank's operation fails.
    self->closed_ = true;
    char text[200];
    if (op->state == OpControl::State::running)
      std::snprintf(text, sizeof text,
                    "%s #%llu passed its deadline of %lld ms (with_deadline); communicator aborted",
                    self->op_name_, static_cast<unsigned long long>(self->seq_),
                    static_cast<long long>(op->deadline.count()));
    else
      std::snprintf(text, sizeof text,
                    "an operation queued behind #%llu passed its deadline of %lld ms "
                    "(with_deadline); communicator aborted",
                    static_cast<unsigned long long>(self->seq_),
                    static_cast<long long>(op->deadline.count()));
    self->fail(make_error_code(errc::timed_out), text);
  });
}

void CommImpl::submit_group(std::vector<OpArgs> ops, std::shared_ptr<OpControl> control,
                            OpHandler handler) {
  for (const OpArgs& a : ops) {
    if (std::string why = validate(a, rank_, size_); !why.empty()) {
      COCCL_WARN(coll, rank_, "group: %s: %s", name_of(a.kind), why.c_str());
      argument_error() = std::string("group: ") + name_of(a.kind) + ": " + why;
      runtime::complete_later(ex_, std::move(handler), make_error_code(errc::invalid_argument));
      return;
    }
  }
  if (ops.empty()) {
    runtime::complete_later(ex_, std::move(handler), std::error_code());
    return;
  }
  // The members complete on this thread, in order; the last one completes the caller's handler
  // with the first error.
  struct Join {
    std::size_t left;
    std::error_code first;
    OpHandler handler;
  };
  auto join = std::make_shared<Join>(Join{ops.size(), {}, std::move(handler)});
  if (control) control->pending = ops.size();
  std::vector<Queued> members;
  members.reserve(ops.size());
  for (OpArgs& a : ops) {
    a.control = control;
    members.push_back(Queued{std::move(a), OpHandler([join](boost::system::error_code ec) {
                               if (ec && !join->first) join->first = ec;
                               if (--join->left == 0)
                                 runtime::complete(std::move(join->handler), join->first);
                             })});
  }
  auto enqueue_all = [](CommImpl& self, std::vector<Queued>& members) {
    for (Queued& q : members) {
      if (self.closed_ || !self.peers_) {
        if (q.args.control) self.finished(*q.args.control);
        self.complete(q.handler, make_error_code(errc::aborted));
        continue;
      }
      self.enqueue(std::move(q.args), std::move(q.handler));
    }
  };
  if (thread_.in_thread()) {
    enqueue_all(*this, members);
    return;
  }
  in_transit_.fetch_add(1, std::memory_order_relaxed);
  asio::post(ex_,
             [self = shared_from_this(),
              members = std::make_shared<std::vector<Queued>>(std::move(members)), enqueue_all]() {
               self->in_transit_.fetch_sub(1, std::memory_order_relaxed);
               enqueue_all(*self, *members);
             });
  thread_.owe();
}
void CommImpl::complete(OpHandler& h, std::error_code ec) {
  // Straight to the handler's own executor (the caller's io_context, or inline for plain
  // callbacks). Dispatching through ex_ would keep a work-tracking copy of the caller's executor
  // on this thread until after the handler ran, and the caller may destroy its io_context as soon
  // as the handler has run; runtime::complete also keeps the handler from running before this
  // thread is done waking that io_context.
  runtime::complete(std::move(h), ec);
}

asio::awaitable<void> CommImpl::drain() {
  auto self = shared_from_this();
  arm_watchdog();
  for (;;) {
    if (queue_.empty()) {
      // A coroutine awaiting on this thread starts its next operation only after this one's
      // completion has run; one trip through the executor lets it, so back-to-back operations
      // reuse this drain instead of spawning a new one each.
      co_await asio::post(ex_, asio::use_awaitable);
      if (queue_.empty()) break;
    }
    Queued q = std::move(queue_.front());
    queue_.pop_front();
    // A fast-path operation was begun when it was handed over; its arguments stay with it.
    OpArgs& args = q.fast ? fast_.args() : q.args;
    if (auto ec = error()) {
      if (args.control) finished(*args.control);
      if (q.fast) {
        fast_.end();
        end_op(false);
      }
      complete(q.handler, ec);
      continue;
    }
    if (!q.fast) {
      if (args.control) args.control->state = OpControl::State::running;
      begin_op(args);
    }
    std::error_code ec;
    try {
      if (q.fast)
        co_await fast_.finish();
      else
        co_await run_op(*this, args);
    } catch (const std::system_error& e) {
      // Algorithms fail the communicator before they throw; this covers anything else.
      fail(e.code(), e.what());
      ec = error();
    } catch (const std::exception& e) {
      fail(make_error_code(errc::internal), e.what());
      ec = error();
    }
    std::shared_ptr<OpControl> control = args.control;
    if (q.fast) fast_.end();
    // The caller may exit on this error: let held-back abort notices reach the peers first.
    if (ec && peers_) co_await peers_->flush_notices(std::chrono::seconds(1));
    end_op(!ec);
    if (control) finished(*control);
    complete(q.handler, ec);
  }
  draining_ = false;
  if (after_drain_) {
    auto next = std::move(after_drain_);
    after_drain_ = nullptr;
    next();
  }
}

std::optional<std::string> CommImpl::record_failure(std::error_code ec, const std::string& why) {
  std::lock_guard lock(error_mutex_);
  if (error_) return std::nullopt;
  error_ = ec;
  error_text_ =
      "rank " + std::to_string(rank_) + (name_.empty() ? "" : " of '" + name_ + "'") + ": " + why;
  failed_.store(true, std::memory_order_release);
  return error_text_;
}

void CommImpl::fail(std::error_code ec, const std::string& why, bool notify) {
  if (auto text = record_failure(ec, why)) after_failure(ec, *text, notify);
}

void CommImpl::after_failure(std::error_code ec, const std::string& text, bool notify) {
  // A peer leaving while nothing runs here (it destroyed its communicator first) is routine.
  if (ec != errc::aborted && draining_) {
    COCCL_WARN(coll, rank_, "communicator failed: %s", text.c_str());
    COCCL_WARN(coll, rank_, "colltrace %s", trace_.json(rank_).c_str());
  } else {
    COCCL_INFO(coll, rank_, "communicator closed: %s", text.c_str());
  }
  watchdog_.cancel();
  if (peers_) peers_->shutdown(ec, text, notify);
  // Kernels still waiting on the device (for a peer that is gone, or that will now never launch
  // its side) return instead of waiting out their deadline.
  if (device::Status* s = device_status_.load(std::memory_order_acquire)) {
    std::atomic_ref<std::uint32_t>(s->abort).store(1, std::memory_order_release);
  }
}

void CommImpl::set_device_status(device::Status* status,
                                 std::function<const char*(std::uint64_t)> op_of_seq) {
  op_of_seq_ = std::move(op_of_seq);
  device_status_.store(status, std::memory_order_release);
  // Failed before the kernels could be told: they must not wait for peers that are gone.
  if (error()) std::atomic_ref<std::uint32_t>(status->abort).store(1, std::memory_order_release);
  // Kernels may now give up a wait while no host operation runs; the watchdog's error() takes
  // that failure in and tells the peers (whose kernels then return), so it ticks from now on.
  asio::post(ex_, [w = weak_from_this()] {
    if (auto self = w.lock()) self->arm_watchdog();
  });
}

void CommImpl::take_device_failure() {
  device::Status* s = device_status_.load(std::memory_order_acquire);
  if (s == nullptr) return;
  // The kernel writes every other field before error (with a system-scope fence between).
  const std::uint32_t why =
      std::atomic_ref<std::uint32_t>(s->error).load(std::memory_order_acquire);
  if (why == 0) return;
  const bool timed_out = why == device::Status::timed_out;
  const char* op = op_of_seq_(s->seq);
  if (*op == 0) op = device::op_name(s->op);
  // A kernel of the network path waits for its own proxy (peer -1), which waits for the peers.
  const std::string whom =
      s->peer >= 0 ? "rank " + std::to_string(s->peer) : std::string("the network proxy");
  char text[256];
  std::snprintf(
      text, sizeof text, "device %s #%llu %s: block %u waited %.3f s for %s (COCCL_TIMEOUT %.3g s)",
      op, static_cast<unsigned long long>(s->seq), timed_out ? "timed out" : "aborted", s->block,
      s->waited_ns / 1e9, whom.c_str(), std::chrono::duration<double>(timeout_).count());
  const std::error_code ec = make_error_code(timed_out ? errc::timed_out : errc::aborted);
  auto full = record_failure(ec, text);
  if (!full) return;
  COCCL_WARN(coll, rank_, "%s", full->c_str());
  // The links and the watchdog belong to the proxy thread.
  asio::post(ex_, [self = weak_from_this(), ec, full = *full] {
    if (auto c = self.lock()) c->after_failure(ec, full, true);
  });
}

CommStatus CommImpl::status() {
  CommStatus s;
  s.rank = rank_;
  s.nranks = size_;
  s.name = name_;
  s.pid = static_cast<int>(::getpid());
  s.error = last_error();
  s.started = seq_;
  s.finished = finished_;
  s.queued = queue_.size();
  s.fast_ops = fast_done_;
  s.fast_handed_over = fast_handed_;
  s.trace = trace_.entries();
  if (s.started > s.finished) {
    s.running_op = op_name_;
    if (!s.trace.empty() && s.trace.back().seq == seq_) s.running_us = s.trace.back().us;
  }
  if (peers_) {
    const auto links = peers_->link_stats();
    s.links_open = links.open;
    s.links_opened = links.opened;
    s.links_closed_budget = links.closed_budget;
    s.links_closed_idle = links.closed_idle;
    s.ring_bytes = links.ring_bytes;
    s.mem_budget = links.budget;
    const auto now = std::chrono::steady_clock::now();
    for (const auto& c : peers_->connections()) {
      const auto since = c->blocked_since();
      if (!since) continue;
      const auto us = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(now - *since).count());
      if (s.waiting_for < 0 || us > s.waiting_us) {
        s.waiting_for = c->peer();
        s.waiting_us = us;
      }
    }
    // No data awaited: the running operation may be waiting for a link to be made.
    if (s.waiting_for < 0 && s.started > s.finished) {
      s.waiting_for = peers_->linking_to();
      if (s.waiting_for >= 0) s.waiting_us = s.running_us;
    }
  }
  std::function<std::vector<TraceEntry>()> device;
  {
    std::lock_guard lock(device_trace_mutex_);
    device = device_trace_;
  }
  if (device) {
    auto d = device();
    s.trace.insert(s.trace.end(), std::make_move_iterator(d.begin()),
                   std::make_move_iterator(d.end()));
  }
  return s;
}

void CommImpl::set_device_trace(std::function<std::vector<TraceEntry>()> trace) {
  std::lock_guard lock(device_trace_mutex_);
  device_trace_ = std::move(trace);
}

void CommImpl::check() const {
  std::lock_guard lock(error_mutex_);
  if (error_) throw LinkError(error_, error_text_);
}

std::string CommImpl::last_error() {
  take_device_failure();
  std::lock_guard lock(error_mutex_);
  return error_text_;
}

std::error_code CommImpl::error() {
  take_device_failure();
  if (!failed_.load(std::memory_order_acquire)) return {};
  std::lock_guard lock(error_mutex_);
  return error_;
}

void CommImpl::abort() {
  auto work = [this] {
    closed_ = true;
    fail(make_error_code(errc::aborted), "aborted by the application");
  };
  runtime::run_on(thread_, work);
}

void CommImpl::destroy() {
  if (thread_.in_thread())
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "destroy() would wait for itself on the proxy thread; use abort()");
  // Operations already queued finish first (or fail by their deadline); then the links close
  // with a goodbye, no abort notice. Every step of that holds a pass of `closing`, so the caller
  // returns once the last one is done (or dropped unrun, with the proxy thread's context).
  runtime::Gate closing;
  auto close_quietly = [this, pass = closing.enter()] {
    record_failure(make_error_code(errc::aborted), "communicator destroyed");
    watchdog_.cancel();
    if (!peers_) return;
    peers_->shutdown(make_error_code(errc::aborted), "destroyed", false);
    // A goodbye queued behind a frame in flight must leave before the caller may exit the
    // process; without it the peers would read the closed stream as a lost rank.
    asio::co_spawn(ex_, peers_->flush_notices(std::chrono::seconds(1)),
                   [pass](std::exception_ptr) {});
  };
  asio::post(ex_, [this, close_quietly = std::move(close_quietly)] {
    closed_ = true;
    if (draining_)
      after_drain_ = close_quietly;
    else
      close_quietly();
  });
  closing.close_and_wait();
}

}  // namespace coccl::detail
