// Scenarios of the fast path of small host operations (collectives/fast_path.hpp).
//
// "fast_path" runs with the proxy thread never asleep and no limit on the fast path's wait
// (COCCL_SPIN_US large, set by the test), so that every eligible operation
// takes it: the counters of CommStatus must count each one, and every result must match the
// reference, from a blocking caller, from a coroutine on the proxy thread, from a coroutine and
// from completion handlers on the caller's own io_context (each handler run there, never inside
// the call that started its operation), from futures, from plain callbacks, and from several
// threads with communicators of their own at once.
//
// "fast_mixed" runs the same cases on a communicator whose rank 0 alone has the fast path: what it
// sends is taken by the slow path of the others, and what they send by its fast path.
//
// "fast_interleaved" runs small operations (the fast path) between large ones (the slow path) with
// the ranks out of step by random pauses, so that a rank still on the fast path of one operation
// reads the first frames of the next, large one, from a peer that is ahead: every result must
// match the reference, and the small ones must mostly take the fast path.
//
// "fast_handover" runs with COCCL_SPIN_US=0: an operation whose peers are late is handed to
// the proxy thread at once. Operations started behind it wait for it (ordering), one cancelled
// while it waits is removed, a small operation queued behind a large one waits its turn, and an
// operation handed over between two rounds of recursive doubling completes on the proxy thread.
#include "collectives/fast_path.hpp"

#include <algorithm>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "tests/multirank/worker.hpp"

namespace coccl::test {
namespace {

namespace asio = boost::asio;

std::uint64_t next_salt() {
  static std::uint64_t salt = 1000;
  return ++salt;
}

// Counts the fast path's operations on `c` between two points.
struct FastCount {
  explicit FastCount(Communicator& c) : c_(c), first_(c.status()) {}
  std::uint64_t taken() const {
    const CommStatus now = c_.status();
    return now.fast_ops + now.fast_handed_over - first_.fast_ops - first_.fast_handed_over;
  }
  std::uint64_t handed() const { return c_.status().fast_handed_over - first_.fast_handed_over; }

