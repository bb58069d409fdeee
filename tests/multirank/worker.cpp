// coccl_worker: one rank of a multi-rank test.
//
//   coccl_worker <scenario> <rank> <nranks> <unique-id-hex> [flags...]
//   coccl_worker <scenario> <rank> <nranks> env [flags...]
//
// Flags: quick, nolarge (see correctness.cpp), cold (no warm-up operation before the scenario),
// world=K (the first communicator has K of the ranks; see recovery.cpp).
//
// Joins the communicator, runs the scenario and exits 0 only if every check passed (see
// worker.hpp for the other exit codes).
#include "tests/multirank/worker.hpp"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>

namespace coccl::test {

bool Worker::has(const std::string& flag) const {
  return std::find(args.begin(), args.end(), flag) != args.end();
}

bool Worker::expect_equal(const std::string& what, DataType t, const void* got, const void* want,
                          std::size_t count) {
  const std::size_t elt = size_of(t);
  if (count == 0 || std::memcmp(got, want, count * elt) == 0) return true;
  int shown = 0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * elt,
                    static_cast<const char*>(want) + i * elt, elt) == 0)
      continue;
    ++bad;
    if (shown++ < 4)
      std::printf("FAIL scenario=%s rank=%d %s index=%zu got=%s want=%s\n", scenario.c_str(), rank,
                  what.c_str(), i, show(t, got, i).c_str(), show(t, want, i).c_str());
  }
  std::printf("FAIL scenario=%s rank=%d %s: %zu of %zu elements differ\n", scenario.c_str(), rank,
              what.c_str(), bad, count);
  std::fflush(stdout);
  ++failures;
  return false;
}

void Worker::fail(const std::string& what, const std::string& why) {
  std::printf("FAIL scenario=%s rank=%d %s: %s\n", scenario.c_str(), rank, what.c_str(),
              why.c_str());
  std::fflush(stdout);
  ++failures;
}

std::string describe(const char* coll, DataType t, ReduceOp op, std::size_t count,
                     const std::string& extra) {
  std::string s = std::string("coll=") + coll + " type=" + std::string(to_string(t)) +
                  " op=" + std::string(to_string(op)) + " count=" + std::to_string(count);
  if (!extra.empty()) s += " " + extra;
  return s;
}

int report_error(Worker& w, const std::system_error& e, double seconds) {
  const std::error_code ec = e.code();
  std::printf("ERROR rank=%d category=%s value=%d after %.2f s: %s\nLAST_ERROR %s\n", w.rank,
              ec.category().name(), ec.value(), seconds, e.what(), w.comm.last_error().c_str());
  std::fflush(stdout);
  if (ec.category() == error_category()) return exit_coccl_error_base + ec.value();
  return exit_exception;
}

}  // namespace coccl::test

namespace {

// Flag "deny_uring": this process's io_uring_setup fails with EPERM, as under a container's
// seccomp policy, so that the tcp engine's fallback can be tested on a kernel that has io_uring.
bool deny_io_uring() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace coccl::test;
  if (argc < 5) {
    std::fprintf(stderr, "usage: coccl_worker <scenario> <rank> <nranks> <id-hex> [flags...]\n");
    return exit_exception;
  }
  Worker w;
  w.scenario = argv[1];
  w.rank = std::atoi(argv[2]);
  w.n = std::atoi(argv[3]);
  w.args.assign(argv + 5, argv + argc);
  if (auto it = std::find(w.args.begin(), w.args.end(), "deny_uring"); it != w.args.end()) {
    w.args.erase(it);
    if (!deny_io_uring()) {
      std::perror("seccomp");
      return exit_exception;
    }
  }

