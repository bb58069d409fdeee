// Every collective on a 1-rank communicator: reductions over one rank return the input (avg
// divides by 1), data movement copies, in place leaves the data as it was.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <coccl/coccl.hpp>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "collectives/comm_params.hpp"

namespace coccl {
namespace {

namespace asio = boost::asio;

class SingleRank : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    comm_ = new Communicator(Communicator::create(UniqueId::create(), 0, 1));
  }
  static void TearDownTestSuite() {
    comm_->destroy();
    delete comm_;
    comm_ = nullptr;
  }
  Communicator& c() { return *comm_; }

  static std::vector<float> iota_f(std::size_t n, float start) {
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), start);
    return v;
  }

  // The last `n` operations of the trace, oldest first, each of which must have finished.
  std::vector<TraceEntry> last_ops(std::size_t n) {
    CommStatus st = c().status();
    EXPECT_EQ(st.started, st.finished) << "an operation is still running";
    EXPECT_EQ(st.queued, 0u);
    EXPECT_GE(st.trace.size(), n);
    if (st.trace.size() < n) return {};
    return {st.trace.end() - static_cast<std::ptrdiff_t>(n), st.trace.end()};
  }

  // Checks that `e` records the host operation `op` over `count` elements as done.
  static void expect_done(const TraceEntry& e, const char* op, std::uint64_t count) {
    EXPECT_EQ(e.op, op);
    EXPECT_FALSE(e.device) << op;
    EXPECT_EQ(e.count, count) << op;
    EXPECT_EQ(e.state, TraceEntry::State::done) << op;
  }

  static Communicator* comm_;
};
Communicator* SingleRank::comm_ = nullptr;

TEST_F(SingleRank, HasRankZeroOfOne) {
  EXPECT_EQ(c().rank(), 0);
  EXPECT_EQ(c().size(), 1);
}

// Bytes of the values 0, 1, 2, 3, 0, 1, ... in type `t`, all exactly representable.
std::vector<std::uint8_t> small_values(DataType t, std::size_t count) {
  std::vector<std::uint8_t> out(count * size_of(t));
  for (std::size_t i = 0; i < count; ++i) {
    int v = static_cast<int>(i % 4);
    std::uint8_t* p = out.data() + i * size_of(t);
    auto put = [&](auto x) { std::memcpy(p, &x, sizeof x); };
    switch (t) {
      case DataType::int8:
        put(static_cast<std::int8_t>(v));
        break;
      case DataType::uint8:
        put(static_cast<std::uint8_t>(v));
        break;
      case DataType::int32:
        put(static_cast<std::int32_t>(v));
        break;
      case DataType::uint32:
        put(static_cast<std::uint32_t>(v));
        break;
      case DataType::int64:
        put(static_cast<std::int64_t>(v));
        break;
      case DataType::uint64:
        put(static_cast<std::uint64_t>(v));
        break;
      case DataType::float32:
        put(static_cast<float>(v));
        break;
      case DataType::float64:
        put(static_cast<double>(v));
        break;
      case DataType::float16: {
        const std::uint16_t h[] = {0x0000, 0x3c00, 0x4000, 0x4200};
        put(h[v]);
        break;
      }
      case DataType::bfloat16: {
        const std::uint16_t h[] = {0x0000, 0x3f80, 0x4000, 0x4040};
        put(h[v]);
        break;
      }
      case DataType::float8_e4m3: {
        const std::uint8_t h[] = {0x00, 0x38, 0x40, 0x44};
        put(h[v]);
        break;
      }
      case DataType::float8_e5m2: {
        const std::uint8_t h[] = {0x00, 0x3c, 0x40, 0x42};
        put(h[v]);
        break;
      }
    }
  }
  return out;
}

constexpr std::size_t kCount = 1000;

class SingleRankAllReduce : public SingleRank,
                            public ::testing::WithParamInterface<std::tuple<DataType, ReduceOp>> {};

TEST_P(SingleRankAllReduce, ReturnsTheInput) {
  auto [type, op] = GetParam();
  auto in = small_values(type, kCount);
  std::vector<std::uint8_t> out(in.size(), 0xee);
  c().all_reduce(in.data(), out.data(), kCount, type, op);
  EXPECT_EQ(out, in);
}

TEST_P(SingleRankAllReduce, InPlaceLeavesTheInput) {
  auto [type, op] = GetParam();
  auto want = small_values(type, kCount);
  auto data = want;
  c().all_reduce(data.data(), data.data(), kCount, type, op);
  EXPECT_EQ(data, want);
}

TEST_P(SingleRankAllReduce, ReduceReturnsTheInput) {
  auto [type, op] = GetParam();
  auto in = small_values(type, kCount);
  std::vector<std::uint8_t> out(in.size(), 0xee);
  c().reduce(in.data(), out.data(), kCount, type, op, 0);
  EXPECT_EQ(out, in);
}

