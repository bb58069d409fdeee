// examples/trainer/mlp_cuda.cu: the model on one GPU, cuBLAS for the matrix products.
//
// Row-major matrices are handed to column-major cuBLAS as their transposes: z = a W (n x out)
// is z^T = W^T a^T, and so on. Gradients are computed on the compute stream; fence_gradients()
// records an event there that the communication stream waits for, so a bucket's all_reduce
// (enqueued on the communication stream) runs beside the backward kernels of earlier layers.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "mlp.hpp"

namespace trainer {
namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void blas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(s));
}
#define CUDA(call) cuda_check((call), #call)
#define BLAS(call) blas_check((call), #call)

__global__ void relu(float* z, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) z[i] = fmaxf(z[i], 0.0f);
}

// delta *= (a > 0): the ReLU's derivative, read from its output.
__global__ void relu_backward(float* delta, const float* a, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n && a[i] <= 0.0f) delta[i] = 0.0f;
}

// diff = out - y; delta = diff / batch.
__global__ void output_error(const float* out, const float* y, float* diff, float* delta,
                             std::size_t n, float inv_batch) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    diff[i] = out[i] - y[i];
    delta[i] = diff[i] * inv_batch;
  }
}

unsigned blocks(std::size_t n) { return static_cast<unsigned>((n + 255) / 256); }

// A device buffer of floats.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t n) : n_(n) {
    CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), (n ? n : 1) * sizeof(float)));
  }
  Buffer(Buffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~Buffer() { cudaFree(p_); }
  float* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  float* p_ = nullptr;
  std::size_t n_ = 0;
};

class CudaModel final : public Model {
 public:
  CudaModel(const Config& c, int device) : c_(c), off_(layer_offsets(c)) {
    CUDA(cudaSetDevice(device));
    CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    CUDA(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    BLAS(cublasCreate(&blas_));
    BLAS(cublasSetStream(blas_, compute_));
    const std::vector<float> p = initial_parameters(c);
    p_ = Buffer(p.size());
    g_ = Buffer(p.size());
    v_ = Buffer(p.size());
    CUDA(cudaMemcpy(p_.get(), p.data(), p.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA(cudaMemset(v_.get(), 0, p.size() * sizeof(float)));
  }
  ~CudaModel() override {
    cudaStreamSynchronize(comm_);
    cudaStreamSynchronize(compute_);
    cublasDestroy(blas_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(comm_);
    cudaStreamDestroy(compute_);
  }

  double forward(int step, int first, int count) override {
    n_ = count;
    std::vector<float> x, y;
    make_batch(c_, step, first, count, x, y);
    if (act_.empty() || act_[0].size() != x.size()) resize(count);
    CUDA(cudaMemcpyAsync(act_[0].get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice,
                         compute_));
    CUDA(cudaMemcpyAsync(y_.get(), y.data(), y.size() * sizeof(float), cudaMemcpyHostToDevice,
                         compute_));
    const float one = 1.0f, zero = 0.0f;
    for (int l = 0; l < c_.layers; ++l) {
      const int in = layer_inputs(c_, l), out = layer_outputs(c_, l);
      const float* w = p_.get() + off_[l];
      const float* b = w + static_cast<std::size_t>(in) * out;
      float* z = act_[l + 1].get();
      BLAS(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, out, n_, in, &one, w, out, act_[l].get(),
                       in, &zero, z, out));
      BLAS(cublasSger(blas_, out, n_, &one, b, 1, ones_.get(), 1, z, out));
      if (l + 1 < c_.layers)
        relu<<<blocks(act_[l + 1].size()), 256, 0, compute_>>>(z, act_[l + 1].size());
    }
    const std::size_t n_out = act_[c_.layers].size();
    output_error<<<blocks(n_out), 256, 0, compute_>>>(act_[c_.layers].get(), y_.get(), diff_.get(),
                                                      delta_.get(), n_out,
                                                      1.0f / static_cast<float>(c_.global_batch));
    CUDA(cudaGetLastError());
    float sq = 0;
    BLAS(cublasSdot(blas_, static_cast<int>(n_out), diff_.get(), 1, diff_.get(), 1, &sq));
    return 0.5 * static_cast<double>(sq);
  }

  void backward_layer(int l) override {
    const int in = layer_inputs(c_, l), out = layer_outputs(c_, l);
    const float* w = p_.get() + off_[l];
    float* gw = g_.get() + off_[l];
    float* gb = gw + static_cast<std::size_t>(in) * out;
    const float one = 1.0f, zero = 0.0f;
    // gW = a^T delta; gb = delta^T 1.
    BLAS(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, out, in, n_, &one, delta_.get(), out,
                     act_[l].get(), in, &zero, gw, out));
    BLAS(cublasSgemv(blas_, CUBLAS_OP_N, out, n_, &one, delta_.get(), out, ones_.get(), 1, &zero,
                     gb, 1));
    if (l == 0) return;
    // delta_prev = (delta W^T), masked by the ReLU of layer l-1.
    BLAS(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, in, n_, out, &one, w, out, delta_.get(), out,
                     &zero, prev_.get(), in));
    const std::size_t k = static_cast<std::size_t>(n_) * in;
    relu_backward<<<blocks(k), 256, 0, compute_>>>(prev_.get(), act_[l].get(), k);
    CUDA(cudaGetLastError());
    std::swap(delta_, prev_);
  }

  float* gradients() override { return g_.get(); }

  void sgd_step(float lr, float momentum) override {
    const int n = static_cast<int>(p_.size());
    const float one = 1.0f, minus_lr = -lr;
    // v = momentum v + g; p -= lr v.
    BLAS(cublasSscal(blas_, n, &momentum, v_.get(), 1));
    BLAS(cublasSaxpy(blas_, n, &one, g_.get(), 1, v_.get(), 1));
    BLAS(cublasSaxpy(blas_, n, &minus_lr, v_.get(), 1, p_.get(), 1));
  }

  std::vector<float> parameters() override {
    std::vector<float> p(p_.size());
    CUDA(cudaStreamSynchronize(compute_));
    CUDA(cudaMemcpy(p.data(), p_.get(), p.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return p;
  }
  bool on_device() const override { return true; }

  void fence_gradients() override {
    CUDA(cudaEventRecord(ready_, compute_));
    CUDA(cudaStreamWaitEvent(comm_, ready_, 0));
  }
  void* comm_stream() override { return comm_; }
  void synchronize() override { CUDA(cudaStreamSynchronize(compute_)); }

 private:
  void resize(int count) {
    act_.clear();
    act_.emplace_back(static_cast<std::size_t>(count) * c_.inputs);
    std::size_t widest = c_.inputs;
    for (int l = 0; l < c_.layers; ++l) {
      act_.emplace_back(static_cast<std::size_t>(count) * layer_outputs(c_, l));
      widest = std::max<std::size_t>(widest, layer_outputs(c_, l));
    }
    y_ = Buffer(static_cast<std::size_t>(count) * c_.outputs);
    diff_ = Buffer(y_.size());
    delta_ = Buffer(static_cast<std::size_t>(count) * widest);
    prev_ = Buffer(delta_.size());
    ones_ = Buffer(static_cast<std::size_t>(count));
    const std::vector<float> ones(static_cast<std::size_t>(count), 1.0f);
    CUDA(cudaMemcpy(ones_.get(), ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  Config c_;
  std::vector<std::size_t> off_;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  Buffer p_, g_, v_, y_, diff_, delta_, prev_, ones_;
  std::vector<Buffer> act_;
  int n_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_cuda_model(const Config& c, int device) {
  return std::make_unique<CudaModel>(c, device);
}

int cuda_devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace trainer
