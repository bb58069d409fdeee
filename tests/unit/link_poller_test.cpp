// Tests for transport/link_poller.hpp: a LinkPoller checks the links that have a waiter, and the
// proxy thread's loop passes it by (dormant) while it has none.
#include "transport/link_poller.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <chrono>
#include <future>
#include <thread>

#include "runtime/engine.hpp"
#include "tests/support/eventually.hpp"

namespace coccl::transport {
namespace {

using namespace std::chrono_literals;

// A fake link: counts the poller's checks and idle calls; its waiter comes and goes on command.
class FakeLink final : public PolledLink {
 public:
  bool check() override {
    checks_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  bool has_waiter() const noexcept override { return waiter_.load(std::memory_order_relaxed); }
  void idle() override { idles_.fetch_add(1, std::memory_order_relaxed); }
  void set_waiter(bool w) { waiter_.store(w, std::memory_order_relaxed); }
  int checks() const { return checks_.load(std::memory_order_relaxed); }
  int idles() const { return idles_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> waiter_{false};
  std::atomic<int> checks_{0};
  std::atomic<int> idles_{0};
};

template <typename F>
void on_thread(runtime::ProxyThread& t, F f) {
  std::promise<void> done;
  boost::asio::post(t.executor(), [&] {
    f();
    done.set_value();
  });
  ASSERT_EQ(done.get_future().wait_for(5s), std::future_status::ready);
}

// A poller on `t` checking `link`, which has a waiter, once it has checked it a few times.
void watch(runtime::ProxyThread& t, LinkPoller& poller, FakeLink& link) {
  on_thread(t, [&] {
    t.add_poller(&poller);
    link.set_waiter(true);
    poller.activate(&link);
  });
  ASSERT_TRUE(test::eventually([&] { return link.checks() > 10; }));
}

TEST(LinkPoller, ChecksALinkWhileItHasAWaiterAndAgainOnceAnotherParks) {
  runtime::ProxyThread t(0);
  LinkPoller poller;
  FakeLink link;
  watch(t, poller, link);
  // The waiter resumed: one more check finds nobody waiting, the link goes idle and the poller
  // has nothing left to check.
  on_thread(t, [&] { link.set_waiter(false); });
  ASSERT_TRUE(test::eventually([&] { return link.idles() != 0; }));
  ASSERT_EQ(link.idles(), 1);
  const int after_idle = link.checks();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(link.checks(), after_idle);
  EXPECT_EQ(link.idles(), 1);
  on_thread(t, [&] {
    link.set_waiter(true);
    poller.activate(&link);
  });
  EXPECT_TRUE(test::eventually([&] { return link.checks() > after_idle; }));
  on_thread(t, [&] {
    poller.forget(&link);
    t.remove_poller(&poller);
  });
}

TEST(LinkPoller, ForgettingItsLastWaitingLinkStopsTheChecks) {
  runtime::ProxyThread t(0);
  LinkPoller poller;
  FakeLink link;
  watch(t, poller, link);
  int forgotten_at = 0;
  on_thread(t, [&] {
    poller.forget(&link);
    forgotten_at = link.checks();
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(link.checks(), forgotten_at);
  EXPECT_EQ(link.idles(), 0);
  on_thread(t, [&] { t.remove_poller(&poller); });
}

}  // namespace
}  // namespace coccl::transport
