// coccl-perf-gloo: times Gloo's CPU collectives so that coccl-perf can report them beside coccl's
// own numbers from the same run. The parent starts one process per rank with
// `--rank R --nranks N --store DIR`; the ranks meet through a gloo FileStore in DIR and talk over
// loopback TCP. Sizes follow nccl-tests, so a row here lines up with the same row of coccl-perf.
//
// Rank 0 prints one line per size:
//   coccl-baseline gloo <coll> <bytes> <count> <type> <op> <time_us> <wrong> <algo>
// Errors go to stderr and the exit status is non-zero.

#include <gloo/algorithm.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "baseline_common.hpp"
#include "init_gate.hpp"

namespace {

using coccl_baseline::bad_usage;
using coccl_baseline::coll_kind;
using coccl_baseline::count_wrong;
using coccl_baseline::data_value;
using coccl_baseline::poison;
using coccl_baseline::reduce_expected;
using coccl_baseline::reduce_input;
using coccl_baseline::reduce_op;
using coccl_baseline::size_layout;

constexpr const char* usage_text =
    "usage: coccl-perf-gloo --rank R --nranks N --store DIR [--coll NAME] [-b BYTES] "
    "[-e BYTES] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP] [--repeat R] [-d TYPE] [-o OP] "
    "[-c 0|1] [--algo auto|LIST] [--timeout SECONDS] [--verbose]\n"
    "LIST: comma-separated ring, ring_chunked, halving_doubling, bcube (legacy classes), "
    "allreduce_ring, allreduce_bcube (gloo::allreduce)";

// The shared sweep options plus this peer's own: how its ranks meet, which allreduce algorithms
// to try, and what to log.
struct options : coccl_baseline::sweep_options {
  int rank = -1;
  int nranks = 0;
  std::string store;
  std::string algo = "auto";
  int timeout_s = 120;
  bool verbose = false;
};

options parse_args(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--verbose") {
      o.verbose = true;
      continue;
    }
    if (i + 1 >= argc) bad_usage("missing value for '" + arg + "'");
    const std::string val = argv[++i];
    if (arg == "--rank")
      o.rank = coccl_baseline::parse_int(val, 0);
    else if (arg == "--nranks")
      o.nranks = coccl_baseline::parse_int(val, 1);
    else if (arg == "--store")
      o.store = val;
    else if (arg == "--algo")
      o.algo = val;
    else if (arg == "--timeout")
      o.timeout_s = coccl_baseline::parse_int(val, 1);
    else if (!coccl_baseline::apply_sweep_option(o, arg, val))
      bad_usage("unknown argument '" + arg + "'");
  }
  if (o.nranks < 1 || o.rank < 0 || o.rank >= o.nranks) bad_usage("need 0 <= --rank < --nranks");
  if (o.store.empty()) bad_usage("--store DIR is required");
  coccl_baseline::validate_sweep(o);
  return o;
}

// `ctx` carries gloo::allreduce and the other options-based collectives plus all bookkeeping;
// `legacy_ctx`, with its own device and connections, carries the legacy algorithm classes. Sharing
// one context made gloo::allreduce's ring about 100x slower once a legacy algorithm had run on it,
// which says nothing about either algorithm on its own.
class bench {
 public:
  bench(const options& opts, std::shared_ptr<gloo::Context> ctx,
        std::shared_ptr<gloo::Context> legacy_ctx)
      : opts_(opts), ctx_(std::move(ctx)), legacy_ctx_(std::move(legacy_ctx)) {}

  void barrier() {
    gloo::BarrierOptions b(ctx_);
    gloo::barrier(b);
  }

  // Element-wise max over ranks, left on every rank so that all of them take the same decisions.
  void max_over_ranks(std::vector<double>& v) {
    gloo::AllreduceOptions a(ctx_);
    a.setOutput(v.data(), v.size());
    a.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::max<double>));
    gloo::allreduce(a);
  }

  std::int64_t sum_over_ranks(std::int64_t v) {
    gloo::AllreduceOptions a(ctx_);
    a.setOutput(&v, 1);
    a.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(
        &gloo::sum<std::int64_t>));
    gloo::allreduce(a);
    return v;
  }

  // Median over batches of the slowest rank's per-call average, in microseconds.
  double time_us(const std::function<void()>& call) {
    std::vector<double> batch_us = coccl_baseline::time_batches(
        opts_, [this] { barrier(); }, call);
    max_over_ranks(batch_us);
    return coccl_baseline::median(std::move(batch_us));
  }

  const options& opts() const { return opts_; }
  const std::shared_ptr<gloo::Context>& ctx() const { return ctx_; }
  const std::shared_ptr<gloo::Context>& legacy_ctx() const {
    if (!legacy_ctx_) throw std::logic_error("no context for legacy algorithms");
    return legacy_ctx_;
  }
  int rank() const { return ctx_->rank; }
  int nranks() const { return ctx_->size; }

 private:
  const options& opts_;
  std::shared_ptr<gloo::Context> ctx_;
  std::shared_ptr<gloo::Context> legacy_ctx_;
};

