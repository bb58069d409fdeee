// Specification of the host reductions (collectives/reduce_cpu.hpp) and of the type names
// (collectives/types.cpp): every result is compared exactly with a plain scalar reference.
#include "collectives/reduce_cpu.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

namespace coccl::detail {
namespace {

constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::max, ReduceOp::min,
                                ReduceOp::avg};
// Crosses the implementation's 256-element, 1 KiB and 8 KiB block boundaries with odd tails.
constexpr std::size_t all_sizes[] = {0, 1, 7, 1023, 4099, 8197};

// ---- Scalar reference --------------------------------------------------------------------------

template <class T>
T ref_int(ReduceOp op, T a, T b) {
  // Modular arithmetic in 64 bits, truncated to T.
  const auto ua = static_cast<std::uint64_t>(a);
  const auto ub = static_cast<std::uint64_t>(b);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return static_cast<T>(ua + ub);
    case ReduceOp::prod:
      return static_cast<T>(ua * ub);
    case ReduceOp::max:
      return a > b ? a : b;
    case ReduceOp::min:
      return a < b ? a : b;
  }
  return T{};
}

template <class F>
F ref_float(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return a + b;
    case ReduceOp::prod:
      return a * b;
    case ReduceOp::max:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      return a > b ? a : b;
    case ReduceOp::min:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      return a < b ? a : b;
  }
  return F{};
}

// Per-type description for the reference: the stored type S, the type A in which values are
// combined (float for the narrow floats), and how to draw random test values.
template <class T, DataType Dt>
struct int_type {
  using storage = T;
  using acc = T;
  static constexpr DataType type = Dt;
  static constexpr bool floating = false;
  static acc load(storage v) { return v; }
  static storage store(acc v) { return v; }
  static acc combine(ReduceOp op, acc a, acc b) { return ref_int(op, a, b); }
  static acc divide(acc a, int d) {
    if constexpr (std::is_signed_v<T>) {
      return static_cast<T>(static_cast<std::int64_t>(a) / d);
    } else {
      return static_cast<T>(static_cast<std::uint64_t>(a) / static_cast<std::uint64_t>(d));
    }
  }
  static storage random(std::mt19937_64& g) { return static_cast<T>(g()); }
};

template <class T, DataType Dt>
struct float_type {
  using storage = T;
  using acc = T;
  static constexpr DataType type = Dt;
  static constexpr bool floating = true;
  static acc load(storage v) { return v; }
  static storage store(acc v) { return v; }
  static acc combine(ReduceOp op, acc a, acc b) { return ref_float(op, a, b); }
  static acc divide(acc a, int d) { return a / static_cast<T>(d); }
  static storage random(std::mt19937_64& g) {
    // Mostly ordinary values (so products of five stay finite), sometimes a special one.
    const T specials[] = {T(0),
                          -T(0),
                          std::numeric_limits<T>::infinity(),
                          -std::numeric_limits<T>::infinity(),
                          std::numeric_limits<T>::quiet_NaN(),
                          std::numeric_limits<T>::denorm_min(),
                          std::numeric_limits<T>::max()};
    if (g() % 16 == 0) return specials[g() % std::size(specials)];
    return std::uniform_real_distribution<T>(-1000, 1000)(g);
  }
};

template <class S, DataType Dt, float (*to_f)(S), S (*from_f)(float)>
struct narrow_type {
  using storage = S;
  using acc = float;
  static constexpr DataType type = Dt;
  static constexpr bool floating = true;
  static acc load(storage v) { return to_f(v); }
  static storage store(acc v) { return from_f(v); }
  static acc combine(ReduceOp op, acc a, acc b) { return ref_float(op, a, b); }
  static acc divide(acc a, int d) { return a / static_cast<float>(d); }
  // Every bit pattern, NaN and inf included.
  static storage random(std::mt19937_64& g) { return static_cast<S>(g()); }
};