 private:
  Communicator& c_;
  CommStatus first_;
};

// `salt` names the inputs; every rank must pass the same one (by default the next in this
// thread's sequence of calls, which is the same on every rank).
void all_reduce_case(Worker& w, Communicator& c, DataType t, ReduceOp op, std::size_t count,
                     bool in_place, std::uint64_t salt = next_salt()) {
  const std::size_t bytes = count * size_of(t);
  Bytes send(bytes), recv(bytes, std::byte{0xcd});
  fill_reduce(t, op, c.rank(), salt, send.data(), 0, count);
  if (in_place) {
    recv = send;
    c.all_reduce(recv.data(), recv.data(), count, t, op);
  } else {
    c.all_reduce(send.data(), recv.data(), count, t, op);
  }
  const Bytes want = reduce_reference(t, op, c.size(), salt, 0, count);
  w.expect_equal(describe("all_reduce", t, op, count, in_place ? "in_place" : "out_of_place"), t,
                 recv.data(), want.data(), count);
}

void all_gather_case(Worker& w, DataType t, std::size_t count, bool in_place) {
  const std::uint64_t salt = next_salt();
  const std::size_t bytes = count * size_of(t);
  Bytes mine(bytes), recv(bytes * w.n, std::byte{0xcd});
  fill_copy(w.rank, salt, mine.data(), 0, bytes);
  if (in_place) {
    std::memcpy(recv.data() + w.rank * bytes, mine.data(), bytes);
    w.comm.all_gather(recv.data() + w.rank * bytes, recv.data(), count, t);
  } else {
    w.comm.all_gather(mine.data(), recv.data(), count, t);
  }
  for (int r = 0; r < w.n; ++r) {
    Bytes want(bytes);
    fill_copy(r, salt, want.data(), 0, bytes);
    w.expect_equal(describe("all_gather", t, ReduceOp::sum, count, "from=" + std::to_string(r)), t,
                   recv.data() + r * bytes, want.data(), count);
  }
}

void reduce_scatter_case(Worker& w, DataType t, ReduceOp op, std::size_t count, bool in_place) {
  const std::uint64_t salt = next_salt();
  const std::size_t bytes = count * size_of(t);
  Bytes send(bytes * w.n), recv(bytes, std::byte{0xcd});
  fill_reduce(t, op, w.rank, salt, send.data(), 0, count * w.n);
  std::byte* out = in_place ? send.data() + w.rank * bytes : recv.data();
  w.comm.reduce_scatter(send.data(), out, count, t, op);
  const Bytes want = reduce_reference(t, op, w.n, salt, w.rank * count, count);
  w.expect_equal(describe("reduce_scatter", t, op, count, in_place ? "in_place" : ""), t, out,
                 want.data(), count);
}

void all_to_all_case(Worker& w, DataType t, std::size_t count) {
  const std::uint64_t salt = next_salt();
  const std::size_t bytes = count * size_of(t);
  Bytes send(bytes * w.n), recv(bytes * w.n, std::byte{0xcd});
  // Block p of rank r's input is bytes [p * bytes, (p + 1) * bytes) of its copy input.
  fill_copy(w.rank, salt, send.data(), 0, bytes * w.n);
  w.comm.all_to_all(send.data(), recv.data(), count, t);
  for (int r = 0; r < w.n; ++r) {
    Bytes want(bytes);
    fill_copy(r, salt, want.data(), w.rank * bytes, bytes);
    w.expect_equal(describe("all_to_all", t, ReduceOp::sum, count, "from=" + std::to_string(r)), t,
                   recv.data() + r * bytes, want.data(), count);
  }
}

// COCCL_FAST_MAX_BYTES as the test set it (64 KiB by default, lower over tcp), or 64 KiB where
// it turned the fast path off.
std::size_t fast_limit() {
  const auto limit = static_cast<std::size_t>(params::fast_max_bytes.get());
  return limit == 0 ? std::size_t{64} << 10 : limit;
}

// Flag "off": the test turned the fast path off (COCCL_FAST_MAX_BYTES=0), so nothing takes it.
void expect_taken(Worker& w, const std::string& what, std::uint64_t got, std::uint64_t want) {
  if (w.has("off")) want = 0;
  if (got != want)
    w.fail(what, std::to_string(got) + " operations took the fast path, expected " +
                     std::to_string(want));
}

// Every eligible size and kind on w.comm, checked against the reference; returns how many ran.
std::uint64_t eligible_cases(Worker& w) {
  std::uint64_t eligible = 0;
  const std::pair<DataType, ReduceOp> reductions[] = {{DataType::float32, ReduceOp::sum},
                                                      {DataType::int32, ReduceOp::max},
                                                      {DataType::bfloat16, ReduceOp::avg},
                                                      {DataType::float64, ReduceOp::prod},
                                                      {DataType::int8, ReduceOp::min}};
  for (auto [t, op] : reductions)
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1023}})
      for (bool in_place : {false, true}) {
        all_reduce_case(w, w.comm, t, op, n, in_place);
        ++eligible;
      }
  // Exactly COCCL_FAST_MAX_BYTES: still the fast path.
  all_reduce_case(w, w.comm, DataType::float32, ReduceOp::sum, fast_limit() / 4, false);
  ++eligible;
  for (DataType t : {DataType::uint8, DataType::float64})
    for (std::size_t n : {std::size_t{1}, std::size_t{13}, std::size_t{1023}})
      for (bool in_place : {false, true}) {
        all_gather_case(w, t, n, in_place);
        reduce_scatter_case(w, t, t == DataType::uint8 ? ReduceOp::max : ReduceOp::sum, n,
                            in_place);
        eligible += 2;
      }
  for (std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{999}}) {
    all_to_all_case(w, DataType::int32, n);
    ++eligible;
  }
  return eligible;
}

