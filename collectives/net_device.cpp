// The proxy half of device operations across hosts (see net_device.hpp and kernels/net.hpp).
//
// One coroutine per communicator serves the operations in the order the kernels post them: it
// waits for the kernel to post an operation (NetMailbox::posted, with the descriptor that the
// launch registered), then for each round waits until the kernel has staged it and starts the
// round as a host operation from the "in" staging into the "out" staging on one of the lanes:
// communicators over the same ranks, made for this path on threads of their own, so that up to
// COCCL_NET_LANES rounds move at once (each lane has its own sockets and its own thread to copy
// through them). Round k runs on lane k % lanes on every rank, so every lane sees the same
// operations in the same order everywhere. Rounds are counted done in order. The communicator
// orders its launches, so one operation is in flight at a time; a captured graph posts the
// descriptor it was captured with at every replay.
#include "collectives/net_device.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "collectives/device_params.hpp"
#include "collectives/net_plan.hpp"
#include "kernels/net.hpp"
#include "runtime/handoff.hpp"
#include "runtime/log.hpp"

namespace coccl::params {

config::Param<std::int64_t> net_slot_bytes{
    "COCCL_NET_SLOT_BYTES", 2 << 20,
    "device operations across hosts: bytes a round stages in pinned host memory on each side "
    "(2 x (COCCL_NET_LANES + 1) such areas per communicator); must be equal on every rank"};
config::Param<std::int64_t> net_lanes{
    "COCCL_NET_LANES", 4,
    "device operations across hosts: rounds moved at once, each over its own connections and "
    "proxy thread (1 to 15); must be equal on every rank"};

}  // namespace coccl::params

namespace coccl::detail {

namespace {

// What the proxy needs to run an operation's rounds on the host.
struct NetOp {
  kernels::NetPlan plan;  // for an all_to_allv with device counts: made after round 0
  OpKind kind;
  DataType type;
  ReduceOp op;
  int root;
  bool eager;
  bool device_counts = false;  // round 0 exchanges the counts (kernels::NetA2av)
  std::uint32_t elt = 1;
};

// Descriptors by id. Shared with the destructors of graph user objects, which CUDA runs on its
// own thread and which must not call CUDA: so this holds no CUDA resource.
struct OpTable {
  std::mutex mutex;
  std::map<std::uint64_t, std::shared_ptr<const NetOp>> ops;
  std::uint64_t next = 1;
  std::atomic<std::int64_t> eager{0};   // eager operations launched and not yet served
  std::atomic<std::int64_t> graphs{0};  // descriptors kept alive by graphs

  std::uint64_t add(std::shared_ptr<const NetOp> op) {
    std::lock_guard lock(mutex);
    const std::uint64_t id = next++;
    ops.emplace(id, std::move(op));
    return id;
  }
  std::shared_ptr<const NetOp> find(std::uint64_t id) {
    std::lock_guard lock(mutex);
    auto it = ops.find(id);
    return it == ops.end() ? nullptr : it->second;
  }
  void erase(std::uint64_t id) {
    std::lock_guard lock(mutex);
    ops.erase(id);
  }
};

struct GraphRef {
  std::shared_ptr<OpTable> table;
  std::uint64_t id;
};

void release_graph_op(void* p) {
  std::unique_ptr<GraphRef> ref(static_cast<GraphRef*>(p));
  ref->table->erase(ref->id);
  ref->table->graphs.fetch_sub(1, std::memory_order_relaxed);
}

// The kernels write these words over PCIe; the host reads them with acquire loads.
std::uint64_t load_acquire(std::uint64_t& v) {
  return std::atomic_ref<std::uint64_t>(v).load(std::memory_order_acquire);
}

}  // namespace

// Waits of the serving coroutine on the kernels' counters, checked by the proxy thread's loop.
class NetPoller final : public runtime::Poller {
 public:
  using Handler = asio::any_completion_handler<void(bool)>;