using Int8 = int_type<std::int8_t, DataType::int8>;
using Uint8 = int_type<std::uint8_t, DataType::uint8>;
using Int32 = int_type<std::int32_t, DataType::int32>;
using Uint32 = int_type<std::uint32_t, DataType::uint32>;
using Int64 = int_type<std::int64_t, DataType::int64>;
using Uint64 = int_type<std::uint64_t, DataType::uint64>;
using Float32 = float_type<float, DataType::float32>;
using Float64 = float_type<double, DataType::float64>;
using Float16 = narrow_type<std::uint16_t, DataType::float16, half_to_float, float_to_half>;
using Bfloat16 = narrow_type<std::uint16_t, DataType::bfloat16, bf16_to_float, float_to_bf16>;
using E4m3 = narrow_type<std::uint8_t, DataType::float8_e4m3, e4m3_to_float, float_to_e4m3>;
using E5m2 = narrow_type<std::uint8_t, DataType::float8_e5m2, e5m2_to_float, float_to_e5m2>;

template <class Ty>
std::vector<typename Ty::storage> random_vector(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<typename Ty::storage> v(n);
  for (auto& x : v) x = Ty::random(g);
  return v;
}

template <class Ty>
std::vector<typename Ty::storage> ref_reduce(
    const std::vector<std::vector<typename Ty::storage>>& srcs, ReduceOp op) {
  std::vector<typename Ty::storage> out(srcs[0].size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    typename Ty::acc acc = Ty::load(srcs[0][i]);
    for (std::size_t k = 1; k < srcs.size(); ++k) acc = Ty::combine(op, acc, Ty::load(srcs[k][i]));
    out[i] = Ty::store(acc);
  }
  return out;
}

