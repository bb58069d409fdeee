// Communicator::from_env() under each launcher it supports, with real processes: torchrun's
// TCPStore (served by a fake store speaking its protocol, and by a real torchrun where PyTorch is
// installed), mpirun's PMIx, and an explicit
// COCCL_COMM_ID, which needs a secret. Each worker joins from the environment, checks every result
// of its scenario, and then forms a second communicator the same way.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <coccl/error.hpp>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "tests/multirank/harness.hpp"
#include "tests/support/fake_store.hpp"

namespace coccl::test {
namespace {

LaunchOptions torchrun_like(const FakeStore& store, int nranks) {
  LaunchOptions o;
  o.scenario = "all_reduce";
  o.nranks = nranks;
  o.id_text = "env";
  o.args = {"quick", "nolarge"};
  o.env = {"COCCL_TIMEOUT=60",
           "MASTER_ADDR=127.0.0.1",
           "MASTER_PORT=" + std::to_string(store.port()),
           "WORLD_SIZE=" + std::to_string(nranks),
           "COCCL_COMM_ID=",
           "COCCL_SECRET="};
  for (int r = 0; r < nranks; ++r) o.rank_env.push_back({"RANK=" + std::to_string(r)});
  return o;
}

bool is_hex(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string all_output(const LaunchResult& r) {
  std::string out;
  for (const auto& rank : r.ranks) out += rank.output;
  return out;
}

// A rank that never comes (WORLD_SIZE 3, two ranks started): those that came fail within
// COCCL_TIMEOUT with timed_out, saying how many ranks had arrived in the store when they did.
TEST(FromEnv, TorchrunStoreWithARankMissingFailsEveryRankThatCameWithinTheTimeout) {
  FakeStore store;
  LaunchOptions o = torchrun_like(store, 3);
  o.nranks = 2;
  o.rank_env.resize(2);
  o.env.push_back("COCCL_BOOTSTRAP=launcher");
  for (std::string& e : o.env)
    if (e.starts_with("COCCL_TIMEOUT=")) e = "COCCL_TIMEOUT=3";
  o.deadline = std::chrono::seconds(60);
  const auto t0 = std::chrono::steady_clock::now();
  const LaunchResult r = launch(o);
  ASSERT_FALSE(r.timed_out) << r.describe();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  std::size_t said = 0;
  for (const auto& rank : r.ranks) {
    EXPECT_NE(rank.exit_code, 0) << r.describe();
    EXPECT_NE(rank.output.find("category=coccl value=" +
                               std::to_string(static_cast<int>(errc::timed_out))),
              std::string::npos)
        << rank.output;
    said += rank.output.find(" of 3 ranks had put their address in the launcher's store") !=
            std::string::npos;
  }
  EXPECT_EQ(said, 2u) << r.describe();
}

// COCCL_BOOTSTRAP=launcher under torchrun: no root. Rank 0 sets a random secret in the store,
// every rank sets its listener's entry and counts its host there, and reads the entries it keeps.
// Ranks 0-1 and 2-4 act as two hosts. With a full directory the entries give the hosts; above
// COCCL_DIRECTORY_FULL (lowered to 2) a rank reads only its partners' and the store's count.
TEST(FromEnv, TorchrunStoreFormsWithoutARootFromTheRanksEntries) {
  std::vector<std::string> secrets;
  for (const char* full : {"64", "2"}) {
    FakeStore store;
    LaunchOptions o = torchrun_like(store, 5);
    o.env.push_back("COCCL_DEBUG=INFO");
    o.env.push_back("COCCL_BOOTSTRAP=launcher");
    o.env.push_back(std::string("COCCL_DIRECTORY_FULL=") + full);
    for (int r = 0; r < 5; ++r)
      o.rank_env[r].push_back(r < 2 ? "COCCL_HOSTID=a" : "COCCL_HOSTID=b");
    const LaunchResult r = launch(o);
    ASSERT_TRUE(r.all_passed()) << r.describe();
    const std::string out = all_output(r);
    EXPECT_EQ(count_of(out, "formed from the launcher's table, without a root: 5 ranks, 2 hosts"),
              10u)
        << out;
    EXPECT_EQ(count_of(out, "bootstrap done"), 0u) << out;
    // Every rank spoke the store's protocol, once per from_env() call.
    EXPECT_EQ(store.validated_clients(), 10);
    const auto kv = store.contents();
    std::set<std::string> calls;
    for (const auto& [key, value] : kv) {
      ASSERT_TRUE(key.starts_with("coccl/from_env/")) << key;
      calls.insert(key.substr(0, key.find('/', std::string("coccl/from_env/").size())));
    }
    ASSERT_EQ(calls.size(), 2u);
    for (const std::string& call : calls) {
      const std::string& secret = kv.at(call + "/secret");
      EXPECT_EQ(secret.size(), 32u);
      EXPECT_TRUE(is_hex(secret)) << secret;
      secrets.push_back(secret);
      for (int rank = 0; rank < 5; ++rank) {
        const std::string& entry = kv.at(call + "/addr/" + std::to_string(rank));
        EXPECT_TRUE(is_hex(entry)) << entry;
      }
      EXPECT_EQ(kv.at(call + "/arrived"), "5");
      EXPECT_EQ(kv.at(call + "/hosts"), "2");
      EXPECT_TRUE(kv.count(call + "/ready"));
      // The secret, five entries, two hosts' counts, the host count, arrivals, the barrier.
      std::size_t keys = 0;
      for (const auto& [key, value] : kv) keys += key.starts_with(call + "/");
      EXPECT_EQ(keys, 11u);
    }
  }
  // Random secrets: the two communicators of a run and those of the next run all differ.
  std::sort(secrets.begin(), secrets.end());
  EXPECT_EQ(std::unique(secrets.begin(), secrets.end()), secrets.end());
}

// The default under torchrun (and COCCL_BOOTSTRAP=root): rank 0 publishes a fresh random id
// (root address and secret) in the store and the others read it.
TEST(FromEnv, TorchrunStoreCarriesAFreshRandomIdToEveryRank) {
  std::vector<std::string> ids;
  for (const char* how : {"auto", "root"}) {
    FakeStore store;
    LaunchOptions o = torchrun_like(store, 4);
    o.env.push_back(std::string("COCCL_BOOTSTRAP=") + how);
    const LaunchResult r = launch(o);
    ASSERT_TRUE(r.all_passed()) << r.describe();
    // Every rank spoke the store's protocol; rank 0 published one id per from_env() call.
    EXPECT_EQ(store.validated_clients(), 8);
    const auto kv = store.contents();
    ASSERT_EQ(kv.size(), 2u);
    for (const auto& [key, value] : kv) {
      EXPECT_TRUE(key.starts_with("coccl/from_env/")) << key;
      EXPECT_EQ(value.size(), 256u);
      EXPECT_TRUE(is_hex(value)) << value;
      ids.push_back(value);
    }
  }
  // Random ids: the two communicators of one run and those of a second run all differ, so no
  // secret follows from the address or the job.
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());
}

// A bad COCCL_BOOTSTRAP is refused under torchrun too, before the store is touched.
TEST(FromEnv, TorchrunRefusesAnUnknownBootstrap) {
  FakeStore store;
  LaunchOptions o = torchrun_like(store, 2);
  o.env.push_back("COCCL_BOOTSTRAP=leader");
  const LaunchResult r = launch(o);
  ASSERT_FALSE(r.timed_out) << r.describe();
  for (const auto& rank : r.ranks) {
    EXPECT_NE(rank.exit_code, 0) << r.describe();
    EXPECT_NE(rank.output.find("COCCL_BOOTSTRAP is auto, root or launcher, not 'leader'"),
              std::string::npos)
        << rank.output;
  }
  EXPECT_EQ(store.validated_clients(), 0);
}

TEST(FromEnv, CommIdWithoutASecretIsRefusedOnEveryRank) {
  LaunchOptions o;
  o.scenario = "all_reduce";
  o.nranks = 2;
  o.id_text = "env";
  o.env = {"COCCL_TIMEOUT=10", "COCCL_COMM_ID=127.0.0.1:1", "COCCL_SECRET=", "WORLD_SIZE=2"};
  o.rank_env = {{"RANK=0"}, {"RANK=1"}};
  const LaunchResult r = launch(o);
  ASSERT_FALSE(r.timed_out) << r.describe();
  for (const auto& rank : r.ranks) {
    EXPECT_NE(rank.exit_code, 0) << r.describe();
    EXPECT_NE(rank.output.find("COCCL_SECRET"), std::string::npos) << rank.output;
  }
}

// Runs `command` through the shell, returning its exit status and merged output.
std::pair<int, std::string> shell(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The worker's all_reduce scenario for `n` ranks, each taking its rank from the launcher (-1).
std::string launched_worker(int n) {
  return std::string(COCCL_WORKER) + " all_reduce -1 " + std::to_string(n) + " env quick nolarge";
}

// `n` workers of the all_reduce scenario under mpirun, with `env` (NAME=value ...) passed to
// them; each forms two communicators from the environment. Rank -1: the worker takes its rank
// from the launcher. MASTER_ADDR and COCCL_COMM_ID are cleared so that PMIx is the only way the
// ranks can meet. libpmix keeps a few bytes of its own initialisation until exit, which the
// sanitizer build's leak check would count.
std::pair<int, std::string> under_mpirun(int n, const std::vector<std::string>& env,
                                         std::string program = {}) {
  if (program.empty()) program = launched_worker(n);
  const std::string supp = ::testing::TempDir() + "coccl_lsan_pmix.supp";
  if (FILE* f = std::fopen(supp.c_str(), "w")) {
    std::fputs("leak:libpmix.so\n", f);
    std::fclose(f);
  }
  std::string vars, exported;
  for (const std::string& e : env) {
    vars += e + " ";
    exported += "-x " + e.substr(0, e.find('=')) + " ";
  }
  const std::string cmd =
      "env -u MASTER_ADDR -u MASTER_PORT -u COCCL_COMM_ID -u COCCL_SECRET COCCL_TIMEOUT=60 "
      "LSAN_OPTIONS=suppressions=" +
      supp + " " + vars +
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1 "
      "timeout 120 /usr/bin/mpirun " +
      exported + "-n " + std::to_string(n) + " " + program + " 2>&1";
  return shell(cmd);
}

TEST(FromEnv, MpirunPassesTheIdThroughPmix) {
  if (::access("/usr/bin/mpirun", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/mpirun";
  // With a root: rank 0 starts it and puts its id in the launcher's table.
  const auto [code, out] = under_mpirun(3, {"COCCL_BOOTSTRAP=root", "COCCL_DEBUG=INFO"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(count_of(out, "all checks passed"), 3u) << out;
  EXPECT_EQ(count_of(out, "bootstrap done: 3 ranks"), 6u) << out;
  EXPECT_EQ(count_of(out, "formed from the launcher's table"), 0u) << out;
}

// The default under PMIx: no root; every rank puts its listener in the launcher's table and
// reads those it keeps. A full directory (3 ranks) counts the hosts from the entries; above
// COCCL_DIRECTORY_FULL (lowered to 2) a rank reads its O(log N) partners and the launcher counts
// the hosts (its nodes: one here).
TEST(FromEnv, MpirunFormsFromTheLaunchersTableWithoutARoot) {
  if (::access("/usr/bin/mpirun", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/mpirun";
  for (const auto& [n, full] : {std::pair{3, "64"}, std::pair{4, "2"}}) {
    const auto [code, out] =
        under_mpirun(n, {"COCCL_DEBUG=INFO", std::string("COCCL_DIRECTORY_FULL=") + full});
    EXPECT_EQ(code, 0) << out;
    const std::string formed =
        "formed from the launcher's table, without a root: " + std::to_string(n) +
        " ranks, 1 hosts";
    EXPECT_EQ(count_of(out, "all checks passed"), static_cast<std::size_t>(n)) << out;
    EXPECT_EQ(count_of(out, formed), 2u * n) << out;
    EXPECT_EQ(count_of(out, "bootstrap done"), 0u) << out;
  }
}

// A process of the job that never calls from_env() (it sleeps): the others' fence fails within
// COCCL_TIMEOUT (PMIx's own timeout) with timed_out. Each worker's shell reports the worker's exit
// status and exits 0 itself: a process that exits non-zero makes mpirun end the job, which could
// kill the other worker before it has printed its error.
TEST(FromEnv, UnderMpirunAProcessThatNeverComesFailsTheOthersWithinTheTimeout) {
  if (::access("/usr/bin/mpirun", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/mpirun";
  const auto t0 = std::chrono::steady_clock::now();
  // mpirun's own status is not checked: it says only that rank 2 never initialised.
  const std::string out =
      under_mpirun(3, {"COCCL_TIMEOUT=3"},
                   "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 2 ]; then sleep 10; else " +
                       launched_worker(3) + "; echo \"worker exited $?\"; fi'")
          .second;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(50)) << out;
  EXPECT_EQ(count_of(out, "all checks passed"), 0u) << out;
  // Both processes that came say so, and fail.
  // (A rank may also log the failure as a warning, with the same words.)
  EXPECT_EQ(
      count_of(out, "category=coccl value=" + std::to_string(static_cast<int>(errc::timed_out)) +
                        ": PMIx_Fence: not every process of the job came within 3 s"),
      2u)
      << out;
  EXPECT_EQ(count_of(out, "worker exited "), 2u) << out;
  EXPECT_EQ(count_of(out, "worker exited 0"), 0u) << out;
}

// COCCL_HOSTID gives ranks hosts the launcher does not know: above the full directory's limit
// auto falls back to a root, and launcher refuses with the reason on every rank.
TEST(FromEnv, HostIdentitiesTheLauncherCannotCountTakeARootOrAreRefused) {
  if (::access("/usr/bin/mpirun", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/mpirun";
  const std::vector<std::string> sparse{"COCCL_DEBUG=INFO", "COCCL_DIRECTORY_FULL=2",
                                        "COCCL_HOSTID=emulated"};
  {
    const auto [code, out] = under_mpirun(4, sparse);
    EXPECT_EQ(code, 0) << out;
    EXPECT_EQ(count_of(out, "all checks passed"), 4u) << out;
    EXPECT_EQ(count_of(out, "bootstrap done: 4 ranks"), 8u) << out;
    EXPECT_EQ(count_of(out, "formed from the launcher's table"), 0u) << out;
  }
  std::vector<std::string> forced = sparse;
  forced.push_back("COCCL_BOOTSTRAP=launcher");
  const auto [code, out] = under_mpirun(4, forced);
  EXPECT_NE(code, 0) << out;
  EXPECT_EQ(count_of(out, "all checks passed"), 0u) << out;
  EXPECT_GE(count_of(out,
                     "COCCL_BOOTSTRAP=launcher, but the launcher cannot count the hosts of 4 "
                     "ranks"),
            1u)
      << out;
  const auto [bad_code, bad_out] = under_mpirun(3, {"COCCL_BOOTSTRAP=leader"});
  EXPECT_NE(bad_code, 0) << bad_out;
  EXPECT_GE(count_of(bad_out, "COCCL_BOOTSTRAP is auto, root or launcher, not 'leader'"), 1u)
      << bad_out;
}

// A port no one listens on now (the kernel's pick for a socket bound to port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

// PyTorch's own launcher, where it is installed (the GPU machines' image has it; this machine
// does not): its agent serves the TCPStore on MASTER_PORT, and every rank's from_env() meets
// there. Standalone (one agent, three ranks) through a root and without one, then two agents of
// two ranks each without a root, as two hosts' agents would run, rendezvousing on the first
// agent's store.
TEST(FromEnv, RealTorchrunFormsThroughItsStore) {
  if (shell("command -v torchrun").first != 0) GTEST_SKIP() << "no torchrun on PATH";
  const std::string env = "env -u COCCL_COMM_ID -u COCCL_SECRET COCCL_TIMEOUT=60 COCCL_DEBUG=INFO ";
  const std::string rootless = "formed from the launcher's table, without a root";
  for (const char* how : {"auto", "launcher"}) {
    const auto [code, out] =
        shell(env + "COCCL_BOOTSTRAP=" + how + " timeout 120 torchrun --standalone " +
              "--nproc-per-node=3 --no-python " + launched_worker(3));
    EXPECT_EQ(code, 0) << out;
    EXPECT_EQ(count_of(out, "all checks passed"), 3u) << out;
    const bool root = std::string(how) == "auto";
    EXPECT_EQ(count_of(out, rootless), root ? 0u : 6u) << out;
    EXPECT_EQ(count_of(out, "bootstrap done: 3 ranks"), root ? 6u : 0u) << out;
  }
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string agent = env +
                            "COCCL_BOOTSTRAP=launcher timeout 120 torchrun --nnodes=2 "
                            "--master-addr=127.0.0.1 " +
                            "--master-port=" + std::to_string(port) +
                            " --nproc-per-node=2 --no-python ";
  // In a subshell, so that both agents' standard error joins the output.
  const auto [code, out] =
      shell("((" + agent + "--node-rank=1 " + launched_worker(4) + ") & " + agent +
            "--node-rank=0 " + launched_worker(4) + "; rc=$?; wait $! || rc=1; exit $rc)");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(count_of(out, "all checks passed"), 4u) << out;
  EXPECT_EQ(count_of(out, rootless), 8u) << out;
}

}  // namespace
}  // namespace coccl::test
