// collectives/reduce_cpu.hpp: element-wise reductions and narrow-float conversions on host memory,
// used by the host-memory collectives and as the reference for the device kernels.
//
// Buffers must be aligned to size_of(t). All functions are thread-safe (they touch only the
// buffers passed in) and never allocate.
//
// Semantics shared by every function:
// - Integer sum and prod wrap modulo 2^bits, also for the signed types.
// - ReduceOp::avg reduces exactly like sum; the caller divides once at the end with divide_by.
// - Floating max/min propagate NaN: if either operand is NaN the result is NaN (the left one's if
//   both are), so the result does not depend on the order in which ranks' values meet. Between
//   values that compare equal (+0 and -0) the right operand wins.
// - float16, bfloat16 and the float8 types are computed in float and rounded once to the nearest
//   even; NaN results become the type's canonical NaN (sign kept). float8_e4m3 saturates: a
//   finite or infinite result beyond +-448 becomes +-448 (CUDA's __NV_SATFINITE). float8_e5m2
//   overflows to +-inf like the other IEEE formats.
#pragma once

#include <coccl/types.hpp>
#include <cstddef>
#include <cstdint>

namespace coccl::detail {

/// dst[i] = a[i] op b[i] for i < count. dst may be the same pointer as a or b (or both), but must
/// not partially overlap either.
void reduce2(void* dst, const void* a, const void* b, std::size_t count, DataType t,
             ReduceOp op) noexcept;

/// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], combined left to right so results are
/// deterministic. n >= 1; n == 1 copies bit for bit. dst may be the same pointer as srcs[0]; no
/// other source may overlap dst. float16, bfloat16 and float8 accumulate in float across all n
/// sources and round once at the end.
void reduce_n(void* dst, const void* const* srcs, int n, std::size_t count, DataType t,
              ReduceOp op) noexcept;

/// data[i] = data[i] / divisor, divisor >= 1. Integers truncate toward zero like C++ '/'; float64
/// divides in double, every other floating type in float, rounding once.
void divide_by(void* data, std::size_t count, DataType t, int divisor) noexcept;

/// IEEE binary16 <-> float. float -> half rounds to nearest even and overflows to inf.
float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;

/// bfloat16 <-> float. float -> bfloat16 rounds to nearest even and overflows to inf.
float bf16_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_bf16(float f) noexcept;

/// OCP float8 e4m3 ("FN": no infinities, max 448, NaN 0x7f/0xff) <-> float. float -> e4m3 rounds
/// to nearest even and saturates: anything beyond +-448, inf included, becomes +-448 (0x7e/0xfe);
/// NaN becomes 0x7f/0xff.
float e4m3_to_float(std::uint8_t v) noexcept;
std::uint8_t float_to_e4m3(float f) noexcept;

/// OCP float8 e5m2 (IEEE-like, with inf; max 57344) <-> float. float -> e5m2 rounds to nearest
/// even and overflows to inf; NaN becomes 0x7e/0xfe.
float e5m2_to_float(std::uint8_t v) noexcept;
std::uint8_t float_to_e5m2(float f) noexcept;

}  // namespace coccl::detail
