// examples/trainer/mlp_common.cpp: layer shapes, initial weights and the synthetic data.
#include <cmath>

#include "mlp.hpp"

namespace trainer {
namespace {

// A counter-based generator: the value depends only on (seed, stream, index), so a rank can make
// sample 37 of step 5 without making the samples before it.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1).
float uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t r = mix(mix(mix(seed) ^ stream) ^ index);
  return static_cast<float>(static_cast<double>(r >> 11) * 0x1.0p-52 - 1.0);
}

constexpr std::uint64_t weights_stream = 1, inputs_stream = 2, teacher_stream = 3;

}  // namespace

int layer_inputs(const Config& c, int l) { return l == 0 ? c.inputs : c.hidden; }
int layer_outputs(const Config& c, int l) { return l == c.layers - 1 ? c.outputs : c.hidden; }

std::vector<std::size_t> layer_offsets(const Config& c) {
  std::vector<std::size_t> off{0};
  for (int l = 0; l < c.layers; ++l) {
    const std::size_t in = layer_inputs(c, l), out = layer_outputs(c, l);
    off.push_back(off.back() + in * out + out);
  }
  return off;
}

std::vector<float> initial_parameters(const Config& c) {
  const auto off = layer_offsets(c);
  std::vector<float> p(off.back());
  for (int l = 0; l < c.layers; ++l) {
    const std::size_t in = layer_inputs(c, l), out = layer_outputs(c, l);
    // Uniform with variance 1/in (LeCun), so activations keep their scale; biases start at 0.
    const float scale = std::sqrt(3.0f / static_cast<float>(in));
    for (std::size_t i = 0; i < in * out; ++i)
      p[off[l] + i] = scale * uniform(c.seed, weights_stream, off[l] + i);
  }
  return p;
}

void make_batch(const Config& c, int step, int first, int count, std::vector<float>& x,
                std::vector<float>& y) {
  x.assign(static_cast<std::size_t>(count) * c.inputs, 0.0f);
  y.assign(static_cast<std::size_t>(count) * c.outputs, 0.0f);
  const float teacher_scale = 2.0f / std::sqrt(static_cast<float>(c.inputs));
  for (int s = 0; s < count; ++s) {
    const std::uint64_t sample =
        static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(c.global_batch) +
        static_cast<std::uint64_t>(first + s);
    float* xs = &x[static_cast<std::size_t>(s) * c.inputs];
    for (int i = 0; i < c.inputs; ++i)
      xs[i] = uniform(c.seed, inputs_stream, sample * c.inputs + i);
    for (int o = 0; o < c.outputs; ++o) {
      float acc = 0;
      for (int i = 0; i < c.inputs; ++i)
        acc +=
            xs[i] * uniform(c.seed, teacher_stream, static_cast<std::uint64_t>(i) * c.outputs + o);
      y[static_cast<std::size_t>(s) * c.outputs + o] = std::tanh(teacher_scale * acc);
    }
  }
}

}  // namespace trainer
