// tests/moe/moe_reference.hpp: deterministic inputs of the MoE exchange tests and an independent,
// naive reference of what every rank must receive.
//
// Every rank's inputs are pure functions of (case, rank), so each rank computes what all others
// send. Values are small multiples of 1/8, exact in float16 and bfloat16, and the expert and
// combine arithmetic is one fma per step in a fixed order, so device and host results must equal
// the reference bit for bit.
#pragma once

#include <cmath>
#include <coccl/moe.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/reduce_cpu.hpp"

namespace coccl::moe_test {

using coccl::moe::Row;

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ---- all_to_allv ----

enum class Counts { random, skewed, at_max, zeros };

/// Elements rank `from` sends to rank `to` in round `round`.
inline std::int64_t a2av_count(Counts kind, int from, int to, int round, std::int64_t max) {
  switch (kind) {
    case Counts::zeros:
      return 0;
    case Counts::at_max:
      return max;
    case Counts::skewed:  // everyone sends everything to one rank, which changes per round
      return to == round % 8 ? max : 0;
    case Counts::random:
      break;
  }
  const std::uint64_t h = mix((static_cast<std::uint64_t>(round) << 32) ^ (from * 131 + to));
  // One in four is zero, the rest anywhere in [1, max].
  return h % 4 == 0 ? 0 : static_cast<std::int64_t>(1 + (h >> 8) % static_cast<std::uint64_t>(max));
}

/// The int32 value of element i of what `from` sends to `to`.
inline std::int32_t a2av_value(int from, int to, std::int64_t i, int round) {
  return static_cast<std::int32_t>(
      mix((static_cast<std::uint64_t>(from) << 40) ^ (static_cast<std::uint64_t>(to) << 32) ^
          (static_cast<std::uint64_t>(round) << 24) ^ static_cast<std::uint64_t>(i)));
}

// ---- dispatch and combine ----

enum class Routing { random, skewed, sparse };

struct MoeCase {
  int nranks;
  int max_tokens;
  int hidden;
  DataType type;
  int top_k;
  int num_experts;
  Routing routing;
  int round;  // varies the inputs between calls
};

inline int tokens_of(const MoeCase& c, int rank) {
  // Ranks differ; one round in three uses the maximum everywhere.
  if (c.round % 3 == 0) return c.max_tokens;
  return c.max_tokens - static_cast<int>(mix(rank * 7 + c.round) % (c.max_tokens / 2 + 1));
}

/// topk_idx of `rank`: distinct experts per token (random), all on rank 0 (skewed), or random with
/// about a third of the slots unused (-1, sparse).
inline std::vector<std::int32_t> routing_of(const MoeCase& c, int rank) {
  const int tokens = tokens_of(c, rank);
  const int E = c.num_experts;
  std::vector<std::int32_t> idx(static_cast<std::size_t>(tokens) * c.top_k);
  const int pool = c.routing == Routing::skewed ? E / c.nranks : E;
  for (int t = 0; t < tokens; ++t) {
    const std::uint64_t h = mix((static_cast<std::uint64_t>(c.round) << 40) ^ (rank << 20) ^ t);
    for (int s = 0; s < c.top_k; ++s) {
      // Distinct experts: start + s * stride (mod pool) with an odd stride for a power-of-two
      // pool; other pools fall back to consecutive experts.
      const int start = static_cast<int>(h % pool);
      const int stride = (pool & (pool - 1)) == 0 ? static_cast<int>((h >> 16) % pool) | 1 : 1;
      int ex = (start + s * stride) % pool;
      if (c.routing == Routing::sparse && mix(h + s) % 3 == 0) ex = -1;
      idx[static_cast<std::size_t>(t) * c.top_k + s] = ex;
    }
  }
  return idx;
}

inline float widen(DataType t, const void* p) {
  std::uint16_t h;
  float f;
  switch (t) {
    case DataType::float16:
      std::memcpy(&h, p, 2);
      return coccl::detail::half_to_float(h);
    case DataType::bfloat16:
      std::memcpy(&h, p, 2);
      return coccl::detail::bf16_to_float(h);
    default:
      std::memcpy(&f, p, 4);
      return f;
  }
}

inline void narrow(DataType t, float f, void* p) {
  std::uint16_t h;
  switch (t) {
    case DataType::float16:
      h = coccl::detail::float_to_half(f);
      std::memcpy(p, &h, 2);
      break;
    case DataType::bfloat16:
      h = coccl::detail::float_to_bf16(f);
      std::memcpy(p, &h, 2);
      break;
    default:
      std::memcpy(p, &f, 4);
  }
}

inline std::size_t row_bytes(const MoeCase& c) {
  return static_cast<std::size_t>(c.hidden) * size_of(c.type);
}

/// x of `rank`: element (t, h) = ((rank * 37 + t * 11 + h * 5 + round) % 64 - 32) / 8.
inline std::vector<char> tokens_x(const MoeCase& c, int rank) {
  const int tokens = tokens_of(c, rank);
  std::vector<char> x(tokens * row_bytes(c));
  const std::size_t elt = size_of(c.type);
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < c.hidden; ++h) {
      const float v = static_cast<float>((rank * 37 + t * 11 + h * 5 + c.round) % 64 - 32) / 8;
      narrow(c.type, v, x.data() + (static_cast<std::size_t>(t) * c.hidden + h) * elt);
    }
  return x;
}

