// shm segments reserve their memory when they are made: a filesystem too small for a segment
// fails its creation with a clear error, where a segment that was only sized would have faulted
// (SIGBUS) on first touch. And the ring of a pair of shm connections in one process: chunks of
// every size up to a slot arrive whole and in order across wrap-arounds (a slot count that is a
// power of two and one that is not), through peek() and wait(), and a full ring takes a put again
// once the receiver releases a slot.
#include "transport/shm.hpp"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_future.hpp>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

namespace coccl {
namespace {

constexpr int cannot_mount = 77;

// In a child process: a 64 KiB tmpfs of its own (a mount namespace; a user namespace too when
// not root) as COCCL_SHM_DIR, and a 1 MiB segment made and written there. Exits 0 if creation
// failed with the clear error, 1 if the segment was made and written, 2 on another error.
[[noreturn]] void make_segment_on_small_tmpfs(const char* dir) {
  const int flags = CLONE_NEWNS | (::geteuid() == 0 ? 0 : CLONE_NEWUSER);
  if (::unshare(flags) != 0) ::_exit(cannot_mount);
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(cannot_mount);
  if (::mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) ::_exit(cannot_mount);
  params::shm_dir.set_override(dir);
  constexpr std::size_t bytes = 1 << 20;
  try {
    auto segment = transport::ShmSegment::create(bytes);
    std::memset(segment->data(), 1, bytes);
    ::_exit(1);
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    const bool clear = e.code() == std::errc::no_space_on_device &&
                       std::string(e.what()).find("cannot reserve") != std::string::npos;
    ::_exit(clear ? 0 : 2);
  }
}

TEST(ShmSegment, TooSmallFilesystemFailsCreationInsteadOfFaultingOnTouch) {
  char dir[] = "/tmp/coccl-shm-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) make_segment_on_small_tmpfs(dir);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::rmdir(dir);
  if (WIFEXITED(status) && WEXITSTATUS(status) == cannot_mount)
    GTEST_SKIP() << "no mount namespace for a small tmpfs here";
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

namespace asio = boost::asio;
using transport::Chunk;
using transport::ShmConnection;
using transport::ShmSegment;

// Two ends of a shm link with `slots` slots of `slot_bytes`; the set-up socket is a loopback pair.
struct ShmPair {
  ShmPair(std::size_t slots, std::size_t slot_bytes) {
    asio::ip::tcp::acceptor acceptor(ctx, {asio::ip::address_v4::loopback(), 0});
    asio::ip::tcp::socket a(ctx), b(ctx);
    a.connect(acceptor.local_endpoint());
    acceptor.accept(b);
    const std::size_t bytes = ShmConnection::segment_bytes(slots, slot_bytes);
    auto own_a = ShmSegment::create(bytes), own_b = ShmSegment::create(bytes);
    auto seen_by_a = ShmSegment::open(own_b->name(), bytes);
    auto seen_by_b = ShmSegment::open(own_a->name(), bytes);
    auto ignore = [](int, std::error_code, const std::string&) {};
    sender =
        std::make_unique<ShmConnection>(0, 1, transport::Stream(std::move(a)), slots, slot_bytes,
                                        std::move(own_a), std::move(seen_by_a), poller, ignore);
    receiver =
        std::make_unique<ShmConnection>(1, 0, transport::Stream(std::move(b)), slots, slot_bytes,
                                        std::move(own_b), std::move(seen_by_b), poller, ignore);
  }
  asio::io_context ctx;
  transport::ShmPoller poller;
  std::unique_ptr<ShmConnection> sender, receiver;
};

std::vector<std::uint8_t> pattern(std::size_t n, int seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed * 31 + i * 7);
  return v;
}

// Takes the next chunk with peek() and checks it against `want` and `fp`; releases it.
void expect_next(ShmConnection& c, const std::vector<std::uint8_t>& want, std::uint32_t fp) {
  std::optional<Chunk> ch = c.peek();
  ASSERT_TRUE(ch.has_value());
  ASSERT_EQ(ch->size, want.size());
  EXPECT_EQ(ch->fingerprint, fp);
  if (!want.empty()) {
    EXPECT_EQ(std::memcmp(ch->data, want.data(), want.size()), 0);
  }
  c.take_peeked();
  c.release();
}

class ShmRing : public ::testing::TestWithParam<std::size_t> {};

TEST_P(ShmRing, ChunksOfEverySizeArriveWholeAndInOrderAcrossWrapArounds) {
  constexpr std::size_t slot_bytes = 256;
  ShmPair link(GetParam(), slot_bytes);
  // Empty, inside the slot header's cache line, just past it, and a whole slot.
  const std::size_t sizes[] = {0, 8, 48, 49, 200, slot_bytes};
  std::uint32_t fp = 1;
  for (int round = 0; round < 20; ++round) {
    // Two puts in flight at a time, so that the sender and the receiver wrap at different points.
    const auto a = pattern(sizes[round % 6], round), b = pattern(sizes[(round + 3) % 6], -round);
    ASSERT_TRUE(link.sender->try_put(a.data(), a.size(), fp));
    ASSERT_TRUE(link.sender->try_put(b.data(), b.size(), fp + 1));
    expect_next(*link.receiver, a, fp);
    expect_next(*link.receiver, b, fp + 1);
    EXPECT_FALSE(link.receiver->peek().has_value());
    fp += 2;
  }
  const auto big = pattern(slot_bytes + 1, 0);
  EXPECT_FALSE(link.sender->try_put(big.data(), big.size(), 0)) << "larger than a slot";
  EXPECT_FALSE(link.receiver->peek().has_value());
}

TEST_P(ShmRing, AFullRingTakesAPutAgainOnceTheReceiverReleasesASlot) {
  const std::size_t slots = GetParam();
  ShmPair link(slots, 64);
  const auto v = pattern(32, 5);
  for (std::size_t i = 0; i < slots; ++i)
    ASSERT_TRUE(link.sender->try_put(v.data(), v.size(), static_cast<std::uint32_t>(i)));
  EXPECT_FALSE(link.sender->try_put(v.data(), v.size(), 99)) << "every slot is taken";
  // Taken but not released: still no room.
  ASSERT_TRUE(link.receiver->peek().has_value());
  link.receiver->take_peeked();
  EXPECT_FALSE(link.sender->try_put(v.data(), v.size(), 99));
  link.receiver->release();
  EXPECT_TRUE(link.sender->try_put(v.data(), v.size(), 99));
  for (std::size_t i = 1; i < slots; ++i)
    expect_next(*link.receiver, v, static_cast<std::uint32_t>(i));
  expect_next(*link.receiver, v, 99);
  EXPECT_FALSE(link.receiver->peek().has_value());
}

TEST_P(ShmRing, WaitTakesWhatPeekWouldAndTheLinkSettles) {
  ShmPair link(GetParam(), 128);
  const auto a = pattern(8, 1), b = pattern(100, 2);
  ASSERT_TRUE(link.sender->try_put(a.data(), a.size(), 11));
  ASSERT_TRUE(link.sender->try_put(b.data(), b.size(), 12));
  EXPECT_FALSE(link.receiver->settled()) << "two chunks wait to be taken";
  auto got = asio::co_spawn(
      link.ctx,
      [&]() -> asio::awaitable<std::vector<std::pair<std::vector<std::uint8_t>, std::uint32_t>>> {
        std::vector<std::pair<std::vector<std::uint8_t>, std::uint32_t>> out;
        for (int i = 0; i < 2; ++i) {
          Chunk ch = co_await link.receiver->wait();
          const auto* p = reinterpret_cast<const std::uint8_t*>(ch.data);
          out.emplace_back(std::vector<std::uint8_t>(p, p + ch.size), ch.fingerprint);
          link.receiver->release();
        }
        co_return out;
      },
      asio::use_future);
  link.ctx.run();
  const auto chunks = got.get();
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].first, a);
  EXPECT_EQ(chunks[0].second, 11u);
  EXPECT_EQ(chunks[1].first, b);
  EXPECT_EQ(chunks[1].second, 12u);
  EXPECT_TRUE(link.receiver->settled());
}

INSTANTIATE_TEST_SUITE_P(Slots, ShmRing, ::testing::Values(std::size_t{3}, std::size_t{8}),
                         [](const auto& info) { return std::to_string(info.param) + "slots"; });

}  // namespace
}  // namespace coccl
