// The device side of coccl::moe: one arena per object and rank, mapped by every peer (CUDA IPC
// across processes, peer access between GPUs of one process), and host-mapped error words.
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "collectives/comm.hpp"
#include "collectives/moe_state.hpp"
#include "collectives/peer_memory.hpp"
#include "transport/bootstrap.hpp"

namespace coccl::moe::detail {

struct DeviceArena {
  Communicator comm;  // for the barrier before the arena is freed
  int device = -1;
  std::size_t bytes = 0;
  char* base = nullptr;
  std::vector<void*> opened;  // IPC mappings to close
  kernels::moe::Arenas arenas{};
  unsigned* errors = nullptr;  // host memory mapped into the device, error_kinds words
};

void DeviceArenaDeleter::operator()(DeviceArena* a) const noexcept {
  if (a == nullptr) return;
  int current = -1;
  cudaGetDevice(&current);
  cudaSetDevice(a->device);
  cudaDeviceSynchronize();
  // A peer's last signals into this arena (all_to_allv's "consumed" flags) may still be on the
  // way when this rank's kernel has finished; after the barrier every rank's kernels are done.
  // A failed communicator cannot synchronise: its peers are gone or stopping anyway.
  try {
    a->comm.barrier();
  } catch (const std::exception&) {
  }
  for (void* p : a->opened) cudaIpcCloseMemHandle(p);
  if (a->base) cudaFree(a->base);
  if (a->errors) cudaFreeHost(a->errors);
  if (current >= 0) cudaSetDevice(current);
  delete a;
}

namespace {

[[noreturn]] void fail(errc e, const std::string& why) {
  throw std::system_error(make_error_code(e), "coccl::moe: " + why);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(errc::cuda_error, std::string(what) + ": " + cudaGetErrorString(e));
}

constexpr std::size_t status_at = 64;

void on_arena_device(const DeviceArena& a) {
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != a.device) {
    fail(errc::invalid_argument, "current GPU " + std::to_string(current) +
                                     " is not the GPU the object was prepared on (" +
                                     std::to_string(a.device) + ")");
  }
}

void launched(int rc, const char* what) {
  if (rc == cudaErrorInvalidValue)
    fail(errc::invalid_argument, std::string(what) + ": invalid arguments");
  if (rc != 0) check(static_cast<cudaError_t>(rc), what);
}

}  // namespace

