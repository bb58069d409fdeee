// The bootstrap root's status answer (transport/bootstrap.hpp, decode_root_view): what an honest
// answer says of the root's share, and forged answers refused before anything is allocated for
// the counts they claim.
#include <gtest/gtest.h>

#include <coccl/error.hpp>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "tests/support/code_of.hpp"
#include "transport/bootstrap.hpp"
#include "transport/wire.hpp"

namespace coccl {
namespace {

// A root's status answer written field by field as the root lays it out, so that each field can
// be made to lie. As it stands it is honest: root 1 of 4 for 8 ranks, rank 2 seen on its own
// connection, rank 3 not, rank 6's failure, still waiting for root 0.
struct ForgedAnswer {
  std::uint32_t magic = 0x32565743u;  // "CWV2"
  std::int32_t nranks = 8, roots = 4, index = 1, arrived = 1;
  std::uint8_t rank0 = 0, formed = 0;
  std::int32_t first = 2, last = 4;
  struct Record {
    std::uint8_t seen;
    std::int32_t via;
  };
  std::vector<Record> records{{1, 2}, {0, -1}};
  std::optional<std::uint32_t> failure_count;  // the count sent instead of failures.size()
  std::vector<std::pair<std::int32_t, std::string>> failures{{6, "rank 6 has failed"}};
  std::vector<std::int32_t> waiting{0};

  std::vector<std::uint8_t> bytes() const {
    transport::Writer w;
    w.put(magic).put(nranks).put(roots).put(index).put(arrived).put(rank0).put(formed);
    w.put(first).put(last);
    transport::PeerInfo listener{};
    listener.family = 4;
    listener.port = 4000;
    for (const Record& r : records) w.put(r.seen).put(listener).put(r.via);
    w.put(failure_count.value_or(static_cast<std::uint32_t>(failures.size())));
    for (const auto& [rank, text] : failures)
      w.put(rank).put_bytes({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
    w.put(static_cast<std::uint32_t>(waiting.size()));
    for (std::int32_t k : waiting) w.put(k);
    return std::move(w.bytes());
  }
};

// The error a decoder gives `bytes` (none when it decodes them). Anything but std::system_error,
// std::bad_alloc from a count taken on trust included, escapes and fails the test.
std::error_code decode_root_view_error(const std::vector<std::uint8_t>& bytes) {
  return test::code_of([&] { transport::decode_root_view(bytes); });
}

TEST(RootStatusAnswer, AnHonestAnswerDecodesToItsShare) {
  const transport::RootView v = transport::decode_root_view(ForgedAnswer{}.bytes());
  EXPECT_EQ(v.first, 2);
  EXPECT_EQ(v.last, 4);
  ASSERT_EQ(v.records.size(), 2u);
  EXPECT_TRUE(v.seen(2));
  EXPECT_EQ(v.via(2), 2);
  EXPECT_EQ(v.listener(2).port, 4000);
  EXPECT_FALSE(v.seen(3));
  EXPECT_EQ(v.via(3), -1);
  EXPECT_EQ(v.failed, (std::map<int, std::string>{{6, "rank 6 has failed"}}));
  EXPECT_EQ(v.awaiting, std::vector<int>{0});
}

TEST(RootStatusAnswer, ForgedAnswersAreRefusedBeforeAnythingIsAllocated) {
  auto refused = [](const ForgedAnswer& f) {
    return decode_root_view_error(f.bytes()) == errc::bad_message;
  };
  // Each case below lies in one field only: the others stay consistent with it.
  ForgedAnswer f;
  f.magic = 0x52565743u;  // the first format, a record per rank of the communicator
  EXPECT_TRUE(refused(f));
  // The only root, of a share of 2^31 - 1 ranks, in a payload of two records: refused, not
  // allocated.
  f = {};
  f.nranks = f.last = std::numeric_limits<std::int32_t>::max();
  f.roots = 1;
  f.index = f.first = 0;
  f.waiting = {};
  EXPECT_TRUE(refused(f));
  f = {};
  std::swap(f.first, f.last);  // first > last
  EXPECT_TRUE(refused(f));
  f = {};
  f.nranks = 3;  // the only root, with a share beyond the ranks
  f.roots = 1;
  f.index = 0;
  f.first = 0;
  f.records.resize(4, {0, -1});
  f.failures = {};
  f.waiting = {};
  EXPECT_TRUE(refused(f));
  f = {};
  f.index = 0;  // root 0's share is [0, 2), not [2, 4)
  f.waiting = {2};
  EXPECT_TRUE(refused(f));
  f = {};
  f.index = 4;  // no such root
  EXPECT_TRUE(refused(f));
  f = {};
  f.roots = 9;  // more roots than ranks; root 2 of 9 would serve [2, 3)
  f.index = 2;
  f.last = 3;
  f.records.resize(1);
  EXPECT_TRUE(refused(f));
  f = {};
  f.arrived = 2;  // more than it has seen
  EXPECT_TRUE(refused(f));
  f = {};
  f.records[0].via = 0;  // carried by a rank of another share
  EXPECT_TRUE(refused(f));
  f = {};
  f.records[1].via = 3;  // a carrier for a rank never seen
  EXPECT_TRUE(refused(f));
  f = {};
  f.failure_count = 0xffffffffu;  // more failures than the payload holds
  EXPECT_TRUE(refused(f));
  for (std::int32_t rank : {-1, 8}) {
    f = {};
    f.failures = {{rank, "out of range"}};
    EXPECT_TRUE(refused(f)) << "failure of rank " << rank;
  }
  f = {};
  f.failures = {{6, "a"}, {6, "b"}};
  EXPECT_TRUE(refused(f));
  for (const std::vector<std::int32_t>& waiting :
       std::vector<std::vector<std::int32_t>>{{1}, {4}, {-1}, {0, 0}, {3, 0}, {0, 2, 3, 0}}) {
    f = {};
    f.waiting = waiting;
    EXPECT_TRUE(refused(f)) << "waiting for " << waiting.size() << " roots";
  }
  // Every truncation, and a trailing byte.
  const auto bytes = ForgedAnswer{}.bytes();
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_EQ(
        decode_root_view_error({bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)}),
        errc::bad_message)
        << n;
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_EQ(decode_root_view_error(longer), errc::bad_message);
}

}  // namespace
}  // namespace coccl
