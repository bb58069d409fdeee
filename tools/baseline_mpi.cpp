// coccl-perf-mpi: times MPI's collectives so that coccl-perf can report them beside coccl's own
// numbers from the same run. The parent launches it as
//   mpirun --allow-run-as-root --oversubscribe --bind-to none -np N coccl-perf-mpi <args>
// Sizes follow nccl-tests, so a row here lines up with the same row of coccl-perf.
//
// Rank 0 prints one line per size:
//   coccl-baseline mpi <coll> <bytes> <count> <type> <op> <time_us> <wrong> <algo>
// `algo` is "default": the MPI library picks its algorithm and does not say which.
// Errors go to stderr and abort the whole job with a non-zero status.

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
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
// This peer takes only the shared options.
using options = coccl_baseline::sweep_options;

constexpr const char* usage_text =
    "usage: coccl-perf-mpi [--coll NAME] [-b BYTES] [-e BYTES] [-f FACTOR | -i STEP] "
    "[-n ITERS] [-w WARMUP] [--repeat R] [-d TYPE] [-o OP] [-c 0|1]";

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(what) + ": " +
                           std::string(text, static_cast<std::size_t>(len)));
}

MPI_Op mpi_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      return MPI_SUM;
    case reduce_op::prod:
      return MPI_PROD;
    case reduce_op::min:
      return MPI_MIN;
    case reduce_op::max:
      return MPI_MAX;
  }
  return MPI_OP_NULL;
}

template <typename T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, std::int8_t>)
    return MPI_INT8_T;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return MPI_UINT8_T;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::uint32_t>)
    return MPI_UINT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return MPI_UINT64_T;
  else if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else
    return MPI_DOUBLE;
}

options parse_args(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) bad_usage("missing value for '" + arg + "'");
    const std::string val = argv[++i];
    if ((arg == "-d" || arg == "--datatype") &&
        (val == "float16" || val == "half" || val == "bfloat16")) {
      bad_usage("MPI has no standard " + val + " datatype");
    }
    if (!coccl_baseline::apply_sweep_option(o, arg, val)) {
      bad_usage("unknown argument '" + arg + "'");
    }
  }
  coccl_baseline::validate_sweep(o);
  return o;
}

int as_count(std::size_t n) {
  if (n > static_cast<std::size_t>(INT_MAX)) throw std::runtime_error("count exceeds MPI's int");
  return static_cast<int>(n);
}

// Median over batches of the slowest rank's per-call average, in microseconds; valid on rank 0.
double time_us(const options& o, int rank, const std::function<void()>& call) {
  const std::vector<double> batch_us = coccl_baseline::time_batches(
      o, [] { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }, call);
  std::vector<double> slowest(batch_us.size());
  check_mpi(MPI_Reduce(batch_us.data(), slowest.data(), as_count(batch_us.size()), MPI_DOUBLE,
                       MPI_MAX, 0, MPI_COMM_WORLD),
            "MPI_Reduce");
  if (rank != 0) return 0.0;
  return coccl_baseline::median(std::move(slowest));
}

struct result {
  double time_us;
  std::int64_t wrong;
};

