// Links under a memory budget and an idle timeout (COCCL_MEM_BUDGET, COCCL_LINK_IDLE_S): the
// "links" scenario, one of three modes by flag.
//   budget: rounds of ring all_reduce, pairwise exchanges with every peer (rank ^ k) and ring
//           all_gather, all checked, on a budget of two links: links are closed and reopened.
//   idle:   an all_reduce and small ones, then the links close when idle; the next all_reduce
//           reopens them.
//   tiny:   a budget below one link's ring: the first operation fails naming COCCL_MEM_BUDGET.
// Each checks the link counts of Communicator::status() and prints them ("links: ...").
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/multirank/worker.hpp"

namespace coccl::test {
namespace {

std::string line(const CommStatus& s) {
  return "links: open=" + std::to_string(s.links_open) +
         " opened=" + std::to_string(s.links_opened) +
         " closed_budget=" + std::to_string(s.links_closed_budget) +
         " closed_idle=" + std::to_string(s.links_closed_idle) +
         " ring_bytes=" + std::to_string(s.ring_bytes) + " budget=" + std::to_string(s.mem_budget);
}

void print(const CommStatus& s) {
  std::printf("%s\n", line(s).c_str());
  std::fflush(stdout);
}

// An all_reduce of (rank + 1) * (i % 13), checked.
void all_reduce(Worker& w, std::size_t count) {
  std::vector<float> in(count), out(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>((w.rank + 1) * (i % 13));
  w.comm.all_reduce(in.data(), out.data(), count, DataType::float32, ReduceOp::sum);
  const int sum = w.n * (w.n + 1) / 2;
  for (std::size_t i = 0; i < count; ++i)
    if (out[i] != static_cast<float>(sum * (i % 13))) {
      w.fail("coll=all_reduce count=" + std::to_string(count),
             "index " + std::to_string(i) + " is " + std::to_string(out[i]));
      return;
    }
}

// Rank r and rank r ^ k swap `count` values that name sender, step and round.
void exchange(Worker& w, int k, int round) {
  const int peer = w.rank ^ k;
  if (peer >= w.n) return;
  constexpr std::size_t count = 700;
  auto value = [&](int from, std::size_t i) {
    return static_cast<std::int32_t>(from * 1000000 + k * 10000 + round * 1000 + i);
  };
  std::vector<std::int32_t> out(count), in(count, -1);
  for (std::size_t i = 0; i < count; ++i) out[i] = value(w.rank, i);
  w.comm.send_recv({Communicator::recv_op(in.data(), count, DataType::int32, peer),
                    Communicator::send_op(out.data(), count, DataType::int32, peer)});
  for (std::size_t i = 0; i < count; ++i)
    if (in[i] != value(peer, i)) {
      w.fail("coll=send_recv peer=" + std::to_string(peer),
             "index " + std::to_string(i) + " is " + std::to_string(in[i]));
      return;
    }
}

void all_gather(Worker& w, int round) {
  std::vector<std::int32_t> mine{w.rank, round, -w.rank}, all(3 * w.n, -1);
  w.comm.all_gather(mine.data(), all.data(), 3, DataType::int32);
  for (int r = 0; r < w.n; ++r)
    if (all[3 * r] != r || all[3 * r + 1] != round || all[3 * r + 2] != -r) {
      w.fail("coll=all_gather", "block of rank " + std::to_string(r) + " is wrong");
      return;
    }
}

std::uint64_t env_bytes(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : 0;
}

int budget(Worker& w) {
  for (int round = 0; round < 3; ++round) {
    all_reduce(w, 1000);
    for (int k = 1; k < w.n; ++k) exchange(w, k, round);
    all_gather(w, round);
  }
  const CommStatus s = w.comm.status();
  print(s);
  if (s.mem_budget != env_bytes("COCCL_MEM_BUDGET")) w.fail("status", "budget " + line(s));
  if (s.links_closed_budget == 0) w.fail("status", "no link closed for the budget: " + line(s));
  // Reopenings: more links made than there are peers.
  if (s.links_opened < static_cast<std::uint64_t>(w.n))
    w.fail("status", "no reopening: " + line(s));
  if (s.ring_bytes > s.mem_budget || s.links_open > 2) w.fail("status", "over budget: " + line(s));
  return exit_ok;
}

int idle(Worker& w) {
  all_reduce(w, 1000);
  const CommStatus first = w.comm.status();
  print(first);
  // 4000 bytes ask for the smallest ring: 2 slots.
  const std::uint64_t small = 2 * env_bytes("COCCL_SLOT_BYTES");
  if (first.links_open < 1 || first.ring_bytes != first.links_open * small)
    w.fail("status", "links not sized for a small operation: " + line(first));
  // Small operations on the open links take the fast path where it is on; over tcp their last
  // credits wait for a next frame that does not come, and must still leave, or no link settles.
  for (int i = 0; i < 50; ++i) all_reduce(w, 2);
  // The links close once idle (both ends agree and count it); bounded by the test's deadline.
  // A peer that saw its own close first may already be reopening them for the next all_reduce,
  // so the count is what is waited for, not an empty link table.
  const auto closed = static_cast<std::uint64_t>(first.links_open);
  CommStatus s = first;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (s.links_closed_idle < closed && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = w.comm.status();
  }
  print(s);
  if (s.links_closed_idle < closed || s.links_closed_budget != 0)
    w.fail("status", "links not closed when idle: " + line(s));
  if (!s.error.empty()) w.fail("status", "an idle close failed the communicator: " + s.error);
  all_reduce(w, 1000);
  const CommStatus again = w.comm.status();
  print(again);
  if (again.links_open < 1 || again.links_opened <= first.links_opened)
    w.fail("status", "links not reopened: " + line(again));
  return exit_ok;
}

int tiny(Worker& w) {
  try {
    all_reduce(w, 1000);
  } catch (const std::system_error& e) {
    std::printf("refused: %s\n", e.what());
    if (std::string(e.what()).find("COCCL_MEM_BUDGET") == std::string::npos)
      w.fail("coll=all_reduce", std::string("the error does not name the budget: ") + e.what());
    return exit_ok;
  }
  w.fail("coll=all_reduce", "ran on a budget below one link");
  return exit_unexpected_success;
}

}  // namespace

int run_links(Worker& w) {
  if (w.has("budget")) return budget(w);
  if (w.has("idle")) return idle(w);
  if (w.has("tiny")) return tiny(w);
  w.fail("links", "needs a flag: budget, idle or tiny");
  return exit_check_failed;
}

}  // namespace coccl::test
