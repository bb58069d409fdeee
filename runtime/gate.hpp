// Structured shutdown: one gate per object whose handlers may run after it has started closing.
//
// An object's Asio completions, timers and parked coroutines can run after the object has begun
// to shut down, or after it is gone. Each such handler carries a Gate::Pass taken from the
// object's gate and checks open() before it touches the object. The owner closes the gate when
// it starts shutting down, and every pass then reads closed, also one whose handler runs after
// the gate itself was destroyed (the passes share the gate's state). An owner that must not go on
// before its handlers have finished waits until every pass has been dropped (wait()).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>

namespace coccl::runtime {

class Gate {
  struct State {
    std::atomic<bool> closed{false};
    std::atomic<std::size_t> passes{0};
    std::mutex mutex;
    std::condition_variable left;
  };

 public:
  /// A handler's hold on the gate: counted until it is destroyed (or moved from). Copies count
  /// separately. A moved-from pass holds nothing and reads closed.
  class Pass {
   public:
    Pass(const Pass& o) noexcept : s_(o.s_) { take(); }
    Pass(Pass&& o) noexcept = default;
    Pass& operator=(Pass o) noexcept {
      std::swap(s_, o.s_);
      return *this;
    }
    ~Pass() { drop(); }

    /// True until the gate is closed. Any thread.
    bool open() const noexcept { return s_ && !s_->closed.load(); }

   private:
    friend class Gate;
    explicit Pass(std::shared_ptr<State> s) noexcept : s_(std::move(s)) { take(); }
    void take() noexcept {
      if (s_) ++s_->passes;
    }
    void drop() noexcept {
      if (!s_) return;
      // The waiter checks the count under the mutex: taking it here before notifying means the
      // waiter either sees zero or is already waiting when the notification comes.
      if (--s_->passes == 0 && s_->closed.load()) {
        std::lock_guard lock(s_->mutex);
        s_->left.notify_all();
      }
      s_.reset();
    }
    std::shared_ptr<State> s_;
  };

  Gate() = default;
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  /// Closes the gate: passes still held read closed from now on.
  ~Gate() { close(); }

  /// A pass for a handler about to be queued. Taken after close() it is closed already.
  Pass enter() const { return Pass(s_); }

  /// From now on every pass reads closed. Idempotent; any thread.
  void close() noexcept { s_->closed.store(true); }
  bool closed() const noexcept { return s_->closed.load(); }

  /// Passes not yet dropped.
  std::size_t passes() const noexcept { return s_->passes.load(); }

  /// Closes the gate and blocks until every pass has been dropped. Never on a thread whose work
  /// drops one of them (the proxy thread, for handlers queued there): that would wait for ever.
  void close_and_wait() {
    close();
    std::unique_lock lock(s_->mutex);
    s_->left.wait(lock, [&] { return s_->passes.load() == 0; });
  }

 private:
  std::shared_ptr<State> s_ = std::make_shared<State>();
};

}  // namespace coccl::runtime