template <typename T>
result run_size(const options& o, int rank, int nranks, const size_layout& l) {
  const auto n = static_cast<std::size_t>(nranks);
  const std::size_t pc = l.per_rank;
  const int cnt = as_count(pc);
  const MPI_Datatype type = mpi_type<T>();
  const MPI_Op op = mpi_op(o.op);
  constexpr int root = 0;
  const MPI_Comm comm = MPI_COMM_WORLD;

  std::vector<T> in;
  std::vector<T> out;
  std::function<void()> call;
  std::function<void()> prepare_check;
  std::function<std::int64_t()> verify;

  // Inputs and outputs are distinct buffers, as in nccl-tests' default out-of-place mode.
  switch (o.coll) {
    case coll_kind::allreduce:
    case coll_kind::reduce: {
      in.assign(pc, T{});
      out.assign(pc, T{});
      const bool all = o.coll == coll_kind::allreduce;
      call = [&, all] {
        check_mpi(all ? MPI_Allreduce(in.data(), out.data(), cnt, type, op, comm)
                      : MPI_Reduce(in.data(), out.data(), cnt, type, op, root, comm),
                  all ? "MPI_Allreduce" : "MPI_Reduce");
      };
      prepare_check = [&] {
        for (std::size_t i = 0; i < pc; ++i) {
          in[i] = static_cast<T>(reduce_input(o.op, rank, i));
          out[i] = poison<T>(reduce_expected(o.op, nranks, i));
        }
      };
      verify = [&, all]() -> std::int64_t {
        if (!all && rank != root) return 0;
        return count_wrong<T>(out.data(), pc,
                              [&](std::size_t i) { return reduce_expected(o.op, nranks, i); });
      };
      break;
    }
    case coll_kind::broadcast: {
      // MPI_Bcast is in place; the root's buffer is its input.
      out.assign(pc, T{});
      call = [&] { check_mpi(MPI_Bcast(out.data(), cnt, type, root, comm), "MPI_Bcast"); };
      prepare_check = [&] {
        for (std::size_t i = 0; i < pc; ++i) {
          out[i] =
              rank == root ? static_cast<T>(data_value(root, i)) : poison<T>(data_value(root, i));
        }
      };
      verify = [&] {
        return count_wrong<T>(out.data(), pc, [&](std::size_t i) { return data_value(root, i); });
      };
      break;
    }
    case coll_kind::allgather:
    case coll_kind::gather: {
      const bool all = o.coll == coll_kind::allgather;
      in.assign(pc, T{});
      out.assign(all || rank == root ? pc * n : 0, T{});
      call = [&, all] {
        check_mpi(all ? MPI_Allgather(in.data(), cnt, type, out.data(), cnt, type, comm)
                      : MPI_Gather(in.data(), cnt, type, out.data(), cnt, type, root, comm),
                  all ? "MPI_Allgather" : "MPI_Gather");
      };
      prepare_check = [&] {
        for (std::size_t j = 0; j < pc; ++j) in[j] = static_cast<T>(data_value(rank, j));
        for (std::size_t i = 0; i < out.size(); ++i)
          out[i] = poison<T>(data_value(static_cast<int>(i / pc), i % pc));
      };
      verify = [&] {
        return count_wrong<T>(out.data(), out.size(), [&](std::size_t i) {
          return data_value(static_cast<int>(i / pc), i % pc);
        });
      };
      break;
    }
    case coll_kind::reducescatter: {
      in.assign(pc * n, T{});
      out.assign(pc, T{});
      const std::size_t base = static_cast<std::size_t>(rank) * pc;
      call = [&] {
        check_mpi(MPI_Reduce_scatter_block(in.data(), out.data(), cnt, type, op, comm),
                  "MPI_Reduce_scatter_block");
      };
      prepare_check = [&, base] {
        for (std::size_t i = 0; i < pc * n; ++i)
          in[i] = static_cast<T>(reduce_input(o.op, rank, i));
        for (std::size_t j = 0; j < pc; ++j)
          out[j] = poison<T>(reduce_expected(o.op, nranks, base + j));
      };
      verify = [&, base] {
        return count_wrong<T>(
            out.data(), pc, [&](std::size_t j) { return reduce_expected(o.op, nranks, base + j); });
      };
      break;
    }
    case coll_kind::alltoall: {
      in.assign(pc * n, T{});
      out.assign(pc * n, T{});
      // Block p of rank s's input goes to rank p, landing in block s of p's output.
      const auto sent = [rank, pc](std::size_t i) {
        return data_value(static_cast<int>(i / pc), static_cast<std::size_t>(rank) * pc + i % pc);
      };
      call = [&] {
        check_mpi(MPI_Alltoall(in.data(), cnt, type, out.data(), cnt, type, comm), "MPI_Alltoall");
      };
      prepare_check = [&, sent] {
        for (std::size_t i = 0; i < pc * n; ++i) {
          in[i] = static_cast<T>(data_value(rank, i));
          out[i] = poison<T>(sent(i));
        }
      };
      verify = [&, sent] { return count_wrong<T>(out.data(), pc * n, sent); };
      break;
    }
    case coll_kind::scatter: {
      in.assign(rank == root ? pc * n : 0, T{});
      out.assign(pc, T{});
      const std::size_t base = static_cast<std::size_t>(rank) * pc;
      call = [&] {
        check_mpi(MPI_Scatter(in.data(), cnt, type, out.data(), cnt, type, root, comm),
                  "MPI_Scatter");
      };
      prepare_check = [&, base] {
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<T>(data_value(root, i));
        for (std::size_t j = 0; j < pc; ++j) out[j] = poison<T>(data_value(root, base + j));
      };
      verify = [&, base] {
        return count_wrong<T>(out.data(), pc,
                              [&](std::size_t j) { return data_value(root, base + j); });
      };
      break;
    }
  }

  result r{time_us(o, rank, call), 0};
  if (o.check) {
    prepare_check();
    check_mpi(MPI_Barrier(comm), "MPI_Barrier");
    call();
    const std::int64_t mine = verify();
    check_mpi(MPI_Reduce(&mine, &r.wrong, 1, MPI_INT64_T, MPI_SUM, root, comm), "MPI_Reduce");
  }
  return r;
}

template <typename T>
void run_all(const options& o, int rank, int nranks) {
  coccl_baseline::for_each_size(o, sizeof(T), nranks, [&](const size_layout& l) {
    const result r = run_size<T>(o, rank, nranks, l);
    if (rank == 0) coccl_baseline::print_row("mpi", o, l, r.time_us, r.wrong, "default");
  });
}

void run(const options& o) {
  int rank = 0;
  int nranks = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &nranks), "MPI_Comm_size");
  // parse_args() turned float16 away, so no MPI code is built for it.
  coccl_baseline::visit_type<false>(o.dtype, [&]<typename T>() { run_all<T>(o, rank, nranks); });
}

}  // namespace

// coccl-init-bench's peer: `--init DIR` times MPI_Init plus a first MPI_Allreduce of one float
// from the start gate (tools/init_gate.hpp).
int init_main(int argc, char** argv, const std::string& dir) {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  if (r == nullptr) r = std::getenv("PMI_RANK");
  if (r == nullptr) {
    std::fprintf(stderr, "coccl-perf-mpi --init: no rank in the environment (run under mpiexec)\n");
    return 1;
  }
  const int rank = std::atoi(r);
  try {
    coccl_init_gate::wait_for_go(dir, rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coccl-perf-mpi --init: %s\n", e.what());
    return 1;
  }
  const double t0 = coccl_init_gate::now_us();
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) return 1;
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  float x = 1, y = 0;
  const int rc = MPI_Allreduce(&x, &y, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double t1 = coccl_init_gate::now_us();
  coccl_init_gate::write_result(dir, rank, t0, t1, rc == MPI_SUCCESS && y == static_cast<float>(n));
  MPI_Finalize();
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--init") return init_main(argc, argv, argv[2]);
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    std::fprintf(stderr, "coccl-perf-mpi: MPI_Init failed\n");
    return 1;
  }
  // Errors come back as codes so they can be reported before the job is torn down.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  try {
    run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    coccl_baseline::report_error("coccl-perf-mpi", e, usage_text);
    // A lone failing rank would leave its peers blocked in the next collective.
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return 0;
}
