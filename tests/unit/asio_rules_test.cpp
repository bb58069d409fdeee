// coccl's asynchronous operations keep Asio's rules: they hold work on the handler's executor
// until the handler has run, honour the handler's cancellation slot (async_create included),
// offer get_executor(), and a blocking call made on a proxy thread fails at once instead of
// deadlocking. The cancellation of operations in flight across ranks is in the multi-rank tests.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <coccl/coccl.hpp>
#include <cstdint>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "collectives/comm.hpp"
#include "collectives/status_codec.hpp"

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
  Communicator::async_create(
      UniqueId::create(), 0, 2,
      asio::bind_cancellation_slot(
          sig.slot(), asio::bind_executor(io, [&](std::error_code ec, Communicator comm) {
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

// ---- Error type: completions pass boost::system::error_code (issue 15). ----

TEST(AsioRules, UseAwaitableThrowsBoostSystemErrorWithCocclsCode) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  asio::io_context io;
  std::string what;
  boost::system::error_code thrown;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        try {
          // A null buffer with elements: refused, nothing sent.
          co_await c.async_all_reduce(nullptr, nullptr, 4, DataType::int32, ReduceOp::sum,
                                      asio::use_awaitable);
        } catch (const boost::system::system_error& e) {
          thrown = e.code();
          what = e.what();
        }
      },
      asio::detached);
  io.run();
  EXPECT_EQ(thrown, errc::invalid_argument) << thrown.message();
  EXPECT_EQ(thrown.message(), make_error_code(errc::invalid_argument).message());
  // Back to the standard type without loss: coccl's own category.
  const std::error_code back = thrown;
  EXPECT_EQ(&back.category(), &error_category());
  EXPECT_EQ(back, errc::invalid_argument);
  c.destroy();
}

TEST(AsioRules, AsTupleAndRedirectErrorGiveTheCode) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  asio::io_context io;
  boost::system::error_code from_tuple, redirected, ok = make_error_code(errc::internal);
  std::int32_t x = 3, y = 0;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto [ec] = co_await c.async_barrier(asio::as_tuple(asio::use_awaitable));
        ok = ec;
        std::tie(from_tuple) =
            co_await c.async_all_reduce(nullptr, nullptr, 1, DataType::int32, ReduceOp::sum,
                                        asio::as_tuple(asio::use_awaitable));
        co_await c.async_broadcast(&x, &y, 1, DataType::int32, 5,
                                   asio::redirect_error(asio::use_awaitable, redirected));
      },
      asio::detached);
  io.run();
  EXPECT_FALSE(ok) << ok.message();
  EXPECT_EQ(from_tuple, errc::invalid_argument) << from_tuple.message();
  EXPECT_EQ(redirected, errc::invalid_argument) << redirected.message();
  // The blocking forms keep std::system_error, and the error_code& forms take Boost's type.
  EXPECT_THROW(c.all_reduce(nullptr, nullptr, 1, DataType::int32, ReduceOp::sum),
               std::system_error);
  boost::system::error_code ec;
  c.all_reduce(nullptr, nullptr, 1, DataType::int32, ReduceOp::sum, ec);
  EXPECT_EQ(ec, errc::invalid_argument);
  c.destroy();
}

// ---- Every operation has a blocking, an error_code& and an async form. ----

