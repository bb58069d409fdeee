// What the baseline peers coccl-perf-gloo and coccl-perf-mpi share: the command-line options that
// pick the size sweep, the sweep itself and the buffer shape of each size (nccl-tests semantics),
// the check patterns with their reference results, the batch timing, and the one output line that
// coccl-perf parses:
//   coccl-baseline <peer> <coll> <bytes> <count> <type> <op> <time_us> <wrong> <algo>
// Keeping these in one place is what makes a row of one peer line up with the same row of the
// other and of coccl-perf itself.
//
// Everything here is header-only and free of any collective library, so each peer includes it
// with its own library's headers and nothing else to link.

#pragma once

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

namespace coccl_baseline {

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
enum class data_type { int8, uint8, int32, uint32, int64, uint64, float16, float32, float64 };

/// A bad command line. The message names the problem only; report_error() adds the peer's usage
/// text, so shared parsers need not know which peer they serve.
class usage_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Throws usage_error with `what`.
[[noreturn]] inline void bad_usage(const std::string& what) { throw usage_error(what); }

/// Writes `program: what` to stderr, followed on the next line by `usage` when `e` is a
/// usage_error.
inline void report_error(const char* program, const std::exception& e, const char* usage) {
  if (dynamic_cast<const usage_error*>(&e) != nullptr) {
    std::fprintf(stderr, "%s: %s\n%s\n", program, e.what(), usage);
  } else {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
  }
}

/// Parses a byte count with an optional binary suffix, as nccl-tests does: 1K = 1024, also M and
/// G, either case. Throws usage_error on anything else or on overflow.
inline std::uint64_t parse_size(std::string_view text) {
  if (text.empty()) bad_usage("empty size");
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
    bad_usage("bad size '" + digits + "'");
  }
  return static_cast<std::uint64_t>(value) << shift;
}

/// Parses a decimal int no smaller than `min`; throws usage_error otherwise.
inline int parse_int(const std::string& text, int min) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < min || value > INT_MAX) {
    bad_usage("bad number '" + text + "'");
  }
  return static_cast<int>(value);
}

/// Parses a collective's name as coccl-perf spells it (`reduce_scatter` also accepted).
inline coll_kind parse_coll(const std::string& s) {
  if (s == "allreduce") return coll_kind::allreduce;
  if (s == "allgather") return coll_kind::allgather;
  if (s == "broadcast") return coll_kind::broadcast;
  if (s == "reduce") return coll_kind::reduce;
  if (s == "reducescatter" || s == "reduce_scatter") return coll_kind::reducescatter;
  if (s == "alltoall") return coll_kind::alltoall;
  if (s == "gather") return coll_kind::gather;
  if (s == "scatter") return coll_kind::scatter;
  bad_usage("unknown collective '" + s + "'");
}

