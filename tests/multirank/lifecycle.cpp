// Scenarios beyond plain correctness: failures (loop, mismatch, abort), split and the
// asynchronous interface.
#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tests/multirank/worker.hpp"

namespace coccl::test {
namespace {

namespace asio = boost::asio;
using Seconds = std::chrono::duration<double>;

double since(std::chrono::steady_clock::time_point t) {
  return Seconds(std::chrono::steady_clock::now() - t).count();
}

// One all_reduce of 1 MiB, in float32 sum, checked (inputs by rank in `comm`).
void all_reduce_mib(Worker& w, Communicator& comm, std::uint64_t salt) {
  constexpr std::size_t count = (1 << 20) / 4;
  Bytes send(count * 4), recv(count * 4);
  fill_reduce(DataType::float32, ReduceOp::sum, comm.rank(), salt, send.data(), 0, count);
  comm.all_reduce(send.data(), recv.data(), count, DataType::float32, ReduceOp::sum);
  const Bytes want =
      reduce_reference(DataType::float32, ReduceOp::sum, comm.size(), salt, 0, count);
  w.expect_equal(describe("all_reduce", DataType::float32, ReduceOp::sum, count), DataType::float32,
                 recv.data(), want.data(), count);
}

}  // namespace

int run_loop(Worker& w) {
  // Loops until a fault (made by the test) stops the communicator. Only the first iteration is
  // checked against the reference; the rest must be fast so faults land mid-collective.
  constexpr std::size_t count = (1 << 20) / 4;
  const auto start = std::chrono::steady_clock::now();
  try {
    all_reduce_mib(w, w.comm, 7);
    std::printf("looping\n");
    std::fflush(stdout);
    Bytes send(count * 4, std::byte{0}), recv(count * 4);
    if (w.has("zcopy")) {
      // all_to_all between registered buffers: over ib, zero-copy blocks are in flight when the
      // fault lands.
      BufferRegistration rs = w.comm.register_buffer(send.data(), send.size());
      BufferRegistration rr = w.comm.register_buffer(recv.data(), recv.size());
      const std::size_t each = count / static_cast<std::size_t>(w.n);
      for (int i = 0; i < 200000 && since(start) < 120; ++i)
        w.comm.all_to_all(send.data(), recv.data(), each, DataType::float32);
    }
    for (int i = 0; i < 200000 && since(start) < 120; ++i)
      w.comm.all_reduce(send.data(), recv.data(), count, DataType::float32, ReduceOp::sum);
  } catch (const std::system_error& e) {
    return report_error(w, e, since(start));
  }
  std::printf("loop finished without an error\n");
  return exit_unexpected_success;
}

int run_chaos(Worker& w) {
  // Mixed small collectives, every result checked, until a fault made by the test stops the
  // communicator (a rank killed or stopped at a random moment). A wrong result is reported at
  // once: the point is that a fault never turns into silent corruption.
  const auto start = std::chrono::steady_clock::now();
  const std::int32_t n = w.n, me = w.rank;
  std::printf("formed\n");
  std::fflush(stdout);
  try {
    for (std::int32_t i = 0; since(start) < 20; ++i) {
      const std::size_t c = 1 + static_cast<std::size_t>((i * 37) % 3000);
      std::vector<std::int32_t> send(c), recv(c * n), want(c * n);
      switch (i % 4) {
        case 0:
          for (std::size_t j = 0; j < c; ++j)
            send[j] = me * 1000 + static_cast<std::int32_t>(j) + i;
          w.comm.all_reduce(send.data(), recv.data(), c, DataType::int32, ReduceOp::sum);
          for (std::size_t j = 0; j < c; ++j)
            want[j] = 1000 * n * (n - 1) / 2 + n * (static_cast<std::int32_t>(j) + i);
          recv.resize(c);
          want.resize(c);
          break;
        case 1:
          for (std::size_t j = 0; j < c; ++j) send[j] = me + static_cast<std::int32_t>(j) * 7 + i;
          w.comm.all_gather(send.data(), recv.data(), c, DataType::int32);
          for (std::int32_t r = 0; r < n; ++r)
            for (std::size_t j = 0; j < c; ++j)
              want[r * c + j] = r + static_cast<std::int32_t>(j) * 7 + i;
          break;
        case 2: {
          const std::int32_t root = i % n;
          recv.resize(c);
          want.resize(c);
          for (std::size_t j = 0; j < c; ++j) {
            want[j] = root * 31 + static_cast<std::int32_t>(j) - i;
            recv[j] = me == root ? want[j] : -1;
          }
          w.comm.broadcast(recv.data(), recv.data(), c, DataType::int32, root);
          break;
        }
        default: {
          const int to = (me + 1) % n, from = (me + n - 1) % n;
          for (std::size_t j = 0; j < c; ++j)
            send[j] = me * 100000 + static_cast<std::int32_t>(j) + i;
          recv.resize(c);
          want.resize(c);
          for (std::size_t j = 0; j < c; ++j)
            want[j] = from * 100000 + static_cast<std::int32_t>(j) + i;
          std::vector<Transfer> ops{Communicator::send_op(send.data(), c, DataType::int32, to),
                                    Communicator::recv_op(recv.data(), c, DataType::int32, from)};
          w.comm.send_recv(std::move(ops));
          break;
        }
      }
      if (recv != want) {
        std::printf("WRONG RESULT rank=%d iteration=%d op=%d count=%zu\n", me, i, i % 4, c);
        std::fflush(stdout);
        return exit_check_failed;
      }
    }
  } catch (const std::system_error& e) {
    return report_error(w, e, since(start));
  }
  std::printf("chaos loop finished without an error\n");
  return exit_unexpected_success;
}

int run_mismatch(Worker& w) {
  // Rank 0 calls all_reduce while every other rank calls broadcast, with the same count.
  constexpr std::size_t count = 1024;
  std::vector<float> send(count, 1.0f), recv(count);
  const auto start = std::chrono::steady_clock::now();
  try {
    if (w.has("blocks")) {
      // all_to_all against all_gather with transfers of the same size, large enough to be ib
      // blocks: the sender sees the receiver's offer belong to another operation.
      const std::size_t each = 50000;
      std::vector<float> big_send(each * w.n, 1.0f), big_recv(each * w.n);
      if (w.rank == 0)
        w.comm.all_to_all(big_send.data(), big_recv.data(), each, DataType::float32);
      else
        w.comm.all_gather(big_send.data(), big_recv.data(), each, DataType::float32);
    } else if (w.rank == 0) {
      w.comm.all_reduce(send.data(), recv.data(), count, DataType::float32, ReduceOp::sum);
    } else {
      w.comm.broadcast(nullptr, recv.data(), count, DataType::float32, 0);
    }
    // The collective may complete on some ranks before the mismatch is seen elsewhere; the next
    // operation must then fail.
    w.comm.barrier();
  } catch (const std::system_error& e) {
    return report_error(w, e, since(start));
  }
  std::printf("mismatched collectives completed without an error\n");
  return exit_unexpected_success;
}

namespace {

// The mismatched operation of run_op_mismatch named by the worker's flag.
void mismatched_op(Worker& w) {
  const int r = w.rank, n = w.n;
  if (w.has("send2recv1") || w.has("type")) {
    // Ranks 0 and 1: rank 0 sends two float32, rank 1 receives one float32 ("send2recv1") or two
    // int32 ("type").
    std::vector<float> data{1.5f, 2.5f};
    std::vector<std::int32_t> got(2, 0);
    if (r == 0) w.comm.send(data.data(), 2, DataType::float32, 1);
    if (r == 1 && w.has("type")) w.comm.recv(got.data(), 2, DataType::int32, 0);
    if (r == 1 && w.has("send2recv1")) w.comm.recv(got.data(), 1, DataType::float32, 0);
  } else if (w.has("a2av")) {
    // One element between every pair, except that rank 0 sends 3 to rank 2, which expects none
    // from rank 0 (two ranks that are not neighbours when n >= 4).
    std::vector<std::size_t> sc(n, 1), rc(n, 1), sd(n), rd(n);
    if (r == 0) sc[2] = 3;
    if (r == 2) rc[0] = 0;
    for (int p = 1; p < n; ++p) {
      sd[p] = sd[p - 1] + sc[p - 1];
      rd[p] = rd[p - 1] + rc[p - 1];
    }
    std::vector<float> send(sd[n - 1] + sc[n - 1], 1.0f), recv(rd[n - 1] + rc[n - 1]);
    w.comm.all_to_allv(send.data(), sc, sd, recv.data(), rc, rd, DataType::float32);
  } else if (w.has("count")) {
    // A small all_reduce that every rank agrees on (it opens the links, so that the next
    // operation may take the fast path), then one that rank 0 alone calls with a count of 2.
    std::vector<float> in(3, 1.0f), out(3);
    w.comm.all_reduce(in.data(), out.data(), 3, DataType::float32, ReduceOp::sum);
    w.comm.all_reduce(in.data(), out.data(), r == 0 ? 2 : 3, DataType::float32, ReduceOp::sum);
  } else if (w.has("root")) {
    // The last rank takes itself for the root; the others take rank 0.
    const int root = r == n - 1 ? n - 1 : 0;
    std::vector<float> buf(4, static_cast<float>(r));
    w.comm.broadcast(buf.data(), buf.data(), buf.size(), DataType::float32, root);
  }
}

}  // namespace

int run_op_mismatch(Worker& w) {
  // Runs a mismatched operation (flag: send2recv1, type, a2av, count or root), then an all_reduce
  // on the same communicator, which must be correct or fail: it never returns wrong data.
  const auto start = std::chrono::steady_clock::now();
  int code = exit_unexpected_success;
  try {
    mismatched_op(w);
    std::printf("OP_RESULT ok\n");
  } catch (const std::system_error& e) {
    std::printf("OP_RESULT error\n");
    code = report_error(w, e, since(start));
  }
  std::vector<std::int32_t> send{w.rank + 1, 7}, recv(2, -1);
  try {
    w.comm.all_reduce(send.data(), recv.data(), 2, DataType::int32, ReduceOp::sum);
    const std::vector<std::int32_t> want{w.n * (w.n + 1) / 2, 7 * w.n};
    if (!w.expect_equal("coll=all_reduce (after the mismatch)", DataType::int32, recv.data(),
                        want.data(), 2))
      return exit_check_failed;
    std::printf("NEXT_RESULT ok\n");
  } catch (const std::system_error& e) {
    std::printf("NEXT_RESULT error\n");
    const int next = report_error(w, e, since(start));
    if (code == exit_unexpected_success) code = next;
  }
  std::fflush(stdout);
  return code;
}

int run_abort(Worker& w) {
  // Rank 1 aborts while the others wait inside an all_reduce it never joins.
  constexpr std::size_t count = (1 << 20) / 4;
  const auto start = std::chrono::steady_clock::now();
  w.comm.barrier();
  if (w.rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Communicator other_handle = w.comm;
    std::printf("aborting\n");
    std::fflush(stdout);
    w.comm.abort();
    std::printf("aborted after %.3f s\n", since(start));
    boost::system::error_code ec;
    std::int32_t one = 1, sum = 0;
    other_handle.all_reduce(&one, &sum, 1, DataType::int32, ReduceOp::sum, ec);
    if (ec != make_error_code(errc::aborted))
      w.fail("coll=all_reduce after abort", "want errc::aborted, got '" + ec.message() + "'");
    std::fflush(stdout);
    return w.failures ? exit_check_failed : exit_ok;
  }
  Bytes send(count * 4, std::byte{0}), recv(count * 4);
  try {
    w.comm.all_reduce(send.data(), recv.data(), count, DataType::float32, ReduceOp::sum);
  } catch (const std::system_error& e) {
    return report_error(w, e, since(start));
  }
  std::printf("all_reduce completed although rank 1 aborted\n");
  return exit_unexpected_success;
}

int run_split(Worker& w) {
  const int n = w.n, me = w.rank;
  {  // color = rank % 2, key = -rank: each half, ordered by descending old rank.
    Communicator sub = w.comm.split(me % 2, -me);
    std::vector<std::int32_t> members;
    for (int r = n - 1; r >= 0; --r)
      if (r % 2 == me % 2) members.push_back(r);
    const int want_rank =
        static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
    if (!sub) {
      w.fail("split color=rank%2", "got an empty handle");
      return exit_check_failed;
    }
    if (sub.size() != static_cast<int>(members.size()) || sub.rank() != want_rank)
      w.fail("split color=rank%2",
             "got rank " + std::to_string(sub.rank()) + " of " + std::to_string(sub.size()) +
                 ", want " + std::to_string(want_rank) + " of " + std::to_string(members.size()));
    // The first operation links every peer (see the warm-up in worker.cpp).
    all_reduce_mib(w, sub, 11 + me % 2);
    std::vector<std::int32_t> gathered(sub.size());
    const std::int32_t old = me;
    sub.all_gather(&old, gathered.data(), 1, DataType::int32);
    if (gathered.size() == members.size())
      w.expect_equal("coll=all_gather in split comm: old ranks by new rank", DataType::int32,
                     gathered.data(), members.data(), members.size());
    std::int64_t one = me + 1, sum = 0, want = 0;
    for (int r : members) want += r + 1;
    sub.all_reduce(&one, &sum, 1, DataType::int64, ReduceOp::sum);
    if (sum != want)
      w.fail("coll=all_reduce in split comm",
             "got " + std::to_string(sum) + ", want " + std::to_string(want));
    sub.destroy();
  }
  {  // The last rank passes color -1 and gets an empty handle; the rest keep their order.
    const bool out = me == n - 1;
    Communicator sub = w.comm.split(out ? -1 : 0, me);
    if (out) {
      if (sub) w.fail("split color=-1", "got a communicator, want an empty handle");
    } else if (!sub) {
      w.fail("split color=0", "got an empty handle");
    } else {
      if (sub.size() != n - 1 || sub.rank() != me)
        w.fail("split color=0",
               "got rank " + std::to_string(sub.rank()) + " of " + std::to_string(sub.size()));
      all_reduce_mib(w, sub, 13);
      sub.destroy();
    }
  }
  w.comm.barrier();
  return w.failures ? exit_check_failed : exit_ok;
}

int run_split_members(Worker& w) {
  const int n = w.n, me = w.rank;
  // Invalid lists: refused on every rank before anything is sent.
  auto refused = [&](const std::vector<int>& list, const char* what) {
    try {
      w.comm.split_members(list);
      w.fail(std::string("split_members ") + what, "accepted");
    } catch (const std::system_error& e) {
      if (e.code() != make_error_code(errc::invalid_argument))
        w.fail(std::string("split_members ") + what, e.what());
    }
  };
  refused({}, "empty list");
  refused({me, n}, "rank out of range");
  refused({me, me}, "rank listed twice");
  refused({(me + 1) % n}, "list without this rank");
  // Odd ranks, last first (a single rank with 3 ranks); then the last rank and rank 0. Only the
  // members call; the parent stays usable by everyone afterwards.
  std::vector<std::vector<int>> groups(2);
  for (int r = n - 1; r >= 0; --r)
    if (r % 2 == 1) groups[0].push_back(r);
  groups[1] = {n - 1, 0};
  for (const auto& members : groups) {
    const auto at = std::find(members.begin(), members.end(), me);
    if (at == members.end()) continue;
    const std::string what = "split_members of " + std::to_string(members.size());
    Communicator sub = w.comm.split_members(members);
    if (!sub || sub.size() != static_cast<int>(members.size()) ||
        sub.rank() != static_cast<int>(at - members.begin())) {
      w.fail(what, "got rank " + std::to_string(sub ? sub.rank() : -1) + " of " +
                       std::to_string(sub ? sub.size() : 0));
      continue;
    }
    std::vector<std::int32_t> gathered(sub.size()), want(members.begin(), members.end());
    const std::int32_t old = me;
    sub.all_gather(&old, gathered.data(), 1, DataType::int32);
    w.expect_equal("coll=all_gather in " + what + ": old ranks by new rank", DataType::int32,
                   gathered.data(), want.data(), want.size());
    std::int64_t one = me + 1, sum = 0, total = 0;
    for (int r : members) total += r + 1;
    sub.all_reduce(&one, &sum, 1, DataType::int64, ReduceOp::sum);
    if (sum != total)
      w.fail("coll=all_reduce in " + what,
             "got " + std::to_string(sum) + ", want " + std::to_string(total));
    sub.destroy();
  }
  std::int64_t one = 1, count = 0;
  w.comm.all_reduce(&one, &count, 1, DataType::int64, ReduceOp::sum);
  if (count != n) w.fail("coll=all_reduce on the parent after split_members", "wrong sum");
  return w.failures ? exit_check_failed : exit_ok;
}

namespace {

void check_ec(Worker& w, const char* what, std::error_code ec) {
  if (ec) w.fail(std::string("async ") + what, ec.message() + "; " + w.comm.last_error());
}

// Several collectives back to back, each awaited.
asio::awaitable<void> async_round(Worker* w, std::uint64_t salt) {
  Communicator comm = w->comm;
  const int n = w->n, me = w->rank;
  {
    const std::size_t count = 1023;
    Bytes send(count * 4), recv(count * 4);
    fill_reduce(DataType::float32, ReduceOp::sum, me, salt, send.data(), 0, count);
    auto [ec] = co_await comm.async_all_reduce(send.data(), recv.data(), count, DataType::float32,
                                               ReduceOp::sum, asio::as_tuple(asio::use_awaitable));
    check_ec(*w, "all_reduce", ec);
    const Bytes want = reduce_reference(DataType::float32, ReduceOp::sum, n, salt, 0, count);
    w->expect_equal(describe("async_all_reduce", DataType::float32, ReduceOp::sum, count),
                    DataType::float32, recv.data(), want.data(), count);
  }
  {
    const std::size_t count = 100003;
    Bytes buf(count * 4);
    fill_reduce(DataType::int32, ReduceOp::max, me, salt + 1, buf.data(), 0, count);
    auto [ec] = co_await comm.async_all_reduce(buf.data(), buf.data(), count, DataType::int32,
                                               ReduceOp::max, asio::as_tuple(asio::use_awaitable));
    check_ec(*w, "all_reduce in place", ec);
    const Bytes want = reduce_reference(DataType::int32, ReduceOp::max, n, salt + 1, 0, count);
    w->expect_equal(describe("async_all_reduce", DataType::int32, ReduceOp::max, count, "in_place"),
                    DataType::int32, buf.data(), want.data(), count);
  }
  {
    const std::size_t count = 4097;
    Bytes data(count), recv(count);
    fill_copy(n - 1, salt, data.data(), 0, count);
    auto [ec] = co_await comm.async_broadcast(data.data(), recv.data(), count, DataType::uint8,
                                              n - 1, asio::as_tuple(asio::use_awaitable));
    check_ec(*w, "broadcast", ec);
    w->expect_equal(describe("async_broadcast", DataType::uint8, ReduceOp::sum, count),
                    DataType::uint8, recv.data(), data.data(), count);
  }
  {
    const std::size_t count = 1023;
    Bytes send(count * n * 2), recv(count * 2);
    fill_reduce(DataType::float16, ReduceOp::avg, me, salt, send.data(), 0, count * n);
    auto [ec] =
        co_await comm.async_reduce_scatter(send.data(), recv.data(), count, DataType::float16,
                                           ReduceOp::avg, asio::as_tuple(asio::use_awaitable));
    check_ec(*w, "reduce_scatter", ec);
    const Bytes want =
        reduce_reference(DataType::float16, ReduceOp::avg, n, salt, me * count, count);
    w->expect_equal(describe("async_reduce_scatter", DataType::float16, ReduceOp::avg, count),
                    DataType::float16, recv.data(), want.data(), count);
  }
  {
    std::vector<std::int32_t> all(n);
    const std::int32_t mine = me * 10;
    auto [ec] = co_await comm.async_all_gather(&mine, all.data(), 1, DataType::int32,
                                               asio::as_tuple(asio::use_awaitable));
    check_ec(*w, "all_gather", ec);
    for (int r = 0; r < n; ++r)
      if (all[r] != r * 10) w->fail("async_all_gather", "rank " + std::to_string(r) + " wrong");
  }
  {
    const std::size_t count = 513;
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    Bytes out(count * 8), in(count * 8);
    fill_copy(me, salt, out.data(), 0, out.size());
    // Built outside the co_await: GCC 12 rejects an initializer list inside it.
    std::vector<Transfer> ops;
    ops.push_back(Communicator::send_op(out.data(), count, DataType::float64, next));
    ops.push_back(Communicator::recv_op(in.data(), count, DataType::float64, prev));
    auto [ec] = co_await comm.async_send_recv(std::move(ops), asio::as_tuple(asio::use_awaitable));
    check_ec(*w, "send_recv", ec);
    Bytes want(count * 8);
    fill_copy(prev, salt, want.data(), 0, want.size());
    w->expect_equal(describe("async_send_recv", DataType::float64, ReduceOp::sum, count, "ring"),
                    DataType::float64, in.data(), want.data(), count);
  }
  auto [ec] = co_await comm.async_barrier(asio::as_tuple(asio::use_awaitable));
  check_ec(*w, "barrier", ec);
}

}  // namespace

int run_async(Worker& w) {
  {  // A coroutine on this thread's io_context.
    asio::io_context io;
    auto done = asio::co_spawn(io, async_round(&w, 100), asio::use_future);
    io.run();
    done.get();
  }
  {  // The same on the communicator's proxy thread.
    auto done = asio::co_spawn(w.comm.executor(), async_round(&w, 200), asio::use_future);
    done.get();
  }
  {  // Operations started back to back without waiting run in the order they were started.
    constexpr int ops = 4;
    constexpr std::size_t count = 4099;
    std::vector<Bytes> send(ops, Bytes(count * 8)), recv(ops, Bytes(count * 8));
    std::vector<std::error_code> ecs(ops);
    int completed = 0;
    asio::io_context io;
    for (int i = 0; i < ops; ++i) {
      fill_reduce(DataType::int64, ReduceOp::sum, w.rank, 300 + i, send[i].data(), 0, count);
      w.comm.async_all_reduce(send[i].data(), recv[i].data(), count, DataType::int64, ReduceOp::sum,
                              asio::bind_executor(io, [&ecs, &completed, i](std::error_code ec) {
                                ecs[i] = ec;
                                ++completed;
                              }));
    }
    // The completion handlers run on io through their associated executor, and every
    // operation holds work there until its handler has run: run() returns after the last.
    io.run();
    if (completed != ops)
      w.fail("async_all_reduce (back to back)", "io.run() returned after " +
                                                    std::to_string(completed) + " of " +
                                                    std::to_string(ops) + " handlers");
    for (int i = 0; i < ops; ++i) {
      check_ec(w, "all_reduce (back to back)", ecs[i]);
      const Bytes want = reduce_reference(DataType::int64, ReduceOp::sum, w.n, 300 + i, 0, count);
      w.expect_equal(describe("async_all_reduce", DataType::int64, ReduceOp::sum, count,
                              "back_to_back=" + std::to_string(i)),
                     DataType::int64, recv[i].data(), want.data(), count);
    }
  }
  return w.failures ? exit_check_failed : exit_ok;
}

int run_cancel(Worker& w) {
  // 1. An operation that has not started is removed by any cancellation. Rank 1 joins
  //    all_reduce A late, so rank 0's A is still in flight when it cancels B, queued behind it;
  //    rank 1 never calls B. Then both run C on the same communicator.
  std::int64_t one = w.rank + 1, sum = 0;
  const std::int64_t want = static_cast<std::int64_t>(w.n) * (w.n + 1) / 2;
  if (w.rank == 0) {
    asio::io_context io;
    asio::cancellation_signal sig;
    std::error_code a_ec = make_error_code(errc::internal), b_ec;
    std::int64_t b_in = 5, b_out = 0;
    w.comm.async_all_reduce(&one, &sum, 1, DataType::int64, ReduceOp::sum,
                            asio::bind_executor(io, [&](std::error_code ec) { a_ec = ec; }));
    w.comm.async_all_reduce(
        &b_in, &b_out, 1, DataType::int64, ReduceOp::sum,
        asio::bind_cancellation_slot(
            sig.slot(), asio::bind_executor(io, [&](std::error_code ec) { b_ec = ec; })));
    sig.emit(asio::cancellation_type::partial);
    io.run();
    check_ec(w, "all_reduce A (before a cancelled one)", a_ec);
    if (sum != want) w.fail("all_reduce A", "sum " + std::to_string(sum));
    if (b_ec != std::errc::operation_canceled)
      w.fail("all_reduce B (cancelled before it started)", "got '" + b_ec.message() + "'");
    if (b_out != 0) w.fail("all_reduce B (cancelled before it started)", "it wrote its output");
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    w.comm.all_reduce(&one, &sum, 1, DataType::int64, ReduceOp::sum);
    if (sum != want) w.fail("all_reduce A", "sum " + std::to_string(sum));
  }
  sum = 0;
  w.comm.all_reduce(&one, &sum, 1, DataType::int64, ReduceOp::sum);
  if (sum != want) w.fail("all_reduce C (after the cancellation)", "sum " + std::to_string(sum));

  // 2. Terminal cancellation of an operation in flight aborts the communicator on every rank.
  //    Rank 0 cancels its all_reduce D while rank 1 has not joined it.
  const auto start = std::chrono::steady_clock::now();
  if (w.rank == 0) {
    asio::io_context io;
    asio::cancellation_signal sig;
    std::error_code d_ec;
    w.comm.async_all_reduce(
        &one, &sum, 1, DataType::int64, ReduceOp::sum,
        asio::bind_cancellation_slot(
            sig.slot(), asio::bind_executor(io, [&](std::error_code ec) { d_ec = ec; })));
    asio::steady_timer t(io, std::chrono::milliseconds(200));
    t.async_wait([&](boost::system::error_code) { sig.emit(asio::cancellation_type::terminal); });
    io.run();
    if (d_ec != make_error_code(errc::aborted))
      w.fail("all_reduce D (terminal cancellation in flight)", "got '" + d_ec.message() + "'");
    if (w.comm.last_error().find("cancelled by the caller") == std::string::npos)
      w.fail("all_reduce D", "last_error '" + w.comm.last_error() + "'");
    return w.failures ? exit_check_failed : exit_ok;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  try {
    w.comm.all_reduce(&one, &sum, 1, DataType::int64, ReduceOp::sum);
  } catch (const std::system_error& e) {
    return report_error(w, e, since(start));
  }
  std::printf("all_reduce completed although rank 0 cancelled it\n");
  return exit_unexpected_success;
}

}  // namespace coccl::test