  NetPoller(std::shared_ptr<OpTable> table, device::Status* status,
            std::function<void()> on_destroy)
      : table_(std::move(table)), status_(status), on_destroy_(std::move(on_destroy)) {}
  // The communicator is going away (its proxy thread, which owns this): stop the lanes, which
  // also ends any round still running on them.
  ~NetPoller() override {
    if (on_destroy_) on_destroy_();
  }

  // Completes with true once ready() holds, false if the kernels were told to stop first.
  template <class Token>
  auto until(std::function<bool()> ready, Token&& token) {
    return asio::async_initiate<Token, void(bool)>(
        [this](auto handler, std::function<bool()> r) {
          ready_ = std::move(r);
          handler_.emplace(std::move(handler));
        },
        token, std::move(ready));
  }

  bool poll() override {
    if (!handler_) return false;
    const bool ok = ready_();
    if (!ok && std::atomic_ref<std::uint32_t>(status_->abort).load(std::memory_order_acquire) == 0)
      return false;
    Handler h = std::move(*handler_);
    handler_.reset();
    runtime::complete(std::move(h), ok);
    return true;
  }

  // Spins only while an operation may be posted: eager launches not yet served, or graphs that
  // may replay at any time (then the loop naps 200 us between visits once idle).
  bool waiting() const override {
    return handler_ && (table_->eager.load(std::memory_order_relaxed) > 0 ||
                        table_->graphs.load(std::memory_order_relaxed) > 0);
  }

 private:
  std::shared_ptr<OpTable> table_;
  device::Status* status_;
  std::function<void()> on_destroy_;
  std::function<bool()> ready_;
  std::optional<Handler> handler_;
};

// The threads of every lane of this process, made on first use and kept to the end (like the
// process engine).
std::shared_ptr<runtime::Engine> lane_engine(int lanes) {
  static auto* e = new std::shared_ptr<runtime::Engine>(std::make_shared<runtime::Engine>(lanes));
  return *e;
}

class NetDevice {
 public:
  ~NetDevice() {
    if (box_) cudaFreeHost(box_);
    if (stage_) cudaFreeHost(stage_);
    if (counters_) cudaFree(counters_);
  }

  std::error_code init(CommImpl& c) {
    rank_ = c.rank();
    slot_ =
        static_cast<std::size_t>(std::max<std::int64_t>(0, params::net_slot_bytes.get())) / 64 * 64;
    if (slot_ < 64 * static_cast<std::size_t>(c.size())) {
      COCCL_WARN(p2p, c.rank(), "COCCL_NET_SLOT_BYTES %zu is below 64 bytes a rank", slot_);
      return make_error_code(errc::invalid_argument);
    }
    lanes_n_ = static_cast<int>(
        std::clamp<std::int64_t>(params::net_lanes.get(), 1, kernels::net_max_slots - 1));
    slots_ = static_cast<std::uint32_t>(lanes_n_ + 1);
    void* p = nullptr;
    if (auto e = cudaHostAlloc(&p, sizeof(kernels::NetMailbox),
                               cudaHostAllocMapped | cudaHostAllocPortable))
      return fail(c, e, "cudaHostAlloc of the network mailbox");
    box_ = static_cast<kernels::NetMailbox*>(p);
    std::memset(p, 0, sizeof(kernels::NetMailbox));
    if (auto e = cudaHostAlloc(&p, 2 * slots_ * slot_, cudaHostAllocMapped | cudaHostAllocPortable))
      return fail(c, e, "cudaHostAlloc of the network staging");
    stage_ = static_cast<char*>(p);
    if (auto e = cudaHostGetDevicePointer(&p, box_, 0))
      return fail(c, e, "cudaHostGetDevicePointer");
    box_dev_ = static_cast<kernels::NetMailbox*>(p);
    if (auto e = cudaHostGetDevicePointer(&p, stage_, 0))
      return fail(c, e, "cudaHostGetDevicePointer");
    stage_dev_ = static_cast<char*>(p);
    if (auto e = cudaMalloc(&p, sizeof(kernels::NetCounters)))
      return fail(c, e, "cudaMalloc of the network counters");
    counters_ = static_cast<kernels::NetCounters*>(p);
    if (auto e = cudaMemset(p, 0, sizeof(kernels::NetCounters))) return fail(c, e, "cudaMemset");
    if (auto e = cudaDeviceSynchronize()) return fail(c, e, "cudaDeviceSynchronize");
    return {};
  }

