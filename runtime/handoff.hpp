// Completing a caller's handler from a proxy thread.
//
// A handler that belongs to the caller's io_context has to be posted there from the proxy thread,
// and Asio's post publishes the operation, unlocks the scheduler and only then wakes the caller's
// thread (signals a condition variable or interrupts the reactor). A caller that destroys its
// io_context as soon as the handler has run (run() returned, or a run_one() loop saw the result)
// can therefore destroy it while the proxy thread is still inside that wake-up. A work guard on
// the caller's context does not help the run_one() caller, whose context may be gone before the
// guard is dropped. So the handler is wrapped: the wrapper, run on the caller's thread, first
// waits until the proxy thread has returned from the hand-over (a window of a few instructions
// unless the proxy thread is preempted), and only then runs the handler.
#pragma once

#include <atomic>
#include <boost/asio/append.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <exception>
#include <future>
#include <memory>
#include <thread>
#include <utility>

#include "runtime/engine.hpp"

namespace coccl::runtime {

namespace asio = boost::asio;

namespace detail {

struct HandoffState {
  std::thread::id poster = std::this_thread::get_id();
  std::atomic<bool> handed_over{false};
};

template <typename Handler>
class Handoff {
 public:
  using executor_type = asio::associated_executor_t<Handler>;

  Handoff(Handler h, std::shared_ptr<HandoffState> state)
      : handler_(std::move(h)), state_(std::move(state)) {}

  executor_type get_executor() const noexcept { return asio::get_associated_executor(handler_); }

  template <typename... Args>
  void operator()(Args&&... args) {
    // Run inline by the hand-over itself (the handler's executor allowed it): nothing to wait for.
    if (std::this_thread::get_id() != state_->poster) {
      while (!state_->handed_over.load(std::memory_order_acquire)) std::this_thread::yield();
    }
    std::move(handler_)(std::forward<Args>(args)...);
  }

 private:
  Handler handler_;
  std::shared_ptr<HandoffState> state_;
};

}  // namespace detail

/// Runs `handler(args...)` on the handler's associated executor (inline when that executor allows
/// it), such that the handler starts only after this thread has stopped touching that executor's
/// execution context.
template <typename Handler, typename... Args>
void complete(Handler&& handler, Args&&... args) {
  using H = std::decay_t<Handler>;
  auto state = std::make_shared<detail::HandoffState>();
  asio::dispatch(asio::append(detail::Handoff<H>(std::forward<Handler>(handler), state),
                              std::forward<Args>(args)...));
  state->handed_over.store(true, std::memory_order_release);
}

/// complete(), but later, from `ex` (a proxy thread's executor): the handler never runs inside the
/// call that produced its result.
template <typename Executor, typename Handler, typename... Args>
void complete_later(const Executor& ex, Handler handler, Args... args) {
  // Boxed: a lambda holding a move-only type-erased handler by value can look copyable to Asio.
  auto box = std::make_unique<Handler>(std::move(handler));
  asio::post(ex, [box = std::move(box), ... args = std::move(args)]() mutable {
    complete(std::move(*box), std::move(args)...);
  });
}

namespace detail {

// run_on()'s body; `posted` runs once the work is posted, before the wait.
template <typename Executor, typename Fn, typename Posted>
void post_and_wait(const Executor& ex, Fn& fn, Posted posted) {
  std::exception_ptr failure;
  std::promise<void> done;
  boost::asio::post(ex, [&] {
    try {
      fn();
    } catch (...) {
      failure = std::current_exception();
    }
    done.set_value();
  });
  posted();
  done.get_future().get();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace detail

/// Runs `fn` on `ex` and waits for it on the calling thread (not one of `ex`'s), rethrowing what
/// it threw. The exception is handed over only once `fn`'s catch block has ended there: a
/// promise's set_exception inside it would leave references to the exception on that thread
/// while this one reads it, ordered only by libstdc++'s uninstrumented reference counts, which
/// ThreadSanitizer reports as a data race.
template <typename Executor, typename Fn>
void run_on(const Executor& ex, Fn&& fn) {
  detail::post_and_wait(ex, fn, [] {});
}

/// run_on() a proxy thread: at once when called on that thread (a post would wait for itself),
/// else posted there and waited for. The loop is owed a round for it: napping while callers
/// borrow its role, it would otherwise get to it only at the nap's end (up to 1 ms; a status()
/// after a blocking small operation took 1.2 ms).
template <typename Fn>
void run_on(ProxyThread& thread, Fn&& fn) {
  if (thread.in_thread())
    fn();
  else
    detail::post_and_wait(thread.executor(), fn, [&thread] { thread.owe(); });
}

}  // namespace coccl::runtime
