// kernels/codec.cuh: element types as codecs (storage type, accumulation type, conversions) and
// the reduction operators applied to raw vectors of 2 or 4 32-bit words.
//
// Kernels are templated on the codec only (12 instantiations each); the operator is a run-time
// argument. It is uniform across the grid, so the switch costs a few instructions per vector and
// no divergence, and it keeps compile time to types x kernels instead of types x ops x kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <coccl/types.hpp>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace coccl::kernels::detail {

template <class S>
struct int_codec {
  using storage = S;
  using acc = S;
  static constexpr bool is_int = true;
  __device__ static acc widen(storage v) { return v; }
  __device__ static storage narrow(acc v) { return v; }
};

template <class S>
struct float_codec {
  using storage = S;
  using acc = S;
  static constexpr bool is_int = false;
  __device__ static acc widen(storage v) { return v; }
  __device__ static storage narrow(acc v) { return v; }
};

struct half_codec {
  using storage = std::uint16_t;
  using acc = float;
  static constexpr bool is_int = false;
  __device__ static acc widen(storage v) { return __half2float(__ushort_as_half(v)); }
  __device__ static storage narrow(acc v) { return __half_as_ushort(__float2half_rn(v)); }
};

struct bf16_codec {
  using storage = std::uint16_t;
  using acc = float;
  static constexpr bool is_int = false;
  __device__ static acc widen(storage v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
  __device__ static storage narrow(acc v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

template <__nv_fp8_interpretation_t Kind, __nv_saturation_t Sat>
struct fp8_codec {
  using storage = std::uint8_t;
  using acc = float;
  static constexpr bool is_int = false;
  __device__ static acc widen(storage v) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(v, Kind);
    return __half2float(__half(h));
  }
  __device__ static storage narrow(acc v) { return __nv_cvt_float_to_fp8(v, Sat, Kind); }
};

// e4m3 saturates (no infinities in the format); e5m2 overflows to inf like IEEE types.
using e4m3_codec = fp8_codec<__NV_E4M3, __NV_SATFINITE>;
using e5m2_codec = fp8_codec<__NV_E5M2, __NV_NOSAT>;

/// Calls f(Codec{}) for the codec of t; returns cudaErrorInvalidValue (1) for an invalid type.
template <class F>
int with_codec(DataType t, F&& f) {
  switch (t) {
    case DataType::int8:
      return f(int_codec<std::int8_t>{});
    case DataType::uint8:
      return f(int_codec<std::uint8_t>{});
    case DataType::int32:
      return f(int_codec<std::int32_t>{});
    case DataType::uint32:
      return f(int_codec<std::uint32_t>{});
    case DataType::int64:
      return f(int_codec<std::int64_t>{});
    case DataType::uint64:
      return f(int_codec<std::uint64_t>{});
    case DataType::float16:
      return f(half_codec{});
    case DataType::float32:
      return f(float_codec<float>{});
    case DataType::float64:
      return f(float_codec<double>{});
    case DataType::bfloat16:
      return f(bf16_codec{});
    case DataType::float8_e4m3:
      return f(e4m3_codec{});
    case DataType::float8_e5m2:
      return f(e5m2_codec{});
  }
  return 1;
}

// Integer sum and prod wrap: computed on the unsigned type, where overflow is defined.
template <class A>
__device__ __forceinline__ A op_sum(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class A>
__device__ __forceinline__ A op_prod(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    // uint32_t keeps 8- and 16-bit products from promoting to (overflowing) int.
    using U = std::conditional_t<(sizeof(A) < 4), std::uint32_t, std::make_unsigned_t<A>>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// NaN propagates (the left one wins when both are NaN); between equal values the right wins.
// This matches the host reference so that results do not depend on which side is local.
template <class A>
__device__ __forceinline__ A op_max(A a, A b) {
  if constexpr (!std::is_integral_v<A>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a > b ? a : b;
}

template <class A>
__device__ __forceinline__ A op_min(A a, A b) {
  if constexpr (!std::is_integral_v<A>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? a : b;
}

/// W 32-bit words of raw data (W = 2 for an LL packet pair, 4 for a 16-byte vector).
template <int W>
struct Raw {
  std::uint32_t w[W];
};

/// The accumulators for one Raw<W> of codec C.
template <class C, int W>
struct Acc {
  static constexpr int n = W * 4 / static_cast<int>(sizeof(typename C::storage));
  typename C::acc a[n];
};

template <class C, int W>
__device__ __forceinline__ Acc<C, W> widen(const Raw<W>& r) {
  typename C::storage s[Acc<C, W>::n];
  std::memcpy(s, r.w, sizeof s);
  Acc<C, W> out;
#pragma unroll
  for (int i = 0; i < Acc<C, W>::n; ++i) out.a[i] = C::widen(s[i]);
  return out;
}

/// x = x op widen(r), element by element.
template <class C, int W>
__device__ __forceinline__ void combine(Acc<C, W>& x, const Raw<W>& r, ReduceOp op) {
  const Acc<C, W> y = widen<C, W>(r);
  constexpr int n = Acc<C, W>::n;
  switch (op) {
    case ReduceOp::prod:
#pragma unroll
      for (int i = 0; i < n; ++i) x.a[i] = op_prod(x.a[i], y.a[i]);
      break;
    case ReduceOp::max:
#pragma unroll
      for (int i = 0; i < n; ++i) x.a[i] = op_max(x.a[i], y.a[i]);
      break;
    case ReduceOp::min:
#pragma unroll
      for (int i = 0; i < n; ++i) x.a[i] = op_min(x.a[i], y.a[i]);
      break;
    default:
#pragma unroll
      for (int i = 0; i < n; ++i) x.a[i] = op_sum(x.a[i], y.a[i]);
      break;
  }
}

/// One stored element divided as divide_by specifies: integers truncate, float64 in double, the
/// rest widened to float, divided once and rounded once.
template <class C>
__device__ __forceinline__ typename C::storage divide_one(typename C::storage v, int divisor) {
  if constexpr (C::is_int) {
    using S = typename C::storage;
    return static_cast<S>(v / static_cast<S>(divisor));
  } else {
    return C::narrow(C::widen(v) / static_cast<typename C::acc>(divisor));
  }
}

/// Rounds the accumulators to storage. With `avg_divisor` > 1 the rounded sum is then divided
/// exactly as divide_by would, so a collective's avg equals reduce followed by divide_by.
template <class C, int W>
__device__ __forceinline__ Raw<W> narrow(const Acc<C, W>& x, int avg_divisor) {
  typename C::storage s[Acc<C, W>::n];
#pragma unroll
  for (int i = 0; i < Acc<C, W>::n; ++i) s[i] = C::narrow(x.a[i]);
  if (avg_divisor > 1) {
#pragma unroll
    for (int i = 0; i < Acc<C, W>::n; ++i) s[i] = divide_one<C>(s[i], avg_divisor);
  }
  Raw<W> r;
  std::memcpy(r.w, s, sizeof s);
  return r;
}

}  // namespace coccl::kernels::detail
