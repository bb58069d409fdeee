// tcp links under both engines (COCCL_TCP_ENGINE=uring and =asio), several sockets per link, a
// link between ranks on different engines, and the fallback to Asio where io_uring is refused.
#include <gtest/gtest.h>

#include <coccl/error.hpp>
#include <csignal>
#include <string>
#include <vector>

#include "tests/multirank/harness.hpp"
#include "tests/multirank/worker.hpp"
#include "transport/tcp_uring.hpp"

namespace coccl::test {
namespace {

int coccl_exit(errc e) { return exit_coccl_error_base + static_cast<int>(e); }

std::vector<std::string> tcp_env(const std::string& engine, std::vector<std::string> more = {}) {
  std::vector<std::string> env{"COCCL_TIMEOUT=60", "COCCL_TRANSPORT=tcp",
                               "COCCL_TCP_ENGINE=" + engine, "COCCL_DEBUG=INFO",
                               "COCCL_DEBUG_SUBSYS=net"};
  // A later entry replaces an earlier one of the same name.
  for (const std::string& kv : more) {
    const std::string name = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env, [&](const std::string& e) { return e.starts_with(name); });
    env.push_back(kv);
  }
  return env;
}

bool every_rank_says(const LaunchResult& r, const std::string& text) {
  for (const RankResult& rank : r.ranks)
    if (rank.output.find(text) == std::string::npos) return false;
  return true;
}

std::string last_error_line(const RankResult& r) {
  auto at = r.output.find("LAST_ERROR ");
  if (at == std::string::npos) return {};
  return r.output.substr(at, r.output.find('\n', at) - at);
}

void skip_without_uring() {
  if (!transport::uring_unavailable().empty())
    GTEST_SKIP() << "io_uring unavailable here: " << transport::uring_unavailable();
}

// ---- The tcp tests under each engine ---------------------------------------------------------

class TcpEngine : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(GetParam()) == "uring") skip_without_uring();
  }
  std::string engine() const { return GetParam(); }
  std::string engine_line() const {
    return engine() == "uring" ? "tcp engine: io_uring" : "tcp engine: asio";
  }
  // `scenario` on `nranks` ranks over tcp on this engine.
  LaunchResult run(const std::string& scenario, int nranks) const {
    LaunchOptions o;
    o.scenario = scenario;
    o.nranks = nranks;
    o.env = tcp_env(engine());
    return launch(o);
  }
};

TEST_P(TcpEngine, EveryCollectiveWithThreeRanks) {
  const LaunchResult r = run("every_collective", 3);
  ASSERT_TRUE(r.all_passed()) << r.describe();
  EXPECT_TRUE(every_rank_says(r, engine_line())) << r.describe();
}

TEST_P(TcpEngine, AllReduceWithFourRanksSmallSlotsAndThreeSockets) {
  LaunchOptions o;
  o.scenario = "all_reduce";
  o.nranks = 4;
  o.args = {"quick"};
  o.env = tcp_env(engine(), {"COCCL_SLOT_BYTES=4096", "COCCL_SLOTS=2", "COCCL_TCP_SOCKETS=3"});
  const LaunchResult r = launch(o);
  ASSERT_TRUE(r.all_passed()) << r.describe();
  // The asio engine has one socket per link; uring stripes over the three asked for.
  EXPECT_TRUE(every_rank_says(
      r, engine() == "uring" ? "over 3 sockets, 2 on io_uring" : "connected to rank"))
      << r.describe();
}

