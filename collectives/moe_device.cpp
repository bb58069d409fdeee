// The device side of coccl::moe: one arena per object and rank, mapped by every peer (CUDA IPC
// across processes, peer access between GPUs of one process), and host-mapped error words.
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <vector>

#include "collectives/comm.hpp"
#include "collectives/device_timeout.hpp"
#include "collectives/moe_state.hpp"
#include "transport/bootstrap.hpp"
#include "transport/peer_memory.hpp"

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
  for (void* p : a->opened) transport::unmap_peer(p);
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

  transport::PeerAdvert mine{};
  // The communicator's host identity (COCCL_HOSTID where set), as the device workspace uses.
  check(transport::advertise(base, a->device, transport::host_hash(), mine), "cudaIpcGetMemHandle");
  std::vector<transport::PeerAdvert> all(n);
  comm.all_gather(&mine, all.data(), sizeof(transport::PeerAdvert), DataType::uint8);
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
    check(transport::map_peer(mine, all[p], &mapped, &ipc),
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

// ---- Dispatcher across hosts ----

struct NetDispatch {
  int device = -1;
  kernels::moe::NetMoe m{};
  unsigned* errors = nullptr;  // host side of m.errors
};

void NetDispatchDeleter::operator()(NetDispatch* n) const noexcept {
  if (n == nullptr) return;
  // Only this rank's kernels use the buffer (peers reach it through the network all_to_allv,
  // whose kernels are on the same stream), so finishing the local work is enough.
  int current = -1;
  cudaGetDevice(&current);
  cudaSetDevice(n->device);
  cudaDeviceSynchronize();
  if (n->m.base) cudaFree(n->m.base);
  if (n->errors) cudaFreeHost(n->errors);
  if (current >= 0) cudaSetDevice(current);
  delete n;
}

NetDispatchPtr make_net_dispatch(Communicator& comm, const kernels::moe::MoeShape& shape) {
  NetDispatchPtr n(new NetDispatch);
  kernels::moe::NetMoe& m = n->m;
  m.shape = shape;
  if (!kernels::moe::net_moe_layout(shape, m.L))
    fail(errc::invalid_argument, "invalid dispatch shape across hosts");
  m.rank = comm.rank();
  check(cudaGetDevice(&n->device), "cudaGetDevice");
  auto impl = coccl::detail::impl_of(comm);
  // The communicator's network path (lanes, staging, proxy): collective.
  if (auto ec = coccl::detail::prepare_device(impl))
    fail(static_cast<errc>(ec.value()),
         "dispatch across hosts: " + (impl && impl->error() ? impl->last_error() : ec.message()));
  void* base = nullptr;
  check(cudaMalloc(&base, m.L.total), "cudaMalloc of the dispatch buffer");
  m.base = static_cast<char*>(base);
  check(cudaMemset(base, 0, m.L.total), "cudaMemset");
  const int nr = shape.nranks;
  std::vector<std::int64_t> starts(2 * static_cast<std::size_t>(nr));
  for (int q = 0; q < nr; ++q) {
    starts[q] = static_cast<std::int64_t>(q * m.L.per_peer);
    starts[nr + q] = static_cast<std::int64_t>(q * m.L.per_peer + m.L.head);
  }
  auto* counts = reinterpret_cast<std::int64_t*>(m.base + m.L.counts);
  check(cudaMemcpy(counts + kernels::moe::segment_start * nr, starts.data(), nr * 8,
                   cudaMemcpyHostToDevice),
        "cudaMemcpy");
  check(cudaMemcpy(counts + kernels::moe::rows_start * nr, starts.data() + nr, nr * 8,
                   cudaMemcpyHostToDevice),
        "cudaMemcpy");
  void* words = nullptr;
  check(cudaHostAlloc(&words, kernels::moe::error_kinds * sizeof(unsigned),
                      cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc of the error words");
  n->errors = static_cast<unsigned*>(words);
  std::memset(words, 0, kernels::moe::error_kinds * sizeof(unsigned));
  check(cudaHostGetDevicePointer(&words, n->errors, 0), "cudaHostGetDevicePointer");
  m.errors = static_cast<unsigned*>(words);
  check(static_cast<cudaError_t>(kernels::moe::load_net_moe()), "loading the MoE kernels");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return n;
}

std::size_t net_dispatch_bytes(const NetDispatch& n) noexcept { return n.m.L.total; }

char* net_dispatch_base(NetDispatch& n) noexcept { return n.m.base; }

namespace {

void on_device(const NetDispatch& n) {
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != n.device) {
    fail(errc::invalid_argument, "current GPU " + std::to_string(current) +
                                     " is not the GPU the object was prepared on (" +
                                     std::to_string(n.device) + ")");
  }
}

// The network all_to_allv of whole elements (record + row) from area `from` to area `to`.
void exchange(NetDispatch& n, Communicator& comm, std::size_t from, int send_counts,
              int send_displs, std::size_t to, int recv_counts, int recv_displs,
              cuda_stream stream) {
  const kernels::moe::NetMoe& m = n.m;
  auto* counts = reinterpret_cast<std::int64_t*>(m.base + m.L.counts);
  const int nr = m.shape.nranks;
  kernels::NetA2av a{};
  a.send = m.base + from;
  a.send_counts = counts + send_counts * nr;
  a.send_displs = counts + send_displs * nr;
  a.recv = m.base + to;
  a.recv_counts = counts + recv_counts * nr;
  a.recv_displs = counts + recv_displs * nr;
  a.counts64 = true;
  a.max_count = m.L.per_peer;
  a.elem_bytes = static_cast<std::uint32_t>(m.L.elem);
  a.nranks = nr;
  a.errors = m.errors;
  auto impl = coccl::detail::impl_of(comm);
  if (auto ec = coccl::detail::enqueue_device_a2av(impl, a, stream)) {
    fail(static_cast<errc>(ec.value()),
         "exchange across hosts: " + (impl && impl->error() ? impl->last_error() : ec.message()));
  }
}

}  // namespace

void net_dispatch(NetDispatch& n, Communicator& comm, const void* x, int tokens,
                  const std::int32_t* topk_idx, cuda_stream stream) {
  namespace k = kernels::moe;
  on_device(n);
  auto* s = reinterpret_cast<CUstream_st*>(stream);
  launched(k::net_dispatch_pack(n.m, x, tokens, topk_idx, s), "dispatch");
  exchange(n, comm, n.m.L.send, k::dispatch_send, k::segment_start, n.m.L.recv, k::dispatch_recv,
           k::segment_start, stream);
  launched(k::net_dispatch_place(n.m, s), "dispatch");
}

void net_combine(NetDispatch& n, Communicator& comm, const void* y, const float* weights, void* out,
                 int tokens, cuda_stream stream) {
  namespace k = kernels::moe;
  on_device(n);
  auto* s = reinterpret_cast<CUstream_st*>(stream);
  launched(k::net_combine_pack(n.m, y, s), "combine");
  exchange(n, comm, n.m.L.recv, k::combine_send, k::rows_start, n.m.L.send, k::combine_recv,
           k::rows_start, stream);
  launched(k::net_combine_sum(n.m, weights, out, tokens, s), "combine");
}

std::error_code take_net_dispatch_errors(NetDispatch& n, Communicator& comm, std::string* what) {
  auto impl = coccl::detail::impl_of(comm);
  if (impl) {
    if (std::error_code ec = impl->error()) {
      if (what) *what = impl->last_error();
      return ec;
    }
  }
  return take_words(n.errors, what);
}

}  // namespace coccl::moe::detail
