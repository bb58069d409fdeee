// The engine: proxy threads, each running one io_context under a driver loop.
//
// The driver loop polls registered pollers (shared-memory rings, verbs completion queues, pinned
// GPU flags), runs ready handlers with ctx.poll(), and only after COCCL_SPIN_US without progress
// sleeps in the io_context (on sockets, timers and posted work). While a poller reports waiters,
// the sleep is bounded so the poller is still visited; while nothing waits, the thread blocks until
// work is posted. A communicator is bound to one proxy thread and its state is touched only there,
// or by a thread that has borrowed the proxy thread's role (ProxyThread::Borrow) while the proxy
// thread was awake and idle.
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/config.hpp"

namespace coccl::runtime {

namespace asio = boost::asio;

class ProxyThread;

/// Something the driver loop polls: a source of completions that has no file descriptor to sleep
/// on (or one that is cheaper to poll while busy). Registered and called on its proxy thread only.
class Poller {
 public:
  Poller() = default;
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;
  virtual ~Poller() = default;
  /// Processes what is ready; returns true if anything progressed.
  virtual bool poll() = 0;
  /// True while someone waits on this poller, so the loop must keep visiting it.
  virtual bool waiting() const = 0;
  /// True if only the proxy thread itself may poll it (an io_uring that takes submissions from one
  /// thread): while one is registered, the loop is pinned (ProxyThread::pin()).
  virtual bool thread_bound() const { return false; }

 protected:
  /// A poller that can tell when it has nothing to do says so: while dormant, the loop neither
  /// polls it nor asks whether it waits, so that a registered poller without work costs the loop
  /// nothing (a proxy thread may carry hundreds of thousands of communicators, each with its
  /// pollers). A dormant poller's poll() must return false and its waiting() false, so the loop
  /// behaves as if it visited it. Pollers start awake. Call with the proxy thread's role held
  /// (owned_here()), registered or not.
  void set_dormant(bool dormant);

 private:
  friend class ProxyThread;
  static constexpr std::size_t unlisted = static_cast<std::size_t>(-1);
  ProxyThread* thread_ = nullptr;  // where it is registered
  std::size_t slot_ = unlisted;    // its index in the thread's list of awake pollers
  bool dormant_ = false;
};

/// Work a loop keeps for later that must not wait long (ProxyThread::defer): tcp credits that wait
/// to ride on the next frame of their link.
class Deferred {
 public:
  /// Runs once, on the loop with its role held, then the loop forgets it.
  virtual void run_deferred() = 0;

 protected:
  ~Deferred() = default;
};

/// A completion that a proxy thread's loop runs itself (ProxyThread::complete_soon).
class Ready {
 public:
  virtual ~Ready() = default;
  /// Runs once, on the loop with its role held, outside the io_context.
  virtual void run() = 0;
};

/// True when called from any proxy thread of this process: a blocking call there would stall the
/// loop that has to complete it.
bool on_proxy_thread() noexcept;

/// The proxy thread this is called from, or null.
ProxyThread* current_proxy_thread() noexcept;

/// One pause in a spin-wait: tells the core this thread spins (x86 `pause`), so that its sibling
/// hyper-thread and the memory system are spared.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// One proxy thread and its io_context.
///
/// The state the proxy thread owns (its communicators, links and pollers) may also be used, for a
/// short section, by another thread that borrows the proxy thread's role: the proxy thread holds
/// the role whenever it runs handlers or pollers, and lets go of it only between the rounds of its
/// loop (to a thread asking for it, or while it yields its core in an idle round within
/// COCCL_SPIN_US of its last work). A borrower that gets it runs with the proxy thread stopped at
/// that point; the proxy thread waits until the borrower gives it back, asleep on a futex (at most
/// 1 ms at a time) so that it leaves the core to the borrowers: it is woken early when it is owed
/// a round (owe()) or when a borrower gives back the role while the loop's pollers wait. Once a
/// borrower has done work since its last round and the loop has none of its own under way, the
/// proxy thread naps the same way between idle rounds, the role free. Nothing is lent while the
/// proxy thread is busy or asleep (in its io_context, after COCCL_SPIN_US without work). The role
/// is handed over with acquire/release atomics, so everything the borrower did is visible to the
/// proxy thread afterwards, and the other way round.
class ProxyThread {
 public:
  explicit ProxyThread(int index);
  ~ProxyThread();
  ProxyThread(const ProxyThread&) = delete;
  ProxyThread& operator=(const ProxyThread&) = delete;

