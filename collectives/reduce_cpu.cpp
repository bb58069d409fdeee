// collectives/reduce_cpu.cpp: element-wise reductions on host memory.
//
// Speed comes from the compiler's auto-vectorizer, without -march flags, so the loops are written
// for it: every hot loop has a constant trip count (GCC's -O2 "very cheap" cost model vectorizes
// only loops that need no scalar epilogue), and every aliasing case has its own function whose
// pointers are __restrict (otherwise the compiler must assume dst may overlap a source and emits
// runtime overlap checks or scalar code).
#include "collectives/reduce_cpu.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace coccl::detail {
namespace {

// One inner loop covers this many bytes: a constant trip count the vectorizer accepts, small
// enough that the scalar tail after the last full block stays cheap.
constexpr std::size_t block_bytes = 1024;

template <class T>
constexpr std::size_t block_elems = block_bytes / sizeof(T);

// reduce_n passes over each chunk once per source; a chunk of dst this size stays in L1 between
// passes, so n sources cost one read of each source and one write of dst.
constexpr std::size_t chunk_bytes = 8192;

// Narrow floats are widened to float in blocks of this many elements; the two float buffers
// (2 KiB) live on the stack and in L1.
constexpr std::size_t narrow_block = 256;

// ---- Scalar operators --------------------------------------------------------------------------

template <ReduceOp Op, class T>
inline T combine(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    // Unsigned arithmetic wraps by definition; signed overflow would be UB.
    using U = std::make_unsigned_t<T>;
    if constexpr (Op == ReduceOp::sum || Op == ReduceOp::avg) {
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else if constexpr (Op == ReduceOp::prod) {
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else if constexpr (Op == ReduceOp::max) {
      return a < b ? b : a;
    } else {
      return b < a ? b : a;
    }
  } else {
    if constexpr (Op == ReduceOp::sum || Op == ReduceOp::avg) {
      return a + b;
    } else if constexpr (Op == ReduceOp::prod) {
      return a * b;
    } else if constexpr (Op == ReduceOp::max) {
      // Written as compare-and-select (not std::fmax, a libm call) so it vectorizes; checking a
      // for NaN makes NaN win from either side, b's NaN falling out of the failed comparison.
      return (a > b || std::isnan(a)) ? a : b;
    } else {
      return (a < b || std::isnan(a)) ? a : b;
    }
  }
}

// ---- Wide types: kernels per aliasing case -----------------------------------------------------

template <ReduceOp Op, class T>
void apply_distinct(T* __restrict d, const T* __restrict a, const T* __restrict b,
                    std::size_t n) noexcept {
  constexpr std::size_t bl = block_elems<T>;
  std::size_t i = 0;
  for (; i + bl <= n; i += bl) {
    for (std::size_t j = 0; j < bl; ++j) d[i + j] = combine<Op>(a[i + j], b[i + j]);
  }
  for (; i < n; ++i) d[i] = combine<Op>(a[i], b[i]);
}

// d = d op b.
template <ReduceOp Op, class T>
void apply_into_left(T* __restrict d, const T* __restrict b, std::size_t n) noexcept {
  constexpr std::size_t bl = block_elems<T>;
  std::size_t i = 0;
  for (; i + bl <= n; i += bl) {
    for (std::size_t j = 0; j < bl; ++j) d[i + j] = combine<Op>(d[i + j], b[i + j]);
  }
  for (; i < n; ++i) d[i] = combine<Op>(d[i], b[i]);
}

// d = a op d; kept apart from apply_into_left because operand order decides NaN payloads and
// which of +0/-0 max/min return.
template <ReduceOp Op, class T>
void apply_into_right(T* __restrict d, const T* __restrict a, std::size_t n) noexcept {
  constexpr std::size_t bl = block_elems<T>;
  std::size_t i = 0;
  for (; i + bl <= n; i += bl) {
    for (std::size_t j = 0; j < bl; ++j) d[i + j] = combine<Op>(a[i + j], d[i + j]);
  }
  for (; i < n; ++i) d[i] = combine<Op>(a[i], d[i]);
}

template <ReduceOp Op, class T>
void apply_self(T* __restrict d, std::size_t n) noexcept {
  constexpr std::size_t bl = block_elems<T>;
  std::size_t i = 0;
  for (; i + bl <= n; i += bl) {
    for (std::size_t j = 0; j < bl; ++j) d[i + j] = combine<Op>(d[i + j], d[i + j]);
  }
  for (; i < n; ++i) d[i] = combine<Op>(d[i], d[i]);
}

template <ReduceOp Op, class T>
void reduce2_wide(T* d, const T* a, const T* b, std::size_t n) noexcept {
  if (d == a && d == b) {
    apply_self<Op>(d, n);
  } else if (d == a) {
    apply_into_left<Op>(d, b, n);
  } else if (d == b) {
    apply_into_right<Op>(d, a, n);
  } else {
    apply_distinct<Op>(d, a, b, n);
  }
}

template <ReduceOp Op, class T>
void reduce_n_wide(T* d, const void* const* srcs, int n, std::size_t count) noexcept {
  constexpr std::size_t chunk = chunk_bytes / sizeof(T);
  for (std::size_t i = 0; i < count; i += chunk) {
    const std::size_t m = std::min(chunk, count - i);
    reduce2_wide<Op>(d + i, static_cast<const T*>(srcs[0]) + i, static_cast<const T*>(srcs[1]) + i,
                     m);
    for (int k = 2; k < n; ++k) {
      apply_into_left<Op>(d + i, static_cast<const T*>(srcs[k]) + i, m);
    }
  }
}

template <class T>
void divide_wide(T* __restrict d, std::size_t n, int divisor) noexcept {
  // The quotient's type: int for the 8-bit types (so a divisor above 127 is not truncated), and
  // for the others T itself, where divisor >= 1 rules out the one overflowing case, MIN / -1.
  using Q = std::conditional_t<(sizeof(T) < sizeof(int)), int, T>;
  const Q q = static_cast<Q>(divisor);
  constexpr std::size_t bl = block_elems<T>;
  std::size_t i = 0;
  for (; i + bl <= n; i += bl) {
    for (std::size_t j = 0; j < bl; ++j) d[i + j] = static_cast<T>(static_cast<Q>(d[i + j]) / q);
  }
  for (; i < n; ++i) d[i] = static_cast<T>(static_cast<Q>(d[i]) / q);
}

// ---- Narrow floats ----------------------------------------------------------------------------

// Conversions are branch-free so the widening and narrowing loops vectorize. They use only
// normal-range float arithmetic, so they stay exact when a thread runs with flush-to-zero /
// denormals-are-zero enabled.

// cond ? a : b with masks rather than ?:, which GCC turns into a branch around the float addition
// of the subnormal path and then refuses to if-convert (that addition could trap).
inline std::uint32_t select(bool cond, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

inline float half_to_float_impl(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t em = h & 0x7fffu;
  // Rebias the exponent from 15 to 127.
  const std::uint32_t normal = (em << 13) + (112u << 23);
  // A subnormal m * 2^-24 is computed as (2^-14 + m * 2^-24) - 2^-14, both normal floats.
  const float sub = std::bit_cast<float>(normal + (1u << 23)) - std::bit_cast<float>(113u << 23);
  std::uint32_t bits = select(em >= 0x7c00u, normal + (112u << 23), normal);
  bits = select(em < 0x0400u, std::bit_cast<std::uint32_t>(sub), bits);
  return std::bit_cast<float>(bits | sign);
}

inline std::uint16_t float_to_half_impl(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  const std::uint32_t inf_or_nan = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // Below 2^-14 the result is subnormal with step 2^-24, the ulp of 0.5: adding 0.5 lets the FPU
  // round to nearest even, and the mantissa bits of the sum are the half's bits.
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(u) + 0.5f) - (126u << 23);
  // Round to nearest even on the 13 dropped bits; a carry ripples into the exponent, up to inf.
  const std::uint32_t normal = (u - (112u << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  std::uint32_t r = select(u < (113u << 23), sub, normal);
  r = select(u >= (143u << 23), inf_or_nan, r);
  return static_cast<std::uint16_t>(r | sign);
}

inline float bf16_to_float_impl(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

inline std::uint16_t float_to_bf16_impl(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  // Rounding could carry a NaN's payload into the sign or turn it into inf; keep it a quiet NaN.
  const std::uint32_t nan = (u >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// Bits of the float equal to float8 value v, with exp_bits exponent bits and man_bits mantissa
// bits. e4m3 ("FN") has no inf and only all-ones as NaN; e5m2 follows IEEE.
constexpr std::uint32_t fp8_float_bits(std::uint32_t v, int exp_bits, int man_bits, bool ieee) {
  const std::uint32_t sign = (v & 0x80u) << 24;
  const std::uint32_t e = (v >> man_bits) & ((1u << exp_bits) - 1u);
  const std::uint32_t m = v & ((1u << man_bits) - 1u);
  const int bias = (1 << (exp_bits - 1)) - 1;
  const std::uint32_t e_max = (1u << exp_bits) - 1u;
  if (e == e_max && ieee) return sign | (m == 0 ? 0x7f800000u : 0x7fc00000u);
  if (e == e_max && m == (1u << man_bits) - 1u) return sign | 0x7fc00000u;
  if (e == 0) {
    if (m == 0) return sign;
    int top = man_bits - 1;
    while ((m >> top) == 0) --top;
    // m * 2^(1 - bias - man_bits) == 1.xxx * 2^(top + 1 - bias - man_bits).
    const std::uint32_t fe = static_cast<std::uint32_t>(top + 1 - bias - man_bits + 127);
    return sign | (fe << 23) | ((m - (1u << top)) << (23 - top));
  }
  return sign | ((e - static_cast<std::uint32_t>(bias) + 127u) << 23) | (m << (23 - man_bits));
}

constexpr std::array<float, 256> fp8_table(int exp_bits, int man_bits, bool ieee) {
  std::array<float, 256> t{};
  for (std::uint32_t v = 0; v < 256; ++v) {
    t[v] = std::bit_cast<float>(fp8_float_bits(v, exp_bits, man_bits, ieee));
  }
  return t;
}

// 256 entries each: a lookup is cheaper than decoding, and no SSE2 instruction widens 8 bits to
// float anyway.
constexpr std::array<float, 256> e4m3_values = fp8_table(4, 3, false);
constexpr std::array<float, 256> e5m2_values = fp8_table(5, 2, true);

inline std::uint8_t float_to_e4m3_impl(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  u &= 0x7fffffffu;
  // Below 2^-6 the step is 2^-9, the ulp of 2^14 (see float_to_half_impl).
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(u) + 16384.0f) - (141u << 23);
  const std::uint32_t normal = (u - (120u << 23) + 0x7ffffu + ((u >> 20) & 1u)) >> 20;
  std::uint32_t r = select(u < (121u << 23), sub, normal);
  r = select(r > 0x7eu, 0x7eu, r);
  r = select(u > 0x7f800000u, 0x7fu, r);
  return static_cast<std::uint8_t>(r | sign);
}

inline std::uint8_t float_to_e5m2_impl(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  u &= 0x7fffffffu;
  // Below 2^-14 the step is 2^-16, the ulp of 2^7.
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(u) + 128.0f) - (134u << 23);
  const std::uint32_t normal = (u - (112u << 23) + 0xfffffu + ((u >> 21) & 1u)) >> 21;
  std::uint32_t r = select(u < (113u << 23), sub, normal);
  r = select(r > 0x7cu, 0x7cu, r);
  r = select(u > 0x7f800000u, 0x7eu, r);
  return static_cast<std::uint8_t>(r | sign);
}

struct half_codec {
  using storage = std::uint16_t;
  static float widen(storage v) noexcept { return half_to_float_impl(v); }
  static storage narrow(float f) noexcept { return float_to_half_impl(f); }
};

struct bf16_codec {
  using storage = std::uint16_t;
  static float widen(storage v) noexcept { return bf16_to_float_impl(v); }
  static storage narrow(float f) noexcept { return float_to_bf16_impl(f); }
};

struct e4m3_codec {
  using storage = std::uint8_t;
  static float widen(storage v) noexcept { return e4m3_values[v]; }
  static storage narrow(float f) noexcept { return float_to_e4m3_impl(f); }
};

struct e5m2_codec {
  using storage = std::uint8_t;
  static float widen(storage v) noexcept { return e5m2_values[v]; }
  static storage narrow(float f) noexcept { return float_to_e5m2_impl(f); }
};

// The full-block branches have a constant trip count so that they vectorize at -O2.
template <class Codec>
void widen(float* __restrict out, const typename Codec::storage* __restrict in,
           std::size_t m) noexcept {
  if (m == narrow_block) {
    for (std::size_t j = 0; j < narrow_block; ++j) out[j] = Codec::widen(in[j]);
  } else {
    for (std::size_t j = 0; j < m; ++j) out[j] = Codec::widen(in[j]);
  }
}

template <class Codec>
void narrow(typename Codec::storage* __restrict out, const float* __restrict in,
            std::size_t m) noexcept {
  if (m == narrow_block) {
    for (std::size_t j = 0; j < narrow_block; ++j) out[j] = Codec::narrow(in[j]);
  } else {
    for (std::size_t j = 0; j < m; ++j) out[j] = Codec::narrow(in[j]);
  }
}

template <ReduceOp Op>
void combine_block(float* __restrict acc, const float* __restrict x, std::size_t m) noexcept {
  if (m == narrow_block) {
    for (std::size_t j = 0; j < narrow_block; ++j) acc[j] = combine<Op>(acc[j], x[j]);
  } else {
    for (std::size_t j = 0; j < m; ++j) acc[j] = combine<Op>(acc[j], x[j]);
  }
}

// Both sources of a block are widened before dst is written, so dst may alias either one.
template <ReduceOp Op, class Codec>
void reduce_n_narrow(void* dst, const void* const* srcs, int n, std::size_t count) noexcept {
  using S = typename Codec::storage;
  auto* d = static_cast<S*>(dst);
  float acc[narrow_block];
  float x[narrow_block];
  for (std::size_t i = 0; i < count; i += narrow_block) {
    const std::size_t m = std::min(narrow_block, count - i);
    widen<Codec>(acc, static_cast<const S*>(srcs[0]) + i, m);
    for (int k = 1; k < n; ++k) {
      widen<Codec>(x, static_cast<const S*>(srcs[k]) + i, m);
      combine_block<Op>(acc, x, m);
    }
    narrow<Codec>(d + i, acc, m);
  }
}

template <class Codec>
void divide_narrow(void* data, std::size_t count, int divisor) noexcept {
  using S = typename Codec::storage;
  auto* d = static_cast<S*>(data);
  const float q = static_cast<float>(divisor);
  float x[narrow_block];
  for (std::size_t i = 0; i < count; i += narrow_block) {
    const std::size_t m = std::min(narrow_block, count - i);
    widen<Codec>(x, d + i, m);
    for (std::size_t j = 0; j < m; ++j) x[j] /= q;
    narrow<Codec>(d + i, x, m);
  }
}

// ---- Dispatch ----------------------------------------------------------------------------------

// Calls f(tag<T>) for wide types or f(codec) for narrow ones.
template <class T>
struct wide_tag {
  using type = T;
};

template <class F>
void with_type(DataType t, F&& f) noexcept {
  switch (t) {
    case DataType::int8:
      return f(wide_tag<std::int8_t>{});
    case DataType::uint8:
      return f(wide_tag<std::uint8_t>{});
    case DataType::int32:
      return f(wide_tag<std::int32_t>{});
    case DataType::uint32:
      return f(wide_tag<std::uint32_t>{});
    case DataType::int64:
      return f(wide_tag<std::int64_t>{});
    case DataType::uint64:
      return f(wide_tag<std::uint64_t>{});
    case DataType::float16:
      return f(half_codec{});
    case DataType::float32:
      return f(wide_tag<float>{});
    case DataType::float64:
      return f(wide_tag<double>{});
    case DataType::bfloat16:
      return f(bf16_codec{});
    case DataType::float8_e4m3:
      return f(e4m3_codec{});
    case DataType::float8_e5m2:
      return f(e5m2_codec{});
  }
  assert(!"invalid DataType");
}

template <class F>
void with_op(ReduceOp op, F&& f) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return f(std::integral_constant<ReduceOp, ReduceOp::sum>{});
    case ReduceOp::prod:
      return f(std::integral_constant<ReduceOp, ReduceOp::prod>{});
    case ReduceOp::max:
      return f(std::integral_constant<ReduceOp, ReduceOp::max>{});
    case ReduceOp::min:
      return f(std::integral_constant<ReduceOp, ReduceOp::min>{});
  }
  assert(!"invalid ReduceOp");
}

template <class X>
struct is_wide : std::false_type {};
template <class T>
struct is_wide<wide_tag<T>> : std::true_type {};

}  // namespace

void reduce2(void* dst, const void* a, const void* b, std::size_t count, DataType t,
             ReduceOp op) noexcept {
  const void* srcs[2] = {a, b};
  with_type(t, [&](auto kind) {
    with_op(op, [&](auto o) {
      if constexpr (is_wide<decltype(kind)>::value) {
        using T = typename decltype(kind)::type;
        reduce2_wide<decltype(o)::value>(static_cast<T*>(dst), static_cast<const T*>(a),
                                         static_cast<const T*>(b), count);
      } else {
        reduce_n_narrow<decltype(o)::value, decltype(kind)>(dst, srcs, 2, count);
      }
    });
  });
}

void reduce_n(void* dst, const void* const* srcs, int n, std::size_t count, DataType t,
              ReduceOp op) noexcept {
  assert(n >= 1);
  if (n == 1) {
    // Exact copy, also for NaN payloads, which a trip through float would canonicalize.
    if (count != 0 && dst != srcs[0]) std::memcpy(dst, srcs[0], count * size_of(t));
    return;
  }
  with_type(t, [&](auto kind) {
    with_op(op, [&](auto o) {
      if constexpr (is_wide<decltype(kind)>::value) {
        using T = typename decltype(kind)::type;
        reduce_n_wide<decltype(o)::value>(static_cast<T*>(dst), srcs, n, count);
      } else {
        reduce_n_narrow<decltype(o)::value, decltype(kind)>(dst, srcs, n, count);
      }
    });
  });
}

void divide_by(void* data, std::size_t count, DataType t, int divisor) noexcept {
  assert(divisor >= 1);
  if (divisor == 1) return;
  with_type(t, [&](auto kind) {
    if constexpr (is_wide<decltype(kind)>::value) {
      divide_wide(static_cast<typename decltype(kind)::type*>(data), count, divisor);
    } else {
      divide_narrow<decltype(kind)>(data, count, divisor);
    }
  });
}

float half_to_float(std::uint16_t h) noexcept { return half_to_float_impl(h); }
std::uint16_t float_to_half(float f) noexcept { return float_to_half_impl(f); }
float bf16_to_float(std::uint16_t h) noexcept { return bf16_to_float_impl(h); }
std::uint16_t float_to_bf16(float f) noexcept { return float_to_bf16_impl(f); }
float e4m3_to_float(std::uint8_t v) noexcept { return e4m3_values[v]; }
std::uint8_t float_to_e4m3(float f) noexcept { return float_to_e4m3_impl(f); }
float e5m2_to_float(std::uint8_t v) noexcept { return e5m2_values[v]; }
std::uint8_t float_to_e5m2(float f) noexcept { return float_to_e5m2_impl(f); }

}  // namespace coccl::detail