// Blocking callers: every eligible size and kind, checked; one operation above
// COCCL_FAST_MAX_BYTES does not count.
void blocking_calls(Worker& w) {
  FastCount count(w.comm);
  const std::uint64_t eligible = eligible_cases(w);
  expect_taken(w, "blocking operations", count.taken(), eligible);
  if (count.handed() != 0)
    w.fail("blocking operations",
           std::to_string(count.handed()) + " handed over with no limit on the fast path's wait");
  // One byte more than the limit: the slow path.
  FastCount big(w.comm);
  all_reduce_case(w, w.comm, DataType::uint8, ReduceOp::sum, fast_limit() + 1, false);
  expect_taken(w, "all_reduce above COCCL_FAST_MAX_BYTES", big.taken(), 0);
}

asio::awaitable<void> awaited_all_reduces(Worker& w, int k) {
  for (int i = 0; i < k; ++i) {
    std::int64_t mine[5], sum[5];
    for (int j = 0; j < 5; ++j) mine[j] = (w.rank + 1) * (i + j + 1);
    co_await w.comm.async_all_reduce(mine, sum, 5, DataType::int64, ReduceOp::sum,
                                     asio::use_awaitable);
    for (int j = 0; j < 5; ++j) {
      const std::int64_t want = static_cast<std::int64_t>(w.n) * (w.n + 1) / 2 * (i + j + 1);
      if (sum[j] != want)
        w.fail("awaited all_reduce " + std::to_string(i),
               "element " + std::to_string(j) + ": " + std::to_string(sum[j]));
    }
  }
}

// A coroutine on the communicator's executor holds the proxy thread's role itself.
void awaited_calls(Worker& w) {
  FastCount count(w.comm);
  const int k = 50;
  asio::co_spawn(w.comm.executor(), awaited_all_reduces(w, k), asio::use_future).get();
  expect_taken(w, "awaited operations", count.taken(), k);
}

// Operations started on this thread and not yet returned from: a completion handler that runs
// while one is under way runs inside the call that started an operation.
thread_local int starting = 0;

// A chain of all_reduces, each started by the completion handler of the one before. `loop` is
// the thread the handlers must run on (none: any but one inside a starting call). Failures are
// kept here and counted by the caller's thread afterwards (plain callbacks run on the proxy
// thread).
struct Chain {
  Worker& w;
  const char* what;
  int left;
  std::thread::id loop;
  std::int64_t mine = 0, sum = 0;
  std::vector<std::string> failures;
  std::promise<void> finished;
};

// Starts the chain's next operation with a handler that `bind` wraps (binds to an executor, or
// leaves as it is).
template <typename Bind>
void chain_step(Chain& c, Bind bind) {
  const int i = c.left;
  c.mine = (c.w.rank + 1) * std::int64_t{i};
  ++starting;
  c.w.comm.async_all_reduce(
      &c.mine, &c.sum, 1, DataType::int64, ReduceOp::sum,
      bind([&c, bind, i](boost::system::error_code ec) {
        if (starting != 0) c.failures.push_back("completed inside the call that started it");
        if (c.loop != std::thread::id() && std::this_thread::get_id() != c.loop)
          c.failures.push_back("completed on another thread than its loop");
        const std::int64_t want = static_cast<std::int64_t>(c.w.n) * (c.w.n + 1) / 2 * i;
        if (ec || c.sum != want)
          c.failures.push_back("operation " + std::to_string(i) + ": " + ec.message() + ", " +
                               std::to_string(c.sum));
        if (--c.left > 0)
          chain_step(c, bind);
        else
          c.finished.set_value();
      }));
  --starting;
}

void expect_chain(Worker& w, Chain& c) {
  for (const std::string& f : c.failures) w.fail(c.what, f);
}

