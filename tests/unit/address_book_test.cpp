// Forming from a launcher's table (transport/address_book.hpp): the entries a rank reads, the
// hosts it learns, what is refused, and communicators of many ranks that form this way, without a
// root, and then find each other's addresses by asking.
#include "transport/address_book.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <coccl/communicator.hpp>
#include <coccl/error.hpp>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "collectives/comm.hpp"
#include "tests/support/param_override.hpp"
#include "transport/net.hpp"
#include "transport/traffic.hpp"

namespace coccl::transport {
namespace {

int log2_ceil(int n) { return n <= 1 ? 0 : std::bit_width(static_cast<unsigned>(n - 1)); }

PeerInfo info_of(int rank, int per_host) {
  PeerInfo p{};
  p.family = 4;
  p.addr[0] = 127;
  p.addr[3] = 1;
  p.port = static_cast<std::uint16_t>(1000 + rank % 60000);
  p.host_hash = 0xb00c0000ull + static_cast<std::uint64_t>(rank / per_host);
  p.pid = rank;
  return p;
}

// A launcher's table made up on demand: rank r listens at info_of(r), its host has `per_host`
// ranks. It records what one rank did with it.
class MadeUpBook final : public AddressBook {
 public:
  MadeUpBook(int nranks, int per_host, bool knows_hosts)
      : nranks_(nranks), per_host_(per_host), knows_hosts_(knows_hosts) {}

  void publish(const PeerInfo& self) override {
    ++published;
    published_info = self;
  }
  PeerInfo lookup(int rank) override {
    EXPECT_EQ(published, 1) << "a lookup before publishing";
    looked_up.push_back(rank);
    if (rank == fail_at) throw std::system_error(make_error_code(errc::timed_out), "no answer");
    return info_of(rank, per_host_);
  }
  std::optional<HostCount> hosts() override {
    if (!knows_hosts_ || (counts_from_entries && published == 0)) return std::nullopt;
    if (claimed) return *claimed;
    return HostCount{static_cast<std::uint32_t>((nranks_ + per_host_ - 1) / per_host_),
                     static_cast<std::uint32_t>(per_host_)};
  }

  int published = 0;
  PeerInfo published_info{};
  std::vector<int> looked_up;
  int fail_at = -1;
  std::optional<HostCount> claimed;
  // Like torchrun's store: the hosts are counted from what the ranks published, so no count
  // exists before publish(), though the book promises one.
  bool counts_from_entries = false;
  // What counts_hosts() answers where set; else whether hosts() gives a count now.
  std::optional<bool> promised;
  bool counts_hosts() override { return promised.value_or(hosts().has_value()); }

