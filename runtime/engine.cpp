#include "runtime/engine.hpp"

#include <sched.h>

#include <algorithm>
#include <mutex>

#include "runtime/log.hpp"

namespace coccl::params {

config::Param<std::int64_t> proxy_threads{
    "COCCL_PROXY_THREADS", 1, "proxy threads of the process engine (communicators are spread)"};
config::Param<std::int64_t> spin_us{
    "COCCL_SPIN_US", 2000,
    "microseconds a proxy thread polls without progress before it sleeps on its event sources"};

}  // namespace coccl::params

namespace coccl::runtime {

namespace {
thread_local ProxyThread* current = nullptr;
}

bool on_proxy_thread() noexcept { return current != nullptr; }

ProxyThread* current_proxy_thread() noexcept { return current; }

ProxyThread::ProxyThread(int index)
    : index_(index), guard_(asio::make_work_guard(ctx_)), thread_([this] { run(); }) {}

ProxyThread::~ProxyThread() {
  stop_.store(true, std::memory_order_relaxed);
  guard_.reset();
  ctx_.stop();
  if (thread_.joinable()) thread_.join();
}

void ProxyThread::add_poller(Poller* p) { pollers_.push_back(p); }

void ProxyThread::remove_poller(Poller* p) {
  pollers_.erase(std::remove(pollers_.begin(), pollers_.end(), p), pollers_.end());
}

void ProxyThread::add_idle_poller(Poller* p) { idle_pollers_.push_back(p); }

void ProxyThread::remove_idle_poller(Poller* p) {
  idle_pollers_.erase(std::remove(idle_pollers_.begin(), idle_pollers_.end(), p),
                      idle_pollers_.end());
}

bool ProxyThread::poll_pollers() {
  bool progress = false;
  // Index loop: a poller may complete a handler that registers or removes pollers.
  for (std::size_t i = 0; i < pollers_.size(); ++i) progress |= pollers_[i]->poll();
  return progress;
}

void ProxyThread::run() {
  current = this;
  using clock = std::chrono::steady_clock;
  const auto spin = std::chrono::microseconds(std::max<std::int64_t>(0, params::spin_us.get()));
  COCCL_INFO(proxy, -1, "proxy thread %d started (spin %lld us)", index_,
             static_cast<long long>(spin.count()));
  auto last_progress = clock::now();
  unsigned idle_rounds = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool progress = poll_pollers();
    bool waiting =
        std::any_of(pollers_.begin(), pollers_.end(), [](const Poller* p) { return p->waiting(); });
    // ctx.poll() enters the reactor (an epoll_wait syscall) when nothing is queued. While a
    // poller waits for a peer and only pollers make progress, visit it every fourth round; when
    // nothing waits on a poller, work is most likely queued there, so visit it every round.
    bool polled = false;
    if (progress || !waiting || (++idle_rounds & 3) == 0) {
      progress |= ctx_.poll() > 0;
      polled = true;
    }
    if (ctx_.stopped()) break;
    // Nothing was ready: only now may the idle pollers act (virtual time must not pass while
    // anything could still run at the present time).
    if (!progress && polled)
      for (std::size_t i = 0; i < idle_pollers_.size() && !progress; ++i)
        progress = idle_pollers_[i]->poll();
    if (progress) {
      last_progress = clock::now();
      continue;
    }
    if (clock::now() - last_progress < spin) {
      // Ranks often outnumber cores (several ranks per host in tests and parameter servers):
      // yielding lets the peer we wait for run instead of burning our time slice.
      ::sched_yield();
      continue;
    }
    if (waiting) {
      ctx_.run_one_for(std::chrono::microseconds(200));
    } else {
      ctx_.run_one();
    }
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