TEST_P(SingleRankAllReduce, ReduceScatterReturnsTheInput) {
  auto [type, op] = GetParam();
  auto in = small_values(type, kCount);
  std::vector<std::uint8_t> out(in.size(), 0xee);
  c().reduce_scatter(in.data(), out.data(), kCount, type, op);
  EXPECT_EQ(out, in);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypesAndOps, SingleRankAllReduce,
    ::testing::Combine(::testing::Values(DataType::int8, DataType::uint8, DataType::int32,
                                         DataType::uint32, DataType::int64, DataType::uint64,
                                         DataType::float16, DataType::float32, DataType::float64,
                                         DataType::bfloat16, DataType::float8_e4m3,
                                         DataType::float8_e5m2),
                       ::testing::Values(ReduceOp::sum, ReduceOp::prod, ReduceOp::max,
                                         ReduceOp::min, ReduceOp::avg)),
    [](const auto& info) {
      return std::string(to_string(std::get<0>(info.param))) + "_" +
             std::string(to_string(std::get<1>(info.param)));
    });

TEST_F(SingleRank, AvgOfIntegersDividesByOne) {
  std::int32_t in[3] = {7, -7, 5}, out[3] = {};
  c().all_reduce(in, out, 3, DataType::int32, ReduceOp::avg);
  EXPECT_EQ(out[0], 7);
  EXPECT_EQ(out[1], -7);
  EXPECT_EQ(out[2], 5);
}

TEST_F(SingleRank, AvgOfFloatsDividesByOne) {
  float in[2] = {2.5f, -0.125f}, out[2] = {};
  c().all_reduce(in, out, 2, DataType::float32, ReduceOp::avg);
  EXPECT_EQ(out[0], 2.5f);
  EXPECT_EQ(out[1], -0.125f);
}

TEST_F(SingleRank, ReduceInPlaceLeavesTheInput) {
  auto data = iota_f(100, 1);
  auto want = data;
  c().reduce(data.data(), data.data(), 100, DataType::float32, ReduceOp::avg, 0);
  EXPECT_EQ(data, want);
}

TEST_F(SingleRank, LargeAllReduceCopies) {
  // Larger than COCCL_ALLREDUCE_ONESHOT_MAX and several slots.
  auto in = iota_f(1 << 20, 0);
  std::vector<float> out(in.size(), -1);
  c().all_reduce(in.data(), out.data(), in.size(), DataType::float32, ReduceOp::sum);
  EXPECT_EQ(out, in);
}

TEST_F(SingleRank, ZeroCountAllReduceSucceeds) {
  float x = 3;
  c().all_reduce(&x, &x, 0, DataType::float32, ReduceOp::sum);
  EXPECT_EQ(x, 3);
}

// Count 0 needs no buffers, writes nothing, and is still an operation of the communicator's
// sequence (every rank calls it): it runs, finishes, and is traced as done.
TEST_F(SingleRank, ZeroCountWithNullBuffersSucceeds) {
  std::uint64_t before = c().status().finished;
  c().all_reduce(nullptr, nullptr, 0, DataType::float32, ReduceOp::sum);
  c().all_gather(nullptr, nullptr, 0, DataType::float32);
  c().broadcast(nullptr, nullptr, 0, DataType::float32, 0);
  std::vector<float> in(4, 7), out(4, -1);
  c().all_reduce(in.data(), out.data(), 0, DataType::float32, ReduceOp::sum);
  EXPECT_EQ(out, std::vector<float>(4, -1));
  EXPECT_EQ(in, std::vector<float>(4, 7));

  EXPECT_EQ(c().status().finished, before + 4);
  auto ops = last_ops(4);
  ASSERT_EQ(ops.size(), 4u);
  expect_done(ops[0], "all_reduce", 0);
  expect_done(ops[1], "all_gather", 0);
  expect_done(ops[2], "broadcast", 0);
  expect_done(ops[3], "all_reduce", 0);
  for (std::size_t i = 0; i < ops.size(); ++i) EXPECT_EQ(ops[i].seq, before + 1 + i);
}

TEST_F(SingleRank, BroadcastCopies) {
  auto in = iota_f(300, 5);
  std::vector<float> out(300, -1);
  c().broadcast(in.data(), out.data(), 300, DataType::float32, 0);
  EXPECT_EQ(out, in);
}

TEST_F(SingleRank, BroadcastInPlaceLeavesTheData) {
  auto data = iota_f(300, 5);
  auto want = data;
  c().broadcast(data.data(), data.data(), 300, DataType::float32, 0);
  EXPECT_EQ(data, want);
}

