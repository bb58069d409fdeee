// Argument validation: every invalid call fails with errc::invalid_argument before anything is
// sent, so the communicator stays usable; use after destroy() fails with errc::aborted.
//
// Multi-rank cases run both ranks on threads of this process. Only rank 0 makes the bad call; a
// following all_reduce on both ranks succeeds only if the bad call sent nothing (a stray message
// or sequence number would be a mismatch or a hang).
#include <gtest/gtest.h>

#include <coccl/coccl.hpp>
#include <cstdint>
#include <functional>
#include <latch>
#include <limits>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "runtime/deadline.hpp"
#include "tests/support/code_of.hpp"

namespace coccl {
namespace {

constexpr std::size_t huge = std::numeric_limits<std::size_t>::max();
const DataType bad_type = static_cast<DataType>(99);
const ReduceOp bad_op = static_cast<ReduceOp>(99);

using test::code_of;

// A valid all_reduce on this rank; true if it produced the sum over `nranks` ranks.
bool all_reduce_works(Communicator& c, int nranks) {
  std::int32_t in[4] = {1, 2, 3, 4}, out[4] = {};
  boost::system::error_code ec;
  c.all_reduce(in, out, 4, DataType::int32, ReduceOp::sum, ec);
  if (ec) return false;
  for (int i = 0; i < 4; ++i)
    if (out[i] != (i + 1) * nranks) return false;
  return true;
}

// A bad call must not hang on a broken library: a short COCCL_TIMEOUT turns a hang into a failure.
class BadArgs : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { params::timeout_s.set_override("20"); }
  void TearDown() override { params::timeout_s.set_override(std::nullopt); }

  int nranks() const { return GetParam(); }

  // Forms an nranks() communicator on threads; rank 0 runs `bad` and expects `want`, then every
  // rank runs a valid all_reduce.
  void expect_rejected(std::error_code want, std::function<std::error_code(Communicator&)> bad) {
    const int n = nranks();
    UniqueId id = UniqueId::create();
    std::vector<std::error_code> got(n);
    // char, not bool: each rank thread writes its own element (vector<bool> packs them in one
    // word).
    std::vector<char> usable(n, false);
    std::latch finished(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        Communicator c = Communicator::create(id, r, n);
        if (r == 0) got[r] = bad(c);
        usable[r] = all_reduce_works(c, n);
        // Every rank finishes its work before any destroys.
        finished.arrive_and_wait();
        c.destroy();
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(got[0], want) << got[0].message();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(usable[r]) << "rank " << r << " after the bad call";
  }
  void expect_invalid(std::function<std::error_code(Communicator&)> bad) {
    expect_rejected(make_error_code(errc::invalid_argument), std::move(bad));
  }
};

float buf_a[64], buf_b[64];

TEST_P(BadArgs, NullSendBufferWithCount) {
  expect_invalid([](Communicator& c) {
    boost::system::error_code ec;
    c.all_reduce(nullptr, buf_b, 4, DataType::float32, ReduceOp::sum, ec);
    return ec;
  });
}

TEST_P(BadArgs, NullRecvBufferWithCount) {
  expect_invalid([](Communicator& c) {
    boost::system::error_code ec;
    c.all_reduce(buf_a, nullptr, 4, DataType::float32, ReduceOp::sum, ec);
    return ec;
  });
}

TEST_P(BadArgs, NullBroadcastBufferOnRoot) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.broadcast(nullptr, buf_b, 4, DataType::float32, 0); });
  });
}

TEST_P(BadArgs, NullSendBufferOfAllGather) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.all_gather(nullptr, buf_b, 1, DataType::float32); });
  });
}

TEST_P(BadArgs, NullBufferOfASend) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.send(nullptr, 4, DataType::float32, c.size() - 1); });
  });
}

TEST_P(BadArgs, AllReduceCountOverflow) {
  expect_invalid([](Communicator& c) {
    boost::system::error_code ec;
    c.all_reduce(buf_a, buf_b, huge, DataType::float32, ReduceOp::sum, ec);
    return ec;
  });
}

