#include "runtime/engine.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <optional>

#include "runtime/log.hpp"

namespace coccl::params {

config::Param<std::int64_t> proxy_threads{
    "COCCL_PROXY_THREADS", 1, "proxy threads of the process engine (communicators are spread)"};
config::Param<std::int64_t> spin_us{
    "COCCL_SPIN_US", 2000,
    "microseconds a proxy thread polls without progress before it sleeps on its event sources, "
    "and a blocking caller running the loop itself before it hands the rest to the proxy thread; "
    "also how long an operation on the fast path of small operations spins for its peers (and "
    "its caller for the proxy thread's role) before the proxy thread takes it over"};

}  // namespace coccl::params

namespace coccl::runtime {

namespace {
// The proxy thread this thread runs (null on other threads, borrowers included).
thread_local ProxyThread* current = nullptr;
// The proxy thread whose role this thread holds (its own, or one it borrowed).
thread_local const ProxyThread* role_held = nullptr;
}  // namespace

bool on_proxy_thread() noexcept { return current != nullptr; }

ProxyThread* current_proxy_thread() noexcept { return current; }

bool ProxyThread::owned_here() const noexcept { return role_held == this; }

void ProxyThread::lend_if_asked() noexcept {
  // Owed a round, the loop keeps the role (Borrow does not take it then either).
  if (asking_.load(std::memory_order_relaxed) == 0 || owed_.load(std::memory_order_relaxed)) return;
  release_role();
  // hold_role() would win the race against a borrower that has not tried again yet. Owed a round
  // meanwhile, the loop takes the role back: no borrower takes it then.
  while (holder_.load(std::memory_order_relaxed) == free_role &&
         asking_.load(std::memory_order_relaxed) > 0 && !owed_.load(std::memory_order_relaxed))
    cpu_relax();
  hold_role();
}

bool ProxyThread::wanted() const noexcept {
  if (asking_.load(std::memory_order_relaxed) > 0) return true;
  // Work handed to the loop waits until the holder returns; on the proxy thread itself (a handler
  // of the loop) it runs right after, whatever the flag says.
  if (!in_thread() && owed_.load(std::memory_order_relaxed)) return true;
  if (io_parked_.load(std::memory_order_relaxed) > 0) return true;
  return pollers_waiting();
}

void ProxyThread::owe() noexcept {
  owed_.store(true, std::memory_order_seq_cst);
  // Paired with hold_role(): it sets napping_ and then reads owed_, this sets owed_ and then reads
  // napping_ (both sequentially consistent), so either the nap is not begun or it is woken.
  if (napping_.load(std::memory_order_seq_cst)) wake_nap();
}

void ProxyThread::wake_nap() noexcept {
  nap_word_.fetch_add(1, std::memory_order_seq_cst);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&nap_word_), FUTEX_WAKE_PRIVATE, 1, nullptr,
            nullptr, 0);
}

void ProxyThread::hold_role() noexcept {
  for (bool yielded = false;; yielded = true) {
    int expected = free_role;
    if (holder_.compare_exchange_weak(expected, proxy_role, std::memory_order_acquire,
                                      std::memory_order_relaxed))
      return;
    if (!yielded || holder_.load(std::memory_order_relaxed) != borrowed_role) {
      // A borrower runs: it needs a core more than this loop does.
      ::sched_yield();
      continue;
    }
    // Still borrowed after a yield: a caller is running small operations back to back. Spinning
    // here took a core from the ranks that callers wait for (with ranks outnumbering cores, 40% of
    // a 4-rank run's time went to yielding proxy threads), so sleep until woken (owe(), or a
    // borrower leaving while pollers wait) or for at most 1 ms: the loop's sockets and timers are
    // served that late at worst while callers keep the role busy. Every nap that ends is a context
    // switch and a round that keeps the role from the callers: with a 100 us nap, 4 ranks on 2
    // cores took 12.7-14 us per small blocking all_reduce, with 1 ms 10-12.3 (docs/performance.md).
    nap(true);
  }
}

void ProxyThread::nap(bool while_borrowed) noexcept {
  const std::uint32_t word = nap_word_.load(std::memory_order_seq_cst);
  napping_.store(true, std::memory_order_seq_cst);
  if (!owed_.load(std::memory_order_seq_cst) &&
      (!while_borrowed || holder_.load(std::memory_order_seq_cst) == borrowed_role)) {
    timespec limit{0, 1'000'000};
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&nap_word_), FUTEX_WAIT_PRIVATE, word,
              &limit, nullptr, 0);
  }
  napping_.store(false, std::memory_order_relaxed);
}