// Exact equality, except that any two NaNs of a floating type match: NaN payloads depend on
// operand order inside the FPU, which the reduction does not promise.
template <class Ty>
::testing::AssertionResult same_elements(const std::vector<typename Ty::storage>& expected,
                                         const std::vector<typename Ty::storage>& actual) {
  if (expected.size() != actual.size()) return ::testing::AssertionFailure() << "size differs";
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (Ty::floating && std::isnan(Ty::load(expected[i])) && std::isnan(Ty::load(actual[i]))) {
      continue;
    }
    if (std::memcmp(&expected[i], &actual[i], sizeof(expected[i])) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << " of " << expected.size() << ": expected "
             << +Ty::load(expected[i]) << ", got " << +Ty::load(actual[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- Every type x every op ---------------------------------------------------------------------

template <class Ty>
class ReduceEveryType : public ::testing::Test {};

using AllTypes = ::testing::Types<Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32,
                                  Float64, Bfloat16, E4m3, E5m2>;
TYPED_TEST_SUITE(ReduceEveryType, AllTypes);

TYPED_TEST(ReduceEveryType, Reduce2IntoSeparateBufferMatchesReference) {
  for (ReduceOp op : all_ops) {
    for (std::size_t n : all_sizes) {
      SCOPED_TRACE(::testing::Message() << to_string(op) << " n=" << n);
      const auto a = random_vector<TypeParam>(n, 1);
      const auto b = random_vector<TypeParam>(n, 2);
      std::vector<typename TypeParam::storage> dst(n);
      reduce2(dst.data(), a.data(), b.data(), n, TypeParam::type, op);
      EXPECT_TRUE(same_elements<TypeParam>(ref_reduce<TypeParam>({a, b}, op), dst));
    }
  }
}

TYPED_TEST(ReduceEveryType, Reduce2InPlaceOverLeftSourceMatchesReference) {
  for (ReduceOp op : all_ops) {
    for (std::size_t n : all_sizes) {
      SCOPED_TRACE(::testing::Message() << to_string(op) << " n=" << n);
      auto a = random_vector<TypeParam>(n, 3);
      const auto b = random_vector<TypeParam>(n, 4);
      const auto expected = ref_reduce<TypeParam>({a, b}, op);
      reduce2(a.data(), a.data(), b.data(), n, TypeParam::type, op);
      EXPECT_TRUE(same_elements<TypeParam>(expected, a));
    }
  }
}

TYPED_TEST(ReduceEveryType, Reduce2InPlaceOverRightSourceMatchesReference) {
  for (ReduceOp op : all_ops) {
    for (std::size_t n : all_sizes) {
      SCOPED_TRACE(::testing::Message() << to_string(op) << " n=" << n);
      const auto a = random_vector<TypeParam>(n, 5);
      auto b = random_vector<TypeParam>(n, 6);
      const auto expected = ref_reduce<TypeParam>({a, b}, op);
      reduce2(b.data(), a.data(), b.data(), n, TypeParam::type, op);
      EXPECT_TRUE(same_elements<TypeParam>(expected, b));
    }
  }
}

TYPED_TEST(ReduceEveryType, Reduce2OfBufferWithItselfInPlaceMatchesReference) {
  for (ReduceOp op : all_ops) {
    for (std::size_t n : all_sizes) {
      SCOPED_TRACE(::testing::Message() << to_string(op) << " n=" << n);
      auto a = random_vector<TypeParam>(n, 7);
      const auto expected = ref_reduce<TypeParam>({a, a}, op);
      reduce2(a.data(), a.data(), a.data(), n, TypeParam::type, op);
      EXPECT_TRUE(same_elements<TypeParam>(expected, a));
    }
  }
}

TYPED_TEST(ReduceEveryType, ReduceNCombinesOneToFiveSourcesLeftToRight) {
  for (ReduceOp op : all_ops) {
    for (std::size_t n : all_sizes) {
      for (int k = 1; k <= 5; ++k) {
        SCOPED_TRACE(::testing::Message() << to_string(op) << " n=" << n << " sources=" << k);
        std::vector<std::vector<typename TypeParam::storage>> srcs;
        std::vector<const void*> ptrs;
        for (int s = 0; s < k; ++s) srcs.push_back(random_vector<TypeParam>(n, 10 + s));
        for (const auto& s : srcs) ptrs.push_back(s.data());
        std::vector<typename TypeParam::storage> dst(n);
        reduce_n(dst.data(), ptrs.data(), k, n, TypeParam::type, op);
        const auto expected = k == 1 ? srcs[0] : ref_reduce<TypeParam>(srcs, op);
        EXPECT_TRUE(same_elements<TypeParam>(expected, dst));
      }
    }
  }
}

TYPED_TEST(ReduceEveryType, ReduceNInPlaceOverFirstSourceMatchesReference) {
  for (ReduceOp op : all_ops) {
    for (std::size_t n : all_sizes) {
      for (int k = 1; k <= 5; ++k) {
        SCOPED_TRACE(::testing::Message() << to_string(op) << " n=" << n << " sources=" << k);
        std::vector<std::vector<typename TypeParam::storage>> srcs;
        std::vector<const void*> ptrs;
        for (int s = 0; s < k; ++s) srcs.push_back(random_vector<TypeParam>(n, 20 + s));
        for (const auto& s : srcs) ptrs.push_back(s.data());
        const auto expected = k == 1 ? srcs[0] : ref_reduce<TypeParam>(srcs, op);
        reduce_n(srcs[0].data(), ptrs.data(), k, n, TypeParam::type, op);
        EXPECT_TRUE(same_elements<TypeParam>(expected, srcs[0]));
      }
    }
  }
}

TYPED_TEST(ReduceEveryType, ReduceNOfOneSourceCopiesEveryBitPattern) {
  // Random bits, including NaNs with payloads that a trip through float would not keep.
  const std::size_t n = 4099;
  std::mt19937_64 g(30);
  std::vector<typename TypeParam::storage> src(n);
  for (auto& x : src) x = static_cast<typename TypeParam::storage>(g());
  std::vector<typename TypeParam::storage> dst(n);
  const void* ptrs[] = {src.data()};
  reduce_n(dst.data(), ptrs, 1, n, TypeParam::type, ReduceOp::sum);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), n * sizeof(src[0])));
}

TYPED_TEST(ReduceEveryType, AvgReducesExactlyLikeSum) {
  const std::size_t n = 1023;
  const auto a = random_vector<TypeParam>(n, 40);
  const auto b = random_vector<TypeParam>(n, 41);
  std::vector<typename TypeParam::storage> by_sum(n);
  std::vector<typename TypeParam::storage> by_avg(n);
  reduce2(by_sum.data(), a.data(), b.data(), n, TypeParam::type, ReduceOp::sum);
  reduce2(by_avg.data(), a.data(), b.data(), n, TypeParam::type, ReduceOp::avg);
  EXPECT_TRUE(same_elements<TypeParam>(by_sum, by_avg));
}

TYPED_TEST(ReduceEveryType, DivideByMatchesReferenceDivision) {
  for (int divisor : {1, 2, 3, 7, 8, 1000}) {
    for (std::size_t n : all_sizes) {
      SCOPED_TRACE(::testing::Message() << "divisor=" << divisor << " n=" << n);
      auto data = random_vector<TypeParam>(n, 50);
      std::vector<typename TypeParam::storage> expected(n);
      for (std::size_t i = 0; i < n; ++i) {
        expected[i] = TypeParam::store(TypeParam::divide(TypeParam::load(data[i]), divisor));
      }
      divide_by(data.data(), n, TypeParam::type, divisor);
      EXPECT_TRUE(same_elements<TypeParam>(expected, data));
    }
  }
}

// ---- Specific semantics ------------------------------------------------------------------------

TEST(ReduceSemantics, SignedIntegerSumWrapsAround) {
  const std::int8_t a8[] = {127, -128};
  const std::int8_t b8[] = {1, -1};
  std::int8_t d8[2];
  reduce2(d8, a8, b8, 2, DataType::int8, ReduceOp::sum);
  EXPECT_EQ(d8[0], -128);
  EXPECT_EQ(d8[1], 127);

  const std::int64_t a64[] = {std::numeric_limits<std::int64_t>::max()};
  const std::int64_t b64[] = {1};
  std::int64_t d64[1];
  reduce2(d64, a64, b64, 1, DataType::int64, ReduceOp::sum);
  EXPECT_EQ(d64[0], std::numeric_limits<std::int64_t>::min());
}

TEST(ReduceSemantics, SignedIntegerProductWrapsAround) {
  const std::int32_t a[] = {65536, std::numeric_limits<std::int32_t>::min()};
  const std::int32_t b[] = {65536, -1};
  std::int32_t d[2];
  reduce2(d, a, b, 2, DataType::int32, ReduceOp::prod);
  EXPECT_EQ(d[0], 0);
  EXPECT_EQ(d[1], std::numeric_limits<std::int32_t>::min());
}

TEST(ReduceSemantics, UnsignedMinAndMaxCompareAsUnsigned) {
  const std::uint32_t a[] = {0xffffffffu};
  const std::uint32_t b[] = {1};
  std::uint32_t hi[1];
  std::uint32_t lo[1];
  reduce2(hi, a, b, 1, DataType::uint32, ReduceOp::max);
  reduce2(lo, a, b, 1, DataType::uint32, ReduceOp::min);
  EXPECT_EQ(hi[0], 0xffffffffu);
  EXPECT_EQ(lo[0], 1u);
}

TEST(ReduceSemantics, FloatMaxAndMinReturnNaNWhenEitherOperandIsNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float a[] = {nan, 1.0f, nan};
  const float b[] = {1.0f, nan, nan};
  for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
    float d[3];
    reduce2(d, a, b, 3, DataType::float32, op);
    for (float x : d) EXPECT_TRUE(std::isnan(x)) << to_string(op);
  }
}