TEST(AsioRules, DeviceOperationsHaveErrorCodeAndAsyncForms) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  // Null device buffers with elements: refused (or, without CUDA, unsupported) without a throw.
  auto refused = [](const boost::system::error_code& ec) {
    return ec == errc::invalid_argument || ec == errc::unsupported;
  };
  const cuda_stream s = nullptr;
  const DataType t = DataType::float32;
  std::vector<std::size_t> one{1};
  boost::system::error_code ec;
  c.all_reduce(nullptr, nullptr, 1, t, ReduceOp::sum, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.all_gather(nullptr, nullptr, 1, t, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.reduce_scatter(nullptr, nullptr, 1, t, ReduceOp::sum, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.all_to_all(nullptr, nullptr, 1, t, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.broadcast(nullptr, nullptr, 1, t, 0, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.reduce(nullptr, nullptr, 1, t, ReduceOp::sum, 0, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.gather(nullptr, nullptr, 1, t, 0, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.scatter(nullptr, nullptr, 1, t, 0, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.all_to_allv(nullptr, one, {0}, nullptr, one, {0}, t, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.send_recv({Transfer::send(nullptr, 1, t, 0), Transfer::recv(nullptr, 1, t, 0)}, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.send(nullptr, 1, t, 0, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  ec.clear();
  c.recv(nullptr, 1, t, 0, s, ec);
  EXPECT_TRUE(refused(ec)) << ec.message();
  // The asynchronous device send and receive.
  asio::io_context io;
  std::vector<boost::system::error_code> got;
  auto keep = [&](boost::system::error_code e) { got.push_back(e); };
  c.async_send(nullptr, 1, t, 0, s, asio::bind_executor(io, keep));
  c.async_recv(nullptr, 1, t, 0, s, asio::bind_executor(io, keep));
  io.run();
  ASSERT_EQ(got.size(), 2u);
  for (const auto& e : got) EXPECT_TRUE(refused(e)) << e.message();
  c.destroy();
}

// ---- Communicator::Options. ----

TEST(CommunicatorOptions, TimeoutEndsACreateWhoseRankNeverJoins) {
  // Rank 1 of 2 never comes: the options' timeout, not COCCL_TIMEOUT, ends the join.
  Communicator::Options o;
  o.timeout = 300ms;
  try {
    Communicator::create(UniqueId::create(), 0, 2, o);
    FAIL() << "create without rank 1 succeeded";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::timed_out) << e.what();
    EXPECT_NE(std::string(e.what()).find("Options::timeout"), std::string::npos) << e.what();
  }
}

TEST(CommunicatorOptions, NameIsInStatusAndErrors) {
  Communicator::Options o;
  o.name = "grad-sync";
  Communicator c = Communicator::create(UniqueId::create(), 0, 1, o);
  const CommStatus s = c.status();
  EXPECT_EQ(s.name, "grad-sync");
  EXPECT_NE(s.json().find("\"name\":\"grad-sync\""), std::string::npos) << s.json();
  // Round trip through the status answer coccl-status reads.
  EXPECT_EQ(detail::decode_status(detail::encode_status(s)).name, "grad-sync");
  c.abort();
}

TEST(CommunicatorOptions, NonBlockingRefusesBlockingFormsAndRunsAsyncOnes) {
  Communicator::Options o;
  o.blocking = false;
  Communicator c = Communicator::create(UniqueId::create(), 0, 1, o);
  std::int32_t x = 4, y = 0;
  boost::system::error_code ec;
  c.all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum, ec);
  EXPECT_EQ(ec, std::errc::operation_would_block) << ec.message();
  EXPECT_EQ(y, 0);
  EXPECT_THROW(c.barrier(), std::system_error);
  asio::io_context io;
  c.async_all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum,
                     asio::bind_executor(io, [&](boost::system::error_code e) { ec = e; }));
  io.run();
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(y, 4);
  c.destroy();
}

// Runs `body(rank, comm)` on `n` rank threads of one communicator made with `options`.
void on_ranks(int n, const Communicator::Options& options,
              const std::function<void(int, Communicator&)>& body) {
  const UniqueId id = UniqueId::create();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Communicator c = Communicator::create(id, r, n, options);
      body(r, c);
      c.destroy();
    });
  for (auto& t : threads) t.join();
}

TEST(CommunicatorOptions, TransportOptionPicksTcp) {
  // Two ranks of one host would use shm by default; the option makes every link tcp.
  Communicator::Options o;
  o.transport = "tcp";
  std::vector<std::vector<std::string>> kinds(2);
  on_ranks(2, o, [&](int r, Communicator& c) {
    std::int32_t x = r, y = -1;
    c.all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum);
    EXPECT_EQ(y, 1);
    auto impl = detail::impl_of(c);
    std::promise<std::vector<std::string>> seen;
    asio::post(impl->executor(), [&] {
      std::vector<std::string> k;
      for (const auto& conn : impl->peers().connections())
        if (conn) k.push_back(conn->kind());
      seen.set_value(k);
    });
    kinds[r] = seen.get_future().get();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(kinds[r].empty()) << "rank " << r << " has no link";
    for (const auto& k : kinds[r]) EXPECT_EQ(k, "tcp") << "rank " << r;
  }
  o.transport = "carrier-pigeon";
  try {
    Communicator::create(UniqueId::create(), 0, 1, o);
    FAIL() << "an unknown transport was accepted";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("carrier-pigeon"), std::string::npos) << e.what();
  }
}

// ---- Per-operation deadline. ----

TEST(Deadline, AnOperationPastItsDeadlineFailsWithTimedOutAndAbortsEveryRank) {
  // Rank 1 joins but never enters the all_reduce until rank 0 has failed.
  std::atomic<bool> rank0_done{false};
  boost::system::error_code got0, got1;
  std::string why0, why1;
  on_ranks(2, {}, [&](int r, Communicator& c) {
    std::int32_t x = 1, y = 0;
    if (r == 0) {
      c.with_deadline(200ms).all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum, got0);
      why0 = c.last_error();
      rank0_done = true;
      rank0_done.notify_one();
    } else {
      rank0_done.wait(false);
      // Its all_reduce may still complete with the data rank 0 had sent before it gave up; the
      // next operation finds the communicator aborted.
      boost::system::error_code ignored;
      c.all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum, ignored);
      c.barrier(got1);
      why1 = c.last_error();
    }
  });
  EXPECT_EQ(got0, errc::timed_out) << got0.message();
  EXPECT_NE(why0.find("deadline"), std::string::npos) << why0;
  EXPECT_NE(why0.find("all_reduce"), std::string::npos) << why0;
  // The peer fails too, told by rank 0 why (the notice carries the code and the text).
  EXPECT_TRUE(got1 == errc::timed_out || got1 == errc::remote_error) << got1.message();
  EXPECT_NE(why1.find("rank 0 aborted"), std::string::npos) << why1;
  EXPECT_NE(why1.find("deadline"), std::string::npos) << why1;
}

TEST(Deadline, AnOperationWithinItsDeadlineIsUnaffected) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  std::int32_t x = 7, y = 0;
  Communicator d = c.with_deadline(60s);
  for (int i = 0; i < 20; ++i) d.all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum);
  EXPECT_EQ(y, 7);
  EXPECT_FALSE(c.error());
  c.destroy();
}

