// examples/moe_layer.hpp: the example's own GPU kernels (examples/moe_layer.cu), float32. Plain
// pointers only: nvcc does not compile coccl's headers (Asio), so the .cu never includes them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace example {

/// Router: logits = x (tokens x hidden) * wr (hidden x experts); per token the top_k largest
/// (ties to the lower expert id) and their softmax, written to idx and weights (tokens x top_k).
void route(const float* x, const float* wr, int tokens, int hidden, int experts, int top_k,
           std::int32_t* idx, float* weights, cudaStream_t stream);

/// Experts: for each received row r < offsets[local_experts] (read on the device),
/// y[r] = relu(x[r] * w[expert - first_expert]), expert = rows[4 r + 3] (coccl::moe::Row as four
/// int32), w holding local_experts hidden x hidden matrices. Rows past the count are left alone,
/// so no host synchronisation is needed.
void run_experts(const float* x, const std::int32_t* rows, const std::int32_t* offsets,
                 int local_experts, int first_expert, std::size_t capacity, const float* w,
                 float* y, int hidden, cudaStream_t stream);

}  // namespace example