TEST(ReduceSemantics, HalfMaxReturnsNaNWhenEitherOperandIsNaN) {
  const std::uint16_t a[] = {0x7e00, 0x3c00};
  const std::uint16_t b[] = {0x3c00, 0xfe00};
  std::uint16_t d[2];
  reduce2(d, a, b, 2, DataType::float16, ReduceOp::max);
  EXPECT_TRUE(std::isnan(half_to_float(d[0])));
  EXPECT_TRUE(std::isnan(half_to_float(d[1])));
}

TEST(ReduceSemantics, FloatMaxOfEqualZerosReturnsRightOperand) {
  const float a[] = {0.0f, -0.0f};
  const float b[] = {-0.0f, 0.0f};
  float d[2];
  reduce2(d, a, b, 2, DataType::float32, ReduceOp::max);
  EXPECT_TRUE(std::signbit(d[0]));
  EXPECT_FALSE(std::signbit(d[1]));
}

TEST(ReduceSemantics, HalfReduceNAccumulatesInFloatAndRoundsOnce) {
  // In half, 2048 + 1 rounds back to 2048 (ties to even) at every step; in float the sum is 2050.
  const std::uint16_t a[] = {float_to_half(2048.0f)};
  const std::uint16_t one[] = {float_to_half(1.0f)};
  const void* srcs[] = {a, one, one};
  std::uint16_t d[1];
  reduce_n(d, srcs, 3, 1, DataType::float16, ReduceOp::sum);
  EXPECT_EQ(half_to_float(d[0]), 2050.0f);
}

