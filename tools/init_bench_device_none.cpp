// coccl-init-bench without CUDA: no device runs.
#include <cstdio>

#include "init_bench_device.hpp"

namespace coccl_init_bench {

bool device_runs_built() { return false; }

int device_rank_main(int, int, const std::string&, const std::string&) {
  std::fprintf(stderr, "coccl-init-bench: built without CUDA, no device runs\n");
  return 2;
}

}  // namespace coccl_init_bench