struct result {
  double time_us;
  std::int64_t wrong;
  std::string algo;
};

template <typename T>
const gloo::ReductionFunction<T>* legacy_reduction(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      return gloo::ReductionFunction<T>::sum;
    case reduce_op::prod:
      return gloo::ReductionFunction<T>::product;
    case reduce_op::min:
      return gloo::ReductionFunction<T>::min;
    case reduce_op::max:
      return gloo::ReductionFunction<T>::max;
  }
  return nullptr;
}

template <typename T>
gloo::AllreduceOptions::Func reduction(reduce_op op) {
  using fn = void (*)(void*, const void*, const void*, std::size_t);
  switch (op) {
    case reduce_op::sum:
      return static_cast<fn>(&gloo::sum<T>);
    case reduce_op::prod:
      return static_cast<fn>(&gloo::product<T>);
    case reduce_op::min:
      return static_cast<fn>(&gloo::min<T>);
    case reduce_op::max:
      return static_cast<fn>(&gloo::max<T>);
  }
  return {};
}

// The legacy algorithm classes keep counts and byte sizes in int.
void require_int_sized(std::size_t count, std::size_t elt, const char* what) {
  if (count * elt > static_cast<std::size_t>(INT_MAX)) {
    throw std::runtime_error(std::string(what) + " takes at most 2 GiB buffers");
  }
}

// One way of running allreduce. Legacy algorithms work in place on `data`; the options API reads
// `input` and writes `data`.
template <typename T>
struct allreduce_candidate {
  std::string name;
  bool in_place;
  std::function<void()> run;
  std::unique_ptr<gloo::Algorithm> legacy;
  std::unique_ptr<gloo::AllreduceOptions> api;
};

bool known_allreduce_algo(const std::string& name) {
  return name == "ring" || name == "ring_chunked" || name == "halving_doubling" ||
         name == "bcube" || name == "allreduce_ring" || name == "allreduce_bcube";
}

// `--algo` is "auto" or a comma-separated list of candidates, timed in the order given.
std::vector<std::string> allreduce_algos(const std::string& spec) {
  if (spec == "auto") {
    return {"allreduce_ring", "allreduce_bcube", "ring_chunked", "halving_doubling"};
  }
  std::vector<std::string> names;
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t comma = std::min(spec.find(',', start), spec.size());
    names.push_back(spec.substr(start, comma - start));
    if (!known_allreduce_algo(names.back())) {
      bad_usage("unknown allreduce algorithm '" + names.back() + "'");
    }
    start = comma + 1;
  }
  return names;
}

template <typename T>
std::unique_ptr<allreduce_candidate<T>> make_allreduce(bench& b, const std::string& name, T* input,
                                                       T* data, std::size_t count) {
  auto c = std::make_unique<allreduce_candidate<T>>();
  c->name = name;
  const reduce_op op = b.opts().op;
  if (name == "allreduce_ring" || name == "allreduce_bcube") {
    c->in_place = false;
    c->api = std::make_unique<gloo::AllreduceOptions>(b.ctx());
    c->api->setAlgorithm(name == "allreduce_ring" ? gloo::AllreduceOptions::Algorithm::RING
                                                  : gloo::AllreduceOptions::Algorithm::BCUBE);
    c->api->template setInput<T>(input, count);
    c->api->template setOutput<T>(data, count);
    c->api->setReduceFunction(reduction<T>(op));
    gloo::AllreduceOptions* api = c->api.get();
    c->run = [api] { gloo::allreduce(*api); };
    return c;
  }
  require_int_sized(count, sizeof(T), name.c_str());
  const auto& ctx = b.legacy_ctx();
  const std::vector<T*> ptrs{data};
  const int n = static_cast<int>(count);
  const auto* fn = legacy_reduction<T>(op);
  c->in_place = true;
  if (name == "ring") {
    c->legacy = std::make_unique<gloo::AllreduceRing<T>>(ctx, ptrs, n, fn);
  } else if (name == "ring_chunked") {
    c->legacy = std::make_unique<gloo::AllreduceRingChunked<T>>(ctx, ptrs, n, fn);
  } else if (name == "halving_doubling") {
    c->legacy = std::make_unique<gloo::AllreduceHalvingDoubling<T>>(ctx, ptrs, n, fn);
  } else if (name == "bcube") {
    c->legacy = std::make_unique<gloo::AllreduceBcube<T>>(ctx, ptrs, n, fn);
  } else {
    bad_usage("unknown allreduce algorithm '" + name + "'");
  }
  gloo::Algorithm* algo = c->legacy.get();
  c->run = [algo] { algo->run(); };
  return c;
}

