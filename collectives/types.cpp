// collectives/types.cpp: names of DataType and ReduceOp values, for logs, tools and parameters.
#include <array>
#include <coccl/types.hpp>

namespace coccl {
namespace {

struct data_type_name {
  std::string_view name;
  DataType type;
};

// Indexed by DataType value; to_string relies on that order.
constexpr std::array<std::string_view, data_type_count> data_type_names = {
    "int8",    "uint8",   "int32",   "uint32",   "int64",       "uint64",
    "float16", "float32", "float64", "bfloat16", "float8_e4m3", "float8_e5m2",
};

// nccl-tests' spellings (its -d option), accepted so its command lines carry over unchanged.
constexpr std::array<data_type_name, 5> data_type_aliases = {{
    {"half", DataType::float16},
    {"float", DataType::float32},
    {"double", DataType::float64},
    {"f8e4m3", DataType::float8_e4m3},
    {"f8e5m2", DataType::float8_e5m2},
}};

// Indexed by ReduceOp value.
constexpr std::array<std::string_view, reduce_op_count> reduce_op_names = {
    "sum", "prod", "max", "min", "avg",
};

}  // namespace

std::string_view to_string(DataType t) noexcept {
  const int i = static_cast<int>(t);
  return i >= 0 && i < data_type_count ? data_type_names[static_cast<std::size_t>(i)] : "invalid";
}

std::string_view to_string(ReduceOp op) noexcept {
  const int i = static_cast<int>(op);
  return i >= 0 && i < reduce_op_count ? reduce_op_names[static_cast<std::size_t>(i)] : "invalid";
}

std::optional<DataType> parse_data_type(std::string_view name) noexcept {
  for (std::size_t i = 0; i < data_type_names.size(); ++i) {
    if (data_type_names[i] == name) return static_cast<DataType>(i);
  }
  for (const auto& alias : data_type_aliases) {
    if (alias.name == name) return alias.type;
  }
  return std::nullopt;
}

std::optional<ReduceOp> parse_reduce_op(std::string_view name) noexcept {
  for (std::size_t i = 0; i < reduce_op_names.size(); ++i) {
    if (reduce_op_names[i] == name) return static_cast<ReduceOp>(i);
  }
  return std::nullopt;
}

}  // namespace coccl
