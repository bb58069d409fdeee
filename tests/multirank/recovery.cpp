// Recovery scenarios of coccl_worker: shrink after killed ranks, grow with newcomers, and a
// fault-tolerant all_reduce loop (FTAR).
//
// Flags: victims=a,b (ranks the test kills; they print "doomed" and wait for it), world=K (the
// first communicator has K ranks; workers K.. are newcomers that join by grow), fifo=DIR (a
// newcomer reads the grow id from the FIFO DIR/<its worker rank>, made by the test), and for
// ftar: victim=v, kill_step=k (the test kills rank v when it prints "paused at step k").
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "tests/multirank/worker.hpp"

namespace coccl::test {

namespace {

std::string value_of(const Worker& w, const std::string& name) {
  for (const auto& a : w.args)
    if (a.starts_with(name + "=")) return a.substr(name.size() + 1);
  return {};
}

std::vector<int> int_list(const std::string& text) {
  std::vector<int> out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    out.push_back(std::stoi(text.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

std::string list_text(const std::vector<int>& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(v[i]);
  }
  return s + "}";
}

// A rank the test kills: it tells the test, then waits for the signal.
[[noreturn]] void await_death(const std::string& marker) {
  std::printf("%s\n", marker.c_str());
  std::fflush(stdout);
  for (;;) ::pause();
}

// An all_reduce the victims never join: it fails once they are dead.
void fail_on_the_dead(Worker& w) {
  std::int64_t one = 1, sum = 0;
  try {
    w.comm.all_reduce(&one, &sum, 1, DataType::int64, ReduceOp::sum);
    w.fail("all_reduce without the victims", "succeeded");
  } catch (const std::system_error& e) {
    std::printf("rank %d: parent failed as expected: %s\n", w.rank, e.what());
  }
}

// Checks `comm`'s membership (original ranks, in order) and an all_reduce over it.
// async_shrink waited for on this thread: its code and communicator.
std::pair<boost::system::error_code, Communicator> shrink_waited(Communicator& comm,
                                                                 std::vector<int> exclude) {
  std::promise<std::pair<boost::system::error_code, Communicator>> done;
  comm.async_shrink(std::move(exclude), [&done](boost::system::error_code ec, Communicator c) {
    done.set_value({ec, std::move(c)});
  });
  return done.get_future().get();
}

void check_members(Worker& w, Communicator& comm, int me, const std::vector<int>& want) {
  const int n = static_cast<int>(want.size());
  if (comm.size() != n) {
    w.fail("size", std::to_string(comm.size()) + ", want " + std::to_string(n));
    return;
  }
  std::int32_t mine = me;
  std::vector<std::int32_t> all(n);
  comm.all_gather(&mine, all.data(), 1, DataType::int32);
  if (std::vector<int>(all.begin(), all.end()) != want)
    w.fail("members",
           list_text(std::vector<int>(all.begin(), all.end())) + ", want " + list_text(want));
  constexpr std::size_t count = 1000;
  std::vector<std::int64_t> send(count), recv(count), ref(count, 0);
  for (std::size_t i = 0; i < count; ++i) send[i] = (me + 1) * 1000003 + static_cast<int>(i);
  for (int r : want)
    for (std::size_t i = 0; i < count; ++i) ref[i] += (r + 1) * 1000003 + static_cast<int>(i);
  comm.all_reduce(send.data(), recv.data(), count, DataType::int64, ReduceOp::sum);
  w.expect_equal(
      describe("all_reduce", DataType::int64, ReduceOp::sum, count, "members=" + list_text(want)),
      DataType::int64, recv.data(), ref.data(), count);
}

std::vector<int> without(int n, const std::vector<int>& gone) {
  std::vector<int> out;
  for (int r = 0; r < n; ++r)
    if (std::find(gone.begin(), gone.end(), r) == gone.end()) out.push_back(r);
  return out;
}

UniqueId read_id(const Worker& w) {
  const std::string path = value_of(w, "fifo") + "/" + std::to_string(w.rank);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  std::string text(256, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return UniqueId::from_string(text);
}

void write_id(const Worker& w, int newcomer, const UniqueId& id) {
  const std::string path = value_of(w, "fifo") + "/" + std::to_string(newcomer);
  const int fd = ::open(path.c_str(), O_WRONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  const std::string text = id.to_string();
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    throw std::runtime_error("short write to " + path);
  ::close(fd);
}

// The first communicator's survivors after the victims are killed, shrunk to themselves.
Communicator shrink_after_kill(Worker& w, const std::vector<int>& victims) {
  if (victims.empty()) return w.comm;
  if (std::find(victims.begin(), victims.end(), w.rank) != victims.end()) await_death("doomed");
  fail_on_the_dead(w);
  const std::vector<int> lost = w.comm.lost_ranks();
  if (lost != victims) w.fail("lost_ranks", list_text(lost) + ", want " + list_text(victims));
  return w.comm.shrink(lost);
}

}  // namespace

int world_of(const Worker& w) {
  const std::string k = value_of(w, "world");
  return k.empty() ? w.n : std::stoi(k);
}

int run_shrink(Worker& w) {
  const std::vector<int> victims = int_list(value_of(w, "victims"));
  const auto start = std::chrono::steady_clock::now();
  try {
    Communicator child = shrink_after_kill(w, victims);
    const std::vector<int> survivors = without(w.n, victims);
    const int want_rank =
        static_cast<int>(std::find(survivors.begin(), survivors.end(), w.rank) - survivors.begin());
    if (child.rank() != want_rank)
      w.fail("child rank", std::to_string(child.rank()) + ", want " + std::to_string(want_rank));
    check_members(w, child, w.rank, survivors);
    child.destroy();
  } catch (const std::system_error& e) {
    return report_error(
        w, e, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return exit_ok;
}

int run_shrink_mismatch(Worker& w) {
  // Rank 3 is left out by everyone; rank 2 also leaves out rank 1, which the others keep.
  if (w.rank == 3) return exit_ok;
  std::vector<int> exclude = w.rank == 2 ? std::vector<int>{1, 3} : std::vector<int>{3};
  const auto start = std::chrono::steady_clock::now();
  try {
    Communicator child = w.comm.shrink(exclude);
    w.fail("shrink with disagreeing lists", "succeeded");
    return exit_unexpected_success;
  } catch (const std::system_error& e) {
    return report_error(
        w, e, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

int run_shrink_absent(Worker& w) {
  // Rank 2 excludes nobody but never comes: the others time out naming it.
  if (w.rank == 2) return exit_ok;
  const auto start = std::chrono::steady_clock::now();
  try {
    Communicator child = w.comm.shrink(std::vector<int>{});
    w.fail("shrink without rank 2", "succeeded");
    return exit_unexpected_success;
  } catch (const std::system_error& e) {
    return report_error(
        w, e, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

int run_shrink_excluded(Worker& w) {
  // Rank 1 names itself: refused at once, in every form. Rank 0 shrinks to a communicator of one.
  const std::vector<int> exclude{1};
  if (w.rank == 1) {
    boost::system::error_code ec;
    Communicator c = w.comm.shrink(exclude, ec);
    if (ec != errc::invalid_argument || c)
      w.fail("shrink by an excluded rank", "got '" + ec.message() + "'");
    try {
      w.comm.shrink(exclude);
      w.fail("shrink by an excluded rank", "did not throw");
    } catch (const std::system_error& e) {
      if (e.code() != errc::invalid_argument) w.fail("shrink by an excluded rank", e.what());
    }
    auto [async_ec, none] = shrink_waited(w.comm, exclude);
    if (async_ec != errc::invalid_argument || none)
      w.fail("async_shrink by an excluded rank", "got '" + async_ec.message() + "'");
    return exit_ok;
  }
  // The asynchronous form, through a future.
  auto [ec, child] = shrink_waited(w.comm, exclude);
  if (ec) w.fail("async_shrink", ec.message());
  check_members(w, child, w.rank, {0});
  child.destroy();
  return exit_ok;
}

int run_grow(Worker& w) {
  const int world = world_of(w);
  const std::vector<int> victims = int_list(value_of(w, "victims"));
  const int kept = world - static_cast<int>(victims.size());
  const int grown = kept + (w.n - world);
  std::vector<int> want = without(world, victims);
  for (int r = world; r < w.n; ++r) want.push_back(r);
  if (w.rank >= world) {
    // A newcomer: the id comes out of band, its rank follows the members'.
    Communicator big = Communicator::create(read_id(w), kept + (w.rank - world), grown);
    check_members(w, big, w.rank, want);
    big.destroy();
    return exit_ok;
  }
  Communicator cur = shrink_after_kill(w, victims);
  const UniqueId id = cur.grow_id();
  if (cur.rank() == 0)
    for (int r = world; r < w.n; ++r) write_id(w, r, id);
  Communicator big = cur.grow(id, grown);
  if (big.rank() != cur.rank())
    w.fail("rank after grow", std::to_string(big.rank()) + ", want " + std::to_string(cur.rank()));
  check_members(w, big, w.rank, want);
  big.destroy();
  if (!victims.empty()) cur.destroy();
  return exit_ok;
}

int run_ftar(Worker& w) {
  // Every step all_reduces contributions that depend on (original rank, step) and checks the sum
  // over that step's members. Rank `victim` is killed before step `kill_step`; the survivors
  // shrink and redo that step with the same contributions; at step kill_step + 3 a newcomer
  // (worker `world`) is admitted by grow; the loop ends at step kill_step + 6.
  const int world = world_of(w);
  const int victim = std::stoi(value_of(w, "victim"));
  const int kill_step = std::stoi(value_of(w, "kill_step"));
  const int grow_step = kill_step + 3, steps = kill_step + 6;
  constexpr std::size_t count = 4096;
  std::vector<std::int64_t> send(count), recv(count), ref(count);
  std::vector<int> members;
  Communicator cur;
  int step = 0;
  auto learn_members = [&] {
    std::int32_t mine = w.rank;
    std::vector<std::int32_t> all(cur.size());
    cur.all_gather(&mine, all.data(), 1, DataType::int32);
    members.assign(all.begin(), all.end());
  };
  auto reduce = [&] {
    cur.all_reduce(send.data(), recv.data(), count, DataType::int64, ReduceOp::sum);
  };
  const auto start = std::chrono::steady_clock::now();
  try {
    if (w.rank >= world) {
      cur = Communicator::create(read_id(w), world - 1, world);
      learn_members();
      step = grow_step;
    } else {
      cur = w.comm;
      for (int r = 0; r < world; ++r) members.push_back(r);
    }
    bool shrunk = false;
    for (; step < steps; ++step) {
      if (w.rank == victim && step == kill_step)
        await_death("paused at step " + std::to_string(kill_step));
      if (step == grow_step && w.rank < world) {
        const UniqueId id = cur.grow_id();
        if (cur.rank() == 0) write_id(w, world, id);
        Communicator old = cur;
        cur = cur.grow(id, world);
        old.destroy();
        learn_members();
      }
      for (std::size_t i = 0; i < count; ++i)
        send[i] = (w.rank + 1) * 1000003 + step * 1009 + static_cast<std::int64_t>(i);
      try {
        reduce();
      } catch (const std::system_error& e) {
        if (shrunk) throw;
        std::printf("rank %d: step %d failed: %s\n", w.rank, step, e.what());
        const std::vector<int> lost = cur.lost_ranks();
        if (lost != std::vector<int>{victim})
          w.fail("lost_ranks", list_text(lost) + ", want {" + std::to_string(victim) + "}");
        cur = cur.shrink(lost);
        shrunk = true;
        members.erase(std::find(members.begin(), members.end(), victim));
        reduce();
      }
      std::fill(ref.begin(), ref.end(), 0);
      for (int r : members)
        for (std::size_t i = 0; i < count; ++i)
          ref[i] += (r + 1) * 1000003 + step * 1009 + static_cast<std::int64_t>(i);
      w.expect_equal(describe("all_reduce", DataType::int64, ReduceOp::sum, count,
                              "step=" + std::to_string(step) + " members=" + list_text(members)),
                     DataType::int64, recv.data(), ref.data(), count);
    }
    if (w.rank < world && !shrunk) w.fail("ftar", "no step failed");
    std::printf("rank %d: %d steps, members at the end %s\n", w.rank, steps,
                list_text(members).c_str());
    cur.destroy();
  } catch (const std::system_error& e) {
    return report_error(
        w, e, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return exit_ok;
}

}  // namespace coccl::test
