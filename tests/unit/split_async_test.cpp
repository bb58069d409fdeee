// async_split and async_split_members (collectives/split.cpp): one thread drives every rank of
// a communicator on the in-memory network, and the groups it makes have the ranks and sizes asked
// for and reduce correctly; a bad member list and a cancelled split complete with their errors.
// g++ 12 at -O1 under -fsanitize=address,undefined (the ASan tree) reports the completion object
// inside Asio's use_future as maybe used uninitialized, for this file's calls only: a false
// positive within Asio's headers, which -Werror would turn into a failed build.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <coccl/communicator.hpp>
#include <coccl/error.hpp>
#include <cstdint>
#include <future>
#include <thread>
#include <vector>

#include "collectives/comm.hpp"
#include "collectives/comm_params.hpp"
#include "tests/support/param_override.hpp"
#include "transport/directory.hpp"

namespace coccl {
namespace {

namespace asio = boost::asio;

// `n` ranks of one communicator on the in-memory network, created from this thread.
std::vector<Communicator> ranks_of(int n) {
  const UniqueId id = detail::memory_unique_id();
  std::vector<std::future<Communicator>> joining;
  for (int r = 0; r < n; ++r)
    joining.push_back(Communicator::async_create(id, r, n, asio::use_future));
  std::vector<Communicator> comms;
  for (auto& f : joining) comms.push_back(f.get());
  return comms;
}

// Each new communicator reduces its members' old ranks + 1; every member must get the sum.
void expect_sums(std::vector<Communicator>& made, const std::vector<std::vector<int>>& groups) {
  std::vector<std::int64_t> in(made.size()), out(made.size(), -1);
  std::vector<std::future<void>> done;
  for (std::size_t r = 0; r < made.size(); ++r) {
    if (!made[r]) continue;
    in[r] = static_cast<std::int64_t>(r) + 1;
    done.push_back(made[r].async_all_reduce(&in[r], &out[r], 1, DataType::int64, ReduceOp::sum,
                                            asio::use_future));
  }
  for (auto& f : done) f.get();
  for (const auto& members : groups) {
    std::int64_t want = 0;
    for (int r : members) want += r + 1;
    for (int r : members) EXPECT_EQ(out[r], want) << "rank " << r;
  }
}

void destroy_all(std::vector<Communicator>& comms) {
  for (auto& c : comms)
    if (c) c.destroy();
}

TEST(SplitAsync, MembersFormTheGroupsListedFromOneThread) {
  constexpr int n = 8;
  std::vector<Communicator> world = ranks_of(n);
  const std::vector<std::vector<int>> groups{{6, 4, 2, 0}, {1, 3, 5, 7}};
  std::vector<std::future<Communicator>> splitting(n);
  for (const auto& members : groups)
    for (int r : members) splitting[r] = world[r].async_split_members(members, asio::use_future);
  std::vector<Communicator> made(n);
  for (int r = 0; r < n; ++r) made[r] = splitting[r].get();
  for (const auto& members : groups)
    for (std::size_t i = 0; i < members.size(); ++i) {
      const Communicator& c = made[members[i]];
      ASSERT_TRUE(c) << "rank " << members[i];
      EXPECT_EQ(c.size(), 4);
      EXPECT_EQ(c.rank(), static_cast<int>(i));
    }
  expect_sums(made, groups);
  destroy_all(made);
  destroy_all(world);
}

// A group above COCCL_DIRECTORY_FULL members forms without a root: each member takes the entries
// of its O(log m) partners from them, and finds the others by asking.
TEST(SplitAsync, MembersOfALargeGroupFormWithoutARootFromTheirPartnersEntries) {
  const test::ParamOverride sparse(params::directory_full, "3");
  constexpr int n = 10;
  std::vector<Communicator> world = ranks_of(n);
  const std::vector<std::vector<int>> groups{{9, 7, 5, 3, 1, 0, 2, 4}, {6, 8}};
  std::vector<std::future<Communicator>> splitting(n);
  for (const auto& members : groups)
    for (int r : members) splitting[r] = world[r].async_split_members(members, asio::use_future);
  std::vector<Communicator> made(n);
  for (int r = 0; r < n; ++r) made[r] = splitting[r].get();
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (std::size_t i = 0; i < groups[g].size(); ++i) {
      const Communicator& c = made[groups[g][i]];
      ASSERT_TRUE(c) << "rank " << groups[g][i];
      EXPECT_EQ(c.size(), static_cast<int>(groups[g].size()));
      EXPECT_EQ(c.rank(), static_cast<int>(i));
      const auto impl = detail::impl_of(c);
      EXPECT_EQ(impl->peers().roots(), 0u);
      EXPECT_TRUE(impl->one_host());
      // 8 members above the limit of 3: itself, 3 partners, 2 ring neighbours, its tree
      // parent and children (at most 8); 2 members: both.
      std::vector<int> needs;
      transport::directory_needs(static_cast<int>(i), c.size(), needs);
      std::sort(needs.begin(), needs.end());
      needs.erase(std::unique(needs.begin(), needs.end()), needs.end());
      EXPECT_EQ(impl->peers().addresses_known(), g == 0 ? needs.size() : 2u) << groups[g][i];
    }
  // The group of 8 reduces and then exchanges every pair, finding the addresses it lacks.
  expect_sums(made, groups);
  std::vector<std::vector<std::int32_t>> got(n);
  std::vector<std::future<void>> done;
  std::vector<std::vector<std::int32_t>> sent(n);
  for (int r : groups[0]) {
    const int me = made[r].rank();
    for (int p = 0; p < 8; ++p) sent[r].push_back(me * 10 + p);
    got[r].assign(8, -1);
    done.push_back(made[r].async_all_to_all(sent[r].data(), got[r].data(), 1, DataType::int32,
                                            asio::use_future));
  }
  for (auto& f : done) f.get();
  for (int r : groups[0])
    for (int p = 0; p < 8; ++p) EXPECT_EQ(got[r][p], p * 10 + made[r].rank()) << r << " " << p;
  destroy_all(made);
  destroy_all(world);
}

// Members whose lists differ but make the same member tree all fail with errc::mismatch (none
// waits for a message another list's tree never sends), and the parent still works.
TEST(SplitAsync, MembersWithDifferentListsAllFailWithAMismatch) {
  constexpr int n = 3;
  std::vector<Communicator> world = ranks_of(n);
  // Rank 0 lists the others the other way round: the same tree (0 above 1 and 2), another list.
  const std::vector<std::vector<int>> lists{{0, 2, 1}, {0, 1, 2}, {0, 1, 2}};
  std::vector<std::future<Communicator>> splitting;
  for (int r = 0; r < n; ++r)
    splitting.push_back(world[r].async_split_members(lists[r], asio::use_future));
  for (int r = 0; r < n; ++r) {
    try {
      splitting[r].get();
      ADD_FAILURE() << "rank " << r << " formed a group from different lists";
    } catch (const boost::system::system_error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::mismatch)) << "rank " << r << ": " << e.what();
    }
  }
  std::vector<std::vector<int>> all{{0, 1, 2}};
  expect_sums(world, all);
  destroy_all(world);
}

