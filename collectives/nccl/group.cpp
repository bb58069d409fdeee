// The NCCL C API (include/nccl.h), part two: collectives, send/receive and groups.
//
// Every call is recorded as a Call. Outside a group it runs at once; inside one, ncclGroupEnd
// runs the group's calls together: per communicator (in the order they first appear) the
// collectives in call order, then all its sends and receives as one send_recv group of the C++
// API. Device buffers are enqueued on the caller's stream from this thread (the communicator's
// device workspace was made at init, so no enqueue waits for a peer); host buffers are submitted
// to every communicator first and awaited afterwards, so one thread may drive several ranks of
// one communicator without deadlock.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "collectives/nccl/cuda.hpp"
#include "collectives/nccl/exports.hpp"
#include "collectives/nccl/state.hpp"
#include "collectives/reduce_cpu.hpp"

namespace coccl::nccl {
namespace {

using detail::OpKind;

struct Call {
  ncclComm* comm;
  OpKind kind;  // p2p for ncclSend / ncclRecv
  const void* send;
  void* recv;
  std::size_t count;
  int type;  // ncclDataType_t and ncclRedOp_t as given (raw_value): possibly out of range
  int op;
  int root;  // the peer for sends and receives
  bool is_send;
  cudaStream_t stream;
  // A PreMulSum operator, copied when the call is made: NCCL lets the caller destroy it as soon
  // as the call returns, before ncclGroupEnd runs it.
  std::optional<PreMulSum> pm{};
};

struct Group {
  int depth = 0;
  std::vector<Call> calls;
  std::vector<ncclComm*> setups;  // blocking setups started inside the group
  std::vector<std::thread> jobs;
  ncclResult_t error = ncclSuccess;  // the first call of the group that failed
  std::string error_text;
};

thread_local Group group;

// Completions of the host operations of one run; the run waits for all of them.
class HostWaiter {
 public:
  std::function<void(std::error_code)> handler(ncclComm* c, const char* what) {
    std::lock_guard lock(mutex_);
    ++pending_;
    return [this, c, what](std::error_code ec) {
      std::lock_guard lock(mutex_);
      if (ec && !first_) first_ = Failure{c, ec, what};
      if (--pending_ == 0) done_.notify_all();
    };
  }
  /// Waits for every handler; returns the first failure's result, recorded on its comm unless
  /// it is an argument error (the C++ layer refused the operation before sending anything, and
  /// the communicator stays usable, as after an argument error check_call() finds).
  ncclResult_t wait() {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    if (!first_) return ncclSuccess;
    std::string text = std::string(first_->what) + ": " +
                       detail::describe_error(detail::impl_of(first_->comm->comm), first_->ec);
    if (first_->ec == errc::invalid_argument) return fail(ncclInvalidArgument, std::move(text));
    return fail_comm(first_->comm, to_result(first_->ec), std::move(text));
  }
  /// Host copies that must live until the operations finish (pre-multiplied inputs).
  std::vector<std::vector<unsigned char>> scratch;

