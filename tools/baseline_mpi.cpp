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

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

enum class coll_kind {
  allreduce,
  allgather,
  broadcast,
  reduce,
  reducescatter,
  alltoall,
  gather,
  scatter
};
enum class reduce_op { sum, prod, min, max };
enum class data_type { int8, uint8, int32, uint32, int64, uint64, float32, float64 };

struct options {
  coll_kind coll = coll_kind::allreduce;
  std::uint64_t min_bytes = 32ull << 20;
  std::uint64_t max_bytes = 32ull << 20;
  std::uint64_t step_factor = 2;
  std::uint64_t step_bytes = 0;
  int iters = 20;
  int warmup = 5;
  int repeat = 3;
  data_type dtype = data_type::float32;
  reduce_op op = reduce_op::sum;
  bool check = false;
};

[[noreturn]] void usage_error(const std::string& what) {
  throw std::invalid_argument(
      what +
      "\nusage: coccl-perf-mpi [--coll NAME] [-b BYTES] [-e BYTES] [-f FACTOR | -i STEP] "
      "[-n ITERS] [-w WARMUP] [--repeat R] [-d TYPE] [-o OP] [-c 0|1]");
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(std::string(what) + ": " +
                           std::string(text, static_cast<std::size_t>(len)));
}

// Suffixes are binary, as in nccl-tests: 1K = 1024.
std::uint64_t parse_size(std::string_view text) {
  if (text.empty()) usage_error("empty size");
  std::uint64_t shift = 0;
  switch (text.back()) {
    case 'k':
    case 'K':
      shift = 10;
      break;
    case 'm':
    case 'M':
      shift = 20;
      break;
    case 'g':
    case 'G':
      shift = 30;
      break;
    default:
      break;
  }
  if (shift != 0) text.remove_suffix(1);
  std::string digits(text);
  char* end = nullptr;
  const unsigned long long value = std::strtoull(digits.c_str(), &end, 10);
  if (digits.empty() || *end != '\0' || value > (UINT64_MAX >> shift)) {
    usage_error("bad size '" + digits + "'");
  }
  return static_cast<std::uint64_t>(value) << shift;
}

int parse_int(const std::string& text, int min) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < min || value > INT_MAX) {
    usage_error("bad number '" + text + "'");
  }
  return static_cast<int>(value);
}

coll_kind parse_coll(const std::string& s) {
  if (s == "allreduce") return coll_kind::allreduce;
  if (s == "allgather") return coll_kind::allgather;
  if (s == "broadcast") return coll_kind::broadcast;
  if (s == "reduce") return coll_kind::reduce;
  if (s == "reducescatter" || s == "reduce_scatter") return coll_kind::reducescatter;
  if (s == "alltoall") return coll_kind::alltoall;
  if (s == "gather") return coll_kind::gather;
  if (s == "scatter") return coll_kind::scatter;
  usage_error("unknown collective '" + s + "'");
}

const char* coll_name(coll_kind c) {
  switch (c) {
    case coll_kind::allreduce:
      return "allreduce";
    case coll_kind::allgather:
      return "allgather";
    case coll_kind::broadcast:
      return "broadcast";
    case coll_kind::reduce:
      return "reduce";
    case coll_kind::reducescatter:
      return "reducescatter";
    case coll_kind::alltoall:
      return "alltoall";
    case coll_kind::gather:
      return "gather";
    case coll_kind::scatter:
      return "scatter";
  }
  return "?";
}

bool is_reduction(coll_kind c) {
  return c == coll_kind::allreduce || c == coll_kind::reduce || c == coll_kind::reducescatter;
}

// Collectives whose size is the whole buffer across ranks, split N ways (nccl-tests semantics).
bool is_split(coll_kind c) {
  return c == coll_kind::allgather || c == coll_kind::reducescatter || c == coll_kind::alltoall ||
         c == coll_kind::gather || c == coll_kind::scatter;
}

reduce_op parse_op(const std::string& s) {
  if (s == "sum") return reduce_op::sum;
  if (s == "prod") return reduce_op::prod;
  if (s == "min") return reduce_op::min;
  if (s == "max") return reduce_op::max;
  usage_error("unknown op '" + s + "'");
}