TEST_P(TcpEngine, KilledRankIsNamedByEverySurvivor) {
  LaunchOptions o;
  o.scenario = "loop";
  o.nranks = 4;
  o.env = tcp_env(engine(), {"COCCL_TIMEOUT=5"});
  o.signals = {{2, SIGKILL, "looping", std::chrono::milliseconds(200)}};
  o.deadline = std::chrono::seconds(60);
  const LaunchResult r = launch(o);
  ASSERT_FALSE(r.timed_out) << r.describe();
  ASSERT_TRUE(r.fired[0]) << r.describe();
  EXPECT_EQ(r.ranks[2].signal, SIGKILL) << r.describe();
  for (int rank : {0, 1, 3}) {
    const RankResult& x = r.ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(x.signal, 0) << r.describe();
    EXPECT_TRUE(x.exit_code == coccl_exit(errc::peer_lost) ||
                x.exit_code == coccl_exit(errc::remote_error))
        << r.describe();
    EXPECT_NE(last_error_line(x).find("rank 2"), std::string::npos) << r.describe();
  }
}

// Blocking callers on three threads at once, each with a communicator of its own on the one proxy
// thread, run small operations on the fast path and, for the rest, that thread's loop in turn
// (asio) or hand them to it (uring, whose ring binds the loop); handlers that make blocking calls
// are refused wherever they run (tests/multirank/blocking.cpp).
TEST_P(TcpEngine, BlockingCallersOnSeveralThreadsAndRefusedHandlers) {
  const LaunchResult r = run("blocking_threads", 3);
  ASSERT_TRUE(r.all_passed()) << r.describe();
}

// Small puts complete once copied, before their bytes are written: a rank that sends and then
// destroys its communicator at once still delivers every message, small and large.
TEST_P(TcpEngine, SendsThenDestroyAreAllDelivered) {
  const LaunchResult r = run("send_and_leave", 2);
  ASSERT_TRUE(r.all_passed()) << r.describe();
}