// A program with its own event loop: a coroutine on an io_context of this thread, and completion
// handlers bound to it, borrow the proxy thread's role; each completion is posted to the loop.
// Plain callbacks (no executor of their own) complete from the proxy thread.
void own_loop_calls(Worker& w) {
  const int k = 50;
  {
    FastCount count(w.comm);
    asio::io_context io;
    auto done = asio::co_spawn(io, awaited_all_reduces(w, k), asio::use_future);
    io.run();
    done.get();
    expect_taken(w, "operations awaited on the caller's loop", count.taken(), k);
  }
  {
    FastCount count(w.comm);
    asio::io_context io;
    Chain c{w, "handlers bound to the caller's loop", k, std::this_thread::get_id(), 0, 0, {}, {}};
    chain_step(c,
               [ex = io.get_executor()](auto h) { return asio::bind_executor(ex, std::move(h)); });
    io.run();
    expect_chain(w, c);
    if (c.left != 0)
      w.fail(c.what, std::to_string(c.left) + " not completed when the loop ran out");
    expect_taken(w, c.what, count.taken(), k);
  }
  {
    // Futures: the promise is set from the proxy thread.
    FastCount count(w.comm);
    for (int i = 1; i <= k; ++i) {
      std::int64_t mine = (w.rank + 1) * std::int64_t{i}, sum = 0;
      w.comm.async_all_reduce(&mine, &sum, 1, DataType::int64, ReduceOp::sum, asio::use_future)
          .get();
      const std::int64_t want = static_cast<std::int64_t>(w.n) * (w.n + 1) / 2 * i;
      if (sum != want) w.fail("use_future all_reduce " + std::to_string(i), std::to_string(sum));
    }
    expect_taken(w, "operations awaited through futures", count.taken(), k);
  }
  {
    FastCount count(w.comm);
    Chain c{w, "plain callbacks", k, std::thread::id(), 0, 0, {}, {}};
    auto finished = c.finished.get_future();
    chain_step(c, [](auto h) { return h; });
    finished.get();
    expect_chain(w, c);
    expect_taken(w, c.what, count.taken(), k);
  }
}

// Three threads, each with a communicator of its own over the same ranks, all on the one proxy
// thread, calling at once: they borrow its role in turn.
void threads_and_communicators(Worker& w) {
  std::vector<Communicator> comms;
  comms.push_back(w.comm);
  comms.push_back(w.comm.split(0, w.rank));
  comms.push_back(w.comm.split(0, w.rank));
  // A new communicator's first operation makes its links: the slow path.
  for (std::size_t i = 1; i < comms.size(); ++i)
    all_reduce_case(w, comms[i], DataType::int32, ReduceOp::sum, 1, false);
  std::vector<FastCount> counts;
  for (Communicator& c : comms) counts.emplace_back(c);
  const int k = 40;
  std::mutex m;
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < comms.size(); ++i)
    threads.emplace_back([&, i] {
      for (int j = 0; j < k; ++j) {
        Worker local;
        local.scenario = w.scenario;
        local.rank = w.rank;
        local.n = w.n;
        all_reduce_case(local, comms[i], DataType::int32, ReduceOp::sum, 1 + 3 * i + j, j % 2,
                        100000 + 1000 * i + static_cast<std::uint64_t>(j));
        std::lock_guard lock(m);
        w.failures += local.failures;
      }
    });
  for (auto& t : threads) t.join();
  std::uint64_t taken = 0;
  for (const FastCount& c : counts) taken += c.taken();
  expect_taken(w, "operations of three threads", taken, comms.size() * k);
  comms[1].destroy();
  comms[2].destroy();
}

}  // namespace

int run_fast_path(Worker& w) {
  blocking_calls(w);
  awaited_calls(w);
  own_loop_calls(w);
  threads_and_communicators(w);
  return exit_ok;
}

