// runtime::Gate: passes read open until the gate closes, also after the gate is gone, and
// close_and_wait() returns only once every pass has been dropped.
#include "runtime/gate.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <thread>
#include <utility>

namespace coccl::runtime {
namespace {

TEST(Gate, PassesReadOpenUntilTheGateCloses) {
  Gate gate;
  Gate::Pass a = gate.enter();
  Gate::Pass b = a;
  EXPECT_TRUE(a.open());
  EXPECT_TRUE(b.open());
  EXPECT_FALSE(gate.closed());
  gate.close();
  EXPECT_TRUE(gate.closed());
  EXPECT_FALSE(a.open());
  EXPECT_FALSE(b.open());
  EXPECT_FALSE(gate.enter().open());
}

TEST(Gate, CountsEveryCopyAndNotAMovedFromPass) {
  Gate gate;
  EXPECT_EQ(gate.passes(), 0u);
  {
    Gate::Pass a = gate.enter();
    Gate::Pass b = a;
    EXPECT_EQ(gate.passes(), 2u);
    Gate::Pass c = std::move(a);
    EXPECT_EQ(gate.passes(), 2u);
    EXPECT_FALSE(a.open());  // a moved-from pass holds nothing
    b = c;
    EXPECT_EQ(gate.passes(), 2u);
    b = std::move(c);
    EXPECT_EQ(gate.passes(), 1u);
  }
  EXPECT_EQ(gate.passes(), 0u);
}

TEST(Gate, APassOutlivingItsGateReadsClosed) {
  std::optional<Gate> gate(std::in_place);
  Gate::Pass p = gate->enter();
  EXPECT_TRUE(p.open());
  gate.reset();
  EXPECT_FALSE(p.open());
}

TEST(Gate, CloseAndWaitWithoutPassesReturnsAtOnce) {
  Gate gate;
  { Gate::Pass dropped = gate.enter(); }
  gate.close_and_wait();
  EXPECT_TRUE(gate.closed());
}

TEST(Gate, CloseAndWaitReturnsOnlyAfterTheLastPassIsDropped) {
  Gate gate;
  std::optional<Gate::Pass> first(gate.enter()), second(gate.enter());
  std::atomic<int> dropped{0};
  std::atomic<int> dropped_when_returned{-1};
  std::thread waiter([&] {
    gate.close_and_wait();
    dropped_when_returned = dropped.load();
  });
  // The waiter has closed the gate; it is now blocked (or about to block) on the two passes.
  while (!gate.closed()) std::this_thread::yield();
  dropped = 1;
  first.reset();
  dropped = 2;
  second.reset();
  waiter.join();
  EXPECT_EQ(dropped_when_returned.load(), 2);
  EXPECT_EQ(gate.passes(), 0u);
}

}  // namespace
}  // namespace coccl::runtime
