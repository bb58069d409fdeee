// Uses the installed library: one rank all_reduce and a two-rank exchange on threads.
#include <coccl/coccl.hpp>
#include <cstdio>
#include <thread>
#include <vector>

static_assert(__cplusplus >= 202002L, "coccl::coccl must bring C++20 to its consumers");

int main() {
  auto id = coccl::UniqueId::create();
  std::vector<int> result(2, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      auto comm = coccl::Communicator::create(id, r, 2);
      int value = r + 1, sum = 0;
      comm.all_reduce(&value, &sum, 1, coccl::DataType::int32, coccl::ReduceOp::sum);
      result[r] = sum;
      comm.destroy();
    });
  for (auto& t : ranks) t.join();
  std::printf("consumer: %d %d\n", result[0], result[1]);
  return result[0] == 3 && result[1] == 3 ? 0 : 1;
}
