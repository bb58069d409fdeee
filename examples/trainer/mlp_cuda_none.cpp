// examples/trainer/mlp_cuda_none.cpp: the device form in a build without CUDA.
#include <stdexcept>

#include "mlp.hpp"

namespace trainer {

std::unique_ptr<Model> make_cuda_model(const Config&, int) {
  throw std::runtime_error("this build has no CUDA (configure with COCCL_ENABLE_CUDA)");
}

int cuda_devices() { return 0; }

}  // namespace trainer
