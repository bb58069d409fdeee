// examples/trainer/trainer.cpp: data-parallel training of a small MLP with coccl.
//
//   coccl-example-trainer [--ranks N] [--steps S] [--batch B] [--layers L] [--hidden H]
//                         [--bucket-kb K] [--no-overlap | --compare] [--device host|cuda]
//                         [--share-gpus]
//                         [--lr LR] [--momentum M] [--loss-file FILE]
//
// Every rank holds a replica of the model and trains on its share of each global batch (rank r
// takes samples [r*B/N, (r+1)*B/N)). Gradients are bucketed: a bucket is a run of consecutive
// layers of at least K KiB, and as soon as the backward pass has produced a bucket's last layer
// (going from the output towards the input) a coroutine co_awaits its all_reduce while the
// backward pass goes on with the earlier layers. The step then waits for every bucket, and SGD
// with momentum updates the weights, identically on every rank. With --no-overlap the backward
// pass runs to the end first and the buckets are reduced afterwards; --compare trains twice
// from the same start, with and without overlap, and prints both step times.
//
// Started with --ranks N it runs N local processes; under torchrun, mpirun or srun every
// process is a rank (Communicator::from_env()). Rank 0 prints the loss of every step (the mean
// over the global batch) and, with --loss-file, writes "step loss" lines to FILE.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cmath>
#include <coccl/coccl.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "../common/local_ranks.hpp"
#include "mlp.hpp"

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  trainer::Config model;
  int ranks = 0, steps = 20;
  std::size_t bucket_kib = 256;
  bool overlap = true, compare = false, cuda = false, share_gpus = false;
  float lr = 0.05f, momentum = 0.9f;
  std::string loss_file;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "coccl-example-trainer: %s\n"
               "usage: coccl-example-trainer [--ranks N] [--steps S] [--batch B] [--layers L]\n"
               "  [--hidden H] [--bucket-kb K] [--no-overlap | --compare] [--device host|cuda]\n"
               "  [--share-gpus]  (more ranks than GPUs: they share them in turn; start the MPS\n"
               "                   daemon first, or their kernels take turns on the GPU)\n"
               "  [--lr LR] [--momentum M] [--loss-file FILE]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    auto num = [&](int lo) {
      const std::string v = val();
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (*end || x < lo || x > 1 << 20) usage("bad value '" + v + "' for " + a);
      return static_cast<int>(x);
    };
    if (a == "--ranks")
      o.ranks = num(1);
    else if (a == "--steps")
      o.steps = num(1);
    else if (a == "--batch")
      o.model.global_batch = num(1);
    else if (a == "--layers")
      o.model.layers = num(2);
    else if (a == "--hidden")
      o.model.hidden = num(1);
    else if (a == "--bucket-kb")
      o.bucket_kib = static_cast<std::size_t>(num(0));
    else if (a == "--no-overlap")
      o.overlap = false;
    else if (a == "--compare")
      o.compare = true;
    else if (a == "--share-gpus")
      o.share_gpus = true;
    else if (a == "--lr")
      o.lr = std::strtof(val().c_str(), nullptr);
    else if (a == "--momentum")
      o.momentum = std::strtof(val().c_str(), nullptr);
    else if (a == "--loss-file")
      o.loss_file = val();
    else if (a == "--device") {
      const std::string d = val();
      if (d != "host" && d != "cuda") usage("--device takes host or cuda");
      o.cuda = d == "cuda";
    } else
      usage("unknown argument '" + a + "'");
  }
  if (o.compare && !o.overlap) usage("--compare runs both ways; leave out --no-overlap");
  return o;
}

// A run of consecutive layers whose gradients are reduced together: layers [first, last], whose
// gradients are contiguous in the flat buffer.
struct Bucket {
  int first_layer, last_layer;
  std::size_t offset, count;
};

// From the output layer backwards (the order the backward pass produces them), each bucket
// closed once it holds at least `cap` bytes.
std::vector<Bucket> make_buckets(const trainer::Config& c, std::size_t cap) {
  const auto off = trainer::layer_offsets(c);
  std::vector<Bucket> out;
  int last = c.layers - 1;
  for (int l = c.layers - 1; l >= 0; --l)
    if ((off[last + 1] - off[l]) * sizeof(float) >= cap || l == 0) {
      out.push_back({l, last, off[l], off[last + 1] - off[l]});
      last = l - 1;
    }
  return out;
}

struct StepStats {
  double loss, step_ms, backward_ms, wait_ms;
};

// Buckets in flight: the step's coroutine sleeps on `wake` until `count` drops to zero.
struct InFlight {
  explicit InFlight(const asio::any_io_executor& ex) : wake(ex) {}
  int count = 0;
  std::error_code first_error;
  asio::steady_timer wake;
};

