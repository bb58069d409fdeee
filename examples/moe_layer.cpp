// examples/moe_layer.cpp: one step of a mixture-of-experts layer on two GPUs with
// coccl::moe::Dispatcher, checked against a single-process reference.
//
//   coccl-example-moe-layer        (without two GPUs: prints why and exits 77, "skipped")
//
// Each rank (one thread per GPU here; one process per GPU works the same way) holds 64 tokens of
// 256 floats. Per step: the router picks the top-2 of 8 experts per token on the GPU; dispatch
// sends every token to the GPUs of its experts (4 experts per GPU), grouped by expert; each GPU
// runs its experts (relu(x W_e)) on the rows it received, reading the counts on the GPU;
// combine brings the outputs back and sums them with the router's weights. No step waits for
// the host: the whole layer is enqueued on one stream, and only the final result is copied out.
#include "moe_layer.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <coccl/coccl.hpp>
#include <coccl/moe.hpp>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

constexpr int nranks = 2, tokens = 64, hidden = 256, experts = 8, top_k = 2;
constexpr int local_experts = experts / nranks;

// Inputs are multiples of 1/8 (router products and sums are exact in float, so the GPU and the
// reference pick the same experts).
float x_of(int rank, int t, int h) {
  return static_cast<float>((rank * 29 + t * 13 + h * 7) % 33 - 16) / 8;
}
float router_of(int h, int e) { return static_cast<float>((h * 5 + e * 11) % 17 - 8) / 8; }
float expert_w(int e, int i, int o) {
  return static_cast<float>((e * 3 + i * 7 + o * 5) % 13 - 6) / 64;
}

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "rank %d: %s: %s\n", rank, #call, cudaGetErrorString(e_)); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

template <class T>
cudaError_t device_alloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}

// The same layer on the host, for one rank's tokens.
std::vector<float> reference(int rank) {
  std::vector<float> out(static_cast<std::size_t>(tokens) * hidden, 0.0f);
  for (int t = 0; t < tokens; ++t) {
    std::vector<std::pair<float, int>> logits;
    for (int e = 0; e < experts; ++e) {
      float l = 0;
      for (int h = 0; h < hidden; ++h) l = std::fma(x_of(rank, t, h), router_of(h, e), l);
      logits.push_back({l, e});
    }
    std::stable_sort(logits.begin(), logits.end(),
                     [](auto a, auto b) { return a.first > b.first; });
    float sum = 0;
    for (int s = 0; s < top_k; ++s) sum += std::exp(logits[s].first - logits[0].first);
    for (int s = 0; s < top_k; ++s) {
      const int e = logits[s].second;
      const float w = std::exp(logits[s].first - logits[0].first) / sum;
      for (int o = 0; o < hidden; ++o) {
        float acc = 0;
        for (int i = 0; i < hidden; ++i) acc = std::fma(x_of(rank, t, i), expert_w(e, i, o), acc);
        float& r = out[static_cast<std::size_t>(t) * hidden + o];
        r = std::fma(w, std::max(acc, 0.0f), r);
      }
    }
  }
  return out;
}

