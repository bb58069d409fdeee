// A coroutine program that awaits collectives.
//
// Starts `nranks` ranks as threads of this process (a real program runs one process per rank and
// ships the UniqueId bytes to the others), and in each rank runs a coroutine on its own
// io_context that co_awaits an all_reduce, an all_gather and a broadcast.
//
//   coccl-example-coroutine [nranks]
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/coccl.hpp>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>
#include <vector>

namespace asio = boost::asio;

asio::awaitable<void> rank_main(coccl::Communicator comm, int* failures) {
  const int n = comm.size(), me = comm.rank();
  std::vector<float> grad(1000, static_cast<float>(me + 1));
  auto [ec] = co_await comm.async_all_reduce(grad.data(), grad.data(), grad.size(),
                                             coccl::DataType::float32, coccl::ReduceOp::avg,
                                             asio::as_tuple(asio::use_awaitable));
  if (ec || grad[0] != (n + 1) / 2.0f) ++*failures;

  std::vector<int> ids(n);
  std::tie(ec) = co_await comm.async_all_gather(&me, ids.data(), 1, coccl::DataType::int32,
                                                asio::as_tuple(asio::use_awaitable));
  std::vector<int> want(n);
  std::iota(want.begin(), want.end(), 0);
  if (ec || ids != want) ++*failures;

  int step = me == 0 ? 42 : 0;
  std::tie(ec) = co_await comm.async_broadcast(&step, &step, 1, coccl::DataType::int32, 0,
                                               asio::as_tuple(asio::use_awaitable));
  if (ec || step != 42) ++*failures;
  std::printf("rank %d/%d: avg %.1f, gathered %d ids, step %d%s\n", me, n, grad[0], n, step,
              ec ? (" error: " + comm.last_error()).c_str() : "");
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 4;
  auto id = coccl::UniqueId::create();
  std::vector<int> failures(n, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      auto comm = coccl::Communicator::create(id, r, n);
      asio::io_context io;  // the rank's own event loop
      asio::co_spawn(io, rank_main(comm, &failures[r]), asio::detached);
      io.run();
      comm.destroy();
    });
  for (auto& t : ranks) t.join();
  int total = std::accumulate(failures.begin(), failures.end(), 0);
  std::printf("%s\n", total ? "FAILED" : "ok");
  return total ? 1 : 0;
}