// Rank 0 on the fast path, the others on the slow path (their communicator made with
// COCCL_FAST_MAX_BYTES=0): the two paths must send and take the same chunks.
int run_fast_mixed(Worker& w) {
  if (w.rank != 0) params::fast_max_bytes.set_override("0");
  Communicator mixed = w.comm.split(0, w.rank);
  params::fast_max_bytes.set_override(std::nullopt);
  // The first operations make the links: the slow path. An all_gather links every pair; a small
  // all_reduce between ranks acting as hosts only its recursive doubling partners.
  all_reduce_case(w, mixed, DataType::int32, ReduceOp::sum, 1, false);
  const Communicator parent = w.comm;
  w.comm = mixed;
  all_gather_case(w, DataType::uint8, 1, false);
  FastCount count(mixed);
  const std::uint64_t eligible = eligible_cases(w);
  expect_taken(w, "operations with the other ranks on the slow path", count.taken(),
               w.rank == 0 ? eligible : 0);
  if (count.handed() != 0)
    w.fail("operations with the other ranks on the slow path",
           std::to_string(count.handed()) + " handed over with no limit on the fast path's wait");
  w.comm = parent;
  mixed.destroy();
  return exit_ok;
}

int run_fast_interleaved(Worker& w) {
  // The same pauses on every run of a rank, different between ranks.
  std::uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(w.rank + 1);
  const auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const std::size_t counts[] = {2, 1000, 300000, 3, 40000, 1, 3000};
  FastCount count(w.comm);
  std::uint64_t small = 0;
  for (int i = 0; i < 140; ++i) {
    const std::size_t n = counts[static_cast<std::size_t>(i) % std::size(counts)];
    const bool reduce = i % 2 == 0;
    if ((reduce ? n * sizeof(float) : n) <= fast_limit()) ++small;
    if (next() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(next() % 300));
    if (reduce)
      all_reduce_case(w, w.comm, DataType::float32, ReduceOp::sum, n, i % 4 == 0);
    else
      all_gather_case(w, DataType::uint8, n, false);
  }
  // Pauses hand some over; most take it (none would if the fast path could not read the links).
  if (count.taken() * 2 < small)
    w.fail("small operations between large ones",
           std::to_string(count.taken()) + " of " + std::to_string(small) + " took the fast path");
  return exit_ok;
}

