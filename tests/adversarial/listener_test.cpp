// Strangers at a rank's listener and at the bootstrap root: what they may cost (memory,
// descriptors, the accept loop) and that the job still runs after them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "attacker.hpp"
#include "collectives/comm_params.hpp"
#include "runtime/deadline.hpp"
#include "transport/admission.hpp"
#include "transport/bootstrap.hpp"
#include "transport/hmac.hpp"

namespace coccl::test {
namespace {

using namespace std::chrono_literals;

// Sets a parameter for one test.
template <typename P>
struct Override {
  Override(P& p, const char* text) : p_(p) { p_.set_override(text); }
  ~Override() { p_.set_override(std::nullopt); }
  P& p_;
};

// A frame header as the pre-nonce protocol wrote it (magic "OCCL", type connect, 64 MiB): the
// old listener allocated the announced length before checking anything.
std::vector<std::uint8_t> legacy_header_announcing(std::uint64_t length) {
  std::vector<std::uint8_t> h(16);
  const std::uint32_t magic = 0x4c43434fu, type = 3;
  std::memcpy(h.data(), &magic, 4);
  std::memcpy(h.data() + 4, &type, 4);
  std::memcpy(h.data() + 8, &length, 8);
  return h;
}

// A header of the current protocol announcing `length`, with a tag made up by someone who does
// not hold the secret.
std::vector<std::uint8_t> forged_header_announcing(std::uint64_t length) {
  std::vector<std::uint8_t> h(24 + 32, 0x5a);
  const std::uint32_t magic = 0x324c4343u, type = 2;
  const std::uint64_t counter = 0;
  std::memcpy(h.data(), &magic, 4);
  std::memcpy(h.data() + 4, &type, 4);
  std::memcpy(h.data() + 8, &length, 8);
  std::memcpy(h.data() + 16, &counter, 8);
  return h;
}

TEST(Listener, FloodAnnouncing64MiBFramesCostsBoundedMemoryAndTheJobStillRuns) {
  Override timeout(params::timeout_s, "20");
  TwoRanks job(UniqueId::create(), 1024);
  ASSERT_FALSE(job.formed_error(1)) << job.formed_error(1).message();
  const std::size_t before = resident_bytes();
  asio::io_context io;
  constexpr int legacy = 8, forged = 8;
  auto flood = connect_many(io, job.listener(1), legacy + forged);
  for (int i = 0; i < legacy + forged; ++i) {
    if (i >= legacy) open_handshake(*flood[i]);
    auto bytes =
        i < legacy ? legacy_header_announcing(64u << 20) : forged_header_announcing(64u << 20);
    asio::write(*flood[i], asio::buffer(bytes));
  }
  // Each connection is refused on its header; none waits for the 64 MiB it announced.
  EXPECT_EQ(count_closed(io, flood, 10s), legacy + forged);
  const std::size_t after = resident_bytes();
  EXPECT_LT(after, before + (32u << 20)) << "VmRSS grew from " << before << " to " << after;
  auto results = job.all_reduce();
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(summed(results[r])) << "rank " << r << ": " << results[r].ec.message();
}

TEST(Listener, IdleConnectionsBeyondTheCapAreClosedAndTheJobStillRuns) {
  Override timeout(params::timeout_s, "20");
  Override cap(params::bootstrap_pending_max, "8");
  Override auth(params::bootstrap_auth_timeout, "1");
  TwoRanks job(UniqueId::create());
  ASSERT_FALSE(job.formed_error(1)) << job.formed_error(1).message();
  asio::io_context io;
  constexpr int idle = 40;
  auto conns = connect_many(io, job.listener(1), idle);
  // 32 make room for newer ones at once; the last 8 go when their second to authenticate ends.
  EXPECT_EQ(count_closed(io, conns, 10s), idle);
  auto results = job.all_reduce();
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(summed(results[r])) << "rank " << r << ": " << results[r].ec.message();
}

TEST(Listener, ConnectionsOverTheCapDoNotLockOutAnHonestRank) {
  Override timeout(params::timeout_s, "20");
  Override cap(params::bootstrap_pending_max, "4");
  TwoRanks job(UniqueId::create());
  ASSERT_FALSE(job.formed_error(1)) << job.formed_error(1).message();
  asio::io_context io;
  // Held open for the whole operation: the honest rank's dial still gets in, evicting one.
  auto conns = connect_many(io, job.listener(1), 16);
  auto results = job.all_reduce();
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(summed(results[r])) << "rank " << r << ": " << results[r].ec.message();
}

TEST(Listener, AHelloFinishedAfterTheRankIsDestroyedIsDroppedSafely) {
  // The listener's handshake coroutine outlives its communicator: it must not reach back into
  // the destroyed listener for the secret (ASan saw exactly that when a rank failed at once).
  Override timeout(params::timeout_s, "20");
  Override auth(params::bootstrap_auth_timeout, "1");
  TwoRanks job(UniqueId::create());
  ASSERT_FALSE(job.formed_error(1)) << job.formed_error(1).message();
  asio::io_context io;
  auto conns = connect_many(io, job.listener(1), 1);
  transport::Channel::Nonce nonce{};
  detail::random_bytes(nonce);
  const auto hello = transport::Channel::dialler_hello(nonce);
  asio::write(*conns[0], asio::buffer(hello.data(), 8));
  auto results = job.all_reduce();
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(summed(results[r])) << "rank " << r << ": " << results[r].ec.message();
  boost::system::error_code ec;
  asio::write(*conns[0], asio::buffer(hello.data() + 8, hello.size() - 8), ec);
  EXPECT_EQ(count_closed(io, conns, 10s), 1);
}

// Lowers this process's descriptor limit for one test and fills every free descriptor, so the
// next accept or socket fails with EMFILE; restores both on release().
class DescriptorsExhausted {
 public:
  DescriptorsExhausted() {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit low = saved_;
    low.rlim_cur = 512;
    ::setrlimit(RLIMIT_NOFILE, &low);
    for (;;) {
      int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) break;
      fds_.push_back(fd);
    }
  }
  ~DescriptorsExhausted() { release(); }
  // Frees one descriptor and uses it for a blocking connection to `ep` (completed by the kernel
  // from the listen backlog, before anyone accepts it).
  int connect_one(const tcp::endpoint& ep) {
    ::close(fds_.back());
    fds_.pop_back();
    int s = ::socket(ep.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    if (::connect(s, ep.data(), static_cast<socklen_t>(ep.size())) != 0) {
      ::close(s);
      return -1;
    }
    fds_.push_back(s);
    return s;
  }
  std::size_t filled() const { return fds_.size(); }
  void release() {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
    ::setrlimit(RLIMIT_NOFILE, &saved_);
  }

 private:
  rlimit saved_{};
  std::vector<int> fds_;
};

TEST(AcceptLoop, RootKeepsAcceptingAfterRunningOutOfDescriptors) {
  Override timeout(params::timeout_s, "5");
  UniqueId id = UniqueId::create();
  auto root = transport::decode(id);
  {
    DescriptorsExhausted full;
    ASSERT_GT(full.filled(), 0u);
    ASSERT_GE(full.connect_one(root.endpoint()), 0);
    // The root's accept of that connection fails with EMFILE; give its thread the moment it
    // needs to try (the old loop ended there for good).
    std::this_thread::sleep_for(300ms);
  }
  TwoRanks job(id);
  ASSERT_FALSE(job.formed_error(0)) << job.formed_error(0).message();
  ASSERT_FALSE(job.formed_error(1)) << job.formed_error(1).message();
  auto results = job.all_reduce();
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(summed(results[r])) << "rank " << r << ": " << results[r].ec.message();
}

TEST(AcceptLoop, RankListenerKeepsAcceptingAfterRunningOutOfDescriptors) {
  Override timeout(params::timeout_s, "5");
  TwoRanks job(UniqueId::create());
  ASSERT_FALSE(job.formed_error(1)) << job.formed_error(1).message();
  {
    DescriptorsExhausted full;
    ASSERT_GE(full.connect_one(job.listener(1)), 0);
    std::this_thread::sleep_for(300ms);
  }
  auto results = job.all_reduce();
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(summed(results[r])) << "rank " << r << ": " << results[r].ec.message();
}

TEST(AcceptLoop, RunningOutOfDescriptorsWhenDiallingIsALocalErrorNotALostPeer) {
  Override timeout(params::timeout_s, "2");
  TwoRanks job(UniqueId::create());
  ASSERT_FALSE(job.formed_error(0)) << job.formed_error(0).message();
  std::vector<TwoRanks::Result> results;
  {
    DescriptorsExhausted full;
    results = job.all_reduce();
  }
  EXPECT_EQ(results[0].ec, std::errc::too_many_files_open) << results[0].ec.message();
  EXPECT_TRUE(results[1].ec);
}

// ---- Dials that reach their deadline ----

// A loopback port nobody listens on (refuses connections).
tcp::endpoint refusing_endpoint() {
  asio::io_context io;
  tcp::acceptor a(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  auto ep = a.local_endpoint();
  a.close();
  return ep;
}

TEST(Dial, ARefusingAddressFailsWithTimedOutNamingIt) {
  const auto ep = refusing_endpoint();
  const std::string name = "127.0.0.1:" + std::to_string(ep.port());
  // Many short dials: each ends with its deadline passing while connects are being refused,
  // the moment the old code freed a socket its deadline timer then closed.
  for (int i = 0; i < 20; ++i) {
    asio::io_context io;
    std::exception_ptr error;
    bool done = false;
    asio::co_spawn(io,
                   transport::dial(io.get_executor(), transport::PeerInfo::from(ep),
                                   std::chrono::steady_clock::now() + 50ms + i * 1ms),
                   [&](std::exception_ptr e, std::shared_ptr<transport::Stream>) {
                     error = e;
                     done = true;
                   });
    io.run_for(10s);
    ASSERT_TRUE(done);
    ASSERT_TRUE(error);
    try {
      std::rethrow_exception(error);
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), errc::timed_out) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

// Sets the launcher environment of one from_env() call.
struct LauncherEnv {
  LauncherEnv(const std::string& where, int rank, int size) {
    params::comm_id.set_override(where);
    params::secret.set_override("00112233445566778899aabbccddeeff");
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(size).c_str(), 1);
  }
  ~LauncherEnv() {
    params::comm_id.set_override(std::nullopt);
    params::secret.set_override(std::nullopt);
    ::unsetenv("RANK");
    ::unsetenv("WORLD_SIZE");
  }
};

TEST(FromEnv, ALateRankWithNobodyListeningTimesOut) {
  Override timeout(params::timeout_s, "1");
  const auto ep = refusing_endpoint();
  LauncherEnv env("127.0.0.1:" + std::to_string(ep.port()), 3, 4);
  try {
    Communicator::from_env();
    FAIL() << "from_env succeeded with nobody listening";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::timed_out) << e.what();
  }
}

TEST(FromEnv, RankZeroOnATakenPortThrowsCocclErrorNamingTheAddress) {
  asio::io_context io;
  tcp::acceptor taken(io, tcp::endpoint(asio::ip::address_v4::any(), 0));
  const auto port = taken.local_endpoint().port();
  LauncherEnv env("127.0.0.1:" + std::to_string(port), 0, 2);
  try {
    Communicator::from_env();
    FAIL() << "from_env succeeded on a taken port";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().category(), coccl::error_category()) << e.what();
    EXPECT_EQ(e.code(), errc::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(":" + std::to_string(port)), std::string::npos)
        << e.what();
  } catch (const std::exception& e) {
    FAIL() << "not a coccl error: " << e.what();
  }
}

// ---- Admission: who waits when the unauthenticated connections are at the cap ----

// `n` accepted streams of loopback connections; the dialled ends stay in `dialled`.
std::vector<std::shared_ptr<transport::Stream>> accepted_streams(
    asio::io_context& io, int n, std::vector<std::unique_ptr<tcp::socket>>& dialled) {
  tcp::acceptor a(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  std::vector<std::shared_ptr<transport::Stream>> out;
  for (int i = 0; i < n; ++i) {
    dialled.push_back(std::make_unique<tcp::socket>(io));
    dialled.back()->connect(a.local_endpoint());
    out.push_back(std::make_shared<transport::Stream>(a.accept()));
  }
  return out;
}

// Asks `admission` for room and runs `io` until it is given (true) or `limit` passes (false).
bool room_comes(asio::io_context& io, transport::Admission& admission,
                std::chrono::steady_clock::duration limit) {
  bool room = false;
  admission.when_room(io.get_executor(), [&] {
    room = true;
    io.stop();
  });
  io.run_for(limit);
  return room;
}

TEST(Admission, AtTheCapTheNextAcceptWaitsUntilOneAuthenticates) {
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> dialled;
  auto streams = accepted_streams(io, 2, dialled);
  transport::Admission admission(2, 10s, 10s);
  auto first = admission.admit(streams[0]);
  auto second = admission.admit(streams[1]);
  bool room = false;
  admission.when_room(io.get_executor(), [&] { room = true; });
  io.run_for(200ms);
  EXPECT_FALSE(room) << "two wait, both within their grace: no room yet";
  first.release();
  io.restart();
  io.run_for(200ms);
  EXPECT_TRUE(room);
  EXPECT_TRUE(streams[0]->is_open());
  EXPECT_TRUE(streams[1]->is_open());
  EXPECT_EQ(admission.waiting(), 1u);
}

TEST(Admission, BelowTheCapThereIsRoomAtOnce) {
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> dialled;
  auto streams = accepted_streams(io, 1, dialled);
  transport::Admission admission(2, 10s, 10s);
  auto one = admission.admit(streams[0]);
  bool room = false;
  admission.when_room(io.get_executor(), [&] { room = true; });
  EXPECT_FALSE(room) << "called from within when_room";
  io.run_for(200ms);
  EXPECT_TRUE(room);
}

TEST(Admission, AnAnsweredConnectionGivesWayOnceItsGraceHasPassed) {
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> dialled;
  auto streams = accepted_streams(io, 2, dialled);
  transport::Admission admission(2, 300ms, 10s);
  auto first = admission.admit(streams[0]);
  first.answered();
  const auto first_answered = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(100ms);
  auto second = admission.admit(streams[1]);
  second.answered();
  ASSERT_TRUE(room_comes(io, admission, 5s));
  // Not before the first had its grace.
  EXPECT_GE(std::chrono::steady_clock::now() - first_answered, 300ms);
  EXPECT_FALSE(streams[0]->is_open()) << "the first answered is closed";
  EXPECT_TRUE(streams[1]->is_open());
  EXPECT_EQ(admission.waiting(), 1u);
}

// A connection that has not opened its handshake gives way first, though it is the newer.
TEST(Admission, ASilentConnectionGivesWayBeforeAnAnsweredOne) {
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> dialled;
  auto streams = accepted_streams(io, 2, dialled);
  transport::Admission admission(2, 10s, 100ms);
  auto answered = admission.admit(streams[0]);
  answered.answered();
  auto silent = admission.admit(streams[1]);
  ASSERT_TRUE(room_comes(io, admission, 5s));
  EXPECT_TRUE(streams[0]->is_open()) << "the answered one keeps its place";
  EXPECT_FALSE(streams[1]->is_open()) << "the silent one is closed";
  EXPECT_EQ(admission.waiting(), 1u);
}

TEST(Admission, ARequestPendingWhenItIsDestroyedIsNeverCalled) {
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> dialled;
  auto streams = accepted_streams(io, 1, dialled);
  bool room = false;
  transport::Admission::Ticket ticket;
  {
    transport::Admission admission(1, 50ms, 50ms);
    ticket = admission.admit(streams[0]);
    admission.when_room(io.get_executor(), [&] { room = true; });
  }
  ticket.release();
  io.run_for(300ms);
  EXPECT_FALSE(room);
}

}  // namespace
}  // namespace coccl::test