/// Routing weights of `rank`: multiples of 1/16 in (0, 1].
inline std::vector<float> weights_of(const MoeCase& c, int rank) {
  const int tokens = tokens_of(c, rank);
  std::vector<float> w(static_cast<std::size_t>(tokens) * c.top_k);
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = static_cast<float>(1 + mix(i * 3 + rank + c.round * 1000) % 16) / 16;
  return w;
}

/// The test's expert: y = round(x * (1 + (e % 8) / 8) + (e % 3) / 2), one fma.
inline void expert_apply(DataType t, int expert, const void* x, void* y, int hidden) {
  const float scale = 1 + static_cast<float>(expert % 8) / 8;
  const float bias = static_cast<float>(expert % 3) / 2;
  const std::size_t elt = size_of(t);
  for (int h = 0; h < hidden; ++h) {
    const float v = widen(t, static_cast<const char*>(x) + h * elt);
    narrow(t, std::fma(v, scale, bias), static_cast<char*>(y) + h * elt);
  }
}

/// What rank `me` must receive: the Row records in order and the per-expert counts.
struct Expected {
  std::vector<Row> rows;
  std::vector<std::int32_t> counts, offsets;
};

inline Expected expected_dispatch(const MoeCase& c, int me) {
  const int El = c.num_experts / c.nranks;
  Expected e;
  std::vector<std::vector<std::int32_t>> idx(c.nranks);
  for (int q = 0; q < c.nranks; ++q) idx[q] = routing_of(c, q);
  for (int j = 0; j < El; ++j) {
    const int ex = me * El + j;
    e.offsets.push_back(static_cast<std::int32_t>(e.rows.size()));
    for (int q = 0; q < c.nranks; ++q) {
      for (std::size_t i = 0; i < idx[q].size(); ++i) {
        if (idx[q][i] == ex)
          e.rows.push_back(Row{q, static_cast<std::int32_t>(i / c.top_k),
                               static_cast<std::int32_t>(i % c.top_k), ex});
      }
    }
    e.counts.push_back(static_cast<std::int32_t>(e.rows.size()) - e.offsets.back());
  }
  e.offsets.push_back(static_cast<std::int32_t>(e.rows.size()));
  return e;
}

/// out of rank `me` after combine, when each expert applied `expert_apply` (identity: y = x).
inline std::vector<char> expected_combine(const MoeCase& c, int me, bool identity) {
  const int tokens = tokens_of(c, me);
  const std::vector<char> x = tokens_x(c, me);
  const std::vector<std::int32_t> idx = routing_of(c, me);
  const std::vector<float> w = weights_of(c, me);
  const std::size_t elt = size_of(c.type), row = row_bytes(c);
  std::vector<char> out(tokens * row), y(row);
  for (int t = 0; t < tokens; ++t) {
    std::vector<float> acc(c.hidden, 0.0f);
    for (int s = 0; s < c.top_k; ++s) {
      const std::size_t i = static_cast<std::size_t>(t) * c.top_k + s;
      if (idx[i] < 0) continue;
      if (identity) {
        std::memcpy(y.data(), x.data() + t * row, row);
      } else {
        expert_apply(c.type, idx[i], x.data() + t * row, y.data(), c.hidden);
      }
      for (int h = 0; h < c.hidden; ++h)
        acc[h] = std::fma(w[i], widen(c.type, y.data() + h * elt), acc[h]);
    }
    for (int h = 0; h < c.hidden; ++h) narrow(c.type, acc[h], out.data() + t * row + h * elt);
  }
  return out;
}

}  // namespace coccl::moe_test