TEST(ReduceSemantics, E4m3SumSaturatesAt448) {
  const std::uint8_t a[] = {0x7e, 0xfe};
  std::uint8_t d[2];
  reduce2(d, a, a, 2, DataType::float8_e4m3, ReduceOp::sum);
  EXPECT_EQ(d[0], 0x7e);
  EXPECT_EQ(d[1], 0xfe);
}

TEST(ReduceSemantics, E5m2SumOverflowsToInfinity) {
  const std::uint8_t a[] = {0x7b, 0xfb};
  std::uint8_t d[2];
  reduce2(d, a, a, 2, DataType::float8_e5m2, ReduceOp::sum);
  EXPECT_EQ(d[0], 0x7c);
  EXPECT_EQ(d[1], 0xfc);
}

TEST(DivideSemantics, SignedIntegersTruncateTowardZero) {
  std::int32_t d[] = {7, -7, -1, std::numeric_limits<std::int32_t>::min()};
  divide_by(d, 4, DataType::int32, 2);
  EXPECT_EQ(d[0], 3);
  EXPECT_EQ(d[1], -3);
  EXPECT_EQ(d[2], 0);
  EXPECT_EQ(d[3], std::numeric_limits<std::int32_t>::min() / 2);
}

TEST(DivideSemantics, EightBitIntegersAcceptDivisorsAbove127) {
  std::uint8_t u[] = {255};
  std::int8_t s[] = {-128};
  divide_by(u, 1, DataType::uint8, 200);
  divide_by(s, 1, DataType::int8, 100);
  EXPECT_EQ(u[0], 1);
  EXPECT_EQ(s[0], -1);
}

TEST(DivideSemantics, BfloatDividesInFloatAndRoundsOnce) {
  // 3 / 3 is exactly 1 in float, so no rounding error may appear.
  std::uint16_t d[] = {float_to_bf16(3.0f)};
  divide_by(d, 1, DataType::bfloat16, 3);
  EXPECT_EQ(d[0], 0x3f80);
}

// ---- Conversions: known bit patterns -----------------------------------------------------------

float bits_to_float(std::uint32_t u) { return std::bit_cast<float>(u); }

TEST(HalfConversion, DecodesKnownBitPatterns) {
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(half_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(half_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7c01)));
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)));
}

TEST(HalfConversion, EncodesKnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // tie, rounds to even zero
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -26)), 0x0001);  // above the tie
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(HalfConversion, OverflowsToInfinityFromTheRoundingMidpoint) {
  EXPECT_EQ(float_to_half(65519.996f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xfc00);
}

TEST(HalfConversion, NaNStaysNaNWithItsSign) {
  const std::uint16_t h = float_to_half(-std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(h & 0x7c00, 0x7c00);
  EXPECT_NE(h & 0x03ff, 0);
  EXPECT_EQ(h & 0x8000, 0x8000);
  EXPECT_EQ(float_to_half(bits_to_float(0x7f800001u)) & 0x7fff, 0x7e00);  // signaling NaN
}

TEST(Bf16Conversion, DecodesByWideningTheTopHalf) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc040), -3.0f);
  EXPECT_EQ(bf16_to_float(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc0)));
}

TEST(Bf16Conversion, RoundsTiesToEven) {
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f808000u)), 0x3f80);  // tie, down to even
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f818000u)), 0x3f82);  // tie, up to even
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(float_to_bf16(bits_to_float(0x3f807fffu)), 0x3f80);  // below the tie
}