int run_fast_handover(Worker& w) {
  const std::int64_t want = static_cast<std::int64_t>(w.n) * (w.n + 1) / 2;
  std::int64_t one = w.rank + 1;
  // 1. Rank 0 starts A from a coroutine on the proxy thread while the others are still asleep:
  //    A is handed over at once. B and C, started behind it, are queued; B is cancelled there.
  if (w.rank == 0) {
    std::mutex m;
    std::vector<std::string> order;
    std::error_code a_ec = make_error_code(errc::internal), b_ec, c_ec = a_ec;
    std::int64_t a = 0, b_in = 5, b_out = 0, c = 0;
    std::promise<void> done;
    int left = 3;
    auto record = [&](const char* name, std::error_code* slot) {
      return [&, name, slot](boost::system::error_code ec) {
        std::lock_guard lock(m);
        *slot = ec;
        order.push_back(name);
        if (--left == 0) done.set_value();
      };
    };
    asio::cancellation_signal sig;
    FastCount count(w.comm);
    asio::post(w.comm.executor(), [&] {
      w.comm.async_all_reduce(&one, &a, 1, DataType::int64, ReduceOp::sum, record("A", &a_ec));
      w.comm.async_all_reduce(&b_in, &b_out, 1, DataType::int64, ReduceOp::sum,
                              asio::bind_cancellation_slot(sig.slot(), record("B", &b_ec)));
      sig.emit(asio::cancellation_type::partial);
      w.comm.async_all_reduce(&one, &c, 1, DataType::int64, ReduceOp::sum, record("C", &c_ec));
    });
    done.get_future().wait();
    if (a_ec || a != want) w.fail("A (handed over)", a_ec.message() + ", " + std::to_string(a));
    if (c_ec || c != want) w.fail("C (behind A)", c_ec.message() + ", " + std::to_string(c));
    if (b_ec != std::errc::operation_canceled || b_out != 0)
      w.fail("B (cancelled behind A)", b_ec.message() + ", " + std::to_string(b_out));
    const auto at = [&](const char* name) {
      return std::find(order.begin(), order.end(), name) - order.begin();
    };
    if (at("A") > at("C")) w.fail("completion order", "C completed before A");
    expect_taken(w, "A, B and C", count.taken(), 1);
    if (count.handed() != 1)
      w.fail("A", std::to_string(count.handed()) + " operations handed over, expected 1");
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::int64_t a = 0, c = 0;
    w.comm.all_reduce(&one, &a, 1, DataType::int64, ReduceOp::sum);
    w.comm.all_reduce(&one, &c, 1, DataType::int64, ReduceOp::sum);
    if (a != want || c != want) w.fail("A and C", std::to_string(a) + ", " + std::to_string(c));
  }

  // 2. A small operation started behind a large one (above COCCL_FAST_MAX_BYTES) on the proxy
  //    thread waits for it: it is queued, and completes after it.
  const std::size_t large = 1 << 18;
  std::vector<float> big(large, static_cast<float>(w.rank + 1)), big_sum(large);
  std::int64_t small = 0;
  std::mutex m;
  std::vector<int> order;
  std::promise<void> done;
  int left = 2;
  auto record = [&](int which) {
    return [&, which](boost::system::error_code ec) {
      if (ec) w.fail("large then small", ec.message());
      std::lock_guard lock(m);
      order.push_back(which);
      if (--left == 0) done.set_value();
    };
  };
  FastCount count(w.comm);
  asio::post(w.comm.executor(), [&] {
    w.comm.async_all_reduce(big.data(), big_sum.data(), large, DataType::float32, ReduceOp::sum,
                            record(0));
    w.comm.async_all_reduce(&one, &small, 1, DataType::int64, ReduceOp::sum, record(1));
  });
  done.get_future().wait();
  if (order != std::vector<int>{0, 1}) w.fail("large then small", "completed out of order");
  if (small != want) w.fail("small behind large", std::to_string(small));
  if (big_sum[0] != static_cast<float>(want) || big_sum[large - 1] != static_cast<float>(want))
    w.fail("large", std::to_string(big_sum[0]));
  expect_taken(w, "small behind large", count.taken(), 0);

  // 3. And the communicator is still in step: a blocking operation afterwards.
  std::int64_t after = 0;
  w.comm.all_reduce(&one, &after, 1, DataType::int64, ReduceOp::sum);
  if (after != want) w.fail("after", std::to_string(after));

  // 4. Rank 1 starts first, rank 0 next, the others late. Rank 1 is handed over at once. Rank 0
  //    finds rank 1's chunk waiting: with recursive doubling (4 ranks as hosts) its first round
  //    completes and the operation is handed over in its second, whose partner is late; with one
  //    round it is handed over waiting for the late ones.
  if (w.rank != 1) std::this_thread::sleep_for(std::chrono::milliseconds(w.rank == 0 ? 100 : 400));
  //    Started on the proxy thread, as A above: with COCCL_SPIN_US=0 the proxy thread naps at
  //    once, and a blocking caller would find its role taken and queue the operation.
  FastCount late(w.comm);
  std::int64_t rounds = 0;
  std::promise<boost::system::error_code> rounds_done;
  asio::post(w.comm.executor(), [&] {
    w.comm.async_all_reduce(&one, &rounds, 1, DataType::int64, ReduceOp::sum,
                            [&](boost::system::error_code ec) { rounds_done.set_value(ec); });
  });
  const boost::system::error_code rounds_ec = rounds_done.get_future().get();
  if (rounds_ec || rounds != want)
    w.fail("handed over between rounds", rounds_ec.message() + ", " + std::to_string(rounds));
  if (w.rank <= 1 && !w.has("off") && late.handed() != 1)
    w.fail("handed over between rounds",
           std::to_string(late.handed()) + " operations handed over, expected 1");
  return exit_ok;
}

}  // namespace coccl::test
