// tests/multirank/reference.hpp: deterministic inputs and an independent scalar reference for the
// multi-rank scenarios.
//
// Every rank's input is a pure function of (rank, index, salt), so each worker can compute what
// every other rank sent and therefore the exact expected result of any collective. Reduction inputs
// are small integers chosen so that every partial result is exact in every type, whatever order
// or grouping an algorithm uses: the only rounding is the final one of avg.
#pragma once

#include <coccl/types.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace coccl::test {

using Bytes = std::vector<std::byte>;

/// A well-mixed 64-bit hash (splitmix64 finalizer).
std::uint64_t mix(std::uint64_t x);

/// The integer value rank `rank` contributes at element `index` of a reduction with `op` on `t`.
std::int64_t reduce_input(DataType t, ReduceOp op, int rank, std::size_t index, std::uint64_t salt);

/// The raw byte rank `rank` holds at byte `index` of a data-movement collective's input.
std::byte copy_input(int rank, std::size_t index, std::uint64_t salt);

/// Writes integer `v` (exactly representable in `t`, or wrapping for integer types) at element i.
void store_int(DataType t, void* base, std::size_t i, std::int64_t v);

/// buf[i] = reduce_input(t, op, rank, first + i, salt) for i < count.
void fill_reduce(DataType t, ReduceOp op, int rank, std::uint64_t salt, void* buf,
                 std::size_t first, std::size_t count);

/// buf[i] = copy_input(rank, first + i, salt) for i < bytes.
void fill_copy(int rank, std::uint64_t salt, void* buf, std::size_t first, std::size_t bytes);

/// The exact result of reducing element `first + i` over ranks 0 .. n-1, for i < count.
Bytes reduce_reference(DataType t, ReduceOp op, int n, std::uint64_t salt, std::size_t first,
                       std::size_t count);

/// The element at `i` decoded for printing.
std::string show(DataType t, const void* base, std::size_t i);

}  // namespace coccl::test
