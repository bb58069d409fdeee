// The engine: proxy threads, each running one io_context under a driver loop.
//
// The driver loop polls registered pollers (shared-memory rings, verbs completion queues, pinned
// GPU flags), runs ready handlers with ctx.poll(), and only after COCCL_SPIN_US without progress
// sleeps in the io_context (on sockets, timers and posted work). While a poller reports waiters,
// the sleep is bounded so the poller is still visited; while nothing waits, the thread blocks until
// work is posted. A communicator is bound to one proxy thread and its state is touched only there.
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/config.hpp"

namespace coccl::runtime {

namespace asio = boost::asio;

/// Something the driver loop polls: a source of completions that has no file descriptor to sleep
/// on (or one that is cheaper to poll while busy). Registered and called on its proxy thread only.
class Poller {
 public:
  virtual ~Poller() = default;
  /// Processes what is ready; returns true if anything progressed.
  virtual bool poll() = 0;
  /// True while someone waits on this poller, so the loop must keep visiting it.
  virtual bool waiting() const = 0;
};

/// True when called from any proxy thread of this process: a blocking call there would stall the
/// loop that has to complete it.
bool on_proxy_thread() noexcept;

class ProxyThread;
/// The proxy thread this is called from, or null.
ProxyThread* current_proxy_thread() noexcept;

/// One proxy thread and its io_context.
class ProxyThread {
 public:
  explicit ProxyThread(int index);
  ~ProxyThread();
  ProxyThread(const ProxyThread&) = delete;
  ProxyThread& operator=(const ProxyThread&) = delete;

  asio::io_context& context() noexcept { return ctx_; }
  asio::any_io_executor executor() { return ctx_.get_executor(); }
  /// True when called from this proxy thread.
  bool in_thread() const noexcept { return std::this_thread::get_id() == thread_.get_id(); }

  /// Adds or removes a poller; call on this proxy thread.
  void add_poller(Poller* p);
  void remove_poller(Poller* p);
  /// Adds or removes a poller visited only when the loop found nothing else to do (no handler
  /// ready, no poller progressed): the in-memory network's virtual time advances there. Call on
  /// this proxy thread.
  void add_idle_poller(Poller* p);
  void remove_idle_poller(Poller* p);

 private:
  void run();
  bool poll_pollers();

  int index_;
  asio::io_context ctx_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  std::vector<Poller*> pollers_;
  std::vector<Poller*> idle_pollers_;
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