// Times every candidate and keeps the fastest. The check runs every candidate, so `wrong` sums
// their errors: a zero vouches for all of them, not only for the winner.
template <typename T>
result run_allreduce(bench& b, const size_layout& l) {
  std::vector<std::string> names = allreduce_algos(b.opts().algo);
  if (l.count * sizeof(T) > static_cast<std::size_t>(INT_MAX)) {
    std::erase_if(names, [](const std::string& n) { return n.rfind("allreduce_", 0) != 0; });
  }
  if (names.empty()) throw std::runtime_error("no allreduce algorithm handles this size");

  std::vector<T> input(l.count);
  std::vector<T> data(l.count);
  result best{0.0, 0, ""};
  for (const auto& name : names) {
    // Zeros are a fixed point of every op, so repeated in-place runs keep operands finite.
    std::fill(input.begin(), input.end(), T{});
    std::fill(data.begin(), data.end(), T{});
    auto c = make_allreduce<T>(b, name, input.data(), data.data(), l.count);
    b.barrier();
    const double us = b.time_us(c->run);
    if (b.opts().verbose && b.rank() == 0) {
      std::fprintf(stderr, "# allreduce %zu bytes: %s %.3f us\n", l.bytes, name.c_str(), us);
    }
    if (best.algo.empty() || us < best.time_us) best = {us, 0, name};
    if (b.opts().check) {
      const reduce_op op = b.opts().op;
      T* src = c->in_place ? data.data() : input.data();
      for (std::size_t i = 0; i < l.count; ++i) {
        src[i] = static_cast<T>(reduce_input(op, b.rank(), i));
        if (!c->in_place) data[i] = poison<T>(reduce_expected(op, b.nranks(), i));
      }
      b.barrier();
      c->run();
      const std::int64_t wrong = count_wrong<T>(
          data.data(), l.count, [&](std::size_t i) { return reduce_expected(op, b.nranks(), i); });
      if (wrong != 0)
        std::fprintf(stderr, "rank %d: %s: %lld wrong\n", b.rank(), name.c_str(),
                     static_cast<long long>(wrong));
      best.wrong += wrong;
    }
    b.barrier();
  }
  return best;
}

// A collective other than allreduce: `prepare_check` writes inputs and poisons outputs, `verify`
// counts this rank's wrong elements after one run.
struct simple_case {
  std::string algo;
  std::function<void()> run;
  std::function<void()> prepare_check;
  std::function<std::int64_t()> verify;
};

result run_simple(bench& b, simple_case& sc) {
  result r{b.time_us(sc.run), 0, sc.algo};
  if (b.opts().check) {
    sc.prepare_check();
    b.barrier();
    sc.run();
    r.wrong = sc.verify();
  }
  return r;
}

