// coccl-init-bench's device runs (see init_bench_device.hpp).
#include "init_bench_device.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include "init_gate.hpp"
#include "nccl_runtime.hpp"

namespace coccl_init_bench {

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

constexpr int nccl_float32 = 7;
constexpr int nccl_sum = 0;

}  // namespace

bool device_runs_built() { return true; }

int device_rank_main(int rank, int n, const std::string& dir, const std::string& lib) {
  namespace gate = coccl_init_gate;
  using coccl_tools::Nccl;
  try {
    int gpus = 0;
    cuda_ok(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
    cuda_ok(cudaSetDevice(rank % gpus), "cudaSetDevice");
    // The CUDA context and the buffer exist before the clock starts: only the library is timed.
    void* buf = nullptr;
    cuda_ok(cudaMalloc(&buf, sizeof(float)), "cudaMalloc");
    const float one = 1;
    cuda_ok(cudaMemcpy(buf, &one, sizeof one, cudaMemcpyHostToDevice), "cudaMemcpy");
    cudaStream_t st;
    cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    Nccl nccl;
    if (!nccl.load(lib.c_str())) throw std::runtime_error("cannot load " + lib);
    coccl_tools::NcclId id{};
    const std::string id_path = dir + "/id";
    if (rank == 0) {
      Nccl::ok(nccl.get_unique_id(&id), "ncclGetUniqueId");
      std::ofstream(id_path + ".tmp", std::ios::binary).write(id.internal, sizeof id.internal);
      if (std::rename((id_path + ".tmp").c_str(), id_path.c_str()) != 0)
        throw std::runtime_error("cannot write " + id_path);
    }
    // Rank 0 wrote the id before saying it is ready, so it is there once the gate opens.
    gate::wait_for_go(dir, rank);
    if (rank != 0) {
      std::ifstream f(id_path, std::ios::binary);
      if (!f.read(id.internal, sizeof id.internal)) throw std::runtime_error("no id in " + dir);
    }
    const double t0 = gate::now_us();
    coccl_tools::nccl_comm comm = nullptr;
    Nccl::ok(nccl.init_rank(&comm, n, id, rank), "ncclCommInitRank");
    Nccl::ok(nccl.all_reduce(buf, buf, 1, nccl_float32, nccl_sum, comm, st), "ncclAllReduce");
    cuda_ok(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    float got = 0;
    cuda_ok(cudaMemcpy(&got, buf, sizeof got, cudaMemcpyDeviceToHost), "cudaMemcpy");
    const double t1 = gate::now_us();
    gate::write_result(dir, rank, t0, t1, got == static_cast<float>(n));
    nccl.destroy(comm);
    cudaStreamDestroy(st);
    cudaFree(buf);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coccl-init-bench device rank %d (%s): %s\n", rank, lib.c_str(), e.what());
    return 1;
  }
}

}  // namespace coccl_init_bench