const char* op_name(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::prod:
      return "prod";
    case reduce_op::min:
      return "min";
    case reduce_op::max:
      return "max";
  }
  return "?";
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

data_type parse_type(const std::string& s) {
  if (s == "int8" || s == "char") return data_type::int8;
  if (s == "uint8") return data_type::uint8;
  if (s == "int32" || s == "int") return data_type::int32;
  if (s == "uint32") return data_type::uint32;
  if (s == "int64") return data_type::int64;
  if (s == "uint64") return data_type::uint64;
  if (s == "float32" || s == "float") return data_type::float32;
  if (s == "float64" || s == "double") return data_type::float64;
  if (s == "float16" || s == "half" || s == "bfloat16") {
    usage_error("MPI has no standard " + s + " datatype");
  }
  usage_error("unknown data type '" + s + "'");
}

const char* type_name(data_type t) {
  switch (t) {
    case data_type::int8:
      return "int8";
    case data_type::uint8:
      return "uint8";
    case data_type::int32:
      return "int32";
    case data_type::uint32:
      return "uint32";
    case data_type::int64:
      return "int64";
    case data_type::uint64:
      return "uint64";
    case data_type::float32:
      return "float32";
    case data_type::float64:
      return "float64";
  }
  return "?";
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
    if (i + 1 >= argc) usage_error("missing value for '" + arg + "'");
    const std::string val = argv[++i];
    if (arg == "--coll")
      o.coll = parse_coll(val);
    else if (arg == "-b" || arg == "--minbytes")
      o.min_bytes = parse_size(val);
    else if (arg == "-e" || arg == "--maxbytes")
      o.max_bytes = parse_size(val);
    else if (arg == "-f" || arg == "--stepfactor")
      o.step_factor = parse_size(val);
    else if (arg == "-i" || arg == "--stepbytes")
      o.step_bytes = parse_size(val);
    else if (arg == "-n" || arg == "--iters")
      o.iters = parse_int(val, 1);
    else if (arg == "-w" || arg == "--warmup_iters")
      o.warmup = parse_int(val, 0);
    else if (arg == "--repeat")
      o.repeat = parse_int(val, 1);
    else if (arg == "-d" || arg == "--datatype")
      o.dtype = parse_type(val);
    else if (arg == "-o" || arg == "--op")
      o.op = parse_op(val);
    else if (arg == "-c" || arg == "--check")
      o.check = parse_int(val, 0) != 0;
    else
      usage_error("unknown argument '" + arg + "'");
  }
  if (o.min_bytes > o.max_bytes) usage_error("-b is larger than -e");
  if (o.step_bytes == 0 && o.step_factor < 2) usage_error("-f must be at least 2");
  return o;
}

// Element counts for one requested size. `per_rank` is what each rank contributes (or, for the
// unsplit collectives, the buffer length); `count` is the element count of the buffer the size
// names, after rounding down to a multiple of the rank count as nccl-tests does.
struct size_layout {
  std::size_t bytes;
  std::size_t count;
  std::size_t per_rank;
};

std::optional<size_layout> layout_for(coll_kind c, std::uint64_t size, std::size_t elt, int n) {
  const std::size_t count = size / elt;
  const std::size_t per_rank = is_split(c) ? count / static_cast<std::size_t>(n) : count;
  if (per_rank == 0) return std::nullopt;
  const std::size_t total = is_split(c) ? per_rank * static_cast<std::size_t>(n) : per_rank;
  return size_layout{total * elt, total, per_rank};
}

// Check patterns are small integers so every type holds inputs and results exactly. The product
// pattern puts a 2 on at most ceil(N/5) ranks per index, which keeps results inside int8 up to 30
// ranks.
double data_value(int rank, std::size_t i) {
  return static_cast<double>((static_cast<std::size_t>(rank) * 13 + i * 7) % 101);
}

double reduce_input(reduce_op op, int rank, std::size_t i) {
  const auto r = static_cast<std::size_t>(rank);
  if (op == reduce_op::prod) return (r + i) % 5 == 0 ? 2.0 : 1.0;
  return static_cast<double>((r * 5 + i * 3) % 7);
}