// ---- Groups. ----

TEST(Group, OperationsOfAGroupMatchTheReferenceOnThreeRanks) {
  constexpr int n = 3;
  constexpr std::size_t count = 1000;
  std::vector<int> failures(n, 0);
  on_ranks(n, {}, [&](int r, Communicator& c) {
    std::vector<std::int64_t> a(count), sum(count), gathered(count * n), from_left(count),
        bcast(count);
    for (std::size_t i = 0; i < count; ++i) a[i] = static_cast<std::int64_t>(i) * (r + 1);
    std::vector<std::int64_t> to_right = a;
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    if (r == 1) bcast = a;
    // The blocking form with a filling function.
    c.group([&](Group& g) {
      g.all_reduce(a.data(), sum.data(), count, DataType::int64, ReduceOp::sum);
      g.send(to_right.data(), count, DataType::int64, right);
      g.recv(from_left.data(), count, DataType::int64, left);
      g.all_gather(a.data(), gathered.data(), count, DataType::int64);
      g.broadcast(bcast.data(), bcast.data(), count, DataType::int64, 1);
    });
    for (std::size_t i = 0; i < count; ++i) {
      const auto v = static_cast<std::int64_t>(i);
      failures[r] += sum[i] != v * (1 + 2 + 3);
      failures[r] += from_left[i] != v * (left + 1);
      failures[r] += bcast[i] != v * 2;
      for (int p = 0; p < n; ++p) failures[r] += gathered[p * count + i] != v * (p + 1);
    }
    // The asynchronous form, awaited: one completion for the whole group.
    asio::io_context io;
    boost::system::error_code ec = make_error_code(errc::internal);
    std::int32_t one = 1, ranks = 0, mx = 0;
    Group g;
    g.all_reduce(&one, &ranks, 1, DataType::int32, ReduceOp::sum);
    g.barrier();
    std::int32_t mine = r;
    g.all_reduce(&mine, &mx, 1, DataType::int32, ReduceOp::max);
    EXPECT_EQ(g.size(), 3u);
    c.async_group(std::move(g),
                  asio::bind_executor(io, [&](boost::system::error_code e) { ec = e; }));
    io.run();
    EXPECT_FALSE(ec) << ec.message();
    failures[r] += ranks != n;
    failures[r] += mx != n - 1;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(failures[r], 0) << "rank " << r;
}

TEST(Group, ABadMemberFailsTheGroupWithNothingSent) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  std::int32_t x = 2, y = 0;
  Group g;
  g.all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum);
  g.broadcast(&x, &y, 1, DataType::int32, 3);  // no rank 3
  boost::system::error_code ec;
  c.group(std::move(g), ec);
  EXPECT_EQ(ec, errc::invalid_argument) << ec.message();
  EXPECT_EQ(y, 0) << "a member ran although the group was refused";
  // The communicator is unharmed; an empty group succeeds.
  c.group(Group{});
  c.all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum);
  EXPECT_EQ(y, 2);
  c.destroy();
}