 private:
  int nranks_, per_host_;
  bool knows_hosts_;
};

// The entries `rank` keeps in a sparse directory of `n` ranks, sorted.
std::vector<int> needs_one(int rank, int n) { return needs_of(std::span<const int>(&rank, 1), n); }

TEST(BookEntry, AnAddressGoesThroughAsHexAndAnythingElseIsRefused) {
  const PeerInfo in = info_of(77, 8);
  const std::string text = encode_book_entry(in);
  EXPECT_EQ(text.size(), 2 * sizeof(PeerInfo));
  EXPECT_TRUE(std::all_of(text.begin(), text.end(),
                          [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }));
  const PeerInfo out = decode_book_entry(text, 77);
  EXPECT_EQ(std::memcmp(&in, &out, sizeof in), 0);
  EXPECT_TRUE(is_memory(decode_book_entry(encode_book_entry(memory_address(5)), 1)));

  auto refused = [](const std::string& t, const std::string& says) {
    try {
      decode_book_entry(t, 3);
      ADD_FAILURE() << "accepted " << t;
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::bad_message));
      EXPECT_NE(std::string(e.what()).find("rank 3"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("", "characters");
  refused(text.substr(2), "characters");
  refused(text + "00", "characters");
  std::string upper = text;
  std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
  if (upper != text) refused(upper, "hex");
  refused(std::string(text.size(), 'z'), "hex");
  PeerInfo no_family = in;
  no_family.family = 0;
  refused(encode_book_entry(no_family), "no usable address");
  PeerInfo no_port = in;
  no_port.port = 0;
  refused(encode_book_entry(no_port), "no usable address");
}

TEST(FrameFromBook, AFullDirectoryReadsEveryOtherEntryOnceAndCountsTheHosts) {
  const int n = 10;  // hosts of 3, 3, 3 and 1 ranks
  for (int rank : {0, 4, 9}) {
    MadeUpBook book(n, 3, false);  // a full directory needs no count from the launcher
    ASSERT_TRUE(can_form_from(book, n));
    const PeerInfo self = info_of(rank, 3);
    const DirectoryFrame f = frame_from_book(book, self, rank, n);
    EXPECT_EQ(book.published, 1);
    EXPECT_EQ(std::memcmp(&book.published_info, &self, sizeof self), 0);
    std::vector<int> others;
    for (int r = 0; r < n; ++r)
      if (r != rank) others.push_back(r);
    EXPECT_EQ(book.looked_up, others);
    EXPECT_EQ(f.header.nranks, static_cast<std::uint32_t>(n));
    EXPECT_EQ(f.header.full, 1u);
    EXPECT_EQ(f.header.hosts, 4u);
    ASSERT_EQ(f.entries.size(), static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(f.entries[r].rank, r);
      EXPECT_EQ(f.entries[r].info.port, info_of(r, 3).port);
      EXPECT_EQ(f.entries[r].host_ranks, r == 9 ? 1u : 3u) << r;
    }
    Directory d;
    d.assign(f, rank);
    EXPECT_EQ(d.known(), static_cast<std::size_t>(n));
    EXPECT_EQ(d.host_ranks(), rank == 9 ? 1u : 3u);
  }
}

TEST(FrameFromBook, AboveTheFullLimitARankReadsOnlyTheLogNEntriesItKeeps) {
  for (int n : {65, 1000, 98304}) {
    for (int rank : {0, 1, n / 2, n - 1}) {
      MadeUpBook book(n, 8, true);
      ASSERT_TRUE(can_form_from(book, n));
      const DirectoryFrame f = frame_from_book(book, info_of(rank, 8), rank, n);
      std::vector<int> others;
      for (int r : needs_one(rank, n))
        if (r != rank) others.push_back(r);
      EXPECT_EQ(book.looked_up, others) << n << " " << rank;
      EXPECT_LE(book.looked_up.size(), static_cast<std::size_t>(log2_ceil(n) + 5));
      EXPECT_EQ(f.header.full, 0u);
      EXPECT_EQ(f.header.hosts, static_cast<std::uint32_t>((n + 7) / 8));
      Directory d;
      d.assign(f, rank);
      EXPECT_EQ(d.known(), needs_one(rank, n).size());
      EXPECT_EQ(d.host_ranks(), 8u);
      for (int r : needs_one(rank, n)) ASSERT_NE(d.find(r), nullptr) << r;
    }
  }
}

TEST(FrameFromBook, WithoutTheLaunchersCountOfHostsOnlyAFullDirectoryForms) {
  MadeUpBook book(100, 8, false);
  EXPECT_FALSE(can_form_from(book, 100));
  try {
    frame_from_book(book, info_of(5, 8), 5, 100);
    ADD_FAILURE() << "formed without a count of hosts";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::unsupported));
    EXPECT_NE(std::string(e.what()).find("COCCL_DIRECTORY_FULL"), std::string::npos) << e.what();
  }
  // Refused before anything was published: the other ranks are not left waiting on a table
  // this rank went into.
  EXPECT_EQ(book.published, 0);
  EXPECT_TRUE(book.looked_up.empty());
  // The same ranks with a larger limit form, counting the hosts from the entries.
  const test::ParamOverride limit(params::directory_full, "100");
  EXPECT_TRUE(can_form_from(book, 100));
  EXPECT_EQ(frame_from_book(book, info_of(5, 8), 5, 100).header.hosts, 13u);
}

TEST(FrameFromBook, ABookThatCountsTheHostsOnlyOnceTheRanksPublishedFormsASparseFrame) {
  const int n = 100, rank = 37;
  MadeUpBook book(n, 8, true);
  book.counts_from_entries = true;
  book.promised = true;
  EXPECT_FALSE(book.hosts().has_value());
  EXPECT_TRUE(can_form_from(book, n));
  const DirectoryFrame frame = frame_from_book(book, info_of(rank, 8), rank, n);
  EXPECT_EQ(frame.header.hosts, 13u);
  EXPECT_EQ(frame.header.full, 0);
  // Every entry it keeps but its own was read, once, in the order the frame holds them.
  std::vector<int> others;
  for (int r : needs_one(rank, n))
    if (r != rank) others.push_back(r);
  EXPECT_EQ(book.looked_up, others);
  for (const DirectoryEntry& e : frame.entries)
    EXPECT_EQ(e.host_ranks, e.rank == rank ? 8u : 1u) << e.rank;
  // A book that promised a count and has none after publishing is refused.
  MadeUpBook liar(n, 8, false);
  liar.promised = true;
  try {
    frame_from_book(liar, info_of(rank, 8), rank, n);
    ADD_FAILURE() << "formed without a count of hosts";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::unsupported)) << e.what();
  }
  EXPECT_EQ(liar.published, 1);
  EXPECT_TRUE(liar.looked_up.empty());
}

