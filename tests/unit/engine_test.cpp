// Tests for runtime/engine.hpp (the proxy thread's driver loop) and runtime/deadline.hpp
// (Mailbox and CloseAfter).
#include "runtime/engine.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <future>
#include <optional>
#include <thread>
#include <vector>

#include "runtime/deadline.hpp"
#include "runtime/handoff.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/param_override.hpp"

namespace coccl::runtime {
namespace {

using namespace std::chrono_literals;
using tcp = asio::ip::tcp;

// A fake source of completions: reports progress on its `progress_at`-th poll, counts polls.
class FakePoller : public Poller {
 public:
  FakePoller(int progress_at, bool waiting) : progress_at_(progress_at), waiting_(waiting) {}
  bool poll() override {
    int n = polls_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (n != progress_at_) return false;
    progressed_.set_value(std::this_thread::get_id());
    return true;
  }
  bool waiting() const override { return waiting_.load(std::memory_order_relaxed); }
  void set_waiting(bool w) { waiting_.store(w, std::memory_order_relaxed); }
  using Poller::set_dormant;
  int polls() const { return polls_.load(std::memory_order_relaxed); }
  std::future<std::thread::id> progressed() { return progressed_.get_future(); }

 private:
  int progress_at_;
  std::atomic<bool> waiting_;
  std::atomic<int> polls_{0};
  std::promise<std::thread::id> progressed_;
};

// Runs `f` on the proxy thread and waits for it.
template <typename F>
void on_thread(ProxyThread& t, F f) {
  std::promise<void> done;
  asio::post(t.executor(), [&] {
    f();
    done.set_value();
  });
  ASSERT_EQ(done.get_future().wait_for(5s), std::future_status::ready);
}

// coarse_now() reads the clock steady_clock reads (its epoch, not the wall clock's), at most a tick
// behind (a tick is 1 to 10 ms; the bound leaves room for a loaded machine).
TEST(CoarseClock, ReadsSteadyClockTimeAtMostATickBehind) {
  for (int i = 0; i < 100; ++i) {
    const auto before = std::chrono::steady_clock::now();
    const auto coarse = coarse_now();
    const auto after = std::chrono::steady_clock::now();
    ASSERT_LE(coarse, after);
    ASSERT_GT(coarse, before - 200ms);
  }
}

TEST(ProxyThread, PollsARegisteredPollerUntilItReportsProgress) {
  ProxyThread t(0);
  FakePoller p(/*progress_at=*/1000, /*waiting=*/true);
  auto progressed = p.progressed();
  on_thread(t, [&] { t.add_poller(&p); });
  ASSERT_EQ(progressed.wait_for(10s), std::future_status::ready);
  EXPECT_GE(p.polls(), 1000);
  on_thread(t, [&] { t.remove_poller(&p); });
}

TEST(ProxyThread, CallsPollersOnTheProxyThread) {
  ProxyThread t(0);
  FakePoller p(1, true);
  auto progressed = p.progressed();
  std::thread::id proxy_id;
  on_thread(t, [&] {
    proxy_id = std::this_thread::get_id();
    t.add_poller(&p);
  });
  ASSERT_EQ(progressed.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(progressed.get(), proxy_id);
  on_thread(t, [&] { t.remove_poller(&p); });
}

TEST(ProxyThread, RunsPostedWorkOnTheProxyThread) {
  ProxyThread t(0);
  std::promise<bool> in_thread;
  asio::post(t.executor(), [&] { in_thread.set_value(t.in_thread()); });
  auto f = in_thread.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(f.get());
  EXPECT_FALSE(t.in_thread());
}

// A Ready that records that it ran and whether it ran in the loop, may list another in turn, and
// may signal that it ran.
class Recorded final : public Ready {
 public:
  Recorded(ProxyThread& t, std::vector<int>& order, int id, int then = -1,
           std::promise<void>* ran = nullptr)
      : t_(t), order_(order), id_(id), then_(then), ran_(ran) {}
  void run() override {
    order_.push_back(id_);
    in_loop_ = in_loop_ && t_.in_thread() && t_.owned_here();
    if (then_ >= 0)
      t_.complete_soon(std::make_unique<Recorded>(t_, order_, then_, -1, ran_));
    else if (ran_)
      ran_->set_value();
  }
  static inline bool in_loop_ = true;

 private:
  ProxyThread& t_;
  std::vector<int>& order_;
  int id_, then_;
  std::promise<void>* ran_;
};

TEST(ProxyThread, RunsCompletionsListedByAHandlerAfterItInOrderOnItsThread) {
  ProxyThread t(0);
  std::vector<int> order;
  Recorded::in_loop_ = true;
  std::promise<void> last;
  // Listed by a handler: none runs inside it; they run in the order listed, and one listed by a
  // completion (a coroutine resumed that starts its next operation) runs after them.
  asio::post(t.executor(), [&] {
    t.complete_soon(std::make_unique<Recorded>(t, order, 1, 3, &last));
    t.complete_soon(std::make_unique<Recorded>(t, order, 2));
    order.push_back(0);
  });
  auto f = last.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(Recorded::in_loop_);
}

TEST(ProxyThread, RunsAChainOfCompletionsLongerThanOneRoundsBudget) {
  ProxyThread t(0);
  std::vector<int> order;
  std::promise<void> last;
  // Each lists the next, as a coroutine awaiting one fast operation after another does: the loop
  // goes on past its per-round budget (256) in later rounds.
  class Chain final : public Ready {
   public:
    Chain(ProxyThread& t, std::vector<int>& order, int left, std::promise<void>& last)
        : t_(t), order_(order), left_(left), last_(last) {}
    void run() override {
      order_.push_back(left_);
      if (left_ > 0)
        t_.complete_soon(std::make_unique<Chain>(t_, order_, left_ - 1, last_));
      else
        last_.set_value();
    }

   private:
    ProxyThread& t_;
    std::vector<int>& order_;
    int left_;
    std::promise<void>& last_;
  };
  asio::post(t.executor(), [&] { t.complete_soon(std::make_unique<Chain>(t, order, 1000, last)); });
  auto f = last.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  ASSERT_EQ(order.size(), 1001u);
  for (int i = 0; i <= 1000; ++i) EXPECT_EQ(order[i], 1000 - i);
}

TEST(ProxyThread, KeepsVisitingAPollerThatHasWaiters) {
  ProxyThread t(0);
  FakePoller p(-1, /*waiting=*/true);
  on_thread(t, [&] { t.add_poller(&p); });
  // Well past COCCL_SPIN_US: the loop no longer spins but still visits the poller.
  std::this_thread::sleep_for(100ms);
  int before = p.polls();
  std::this_thread::sleep_for(100ms);
  EXPECT_GT(p.polls(), before);
  on_thread(t, [&] { t.remove_poller(&p); });
}

TEST(ProxyThread, SleepsWhenNoPollerWaits) {
  ProxyThread t(0);
  FakePoller p(-1, /*waiting=*/false);
  on_thread(t, [&] { t.add_poller(&p); });
  // After COCCL_SPIN_US (2 ms by default) without progress the thread blocks in the io_context.
  std::this_thread::sleep_for(200ms);
  int before = p.polls();
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(p.polls(), before);
  on_thread(t, [&] { t.remove_poller(&p); });
}

// Deferred work that counts its runs and remembers the thread of the last.
class CountingDeferral : public Deferred {
 public:
  void run_deferred() override {
    thread_ = std::this_thread::get_id();
    runs_.fetch_add(1, std::memory_order_release);
  }
  int runs() const { return runs_.load(std::memory_order_acquire); }
  std::thread::id thread() const { return thread_; }

 private:
  std::atomic<int> runs_{0};
  std::thread::id thread_;
};

// A source that always has work: the loop never finds nothing to do.
class BusyPoller : public Poller {
 public:
  bool poll() override { return true; }
  bool waiting() const override { return true; }
};

TEST(ProxyThread, RunsDeferredWorkOnceOnItsThreadWhenIdle) {
  ProxyThread t(0);
  CountingDeferral d;
  std::thread::id proxy;
  on_thread(t, [&] {
    proxy = std::this_thread::get_id();
    t.defer(&d);
    t.defer(&d);  // listed once
  });
  ASSERT_TRUE(test::eventually([&] { return d.runs() > 0; }));
  EXPECT_EQ(d.thread(), proxy);
  // Run once, then forgotten: the loop sleeps without running it again.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(d.runs(), 1);
}

TEST(ProxyThread, RunsDeferredWorkEvenWhileNeverIdle) {
  ProxyThread t(0);
  BusyPoller busy;
  CountingDeferral d;
  on_thread(t, [&] {
    t.add_poller(&busy);
    t.defer(&d);
  });
  ASSERT_TRUE(test::eventually([&] { return d.runs() > 0; }));
  on_thread(t, [&] { t.remove_poller(&busy); });
}

TEST(ProxyThread, ACancelledDeferralNeverRuns) {
  ProxyThread t(0);
  CountingDeferral cancelled, kept;
  on_thread(t, [&] {
    t.defer(&cancelled);
    t.defer(&kept);
    t.cancel_deferred(&cancelled);
    t.cancel_deferred(&cancelled);  // not listed: nothing
  });
  ASSERT_TRUE(test::eventually([&] { return kept.runs() > 0; }));
  EXPECT_EQ(cancelled.runs(), 0);
}

TEST(ProxyThread, WakesFromSleepForPostedWork) {
  ProxyThread t(0);
  FakePoller p(-1, /*waiting=*/false);
  on_thread(t, [&] { t.add_poller(&p); });
  std::this_thread::sleep_for(200ms);
  int before = p.polls();
  std::promise<bool> ran;
  auto start = std::chrono::steady_clock::now();
  asio::post(t.executor(), [&] { ran.set_value(t.in_thread()); });
  auto f = ran.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_TRUE(f.get());
  // The woken loop visits its pollers again.
  on_thread(t, [&] { t.remove_poller(&p); });
  EXPECT_GT(p.polls(), before);
}

TEST(ProxyThread, PassesByADormantPollerUntilItWakes) {
  ProxyThread t(0);
  FakePoller p(/*progress_at=*/1, /*waiting=*/true);
  auto progressed = p.progressed();
  on_thread(t, [&] {
    p.set_dormant(true);
    t.add_poller(&p);
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(p.polls(), 0);
  on_thread(t, [&] { p.set_dormant(false); });
  ASSERT_EQ(progressed.wait_for(10s), std::future_status::ready);
  on_thread(t, [&] { t.remove_poller(&p); });
}

TEST(ProxyThread, StopsVisitingAPollerThatFallsDormant) {
  ProxyThread t(0);
  FakePoller p(-1, /*waiting=*/true);
  on_thread(t, [&] { t.add_poller(&p); });
  std::this_thread::sleep_for(20ms);
  on_thread(t, [&] { p.set_dormant(true); });
  const int before = p.polls();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(p.polls(), before);
  on_thread(t, [&] { t.remove_poller(&p); });
}

TEST(ProxyThread, KeepsVisitingTheOthersOnceAPollerIsRemoved) {
  ProxyThread t(0);
  FakePoller a(-1, true), b(-1, true), c(-1, true);
  on_thread(t, [&] {
    t.add_poller(&a);
    t.add_poller(&b);
    t.add_poller(&c);
  });
  std::this_thread::sleep_for(20ms);
  int a_left = 0;
  on_thread(t, [&] {
    t.remove_poller(&a);
    a_left = a.polls();
  });
  // Until the loop has made a few rounds without `a` (waited for: a loaded machine is slow).
  ASSERT_TRUE(test::eventually([&] { return b.polls() > a_left + 2; }));
  // Read between two rounds of the loop: every round visits each listed poller once.
  int b_polls = 0, c_polls = 0;
  on_thread(t, [&] {
    b_polls = b.polls();
    c_polls = c.polls();
  });
  EXPECT_EQ(a.polls(), a_left);
  EXPECT_GT(b_polls, a_left);
  EXPECT_EQ(b_polls, c_polls);
  on_thread(t, [&] {
    t.remove_poller(&b);
    t.remove_poller(&c);
    t.remove_poller(&a);  // not registered any more: nothing happens
  });
}

// Falls dormant in its first poll, as a LinkPoller does when its last link's waiter resumes.
class OneShotPoller : public Poller {
 public:
  bool poll() override {
    ++polls_;
    set_dormant(true);
    return false;
  }
  bool waiting() const override { return true; }
  int polls() const { return polls_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int> polls_{0};
};

TEST(ProxyThread, APollerFallingDormantInItsPollMakesTheLoopSkipNoOther) {
  ProxyThread t(0);
  FakePoller first(-1, true), last(-1, true);
  OneShotPoller middle;
  on_thread(t, [&] {
    t.add_poller(&first);
    t.add_poller(&middle);
    t.add_poller(&last);
  });
  ASSERT_TRUE(test::eventually([&] { return first.polls() > 2; }));
  int first_polls = 0, last_polls = 0;
  on_thread(t, [&] {
    first_polls = first.polls();
    last_polls = last.polls();
  });
  EXPECT_EQ(middle.polls(), 1);
  EXPECT_GT(first_polls, 1);
  EXPECT_EQ(first_polls, last_polls);
  on_thread(t, [&] {
    t.remove_poller(&first);
    t.remove_poller(&middle);
    t.remove_poller(&last);
  });
}

TEST(ProxyThread, StopsPromptlyWhileSleeping) {
  auto t = std::make_unique<ProxyThread>(0);
  std::this_thread::sleep_for(50ms);
  auto start = std::chrono::steady_clock::now();
  t.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

// Never past its spin: the proxy thread stays awake, lending its role between idle rounds.
constexpr const char* awake_forever = "60000000";

TEST(ProxyThreadBorrow, AnAwakeIdleProxyThreadLendsItsRoleAndRunsNothingMeanwhile) {
  test::ParamOverride spin(params::spin_us, awake_forever);
  ProxyThread t(0);
  std::atomic<bool> ran{false};
  {
    ProxyThread::Borrow borrowed(t, 10s);
    ASSERT_TRUE(borrowed);
    EXPECT_TRUE(t.owned_here());
    asio::post(t.executor(), [&] { ran = true; });
    // Posted work waits while the role is lent.
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(ran.load());
  }
  EXPECT_FALSE(t.owned_here());
  on_thread(t, [] {});
  EXPECT_TRUE(ran.load());
}

TEST(ProxyThreadBorrow, AProxyThreadAsleepLendsNothing) {
  test::ParamOverride spin(params::spin_us, "0");
  ProxyThread t(0);
  on_thread(t, [] {});
  // With no spin the loop goes to sleep in the io_context right after that round.
  std::this_thread::sleep_for(100ms);
  ProxyThread::Borrow borrowed(t, 2s);
  EXPECT_FALSE(borrowed);
  EXPECT_FALSE(t.owned_here());
}

TEST(ProxyThreadBorrow, NeitherAProxyThreadNorAHolderBorrowsAgain) {
  test::ParamOverride spin(params::spin_us, awake_forever);
  ProxyThread a(0), b(1);
  bool lent = true, owns = false;
  on_thread(a, [&] {
    ProxyThread::Borrow borrowed(b, 1s);
    lent = static_cast<bool>(borrowed);
    owns = a.owned_here();
  });
  EXPECT_FALSE(lent);
  EXPECT_TRUE(owns);
  ProxyThread::Borrow outer(a, 10s);
  ASSERT_TRUE(outer);
  ProxyThread::Borrow inner(b, 1s);
  EXPECT_FALSE(inner);
}

TEST(ProxyThreadBorrow, AHolderSeesAnotherThreadWantItAndHandsItOn) {
  test::ParamOverride spin(params::spin_us, awake_forever);
  ProxyThread t(0);
  std::optional<ProxyThread::Borrow> first;
  first.emplace(t, 10s);
  ASSERT_TRUE(*first);
  EXPECT_FALSE(t.wanted());
  std::atomic<bool> second{false};
  std::thread other([&] {
    ProxyThread::Borrow borrowed(t, 60s);
    second = static_cast<bool>(borrowed);
  });
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!t.wanted() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  EXPECT_TRUE(t.wanted());
  first.reset();
  other.join();
  EXPECT_TRUE(second.load());
  EXPECT_FALSE(t.wanted());
}

TEST(ProxyThreadBorrow, OnlyAnAwakePollerThatWaitsMakesTheRoleWanted) {
  test::ParamOverride spin(params::spin_us, awake_forever);
  ProxyThread t(0);
  FakePoller p(-1, /*waiting=*/true);
  on_thread(t, [&] {
    p.set_dormant(true);
    t.add_poller(&p);
  });
  {
    ProxyThread::Borrow borrowed(t, 10s);
    ASSERT_TRUE(borrowed);
    EXPECT_FALSE(t.wanted());
    p.set_dormant(false);  // the role is held: the loop's state may be changed here
    EXPECT_TRUE(t.wanted());
  }
  on_thread(t, [&] { t.remove_poller(&p); });
}

// runtime::complete from another thread: the handler runs on its io_context's thread, and the
// caller may destroy that io_context as soon as the handler has run (a run_one() loop), which the
// sanitizer builds check by doing it many times.
// ---- A caller running the loop while it waits (drive) -------------------------------------------

TEST(ProxyThreadDrive, TheCallerRunsTheWorkItStartsAndCountsAsTheProxyThreadMeanwhile) {
  test::ParamOverride spin(params::spin_us, awake_forever);
  ProxyThread t(0);
  on_thread(t, [] {});
  std::atomic<int> done{0};
  std::thread::id ran_on;
  bool in_thread = false, on_proxy = false, own = true;
  const bool driven = t.drive(
      [&] {
        // Queued by the caller, run by the caller.
        asio::post(t.executor(), [&] {
          ran_on = std::this_thread::get_id();
          in_thread = t.in_thread();
          on_proxy = on_proxy_thread();
          own = t.on_own_thread();
          done.store(1, std::memory_order_release);
        });
      },
      done, 10s, 10s);
  ASSERT_TRUE(driven);
  EXPECT_EQ(done.load(), 1);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(in_thread);
  EXPECT_TRUE(on_proxy);
  EXPECT_FALSE(own);
  // Afterwards the caller is an ordinary thread again, and the loop runs on.
  EXPECT_FALSE(t.in_thread());
  EXPECT_FALSE(on_proxy_thread());
  EXPECT_FALSE(t.owned_here());
  on_thread(t, [] {});
}

TEST(ProxyThreadDrive, APinnedLoopIsNotDrivenAndAPinStopsTheDriverAfterItsHandler) {
  test::ParamOverride spin(params::spin_us, awake_forever);
  ProxyThread t(0);
  std::atomic<int> never{0};
  // Pinned: the caller hands over (start is not called).
  on_thread(t, [&] { t.pin(); });
  bool started = false;
  EXPECT_FALSE(t.drive([&] { started = true; }, never, 10s, 10s));
  EXPECT_FALSE(started);
  on_thread(t, [&] { t.unpin(); });
  // A handler run by the caller pins the loop: the caller stops after it, and the handler queued
  // behind it runs on the proxy thread itself.
  std::atomic<int> done{0};
  std::atomic<bool> second_on_own{false};
  const bool driven = t.drive(
      [&] {
        asio::post(t.executor(), [&] {
          t.pin();
          asio::post(t.executor(), [&] {
            second_on_own = t.on_own_thread();
            t.unpin();
            done.store(1, std::memory_order_release);
            done.notify_all();
          });
        });
      },
      done, 10s, 10s);
  EXPECT_TRUE(driven);
  done.wait(0, std::memory_order_acquire);
  EXPECT_TRUE(second_on_own.load());
}

TEST(ProxyThreadDrive, TheCallerRunsCompletionsItsHandlersListAndLeavesThemToTheLoopWhenPinned) {
  test::ParamOverride spin(params::spin_us, awake_forever);
  ProxyThread t(0);
  on_thread(t, [] {});
  std::vector<int> order;
  Recorded::in_loop_ = true;
  std::atomic<int> done{0};
  // Listed by a handler the caller runs: the caller runs them too.
  ASSERT_TRUE(t.drive(
      [&] {
        asio::post(t.executor(), [&] {
          t.complete_soon(std::make_unique<Recorded>(t, order, 1));
          t.complete_soon(std::make_unique<Recorded>(t, order, 2));
        });
      },
      done, 10s, 10ms));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_TRUE(Recorded::in_loop_);
  // A handler that pins the loop and lists a completion: the caller stops, the proxy thread runs
  // it.
  std::promise<bool> on_own;
  class OnOwn final : public Ready {
   public:
    OnOwn(ProxyThread& t, std::promise<bool>& p) : t_(t), p_(p) {}
    void run() override {
      t_.unpin();
      p_.set_value(t_.on_own_thread());
    }

   private:
    ProxyThread& t_;
    std::promise<bool>& p_;
  };
  ASSERT_TRUE(t.drive(
      [&] {
        asio::post(t.executor(), [&] {
          t.pin();
          t.complete_soon(std::make_unique<OnOwn>(t, on_own));
        });
      },
      done, 10s, 10s));
  auto f = on_own.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(f.get());
}

TEST(ProxyThreadDrive, TheCallerStopsWhenAnotherThreadAsksForTheRole) {
  test::ParamOverride spin(params::spin_us, awake_forever);
  ProxyThread t(0);
  on_thread(t, [] {});
  std::atomic<int> never{0};
  std::atomic<bool> borrowed{false};
  std::thread other;
  // The caller never sees its work done; it gives the role up when the other thread asks.
  EXPECT_TRUE(t.drive(
      [&] {
        other = std::thread([&] {
          ProxyThread::Borrow b(t, 10s);
          borrowed = static_cast<bool>(b);
        });
      },
      never, 10s, 60s));
  other.join();
  EXPECT_TRUE(borrowed.load());
}

TEST(Handoff, CompletesOnTheHandlersThreadAndLetsTheCallerDestroyItsContextAtOnce) {
  ProxyThread proxy(0);
  for (int i = 0; i < 300; ++i) {
    std::optional<asio::io_context> io(std::in_place);
    auto work = asio::make_work_guard(*io);
    int got = -1;
    std::thread::id ran_on;
    auto handler = asio::bind_executor(*io, [&](int v) {
      got = v;
      ran_on = std::this_thread::get_id();
    });
    asio::post(proxy.executor(), [handler, i]() mutable { complete(std::move(handler), i); });
    while (got < 0) io->run_one();
    EXPECT_EQ(got, i);
    EXPECT_EQ(ran_on, std::this_thread::get_id());
    work.reset();
    io.reset();
  }
}

TEST(Handoff, RunsInlineWhenTheHandlerHasNoExecutorOfItsOwn) {
  std::thread::id ran_on;
  complete(
      [&](int v) {
        EXPECT_EQ(v, 7);
        ran_on = std::this_thread::get_id();
      },
      7);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(Handoff, CompleteLaterRunsAHandlerWithoutExecutorOnTheGivenExecutor) {
  ProxyThread proxy(0);
  std::promise<std::thread::id> ran_on;
  complete_later(
      proxy.executor(),
      [&](std::string s) {
        EXPECT_EQ(s, "done");
        ran_on.set_value(std::this_thread::get_id());
      },
      std::string("done"));
  const std::thread::id id = ran_on.get_future().get();
  EXPECT_NE(id, std::this_thread::get_id());
}

TEST(Engine, HandsOutThreadsRoundRobin) {
  Engine e(2);
  ASSERT_EQ(e.size(), 2u);
  ProxyThread* a = &e.next_thread();
  ProxyThread* b = &e.next_thread();
  ProxyThread* c = &e.next_thread();
  EXPECT_NE(a, b);
  EXPECT_EQ(a, c);
  EXPECT_EQ(a, &e.thread(0));
}

TEST(Engine, HasAtLeastOneThread) {
  Engine e(0);
  EXPECT_EQ(e.size(), 1u);
}

// ---- Mailbox ----

// Runs coroutine `c` on `ctx` to completion (or 5 s), rethrowing its exception.
template <typename T>
T run_coro(asio::io_context& ctx, asio::awaitable<T> c) {
  std::optional<T> result;
  std::exception_ptr error;
  asio::co_spawn(ctx, std::move(c), [&](std::exception_ptr e, T v) {
    error = e;
    if (!e) result = std::move(v);
  });
  ctx.restart();
  ctx.run_for(5s);
  if (error) std::rethrow_exception(error);
  if (!result) throw std::runtime_error("coroutine did not finish within 5 s");
  return std::move(*result);
}

asio::awaitable<std::vector<int>> pop_n(Mailbox<int>& box, int n,
                                        std::chrono::steady_clock::duration limit) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(co_await box.pop(limit));
  co_return out;
}

boost::system::error_code pop_error(asio::io_context& ctx, Mailbox<int>& box,
                                    std::chrono::steady_clock::duration limit) {
  try {
    run_coro(ctx, pop_n(box, 1, limit));
  } catch (const boost::system::system_error& e) {
    return e.code();
  }
  return {};
}

TEST(Mailbox, PopReturnsValuesPushedBeforeInOrder) {
  asio::io_context ctx;
  Mailbox<int> box(ctx.get_executor());
  box.push(1);
  box.push(2);
  box.push(3);
  EXPECT_EQ(run_coro(ctx, pop_n(box, 3, 1s)), (std::vector<int>{1, 2, 3}));
}

TEST(Mailbox, PopWaitsForValuesPushedLater) {
  asio::io_context ctx;
  Mailbox<int> box(ctx.get_executor());
  asio::post(ctx, [&] {
    box.push(7);
    asio::post(ctx, [&] { box.push(8); });
  });
  EXPECT_EQ(run_coro(ctx, pop_n(box, 2, 5s)), (std::vector<int>{7, 8}));
}

TEST(Mailbox, PopTimesOutAtItsDeadline) {
  asio::io_context ctx;
  Mailbox<int> box(ctx.get_executor());
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(pop_error(ctx, box, 50ms), asio::error::timed_out);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 50ms);
  EXPECT_LT(took, 2s);
}

TEST(Mailbox, PopAfterFailThrowsTheFailure) {
  asio::io_context ctx;
  Mailbox<int> box(ctx.get_executor());
  box.fail(asio::error::operation_aborted);
  EXPECT_EQ(pop_error(ctx, box, 5s), asio::error::operation_aborted);
}

TEST(Mailbox, FailWakesAWaitingPop) {
  asio::io_context ctx;
  Mailbox<int> box(ctx.get_executor());
  asio::post(ctx, [&] { box.fail(asio::error::connection_reset); });
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(pop_error(ctx, box, 5s), asio::error::connection_reset);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

TEST(Mailbox, ValuesPushedBeforeFailAreStillDelivered) {
  asio::io_context ctx;
  Mailbox<int> box(ctx.get_executor());
  box.push(4);
  box.fail(asio::error::operation_aborted);
  EXPECT_EQ(run_coro(ctx, pop_n(box, 1, 1s)), (std::vector<int>{4}));
  EXPECT_EQ(pop_error(ctx, box, 1s), asio::error::operation_aborted);
}

// ---- CloseAfter ----

struct SocketPair {
  explicit SocketPair(asio::io_context& ctx) : client(ctx), server(ctx) {
    tcp::acceptor acc(ctx, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    client.connect(acc.local_endpoint());
    acc.accept(server);
  }
  tcp::socket client, server;
};

asio::awaitable<boost::system::error_code> read_one(tcp::socket& s,
                                                    std::chrono::steady_clock::duration limit,
                                                    bool& fired) {
  CloseAfter guard(s, limit);
  char byte;
  boost::system::error_code ec;
  try {
    co_await asio::async_read(s, asio::buffer(&byte, 1), asio::use_awaitable);
  } catch (const boost::system::system_error& e) {
    ec = e.code();
  }
  fired = guard.fired();
  co_return ec;
}

TEST(CloseAfter, ClosesASocketWhosePeerNeverWrites) {
  asio::io_context ctx;
  SocketPair pair(ctx);
  bool fired = false;
  auto start = std::chrono::steady_clock::now();
  auto ec = run_coro(ctx, read_one(pair.server, 100ms, fired));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(ec, asio::error::operation_aborted);
  EXPECT_TRUE(fired);
  EXPECT_FALSE(pair.server.is_open());
  EXPECT_GE(took, 100ms);
  EXPECT_LT(took, 2s);
}

TEST(CloseAfter, LeavesTheSocketOpenWhenThePeerWritesInTime) {
  asio::io_context ctx;
  SocketPair pair(ctx);
  asio::write(pair.client, asio::buffer("x", 1));
  bool fired = true;
  auto ec = run_coro(ctx, read_one(pair.server, 200ms, fired));
  EXPECT_EQ(ec, boost::system::error_code());
  EXPECT_FALSE(fired);
  // Past the limit: the guard's timer was cancelled with the guard.
  std::this_thread::sleep_for(300ms);
  ctx.restart();
  ctx.poll();
  EXPECT_TRUE(pair.server.is_open());
}

}  // namespace
}  // namespace coccl::runtime