 private:
  struct Failure {
    ncclComm* comm;
    std::error_code ec;
    const char* what;
  };
  std::mutex mutex_;
  std::condition_variable done_;
  int pending_ = 0;
  std::optional<Failure> first_;
};

const char* name(OpKind k) {
  switch (k) {
    case OpKind::all_reduce:
      return "ncclAllReduce";
    case OpKind::broadcast:
      return "ncclBroadcast";
    case OpKind::reduce:
      return "ncclReduce";
    case OpKind::all_gather:
      return "ncclAllGather";
    case OpKind::reduce_scatter:
      return "ncclReduceScatter";
    case OpKind::all_to_all:
      return "ncclAlltoAll";
    case OpKind::gather:
      return "ncclGather";
    case OpKind::scatter:
      return "ncclScatter";
    case OpKind::p2p:
      return "ncclSend/ncclRecv";
    case OpKind::all_to_allv:
    case OpKind::barrier:
      break;
  }
  return "ncclCall";
}

bool reduces(OpKind k) {
  return k == OpKind::all_reduce || k == OpKind::reduce || k == OpKind::reduce_scatter;
}

template <class T>
void scale_as(void* dst, const void* src, std::size_t n, std::uint64_t bits) {
  T s;
  std::memcpy(&s, &bits, sizeof s);
  const T* in = static_cast<const T*>(src);
  T* out = static_cast<T*>(dst);
  if constexpr (std::is_integral_v<T>) {
    // Wrapping products, as the device kernels compute them.
    using U = std::make_unsigned_t<T>;
    for (std::size_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(static_cast<U>(static_cast<U>(in[i]) * static_cast<U>(s)));
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i] * s;
  }
}

template <float (*widen)(std::uint16_t), std::uint16_t (*narrow)(float)>
void scale_narrow16(void* dst, const void* src, std::size_t n, std::uint64_t bits) {
  const float s = widen(static_cast<std::uint16_t>(bits));
  const auto* in = static_cast<const std::uint16_t*>(src);
  auto* out = static_cast<std::uint16_t*>(dst);
  for (std::size_t i = 0; i < n; ++i) out[i] = narrow(widen(in[i]) * s);
}

template <float (*widen)(std::uint8_t), std::uint8_t (*narrow)(float)>
void scale_narrow8(void* dst, const void* src, std::size_t n, std::uint64_t bits) {
  const float s = widen(static_cast<std::uint8_t>(bits));
  const auto* in = static_cast<const std::uint8_t*>(src);
  auto* out = static_cast<std::uint8_t*>(dst);
  for (std::size_t i = 0; i < n; ++i) out[i] = narrow(widen(in[i]) * s);
}

// dst = src * scalar on the host: the device kernel's arithmetic (narrow floats in float,
// rounded once; integers wrap).
void pre_multiply_host(void* dst, const void* src, std::size_t n, DataType t, std::uint64_t bits) {
  switch (t) {
    case DataType::int8:
      return scale_as<std::int8_t>(dst, src, n, bits);
    case DataType::uint8:
      return scale_as<std::uint8_t>(dst, src, n, bits);
    case DataType::int32:
      return scale_as<std::int32_t>(dst, src, n, bits);
    case DataType::uint32:
      return scale_as<std::uint32_t>(dst, src, n, bits);
    case DataType::int64:
      return scale_as<std::int64_t>(dst, src, n, bits);
    case DataType::uint64:
      return scale_as<std::uint64_t>(dst, src, n, bits);
    case DataType::float32:
      return scale_as<float>(dst, src, n, bits);
    case DataType::float64:
      return scale_as<double>(dst, src, n, bits);
    case DataType::float16:
      return scale_narrow16<detail::half_to_float, detail::float_to_half>(dst, src, n, bits);
    case DataType::bfloat16:
      return scale_narrow16<detail::bf16_to_float, detail::float_to_bf16>(dst, src, n, bits);
    case DataType::float8_e4m3:
      return scale_narrow8<detail::e4m3_to_float, detail::float_to_e4m3>(dst, src, n, bits);
    case DataType::float8_e5m2:
      return scale_narrow8<detail::e5m2_to_float, detail::float_to_e5m2>(dst, src, n, bits);
  }
}

// Checks what can be checked when the call is made; the C++ API checks the rest at run time.
ncclResult_t check_call(Call& k) {
  const char* what = name(k.kind);
  if (auto r = check_comm(k.comm, what)) return r;
  if (k.type < 0 || k.type >= ncclNumTypes)
    return fail(ncclInvalidArgument,
                std::string(what) + ": unknown datatype " + std::to_string(k.type));
  if (reduces(k.kind) && k.op >= ncclNumOps) {
    std::lock_guard lock(k.comm->mutex);
    auto it = k.comm->ops.find(k.op);
    if (it == k.comm->ops.end())
      return fail(ncclInvalidArgument,
                  std::string(what) + ": unknown reduction operator " + std::to_string(k.op));
    if (it->second.type != static_cast<DataType>(k.type))
      return fail(ncclInvalidArgument,
                  std::string(what) + ": the operator was made for another datatype");
    k.pm = it->second;
  } else if (reduces(k.kind) && k.op < 0) {
    return fail(ncclInvalidArgument,
                std::string(what) + ": unknown reduction operator " + std::to_string(k.op));
  }
  const int n = k.comm->nranks.load();
  // Host copies of the input (PreMulSum, in-place all_to_all) are count * type size bytes, per
  // rank where each rank has a block: refuse counts whose byte size does not fit a size_t.
  const std::size_t elt = size_of(static_cast<DataType>(k.type));
  const bool per_rank = k.kind == OpKind::all_gather || k.kind == OpKind::reduce_scatter ||
                        k.kind == OpKind::all_to_all || k.kind == OpKind::gather ||
                        k.kind == OpKind::scatter;
  const std::size_t blocks = per_rank && n > 0 ? static_cast<std::size_t>(n) : 1;
  if (k.count > std::numeric_limits<std::size_t>::max() / elt / blocks)
    return fail(ncclInvalidArgument, std::string(what) + ": count " + std::to_string(k.count) +
                                         " * type size " + std::to_string(elt) +
                                         (blocks > 1 ? " * " + std::to_string(n) + " ranks" : "") +
                                         " overflows");
  const bool rooted = k.kind == OpKind::broadcast || k.kind == OpKind::reduce ||
                      k.kind == OpKind::gather || k.kind == OpKind::scatter ||
                      k.kind == OpKind::p2p;
  if (rooted && n > 0 && (k.root < 0 || k.root >= n))
    return fail(ncclInvalidArgument,
                std::string(what) + ": " + (k.kind == OpKind::p2p ? "peer " : "root ") +
                    std::to_string(k.root) + " out of range [0, " + std::to_string(n) + ")");
  if (k.count > 0) {
    const bool send_needed = k.kind == OpKind::p2p
                                 ? k.is_send
                                 : !((k.kind == OpKind::broadcast || k.kind == OpKind::scatter) &&
                                     k.comm->rank.load() != k.root);
    const bool recv_needed = k.kind == OpKind::p2p
                                 ? !k.is_send
                                 : !((k.kind == OpKind::reduce || k.kind == OpKind::gather) &&
                                     k.comm->rank.load() != k.root);
    if ((send_needed && !k.send) || (recv_needed && !k.recv))
      return fail(ncclInvalidArgument, std::string(what) + ": NULL buffer");
  }
  return ncclSuccess;
}

// The elements of the send buffer of a collective that is staged through scratch.
std::size_t send_elements(const Call& k) {
  const bool per_rank = k.kind == OpKind::reduce_scatter || k.kind == OpKind::all_to_all;
  return per_rank ? k.count * k.comm->nranks.load() : k.count;
}

// The C++ API has no in-place all_to_all; NCCL programs may pass one buffer, so the input is
// copied aside first.
bool staged_in_place(const Call& k) {
  return k.kind == OpKind::all_to_all && k.send == k.recv && k.comm->nranks.load() > 1;
}

ncclResult_t device_error(ncclComm* c, const char* what, const std::system_error& e) {
  return fail_comm(c, to_result(e.code()), std::string(what) + ": " + e.what());
}

// Enqueues one collective of device buffers on its stream.
ncclResult_t launch_device(const Call& k, ReduceOp op, const std::optional<PreMulSum>& pm) {
  Communicator& comm = k.comm->comm;
  const DataType t = static_cast<DataType>(k.type);
  const void* send = k.send;
  void* scratch = nullptr;
  if (pm || staged_in_place(k)) {
    const std::size_t n = send_elements(k);
    if (auto why = scratch_alloc(&scratch, n * size_of(t), k.stream); !why.empty())
      return fail_comm(k.comm, ncclUnhandledCudaError, std::string(name(k.kind)) + ": " + why);
    auto why =
        pm ? pre_multiply(scratch, k.send, n, t, pm->scalar_address, pm->scalar_bits, k.stream)
           : copy_async(scratch, k.send, n * size_of(t), k.stream);
    if (!why.empty()) {
      scratch_free(scratch, k.stream);
      return fail_comm(k.comm, ncclUnhandledCudaError, std::string(name(k.kind)) + ": " + why);
    }
    send = scratch;
  }
  ncclResult_t r = ncclSuccess;
  try {
    switch (k.kind) {
      case OpKind::all_reduce:
        comm.all_reduce(send, k.recv, k.count, t, op, k.stream);
        break;
      case OpKind::broadcast:
        comm.broadcast(send, k.recv, k.count, t, k.root, k.stream);
        break;
      case OpKind::reduce:
        comm.reduce(send, k.recv, k.count, t, op, k.root, k.stream);
        break;
      case OpKind::all_gather:
        comm.all_gather(send, k.recv, k.count, t, k.stream);
        break;
      case OpKind::reduce_scatter:
        comm.reduce_scatter(send, k.recv, k.count, t, op, k.stream);
        break;
      case OpKind::all_to_all:
        comm.all_to_all(send, k.recv, k.count, t, k.stream);
        break;
      case OpKind::gather:
        comm.gather(send, k.recv, k.count, t, k.root, k.stream);
        break;
      case OpKind::scatter:
        comm.scatter(send, k.recv, k.count, t, k.root, k.stream);
        break;
      case OpKind::p2p:
      case OpKind::all_to_allv:
      case OpKind::barrier:
        break;
    }
  } catch (const std::system_error& e) {
    r = device_error(k.comm, name(k.kind), e);
  }
  if (scratch) {
    if (auto why = scratch_free(scratch, k.stream); !why.empty() && r == ncclSuccess)
      r = fail_comm(k.comm, ncclUnhandledCudaError, std::string(name(k.kind)) + ": " + why);
  }
  return r;
}

// Submits one collective of host buffers; `waiter` collects its completion.
ncclResult_t launch_host(const Call& k, ReduceOp op, const std::optional<PreMulSum>& pm,
                         HostWaiter& waiter) {
  Communicator& comm = k.comm->comm;
  const DataType t = static_cast<DataType>(k.type);
  const void* send = k.send;
  if (pm) {
    std::uint64_t bits = pm->scalar_bits;
    if (pm->scalar_address) {
      if (auto why = read_bytes(&bits, pm->scalar_address, size_of(t)); !why.empty())
        return fail_comm(k.comm, ncclUnhandledCudaError, std::string(name(k.kind)) + ": " + why);
    }
    const std::size_t n = send_elements(k);
    auto& copy = waiter.scratch.emplace_back(n * size_of(t));
    pre_multiply_host(copy.data(), k.send, n, t, bits);
    send = copy.data();
  } else if (staged_in_place(k)) {
    const auto* in = static_cast<const unsigned char*>(k.send);
    send = waiter.scratch.emplace_back(in, in + send_elements(k) * size_of(t)).data();
  }
  auto h = waiter.handler(k.comm, name(k.kind));
  switch (k.kind) {
    case OpKind::all_reduce:
      comm.async_all_reduce(send, k.recv, k.count, t, op, h);
      break;
    case OpKind::broadcast:
      comm.async_broadcast(send, k.recv, k.count, t, k.root, h);
      break;
    case OpKind::reduce:
      comm.async_reduce(send, k.recv, k.count, t, op, k.root, h);
      break;
    case OpKind::all_gather:
      comm.async_all_gather(send, k.recv, k.count, t, h);
      break;
    case OpKind::reduce_scatter:
      comm.async_reduce_scatter(send, k.recv, k.count, t, op, h);
      break;
    case OpKind::all_to_all:
      comm.async_all_to_all(send, k.recv, k.count, t, h);
      break;
    case OpKind::gather:
      comm.async_gather(send, k.recv, k.count, t, k.root, h);
      break;
    case OpKind::scatter:
      comm.async_scatter(send, k.recv, k.count, t, k.root, h);
      break;
    case OpKind::p2p:
    case OpKind::all_to_allv:
    case OpKind::barrier:
      break;
  }
  return ncclSuccess;
}

ncclResult_t launch_collective(const Call& k, HostWaiter& waiter) {
  if (k.count == 0) return ncclSuccess;
  const ReduceOp op = reduces(k.kind) && !k.pm ? static_cast<ReduceOp>(k.op) : ReduceOp::sum;
  const void* probe = k.send ? k.send : k.recv;
  if (is_device_memory(probe)) return launch_device(k, op, k.pm);
  return launch_host(k, op, k.pm, waiter);
}

// All sends and receives of one communicator in a run, as one group of the C++ API.
ncclResult_t launch_p2p(ncclComm* c, const std::vector<const Call*>& calls, HostWaiter& waiter) {
  std::vector<Transfer> ops;
  const void* probe = nullptr;
  for (const Call* k : calls) {
    if (k->count == 0) continue;
    auto t = static_cast<DataType>(k->type);
    ops.push_back(k->is_send ? Communicator::send_op(k->send, k->count, t, k->root)
                             : Communicator::recv_op(k->recv, k->count, t, k->root));
    if (!probe) probe = ops.back().buffer;
  }
  if (ops.empty()) return ncclSuccess;
  if (is_device_memory(probe)) {
    try {
      c->comm.send_recv(std::move(ops), calls.front()->stream);
    } catch (const std::system_error& e) {
      return device_error(c, name(OpKind::p2p), e);
    }
    return ncclSuccess;
  }
  c->comm.async_send_recv(std::move(ops), waiter.handler(c, name(OpKind::p2p)));
  return ncclSuccess;
}

// Runs a group's calls (or a single call) and returns once host operations have finished and
// device ones are enqueued.
ncclResult_t run_calls(const std::vector<Call>& calls) {
  std::vector<ncclComm*> comms;
  for (const Call& k : calls)
    if (std::find(comms.begin(), comms.end(), k.comm) == comms.end()) comms.push_back(k.comm);
  for (ncclComm* c : comms) {
    if (auto r = wait_ready(c)) return r;
    std::lock_guard lock(c->mutex);
    if (c->finalized)
      return fail(ncclInvalidUsage, "the communicator was finalized (ncclCommFinalize)");
  }
  // Device work is enqueued with each communicator's GPU current (one thread may drive several);
  // the caller's current GPU is restored afterwards.
  const int caller_device = current_device();
  HostWaiter waiter;
  ncclResult_t first = ncclSuccess;
  for (ncclComm* c : comms) {
    if (c->device >= 0 && caller_device >= 0 && current_device() != c->device) {
      if (auto why = set_device(c->device); !why.empty()) {
        if (first == ncclSuccess) first = fail(ncclUnhandledCudaError, why);
        continue;
      }
    }
    std::vector<const Call*> p2p;
    for (const Call& k : calls) {
      if (k.comm != c) continue;
      if (k.kind == OpKind::p2p) {
        p2p.push_back(&k);
        continue;
      }
      ncclResult_t r = launch_collective(k, waiter);
      if (r != ncclSuccess && first == ncclSuccess) first = r;
    }
    if (!p2p.empty()) {
      ncclResult_t r = launch_p2p(c, p2p, waiter);
      if (r != ncclSuccess && first == ncclSuccess) first = r;
    }
  }
  if (caller_device >= 0 && current_device() != caller_device) set_device(caller_device);
  ncclResult_t r = waiter.wait();
  return first != ncclSuccess ? first : r;
}

ncclResult_t submit(Call k) {
  if (auto r = check_call(k)) {
    if (group.depth > 0 && group.error == ncclSuccess) {
      group.error = r;
      group.error_text = ncclGetLastError(nullptr);
    }
    return r;
  }
  if (group.depth > 0) {
    group.calls.push_back(k);
    return ncclSuccess;
  }
  return run_calls({k});
}

// Joins the group's setup jobs; the first failure's result, or ncclInProgress if a
// nonblocking setup is still running.
ncclResult_t finish_setups(Group& g) {
  for (auto& job : g.jobs) job.join();
  ncclResult_t first = ncclSuccess;
  for (ncclComm* c : g.setups) {
    ncclResult_t r = wait_ready(c);
    if (r != ncclSuccess && first == ncclSuccess) first = r;
  }
  return first;
}

}  // namespace

bool in_group() noexcept { return group.depth > 0; }

void join_at_group_end(ncclComm* c) { group.setups.push_back(c); }

void run_at_group_end(std::thread job) { group.jobs.push_back(std::move(job)); }

}  // namespace coccl::nccl