  // Collective over `comm` (any thread but its proxy thread): rank 0 opens a root per lane, the
  // others learn the ids from it, and everyone joins the lanes in order.
  std::error_code make_lanes(const std::shared_ptr<CommImpl>& comm) {
    auto engine = lane_engine(lanes_n_);
    std::vector<UniqueId> ids(static_cast<std::size_t>(lanes_n_));
    if (comm->rank() == 0)
      for (UniqueId& id : ids) id = unique_id_on(*engine);
    OpArgs share;
    share.kind = OpKind::broadcast;
    share.send = ids.data();
    share.recv = ids.data();
    share.count = ids.size() * sizeof(UniqueId);
    share.type = DataType::uint8;
    std::error_code ec;
    run_blocking(comm, std::move(share), ec);
    if (ec) return ec;
    for (const UniqueId& id : ids) {
      lanes_.push_back(join_on(engine, id, comm->rank(), comm->size(), ec));
      if (ec) {
        COCCL_WARN(net, comm->rank(), "joining network lane %zu failed: %s", lanes_.size() - 1,
                   ec.message().c_str());
        return ec;
      }
    }
    return {};
  }

  // Proxy thread: registers the poller and starts serving.
  void start(const std::shared_ptr<CommImpl>& comm, std::shared_ptr<NetDevice> self,
             device::Status* status) {
    std::weak_ptr<NetDevice> weak = self;
    auto poller = std::make_unique<NetPoller>(table_, status, [weak] {
      if (auto net = weak.lock()) net->stop_lanes();
    });
    poller_ = poller.get();
    comm->thread().add_poller(poller_);
    comm->net_poller() = std::move(poller);
    asio::co_spawn(comm->executor(), serve(std::weak_ptr<CommImpl>(comm), std::move(self)),
                   asio::detached);
  }

  // Lanes with rounds still running (the communicator failed or was aborted) stop at once; idle
  // ones close like any communicator. Not on a lane's thread.
  void stop_lanes() {
    for (auto& lane : lanes_) {
      if (!lane) continue;
      if (inflight_ > 0 || lane->error())
        lane->abort();
      else
        lane->destroy();
    }
    lanes_.clear();
  }

  std::error_code launch(CommImpl& c, const OpArgs& a, cudaStream_t s, cudaGraph_t graph,
                         const device::Workspace& ws) {
    auto op = std::make_shared<NetOp>();
    if (auto ec = make_net_plan(a, c.rank(), c.size(), slot_, op->plan)) return ec;
    if (op->plan.rounds == 0) return {};  // a group with nothing for this rank
    op->kind = a.kind == OpKind::all_to_allv ? OpKind::p2p : a.kind;
    op->type = a.type;
    op->op = a.op;
    op->root = a.root;
    return enqueue(
        c, op, opcode_of(a.kind), graph, ws, [&](const kernels::NetChannel& ch, int grid) {
          return kernels::net_stage(op->plan, ch, grid, reinterpret_cast<CUstream_st*>(s));
        });
  }

  std::error_code launch_a2av(CommImpl& c, const kernels::NetA2av& args, cudaStream_t s,
                              cudaGraph_t graph, const device::Workspace& ws) {
    auto op = std::make_shared<NetOp>();
    op->kind = OpKind::p2p;
    op->type = DataType::uint8;
    op->root = 0;
    op->op = ReduceOp::sum;
    op->device_counts = true;
    op->elt = args.elem_bytes;
    const std::uint64_t chunk = a2av_chunk(c.size());
    return enqueue(c, op, device::OpCode::all_to_allv, graph, ws,
                   [&](const kernels::NetChannel& ch, int grid) {
                     return kernels::net_all_to_allv(args, ch, chunk, grid,
                                                     reinterpret_cast<CUstream_st*>(s));
                   });
  }