ProxyThread::Borrow::Borrow(ProxyThread& t, std::chrono::nanoseconds patience) noexcept
    : t_(t), held_(t.take_role(patience, false)) {}

ProxyThread::Borrow::~Borrow() {
  if (held_) t_.give_back_role();
}

bool ProxyThread::take_role(std::chrono::nanoseconds patience, bool even_if_owed) noexcept {
  // A proxy thread's own role is not lent to itself or to another proxy thread's handlers (they
  // would stop their own loop while they wait).
  if (current || role_held) return false;
  // Owed a round, the proxy thread goes first (unless the taker runs that round itself): someone
  // waits for the work it was handed. Asleep in the io_context, it holds the role until something
  // wakes it.
  auto take = [this, even_if_owed] {
    int expected = free_role;
    return (even_if_owed || !owed_.load(std::memory_order_relaxed)) &&
           holder_.compare_exchange_weak(expected, borrowed_role, std::memory_order_acquire,
                                         std::memory_order_relaxed);
  };
  bool held = false;
  if (take()) {
    held = true;
  } else {
    // Asking makes the loop lend the role at its next round (lend_if_asked). The clock is read
    // only if the role does not come soon.
    std::optional<std::chrono::steady_clock::time_point> until;
    asking_.fetch_add(1, std::memory_order_relaxed);
    for (unsigned tries = 1;; ++tries) {
      if (asleep_.load(std::memory_order_relaxed)) break;
      if (take()) {
        held = true;
        break;
      }
      if ((tries & 63) == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (!until) until = now + patience;
        if (now >= *until) break;
        // The proxy thread may share this core: let it reach the point where it lets go.
        ::sched_yield();
      } else {
        cpu_relax();
      }
    }
    asking_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (held) role_held = this;
  return held;
}

void ProxyThread::give_back_role() noexcept {
  // Coroutines parked on the loop's pollers, and completions listed for it (complete_soon), wait
  // for it: a napping proxy thread is woken now rather than at the end of its nap. Read while
  // the role is still held (both are the loop's state).
  const bool loop_awaited = pollers_waiting() || !ready_.empty();
  role_held = nullptr;
  lent_.store(true, std::memory_order_relaxed);
  // Sequentially consistent, paired with hold_role()'s napping_ store and holder_ load: either the
  // nap sees the role free and is not begun, or this sees napping_ and wakes it.
  holder_.store(free_role, std::memory_order_seq_cst);
  if (loop_awaited && napping_.load(std::memory_order_seq_cst)) wake_nap();
}

bool ProxyThread::drive(const std::function<void()>& start, const std::atomic<int>& done,
                        std::chrono::nanoseconds patience, std::chrono::nanoseconds idle) {
  if (!take_role(patience, true)) return false;
  if (pinned_ > 0) {
    give_back_role();
    return false;
  }
  current = this;
  // The role goes back however this ends (a handler that throws passes through to the caller).
  struct GiveBack {
    ProxyThread& t;
    ~GiveBack() {
      current = nullptr;
      t.give_back_role();
    }
  } give_back{*this};
  if (start) start();
  using clock = std::chrono::steady_clock;
  auto last_progress = clock::now();
  for (unsigned rounds = 1;; ++rounds) {
    // The loop's round, as run() does it; the handlers include the operation's completion.
    bool progress = poll_pollers();
    owed_.store(false, std::memory_order_relaxed);
    // One handler at a time: one that pins the loop is the last this thread runs.
    while (pinned_ == 0 && ctx_.poll_one() > 0) progress = true;
    progress |= run_ready(true);
    if (done.load(std::memory_order_acquire) || ctx_.stopped() || pinned_ > 0 ||
        asking_.load(std::memory_order_relaxed) > 0)
      break;
    if (progress) {
      last_progress = clock::now();
      continue;
    }
    if ((rounds & 15) == 0 && clock::now() - last_progress >= idle) break;
    // As the loop does between idle rounds: the peer waited for may need this core (ranks often
    // outnumber cores), and spinning without yielding cost 4 ranks on 2 cores 2.8 ms an operation.
    ::sched_yield();
  }
  return true;
}

bool ProxyThread::in_thread() const noexcept { return current == this; }

ProxyThread::ProxyThread(int index)
    : index_(index), guard_(asio::make_work_guard(ctx_)), thread_([this] { run(); }) {}

ProxyThread::~ProxyThread() {
  stop_.store(true, std::memory_order_relaxed);
  guard_.reset();
  ctx_.stop();
  if (thread_.joinable()) thread_.join();
}

void Poller::set_dormant(bool dormant) {
  if (dormant == dormant_) return;
  dormant_ = dormant;
  if (!thread_) return;
  if (dormant)
    thread_->unlist(this);
  else
    thread_->list(this);
}

void ProxyThread::list(Poller* p) {
  p->slot_ = pollers_.size();
  pollers_.push_back(p);
}

void ProxyThread::unlist(Poller* p) {
  Poller* last = pollers_.back();
  pollers_[p->slot_] = last;
  last->slot_ = p->slot_;
  pollers_.pop_back();
  p->slot_ = Poller::unlisted;
}

void ProxyThread::add_poller(Poller* p) {
  p->thread_ = this;
  if (p->thread_bound()) ++pinned_;
  if (!p->dormant_) list(p);
}

void ProxyThread::remove_poller(Poller* p) {
  if (p->thread_ != this) return;
  if (p->thread_bound()) --pinned_;
  if (p->slot_ != Poller::unlisted) unlist(p);
  p->thread_ = nullptr;
}

void ProxyThread::add_idle_poller(Poller* p) { idle_pollers_.push_back(p); }

void ProxyThread::remove_idle_poller(Poller* p) {
  idle_pollers_.erase(std::remove(idle_pollers_.begin(), idle_pollers_.end(), p),
                      idle_pollers_.end());
}

void ProxyThread::defer(Deferred* d) {
  if (std::find(deferred_.begin(), deferred_.end(), d) != deferred_.end()) return;
  if (deferred_.empty()) deferred_since_ = std::chrono::steady_clock::now();
  deferred_.push_back(d);
}

void ProxyThread::cancel_deferred(Deferred* d) {
  deferred_.erase(std::remove(deferred_.begin(), deferred_.end(), d), deferred_.end());
}

void ProxyThread::run_deferred() {
  // Taken first: a deferral may defer again (into a fresh list).
  std::vector<Deferred*> due;
  due.swap(deferred_);
  for (Deferred* d : due) d->run_deferred();
}

bool ProxyThread::run_ready(bool stop_when_pinned) {
  // A completion resumes a coroutine that may start its next operation and list that one's
  // completion in turn: up to about `budget` of them run before the loop looks at its pollers and
  // its io_context again.
  constexpr std::size_t budget = 256;
  std::size_t n = 0;
  while (n < budget && !ready_.empty()) {
    due_.swap(ready_);
    std::size_t i = 0;
    for (; i < due_.size() && !(stop_when_pinned && pinned_ > 0); ++i, ++n) {
      std::unique_ptr<Ready> r = std::move(due_[i]);
      r->run();
    }
    // Pinned (a thread in drive() stops there): the rest go back ahead of those listed since.
    ready_.insert(ready_.begin(), std::make_move_iterator(due_.begin() + static_cast<long>(i)),
                  std::make_move_iterator(due_.end()));
    due_.clear();
    if (stop_when_pinned && pinned_ > 0) break;
  }
  return n > 0;
}

bool ProxyThread::pollers_waiting() const noexcept {
  return std::any_of(pollers_.begin(), pollers_.end(),
                     [](const Poller* p) { return p->waiting(); });
}

bool ProxyThread::poll_pollers() {
  bool progress = false;
  // A poller may resume coroutines that register, remove, wake or put to sleep pollers, itself
  // included. Taking one out moves the last into its place, so walk from the end: what moves
  // down was visited already (a poller that leaves makes none of the others be skipped); one
  // that comes in is visited next round; when several left, indices past the end are passed by.
  for (std::size_t i = pollers_.size(); i-- > 0;)
    if (i < pollers_.size()) progress |= pollers_[i]->poll();
  return progress;
}

void ProxyThread::run() {
  current = this;
  role_held = this;  // holder_ starts as proxy_role
  using clock = std::chrono::steady_clock;
  const auto spin = std::chrono::microseconds(std::max<std::int64_t>(0, params::spin_us.get()));
  COCCL_INFO(proxy, -1, "proxy thread %d started (spin %lld us)", index_,
             static_cast<long long>(spin.count()));
  auto last_progress = clock::now();
  unsigned idle_rounds = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    // Between rounds nothing of the loop is under way: a caller waiting to borrow the role (a
    // blocking operation on the fast path) gets it now rather than at the next idle round.
    lend_if_asked();
    const bool lent = lent_.exchange(false, std::memory_order_relaxed);
    bool progress = poll_pollers();
    bool waiting = pollers_waiting();
    // ctx.poll() enters the reactor (an epoll_wait syscall) when nothing is queued. While a
    // poller waits for a peer and only pollers make progress, visit it every fourth round; when
    // nothing waits on a poller, work is most likely queued there, so visit it every round,
    // except right after a borrower gave the role back: a caller doing blocking operations on the
    // fast path comes back within a microsecond, and the role is held through the syscall. Work
    // owed to the loop (owe()) is visited at once.
    bool polled = false;
    if (progress || owed_.load(std::memory_order_relaxed) || (!waiting && !lent) ||
        (++idle_rounds & 3) == 0) {
      // Cleared before the handlers run: work handed over before owe() is among them.
      owed_.store(false, std::memory_order_relaxed);
      progress |= ctx_.poll() > 0;
      polled = true;
    }
    if (ctx_.stopped()) break;
    progress |= run_ready(false);
    // Nothing was ready: only now may the idle pollers act (virtual time must not pass while
    // anything could still run at the present time, a borrower's work just done included).
    if (!progress && polled && !lent)
      for (std::size_t i = 0; i < idle_pollers_.size() && !progress; ++i)
        progress = idle_pollers_[i]->poll();
    // Deferred work waits while operations keep coming (what it waits for is their next frame),
    // but not past deferred_max, however busy the loop.
    constexpr auto deferred_max = std::chrono::milliseconds(1);
    const auto now = clock::now();
    if (!deferred_.empty() && now - deferred_since_ >= deferred_max) run_deferred();
    if (progress) {
      last_progress = now;
      continue;
    }
    // A borrower's work keeps the loop awake (so lendable) as its own would, but the loop still
    // yields its core between rounds: the borrower may need it.
    if (lent) last_progress = now;
    if (now - last_progress < spin) {
      // Ranks often outnumber cores (several ranks per host in tests and parameter servers):
      // yielding lets the peer we wait for run instead of burning our time slice. Meanwhile the
      // role is free for a thread that wants to borrow it (Borrow). When a borrower did the work
      // and nothing of the loop's own is under way, the loop naps instead (as hold_role() does,
      // the role left free): a loop that only yields stays runnable, and 2 ranks on 2 cores with
      // their two yielding proxy threads were often placed with both ranks on one core, which
      // made a small blocking all_reduce take 10-12 us instead of 0.3-0.8 in a third of the runs.
      // Decided while the role is held: the deferred list is the holder's, and a borrower may add
      // to it as soon as the role is free.
      const bool idle =
          lent && !waiting && deferred_.empty() && io_parked_.load(std::memory_order_relaxed) == 0;
      release_role();
      if (idle)
        nap(false);
      else
        ::sched_yield();
      hold_role();
      continue;
    }
    // No more operations soon: what was deferred for them goes now, and the loop looks once more
    // (what that queued) before it sleeps, without spinning again.
    if (!deferred_.empty()) {
      run_deferred();
      continue;
    }
    // Handlers run inside run_one, so the role stays held while asleep; a would-be borrower sees
    // the flag and gives up at once instead of spinning for nothing.
    asleep_.store(true, std::memory_order_relaxed);
    if (waiting) {
      ctx_.run_one_for(std::chrono::microseconds(200));
    } else {
      ctx_.run_one();
    }
    asleep_.store(false, std::memory_order_relaxed);
    last_progress = clock::now();
  }
}

Engine::Engine(int threads) {
  threads = std::max(1, threads);
  for (int i = 0; i < threads; ++i) threads_.push_back(std::make_unique<ProxyThread>(i));
}

Engine::~Engine() = default;

std::shared_ptr<Engine> Engine::instance() {
  static std::mutex m;
  static std::weak_ptr<Engine> weak;
  std::lock_guard lock(m);
  auto e = weak.lock();
  if (!e) {
    static std::once_flag printed;
    std::call_once(printed, [] {
      if (log::enabled(log::Level::info, log::Subsys::env)) config::print_parameters();
    });
    e = std::make_shared<Engine>(static_cast<int>(params::proxy_threads.get()));
    weak = e;
  }
  return e;
}

ProxyThread& Engine::next_thread() {
  return *threads_[next_.fetch_add(1, std::memory_order_relaxed) % threads_.size()];
}

bool Engine::owns(const ProxyThread& t) const noexcept {
  return std::any_of(threads_.begin(), threads_.end(),
                     [&](const std::unique_ptr<ProxyThread>& p) { return p.get() == &t; });
}

}  // namespace coccl::runtime
