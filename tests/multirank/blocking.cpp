// Scenarios of blocking callers and of links that finish sending after an operation completes.
//
// "blocking_threads": a blocking caller runs its communicator's loop itself while it waits
// (runtime::ProxyThread::drive). Three threads with a communicator each, all on the one proxy
// thread, call at once with sizes on both sides of a tcp link's copied puts (4 KiB), and every
// result must match the reference. Then one thread calls in a loop while handlers posted to the
// communicator's executor make blocking calls: those run on whichever thread runs the loop (the
// proxy thread, or the caller driving it), and each must be refused with
// resource_deadlock_would_occur rather than wait for the loop it runs in.
//
// "send_and_leave": rank 0 sends three messages (8 B, 4 KiB, 1 MiB) to rank 1 and destroys its
// communicator as soon as the sends complete; rank 1 starts receiving only later. A small put over
// tcp completes once copied, before its bytes are written: the goodbye must still follow them.
#include <atomic>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "tests/multirank/worker.hpp"

namespace coccl::test {
namespace {

namespace asio = boost::asio;

// A blocking all_reduce of `count` int32 on `c`, checked against the sum over ranks.
void checked_all_reduce(Worker& w, Communicator& c, std::size_t count, int salt) {
  std::vector<std::int32_t> in(count), out(count, -1);
  for (std::size_t i = 0; i < count; ++i)
    in[i] = (c.rank() + 1) * static_cast<std::int32_t>((i + salt) % 1000);
  c.all_reduce(in.data(), out.data(), count, DataType::int32, ReduceOp::sum);
  const std::int32_t ranks = c.size() * (c.size() + 1) / 2;
  for (std::size_t i = 0; i < count; ++i)
    if (out[i] != ranks * static_cast<std::int32_t>((i + salt) % 1000)) {
      w.fail("all_reduce count=" + std::to_string(count) + " salt=" + std::to_string(salt),
             "element " + std::to_string(i) + ": " + std::to_string(out[i]));
      return;
    }
}

void threads_at_once(Worker& w) {
  std::vector<Communicator> comms;
  comms.push_back(w.comm);
  comms.push_back(w.comm.split(0, w.rank));
  comms.push_back(w.comm.split(0, w.rank));
  const std::size_t sizes[] = {1, 2, 1023, 1024, 1025, 4096, 65536};
  std::mutex m;
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < comms.size(); ++t)
    threads.emplace_back([&, t] {
      Worker local;
      local.scenario = w.scenario;
      local.rank = w.rank;
      local.n = w.n;
      for (int j = 0; j < 40; ++j)
        checked_all_reduce(local, comms[t], sizes[(j + t) % std::size(sizes)],
                           static_cast<int>(100 * t) + j);
      std::lock_guard lock(m);
      w.failures += local.failures;
    });
  for (auto& t : threads) t.join();
  comms[1].destroy();
  comms[2].destroy();
}

void refused_in_handlers(Worker& w) {
  std::atomic<bool> looping{true};
  std::thread caller([&] {
    Worker local;
    local.scenario = w.scenario;
    local.rank = w.rank;
    local.n = w.n;
    for (int j = 0; j < 200; ++j) checked_all_reduce(local, w.comm, 1 + j % 3, j);
    looping = false;
    w.failures += local.failures;
  });
  const int handlers = 50;
  std::mutex m;
  std::vector<std::error_code> got;
  for (int i = 0; i < handlers; ++i) {
    asio::post(w.comm.executor(), [&] {
      std::int32_t one = 1, out = 0;
      std::error_code ec;
      try {
        w.comm.all_reduce(&one, &out, 1, DataType::int32, ReduceOp::sum);
      } catch (const std::system_error& e) {
        ec = e.code();
      }
      std::lock_guard lock(m);
      got.push_back(ec);
    });
    // Spread over the caller's loop, so that some land while it drives.
    if (looping) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  caller.join();
  // Every handler has run by now or runs soon; wait for the last.
  for (int tries = 0; tries < 5000; ++tries) {
    {
      std::lock_guard lock(m);
      if (got.size() == static_cast<std::size_t>(handlers)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard lock(m);
  if (got.size() != static_cast<std::size_t>(handlers))
    w.fail("blocking calls from handlers",
           std::to_string(got.size()) + " of " + std::to_string(handlers) + " handlers ran");
  for (const std::error_code& ec : got)
    if (ec != std::errc::resource_deadlock_would_occur) {
      w.fail("blocking call from a handler", "expected a refusal, got '" + ec.message() + "'");
      break;
    }
}

std::vector<std::uint8_t> message(std::size_t bytes, int which) {
  std::vector<std::uint8_t> m(bytes);
  for (std::size_t i = 0; i < bytes; ++i) m[i] = static_cast<std::uint8_t>(i * 7 + which * 31);
  return m;
}

}  // namespace

int run_blocking_threads(Worker& w) {
  threads_at_once(w);
  refused_in_handlers(w);
  return exit_ok;
}

int run_send_and_leave(Worker& w) {
  const std::size_t sizes[] = {8, 4096, 1 << 20};
  if (w.rank == 0) {
    for (int k = 0; k < 3; ++k) {
      const auto m = message(sizes[k], k);
      w.comm.send(m.data(), m.size(), DataType::uint8, 1);
    }
    w.comm.destroy();
  } else if (w.rank == 1) {
    // Rank 0 has left (or is leaving) before the first receive is posted.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (int k = 0; k < 3; ++k) {
      std::vector<std::uint8_t> got(sizes[k], 0xee);
      w.comm.recv(got.data(), got.size(), DataType::uint8, 0);
      if (got != message(sizes[k], k))
        w.fail("message " + std::to_string(k), std::to_string(sizes[k]) + " bytes differ");
    }
  }
  return exit_ok;
}

}  // namespace coccl::test
