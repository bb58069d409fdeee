// Device-memory collectives. On the GPUs of one host: a workspace per rank mapped by every peer
// (CUDA IPC across processes, peer access within one) and peer kernels enqueued on the caller's
// stream. Across hosts: a staging kernel and the communicator's proxy (net_device.cpp). Either
// way, CUDA events polled by the proxy thread for the awaitable forms.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>

#include "collectives/comm.hpp"
#include "collectives/comm_params.hpp"
#include "collectives/device_budget.hpp"
#include "collectives/device_params.hpp"
#include "collectives/device_timeout.hpp"
#include "collectives/net_device.hpp"
#include "kernels/launch.hpp"
#include "runtime/engine.hpp"
#include "runtime/handoff.hpp"
#include "runtime/log.hpp"
#include "transport/peer_memory.hpp"

namespace coccl::params {

config::Param<std::int64_t> device_oneshot_max{
    "COCCL_DEVICE_ONESHOT_MAX", 512 << 10,
    "largest device all_reduce (bytes per rank) run by the one-shot LL kernel; sizes the "
    "workspace, so every rank must use the same value"};
config::Param<bool> dependent_launch{
    "COCCL_DEPENDENT_LAUNCH", true,
    "launch device kernels with programmatic dependent launch (Hopper): a kernel starts while "
    "the previous one in the stream finishes and waits on the device for it"};
config::Param<std::int64_t> device_comms{
    "COCCL_DEVICE_COMMS", 2,
    "communicators a rank may have working on its GPU at once (data and tensor parallel: 2); "
    "each device kernel takes at most 1/(this x ranks sharing the GPU x 2) of the GPU so that "
    "all of them fit together; the count of this process's communicators on the GPU raises it"};

}  // namespace coccl::params

namespace coccl::detail {
namespace {

// Communicators of this process with a workspace, per GPU (by UUID): part of the block budget.
std::mutex gpu_users_mutex;
std::map<decltype(GpuShare::gpu), int> gpu_users;

struct DeviceState {
  int device = -1;
  std::optional<decltype(GpuShare::gpu)> gpu;  // the device's UUID, once counted in gpu_users
  void* workspace = nullptr;
  device::Status* status = nullptr;  // mapped host memory, read by the host, written by kernels
  std::vector<void*> peers;
  std::vector<void*> opened;  // IPC mappings to close
  device::Workspace ws;
  // Set when the ranks span hosts: every operation goes through the network proxy.
  std::shared_ptr<NetDevice> net;
  // Hosts of several ranks each (the same number everywhere): the ranks of this host (NVLink
  // kernels) and this rank's rail, one rank of each host with the same local index (the network).
  // `blocked`: rank = host * local size + local index, which the hierarchical all_gather and
  // reduce_scatter need for their layout.
  std::shared_ptr<CommImpl> local, rail;
  bool blocked = false;
  // Device scratch of the hierarchical all_gather and reduce_scatter; earlier, smaller ones stay
  // until the communicator goes, as captured graphs may still use them.
  std::vector<void*> scratch;
  std::size_t scratch_bytes = 0;

  // Call order (enqueue_device): every launch of the communicator runs after the previous one,
  // whichever stream each was issued on. Guarded by order_mutex, which also keeps the launches
  // of several user threads in one order.
  // Eager operations form one chain, the operations of the graph being captured another: a
  // graph's work is ordered with eager work by the stream it is launched on.
  struct Chain {
    cudaEvent_t done = nullptr;  // recorded after the chain's last operation
    cudaStream_t stream = nullptr;
    bool any = false;
    unsigned long long capture = 0;  // the capture's id (captured chain)
  };
  std::mutex order_mutex;
  Chain eager, captured;
  std::atomic<std::uint64_t> launches{0};  // ws.seq of the last operation
  // The operation of each recent sequence number, for the error a kernel reports by number
  // (read by any thread that asks for the communicator's error).
  std::array<std::atomic<OpKind>, 256> recent{};

  // CollTrace of device operations (Communicator::status): a ring of recent launches, each eager
  // one with an event recorded after it. The eager chain runs them one after another, so one whose
  // predecessor's event has fired has started. Its own mutex: status() runs on the proxy thread,
  // which a launch holding order_mutex may be waiting for.
  struct Traced {
    std::uint64_t seq = 0;
    OpKind kind{};
    std::uint64_t count = 0;
    int type = 0, root = 0;
    bool captured = false;
    bool recorded = false;  // `done` was recorded for this launch
    cudaEvent_t done = nullptr;
    std::chrono::steady_clock::time_point at{};
  };
  std::mutex trace_mutex;
  std::vector<Traced> traced;
  std::uint64_t traced_count = 0;