TEST(FrameFromBook, ImpossibleCountsBadRanksAndTheBooksFailuresAreErrors) {
  const int n = 100;
  auto code_of = [&](MadeUpBook& book, int rank, int nranks) {
    try {
      frame_from_book(book, info_of(rank < 0 ? 0 : rank, 8), rank, nranks);
    } catch (const std::system_error& e) {
      return e.code();
    }
    return std::error_code();
  };
  for (const HostCount& lie :
       {HostCount{0, 8}, HostCount{101, 8}, HostCount{13, 0}, HostCount{13, 101}}) {
    MadeUpBook book(n, 8, true);
    book.claimed = lie;
    EXPECT_EQ(code_of(book, 3, n), make_error_code(errc::bad_message))
        << lie.hosts << " " << lie.host_ranks;
  }
  MadeUpBook book(n, 8, true);
  EXPECT_EQ(code_of(book, -1, n), make_error_code(errc::invalid_argument));
  EXPECT_EQ(code_of(book, n, n), make_error_code(errc::invalid_argument));
  EXPECT_EQ(code_of(book, 0, 0), make_error_code(errc::invalid_argument));
  EXPECT_EQ(book.published, 0);
  // A launcher that cannot answer: its error, as it gave it.
  MadeUpBook silent(n, 8, true);
  silent.fail_at = 1;
  EXPECT_EQ(code_of(silent, 0, n), make_error_code(errc::timed_out));
}

// The launcher's table of one job in this process: each rank publishes, then waits at the fence
// for every other rank, as PMIx's fence does.
class SharedBook {
 public:
  SharedBook(int nranks, int per_host) : entries_(nranks), fence_(nranks), per_host_(per_host) {}

  class View final : public AddressBook {
   public:
    View(SharedBook& book, int rank) : book_(book), rank_(rank) {}
    void publish(const PeerInfo& self) override {
      book_.entries_[rank_] = encode_book_entry(self);
      book_.fence_.arrive_and_wait();
    }
    PeerInfo lookup(int rank) override {
      ++book_.lookups_;
      return decode_book_entry(book_.entries_.at(rank), rank);
    }
    std::optional<HostCount> hosts() override {
      const int n = static_cast<int>(book_.entries_.size());
      const int first = rank_ / book_.per_host_ * book_.per_host_;
      return HostCount{static_cast<std::uint32_t>((n + book_.per_host_ - 1) / book_.per_host_),
                       static_cast<std::uint32_t>(std::min(book_.per_host_, n - first))};
    }