template <typename T>
result run_size(bench& b, const size_layout& l) {
  const coll_kind coll = b.opts().coll;
  if (coll == coll_kind::allreduce) return run_allreduce<T>(b, l);

  const int rank = b.rank();
  const int nranks = b.nranks();
  const auto n = static_cast<std::size_t>(nranks);
  const std::size_t pc = l.per_rank;
  const reduce_op op = b.opts().op;
  const auto& ctx = b.ctx();
  constexpr int root = 0;

  std::vector<T> in;
  std::vector<T> out;
  simple_case sc;
  // Options objects are built once per size so the timed loop measures the collective, not the
  // setup of its buffers, in line with how coccl's own plans are timed.

  switch (coll) {
    case coll_kind::allgather: {
      in.assign(pc, T{});
      out.assign(pc * n, T{});
      auto o = std::make_shared<gloo::AllgatherOptions>(ctx);
      o->setInput(in.data(), pc);
      o->setOutput(out.data(), pc * n);
      sc = {"allgather", [o] { gloo::allgather(*o); },
            [&] {
              for (std::size_t j = 0; j < pc; ++j) in[j] = static_cast<T>(data_value(rank, j));
              for (std::size_t i = 0; i < pc * n; ++i)
                out[i] = poison<T>(data_value(static_cast<int>(i / pc), i % pc));
            },
            [&] {
              return count_wrong<T>(out.data(), pc * n, [&](std::size_t i) {
                return data_value(static_cast<int>(i / pc), i % pc);
              });
            }};
      break;
    }
    case coll_kind::broadcast: {
      in.assign(pc, T{});
      out.assign(pc, T{});
      auto o = std::make_shared<gloo::BroadcastOptions>(ctx);
      o->setRoot(root);
      if (rank == root) o->setInput(in.data(), pc);
      o->setOutput(out.data(), pc);
      sc = {"broadcast", [o] { gloo::broadcast(*o); },
            [&] {
              for (std::size_t i = 0; i < pc; ++i) {
                in[i] = static_cast<T>(data_value(rank, i));
                out[i] = poison<T>(data_value(root, i));
              }
            },
            [&] {
              return count_wrong<T>(out.data(), pc,
                                    [&](std::size_t i) { return data_value(root, i); });
            }};
      break;
    }
    case coll_kind::reduce: {
      in.assign(pc, T{});
      out.assign(pc, T{});
      auto o = std::make_shared<gloo::ReduceOptions>(ctx);
      o->setRoot(root);
      o->setInput(in.data(), pc);
      o->setOutput(out.data(), pc);
      o->setReduceFunction(reduction<T>(op));
      sc = {"reduce", [o] { gloo::reduce(*o); },
            [&] {
              for (std::size_t i = 0; i < pc; ++i) {
                in[i] = static_cast<T>(reduce_input(op, rank, i));
                out[i] = poison<T>(reduce_expected(op, nranks, i));
              }
            },
            [&]() -> std::int64_t {
              if (rank != root) return 0;
              return count_wrong<T>(out.data(), pc,
                                    [&](std::size_t i) { return reduce_expected(op, nranks, i); });
            }};
      break;
    }
    case coll_kind::reducescatter: {
      // Gloo's only reduce-scatter is the legacy in-place halving-doubling class; each rank's
      // block ends up at the front of its buffer.
      require_int_sized(pc * n, sizeof(T), "ReduceScatterHalvingDoubling");
      out.assign(pc * n, T{});
      const std::vector<int> recv_elems(n, static_cast<int>(pc));
      auto a = std::make_shared<gloo::ReduceScatterHalvingDoubling<T>>(
          b.legacy_ctx(), std::vector<T*>{out.data()}, static_cast<int>(pc * n), recv_elems,
          legacy_reduction<T>(op));
      sc = {"halving_doubling", [a] { a->run(); },
            [&] {
              for (std::size_t i = 0; i < pc * n; ++i)
                out[i] = static_cast<T>(reduce_input(op, rank, i));
            },
            [&] {
              const std::size_t base = static_cast<std::size_t>(rank) * pc;
              return count_wrong<T>(out.data(), pc, [&](std::size_t j) {
                return reduce_expected(op, nranks, base + j);
              });
            }};
      break;
    }
    case coll_kind::alltoall: {
      in.assign(pc * n, T{});
      out.assign(pc * n, T{});
      auto o = std::make_shared<gloo::AlltoallOptions>(ctx);
      o->setInput(in.data(), pc * n);
      o->setOutput(out.data(), pc * n);
      // Block p of rank s's input goes to rank p, landing in block s of p's output.
      const auto sent = [&, pc](int from, std::size_t i) {
        return data_value(from, static_cast<std::size_t>(rank) * pc + i % pc);
      };
      sc = {"alltoall", [o] { gloo::alltoall(*o); },
            [&, sent] {
              for (std::size_t i = 0; i < pc * n; ++i) {
                in[i] = static_cast<T>(data_value(rank, i));
                out[i] = poison<T>(sent(static_cast<int>(i / pc), i));
              }
            },
            [&, sent] {
              return count_wrong<T>(out.data(), pc * n, [&](std::size_t i) {
                return sent(static_cast<int>(i / pc), i);
              });
            }};
      break;
    }
    case coll_kind::gather: {
      in.assign(pc, T{});
      out.assign(rank == root ? pc * n : 0, T{});
      auto o = std::make_shared<gloo::GatherOptions>(ctx);
      o->setRoot(root);
      o->setInput(in.data(), pc);
      if (rank == root) o->setOutput(out.data(), pc * n);
      sc = {"gather", [o] { gloo::gather(*o); },
            [&] {
              for (std::size_t j = 0; j < pc; ++j) in[j] = static_cast<T>(data_value(rank, j));
              for (std::size_t i = 0; i < out.size(); ++i)
                out[i] = poison<T>(data_value(static_cast<int>(i / pc), i % pc));
            },
            [&] {
              return count_wrong<T>(out.data(), out.size(), [&](std::size_t i) {
                return data_value(static_cast<int>(i / pc), i % pc);
              });
            }};
      break;
    }
    case coll_kind::scatter: {
      in.assign(rank == root ? pc * n : 0, T{});
      out.assign(pc, T{});
      auto o = std::make_shared<gloo::ScatterOptions>(ctx);
      o->setRoot(root);
      if (rank == root) {
        std::vector<T*> blocks;
        for (std::size_t p = 0; p < n; ++p) blocks.push_back(in.data() + p * pc);
        o->setInputs(blocks, pc);
      }
      o->setOutput(out.data(), pc);
      const std::size_t base = static_cast<std::size_t>(rank) * pc;
      sc = {"scatter", [o] { gloo::scatter(*o); },
            [&, base] {
              for (std::size_t i = 0; i < in.size(); ++i)
                in[i] = static_cast<T>(data_value(root, i));
              for (std::size_t j = 0; j < pc; ++j) out[j] = poison<T>(data_value(root, base + j));
            },
            [&, base] {
              return count_wrong<T>(out.data(), pc,
                                    [&](std::size_t j) { return data_value(root, base + j); });
            }};
      break;
    }
    case coll_kind::allreduce:
      break;
  }
  b.barrier();
  result r = run_simple(b, sc);
  b.barrier();
  return r;
}