 private:
  std::uint64_t a2av_chunk(int n) const { return slot_ / static_cast<std::size_t>(n) / 64 * 64; }

  // Registers `op` (eager, or kept by the graph being captured) and launches its kernel.
  template <class Launch>
  std::error_code enqueue(CommImpl& c, std::shared_ptr<NetOp> op, device::OpCode code,
                          cudaGraph_t graph, const device::Workspace& ws, Launch&& launch) {
    op->eager = graph == nullptr;
    const std::uint64_t id = table_->add(op);
    if (graph) {
      auto ref = std::make_unique<GraphRef>(GraphRef{table_, id});
      cudaUserObject_t obj = nullptr;
      cudaError_t e = cudaUserObjectCreate(&obj, ref.get(), release_graph_op, 1,
                                           cudaUserObjectNoDestructorSync);
      if (e != cudaSuccess) {
        table_->erase(id);
        return fail(c, e, "cudaUserObjectCreate");
      }
      table_->graphs.fetch_add(1, std::memory_order_relaxed);
      ref.release();  // owned by the user object now
      if ((e = cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove))) {
        cudaUserObjectRelease(obj, 1);
        return fail(c, e, "cudaGraphRetainUserObject");
      }
    } else if (table_->eager.fetch_add(1, std::memory_order_relaxed) == 0) {
      // The proxy thread may be asleep in its io_context: wake it to spin on the mailbox.
      asio::post(c.executor(), [] {});
    }
    kernels::NetChannel ch{};
    ch.stage = stage_dev_;
    ch.slot_bytes = slot_;
    ch.slots = slots_;
    ch.box = box_dev_;
    ch.counters = counters_;
    ch.desc = id;
    ch.status = ws.status;
    ch.timeout_ns = ws.timeout_ns;
    ch.seq = ws.seq;
    ch.op = static_cast<std::uint32_t>(code);
    const int grid = ws.max_grid > 0 ? ws.max_grid : device::max_blocks;
    if (int rc = launch(ch, grid)) {
      if (op->eager) {
        table_->erase(id);
        table_->eager.fetch_sub(1, std::memory_order_relaxed);
      }
      return fail(c, static_cast<cudaError_t>(rc), "launching the network staging kernel");
    }
    return {};
  }

  static device::OpCode opcode_of(OpKind k) {
    switch (k) {
      case OpKind::all_reduce:
        return device::OpCode::all_reduce;
      case OpKind::all_gather:
        return device::OpCode::all_gather;
      case OpKind::reduce_scatter:
        return device::OpCode::reduce_scatter;
      case OpKind::all_to_all:
        return device::OpCode::all_to_all;
      case OpKind::broadcast:
        return device::OpCode::broadcast;
      case OpKind::reduce:
        return device::OpCode::reduce;
      case OpKind::gather:
        return device::OpCode::gather;
      case OpKind::scatter:
        return device::OpCode::scatter;
      case OpKind::all_to_allv:
        return device::OpCode::all_to_allv;
      default:
        return device::OpCode::send_recv;
    }
  }

  static std::error_code fail(CommImpl& c, cudaError_t e, const std::string& what) {
    std::string text = what + ": " + cudaGetErrorString(e);
    COCCL_WARN(p2p, c.rank(), "%s", text.c_str());
    c.fail(make_error_code(errc::cuda_error), text);
    return make_error_code(errc::cuda_error);
  }

