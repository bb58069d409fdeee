// coccl-perf's data check: deterministic inputs and an independent reference for every
// collective, so a benchmarked buffer is verified after the timed runs' first call.
#pragma once

#include <cmath>
#include <coccl/coccl.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace perf {

using coccl::DataType;
using coccl::ReduceOp;

/// coccl-perf's command line.
struct Options {
  std::size_t min_bytes = 8, max_bytes = 64u << 20;
  double factor = 2;
  int iters = 20, warmup = 5, repeat = 3, check = 1, root = 0, ranks = 4;
  DataType type = DataType::float32;
  ReduceOp op = ReduceOp::sum;
  std::vector<std::string> colls{"allreduce"};
  std::vector<std::string> baselines;
  std::string json, device = "host";
  std::string plot;       // --plot FILE.svg|FILE.png: busbw and time against size, via gnuplot
  std::string plot_from;  // --plot-from RUN.json: draw a saved run instead of measuring
  bool graph = false;     // -G: time CUDA graph replays (device only)
  bool register_buffers = false;  // --register: register_buffer on both buffers (host only)
  // --blocking: each rank's own thread times the blocking forms, as the MPI and Gloo baselines do
  // (host only); otherwise a coroutine on the communicator's executor awaits the async forms.
  bool blocking = false;
  // --loop own: the awaiting coroutine runs on an io_context of the rank's own thread, as a
  // program with its own event loop runs it, instead of on the communicator's executor (host
  // only; the blocking forms always run there).
  bool own_loop = false;
  int hosts = 0;  // --hosts: ranks started here act as this many hosts (COCCL_HOSTID, NCCL_HOSTID)
};

// Encodes a small real into a minifloat with `e` exponent and `m` mantissa bits, rounding to
// nearest even (the inputs here never overflow).
inline std::uint32_t minifloat(double v, int e, int m) {
  int bias = (1 << (e - 1)) - 1;
  std::uint32_t sign = std::signbit(v) ? 1u << (e + m) : 0;
  double a = std::fabs(v);
  if (a == 0) return sign;
  int ex = static_cast<int>(std::floor(std::log2(a)));
  if (ex < 1 - bias)
    return sign | static_cast<std::uint32_t>(std::nearbyint(std::ldexp(a, bias - 1 + m)));
  double frac = a / std::ldexp(1.0, ex) - 1.0;
  auto mant = static_cast<std::uint32_t>(std::nearbyint(std::ldexp(frac, m)));
  if (mant == (1u << m)) {
    mant = 0;
    ++ex;
  }
  return sign | (static_cast<std::uint32_t>(ex + bias) << m) | mant;
}

// Stores v as element i of a buffer of type t.
inline void store(void* p, std::size_t i, DataType t, double v) {
  switch (t) {
    case DataType::int8:
      static_cast<std::int8_t*>(p)[i] = static_cast<std::int8_t>(static_cast<std::int64_t>(v));
      break;
    case DataType::uint8:
      static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(static_cast<std::int64_t>(v));
      break;
    case DataType::int32:
      static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v);
      break;
    case DataType::uint32:
      static_cast<std::uint32_t*>(p)[i] = static_cast<std::uint32_t>(static_cast<std::int64_t>(v));
      break;
    case DataType::int64:
      static_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v);
      break;
    case DataType::uint64:
      static_cast<std::uint64_t*>(p)[i] = static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
      break;
    case DataType::float32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::float64:
      static_cast<double*>(p)[i] = v;
      break;
    case DataType::float16:
      static_cast<std::uint16_t*>(p)[i] = static_cast<std::uint16_t>(minifloat(v, 5, 10));
      break;
    case DataType::bfloat16:
      static_cast<std::uint16_t*>(p)[i] = static_cast<std::uint16_t>(minifloat(v, 8, 7));
      break;
    case DataType::float8_e4m3:
      static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(minifloat(v, 4, 3));
      break;
    case DataType::float8_e5m2:
      static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(minifloat(v, 5, 2));
      break;
  }
}

inline bool is_unsigned(DataType t) {
  return t == DataType::uint8 || t == DataType::uint32 || t == DataType::uint64;
}
inline bool is_float8(DataType t) {
  return t == DataType::float8_e4m3 || t == DataType::float8_e5m2;
}
inline bool is_integer(DataType t) {
  return t == DataType::int8 || t == DataType::int32 || t == DataType::int64 || is_unsigned(t);
}

// Rank r's input element i: small exact values (products stay powers of two).
inline double value(DataType t, ReduceOp op, int n, int r, std::size_t i) {
  if (op == ReduceOp::prod) return i % n == static_cast<std::size_t>(r) ? 2 : 1;
  if (is_float8(t)) return static_cast<double>((r + i) % 2);
  if (is_unsigned(t)) return static_cast<double>((r + i) % 4);
  return static_cast<double>((r + i) % 4) - 1;
}

inline double reduced(DataType t, ReduceOp op, int n, std::size_t i) {
  double acc = value(t, op, n, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = value(t, op, n, r, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        acc += v;
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
    }
  }
  if (op == ReduceOp::avg) {
    if (is_integer(t)) return std::trunc(acc / n);
    if (t == DataType::float64) return acc / n;
    return static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
  }
  return acc;
}

template <typename Options>
void fill(const std::string& coll, const Options& o, std::size_t count, int n, int rank, void* send,
          void* recv, bool in_place) {
  (void)recv;
  (void)in_place;
  std::size_t elems = count;
  if (coll == "reducescatter" || coll == "alltoall" || coll == "scatter") elems = count * n;
  if ((coll == "broadcast" || coll == "scatter") && rank != o.root) return;
  for (std::size_t i = 0; i < elems; ++i) store(send, i, o.type, value(o.type, o.op, n, rank, i));
}

// Number of elements of `recv` that differ from the reference.
template <typename Options>
long long count_wrong(const std::string& coll, const Options& o, std::size_t count, int n, int rank,
                      const void* recv) {
  const std::size_t elt = coccl::size_of(o.type);
  std::size_t elems = count;
  if (coll == "allgather" || coll == "alltoall" || coll == "gather") elems = count * n;
  if ((coll == "reduce" || coll == "gather") && rank != o.root) return 0;
  long long wrong = 0;
  unsigned char want[8];
  for (std::size_t i = 0; i < elems; ++i) {
    double v;
    if (coll == "allreduce" || coll == "reduce")
      v = reduced(o.type, o.op, n, i);
    else if (coll == "reducescatter")
      v = reduced(o.type, o.op, n, rank * count + i);
    else if (coll == "broadcast")
      v = value(o.type, o.op, n, o.root, i);
    else if (coll == "allgather" || coll == "gather")
      v = value(o.type, o.op, n, static_cast<int>(i / count), i % count);
    else if (coll == "alltoall")
      v = value(o.type, o.op, n, static_cast<int>(i / count), rank * count + i % count);
    else
      v = value(o.type, o.op, n, o.root, rank * count + i);  // scatter
    store(want, 0, o.type, v);
    if (std::memcmp(want, static_cast<const unsigned char*>(recv) + i * elt, elt) != 0) ++wrong;
  }
  return wrong;
}

}  // namespace perf