TEST(Bf16Conversion, OverflowsToInfinityAndKeepsNaN) {
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bf16(bits_to_float(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  // A NaN whose payload sits only in the low half must not round into inf.
  const std::uint16_t n = float_to_bf16(bits_to_float(0x7f800001u));
  EXPECT_TRUE(std::isnan(bf16_to_float(n)));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bits_to_float(0xffffffffu)))));
}

TEST(E4m3Conversion, DecodesKnownBitPatterns) {
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);  // exponent all ones is still a number
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x07), std::ldexp(7.0f, -9));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
}

TEST(E4m3Conversion, SaturatesToPlusMinus448) {
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e6f), 0x7e);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
}

TEST(E4m3Conversion, NaNBecomesAllOnes) {
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);
}

TEST(E4m3Conversion, RoundsSubnormalTiesToEven) {
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);   // half of the smallest subnormal
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);   // 1.5 steps, up to even
  EXPECT_EQ(float_to_e4m3(std::ldexp(15.0f, -10)), 0x08);  // 7.5 steps, up to the min normal
}

TEST(E5m2Conversion, DecodesKnownBitPatterns) {
  EXPECT_EQ(e5m2_to_float(0x3c), 1.0f);
  EXPECT_EQ(e5m2_to_float(0x7b), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(e5m2_to_float(0x7c), std::numeric_limits<float>::infinity());
  EXPECT_EQ(e5m2_to_float(0xfc), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(e5m2_to_float(0x7d)));
  EXPECT_TRUE(std::isnan(e5m2_to_float(0xff)));
}

TEST(E5m2Conversion, OverflowsToInfinityFromTheRoundingMidpoint) {
  EXPECT_EQ(float_to_e5m2(57344.0f), 0x7b);
  EXPECT_EQ(float_to_e5m2(61439.996f), 0x7b);
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7c);
  EXPECT_EQ(float_to_e5m2(-std::numeric_limits<float>::infinity()), 0xfc);
}

TEST(E5m2Conversion, NaNStaysNaN) {
  EXPECT_EQ(float_to_e5m2(std::numeric_limits<float>::quiet_NaN()), 0x7e);
  EXPECT_EQ(float_to_e5m2(-std::numeric_limits<float>::quiet_NaN()), 0xfe);
}

// ---- Conversions: every code against an independent decoder ------------------------------------

// Value of a binary floating-point code with the given field widths, from the textbook formula.
float textbook_value(std::uint32_t code, int exp_bits, int man_bits, bool ieee_specials) {
  const bool neg = (code >> (exp_bits + man_bits)) & 1u;
  const int e = static_cast<int>((code >> man_bits) & ((1u << exp_bits) - 1u));
  const int m = static_cast<int>(code & ((1u << man_bits) - 1u));
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int e_max = (1 << exp_bits) - 1;
  float v;
  if (ieee_specials && e == e_max) {
    v = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (!ieee_specials && e == e_max && m == (1 << man_bits) - 1) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), 1 - bias - man_bits);
  } else {
    v = std::ldexp(static_cast<float>(m + (1 << man_bits)), e - bias - man_bits);
  }
  return neg ? -v : v;
}

struct format {
  const char* name;
  int exp_bits;
  int man_bits;
  bool ieee_specials;
  std::uint32_t max_finite;  // largest positive finite code
  std::uint32_t overflow;    // code a value rounding past max_finite becomes
  float (*decode)(std::uint32_t);
  std::uint32_t (*encode)(float);
};

const format formats[] = {
    {"half", 5, 10, true, 0x7bff, 0x7c00, [](std::uint32_t c) { return half_to_float(c & 0xffff); },
     [](float f) -> std::uint32_t { return float_to_half(f); }},
    {"bf16", 8, 7, true, 0x7f7f, 0x7f80, [](std::uint32_t c) { return bf16_to_float(c & 0xffff); },
     [](float f) -> std::uint32_t { return float_to_bf16(f); }},
    {"e4m3", 4, 3, false, 0x7e, 0x7e, [](std::uint32_t c) { return e4m3_to_float(c & 0xff); },
     [](float f) -> std::uint32_t { return float_to_e4m3(f); }},
    {"e5m2", 5, 2, true, 0x7b, 0x7c, [](std::uint32_t c) { return e5m2_to_float(c & 0xff); },
     [](float f) -> std::uint32_t { return float_to_e5m2(f); }},
};