TEST_P(BadArgs, AllReduceCountOverflowOfBytes) {
  expect_invalid([](Communicator& c) {
    boost::system::error_code ec;
    c.all_reduce(buf_a, buf_b, huge / 4 + 1, DataType::float32, ReduceOp::sum, ec);
    return ec;
  });
}

TEST_P(BadArgs, AllGatherCountOverflow) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.all_gather(buf_a, buf_b, huge, DataType::float32); });
  });
}

// count fits, but size() * count elements do not.
TEST_P(BadArgs, AllGatherTotalSizeOverflow) {
  if (nranks() < 2) GTEST_SKIP() << "with one rank the total is the count";
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.all_gather(buf_a, buf_b, huge / 2 + 1, DataType::uint8); });
  });
}

TEST_P(BadArgs, SendCountOverflow) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.send(buf_a, huge, DataType::float64, c.size() - 1); });
  });
}

TEST_P(BadArgs, UnknownDataType) {
  expect_invalid([](Communicator& c) {
    boost::system::error_code ec;
    c.all_reduce(buf_a, buf_b, 4, bad_type, ReduceOp::sum, ec);
    return ec;
  });
}

TEST_P(BadArgs, NegativeDataType) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.broadcast(buf_a, buf_b, 4, static_cast<DataType>(-1), 0); });
  });
}

TEST_P(BadArgs, UnknownDataTypeOfASend) {
  expect_invalid(
      [](Communicator& c) { return code_of([&] { c.send(buf_a, 4, bad_type, c.size() - 1); }); });
}

TEST_P(BadArgs, UnknownReduceOp) {
  expect_invalid([](Communicator& c) {
    boost::system::error_code ec;
    c.all_reduce(buf_a, buf_b, 4, DataType::float32, bad_op, ec);
    return ec;
  });
}

TEST_P(BadArgs, NegativeReduceOpOfReduceScatter) {
  expect_invalid([](Communicator& c) {
    return code_of(
        [&] { c.reduce_scatter(buf_a, buf_b, 1, DataType::float32, static_cast<ReduceOp>(-1)); });
  });
}

TEST_P(BadArgs, BroadcastRootEqualToSize) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.broadcast(buf_a, buf_b, 4, DataType::float32, c.size()); });
  });
}

TEST_P(BadArgs, ReduceNegativeRoot) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.reduce(buf_a, buf_b, 4, DataType::float32, ReduceOp::sum, -1); });
  });
}

TEST_P(BadArgs, GatherRootOutOfRange) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.gather(buf_a, buf_b, 1, DataType::float32, c.size() + 5); });
  });
}

TEST_P(BadArgs, ScatterRootOutOfRange) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.scatter(buf_a, buf_b, 1, DataType::float32, c.size()); });
  });
}

TEST_P(BadArgs, SendPeerEqualToSize) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.send(buf_a, 4, DataType::float32, c.size()); });
  });
}

TEST_P(BadArgs, RecvNegativePeer) {
  expect_invalid(
      [](Communicator& c) { return code_of([&] { c.recv(buf_b, 4, DataType::float32, -1); }); });
}

TEST_P(BadArgs, GroupWithOneBadPeerSendsNothing) {
  expect_invalid([](Communicator& c) {
    return code_of([&] {
      c.send_recv({Communicator::send_op(buf_a, 4, DataType::float32, c.size() - 1),
                   Communicator::recv_op(buf_b, 4, DataType::float32, c.size())});
    });
  });
}

TEST_P(BadArgs, UnmatchedSendToSelf) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.send(buf_a, 4, DataType::float32, c.rank()); });
  });
}

TEST_P(BadArgs, AllToAllvWithTooFewCounts) {
  expect_invalid([](Communicator& c) {
    const std::size_t n = static_cast<std::size_t>(c.size());
    return code_of([&] {
      c.all_to_allv(buf_a, std::vector<std::size_t>(n - 1, 1), std::vector<std::size_t>(n, 0),
                    buf_b, std::vector<std::size_t>(n, 1), std::vector<std::size_t>(n, 0),
                    DataType::float32);
    });
  });
}