double reduce_expected(reduce_op op, int nranks, std::size_t i) {
  double acc = reduce_input(op, 0, i);
  for (int r = 1; r < nranks; ++r) {
    const double v = reduce_input(op, r, i);
    switch (op) {
      case reduce_op::sum:
        acc += v;
        break;
      case reduce_op::prod:
        acc *= v;
        break;
      case reduce_op::min:
        acc = std::min(acc, v);
        break;
      case reduce_op::max:
        acc = std::max(acc, v);
        break;
    }
  }
  return acc;
}

// A value that differs from the expected one, written to outputs before the check run so that an
// element the collective never wrote counts as wrong.
template <typename T>
T poison(double expected) {
  return static_cast<T>(expected + 1.0);
}

template <typename T>
std::int64_t count_wrong(const T* got, std::size_t n,
                         const std::function<double(std::size_t)>& want) {
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (got[i] != static_cast<T>(want(i))) ++wrong;
  }
  return wrong;
}

int as_count(std::size_t n) {
  if (n > static_cast<std::size_t>(INT_MAX)) throw std::runtime_error("count exceeds MPI's int");
  return static_cast<int>(n);
}

// Median over batches of the slowest rank's per-call average, in microseconds; valid on rank 0.
double time_us(const options& o, int rank, const std::function<void()>& call) {
  for (int i = 0; i < o.warmup; ++i) call();
  std::vector<double> batch_us(static_cast<std::size_t>(o.repeat));
  for (auto& us : batch_us) {
    check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) call();
    const auto t1 = std::chrono::steady_clock::now();
    us = std::chrono::duration<double, std::micro>(t1 - t0).count() / o.iters;
  }
  std::vector<double> slowest(batch_us.size());
  check_mpi(MPI_Reduce(batch_us.data(), slowest.data(), as_count(batch_us.size()), MPI_DOUBLE,
                       MPI_MAX, 0, MPI_COMM_WORLD),
            "MPI_Reduce");
  if (rank != 0) return 0.0;
  std::sort(slowest.begin(), slowest.end());
  const std::size_t mid = slowest.size() / 2;
  return slowest.size() % 2 == 1 ? slowest[mid] : (slowest[mid - 1] + slowest[mid]) / 2;
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
  std::uint64_t size = o.min_bytes;
  while (size <= o.max_bytes) {
    if (const auto l = layout_for(o.coll, size, sizeof(T), nranks)) {
      const result r = run_size<T>(o, rank, nranks, *l);
      if (rank == 0) {
        std::printf("coccl-baseline mpi %s %zu %zu %s %s %.3f %lld default\n", coll_name(o.coll),
                    l->bytes, l->count, type_name(o.dtype),
                    is_reduction(o.coll) ? op_name(o.op) : "none", r.time_us,
                    static_cast<long long>(r.wrong));
        std::fflush(stdout);
      }
    }
    const std::uint64_t next = o.step_bytes != 0 ? size + o.step_bytes : size * o.step_factor;
    if (next <= size) break;
    size = next;
  }
}

void run(const options& o) {
  int rank = 0;
  int nranks = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &nranks), "MPI_Comm_size");
  switch (o.dtype) {
    case data_type::int8:
      run_all<std::int8_t>(o, rank, nranks);
      break;
    case data_type::uint8:
      run_all<std::uint8_t>(o, rank, nranks);
      break;
    case data_type::int32:
      run_all<std::int32_t>(o, rank, nranks);
      break;
    case data_type::uint32:
      run_all<std::uint32_t>(o, rank, nranks);
      break;
    case data_type::int64:
      run_all<std::int64_t>(o, rank, nranks);
      break;
    case data_type::uint64:
      run_all<std::uint64_t>(o, rank, nranks);
      break;
    case data_type::float32:
      run_all<float>(o, rank, nranks);
      break;
    case data_type::float64:
      run_all<double>(o, rank, nranks);
      break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    std::fprintf(stderr, "coccl-perf-mpi: MPI_Init failed\n");
    return 1;
  }
  // Errors come back as codes so they can be reported before the job is torn down.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  try {
    run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coccl-perf-mpi: %s\n", e.what());
    // A lone failing rank would leave its peers blocked in the next collective.
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return 0;
}