  asio::io_context& context() noexcept { return ctx_; }
  asio::any_io_executor executor() { return ctx_.get_executor(); }
  /// True when called from this proxy thread's loop: the proxy thread itself, or a thread running
  /// its rounds in drive().
  bool in_thread() const noexcept;
  /// True on the proxy thread itself (not a thread running its rounds in drive()).
  bool on_own_thread() const noexcept { return std::this_thread::get_id() == thread_.get_id(); }
  /// Holder of the role: while pinned (once per pin()), the loop's work stays on the proxy thread
  /// itself: drive() declines, and a thread inside it stops after the handler that pinned. For
  /// what binds to the thread that first uses it (an io_uring that takes submissions from one
  /// thread): pin, move to the proxy thread (post and resume there), make it, and unpin once it
  /// is registered as a thread_bound() poller, which pins the loop for as long as it stays.
  void pin() noexcept { ++pinned_; }
  void unpin() noexcept { --pinned_; }
  /// pin() for as long as it lives.
  class Pin {
   public:
    explicit Pin(ProxyThread& t) noexcept : t_(t) { t_.pin(); }
    ~Pin() { t_.unpin(); }
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;

   private:
    ProxyThread& t_;
  };
  /// True on the thread that holds this proxy thread's role now: the proxy thread itself, or a
  /// thread inside a Borrow of it.
  bool owned_here() const noexcept;

  /// Takes the proxy thread's role for the calling thread (not a proxy thread) if the proxy
  /// thread lets go of it within `patience`; gives it back when destroyed. Only while it is held
  /// (operator bool) may the caller touch the proxy thread's state. Keep the section short: the
  /// proxy thread's other work waits for it.
  class Borrow {
   public:
    Borrow(ProxyThread& t, std::chrono::nanoseconds patience) noexcept;
    ~Borrow();
    Borrow(const Borrow&) = delete;
    Borrow& operator=(const Borrow&) = delete;
    explicit operator bool() const noexcept { return held_; }

   private:
    ProxyThread& t_;
    bool held_ = false;
  };

  /// For a thread (not a proxy thread, holding no role) that hands this loop work and waits for
  /// it: takes the role as Borrow does (within `patience`, even while the loop is owed a round),
  /// calls `start` (which hands the work over) and runs the loop's rounds (ready handlers and
  /// pollers) itself until `done` is non-zero, another thread asks for the role, or `idle` passes
  /// without progress. Meanwhile it counts as this proxy thread (in_thread(), on_proxy_thread()),
  /// so `start` queues the work directly, and a handler that makes a blocking call is refused as
  /// on the loop. Returns false without calling `start` when it did not get the role, or when the
  /// loop is pinned (pin(); the caller then hands the work over as usual); true once
  /// `start` was called, whether or not `done` is set (the proxy thread finishes what is left).
  /// Saves a blocking caller the hand-offs to the proxy thread and back when its links need the
  /// loop (tcp). `start` may be empty (the work was handed over already).
  bool drive(const std::function<void()>& start, const std::atomic<int>& done,
             std::chrono::nanoseconds patience, std::chrono::nanoseconds idle);

  /// Holder of the role (owned_here()): true while someone needs the role that a holder only
  /// waiting for peers keeps: another thread trying to borrow it, coroutines parked on its pollers
  /// (only the loop resumes them), or, for a borrower, the loop being owed a round (owe()). Such a
  /// holder should give it back soon: what it waits for may depend on that work.
  bool wanted() const noexcept;
  /// Any thread, after handing this proxy thread work that another thread waits for (posted, or
  /// queued while holding its role): the proxy thread is owed a round of its loop, so a holder
  /// gives the role back soon and none is lent again before that round has run.
  void owe() noexcept;
  /// Holder of the role: a coroutine parks on (+1) or leaves (-1) a wait that only the loop's
  /// event sources end (a tcp link's put or wait, whose data the io_context reads). While one is
  /// parked, wanted() holds: a holder waiting for peers may be what it waits for.
  void io_parked(int delta) noexcept { io_parked_.fetch_add(delta, std::memory_order_relaxed); }