int run_layer(int rank, coccl::Communicator& comm, double& worst) {
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const auto cs = reinterpret_cast<coccl::cuda_stream>(st);

  std::vector<float> x(static_cast<std::size_t>(tokens) * hidden), wr(hidden * experts),
      we(static_cast<std::size_t>(local_experts) * hidden * hidden);
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < hidden; ++h) x[static_cast<std::size_t>(t) * hidden + h] = x_of(rank, t, h);
  for (int h = 0; h < hidden; ++h)
    for (int e = 0; e < experts; ++e) wr[h * experts + e] = router_of(h, e);
  for (int j = 0; j < local_experts; ++j)
    for (int i = 0; i < hidden; ++i)
      for (int o = 0; o < hidden; ++o)
        we[(static_cast<std::size_t>(j) * hidden + i) * hidden + o] =
            expert_w(rank * local_experts + j, i, o);

  // At most every token of both ranks with both slots on this rank's experts.
  coccl::moe::Dispatcher moe(comm, {tokens, hidden, coccl::DataType::float32, top_k, experts, 0});
  float *dx, *dwr, *dwe, *dy, *dout, *dweights;
  std::int32_t* didx;
  CHECK(device_alloc(&dx, x.size() * 4));
  CHECK(device_alloc(&dwr, wr.size() * 4));
  CHECK(device_alloc(&dwe, we.size() * 4));
  CHECK(device_alloc(&dy, moe.capacity() * hidden * 4));
  CHECK(device_alloc(&dout, x.size() * 4));
  CHECK(device_alloc(&dweights, tokens * top_k * 4));
  CHECK(device_alloc(&didx, tokens * top_k * 4));
  CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dwr, wr.data(), wr.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dwe, we.data(), we.size() * 4, cudaMemcpyHostToDevice));

  // The layer: router, dispatch, experts, combine, all on one stream.
  example::route(dx, dwr, tokens, hidden, experts, top_k, didx, dweights, st);
  const coccl::moe::Received got = moe.dispatch(dx, tokens, didx, cs);
  example::run_experts(static_cast<const float*>(got.x),
                       reinterpret_cast<const std::int32_t*>(got.rows), got.expert_offsets,
                       got.local_experts, got.first_expert, got.capacity, dwe, dy, hidden, st);
  moe.combine(dy, dweights, dout, cs);

  std::vector<float> out(x.size());
  CHECK(cudaMemcpyAsync(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost, st));
  CHECK(cudaStreamSynchronize(st));
  std::string why;
  if (moe.device_status(&why)) {
    std::fprintf(stderr, "rank %d: %s\n", rank, why.c_str());
    return 1;
  }
  const std::vector<float> want = reference(rank);
  for (std::size_t i = 0; i < out.size(); ++i)
    worst = std::max(
        worst, static_cast<double>(std::fabs(out[i] - want[i]) / (1e-3f + std::fabs(want[i]))));
  std::printf(
      "rank %d: %d tokens, %d rows received for experts %d..%d, device arena %.2f MiB\n", rank,
      tokens,
      [&] {
        std::int32_t total = 0;
        cudaMemcpy(&total, got.expert_offsets + got.local_experts, 4, cudaMemcpyDeviceToHost);
        return total;
      }(),
      got.first_expert, got.first_expert + got.local_experts - 1,
      static_cast<double>(moe.device_bytes()) / (1 << 20));
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dwr), static_cast<void*>(dwe),
                  static_cast<void*>(dy), static_cast<void*>(dout), static_cast<void*>(dweights),
                  static_cast<void*>(didx)})
    cudaFree(p);
  cudaStreamDestroy(st);
  return 0;
}

int run_rank(int rank, const coccl::UniqueId& id, double& worst) {
  CHECK(cudaSetDevice(rank));
  auto comm = coccl::Communicator::create(id, rank, nranks);
  // The dispatcher (inside run_layer) is gone before the communicator: its destruction is
  // collective.
  const int rc = run_layer(rank, comm, worst);
  comm.destroy();
  return rc;
}

}  // namespace

int main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < nranks) {
    std::printf("moe_layer: needs %d GPUs, found %d; skipped\n", nranks, gpus);
    return 77;
  }
  const auto id = coccl::UniqueId::create();
  int rc[nranks] = {1, 1};
  double worst[nranks] = {0, 0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < nranks; ++r)
    ranks.emplace_back([&, r] { rc[r] = run_rank(r, id, worst[r]); });
  for (auto& t : ranks) t.join();
  const double err = std::max(worst[0], worst[1]);
  // The router's softmax uses expf on the GPU and std::exp here; everything else rounds the same
  // way in the same order, so the results agree to a few float ulps.
  const bool ok = rc[0] == 0 && rc[1] == 0 && err < 1e-3;
  std::printf("moe_layer: %s (largest relative difference from the reference %.2e)\n",
              ok ? "matches the reference" : "FAILED", err);
  return ok ? 0 : 1;
}