TEST(Group, CancellingAGroupBeforeItStartsRemovesEveryMember) {
  // Rank 0's group waits behind an all_reduce that rank 1 enters only once the group has been
  // cancelled, so the cancellation finds it queued.
  std::atomic<bool> cancelled{false};
  boost::system::error_code group_ec, first_ec = make_error_code(errc::internal);
  std::int32_t y = 0, z = 0;
  std::vector<boost::system::error_code> after(2, make_error_code(errc::internal));
  on_ranks(2, {}, [&](int r, Communicator& c) {
    std::int32_t x = 5, sum = 0;
    if (r == 0) {
      asio::io_context io;
      asio::cancellation_signal sig;
      bool group_done = false;
      c.async_all_reduce(
          &x, &sum, 1, DataType::int32, ReduceOp::sum,
          asio::bind_executor(io, [&](boost::system::error_code e) { first_ec = e; }));
      Group g;
      g.all_reduce(&x, &y, 1, DataType::int32, ReduceOp::sum);
      g.all_reduce(&x, &z, 1, DataType::int32, ReduceOp::sum);
      c.async_group(std::move(g),
                    asio::bind_cancellation_slot(
                        sig.slot(), asio::bind_executor(io, [&](boost::system::error_code e) {
                          group_ec = e;
                          group_done = true;
                        })));
      sig.emit(asio::cancellation_type::total);
      while (!group_done) io.run_one();
      cancelled = true;
      cancelled.notify_one();
      io.run();
    } else {
      cancelled.wait(false);
      c.all_reduce(&x, &sum, 1, DataType::int32, ReduceOp::sum);
    }
    EXPECT_EQ(sum, 10) << "rank " << r;
    c.barrier(after[r]);
  });
  EXPECT_EQ(group_ec, std::errc::operation_canceled) << group_ec.message();
  EXPECT_FALSE(first_ec) << first_ec.message();
  EXPECT_EQ(y, 0);
  EXPECT_EQ(z, 0);
  for (int r = 0; r < 2; ++r) EXPECT_FALSE(after[r]) << "rank " << r << ": " << after[r].message();
}
}  // namespace
}  // namespace coccl

namespace coccl {
namespace {

TEST(AsioRules, CancellingAnOperationBetweenQueuedOnesKeepsTheOthers) {
  // Rank 0 queues four all_reduces behind one that waits for rank 1, then cancels the second of
  // the four: taking it out from between the others must leave them whole (Boost 1.81's
  // any_completion_handler recursed without end when a queue moved one by assignment).
  std::atomic<bool> cancelled{false};
  std::vector<std::int32_t> sums(5, 0);
  std::vector<boost::system::error_code> ecs(5, make_error_code(errc::internal));
  on_ranks(2, {}, [&](int r, Communicator& c) {
    std::int32_t x = r + 1;
    if (r == 0) {
      asio::io_context io;
      asio::cancellation_signal sig;
      int done = 0;
      for (int i = 0; i < 5; ++i) {
        auto record = asio::bind_executor(io, [&, i](boost::system::error_code e) {
          ecs[i] = e;
          ++done;
        });
        if (i == 2)
          c.async_all_reduce(&x, &sums[i], 1, DataType::int32, ReduceOp::sum,
                             asio::bind_cancellation_slot(sig.slot(), std::move(record)));
        else
          c.async_all_reduce(&x, &sums[i], 1, DataType::int32, ReduceOp::sum, std::move(record));
      }
      sig.emit(asio::cancellation_type::total);
      while (ecs[2] == errc::internal) io.run_one();
      cancelled = true;
      cancelled.notify_one();
      while (done < 5) io.run_one();
    } else {
      cancelled.wait(false);
      std::int32_t sum = 0;
      for (int i = 0; i < 4; ++i) {
        c.all_reduce(&x, &sum, 1, DataType::int32, ReduceOp::sum);
        EXPECT_EQ(sum, 3) << "rank 1, operation " << i;
      }
    }
  });
  EXPECT_EQ(ecs[2], std::errc::operation_canceled) << ecs[2].message();
  EXPECT_EQ(sums[2], 0) << "the cancelled operation ran";
  for (int i : {0, 1, 3, 4}) {
    EXPECT_FALSE(ecs[i]) << "operation " << i << ": " << ecs[i].message();
    EXPECT_EQ(sums[i], 3) << "operation " << i;
  }
}

}  // namespace
}  // namespace coccl