template <typename T>
void run_all(bench& b) {
  const options& o = b.opts();
  coccl_baseline::for_each_size(o, sizeof(T), b.nranks(), [&](const size_layout& l) {
    result r = run_size<T>(b, l);
    if (o.check) r.wrong = b.sum_over_ranks(r.wrong);
    if (b.rank() == 0) coccl_baseline::print_row("gloo", o, l, r.time_us, r.wrong, r.algo.c_str());
  });
}

std::shared_ptr<gloo::Context> connect(const options& o, gloo::rendezvous::Store& store) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.nranks);
  ctx->setTimeout(std::chrono::seconds(o.timeout_s));
  ctx->connectFullMesh(store, device);
  return ctx;
}

bool uses_legacy(const options& o) {
  if (o.coll == coll_kind::reducescatter) return true;
  if (o.coll != coll_kind::allreduce) return false;
  const auto names = allreduce_algos(o.algo);
  return std::any_of(names.begin(), names.end(),
                     [](const std::string& n) { return n.rfind("allreduce_", 0) != 0; });
}

void run(const options& o) {
  if (o.coll == coll_kind::allreduce) allreduce_algos(o.algo);
  gloo::rendezvous::FileStore store(o.store);
  gloo::rendezvous::PrefixStore api_store("api", store);
  auto ctx = connect(o, api_store);
  std::shared_ptr<gloo::Context> legacy_ctx;
  if (uses_legacy(o)) {
    gloo::rendezvous::PrefixStore legacy_store("legacy", store);
    legacy_ctx = connect(o, legacy_store);
  }
  bench b(o, std::move(ctx), std::move(legacy_ctx));
  coccl_baseline::visit_type(o.dtype, [&]<typename T>() { run_all<T>(b); });
  // Nobody may close its connections while a peer still has a collective in flight.
  b.barrier();
}

}  // namespace

// coccl-init-bench's peer: `--init DIR RANK NRANKS` times a FileStore rendezvous in DIR,
// connectFullMesh and a first allreduce of one float from the start gate (tools/init_gate.hpp).
int init_main(const std::string& dir, int rank, int nranks) {
  coccl_init_gate::wait_for_go(dir, rank);
  const double t0 = coccl_init_gate::now_us();
  gloo::rendezvous::FileStore store(dir + "/store");
  options o;
  o.rank = rank;
  o.nranks = nranks;
  auto ctx = connect(o, store);
  float x = 1;
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(&x, 1);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
  gloo::allreduce(opts);
  const double t1 = coccl_init_gate::now_us();
  coccl_init_gate::write_result(dir, rank, t0, t1, x == static_cast<float>(nranks));
  return 0;
}

int main(int argc, char** argv) {
  try {
    if (argc == 5 && std::string(argv[1]) == "--init")
      return init_main(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
    run(parse_args(argc, argv));
    return 0;
  } catch (const std::exception& e) {
    coccl_baseline::report_error("coccl-perf-gloo", e, usage_text);
    return 1;
  }
}