  ~DeviceState() {
    for (Traced& t : traced)
      if (t.done) cudaEventDestroy(t.done);
    for (void* p : scratch) cudaFree(p);
    for (Chain* ch : {&eager, &captured})
      if (ch->done) cudaEventDestroy(ch->done);
    for (void* p : opened) transport::unmap_peer(p);
    if (workspace) cudaFree(workspace);
    if (status) cudaFreeHost(status);
    if (gpu) {
      std::lock_guard lock(gpu_users_mutex);
      if (--gpu_users[*gpu] == 0) gpu_users.erase(*gpu);
    }
  }
};

// What each rank tells the others about its workspace and its GPU.
struct Advert {
  transport::PeerAdvert memory;
  std::uint64_t oneshot_max;  // shapes the workspace: must agree
  GpuShare share;             // for the block budget
};

// Adds a launch to the device trace; `s` is its stream (order_mutex held). A failure to record
// only loses the entry's progress: the trace must never fail an operation.
void trace_launch(DeviceState& d, OpKind kind, std::uint64_t count, DataType type, int root,
                  cudaStream_t s, bool captured) {
  std::lock_guard lock(d.trace_mutex);
  if (d.traced.empty()) return;
  DeviceState::Traced& t = d.traced[d.traced_count++ % d.traced.size()];
  t.seq = d.ws.seq;
  t.kind = kind;
  t.count = count;
  t.type = static_cast<int>(type);
  t.root = root;
  t.captured = captured;
  t.at = std::chrono::steady_clock::now();
  t.recorded = false;
  if (captured) return;
  if (!t.done && cudaEventCreateWithFlags(&t.done, cudaEventDisableTiming) != cudaSuccess) {
    t.done = nullptr;
    return;
  }
  t.recorded = cudaEventRecord(t.done, s) == cudaSuccess;
}

std::vector<TraceEntry> device_trace(DeviceState& d) {
  std::lock_guard lock(d.trace_mutex);
  const std::size_t n = std::min<std::uint64_t>(d.traced_count, d.traced.size());
  // A kernel that gave up a wait reported its launch: that one and later ones did not complete.
  const std::uint32_t why =
      std::atomic_ref<std::uint32_t>(d.status->error).load(std::memory_order_acquire);
  const std::uint64_t failed_from = why != 0 ? d.status->seq : ~0ull;
  const auto now = std::chrono::steady_clock::now();
  std::vector<TraceEntry> out;
  out.reserve(n);
  bool before_done = true;  // the oldest entry's predecessor is out of the ring: long finished
  for (std::size_t i = 0; i < n; ++i) {
    const DeviceState::Traced& t = d.traced[(d.traced_count - n + i) % d.traced.size()];
    TraceEntry e;
    e.seq = t.seq;
    e.device = true;
    e.op = name_of(t.kind);
    e.count = t.count;
    e.type = t.type;
    e.root = t.root;
    e.us = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(now - t.at).count());
    if (t.captured) {
      e.state = TraceEntry::State::captured;
    } else {
      const bool done = t.recorded && cudaEventQuery(t.done) == cudaSuccess;
      if (t.seq >= failed_from)
        e.state = TraceEntry::State::failed;
      else if (done)
        e.state = TraceEntry::State::done;
      else
        e.state = before_done ? TraceEntry::State::started : TraceEntry::State::enqueued;
      before_done = done;
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::error_code cuda_error(CommImpl& c, cudaError_t e, const std::string& what) {
  std::string text = what + ": " + cudaGetErrorString(e);
  COCCL_WARN(p2p, c.rank(), "%s", text.c_str());
  c.fail(make_error_code(errc::cuda_error), text);
  return make_error_code(errc::cuda_error);
}

// A communicator of the ranks with `color`, ordered by `key` (collective over `self`, blocking):
// the first member makes the root, the parent's all_gathers spread the groups and the id.
std::shared_ptr<CommImpl> split_blocking(const std::shared_ptr<CommImpl>& self, int color, int key,
                                         std::error_code& ec) {
  const int n = self->size(), me = self->rank();
  std::vector<std::int64_t> mine{color, key}, all(2 * static_cast<std::size_t>(n));
  OpArgs gather;
  gather.kind = OpKind::all_gather;
  gather.send = mine.data();
  gather.recv = all.data();
  gather.count = 2;
  gather.type = DataType::int64;
  run_blocking(self, OpArgs(gather), ec);
  if (ec) return nullptr;
  std::vector<int> members;
  for (int r = 0; r < n; ++r)
    if (all[2 * r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  auto engine = runtime::Engine::instance();
  UniqueId id{};
  if (members.front() == me) id = unique_id_on(*engine);
  std::vector<std::uint8_t> ids(static_cast<std::size_t>(n) * id.bytes.size());
  gather.send = id.bytes.data();
  gather.recv = ids.data();
  gather.count = id.bytes.size();
  gather.type = DataType::uint8;
  run_blocking(self, OpArgs(gather), ec);
  if (ec) return nullptr;
  std::memcpy(id.bytes.data(), ids.data() + members.front() * id.bytes.size(), id.bytes.size());
  const int rank =
      static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  return join_on(engine, id, rank, static_cast<int>(members.size()), ec);
}

// With hosts of equally many ranks (more than one), the sub-communicators of the hierarchical
// algorithms (collective over `self`).
std::error_code make_hierarchy(CommImpl& c, const std::shared_ptr<CommImpl>& self, DeviceState& st,
                               const std::vector<std::uint64_t>& host_of_rank) {
  const int n = c.size();
  std::vector<std::uint64_t> hosts;  // in order of first rank
  std::vector<int> host_of(n), local_of(n), per_host;
  for (int r = 0; r < n; ++r) {
    auto it = std::find(hosts.begin(), hosts.end(), host_of_rank[r]);
    const int h = static_cast<int>(it - hosts.begin());
    if (it == hosts.end()) {
      hosts.push_back(host_of_rank[r]);
      per_host.push_back(0);
    }
    host_of[r] = h;
    local_of[r] = per_host[h]++;
  }
  const int L = per_host[0];
  if (L < 2 || hosts.size() < 2 ||
      std::any_of(per_host.begin(), per_host.end(), [&](int k) { return k != L; }))
    return {};
  std::error_code ec;
  st.local = split_blocking(self, host_of[c.rank()], c.rank(), ec);
  if (!ec) st.rail = split_blocking(self, local_of[c.rank()], c.rank(), ec);
  if (ec) {
    st.local.reset();
    st.rail.reset();
    return ec;
  }
  st.blocked = true;
  for (int r = 0; r < n; ++r) st.blocked = st.blocked && r == host_of[r] * L + local_of[r];
  COCCL_INFO(p2p, c.rank(), "hierarchical device collectives: %zu hosts of %d ranks%s",
             hosts.size(), L, st.blocked ? "" : " (all_reduce only: ranks not grouped by host)");
  return {};
}

// Makes the device state on first use: collective over the communicator.
std::error_code ensure_device(CommImpl& c, const std::shared_ptr<CommImpl>& self,
                              DeviceState*& out) {
  std::lock_guard lock(c.device_mutex());
  if (c.device_state()) {
    out = static_cast<DeviceState*>(c.device_state().get());
    return {};
  }
  auto st = std::make_shared<DeviceState>();
  const int n = c.size(), me = c.rank();
  // Every rank knows the same host table, so all of them take the same path.
  const bool across_hosts = !c.one_host();
  if (!across_hosts && n > device::max_ranks) {
    COCCL_WARN(p2p, me, "device collectives support up to %d GPUs of one host", device::max_ranks);
    return make_error_code(errc::unsupported);
  }
  if (auto e = cudaGetDevice(&st->device)) return cuda_error(c, e, "cudaGetDevice");
  cudaDeviceProp prop{};
  if (auto e = cudaGetDeviceProperties(&prop, st->device))
    return cuda_error(c, e, "cudaGetDeviceProperties");
  const auto oneshot_max =
      static_cast<std::size_t>(std::max<std::int64_t>(0, params::device_oneshot_max.get()));
  std::size_t bytes = across_hosts ? 0 : device::workspace_bytes(n, oneshot_max);
  if (bytes != 0) {
    if (auto e = cudaMalloc(&st->workspace, bytes)) return cuda_error(c, e, "cudaMalloc workspace");
    if (auto e = cudaMemset(st->workspace, 0, bytes)) return cuda_error(c, e, "cudaMemset");
  }
  void* status = nullptr;
  if (auto e = cudaHostAlloc(&status, sizeof(device::Status),
                             cudaHostAllocMapped | cudaHostAllocPortable))
    return cuda_error(c, e, "cudaHostAlloc of the device status");
  st->status = static_cast<device::Status*>(status);
  std::memset(status, 0, sizeof(device::Status));
  for (DeviceState::Chain* ch : {&st->eager, &st->captured})
    if (auto e = cudaEventCreateWithFlags(&ch->done, cudaEventDisableTiming))
      return cuda_error(c, e, "cudaEventCreate");
  // Now, not at the first launch of each kernel: that may wait for a peer's kernel (see
  // kernels::load_kernels).
  if (int rc = kernels::load_kernels())
    return cuda_error(c, static_cast<cudaError_t>(rc), "loading the kernels");
  if (auto e = cudaDeviceSynchronize()) return cuda_error(c, e, "cudaDeviceSynchronize");
  Advert mine{};
  if (across_hosts)
    mine.memory.host = c.peers().self_info().host_hash;
  else if (auto e = transport::advertise(st->workspace, st->device, c.peers().self_info().host_hash,
                                         mine.memory))
    return cuda_error(c, e, "cudaIpcGetMemHandle");
  mine.oneshot_max = oneshot_max;
  mine.share.host = mine.memory.host;
  std::memcpy(mine.share.gpu.data(), prop.uuid.bytes, mine.share.gpu.size());
  mine.share.capacity = prop.multiProcessorCount * std::max(1, kernels::resident_blocks_per_sm());
  {
    std::lock_guard users(gpu_users_mutex);
    mine.share.comms = ++gpu_users[mine.share.gpu];
  }
  st->gpu = mine.share.gpu;
  std::vector<Advert> all(n);
  OpArgs gather;
  gather.kind = OpKind::all_gather;
  gather.send = &mine;
  gather.recv = all.data();
  gather.count = sizeof(Advert);
  gather.type = DataType::uint8;
  std::error_code ec;
  run_blocking(self, OpArgs(gather), ec);
  if (ec) return ec;
  st->peers.resize(across_hosts ? 0 : n);
  for (int p = 0; p < n && !across_hosts; ++p) {
    if (p == me) {
      st->peers[p] = st->workspace;
      continue;
    }
    if (all[p].oneshot_max != mine.oneshot_max) {
      COCCL_WARN(p2p, me, "COCCL_DEVICE_ONESHOT_MAX differs: %llu here, %llu on rank %d",
                 static_cast<unsigned long long>(mine.oneshot_max),
                 static_cast<unsigned long long>(all[p].oneshot_max), p);
      return make_error_code(errc::invalid_argument);
    }
    if (all[p].memory.host != mine.memory.host) {
      COCCL_WARN(p2p, me, "rank %d is on another host: device collectives need one host", p);
      return make_error_code(errc::unsupported);
    }
    bool ipc = false;
    if (auto e = transport::map_peer(mine.memory, all[p].memory, &st->peers[p], &ipc))
      return cuda_error(c, e, "mapping the workspace of rank " + std::to_string(p));
    if (ipc) st->opened.push_back(st->peers[p]);
  }
  // Nobody launches before every workspace is zeroed and mapped.
  OpArgs barrier;
  barrier.kind = OpKind::barrier;
  run_blocking(self, std::move(barrier), ec);
  if (ec) return ec;
  const bool dependent = params::dependent_launch.get();
  st->ws.peers = across_hosts ? nullptr : st->peers.data();
  st->ws.rank = me;
  st->ws.nranks = n;
  st->ws.oneshot_max_bytes = oneshot_max;
  st->ws.status = st->status;
  st->ws.timeout_ns = kernel_timeout_ns();
  std::vector<GpuShare> shares;
  for (const Advert& a : all) shares.push_back(a.share);
  st->ws.max_grid = block_budget(shares, static_cast<int>(params::device_comms.get()), dependent);
  kernels::set_dependent_launch(dependent);
  DeviceState* raw = st.get();
  st->traced.resize(
      static_cast<std::size_t>(std::max<std::int64_t>(0, params::colltrace_size.get())));
  c.set_device_trace([raw] { return device_trace(*raw); });
  c.set_device_status(st->status, [raw](std::uint64_t seq) {
    // A sequence number older than the ring (a graph captured long ago) has no name here.
    if (seq == 0 || seq + raw->recent.size() <= raw->launches) return "";
    return name_of(raw->recent[seq % raw->recent.size()].load(std::memory_order_relaxed));
  });
  if (across_hosts) {
    if (auto ec = make_net_device(self, st->status, st->net)) return ec;
    std::vector<std::uint64_t> host_of_rank;
    host_of_rank.reserve(all.size());
    for (const Advert& a : all) host_of_rank.push_back(a.memory.host);
    if (auto ec = make_hierarchy(c, self, *st, host_of_rank)) return ec;
    COCCL_INFO(p2p, me,
               "device operations across hosts through the proxy on GPU %d, at most %d "
               "blocks a kernel",
               st->device, st->ws.max_grid);
  } else {
    COCCL_INFO(p2p, me,
               "device workspace %zu bytes on GPU %d, %d peers mapped, at most %d blocks a kernel",
               bytes, st->device, n - 1, st->ws.max_grid);
  }
  c.device_state() = st;
  out = st.get();
  return {};
}

// Polls CUDA events of one communicator on its proxy thread.
class EventPoller final : public runtime::Poller {
 public:
  EventPoller(asio::any_io_executor ex, CommImpl& comm) : ex_(std::move(ex)), comm_(comm) {}
  ~EventPoller() override {
    for (auto& w : waits_) cudaEventDestroy(w.event);
  }
  void add(cudaEvent_t ev, OpHandler h) { waits_.push_back({ev, std::move(h)}); }
  bool poll() override {
    bool progress = false;
    for (auto it = waits_.begin(); it != waits_.end();) {
      cudaError_t e = cudaEventQuery(it->event);
      if (e == cudaErrorNotReady) {
        ++it;
        continue;
      }
      if (e != cudaSuccess) cudaGetLastError();
      cudaEventDestroy(it->event);
      OpHandler h(std::move(it->handler));
      it = waits_.erase(it);
      // The kernels ran to their end, or gave up a wait (a peer that never came, an abort):
      // then the communicator has failed with the reason, which the operation reports.
      std::error_code ec = e == cudaSuccess ? comm_.error() : make_error_code(errc::cuda_error);
      runtime::complete(std::move(h), ec);
      progress = true;
    }
    return progress;
  }
  bool waiting() const override { return !waits_.empty(); }

 private:
  struct Wait {
    cudaEvent_t event;
    OpHandler handler;
  };
  asio::any_io_executor ex_;
  CommImpl& comm_;  // owns this poller
  // A list: erasing one wait must not move the others, because Boost 1.81's
  // any_completion_handler recurses without end in its move assignment (several operations
  // awaited at once on one stream crashed the trainer's 2-rank GPU form).
  std::list<Wait> waits_;
};

}  // namespace

namespace {

// From this size up, a broadcast among more than 2 GPUs is a scatter from the root followed by
// an all_gather: every GPU has its own links into the switch, so the root sends (n-1)/n of the
// message once instead of n-1 copies of all of it, and the others relay the rest. Measured on 4
// H200 (single kernel): 0.91x NCCL at 2 MiB, 0.48x at 16 MiB, 0.36x at 128 MiB.
constexpr std::size_t broadcast_split_min = 4u << 20;

int split_broadcast(const OpArgs& a, std::size_t elt, int rank, int n, const device::Workspace& ws,
                    kernels::stream_t stream) {
  const std::size_t bytes = a.count * elt;
  if (n <= 2 || bytes < broadcast_split_min)
    return kernels::broadcast(a.send, a.recv, bytes, a.root, ws, stream);
  // Pieces of whole 16-byte vectors; the remainder goes with the plain kernel.
  const std::size_t piece = bytes / static_cast<std::size_t>(n) / 16 * 16;
  char* recv = static_cast<char*>(a.recv);
  int rc = kernels::scatter(a.send, recv + rank * piece, piece, 1, a.root, ws, stream);
  if (rc == 0) rc = kernels::all_gather(recv + rank * piece, recv, piece, 1, ws, stream);
  const std::size_t done = piece * static_cast<std::size_t>(n);
  if (rc == 0 && done < bytes) {
    const char* rest = rank == a.root ? static_cast<const char*>(a.send) + done : nullptr;
    rc = kernels::broadcast(rest, recv + done, bytes - done, a.root, ws, stream);
  }
  return rc;
}

// The chain an operation on `s` joins: the eager one, or that of the capture `s` is part of
// (started anew by a new capture). Null when CUDA cannot say.
DeviceState::Chain* chain_of(DeviceState& d, cudaStream_t s, cudaError_t& e) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  e = cudaStreamGetCaptureInfo(s, &capture, &id);
  if (e != cudaSuccess) return nullptr;
  if (capture != cudaStreamCaptureStatusActive) return &d.eager;
  if (!d.captured.any || d.captured.capture != id) {
    d.captured.any = false;
    d.captured.capture = id;
  }
  return &d.captured;
}

// Makes `s` wait for the chain's previous operation when that ran on another stream (inside a
// capture the wait joins two captured streams into the graph's order).
cudaError_t after_last(const DeviceState::Chain& ch, cudaStream_t s) {
  if (!ch.any || ch.stream == s) return cudaSuccess;
  return cudaStreamWaitEvent(s, ch.done, 0);
}

int launch(const CommImpl& c, const DeviceState& d, const OpArgs& a, std::size_t elt,
           cuda_stream stream) {
  int rc = 0;
  switch (a.kind) {
    case OpKind::p2p: {
      // Not collective: only the peers named take part (the first device call of the
      // communicator, which makes the workspaces, must still be a collective one).
      kernels::P2p ops[kernels::max_p2p_ops];
      int nops = 0;
      for (const Transfer& o : a.p2p) {
        ops[nops++] = kernels::P2p{o.is_send, o.buffer, o.count * size_of(o.type), o.peer};
      }
      rc = kernels::send_recv(ops, nops, d.ws, stream);
      break;
    }
    case OpKind::all_to_allv: {
      kernels::AllToAllvLayout layout{};
      for (int p = 0; p < c.size(); ++p) {
        layout.send_counts[p] = a.send_counts[p];
        layout.send_displs[p] = a.send_displs[p];
        layout.recv_counts[p] = a.recv_counts[p];
        layout.recv_displs[p] = a.recv_displs[p];
      }
      rc = kernels::all_to_allv(a.send, a.recv, layout, elt, d.ws, stream);
      break;
    }
    case OpKind::barrier:
      break;
    case OpKind::all_reduce:
      rc = a.count * elt <= kernels::oneshot_max_bytes(d.ws)
               ? kernels::all_reduce_oneshot(a.send, a.recv, a.count, a.type, a.op, d.ws, stream)
               : kernels::all_reduce_twoshot(a.send, a.recv, a.count, a.type, a.op, d.ws, stream);
      break;
    case OpKind::broadcast:
      rc = split_broadcast(a, elt, c.rank(), c.size(), d.ws, stream);
      break;
    case OpKind::reduce:
      rc = kernels::reduce_to_root(a.send, a.recv, a.count, a.type, a.op, a.root, d.ws, stream);
      break;
    case OpKind::all_gather:
      rc = kernels::all_gather(a.send, a.recv, a.count, elt, d.ws, stream);
      break;
    case OpKind::reduce_scatter:
      rc = kernels::reduce_scatter(a.send, a.recv, a.count, a.type, a.op, d.ws, stream);
      break;
    case OpKind::all_to_all:
      rc = kernels::all_to_all(a.send, a.recv, a.count, elt, d.ws, stream);
      break;
    case OpKind::gather:
      rc = kernels::gather(a.send, a.recv, a.count, elt, a.root, d.ws, stream);
      break;
    case OpKind::scatter:
      rc = kernels::scatter(a.send, a.recv, a.count, elt, a.root, d.ws, stream);
      break;
  }
  return rc;
}

// From this size up an all_reduce, all_gather or reduce_scatter across hosts of several ranks
// each is hierarchical (COCCL_ALGO=flat or hierarchical forces one way).
constexpr std::size_t hierarchy_min_bytes = 64 * 1024;

bool use_hierarchy(const CommImpl& c, const DeviceState& d, const OpArgs& a, std::size_t elt) {
  if (!d.local) return false;
  const bool fits =
      a.kind == OpKind::all_reduce
          ? a.count >= static_cast<std::size_t>(d.local->size())
          : (a.kind == OpKind::all_gather || a.kind == OpKind::reduce_scatter) && d.blocked;
  if (!fits || c.forced_algo() == "flat") return false;
  return c.forced_algo() == "hierarchical" || a.count * elt >= hierarchy_min_bytes;
}

// Device scratch of at least `bytes` (allocated outside any capture's rules: cudaMalloc is not
// stream work, and a graph keeps using the pointer it captured).
void* scratch_of(CommImpl& c, DeviceState& d, std::size_t bytes, std::error_code& ec) {
  if (bytes > d.scratch_bytes || d.scratch.empty()) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
      ec = cuda_error(c, e, "cudaMalloc of the hierarchical scratch");
      return nullptr;
    }
    d.scratch.push_back(p);
    d.scratch_bytes = bytes;
  }
  return d.scratch.back();
}

// all_reduce: reduce_scatter inside the host (NVLink), all_reduce of the shard across hosts on
// the rail, all_gather inside the host; the elements that do not split evenly go the flat way.
// all_gather: across hosts on the rail into scratch, then one all_gather inside the host per
// host. reduce_scatter: one reduce_scatter inside the host per host into scratch, then across
// hosts on the rail. avg is summed through and divided once at the end, like the reference.
std::error_code hierarchical(CommImpl& c, DeviceState& d, const OpArgs& a, std::size_t elt,
                             cudaStream_t s,
                             const std::function<std::error_code(const OpArgs&)>& flat) {
  const auto cs = reinterpret_cast<cuda_stream>(s);
  const std::size_t L = static_cast<std::size_t>(d.local->size());
  const std::size_t H = static_cast<std::size_t>(d.rail->size());
  const std::size_t lr = static_cast<std::size_t>(d.local->rank());
  OpArgs sum = a;
  if (a.op == ReduceOp::avg) sum.op = ReduceOp::sum;
  const char* send = static_cast<const char*>(a.send);
  char* recv = static_cast<char*>(a.recv);
  std::error_code ec;
  auto step = [&](const std::shared_ptr<CommImpl>& sub, OpKind kind, const void* from, void* to,
                  std::size_t count) {
    if (ec) return;
    OpArgs b = sum;
    b.kind = kind;
    b.send = from;
    b.recv = to;
    b.count = count;
    ec = enqueue_device(sub, b, cs);
  };
  std::size_t out_count = a.count;
  switch (a.kind) {
    case OpKind::all_reduce: {
      const std::size_t shard = a.count / L;
      char* mine = recv + lr * shard * elt;
      step(d.local, OpKind::reduce_scatter, send, mine, shard);
      step(d.rail, OpKind::all_reduce, mine, mine, shard);
      step(d.local, OpKind::all_gather, mine, recv, shard);
      if (!ec && a.count > L * shard) {
        OpArgs rest = sum;
        rest.send = send + L * shard * elt;
        rest.recv = recv + L * shard * elt;
        rest.count = a.count - L * shard;
        ec = flat(rest);
      }
      break;
    }
    case OpKind::all_gather: {
      char* tmp = static_cast<char*>(scratch_of(c, d, H * a.count * elt, ec));
      step(d.rail, OpKind::all_gather, send, tmp, a.count);
      for (std::size_t h = 0; h < H; ++h)
        step(d.local, OpKind::all_gather, tmp + h * a.count * elt, recv + h * L * a.count * elt,
             a.count);
      break;
    }
    case OpKind::reduce_scatter: {
      char* tmp = static_cast<char*>(scratch_of(c, d, H * a.count * elt, ec));
      for (std::size_t h = 0; h < H; ++h)
        step(d.local, OpKind::reduce_scatter, send + h * L * a.count * elt, tmp + h * a.count * elt,
             a.count);
      step(d.rail, OpKind::reduce_scatter, tmp, recv, a.count);
      break;
    }
    default:
      return make_error_code(errc::internal);
  }
  if (!ec && a.op == ReduceOp::avg && a.kind != OpKind::all_gather) {
    if (int rc = kernels::divide_by(recv, out_count, a.type, c.size(), s))
      ec = cuda_error(c, static_cast<cudaError_t>(rc), "divide_by");
  }
  return ec;
}

}  // namespace

std::error_code enqueue_device(const std::shared_ptr<CommImpl>& impl, const OpArgs& a,
                               cuda_stream stream) {
  if (!impl) return make_error_code(errc::aborted);
  CommImpl& c = *impl;
  if (auto ec = c.error()) return ec;
  if (std::string why = validate(a, c.rank(), c.size()); !why.empty()) {
    COCCL_WARN(coll, c.rank(), "%s on device: %s", name_of(a.kind), why.c_str());
    argument_error() = std::string(name_of(a.kind)) + " on device: " + why;
    return make_error_code(errc::invalid_argument);
  }
  if (a.kind == OpKind::barrier) {
    COCCL_WARN(coll, c.rank(), "barrier is not available on device memory");
    return make_error_code(errc::unsupported);
  }
  // Across hosts the staging plan has its own, larger limit (make_net_plan).
  if (c.one_host() && a.kind == OpKind::p2p &&
      a.p2p.size() > static_cast<std::size_t>(kernels::max_p2p_ops)) {
    COCCL_WARN(coll, c.rank(), "send_recv on device takes at most %d transfers a group",
               kernels::max_p2p_ops);
    return make_error_code(errc::unsupported);
  }
  const std::size_t elt = size_of(a.type);
  DeviceState* d = nullptr;
  if (auto ec = ensure_device(c, impl, d)) return ec;
  int current = -1;
  cudaGetDevice(&current);
  if (current != d->device) {
    COCCL_WARN(coll, c.rank(), "current GPU %d is not the communicator's GPU %d", current,
               d->device);
    return make_error_code(errc::invalid_argument);
  }
  // p2p and all_to_allv carry their sizes elsewhere (a.count is 0).
  if (a.count == 0 && a.kind != OpKind::p2p && a.kind != OpKind::all_to_allv) return {};
  std::lock_guard order(d->order_mutex);
  // A kernel that gave up a wait left the workspaces out of step: nothing more may run on them.
  if (auto ec = c.error()) return ec;
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  cudaError_t e = cudaSuccess;
  DeviceState::Chain* chain = chain_of(*d, s, e);
  if (chain == nullptr) return cuda_error(c, e, "cudaStreamGetCaptureInfo");
  if ((e = after_last(*chain, s))) return cuda_error(c, e, "ordering after the previous operation");
  d->ws.seq = ++d->launches;
  d->recent[d->launches % d->recent.size()].store(a.kind, std::memory_order_relaxed);
  if (d->net) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaGraph_t graph = nullptr;
    if ((e = cudaStreamGetCaptureInfo(s, &capture, nullptr, &graph)))
      return cuda_error(c, e, "cudaStreamGetCaptureInfo");
    if (capture != cudaStreamCaptureStatusActive) graph = nullptr;
    auto flat = [&](const OpArgs& b) { return net_launch(*d->net, c, b, s, graph, d->ws); };
    if (auto ec = use_hierarchy(c, *d, a, elt) ? hierarchical(c, *d, a, elt, s, flat) : flat(a))
      return ec;
  } else if (const int rc = launch(c, *d, a, elt, stream)) {
    return cuda_error(c, static_cast<cudaError_t>(rc), name_of(a.kind));
  }
  if ((e = cudaEventRecord(chain->done, s))) return cuda_error(c, e, "cudaEventRecord");
  chain->any = true;
  chain->stream = s;
  trace_launch(*d, a.kind, a.count, a.type, a.root, s, chain == &d->captured);
  return {};
}

std::error_code prepare_device(const std::shared_ptr<CommImpl>& impl) {
  if (!impl) return make_error_code(errc::aborted);
  if (auto ec = impl->error()) return ec;
  DeviceState* d = nullptr;
  return ensure_device(*impl, impl, d);
}

std::error_code enqueue_device_a2av(const std::shared_ptr<CommImpl>& impl,
                                    const kernels::NetA2av& args, cuda_stream stream) {
  if (!impl) return make_error_code(errc::aborted);
  CommImpl& c = *impl;
  if (auto ec = c.error()) return ec;
  if (c.one_host() || c.size() > kernels::net_max_segs) return make_error_code(errc::unsupported);
  DeviceState* d = nullptr;
  if (auto ec = ensure_device(c, impl, d)) return ec;
  int current = -1;
  cudaGetDevice(&current);
  if (current != d->device) {
    COCCL_WARN(coll, c.rank(), "current GPU %d is not the communicator's GPU %d", current,
               d->device);
    return make_error_code(errc::invalid_argument);
  }
  std::lock_guard order(d->order_mutex);
  if (auto ec = c.error()) return ec;
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  cudaError_t e = cudaSuccess;
  DeviceState::Chain* chain = chain_of(*d, s, e);
  if (chain == nullptr) return cuda_error(c, e, "cudaStreamGetCaptureInfo");
  if ((e = after_last(*chain, s))) return cuda_error(c, e, "ordering after the previous operation");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  if ((e = cudaStreamGetCaptureInfo(s, &capture, nullptr, &graph)))
    return cuda_error(c, e, "cudaStreamGetCaptureInfo");
  d->ws.seq = ++d->launches;
  d->recent[d->launches % d->recent.size()].store(OpKind::all_to_allv, std::memory_order_relaxed);
  if (auto ec = net_launch_a2av(*d->net, c, args, s,
                                capture == cudaStreamCaptureStatusActive ? graph : nullptr, d->ws))
    return ec;
  if ((e = cudaEventRecord(chain->done, s))) return cuda_error(c, e, "cudaEventRecord");
  chain->any = true;
  chain->stream = s;
  trace_launch(*d, OpKind::all_to_allv, 0, DataType::uint8, 0, s, chain == &d->captured);
  return {};
}

void notify_when_done(const std::shared_ptr<CommImpl>& impl, cuda_stream stream,
                      std::error_code failed, OpHandler handler) {
  if (!impl || failed) {
    auto ex = impl ? impl->executor() : asio::system_executor();
    runtime::complete_later(ex, std::move(handler),
                            failed ? failed : make_error_code(errc::aborted));
    return;
  }
  cudaEvent_t ev = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (!e) e = cudaEventRecord(ev, stream);
  if (e) {
    if (ev) cudaEventDestroy(ev);
    runtime::complete_later(impl->executor(), std::move(handler),
                            cuda_error(*impl, e, "cudaEventRecord"));
    return;
  }
  auto boxed = std::make_unique<OpHandler>(std::move(handler));
  asio::post(impl->executor(), [impl, ev, h = std::move(boxed)]() mutable {
    auto& poller = impl->event_poller();
    if (!poller) {
      poller = std::make_unique<EventPoller>(impl->executor(), *impl);
      impl->thread().add_poller(poller.get());
    }
    static_cast<EventPoller*>(poller.get())->add(ev, std::move(*h));
  });
  // Posted from the caller's thread: a loop napping while callers borrow its role would otherwise
  // start watching the event up to 1 ms late.
  impl->thread().owe();
}

}  // namespace coccl::detail
