#include "tests/multirank/reference.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#include "collectives/reduce_cpu.hpp"

namespace coccl::test {
namespace {

bool is_float(DataType t) {
  switch (t) {
    case DataType::float16:
    case DataType::bfloat16:
    case DataType::float32:
    case DataType::float64:
    case DataType::float8_e4m3:
    case DataType::float8_e5m2:
      return true;
    default:
      return false;
  }
}

bool is_fp8(DataType t) { return t == DataType::float8_e4m3 || t == DataType::float8_e5m2; }

bool is_unsigned(DataType t) {
  return t == DataType::uint8 || t == DataType::uint32 || t == DataType::uint64;
}

template <class T>
void put(void* base, std::size_t i, T v) {
  std::memcpy(static_cast<char*>(base) + i * sizeof(T), &v, sizeof(T));
}

template <class T>
T get(const void* base, std::size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + i * sizeof(T), sizeof(T));
  return v;
}

// Rounds `v` once to `t`, with the library's documented conversions (round to nearest even,
// e4m3 saturating).
void store_float(DataType t, void* base, std::size_t i, double v) {
  switch (t) {
    case DataType::float16:
      put(base, i, detail::float_to_half(static_cast<float>(v)));
      break;
    case DataType::bfloat16:
      put(base, i, detail::float_to_bf16(static_cast<float>(v)));
      break;
    case DataType::float8_e4m3:
      put(base, i, detail::float_to_e4m3(static_cast<float>(v)));
      break;
    case DataType::float8_e5m2:
      put(base, i, detail::float_to_e5m2(static_cast<float>(v)));
      break;
    case DataType::float32:
      put(base, i, static_cast<float>(v));
      break;
    case DataType::float64:
      put(base, i, v);
      break;
    default:
      break;
  }
}

}  // namespace

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::int64_t reduce_input(DataType t, ReduceOp op, int rank, std::size_t index,
                          std::uint64_t salt) {
  const std::uint64_t h = mix(salt * 0x100000001b3ull ^ mix(index * 131 + rank));
  auto in = [h](std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(h % static_cast<std::uint64_t>(hi - lo + 1));
  };
  switch (op) {
    case ReduceOp::prod:
      // Products of +-1 and 2 over at most 8 ranks are powers of two <= 256: exact in every
      // float type (e4m3 included) and wrapping modulo 2^bits in the 8-bit integer types.
      if (is_unsigned(t)) return in(1, 2);
      return std::array<std::int64_t, 3>{-1, 1, 2}[h % 3];
    case ReduceOp::sum:
    case ReduceOp::avg:
      // Sums over 8 ranks stay within +-24 (exact in every type); fp8 sums stay <= 8 (exact
      // in e5m2's 3-bit significand).
      if (is_fp8(t)) return in(0, 1);
      if (is_unsigned(t)) return in(0, 6);
      return in(-3, 3);
    case ReduceOp::max:
    case ReduceOp::min:
      if (is_fp8(t)) return in(-4, 4);
      if (is_unsigned(t)) return in(0, 100);
      return in(-100, 100);
  }
  return 0;
}

std::byte copy_input(int rank, std::size_t index, std::uint64_t salt) {
  return static_cast<std::byte>(
      mix((salt << 40) ^ (static_cast<std::uint64_t>(rank) << 56) ^ index) & 0xff);
}

void store_int(DataType t, void* base, std::size_t i, std::int64_t v) {
  switch (t) {
    case DataType::int8:
      put(base, i, static_cast<std::int8_t>(v));
      break;
    case DataType::uint8:
      put(base, i, static_cast<std::uint8_t>(v));
      break;
    case DataType::int32:
      put(base, i, static_cast<std::int32_t>(v));
      break;
    case DataType::uint32:
      put(base, i, static_cast<std::uint32_t>(v));
      break;
    case DataType::int64:
      put(base, i, v);
      break;
    case DataType::uint64:
      put(base, i, static_cast<std::uint64_t>(v));
      break;
    default:
      store_float(t, base, i, static_cast<double>(v));
      break;
  }
}