TEST_P(BadArgs, AllToAllvWithTooManyDisplacements) {
  expect_invalid([](Communicator& c) {
    const std::size_t n = static_cast<std::size_t>(c.size());
    return code_of([&] {
      c.all_to_allv(buf_a, std::vector<std::size_t>(n, 1), std::vector<std::size_t>(n, 0), buf_b,
                    std::vector<std::size_t>(n, 1), std::vector<std::size_t>(n + 1, 0),
                    DataType::float32);
    });
  });
}

TEST_P(BadArgs, AllToAllvWithEmptyVectors) {
  expect_invalid([](Communicator& c) {
    return code_of([&] { c.all_to_allv(buf_a, {}, {}, buf_b, {}, {}, DataType::float32); });
  });
}

TEST_P(BadArgs, AllToAllvCountPlusDisplacementOverflow) {
  expect_invalid([](Communicator& c) {
    const std::size_t n = static_cast<std::size_t>(c.size());
    std::vector<std::size_t> counts(n, 1), displs(n, 0);
    displs[0] = huge;
    return code_of([&] {
      c.all_to_allv(buf_a, counts, displs, buf_b, counts, std::vector<std::size_t>(n, 0),
                    DataType::float32);
    });
  });
}

TEST_P(BadArgs, AllToAllvInPlace) {
  expect_invalid([](Communicator& c) {
    const std::size_t n = static_cast<std::size_t>(c.size());
    std::vector<std::size_t> counts(n, 1), displs(n);
    for (std::size_t i = 0; i < n; ++i) displs[i] = i;
    return code_of(
        [&] { c.all_to_allv(buf_a, counts, displs, buf_a, counts, displs, DataType::float32); });
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, BadArgs, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "Ranks"; });

// ---- In-place all_to_all ----

TEST(BadArgsTwoRanks, InPlaceAllToAllIsRejected) {
  UniqueId id = UniqueId::create();
  std::error_code got;
  std::vector<char> usable(2, false);
  std::latch finished(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Communicator c = Communicator::create(id, r, 2);
      float data[4] = {1, 2, 3, 4};
      if (r == 0) got = code_of([&] { c.all_to_all(data, data, 2, DataType::float32); });
      usable[r] = all_reduce_works(c, 2);
      finished.arrive_and_wait();
      c.destroy();
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(got, errc::invalid_argument);
  EXPECT_TRUE(usable[0]);
  EXPECT_TRUE(usable[1]);
}

// With one rank the only block is the rank's own, so in place is well defined and allowed.
TEST(BadArgsOneRank, InPlaceAllToAllIsAllowed) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  float data[2] = {5, 6};
  EXPECT_EQ(code_of([&] { c.all_to_all(data, data, 2, DataType::float32); }), std::error_code());
  EXPECT_EQ(data[0], 5);
  EXPECT_EQ(data[1], 6);
  c.destroy();
}

// ---- The reason reaches the caller ----

// The text of the exception a throwing call raises (empty if it succeeds).
std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::system_error& e) {
    return e.what();
  }
  return {};
}

TEST(BadArgsReason, CountOverflowNamesTheCountInWhat) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  const std::string what =
      what_of([&] { c.all_reduce(buf_a, buf_b, huge, DataType::float32, ReduceOp::sum); });
  EXPECT_NE(what.find("all_reduce"), std::string::npos) << what;
  EXPECT_NE(what.find("count " + std::to_string(huge) + " overflows"), std::string::npos) << what;
  c.destroy();
}

TEST(BadArgsReason, RootOutOfRangeNamesTheRootInWhat) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  const std::string what = what_of([&] { c.broadcast(buf_a, buf_b, 4, DataType::float32, 7); });
  EXPECT_NE(what.find("broadcast"), std::string::npos) << what;
  EXPECT_NE(what.find("root 7 out of range [0, 1)"), std::string::npos) << what;
  c.destroy();
}

