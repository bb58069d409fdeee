// coccl/types.hpp: element types, reduction operators and their sizes.
//
// These enumerations are shared by the C++ API, the NCCL-compatible C API and the kernels, so their
// numeric values equal NCCL's ncclDataType_t / ncclRedOp_t values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace coccl {

/// Element type of a collective's buffers. Values match ncclDataType_t.
enum class DataType : int {
  int8 = 0,
  uint8 = 1,
  int32 = 2,
  uint32 = 3,
  int64 = 4,
  uint64 = 5,
  float16 = 6,
  float32 = 7,
  float64 = 8,
  bfloat16 = 9,
  float8_e4m3 = 10,
  float8_e5m2 = 11,
};

/// Number of DataType values; valid types are 0 .. data_type_count - 1.
inline constexpr int data_type_count = 12;

/// Reduction operator. Values match ncclRedOp_t. `avg` divides the sum by the number of ranks
/// (integer types truncate toward zero).
enum class ReduceOp : int {
  sum = 0,
  prod = 1,
  max = 2,
  min = 3,
  avg = 4,
};

/// Number of ReduceOp values; valid operators are 0 .. reduce_op_count - 1.
inline constexpr int reduce_op_count = 5;

/// Size in bytes of one element of `t`, or 0 if `t` is not a valid DataType.
constexpr std::size_t size_of(DataType t) noexcept {
  switch (t) {
    case DataType::int8:
    case DataType::uint8:
    case DataType::float8_e4m3:
    case DataType::float8_e5m2:
      return 1;
    case DataType::float16:
    case DataType::bfloat16:
      return 2;
    case DataType::int32:
    case DataType::uint32:
    case DataType::float32:
      return 4;
    case DataType::int64:
    case DataType::uint64:
    case DataType::float64:
      return 8;
  }
  return 0;
}

/// True if `t` names a DataType value.
constexpr bool is_valid(DataType t) noexcept { return size_of(t) != 0; }

/// True if `op` names a ReduceOp value.
constexpr bool is_valid(ReduceOp op) noexcept {
  return static_cast<int>(op) >= 0 && static_cast<int>(op) < reduce_op_count;
}

/// Lower-case name of a type ("float32", "bfloat16", ...); "invalid" for an unknown value.
std::string_view to_string(DataType t) noexcept;

/// Lower-case name of an operator ("sum", "prod", "max", "min", "avg"); "invalid" otherwise.
std::string_view to_string(ReduceOp op) noexcept;

/// Parses a type name as printed by to_string, also accepting nccl-tests' short names
/// (int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2).
std::optional<DataType> parse_data_type(std::string_view name) noexcept;

/// Parses an operator name as printed by to_string.
std::optional<ReduceOp> parse_reduce_op(std::string_view name) noexcept;

}  // namespace coccl