   private:
    SharedBook& book_;
    int rank_;
  };

  std::atomic<long> lookups_{0};

 private:
  std::vector<std::string> entries_;
  std::barrier<> fence_;
  int per_host_;
};

// n ranks on the in-memory network formed from a shared table, no root anywhere: an all_reduce,
// then an all_to_all, which links every pair and so makes each rank find, by asking, the
// addresses it did not read.
void ranks_form_from_the_table(int n, int per_host, std::size_t count) {
  SharedBook book(n, per_host);
  Secret secret{};
  secret[0] = 0x5e;
  std::vector<std::string> error(n);
  std::vector<std::size_t> known(n);
  std::vector<bool> one_host(n);
  std::vector<std::vector<std::int32_t>> reduced(n), exchanged(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto party = std::make_shared<Traffic>();
        party->set_host(0xb00c000000000000ull + static_cast<std::uint64_t>(r / per_host));
        SharedBook::View view(book, r);
        Communicator c = detail::create_from_book(view, secret, r, n, true, party);
        known[r] = detail::impl_of(c)->peers().addresses_known();
        one_host[r] = detail::impl_of(c)->one_host();
        std::vector<std::int32_t> mine(count, r + 1);
        reduced[r].resize(count);
        c.all_reduce(mine.data(), reduced[r].data(), count, DataType::int32, ReduceOp::sum);
        std::vector<std::int32_t> send(static_cast<std::size_t>(n) * count);
        for (int p = 0; p < n; ++p)
          for (std::size_t i = 0; i < count; ++i)
            send[p * count + i] = static_cast<std::int32_t>(r * 100000 + p * 10 + i);
        exchanged[r].resize(send.size());
        c.all_to_all(send.data(), exchanged[r].data(), count, DataType::int32);
        c.destroy();
      } catch (const std::exception& e) {
        error[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  // Each rank read the entries it keeps, each once: every other one in a full directory.
  const bool full = n <= params::directory_full.get();
  long reads = 0;
  for (int r = 0; r < n; ++r) reads += full ? n - 1 : static_cast<long>(needs_one(r, n).size()) - 1;
  EXPECT_EQ(book.lookups_.load(), reads);
  const std::int32_t sum = n * (n + 1) / 2;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(error[r], "") << "rank " << r;
    EXPECT_EQ(known[r], full ? static_cast<std::size_t>(n) : needs_one(r, n).size())
        << "rank " << r;
    EXPECT_EQ(one_host[r], n <= per_host) << "rank " << r;
    EXPECT_EQ(reduced[r], std::vector<std::int32_t>(count, sum)) << "rank " << r;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(exchanged[r][p * count + i], static_cast<std::int32_t>(p * 100000 + r * 10 + i))
            << "rank " << r << " from " << p;
  }
}

TEST(LauncherTable, FortyRanksAboveTheFullLimitFormWithoutARootAndFindEachOther) {
  const test::ParamOverride limit(params::directory_full, "16");
  ranks_form_from_the_table(40, 8, 3);
}

// A launcher that fails while a rank reads its table: creation throws the launcher's error, and
// the rank's half-made communicator is let go.
TEST(LauncherTable, ALauncherThatFailsFailsTheCreationWithItsError) {
  MadeUpBook book(2, 8, true);
  book.fail_at = 1;
  Secret secret{};
  try {
    detail::create_from_book(book, secret, 0, 2, true, std::make_shared<Traffic>());
    ADD_FAILURE() << "formed without rank 1's entry";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::timed_out)) << e.what();
  }
  EXPECT_EQ(book.published, 1);
  EXPECT_EQ(book.looked_up, std::vector<int>{1});
}

TEST(LauncherTable, AFullTableOfRanksOnOneHostForms) { ranks_form_from_the_table(6, 8, 4); }

TEST(LauncherTable, AFullTableOfSeveralHostsForms) { ranks_form_from_the_table(12, 4, 2); }

}  // namespace
}  // namespace coccl::transport