  const std::map<std::string, std::function<void(Worker&)>> checks{
      {"all_reduce", run_all_reduce},
      {"broadcast", run_broadcast},
      {"reduce", run_reduce},
      {"all_gather", run_all_gather},
      {"reduce_scatter", run_reduce_scatter},
      {"all_to_all", run_all_to_all},
      {"all_to_allv", run_all_to_allv},
      {"gather", run_gather},
      {"scatter", run_scatter},
      {"send_recv", run_send_recv},
      {"barrier", run_barrier},
      {"registered", run_registered},
  };
  // The collectives whose small forms need only O(log n) peers, small sizes only; all_to_all
  // with blocks small enough for Bruck's algorithm (a large one links every peer).
  auto log_peers = [&](Worker& wk) {
    wk.args.push_back("quick");
    wk.args.push_back("nolarge");
    for (const char* name : {"all_reduce", "all_gather", "reduce_scatter", "barrier"})
      checks.at(name)(wk);
    for (const std::size_t count : std::initializer_list<std::size_t>{0, 1, 7, 100})
      check_all_to_all(wk, coccl::DataType::int32, count);
    return exit_ok;
  };
  const std::map<std::string, std::function<int(Worker&)>> others{
      {"loop", run_loop},
      {"mismatch", run_mismatch},
      {"abort", run_abort},
      {"split", run_split},
      {"async", run_async},
      {"log_peers", log_peers},
      {"split_members", run_split_members},
      {"cancel", run_cancel},
      {"op_mismatch", run_op_mismatch},
      {"chaos", run_chaos},
      {"shrink", run_shrink},
      {"shrink_mismatch", run_shrink_mismatch},
      {"shrink_absent", run_shrink_absent},
      {"shrink_excluded", run_shrink_excluded},
      {"grow", run_grow},
      {"ftar", run_ftar},
      {"links", run_links},
      {"fast_path", run_fast_path},
      {"fast_handover", run_fast_handover},
      {"fast_mixed", run_fast_mixed},
      {"fast_interleaved", run_fast_interleaved},
      {"blocking_threads", run_blocking_threads},
      {"send_and_leave", run_send_and_leave},
      {"registered_uring", run_registered_uring},
  };
  try {
    const bool from_env = std::string(argv[4]) == "env";
    if (from_env) {
      // The launcher's way: rank and size come from the environment (or PMIx); a rank of -1 on
      // the command line leaves them to it.
      w.comm = coccl::Communicator::from_env();
      if ((w.rank >= 0 && w.comm.rank() != w.rank) || w.comm.size() != w.n)
        w.fail("from_env", "rank " + std::to_string(w.comm.rank()) + " of " +
                               std::to_string(w.comm.size()) + ", expected " +
                               std::to_string(w.rank) + " of " + std::to_string(w.n));
      w.rank = w.comm.rank();
    } else if (const int world = world_of(w); w.rank >= world) {
      // A newcomer: it joins later, by the scenario's own means.
      const int code = others.at(w.scenario)(w);
      if (code == exit_ok && w.failures == 0) std::printf("rank %d: all checks passed\n", w.rank);
      return code == exit_ok && w.failures ? exit_check_failed : code;
    } else {
      w.comm = coccl::Communicator::create(coccl::UniqueId::from_string(argv[4]), w.rank, world);
    }
    if (!w.has("cold")) {
      // Links to peers are made lazily by the first operation that needs them. reduce_scatter
      // links every peer up front (up to COCCL_DIRECT_MAX_RANKS ranks; above, the O(log n) peers
      // of its small form), so the scenarios check results rather than link setup; the
      // ColdStart tests (flag "cold") check link setup by each collective on its own.
      std::vector<std::int32_t> send(w.comm.size(), 1);
      std::int32_t recv = 0;
      w.comm.reduce_scatter(send.data(), &recv, 1, coccl::DataType::int32, coccl::ReduceOp::sum);
      if (recv != w.comm.size())
        w.fail("coll=reduce_scatter (warm-up)", "got " + std::to_string(recv));
    }
    int code = exit_ok;
    if (w.scenario == "every_collective") {
      // Everything once, in quick form, one communicator: for transport variants.
      w.args.push_back("quick");
      for (const auto& [name, run] : checks) run(w);
    } else if (auto c = checks.find(w.scenario); c != checks.end()) {
      c->second(w);
    } else if (auto o = others.find(w.scenario); o != others.end()) {
      code = o->second(w);
    } else {
      std::fprintf(stderr, "unknown scenario '%s'\n", w.scenario.c_str());
      return exit_exception;
    }
    if (code != exit_ok) return code;
    if (w.comm) w.comm.destroy();
    if (from_env) {
      // A second communicator from the same launcher must be a new one, not the first's id.
      auto again = coccl::Communicator::from_env();
      std::int64_t mine = again.rank() + 1, sum = 0;
      again.all_reduce(&mine, &sum, 1, coccl::DataType::int64, coccl::ReduceOp::sum);
      if (sum != static_cast<std::int64_t>(w.n) * (w.n + 1) / 2)
        w.fail("from_env (second)", "all_reduce sum " + std::to_string(sum));
      again.destroy();
    }
    if (w.failures) {
      std::printf("rank %d: %d checks failed\n", w.rank, w.failures);
      return exit_check_failed;
    }
    std::printf("rank %d: all checks passed\n", w.rank);
    return exit_ok;
  } catch (const std::system_error& e) {
    std::printf("EXCEPTION rank=%d category=%s value=%d: %s\n", w.rank, e.code().category().name(),
                e.code().value(), e.what());
    // The chaos trials kill a rank at any moment, creation included: a coccl error there is an
    // outcome to classify like any other.
    if (w.scenario == "chaos" && e.code().category() == coccl::error_category()) {
      std::printf("LAST_ERROR %s\n", e.what());
      return exit_coccl_error_base + e.code().value();
    }
    return exit_exception;
  } catch (const std::exception& e) {
    std::printf("EXCEPTION rank=%d: %s\n", w.rank, e.what());
    return exit_exception;
  }
}