using namespace coccl;
using namespace coccl::nccl;
using coccl::detail::OpKind;

extern "C" {

ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream) {
  return guarded("ncclAllReduce", [&]() -> ncclResult_t {
    return submit({comm, OpKind::all_reduce, sendbuff, recvbuff, count, raw_value(datatype),
                   raw_value(op), 0, false, stream});
  });
}

ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream) {
  return guarded("ncclBroadcast", [&]() -> ncclResult_t {
    return submit({comm, OpKind::broadcast, sendbuff, recvbuff, count, raw_value(datatype), ncclSum,
                   root, false, stream});
  });
}

ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclBcast", [&]() -> ncclResult_t {
    // Not through pncclBroadcast: passing datatype on by value would load it as an enum, which is
    // undefined for a value out of its range (the caller's to give, and ours to refuse).
    return submit({comm, OpKind::broadcast, buff, buff, count, raw_value(datatype), ncclSum, root,
                   false, stream});
  });
}

ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream) {
  return guarded("ncclReduce", [&]() -> ncclResult_t {
    return submit({comm, OpKind::reduce, sendbuff, recvbuff, count, raw_value(datatype),
                   raw_value(op), root, false, stream});
  });
}

ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclAllGather", [&]() -> ncclResult_t {
    return submit({comm, OpKind::all_gather, sendbuff, recvbuff, sendcount, raw_value(datatype),
                   ncclSum, 0, false, stream});
  });
}

ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream) {
  return guarded("ncclReduceScatter", [&]() -> ncclResult_t {
    return submit({comm, OpKind::reduce_scatter, sendbuff, recvbuff, recvcount, raw_value(datatype),
                   raw_value(op), 0, false, stream});
  });
}

ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclAlltoAll", [&]() -> ncclResult_t {
    return submit({comm, OpKind::all_to_all, sendbuff, recvbuff, count, raw_value(datatype),
                   ncclSum, 0, false, stream});
  });
}

ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclGather", [&]() -> ncclResult_t {
    return submit({comm, OpKind::gather, sendbuff, recvbuff, count, raw_value(datatype), ncclSum,
                   root, false, stream});
  });
}

ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclScatter", [&]() -> ncclResult_t {
    return submit({comm, OpKind::scatter, sendbuff, recvbuff, count, raw_value(datatype), ncclSum,
                   root, false, stream});
  });
}

ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclSend", [&]() -> ncclResult_t {
    return submit({comm, OpKind::p2p, sendbuff, nullptr, count, raw_value(datatype), ncclSum, peer,
                   true, stream});
  });
}

ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream) {
  return guarded("ncclRecv", [&]() -> ncclResult_t {
    return submit({comm, OpKind::p2p, nullptr, recvbuff, count, raw_value(datatype), ncclSum, peer,
                   false, stream});
  });
}