DeviceArenaPtr make_arena(Communicator& comm, std::size_t bytes) {
  const int n = comm.size(), me = comm.rank();
  if (n > device::max_ranks) {
    fail(errc::unsupported, "device exchange supports up to " + std::to_string(device::max_ranks) +
                                " GPUs of one host");
  }
  DeviceArenaPtr a(new DeviceArena);
  check(cudaGetDevice(&a->device), "cudaGetDevice");
  a->comm = comm;
  a->bytes = bytes;
  void* base = nullptr;
  check(cudaMalloc(&base, bytes), "cudaMalloc of the exchange arena");
  a->base = static_cast<char*>(base);
  check(cudaMemset(base, 0, bytes), "cudaMemset");
  // The error words, then the kernels' Status, in one mapped allocation.
  static_assert(kernels::moe::error_kinds * sizeof(unsigned) <= status_at);
  void* errors = nullptr;
  check(cudaHostAlloc(&errors, status_at + sizeof(device::Status),
                      cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc");
  a->errors = static_cast<unsigned*>(errors);
  std::memset(a->errors, 0, status_at + sizeof(device::Status));
  a->arenas.status = reinterpret_cast<device::Status*>(static_cast<char*>(errors) + status_at);
  a->arenas.timeout_ns = coccl::detail::kernel_timeout_ns();
  // Loaded now: with lazy loading a first launch waits for the device to go idle, which a peer
  // kernel spinning on this GPU for a rank driven by the same thread would prevent.
  check(static_cast<cudaError_t>(kernels::moe::load_moe()), "loading the MoE kernels");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  coccl::detail::PeerAdvert mine{};
  // The communicator's host identity (COCCL_HOSTID where set), as the device workspace uses.
  check(coccl::detail::advertise(base, a->device, transport::host_hash(), mine),
        "cudaIpcGetMemHandle");
  std::vector<coccl::detail::PeerAdvert> all(n);
  comm.all_gather(&mine, all.data(), sizeof(coccl::detail::PeerAdvert), DataType::uint8);
  a->arenas.rank = me;
  a->arenas.nranks = n;
  for (int p = 0; p < n; ++p) {
    if (p == me) {
      a->arenas.peer[p] = a->base;
      continue;
    }
    if (all[p].host != mine.host)
      fail(errc::unsupported, "rank " + std::to_string(p) + " is on another host");
    void* mapped = nullptr;
    bool ipc = false;
    check(coccl::detail::map_peer(mine, all[p], &mapped, &ipc),
          ("mapping the arena of rank " + std::to_string(p)).c_str());
    if (ipc) a->opened.push_back(mapped);
    a->arenas.peer[p] = static_cast<char*>(mapped);
  }
  // No rank launches before every arena is zeroed and mapped.
  comm.barrier();
  return a;
}

std::size_t arena_bytes(const DeviceArena& a) noexcept { return a.bytes; }

char* arena_base(DeviceArena& a) noexcept { return a.base; }

void launch_a2av(DeviceArena& a, kernels::moe::A2av args, cuda_stream stream) {
  on_arena_device(a);
  launched(kernels::moe::all_to_allv(args, a.arenas, a.errors, stream), "all_to_allv");
}

void launch_dispatch(DeviceArena& a, const kernels::moe::MoeShape& shape, const void* x, int tokens,
                     const std::int32_t* topk_idx, cuda_stream stream) {
  on_arena_device(a);
  launched(kernels::moe::dispatch(shape, x, tokens, topk_idx, a.arenas, a.errors, stream),
           "dispatch");
}

void launch_combine(DeviceArena& a, const kernels::moe::MoeShape& shape, const void* y,
                    const float* weights, void* out, int tokens, cuda_stream stream) {
  on_arena_device(a);
  launched(kernels::moe::combine(shape, y, weights, out, tokens, a.arenas, stream), "combine");
}

namespace {

// Reads and clears the error words into a text.
std::error_code take_words(volatile unsigned* words, std::string* what) {
  static const char* const names[kernels::moe::error_kinds] = {
      "a send count above max_count (sent clamped to max_count)",
      "a negative send count (sent as 0)",
      "more rows for a rank than its capacity (rows past it dropped)",
      "an expert id outside [-1, num_experts) (treated as -1)",
  };
  std::string text;
  for (int i = 0; i < kernels::moe::error_kinds; ++i) {
    if (words[i] == 0) continue;
    words[i] = 0;
    if (!text.empty()) text += "; ";
    text += names[i];
  }
  if (text.empty()) return {};
  if (what) *what = text;
  return make_error_code(errc::invalid_argument);
}

}  // namespace

bool spans_hosts(const Communicator& comm) {
  auto impl = coccl::detail::impl_of(comm);
  return impl && !impl->one_host();
}

void prepare_a2av_net(A2avState& s) {
  if (!s.net_errors) {
    void* p = nullptr;
    check(cudaHostAlloc(&p, kernels::moe::error_kinds * sizeof(unsigned),
                        cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc of the error words");
    std::memset(p, 0, kernels::moe::error_kinds * sizeof(unsigned));
    s.net_errors =
        std::shared_ptr<unsigned>(static_cast<unsigned*>(p), [](unsigned* w) { cudaFreeHost(w); });
  }
  auto impl = coccl::detail::impl_of(s.comm);
  if (auto ec = coccl::detail::prepare_device(impl))
    fail(
        static_cast<errc>(ec.value()),
        "all_to_allv across hosts: " + (impl && impl->error() ? impl->last_error() : ec.message()));
}

void launch_a2av_net(A2avState& s, const kernels::moe::A2av& args, cuda_stream stream) {
  prepare_a2av_net(s);
  void* words = nullptr;
  check(cudaHostGetDevicePointer(&words, s.net_errors.get(), 0), "cudaHostGetDevicePointer");
  kernels::NetA2av a{};
  a.send = static_cast<const char*>(args.send);
  a.send_counts = args.send_counts;
  a.send_displs = args.send_displs;
  a.recv = static_cast<char*>(args.recv);
  a.recv_counts = args.recv_counts;
  a.recv_displs = args.recv_displs;
  a.counts64 = args.counts64;
  a.max_count = args.max_count;
  a.elem_bytes = static_cast<std::uint32_t>(args.elem_bytes);
  a.nranks = s.comm.size();
  a.errors = static_cast<unsigned*>(words);
  auto impl = coccl::detail::impl_of(s.comm);
  if (auto ec = coccl::detail::enqueue_device_a2av(impl, a, stream)) {
    fail(
        static_cast<errc>(ec.value()),
        "all_to_allv across hosts: " + (impl && impl->error() ? impl->last_error() : ec.message()));
  }
}

std::error_code take_net_errors(A2avState& s, std::string* what) {
  auto impl = coccl::detail::impl_of(s.comm);
  if (impl) {
    if (std::error_code ec = impl->error()) {
      if (what) *what = impl->last_error();
      return ec;
    }
  }
  return take_words(s.net_errors.get(), what);
}

std::error_code take_errors(DeviceArena& a, std::string* what) {
  // A kernel that gave up a wait leaves the arenas out of step between ranks: the object is
  // unusable from then on, so this is reported every time.
  const volatile device::Status* st = a.arenas.status;
  if (const std::uint32_t why = st->error; why != 0) {
    if (what) {
      *what = std::string(why == device::Status::timed_out ? "timed out" : "aborted") + " in " +
              device::op_name(st->op) + " (block " + std::to_string(st->block) + ") after " +
              std::to_string(st->waited_ns / 1000000) + " ms waiting for rank " +
              std::to_string(st->peer);
    }
    return make_error_code(why == device::Status::timed_out ? errc::timed_out : errc::aborted);
  }
  return take_words(a.errors, what);
}

}  // namespace coccl::moe::detail
