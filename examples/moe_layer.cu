// examples/moe_layer.cu: the router and expert kernels of examples/moe_layer.cpp. Plain and
// unoptimised: the example is about the token exchange around them.
#include <cuda_runtime.h>

#include "moe_layer.hpp"

namespace example {
namespace {

constexpr int max_k = 8;

__global__ void route_kernel(const float* x, const float* wr, int tokens, int hidden, int experts,
                             int top_k, std::int32_t* idx, float* weights) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  float best[max_k];
  int which[max_k];
  for (int s = 0; s < top_k; ++s) {
    best[s] = -INFINITY;
    which[s] = -1;
  }
  for (int e = 0; e < experts; ++e) {
    float logit = 0;
    for (int h = 0; h < hidden; ++h) logit = fmaf(x[t * hidden + h], wr[h * experts + e], logit);
    // Insertion into the sorted top-k; a tie keeps the lower expert first.
    int s = top_k;
    while (s > 0 && logit > best[s - 1]) --s;
    if (s == top_k) continue;
    for (int j = top_k - 1; j > s; --j) {
      best[j] = best[j - 1];
      which[j] = which[j - 1];
    }
    best[s] = logit;
    which[s] = e;
  }
  float sum = 0;
  for (int s = 0; s < top_k; ++s) sum += expf(best[s] - best[0]);
  for (int s = 0; s < top_k; ++s) {
    idx[t * top_k + s] = which[s];
    weights[t * top_k + s] = expf(best[s] - best[0]) / sum;
  }
}

// One block per received row.
__global__ void expert_kernel(const float* x, const std::int32_t* rows, const std::int32_t* offsets,
                              int local_experts, int first_expert, const float* w, float* y,
                              int hidden, int capacity) {
  const int total = offsets[local_experts];
  for (int r = blockIdx.x; r < total && r < capacity; r += gridDim.x) {
    const float* m = w + static_cast<std::size_t>(rows[4 * r + 3] - first_expert) * hidden * hidden;
    for (int o = threadIdx.x; o < hidden; o += blockDim.x) {
      float acc = 0;
      for (int i = 0; i < hidden; ++i)
        acc = fmaf(x[static_cast<std::size_t>(r) * hidden + i], m[i * hidden + o], acc);
      y[static_cast<std::size_t>(r) * hidden + o] = acc > 0 ? acc : 0;
    }
  }
}

}  // namespace

void route(const float* x, const float* wr, int tokens, int hidden, int experts, int top_k,
           std::int32_t* idx, float* weights, cudaStream_t stream) {
  route_kernel<<<(tokens + 127) / 128, 128, 0, stream>>>(x, wr, tokens, hidden, experts, top_k, idx,
                                                         weights);
}

void run_experts(const float* x, const std::int32_t* rows, const std::int32_t* offsets,
                 int local_experts, int first_expert, std::size_t capacity, const float* w,
                 float* y, int hidden, cudaStream_t stream) {
  expert_kernel<<<132, 256, 0, stream>>>(x, rows, offsets, local_experts, first_expert, w, y,
                                         hidden, static_cast<int>(capacity));
}

}  // namespace example