ncclResult_t pncclGroupStart(void) {
  return guarded("ncclGroupStart", [&]() -> ncclResult_t {
    ++group.depth;
    return ncclSuccess;
  });
}

ncclResult_t pncclGroupEnd(void) {
  return guarded("ncclGroupEnd", [&]() -> ncclResult_t {
    if (group.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group.depth > 0) return ncclSuccess;
    coccl::nccl::Group g = std::move(group);
    group = coccl::nccl::Group{};
    ncclResult_t r = finish_setups(g);
    if (g.error != ncclSuccess)
      return fail(g.error, "a call of the group failed, so none ran: " + g.error_text);
    if (r != ncclSuccess && r != ncclInProgress) return r;
    ncclResult_t ran = run_calls(g.calls);
    if (ran != ncclSuccess) return ran;
    for (ncclComm* c : g.setups)
      if (c->state.load(std::memory_order_acquire) == ncclInProgress) return ncclInProgress;
    return r;
  });
}

ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return guarded("ncclGroupSimulateEnd", [&]() -> ncclResult_t {
    (void)simInfo;
    if (group.depth == 0)
      return fail(ncclInvalidUsage, "ncclGroupSimulateEnd without ncclGroupStart");
    if (--group.depth > 0) return ncclSuccess;
    coccl::nccl::Group g = std::move(group);
    group = coccl::nccl::Group{};
    finish_setups(g);
    return fail(ncclInvalidUsage,
                "ncclGroupSimulateEnd is not supported by coccl (no cost model); the group's "
                "operations were dropped");
  });
}

}  // extern "C"

COCCL_NCCL_ALIAS(ncclAllReduce)
COCCL_NCCL_ALIAS(ncclBroadcast)
COCCL_NCCL_ALIAS(ncclBcast)
COCCL_NCCL_ALIAS(ncclReduce)
COCCL_NCCL_ALIAS(ncclAllGather)
COCCL_NCCL_ALIAS(ncclReduceScatter)
COCCL_NCCL_ALIAS(ncclAlltoAll)
COCCL_NCCL_ALIAS(ncclGather)
COCCL_NCCL_ALIAS(ncclScatter)
COCCL_NCCL_ALIAS(ncclSend)
COCCL_NCCL_ALIAS(ncclRecv)
COCCL_NCCL_ALIAS(ncclGroupStart)
COCCL_NCCL_ALIAS(ncclGroupEnd)
COCCL_NCCL_ALIAS(ncclGroupSimulateEnd)