/// The name printed in the output line; parse_coll() reads it back.
inline const char* coll_name(coll_kind c) {
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

/// Whether `c` combines values with a reduce_op (and so prints one).
inline bool is_reduction(coll_kind c) {
  return c == coll_kind::allreduce || c == coll_kind::reduce || c == coll_kind::reducescatter;
}

/// Collectives whose size is the whole buffer across ranks, split N ways (nccl-tests semantics).
inline bool is_split(coll_kind c) {
  return c == coll_kind::allgather || c == coll_kind::reducescatter || c == coll_kind::alltoall ||
         c == coll_kind::gather || c == coll_kind::scatter;
}

/// Parses a reduction's name: sum, prod, min or max.
inline reduce_op parse_op(const std::string& s) {
  if (s == "sum") return reduce_op::sum;
  if (s == "prod") return reduce_op::prod;
  if (s == "min") return reduce_op::min;
  if (s == "max") return reduce_op::max;
  bad_usage("unknown op '" + s + "'");
}

/// The name printed in the output line; parse_op() reads it back.
inline const char* op_name(reduce_op op) {
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

/// Parses a data type's name, nccl-tests' aliases included. A peer without some type rejects its
/// names before calling this.
inline data_type parse_type(const std::string& s) {
  if (s == "int8" || s == "char") return data_type::int8;
  if (s == "uint8") return data_type::uint8;
  if (s == "int32" || s == "int") return data_type::int32;
  if (s == "uint32") return data_type::uint32;
  if (s == "int64") return data_type::int64;
  if (s == "uint64") return data_type::uint64;
  if (s == "float16" || s == "half") return data_type::float16;
  if (s == "float32" || s == "float") return data_type::float32;
  if (s == "float64" || s == "double") return data_type::float64;
  bad_usage("unknown data type '" + s + "'");
}

/// The name printed in the output line; parse_type() reads it back.
inline const char* type_name(data_type t) {
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
    case data_type::float16:
      return "float16";
    case data_type::float32:
      return "float32";
    case data_type::float64:
      return "float64";
  }
  return "?";
}

/// Calls `f.template operator()<T>()` with T the C++ type of `t`. A peer that cannot run float16
/// passes `Float16 = false`, so the body is never instantiated for _Float16; such a peer rejects
/// the type while parsing, and reaching it here anyway is a logic_error.
template <bool Float16 = true, typename F>
void visit_type(data_type t, F&& f) {
  switch (t) {
    case data_type::int8:
      return f.template operator()<std::int8_t>();
    case data_type::uint8:
      return f.template operator()<std::uint8_t>();
    case data_type::int32:
      return f.template operator()<std::int32_t>();
    case data_type::uint32:
      return f.template operator()<std::uint32_t>();
    case data_type::int64:
      return f.template operator()<std::int64_t>();
    case data_type::uint64:
      return f.template operator()<std::uint64_t>();
    case data_type::float16:
      if constexpr (Float16) {
        return f.template operator()<_Float16>();
      } else {
        throw std::logic_error("float16 reached a peer without it");
      }
    case data_type::float32:
      return f.template operator()<float>();
    case data_type::float64:
      return f.template operator()<double>();
  }
}

/// The options every peer takes: which collective, which sizes, how long to time, and whether to
/// check. Defaults match coccl-perf's.
struct sweep_options {
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

/// Applies the shared option `arg` with its value `val` to `o`. Returns false, leaving `o` as it
/// was, when `arg` is not a shared option; throws usage_error for a bad value.
inline bool apply_sweep_option(sweep_options& o, const std::string& arg, const std::string& val) {
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
    return false;
  return true;
}

/// Throws usage_error when the sweep cannot make progress or is empty by construction. Call it
/// after the peer's own checks, so that those are reported first.
inline void validate_sweep(const sweep_options& o) {
  if (o.min_bytes > o.max_bytes) bad_usage("-b is larger than -e");
  if (o.step_bytes == 0 && o.step_factor < 2) bad_usage("-f must be at least 2");
}

/// Element counts for one requested size. `per_rank` is what each rank contributes (or, for the
/// unsplit collectives, the buffer length); `count` is the element count of the buffer the size
/// names, after rounding down to a multiple of the rank count as nccl-tests does.
struct size_layout {
  std::size_t bytes;
  std::size_t count;
  std::size_t per_rank;
};

/// The layout of `size` bytes of `elt`-byte elements over `n` ranks, or nothing when a rank's
/// share would be empty (nccl-tests skips such sizes too).
inline std::optional<size_layout> layout_for(coll_kind c, std::uint64_t size, std::size_t elt,
                                             int n) {
  const std::size_t count = size / elt;
  const std::size_t per_rank = is_split(c) ? count / static_cast<std::size_t>(n) : count;
  if (per_rank == 0) return std::nullopt;
  const std::size_t total = is_split(c) ? per_rank * static_cast<std::size_t>(n) : per_rank;
  return size_layout{total * elt, total, per_rank};
}

/// Calls `f(layout)` for each size of the sweep from -b to -e, stepping by -i bytes or by a factor
/// of -f, skipping sizes with an empty layout. Stops early rather than loop if a step overflows.
template <typename F>
void for_each_size(const sweep_options& o, std::size_t elt, int nranks, F&& f) {
  std::uint64_t size = o.min_bytes;
  while (size <= o.max_bytes) {
    if (const auto l = layout_for(o.coll, size, elt, nranks)) f(*l);
    const std::uint64_t next = o.step_bytes != 0 ? size + o.step_bytes : size * o.step_factor;
    if (next <= size) break;
    size = next;
  }
}

/// Prints the line coccl-perf reads for one size, then flushes so that the parent sees each row
/// as soon as it exists. `peer` names the library; `algo` is what it ran.
inline void print_row(const char* peer, const sweep_options& o, const size_layout& l,
                      double time_us, std::int64_t wrong, const char* algo) {
  std::printf("coccl-baseline %s %s %zu %zu %s %s %.3f %lld %s\n", peer, coll_name(o.coll), l.bytes,
              l.count, type_name(o.dtype), is_reduction(o.coll) ? op_name(o.op) : "none", time_us,
              static_cast<long long>(wrong), algo);
  std::fflush(stdout);
}

/// Runs `call` -w times untimed, then -repeat batches of -n calls, each batch started right
/// after `barrier()` so the ranks begin together. Returns this rank's average microseconds per
/// call for each batch; the peer combines them over ranks and takes median().
template <typename Barrier>
std::vector<double> time_batches(const sweep_options& o, Barrier&& barrier,
                                 const std::function<void()>& call) {
  for (int i = 0; i < o.warmup; ++i) call();
  std::vector<double> batch_us(static_cast<std::size_t>(o.repeat));
  for (auto& us : batch_us) {
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) call();
    const auto t1 = std::chrono::steady_clock::now();
    us = std::chrono::duration<double, std::micro>(t1 - t0).count() / o.iters;
  }
  return batch_us;
}

/// The median of a non-empty `v`; the mean of the middle two for an even size.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

// Check patterns are small integers so every type, float16 included, holds inputs and results
// exactly. The product pattern puts a 2 on at most ceil(N/5) ranks per index, which keeps results
// inside int8 up to 30 ranks.

/// The value rank `rank` holds at index `i` of a data-movement collective's input.
inline double data_value(int rank, std::size_t i) {
  return static_cast<double>((static_cast<std::size_t>(rank) * 13 + i * 7) % 101);
}

/// The value rank `rank` contributes at index `i` of a reduction under `op`.
inline double reduce_input(reduce_op op, int rank, std::size_t i) {
  const auto r = static_cast<std::size_t>(rank);
  if (op == reduce_op::prod) return (r + i) % 5 == 0 ? 2.0 : 1.0;
  return static_cast<double>((r * 5 + i * 3) % 7);
}

/// The reduction of reduce_input() over ranks 0..nranks-1 at index `i`.
inline double reduce_expected(reduce_op op, int nranks, std::size_t i) {
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

/// A value that differs from the expected one, written to outputs before the check run so that an
/// element the collective never wrote counts as wrong.
template <typename T>
T poison(double expected) {
  return static_cast<T>(expected + 1.0);
}

/// How many of `got[0..n)` differ from `want(i)` converted to T.
template <typename T>
std::int64_t count_wrong(const T* got, std::size_t n,
                         const std::function<double(std::size_t)>& want) {
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (got[i] != static_cast<T>(want(i))) ++wrong;
  }
  return wrong;
}

}  // namespace coccl_baseline