TEST_F(SingleRank, AllGatherCopies) {
  auto in = iota_f(257, 1);
  std::vector<float> out(257, -1);
  c().all_gather(in.data(), out.data(), 257, DataType::float32);
  EXPECT_EQ(out, in);
}

TEST_F(SingleRank, AllGatherInPlaceLeavesTheData) {
  auto data = iota_f(257, 1);
  auto want = data;
  c().all_gather(data.data(), data.data(), 257, DataType::float32);
  EXPECT_EQ(data, want);
}

TEST_F(SingleRank, ReduceScatterInPlaceLeavesTheData) {
  auto data = iota_f(64, 3);
  auto want = data;
  c().reduce_scatter(data.data(), data.data(), 64, DataType::float32, ReduceOp::sum);
  EXPECT_EQ(data, want);
}

TEST_F(SingleRank, AllToAllCopies) {
  auto in = iota_f(129, 2);
  std::vector<float> out(129, -1);
  c().all_to_all(in.data(), out.data(), 129, DataType::float32);
  EXPECT_EQ(out, in);
}

TEST_F(SingleRank, AllToAllInPlaceLeavesTheData) {
  auto data = iota_f(129, 2);
  auto want = data;
  c().all_to_all(data.data(), data.data(), 129, DataType::float32);
  EXPECT_EQ(data, want);
}

TEST_F(SingleRank, AllToAllvCopiesWithDisplacements) {
  auto in = iota_f(10, 0);
  std::vector<float> out(12, -1);
  c().all_to_allv(in.data(), {4}, {3}, out.data(), {4}, {5}, DataType::float32);
  std::vector<float> want(12, -1);
  for (int i = 0; i < 4; ++i) want[5 + i] = in[3 + i];
  EXPECT_EQ(out, want);
}

// All counts 0: null buffers are accepted, real ones are left as they were (displacements
// included), and the operation is traced as done.
TEST_F(SingleRank, AllToAllvOfNothingSucceeds) {
  std::uint64_t before = c().status().finished;
  c().all_to_allv(nullptr, {0}, {0}, nullptr, {0}, {0}, DataType::float32);
  auto in = iota_f(8, 1);
  std::vector<float> out(8, -1);
  c().all_to_allv(in.data(), {0}, {3}, out.data(), {0}, {5}, DataType::float32);
  EXPECT_EQ(out, std::vector<float>(8, -1));
  EXPECT_EQ(in, iota_f(8, 1));

  EXPECT_EQ(c().status().finished, before + 2);
  auto ops = last_ops(2);
  ASSERT_EQ(ops.size(), 2u);
  expect_done(ops[0], "all_to_allv", 0);
  expect_done(ops[1], "all_to_allv", 0);
}

TEST_F(SingleRank, GatherCopies) {
  auto in = iota_f(77, 9);
  std::vector<float> out(77, -1);
  c().gather(in.data(), out.data(), 77, DataType::float32, 0);
  EXPECT_EQ(out, in);
}

TEST_F(SingleRank, GatherInPlaceLeavesTheData) {
  auto data = iota_f(77, 9);
  auto want = data;
  c().gather(data.data(), data.data(), 77, DataType::float32, 0);
  EXPECT_EQ(data, want);
}

TEST_F(SingleRank, ScatterCopies) {
  auto in = iota_f(77, 4);
  std::vector<float> out(77, -1);
  c().scatter(in.data(), out.data(), 77, DataType::float32, 0);
  EXPECT_EQ(out, in);
}

TEST_F(SingleRank, ScatterInPlaceLeavesTheData) {
  auto data = iota_f(77, 4);
  auto want = data;
  c().scatter(data.data(), data.data(), 77, DataType::float32, 0);
  EXPECT_EQ(data, want);
}

// A barrier is one operation of the communicator's sequence: it runs and is traced as done, after
// the operation before it. (Across ranks, Collectives.BarrierReleasesNoRankBeforeTheLastEnters in
// tests/multirank checks that no rank leaves before the last one enters.)
TEST_F(SingleRank, BarrierCompletes) {
  auto in = iota_f(64, 1);
  std::vector<float> out(64, -1);
  c().all_reduce(in.data(), out.data(), in.size(), DataType::float32, ReduceOp::sum);
  std::uint64_t before = c().status().finished;
  c().barrier();
  EXPECT_EQ(c().status().finished, before + 1);
  auto ops = last_ops(2);
  ASSERT_EQ(ops.size(), 2u);
  expect_done(ops[0], "all_reduce", in.size());
  expect_done(ops[1], "barrier", 0);
  EXPECT_EQ(ops[1].seq, before + 1);
  EXPECT_EQ(ops[0].seq, before);
}

TEST_F(SingleRank, SendToSelfArrivesInTheMatchingReceive) {
  auto in = iota_f(50, 1);
  std::vector<float> out(50, -1);
  c().send_recv({Communicator::send_op(in.data(), 50, DataType::float32, 0),
                 Communicator::recv_op(out.data(), 50, DataType::float32, 0)});
  EXPECT_EQ(out, in);
}