  /// Adds or removes a poller (removing one that is not registered does nothing); call on this
  /// proxy thread. Constant time: only awake pollers are listed (Poller::set_dormant).
  void add_poller(Poller* p);
  void remove_poller(Poller* p);
  /// Adds or removes a poller visited only when the loop found nothing else to do (no handler
  /// ready, no poller progressed): the in-memory network's virtual time advances there. Call on
  /// this proxy thread.
  void add_idle_poller(Poller* p);
  void remove_idle_poller(Poller* p);
  /// Holder of the role: runs `d` once the loop has found nothing to do for COCCL_SPIN_US (before
  /// it sleeps), and at the latest about a millisecond after the first deferral still waiting.
  /// A deferral listed already is not listed again; cancel_deferred() takes one out (nothing if
  /// not listed), as its owner must before it is destroyed.
  void defer(Deferred* d);
  void cancel_deferred(Deferred* d);
  /// In this loop (in_thread(), the role held): runs `r` once the handler or poller now running
  /// has returned, before the loop's next visit to its io_context. What a coroutine on the
  /// loop's executor awaits may complete at once (the fast path); posted to the io_context, each
  /// such completion cost a visit of its reactor (an epoll_wait), about a third of an operation
  /// awaited on one rank. Runs outside the io_context, as the pollers' resumptions do.
  void complete_soon(std::unique_ptr<Ready> r) { ready_.push_back(std::move(r)); }

 private:
  friend class Poller;
  void run();
  bool poll_pollers();
  // Puts an awake registered poller into pollers_ or takes it out (swapping the last into its
  // place).
  void list(Poller* p);
  void unlist(Poller* p);
  // Whether a coroutine is parked on one of the pollers (only the loop resumes it). Read by the
  // holder of the role.
  bool pollers_waiting() const noexcept;

  // The role: who holds it (free, the proxy thread, a borrower), whether the proxy thread is asleep
  // in the io_context (holding it: a borrower then gives up at once), threads trying to borrow it,
  // whether a borrower did work since the proxy thread last looked (that counts as progress, so
  // the proxy thread stays awake and lendable while borrowers keep coming), and what the proxy
  // thread itself needs it for (wanted()).
  enum Holder : int { free_role = 0, proxy_role = 1, borrowed_role = 2 };
  void hold_role() noexcept;
  // Borrow's taking of the role: true if this thread now holds it (role_held set).
  bool take_role(std::chrono::nanoseconds patience, bool even_if_owed) noexcept;
  // Borrow's giving back.
  void give_back_role() noexcept;
  void lend_if_asked() noexcept;
  void release_role() noexcept { holder_.store(free_role, std::memory_order_release); }
  // The proxy thread naps (at most 1 ms, ended early by wake_nap()) in hold_role() while a
  // borrower holds the role (`while_borrowed`: only if it still does), and between idle rounds
  // while borrowers do the work (the role free).
  void wake_nap() noexcept;
  void nap(bool while_borrowed) noexcept;
  std::atomic<int> holder_{proxy_role};
  std::atomic<bool> asleep_{false};
  std::atomic<int> asking_{0};
  std::atomic<bool> lent_{false};
  std::atomic<bool> owed_{false};
  std::atomic<int> io_parked_{0};
  std::atomic<bool> napping_{false};
  std::atomic<std::uint32_t> nap_word_{0};  // the futex: bumped by every wake_nap()

  int index_;
  asio::io_context ctx_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::vector<Poller*> pollers_;  // registered and awake, in no particular order
  std::vector<Poller*> idle_pollers_;
  std::vector<Deferred*> deferred_;
  std::chrono::steady_clock::time_point deferred_since_{};  // when deferred_ became non-empty
  void run_deferred();
  // complete_soon()'s list, and running it (a thread in drive() stops once the loop is pinned):
  // true if anything ran. due_ is the list being run, kept for its capacity.
  std::vector<std::unique_ptr<Ready>> ready_, due_;
  bool run_ready(bool stop_when_pinned);
  std::size_t pinned_ = 0;  // pin()s held, and registered pollers that are thread_bound()
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// The process's set of proxy threads. Communicators share it; it lives as long as any of them.
class Engine {
 public:
  explicit Engine(int threads);
  ~Engine();

  /// The process-wide engine with COCCL_PROXY_THREADS threads, created on first use.
  static std::shared_ptr<Engine> instance();

  /// The proxy thread for the next communicator (round robin).
  ProxyThread& next_thread();
  /// True when `t` is one of this engine's threads.
  bool owns(const ProxyThread& t) const noexcept;
  ProxyThread& thread(std::size_t i) { return *threads_.at(i); }
  std::size_t size() const noexcept { return threads_.size(); }

 private:
  std::vector<std::unique_ptr<ProxyThread>> threads_;
  std::atomic<std::size_t> next_{0};
};

}  // namespace coccl::runtime

namespace coccl::params {

extern config::Param<std::int64_t> proxy_threads;  // COCCL_PROXY_THREADS
extern config::Param<std::int64_t> spin_us;        // COCCL_SPIN_US

}  // namespace coccl::params