void fill_reduce(DataType t, ReduceOp op, int rank, std::uint64_t salt, void* buf,
                 std::size_t first, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i)
    store_int(t, buf, i, reduce_input(t, op, rank, first + i, salt));
}

void fill_copy(int rank, std::uint64_t salt, void* buf, std::size_t first, std::size_t bytes) {
  auto* p = static_cast<std::byte*>(buf);
  for (std::size_t i = 0; i < bytes; ++i) p[i] = copy_input(rank, first + i, salt);
}

Bytes reduce_reference(DataType t, ReduceOp op, int n, std::uint64_t salt, std::size_t first,
                       std::size_t count) {
  Bytes out(count * size_of(t));
  for (std::size_t i = 0; i < count; ++i) {
    // Integers: sum and min/max in int64 (no overflow at these magnitudes); prod modulo 2^64,
    // then truncated to the type, which is what wrapping modulo 2^bits means.
    std::int64_t acc = reduce_input(t, op, 0, first + i, salt);
    for (int r = 1; r < n; ++r) {
      const std::int64_t v = reduce_input(t, op, r, first + i, salt);
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          acc += v;
          break;
        case ReduceOp::prod:
          acc = static_cast<std::int64_t>(static_cast<std::uint64_t>(acc) *
                                          static_cast<std::uint64_t>(v));
          break;
        case ReduceOp::max:
          acc = std::max(acc, v);
          break;
        case ReduceOp::min:
          acc = std::min(acc, v);
          break;
      }
    }
    if (op != ReduceOp::avg) {
      store_int(t, out.data(), i, acc);
    } else if (!is_float(t)) {
      store_int(t, out.data(), i, acc / n);  // C++ '/' truncates toward zero
    } else if (t == DataType::float64) {
      store_float(t, out.data(), i, static_cast<double>(acc) / static_cast<double>(n));
    } else {
      store_float(t, out.data(), i, static_cast<float>(acc) / static_cast<float>(n));
    }
  }
  return out;
}

std::string show(DataType t, const void* base, std::size_t i) {
  char buf[64];
  switch (t) {
    case DataType::int8:
      std::snprintf(buf, sizeof buf, "%d", get<std::int8_t>(base, i));
      break;
    case DataType::uint8:
      std::snprintf(buf, sizeof buf, "%u", get<std::uint8_t>(base, i));
      break;
    case DataType::int32:
      std::snprintf(buf, sizeof buf, "%d", get<std::int32_t>(base, i));
      break;
    case DataType::uint32:
      std::snprintf(buf, sizeof buf, "%u", get<std::uint32_t>(base, i));
      break;
    case DataType::int64:
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(get<std::int64_t>(base, i)));
      break;
    case DataType::uint64:
      std::snprintf(buf, sizeof buf, "%llu",
                    static_cast<unsigned long long>(get<std::uint64_t>(base, i)));
      break;
    case DataType::float16: {
      auto b = get<std::uint16_t>(base, i);
      std::snprintf(buf, sizeof buf, "%g (0x%04x)", detail::half_to_float(b), b);
      break;
    }
    case DataType::bfloat16: {
      auto b = get<std::uint16_t>(base, i);
      std::snprintf(buf, sizeof buf, "%g (0x%04x)", detail::bf16_to_float(b), b);
      break;
    }
    case DataType::float8_e4m3: {
      auto b = get<std::uint8_t>(base, i);
      std::snprintf(buf, sizeof buf, "%g (0x%02x)", detail::e4m3_to_float(b), b);
      break;
    }
    case DataType::float8_e5m2: {
      auto b = get<std::uint8_t>(base, i);
      std::snprintf(buf, sizeof buf, "%g (0x%02x)", detail::e5m2_to_float(b), b);
      break;
    }
    case DataType::float32:
      std::snprintf(buf, sizeof buf, "%.9g", get<float>(base, i));
      break;
    case DataType::float64:
      std::snprintf(buf, sizeof buf, "%.17g", get<double>(base, i));
      break;
  }
  return buf;
}

}  // namespace coccl::test
