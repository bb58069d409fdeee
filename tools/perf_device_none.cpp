// coccl-perf without CUDA: no device sweep.
#include <cstdio>

#include "perf_device.hpp"

namespace perf {

int gpu_count() { return 0; }

int run_device(coccl::Communicator, const Options&) {
  std::fprintf(stderr, "coccl-perf: built without CUDA; use --device host\n");
  return 2;
}

}  // namespace perf
