// examples/trainer/mlp_cpu.cpp: the model on host memory, plain loops.
#include <algorithm>

#include "mlp.hpp"

namespace trainer {
namespace {

class CpuModel final : public Model {
 public:
  explicit CpuModel(const Config& c)
      : c_(c), off_(layer_offsets(c)), p_(initial_parameters(c)), g_(p_.size()), v_(p_.size()) {}

  double forward(int step, int first, int count) override {
    n_ = count;
    make_batch(c_, step, first, count, x_, y_);
    act_.assign(c_.layers + 1, {});
    act_[0] = x_;
    for (int l = 0; l < c_.layers; ++l) {
      const int in = layer_inputs(c_, l), out = layer_outputs(c_, l);
      const float* w = &p_[off_[l]];
      const float* b = w + static_cast<std::size_t>(in) * out;
      std::vector<float>& z = act_[l + 1];
      z.assign(static_cast<std::size_t>(n_) * out, 0.0f);
      for (int s = 0; s < n_; ++s) {
        float* zs = &z[static_cast<std::size_t>(s) * out];
        std::copy(b, b + out, zs);
        const float* a = &act_[l][static_cast<std::size_t>(s) * in];
        for (int i = 0; i < in; ++i) {
          const float ai = a[i];
          const float* wi = w + static_cast<std::size_t>(i) * out;
          for (int o = 0; o < out; ++o) zs[o] += ai * wi[o];
        }
        if (l + 1 < c_.layers)
          for (int o = 0; o < out; ++o) zs[o] = std::max(zs[o], 0.0f);
      }
    }
    // The gradient of the loss at the output, already divided by the global batch size.
    const std::vector<float>& out = act_[c_.layers];
    delta_.resize(out.size());
    double loss = 0;
    for (std::size_t k = 0; k < out.size(); ++k) {
      const float d = out[k] - y_[k];
      loss += 0.5 * static_cast<double>(d) * d;
      delta_[k] = d / static_cast<float>(c_.global_batch);
    }
    return loss;
  }

  void backward_layer(int l) override {
    const int in = layer_inputs(c_, l), out = layer_outputs(c_, l);
    const float* w = &p_[off_[l]];
    float* gw = &g_[off_[l]];
    float* gb = gw + static_cast<std::size_t>(in) * out;
    std::fill(gw, gw + static_cast<std::size_t>(in) * out + out, 0.0f);
    const std::vector<float>& a = act_[l];
    for (int s = 0; s < n_; ++s) {
      const float* d = &delta_[static_cast<std::size_t>(s) * out];
      const float* as = &a[static_cast<std::size_t>(s) * in];
      for (int i = 0; i < in; ++i) {
        const float ai = as[i];
        float* gwi = gw + static_cast<std::size_t>(i) * out;
        for (int o = 0; o < out; ++o) gwi[o] += ai * d[o];
      }
      for (int o = 0; o < out; ++o) gb[o] += d[o];
    }
    if (l == 0) return;
    // The next delta: through W's transpose, then the ReLU of layer l-1 (a > 0 where z > 0).
    std::vector<float> prev(static_cast<std::size_t>(n_) * in);
    for (int s = 0; s < n_; ++s) {
      const float* d = &delta_[static_cast<std::size_t>(s) * out];
      const float* as = &a[static_cast<std::size_t>(s) * in];
      for (int i = 0; i < in; ++i) {
        if (as[i] <= 0) continue;
        const float* wi = w + static_cast<std::size_t>(i) * out;
        float acc = 0;
        for (int o = 0; o < out; ++o) acc += wi[o] * d[o];
        prev[static_cast<std::size_t>(s) * in + i] = acc;
      }
    }
    delta_ = std::move(prev);
  }

  float* gradients() override { return g_.data(); }

  void sgd_step(float lr, float momentum) override {
    for (std::size_t k = 0; k < p_.size(); ++k) {
      v_[k] = momentum * v_[k] + g_[k];
      p_[k] -= lr * v_[k];
    }
  }

  std::vector<float> parameters() override { return p_; }
  bool on_device() const override { return false; }

 private:
  Config c_;
  std::vector<std::size_t> off_;
  std::vector<float> p_, g_, v_;         // parameters, gradients, momentum
  std::vector<std::vector<float>> act_;  // act_[0] the inputs, act_[l+1] layer l's output
  std::vector<float> x_, y_, delta_;
  int n_ = 0;
};

}  // namespace

std::unique_ptr<Model> make_cpu_model(const Config& c) { return std::make_unique<CpuModel>(c); }

}  // namespace trainer
