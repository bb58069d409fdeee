// coccl-moe-bench's GPU helpers for the NCCL baseline (tools/coccl_moe_bench_kernels.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace bench {

/// The baseline's dispatch-side permutation: rows of x go to send, grouped by expert (experts of
/// one rank are consecutive, so by destination rank too); pos[t * k + s] records where (-1 for no
/// expert) and send_rows[d] how many rows go to rank d (device int64).
struct Pack {
  const std::int32_t* idx;
  int tokens, k, experts, nranks;
  const void* x;
  void* send;
  int row_bytes;  // multiple of 16
  int* hist;      // experts ints of scratch
  int* base;      // experts ints of scratch
  int* cursor;    // experts ints of scratch
  int* pos;       // tokens * k
  std::int64_t* send_rows;
};

int pack(const Pack& args, cudaStream_t stream);

/// out[t] = sum over slots of w[t * k + s] * back[pos[t * k + s]] (bfloat16 rows).
int unpack(const int* pos, const float* w, int tokens, int k, const void* back, void* out,
           int hidden, cudaStream_t stream);

}  // namespace bench