TEST_F(SingleRank, SendsToSelfMatchReceivesInOrder) {
  float a[2] = {1, 2}, b[3] = {3, 4, 5}, ra[2] = {}, rb[3] = {};
  c().send_recv({Communicator::recv_op(ra, 2, DataType::float32, 0),
                 Communicator::send_op(a, 2, DataType::float32, 0),
                 Communicator::send_op(b, 3, DataType::float32, 0),
                 Communicator::recv_op(rb, 3, DataType::float32, 0)});
  EXPECT_EQ(std::vector<float>(ra, ra + 2), std::vector<float>(a, a + 2));
  EXPECT_EQ(std::vector<float>(rb, rb + 3), std::vector<float>(b, b + 3));
}

TEST_F(SingleRank, ManyOperationsInARowSucceed) {
  for (int i = 0; i < 100; ++i) {
    std::int64_t in = i, out = -1;
    c().all_reduce(&in, &out, 1, DataType::int64, ReduceOp::sum);
    ASSERT_EQ(out, i);
  }
}

// A coroutine on the communicator's executor holds the proxy thread's role itself, so every small
// operation it awaits takes the fast path (collectives/fast_path.hpp), finished in its call.
TEST_F(SingleRank, SmallOperationsAwaitedOnItsExecutorTakeTheFastPath) {
  const CommStatus before = c().status();
  const auto in = iota_f(33, 5);
  std::vector<float> reduced(33), gathered(33), scattered(33), exchanged(33);
  asio::co_spawn(
      c().executor(),
      [&]() -> asio::awaitable<void> {
        co_await c().async_all_reduce(in.data(), reduced.data(), 33, DataType::float32,
                                      ReduceOp::max, asio::use_awaitable);
        co_await c().async_all_gather(in.data(), gathered.data(), 33, DataType::float32,
                                      asio::use_awaitable);
        co_await c().async_reduce_scatter(in.data(), scattered.data(), 33, DataType::float32,
                                          ReduceOp::avg, asio::use_awaitable);
        co_await c().async_all_to_all(in.data(), exchanged.data(), 33, DataType::float32,
                                      asio::use_awaitable);
      },
      asio::use_future)
      .get();
  EXPECT_EQ(reduced, in);
  EXPECT_EQ(gathered, in);
  EXPECT_EQ(scattered, in);
  EXPECT_EQ(exchanged, in);
  const CommStatus after = c().status();
  EXPECT_EQ(after.fast_ops - before.fast_ops, 4u);
  EXPECT_EQ(after.fast_handed_over, before.fast_handed_over);
  for (const TraceEntry& e : last_ops(4)) EXPECT_EQ(e.state, TraceEntry::State::done) << e.op;
}

// COCCL_COLLTRACE_SIZE bounds the trace: once the ring has wrapped (twice, and then a partial
// lap), it holds the newest operations, oldest first, each closed as done with its own count.
TEST(SingleRankTrace, KeepsTheNewestOperationsInOrderOnceItsRingWraps) {
  params::colltrace_size.set_override("5");
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  params::colltrace_size.set_override(std::nullopt);
  const CommStatus before = c.status();
  for (std::size_t i = 1; i <= 13; ++i) {
    std::vector<float> in(i, 1.0f), out(i);
    c.all_reduce(in.data(), out.data(), i, DataType::float32, ReduceOp::sum);
  }
  const CommStatus st = c.status();
  EXPECT_GT(st.fast_ops, before.fast_ops);
  ASSERT_EQ(st.trace.size(), 5u);
  for (std::size_t k = 0; k < 5; ++k) {
    const TraceEntry& e = st.trace[k];
    EXPECT_EQ(e.seq, st.started - 4 + k) << k;
    EXPECT_EQ(e.count, 9 + k) << k;
    EXPECT_EQ(e.op, "all_reduce") << k;
    EXPECT_EQ(e.state, TraceEntry::State::done) << k;
  }
  c.destroy();
}

TEST(SingleRankLifetime, SplitOfOneRankGivesAOneRankCommunicator) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  Communicator s = c.split(0, 0);
  ASSERT_TRUE(s);
  EXPECT_EQ(s.size(), 1);
  float in = 4, out = 0;
  s.all_reduce(&in, &out, 1, DataType::float32, ReduceOp::sum);
  EXPECT_EQ(out, 4);
  s.destroy();
  c.destroy();
}

TEST(SingleRankLifetime, SplitWithNegativeColorGivesAnEmptyHandle) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  EXPECT_FALSE(c.split(-1, 0));
  c.destroy();
}

}  // namespace
}  // namespace coccl