TEST(NarrowConversion, EveryCodeDecodesToItsTextbookValue) {
  for (const format& f : formats) {
    const std::uint32_t codes = 1u << (1 + f.exp_bits + f.man_bits);
    for (std::uint32_t c = 0; c < codes; ++c) {
      const float expected = textbook_value(c, f.exp_bits, f.man_bits, f.ieee_specials);
      const float actual = f.decode(c);
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(actual)) << f.name << " code " << c;
      } else {
        EXPECT_EQ(std::bit_cast<std::uint32_t>(expected), std::bit_cast<std::uint32_t>(actual))
            << f.name << " code " << c;
      }
    }
  }
}

TEST(NarrowConversion, EveryFiniteCodeRoundTripsAndMidpointsRoundToEven) {
  for (const format& f : formats) {
    const std::uint32_t sign = 1u << (f.exp_bits + f.man_bits);
    for (std::uint32_t c = 0; c <= f.max_finite; ++c) {
      const float v = f.decode(c);
      ASSERT_EQ(f.encode(v), c) << f.name << " code " << c;
      ASSERT_EQ(f.encode(-v), c | sign) << f.name << " code " << c;
      // Distance to the next representable magnitude; past the largest finite code, where the
      // binade would continue, so that the midpoint is the overflow threshold.
      const float step = c < f.max_finite ? f.decode(c + 1) - v : v - f.decode(c - 1);
      const std::uint32_t up = c < f.max_finite ? c + 1 : f.overflow;
      const float mid = v + step / 2;
      const float inf = std::numeric_limits<float>::infinity();
      ASSERT_EQ(f.encode(mid), (c & 1) ? up : c) << f.name << " tie above code " << c;
      ASSERT_EQ(f.encode(std::nextafter(mid, 0.0f)), c) << f.name << " below tie " << c;
      ASSERT_EQ(f.encode(std::nextafter(mid, inf)), up) << f.name << " above tie " << c;
    }
  }
}

#if defined(__FLT16_MAX__)
TEST(HalfConversion, AgreesWithTheCompilersFloat16OnRandomFloats) {
  std::mt19937 g(60);
  for (int i = 0; i < 1000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(g()));
    const auto expected = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), expected) << "float bits " << std::bit_cast<std::uint32_t>(f);
  }
}
#endif

// ---- Type names --------------------------------------------------------------------------------

TEST(TypeNames, EveryDataTypeParsesBackFromItsName) {
  for (int i = 0; i < data_type_count; ++i) {
    const auto t = static_cast<DataType>(i);
    EXPECT_EQ(parse_data_type(to_string(t)), t) << to_string(t);
  }
}

TEST(TypeNames, EveryReduceOpParsesBackFromItsName) {
  for (int i = 0; i < reduce_op_count; ++i) {
    const auto op = static_cast<ReduceOp>(i);
    EXPECT_EQ(parse_reduce_op(to_string(op)), op) << to_string(op);
  }
}

TEST(TypeNames, NcclTestsShortNamesParse) {
  EXPECT_EQ(parse_data_type("half"), DataType::float16);
  EXPECT_EQ(parse_data_type("float"), DataType::float32);
  EXPECT_EQ(parse_data_type("double"), DataType::float64);
  EXPECT_EQ(parse_data_type("bfloat16"), DataType::bfloat16);
  EXPECT_EQ(parse_data_type("f8e4m3"), DataType::float8_e4m3);
  EXPECT_EQ(parse_data_type("f8e5m2"), DataType::float8_e5m2);
}

TEST(TypeNames, UnknownNamesAndValuesAreRejected) {
  EXPECT_EQ(parse_data_type("int16"), std::nullopt);
  EXPECT_EQ(parse_data_type(""), std::nullopt);
  EXPECT_EQ(parse_reduce_op("mean"), std::nullopt);
  EXPECT_EQ(to_string(static_cast<DataType>(12)), "invalid");
  EXPECT_EQ(to_string(static_cast<ReduceOp>(-1)), "invalid");
}

}  // namespace
}  // namespace coccl::detail
