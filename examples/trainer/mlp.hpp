// examples/trainer/mlp.hpp: the trainer's model, a multi-layer perceptron with a plain CPU form
// and a cuBLAS form, and its synthetic data set.
//
// Layer l maps in_l to out_l features: z = a W + b (W is in_l x out_l, row-major), followed by a
// ReLU except on the last layer. The loss is half the squared error against a fixed "teacher"
// network's outputs, summed over the samples. Everything is a function of the seed, so every rank
// builds the same initial weights and any rank can build any sample of the global batch.
//
// No Asio here: the CUDA form includes this header from a .cu file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trainer {

struct Config {
  int inputs = 64, hidden = 512, outputs = 16, layers = 4;
  int global_batch = 96;
  std::uint64_t seed = 2024;
};

/// Where layer l's weights (then its bias) start in the flat parameter and gradient buffers, for
/// l = 0 .. layers; offsets[layers] is the total count.
std::vector<std::size_t> layer_offsets(const Config& c);
int layer_inputs(const Config& c, int l);
int layer_outputs(const Config& c, int l);

/// The initial parameters (flat, layer after layer).
std::vector<float> initial_parameters(const Config& c);

/// Samples [first, first + count) of step `step`'s global batch: inputs (count x inputs) and
/// targets (count x outputs), row-major.
void make_batch(const Config& c, int step, int first, int count, std::vector<float>& x,
                std::vector<float>& y);

/// One replica of the model. Gradients are computed as sums over this replica's samples divided
/// by the global batch size, so summing them over the ranks gives the global batch's mean.
class Model {
 public:
  virtual ~Model() = default;
  /// Forward pass on samples [first, first + count) of step `step`; returns the sum of their
  /// losses and prepares backward_layer.
  virtual double forward(int step, int first, int count) = 0;
  /// Computes layer l's weight and bias gradients; call for l = layers-1 down to 0.
  virtual void backward_layer(int l) = 0;
  /// The flat gradient buffer (host or device memory, see on_device()).
  virtual float* gradients() = 0;
  /// SGD with momentum on every parameter, from the (all-reduced) gradients.
  virtual void sgd_step(float lr, float momentum) = 0;
  /// The parameters, copied to the host.
  virtual std::vector<float> parameters() = 0;
  virtual bool on_device() const = 0;
  /// Device form: orders the communication stream after everything enqueued so far on the
  /// compute stream (the gradients computed up to now). Host form: nothing to order.
  virtual void fence_gradients() {}
  /// Device form: the stream collectives on the gradients are enqueued on.
  virtual void* comm_stream() { return nullptr; }
  /// Device form: waits for the compute stream (for timing). Host form: nothing.
  virtual void synchronize() {}
};

std::unique_ptr<Model> make_cpu_model(const Config& c);
/// The cuBLAS form on CUDA device `device`; throws std::runtime_error naming the failed call.
/// Declared in every build, defined only in builds with CUDA.
std::unique_ptr<Model> make_cuda_model(const Config& c, int device);
/// Number of CUDA devices (0 in a build without CUDA or on a machine without GPUs).
int cuda_devices();

}  // namespace trainer