// Zero-copy puts from registered buffers: on uring they are sent from the ring's registered
// buffers and counted in zero_copy_bytes (exactly those, per buffer: a registration that ended, a
// full table and a buffer the kernel refuses fall back to unregistered zero-copy sends, uncounted);
// on asio nothing is zero-copy. Every transfer is checked against the reference either way.
TEST_P(TcpEngine, ZeroCopyPutsFromRegisteredBuffers) {
  LaunchOptions o;
  o.scenario = "registered_uring";
  o.nranks = 2;
  o.env = tcp_env(engine(),
                  {"COCCL_SLOT_BYTES=65536", "COCCL_TCP_ZC_MIN=65536", "COCCL_TCP_SOCKETS=2"});
  const LaunchResult r = launch(o);
  ASSERT_TRUE(r.all_passed()) << r.describe();
  if (engine() == "uring") {
    EXPECT_TRUE(every_rank_says(r, "io_uring refused a registered buffer of 1140850688 bytes"))
        << r.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, TcpEngine, ::testing::Values("uring", "asio"),
                         [](const auto& info) { return std::string(info.param); });

// ---- Several sockets per link ----------------------------------------------------------------

// Puts go round the sockets in turn and may arrive in any order across them; with 4 KiB slots
// every collective is many chunks, and the reference check fails if any came out of order. Puts
// of 2 KiB and more go zero-copy (SEND_ZC), smaller ones are copied: both paths interleave.
TEST(TcpStriping, FourSocketsAndSmallSlotsDeliverEveryChunkInPutOrder) {
  skip_without_uring();
  LaunchOptions o;
  o.scenario = "every_collective";
  o.nranks = 3;
  o.env = tcp_env("uring", {"COCCL_SLOT_BYTES=4096", "COCCL_SLOTS=8", "COCCL_TCP_SOCKETS=4",
                            "COCCL_TCP_ZC_MIN=2048"});
  const LaunchResult r = launch(o);
  ASSERT_TRUE(r.all_passed()) << r.describe();
  EXPECT_TRUE(every_rank_says(r, "over 4 sockets, 3 on io_uring")) << r.describe();
}

// A rank on the asio engine links with uring ranks over one socket; the uring ranks use four
// between themselves.
TEST(TcpStriping, RanksOnDifferentEnginesAgreeOnOneSocket) {
  skip_without_uring();
  LaunchOptions o;
  o.scenario = "all_reduce";
  o.nranks = 3;
  o.args = {"quick"};
  o.env = tcp_env("uring", {"COCCL_SLOT_BYTES=4096", "COCCL_TCP_SOCKETS=4"});
  o.rank_env = {{}, {"COCCL_TCP_ENGINE=asio"}, {}};
  const LaunchResult r = launch(o);
  ASSERT_TRUE(r.all_passed()) << r.describe();
  EXPECT_NE(r.ranks[0].output.find("tcp link to rank 1 over 1 socket, none on io_uring"),
            std::string::npos)
      << r.describe();
  EXPECT_NE(r.ranks[0].output.find("tcp link to rank 2 over 4 sockets, 3 on io_uring"),
            std::string::npos)
      << r.describe();
  EXPECT_NE(r.ranks[1].output.find("tcp engine: asio"), std::string::npos) << r.describe();
}

// The fast path reads socket 0 only, and which puts travel there depends on COCCL_TCP_ZC_MIN: a
// rank with a smaller zero-copy size sends puts of 2 to 16 KiB on the ring's sockets, where the
// others' fast path, waiting on socket 0, cannot see them. Those operations are handed over when
// the spin ends, and every result is still right.
TEST(TcpStriping, RanksWithDifferentZeroCopySizesGetEveryResultRight) {
  skip_without_uring();
  LaunchOptions o;
  o.scenario = "all_reduce";
  o.nranks = 3;
  o.args = {"quick", "nolarge"};
  o.env = tcp_env("uring", {"COCCL_TCP_SOCKETS=2"});
  o.rank_env = {{}, {"COCCL_TCP_ZC_MIN=2048"}, {}};
  const LaunchResult r = launch(o);
  ASSERT_TRUE(r.all_passed()) << r.describe();
}

// ---- Slot size where every rank is a host of its own -----------------------------------------

// Each rank its own host (COCCL_HOSTID): every link crosses the network.
std::vector<std::vector<std::string>> own_hosts(int nranks) {
  return rank_hosts(nranks, nranks, "slot-host-");
}

// The quick all_reduce scenario, one rank per entry of `rank_env`.
LaunchResult quick_all_reduce(std::vector<std::string> env,
                              std::vector<std::vector<std::string>> rank_env) {
  LaunchOptions o;
  o.scenario = "all_reduce";
  o.nranks = static_cast<int>(rank_env.size());
  o.args = {"quick"};
  o.env = std::move(env);
  o.rank_env = std::move(rank_env);
  return launch(o);
}

bool any_rank_says(const LaunchResult& r, const std::string& text) {
  for (const RankResult& rank : r.ranks)
    if (rank.output.find(text) != std::string::npos) return true;
  return false;
}

// What a rank logs when it takes the larger slots.
const std::string widened = "every rank a host of its own";

// COCCL_SLOT_BYTES left unset: 512 KiB slots on each rank alike, and every result right.
TEST(LinkSlots, RanksEachAHostOfTheirOwnTakeLargerSlots) {
  const LaunchResult r = quick_all_reduce(tcp_env("auto"), own_hosts(3));
  ASSERT_TRUE(r.all_passed()) << r.describe();
  EXPECT_TRUE(every_rank_says(r, widened + ": links of 524288-byte slots")) << r.describe();
}

// Two ranks share a host: shared memory keeps the default slots, and so do the tcp links of the
// same communicator (every rank chunks alike).
TEST(LinkSlots, RanksSharingAHostKeepTheDefault) {
  const LaunchResult r =
      quick_all_reduce({"COCCL_TIMEOUT=60", "COCCL_DEBUG=INFO", "COCCL_DEBUG_SUBSYS=net"},
                       {{"COCCL_HOSTID=a"}, {"COCCL_HOSTID=a"}, {"COCCL_HOSTID=b"}});
  ASSERT_TRUE(r.all_passed()) << r.describe();
  EXPECT_FALSE(any_rank_says(r, widened)) << r.describe();
}

// A size set explicitly wins over the network default.
TEST(LinkSlots, AnExplicitSlotSizeWins) {
  const LaunchResult r =
      quick_all_reduce(tcp_env("auto", {"COCCL_SLOT_BYTES=262144"}), own_hosts(2));
  ASSERT_TRUE(r.all_passed()) << r.describe();
  EXPECT_FALSE(any_rank_says(r, widened)) << r.describe();
}

// One rank sets the size its peers take by default, the others leave it: no link forms, and the
// error names the two sizes instead of a bare "different settings".
TEST(LinkSlots, RanksOfDifferentSlotSizesFailNamingBoth) {
  std::vector<std::vector<std::string>> hosts = own_hosts(2);
  hosts[1].push_back("COCCL_SLOT_BYTES=262144");
  const LaunchResult r = quick_all_reduce(tcp_env("auto", {"COCCL_TIMEOUT=20"}), hosts);
  EXPECT_FALSE(r.ranks[0].exit_code == 0 && r.ranks[1].exit_code == 0) << r.describe();
  EXPECT_TRUE(any_rank_says(r, "slots of 524288 bytes there, 262144 here") ||
              any_rank_says(r, "slots of 262144 bytes there, 524288 here"))
      << r.describe();
}

// ---- Fallback where io_uring is refused --------------------------------------------------------

// The workers' io_uring_setup fails with EPERM (a seccomp filter, as in a locked-down container).
TEST(TcpEngineFallback, RefusedIoUringFallsBackToAsioAndLogsWhy) {
  LaunchOptions o;
  o.scenario = "all_reduce";
  o.nranks = 2;
  o.args = {"quick", "deny_uring"};
  o.env = tcp_env("auto");
  const LaunchResult r = launch(o);
  ASSERT_TRUE(r.all_passed()) << r.describe();
  EXPECT_TRUE(every_rank_says(
      r, "tcp engine: asio (io_uring unavailable: io_uring_queue_init: Operation not permitted)"))
      << r.describe();
}

TEST(TcpEngineFallback, ForcedUringWhereRefusedFailsWithAClearError) {
  LaunchOptions o;
  o.scenario = "all_reduce";
  o.nranks = 2;
  o.args = {"quick", "deny_uring"};
  o.env = tcp_env("uring", {"COCCL_TIMEOUT=10", "COCCL_DEBUG_SUBSYS=net,init"});
  o.deadline = std::chrono::seconds(60);
  const LaunchResult r = launch(o);
  ASSERT_FALSE(r.timed_out) << r.describe();
  for (const RankResult& x : r.ranks) {
    EXPECT_NE(x.output.find("category=coccl value=" +
                            std::to_string(static_cast<int>(errc::unsupported))),
              std::string::npos)
        << r.describe();
    EXPECT_NE(x.output.find("COCCL_TCP_ENGINE=uring, but io_uring is unavailable: "
                            "io_uring_queue_init: Operation not permitted"),
              std::string::npos)
        << r.describe();
  }
}

TEST(TcpEngineFallback, UnknownEngineIsAnInvalidArgument) {
  LaunchOptions o;
  o.scenario = "all_reduce";
  o.nranks = 2;
  o.args = {"quick"};
  o.env = tcp_env("epoll", {"COCCL_TIMEOUT=10", "COCCL_DEBUG_SUBSYS=net,init"});
  o.deadline = std::chrono::seconds(60);
  const LaunchResult r = launch(o);
  ASSERT_FALSE(r.timed_out) << r.describe();
  for (const RankResult& x : r.ranks) {
    EXPECT_NE(x.output.find("category=coccl value=" +
                            std::to_string(static_cast<int>(errc::invalid_argument))),
              std::string::npos)
        << r.describe();
    EXPECT_NE(x.output.find("COCCL_TCP_ENGINE=epoll: expected uring, asio or auto"),
              std::string::npos)
        << r.describe();
  }
}

}  // namespace
}  // namespace coccl::test