  // The host operation of round k of `op` (following `plan`), on its staging slot. Round 0 of an
  // all_to_allv with device counts is the exchange of the counts: one int64 a rank.
  OpArgs round_of(const NetOp& op, const kernels::NetPlan& plan, std::uint64_t k) const {
    char* in = stage_ + (k % slots_) * 2 * slot_;
    OpArgs shape;
    if (op.device_counts && k == 0) {
      shape.kind = OpKind::all_to_all;
      shape.type = DataType::int64;
      shape.send = in;
      shape.recv = in + slot_;
      shape.count = 1;
      return shape;
    }
    shape.kind = op.kind;
    shape.type = op.type;
    shape.op = op.op;
    shape.root = op.root;
    return net_round(plan, shape, in, in + slot_, k);
  }

  // The plan of an all_to_allv with device counts, from the counts its round 0 left in slot 0
  // (the kernel built the same one). Only sizes, peers and rounds matter here: the buffers are
  // the kernel's.
  kernels::NetPlan counted_plan(const NetOp& op, int n) const {
    std::vector<std::int64_t> sc(n), rc(n);
    std::vector<std::uint64_t> sd(n, 0), rd(n, 0);
    for (int q = 0; q < n; ++q) {
      sc[q] = static_cast<std::int64_t>(load_acquire(reinterpret_cast<std::uint64_t*>(stage_)[q]));
      rc[q] = static_cast<std::int64_t>(
          load_acquire(reinterpret_cast<std::uint64_t*>(stage_ + slot_)[q]));
    }
    kernels::NetPlan p{};
    kernels::net_a2av_plan(p, n, a2av_chunk(n), op.elt, stage_, stage_, sc.data(), sd.data(),
                           rc.data(), rd.data());
    return p;
  }

  // Runs `a` as a host operation of the communicator.
  static auto run_host(CommImpl& c, OpArgs a) {
    return asio::async_initiate<decltype(asio::use_awaitable), void(std::error_code)>(
        [&c](auto handler, OpArgs args) {
          c.submit(std::move(args), OpHandler(std::move(handler)));
        },
        asio::use_awaitable, std::move(a));
  }

  // `self` keeps the staging alive as long as the coroutine may touch it.
  asio::awaitable<void> serve(std::weak_ptr<CommImpl> weak, std::shared_ptr<NetDevice> self) {
    using clock = std::chrono::steady_clock;
    const auto us = [](clock::duration d) {
      return std::chrono::duration<double, std::micro>(d).count();
    };
    for (;;) {
      if (!co_await poller_->until([this] { return load_acquire(box_->posted) > served_; },
                                   asio::use_awaitable))
        co_return;
      const std::uint64_t id = load_acquire(box_->desc);
      std::shared_ptr<const NetOp> op = table_->find(id);
      if (!op) {
        if (auto comm = weak.lock())
          comm->fail(make_error_code(errc::internal),
                     "a device kernel posted an unknown network operation " + std::to_string(id));
        co_return;
      }
      ++served_;
      const auto posted = clock::now();
      clock::duration first_wait{};
      const std::uint64_t base = done_;
      kernels::NetPlan plan = op->plan;
      std::uint64_t rounds = op->device_counts ? 1 : plan.rounds;
      for (std::uint64_t k = 0; k < rounds; ++k) {
        const std::uint64_t target = base + k + 1;
        // Staged, and a lane free for it (rounds are given to lanes in turn).
        if (!co_await poller_->until(
                [this, target] {
                  return inflight_ < lanes_.size() && load_acquire(box_->staged) >= target;
                },
                asio::use_awaitable))
          co_return;
        if (k == 0) first_wait = clock::now() - posted;
        auto comm = weak.lock();
        if (!comm) co_return;
        ++inflight_;
        asio::co_spawn(comm->executor(),
                       run_round(weak, lanes_[k % lanes_.size()], k % lanes_.size(),
                                 round_of(*op, plan, k), target, self),
                       asio::detached);
        if (op->device_counts && k == 0) {
          // The rest of the operation follows from the counts. (No reference to the
          // communicator across the wait: see run_round's.)
          const int n = comm->size();
          comm.reset();
          if (!co_await poller_->until([this, target] { return done_ >= target; },
                                       asio::use_awaitable))
            co_return;
          plan = counted_plan(*op, n);
          rounds = plan.rounds;
        }
      }
      if (!co_await poller_->until([this, end = base + rounds] { return done_ >= end; },
                                   asio::use_awaitable))
        co_return;
      COCCL_TRACE(net, rank_,
                  "device %s (descriptor %llu): %llu rounds, %.1f us from the previous one's end "
                  "to its post, %.1f us waiting for the first round, %.1f us to the last round",
                  name_of(op->kind), static_cast<unsigned long long>(id),
                  static_cast<unsigned long long>(rounds), us(posted - last_end_), us(first_wait),
                  us(clock::now() - posted));
      last_end_ = clock::now();
      if (op->eager) {
        table_->erase(id);
        table_->eager.fetch_sub(1, std::memory_order_relaxed);
      }
    }
  }

