// coccl's asynchronous operations keep Asio's rules: they hold work on the handler's executor
// until the handler has run, honour the handler's cancellation slot (async_create included),
// offer get_executor(), and a blocking call made on a proxy thread fails at once instead of
// deadlocking. The cancellation of operations in flight across ranks is in the multi-rank tests.
#include <gtest/gtest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <coccl/coccl.hpp>
#include <cstdint>
#include <vector>

namespace coccl {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

TEST(AsioRules, RunReturnsOnlyAfterTheHandlerRan) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  for (int i = 0; i < 50; ++i) {
    asio::io_context io;
    std::vector<std::int32_t> in(1000, i), out(1000, -1);
    bool ran = false;
    std::error_code got = make_error_code(errc::internal);
    c.async_all_reduce(in.data(), out.data(), in.size(), DataType::int32, ReduceOp::sum,
                       asio::bind_executor(io, [&](std::error_code ec) {
                         got = ec;
                         ran = true;
                       }));
    // No work guard: the operation itself keeps io.run() going until its handler has run.
    io.run();
    ASSERT_TRUE(ran) << "io.run() returned before the handler ran (round " << i << ")";
    EXPECT_FALSE(got) << got.message();
    EXPECT_EQ(out, in);
  }
  c.destroy();
}

TEST(AsioRules, GetExecutorIsTheCommunicatorsExecutor) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  EXPECT_TRUE(c.get_executor() == c.executor());
  static_assert(std::is_same_v<Communicator::executor_type, asio::any_io_executor>);
  c.destroy();
}

TEST(AsioRules, BlockingCallOnTheProxyThreadFailsAtOnce) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  std::int32_t x = 1, y = 0;
  auto f = asio::co_spawn(
      c.get_executor(),
      [&]() -> asio::awaitable<std::error_code> {
        boost::system::error_code ec;
        c.all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum, ec);
        co_return ec;
      },
      asio::use_future);
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "the blocking call deadlocked";
  EXPECT_EQ(f.get(), std::errc::resource_deadlock_would_occur);
  // The throwing form says what to do instead.
  auto g = asio::co_spawn(
      c.get_executor(),
      [&]() -> asio::awaitable<std::string> {
        try {
          c.barrier();
        } catch (const std::system_error& e) {
          co_return e.what();
        }
        co_return "";
      },
      asio::use_future);
  ASSERT_EQ(g.wait_for(10s), std::future_status::ready);
  EXPECT_NE(g.get().find("co_await the async_ form"), std::string::npos);
  // The communicator is unharmed.
  c.all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum);
  EXPECT_EQ(y, 1);
  c.destroy();
}

TEST(AsioRules, CancellingACreateThatWaitsForAbsentRanksEndsIt) {
  // Rank 0 of 2; rank 1 never comes, so only cancellation can end the join before COCCL_TIMEOUT.
  asio::io_context io;
  asio::cancellation_signal sig;
  std::error_code got;
  bool ran = false;
  Communicator::async_create(UniqueId::create(), 0, 2,
                             asio::bind_cancellation_slot(
                                 sig.slot(), asio::bind_executor(io, [&](std::error_code ec,
                                                                         Communicator comm) {
                                   got = ec;
                                   ran = true;
                                   EXPECT_FALSE(comm);
                                 })));
  asio::steady_timer t(io, 200ms);
  t.async_wait([&](boost::system::error_code) { sig.emit(asio::cancellation_type::terminal); });
  const auto t0 = std::chrono::steady_clock::now();
  io.run();
  ASSERT_TRUE(ran);
  EXPECT_EQ(got, std::errc::operation_canceled) << got.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

}  // namespace
}  // namespace coccl