asio::awaitable<std::error_code> all_reduce_bucket(coccl::Communicator comm, float* g,
                                                   std::size_t n, bool device, void* stream) {
  if (device)
    co_return std::get<0>(co_await comm.async_all_reduce(
        g, g, n, coccl::DataType::float32, coccl::ReduceOp::sum,
        static_cast<coccl::cuda_stream>(stream), asio::as_tuple(asio::use_awaitable)));
  co_return std::get<0>(co_await comm.async_all_reduce(g, g, n, coccl::DataType::float32,
                                                       coccl::ReduceOp::sum,
                                                       asio::as_tuple(asio::use_awaitable)));
}

// Starts bucket b's all_reduce. co_spawn from the loop's own thread runs the new coroutine up to
// its first suspension, which is the all_reduce's initiation: the gradients are on their way
// (the proxy thread moves them) before the caller goes back to computing.
void start_bucket(coccl::Communicator& comm, trainer::Model& model, const Bucket& b,
                  InFlight& flight) {
  model.fence_gradients();
  ++flight.count;
  asio::co_spawn(flight.wake.get_executor(),
                 all_reduce_bucket(comm, model.gradients() + b.offset, b.count, model.on_device(),
                                   model.comm_stream()),
                 [&flight](std::exception_ptr e, std::error_code ec) {
                   if (e && !ec) ec = coccl::errc::internal;
                   if (ec && !flight.first_error) flight.first_error = ec;
                   if (--flight.count == 0) flight.wake.cancel();
                 });
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Trains `o.steps` steps; throws std::system_error when a collective fails.
asio::awaitable<std::vector<StepStats>> train(coccl::Communicator comm, trainer::Model* model,
                                              Options o, bool overlap) {
  const int n = comm.size(), rank = comm.rank(), batch = o.model.global_batch;
  const int first = rank * batch / n, count = (rank + 1) * batch / n - first;
  const std::vector<Bucket> buckets = make_buckets(o.model, o.bucket_kib * 1024);
  InFlight flight(co_await asio::this_coro::executor);
  std::vector<StepStats> stats;
  for (int step = 0; step < o.steps; ++step) {
    const auto t0 = Clock::now();
    double loss = model->forward(step, first, count);
    std::size_t next = 0;
    for (int l = o.model.layers - 1; l >= 0; --l) {
      model->backward_layer(l);
      if (overlap && buckets[next].first_layer == l)
        start_bucket(comm, *model, buckets[next++], flight);
    }
    for (; next < buckets.size(); ++next) start_bucket(comm, *model, buckets[next], flight);
    const auto t1 = Clock::now();
    while (flight.count > 0) {
      flight.wake.expires_at(asio::steady_timer::time_point::max());
      co_await flight.wake.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    if (flight.first_error) throw std::system_error(flight.first_error, comm.last_error());
    const auto t2 = Clock::now();
    auto [ec] =
        co_await comm.async_all_reduce(&loss, &loss, 1, coccl::DataType::float64,
                                       coccl::ReduceOp::sum, asio::as_tuple(asio::use_awaitable));
    if (ec) throw std::system_error(ec, comm.last_error());
    model->sgd_step(o.lr, o.momentum);
    model->synchronize();
    stats.push_back(
        {loss / batch, ms_between(t0, Clock::now()), ms_between(t0, t1), ms_between(t1, t2)});
  }
  co_return stats;
}

std::vector<StepStats> run_training(coccl::Communicator& comm, const Options& o, int device,
                                    bool overlap) {
  std::unique_ptr<trainer::Model> model =
      o.cuda ? trainer::make_cuda_model(o.model, device) : trainer::make_cpu_model(o.model);
  // The training loop has its own thread and event loop: the computation must not run on the
  // communicator's executor, whose thread drives the transfers it overlaps with.
  asio::io_context io;
  std::vector<StepStats> stats;
  std::exception_ptr failed;
  asio::co_spawn(io, train(comm, model.get(), o, overlap),
                 [&](std::exception_ptr e, std::vector<StepStats> s) {
                   failed = e;
                   stats = std::move(s);
                 });
  io.run();
  if (failed) std::rethrow_exception(failed);
  return stats;
}

struct Means {
  double step, backward, wait;
};

// Over steps 1.. (step 0 includes first-touch and connection costs).
Means means(const std::vector<StepStats>& s) {
  Means m{0, 0, 0};
  const std::size_t from = s.size() > 1 ? 1 : 0;
  for (std::size_t i = from; i < s.size(); ++i) {
    m.step += s[i].step_ms;
    m.backward += s[i].backward_ms;
    m.wait += s[i].wait_ms;
  }
  const double k = static_cast<double>(s.size() - from);
  return {m.step / k, m.backward / k, m.wait / k};
}

int local_rank(int rank) {
  for (const char* v : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return rank;
}

int run_rank(coccl::Communicator comm, const Options& o) {
  const int rank = comm.rank(), n = comm.size();
  if (o.model.global_batch < n) {
    if (rank == 0)
      std::fprintf(stderr, "trainer: --batch %d is less than one sample per rank\n",
                   o.model.global_batch);
    comm.destroy();
    return 2;
  }
  const int device = o.cuda ? local_rank(rank) % trainer::cuda_devices() : -1;
  const auto buckets = make_buckets(o.model, o.bucket_kib * 1024);
  if (rank == 0) {
    std::string shape = std::to_string(o.model.inputs);
    for (int l = 0; l < o.model.layers; ++l)
      shape.append(1, '-').append(std::to_string(trainer::layer_outputs(o.model, l)));
    std::printf(
        "trainer: %d rank%s, %s, MLP %s (%zu parameters), global batch %d, %zu buckets "
        "of >= %zu KiB, overlap %s\n",
        n, n == 1 ? "" : "s", o.cuda ? "cuBLAS on GPUs" : "host memory", shape.c_str(),
        trainer::layer_offsets(o.model).back(), o.model.global_batch, buckets.size(), o.bucket_kib,
        o.compare   ? "on, then off"
        : o.overlap ? "on"
                    : "off");
    std::fflush(stdout);
  }
  try {
    const std::vector<StepStats> s = run_training(comm, o, device, o.overlap);
    if (rank == 0) {
      std::FILE* f = o.loss_file.empty() ? nullptr : std::fopen(o.loss_file.c_str(), "w");
      if (!o.loss_file.empty() && !f) {
        std::perror(o.loss_file.c_str());
        comm.abort();
        return 1;
      }
      for (std::size_t i = 0; i < s.size(); ++i) {
        std::printf(
            "step %2zu  loss %.7f  %7.2f ms  (backward %.2f ms, then waited %.2f ms for "
            "all_reduce)\n",
            i, s[i].loss, s[i].step_ms, s[i].backward_ms, s[i].wait_ms);
        if (f) std::fprintf(f, "%zu %.9g\n", i, s[i].loss);
      }
      if (f) std::fclose(f);
      const Means m = means(s);
      std::printf(
          "mean step %.2f ms (backward %.2f ms, waiting for all_reduce %.2f ms), overlap "
          "%s\n",
          m.step, m.backward, m.wait, o.overlap ? "on" : "off");
    }
    if (o.compare) {
      const std::vector<StepStats> s2 = run_training(comm, o, device, false);
      if (rank == 0) {
        const Means on = means(s), off = means(s2);
        // Bit for bit: a diverged run's NaN losses are the same run too.
        bool same = true;
        for (std::size_t i = 0; i < s.size(); ++i)
          same = same && std::memcmp(&s[i].loss, &s2[i].loss, sizeof s[i].loss) == 0;
        std::printf("mean step %.2f ms (backward %.2f ms, then all_reduce %.2f ms), overlap off\n",
                    off.step, off.backward, off.wait);
        std::printf("overlap saves %.2f ms per step (%.1f%%); loss curves %s\n", off.step - on.step,
                    100.0 * (off.step - on.step) / off.step, same ? "identical" : "DIFFER");
        for (std::size_t i = 0; i < s.size(); ++i)
          if (!std::isfinite(s[i].loss)) {
            std::printf("the loss is not finite from step %zu: training diverged (lower --lr)\n",
                        i);
            break;
          }
        if (!same) {
          comm.destroy();
          return 1;
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer rank %d: %s\n", rank, e.what());
    comm.abort();
    return 1;
  }
  comm.destroy();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.cuda && trainer::cuda_devices() == 0) {
    std::printf("trainer: --device cuda needs a GPU (and a build with CUDA); skipped\n");
    return 77;
  }
  if (o.cuda && o.ranks > trainer::cuda_devices() && !o.share_gpus &&
      !std::getenv("COCCL_EXAMPLE_ID")) {
    // Ranks sharing a GPU need MPS (their kernels wait for each other): only on request.
    std::printf("trainer: --ranks %d --device cuda needs %d GPUs, found %d; skipped\n", o.ranks,
                o.ranks, trainer::cuda_devices());
    return 77;
  }
  try {
    coccl::Communicator comm = example::join();
    if (comm) return run_rank(std::move(comm), o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer: cannot join the job: %s\n", e.what());
    return 1;
  }
  return example::run_local_ranks(argv, o.ranks > 0 ? o.ranks : 1);
}