  // One round on one lane; counted done once every earlier round is.
  asio::awaitable<void> run_round(std::weak_ptr<CommImpl> weak, std::shared_ptr<CommImpl> lane,
                                  std::size_t index, OpArgs args, std::uint64_t round,
                                  std::shared_ptr<NetDevice> self) {
    (void)self;  // keeps the staging alive while the round may write it
    const std::error_code ec = co_await run_host(*lane, std::move(args));
    --inflight_;
    if (ec) {
      // The lane failed (a peer left, a timeout): the communicator fails with its reason, which
      // raises the kernels' abort flag.
      if (auto comm = weak.lock())
        comm->fail(ec, "network lane " + std::to_string(index) + ": " + lane->last_error());
      co_return;
    }
    finished_.insert(round);
    while (!finished_.empty() && *finished_.begin() == done_ + 1) {
      finished_.erase(finished_.begin());
      ++done_;
    }
    std::atomic_ref<std::uint64_t>(box_->done).store(done_, std::memory_order_release);
  }

  std::size_t slot_ = 0;
  int lanes_n_ = 1;
  std::uint32_t slots_ = 2;
  std::vector<std::shared_ptr<CommImpl>> lanes_;
  kernels::NetMailbox* box_ = nullptr;
  kernels::NetMailbox* box_dev_ = nullptr;
  char* stage_ = nullptr;
  char* stage_dev_ = nullptr;
  kernels::NetCounters* counters_ = nullptr;
  std::shared_ptr<OpTable> table_ = std::make_shared<OpTable>();
  NetPoller* poller_ = nullptr;  // owned by the communicator (net_poller)
  // Proxy thread: operations served and rounds done over the communicator's life.
  std::uint64_t served_ = 0;
  std::uint64_t done_ = 0;
  std::size_t inflight_ = 0;          // rounds running on the lanes
  std::set<std::uint64_t> finished_;  // rounds done out of order
  std::chrono::steady_clock::time_point last_end_{};
  int rank_ = 0;
};

std::error_code make_net_device(const std::shared_ptr<CommImpl>& comm, device::Status* status,
                                std::shared_ptr<NetDevice>& out) {
  auto net = std::make_shared<NetDevice>();
  if (auto ec = net->init(*comm)) return ec;
  if (auto ec = net->make_lanes(comm)) return ec;
  std::promise<void> started;
  asio::post(comm->executor(), [&] {
    net->start(comm, net, status);
    started.set_value();
  });
  started.get_future().wait();
  out = std::move(net);
  return {};
}

std::error_code net_launch(NetDevice& net, CommImpl& c, const OpArgs& a, cudaStream_t s,
                           cudaGraph_t graph, const device::Workspace& ws) {
  return net.launch(c, a, s, graph, ws);
}

std::error_code net_launch_a2av(NetDevice& net, CommImpl& c, const kernels::NetA2av& args,
                                cudaStream_t s, cudaGraph_t graph, const device::Workspace& ws) {
  return net.launch_a2av(c, args, s, graph, ws);
}

}  // namespace coccl::detail