TEST(SplitAsync, ColorsFormGroupsOrderedByKeyAndANegativeColorGetsNone) {
  constexpr int n = 7;
  std::vector<Communicator> world = ranks_of(n);
  std::vector<std::future<Communicator>> splitting;
  for (int r = 0; r < n; ++r)
    splitting.push_back(world[r].async_split(r == n - 1 ? -1 : r % 2, -r, asio::use_future));
  std::vector<Communicator> made;
  for (auto& f : splitting) made.push_back(f.get());
  // Descending old rank within each color (key = -rank); rank 6 passed -1.
  const std::vector<std::vector<int>> groups{{4, 2, 0}, {5, 3, 1}};
  EXPECT_FALSE(made[n - 1]);
  for (const auto& members : groups)
    for (std::size_t i = 0; i < members.size(); ++i) {
      const Communicator& c = made[members[i]];
      ASSERT_TRUE(c) << "rank " << members[i];
      EXPECT_EQ(c.size(), 3);
      EXPECT_EQ(c.rank(), static_cast<int>(i));
    }
  expect_sums(made, groups);
  destroy_all(made);
  destroy_all(world);
}

TEST(SplitAsync, ABadMemberListCompletesWithInvalidArgument) {
  std::vector<Communicator> world = ranks_of(2);
  for (const std::vector<int>& list : {std::vector<int>{}, std::vector<int>{1}, {0, 0}, {0, 2}}) {
    auto f = world[0].async_split_members(list, asio::use_future);
    try {
      f.get();
      ADD_FAILURE() << "a list of " << list.size() << " was accepted";
    } catch (const boost::system::system_error& e) {
      EXPECT_EQ(e.code(), errc::invalid_argument);
    }
  }
  // Nothing was sent: the communicator still works.
  std::vector<std::vector<int>> all{{0, 1}};
  expect_sums(world, all);
  destroy_all(world);
}

TEST(SplitAsync, AnEmptyHandleCompletesWithInvalidArgument) {
  Communicator none;
  auto f = none.async_split(0, 0, asio::use_future);
  try {
    f.get();
    ADD_FAILURE() << "a split of an empty handle succeeded";
  } catch (const boost::system::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
}

TEST(SplitAsync, TerminalCancellationOfASplitInFlightAbortsTheParent) {
  std::vector<Communicator> world = ranks_of(2);
  // Only rank 0 splits: its all_gather waits for rank 1, which never joins it.
  asio::cancellation_signal cancel;
  auto f =
      world[0].async_split(0, 0, asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (world[0].status().running_op != "all_gather" && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(world[0].status().running_op, "all_gather");
  cancel.emit(asio::cancellation_type::terminal);
  try {
    f.get();
    ADD_FAILURE() << "the cancelled split succeeded";
  } catch (const boost::system::system_error& e) {
    EXPECT_EQ(e.code(), errc::aborted);
  }
  EXPECT_EQ(world[0].error(), errc::aborted);
  world[1].abort();
  world[0].destroy();
}

}  // namespace
}  // namespace coccl