// A refused call leaves no reason behind for a later error of another kind.
TEST(BadArgsReason, LaterErrorOfAnotherKindShowsItsOwnText) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  EXPECT_FALSE(what_of([&] { c.broadcast(buf_a, buf_b, 4, DataType::float32, 7); }).empty());
  c.destroy();
  const std::string what = what_of([&] { c.barrier(); });
  EXPECT_EQ(what.find("root 7"), std::string::npos) << what;
}

// ---- Use after destroy ----

TEST(UseAfterDestroy, OperationOnACopyFailsWithAborted) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  Communicator copy = c;
  c.destroy();
  boost::system::error_code ec;
  copy.all_reduce(buf_a, buf_b, 4, DataType::float32, ReduceOp::sum, ec);
  EXPECT_EQ(ec, errc::aborted);
}

TEST(UseAfterDestroy, ThrowingFormOnACopyThrowsAborted) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  Communicator copy = c;
  c.destroy();
  EXPECT_EQ(code_of([&] { copy.barrier(); }), errc::aborted);
  EXPECT_EQ(code_of([&] { copy.broadcast(buf_a, buf_b, 1, DataType::float32, 0); }), errc::aborted);
}

TEST(UseAfterDestroy, DestroyedHandleIsEmptyAndFailsWithAborted) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  c.destroy();
  EXPECT_FALSE(c);
  boost::system::error_code ec;
  c.all_reduce(buf_a, buf_b, 4, DataType::float32, ReduceOp::sum, ec);
  EXPECT_EQ(ec, errc::aborted);
}

TEST(UseAfterDestroy, OperationOnACopyFailsWithAbortedOnTwoRanks) {
  UniqueId id = UniqueId::create();
  std::vector<boost::system::error_code> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Communicator c = Communicator::create(id, r, 2);
      Communicator copy = c;
      c.destroy();
      float in = 1, out = 0;
      copy.all_reduce(&in, &out, 1, DataType::float32, ReduceOp::sum, got[r]);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[0], errc::aborted);
  EXPECT_EQ(got[1], errc::aborted);
}

TEST(UseAfterDestroy, DestroyingTwiceIsHarmless) {
  Communicator c = Communicator::create(UniqueId::create(), 0, 1);
  Communicator copy = c;
  c.destroy();
  copy.destroy();
  EXPECT_FALSE(copy);
}

TEST(EmptyCommunicator, OperationsFailWithAborted) {
  Communicator c;
  boost::system::error_code ec;
  c.all_reduce(buf_a, buf_b, 1, DataType::float32, ReduceOp::sum, ec);
  EXPECT_EQ(ec, errc::aborted);
}

TEST(EmptyCommunicator, RankThrowsInvalidArgument) {
  Communicator c;
  EXPECT_EQ(code_of([&] { (void)c.rank(); }), errc::invalid_argument);
}

// ---- Bad create arguments ----

std::error_code create_error(const UniqueId& id, int rank, int nranks) {
  return code_of([&] { Communicator::create(id, rank, nranks); });
}

TEST(CreateArgs, RankEqualToSizeIsInvalid) {
  EXPECT_EQ(create_error(UniqueId::create(), 2, 2), errc::invalid_argument);
}

TEST(CreateArgs, RankAboveSizeIsInvalid) {
  EXPECT_EQ(create_error(UniqueId::create(), 5, 2), errc::invalid_argument);
}

TEST(CreateArgs, NegativeRankIsInvalid) {
  EXPECT_EQ(create_error(UniqueId::create(), -1, 2), errc::invalid_argument);
}

TEST(CreateArgs, ZeroRanksIsInvalid) {
  EXPECT_EQ(create_error(UniqueId::create(), 0, 0), errc::invalid_argument);
}

TEST(CreateArgs, NegativeRanksIsInvalid) {
  EXPECT_EQ(create_error(UniqueId::create(), 0, -3), errc::invalid_argument);
}

TEST(CreateArgs, IdNotMadeByCreateIsInvalid) {
  EXPECT_EQ(create_error(UniqueId{}, 0, 1), errc::invalid_argument);
}

}  // namespace
}  // namespace coccl
