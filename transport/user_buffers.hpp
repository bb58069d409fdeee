// Buffers the user registered with a communicator (Communicator::register_buffer): the ones the
// ib transport moves without staging, and the tcp links on io_uring send from their rings'
// registered buffers. Registration goes through the process's registration cache
// (so registering a buffer again, or a part of one, is free) and is dropped from it when the user
// deregisters, which must happen before the memory is freed: a cached registration of freed
// memory would pin it and could later be mistaken for new memory at the same address.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "transport/ib_mr.hpp"

namespace coccl::transport {

class UserBuffers {
 public:
  /// `cache` registers with the network device; null when the communicator has no device (then
  /// ranges are only recorded, nothing is pinned, and find() finds nothing).
  explicit UserBuffers(ib::RegCache* cache) : cache_(cache) {}
  UserBuffers(const UserBuffers&) = delete;
  UserBuffers& operator=(const UserBuffers&) = delete;

  /// Registers [p, p+n); returns a handle for remove(). Throws std::system_error with
  /// errc::invalid_argument for a null pointer or zero bytes, and what the device throws when it
  /// refuses (for instance the locked-memory limit). Any thread.
  std::uint64_t add(void* p, std::size_t n);
  /// Deregisters a handle from add(). Transfers already under way keep their registration until
  /// they finish. Any thread.
  void remove(std::uint64_t handle) noexcept;
  /// A registration covering [p, p+n) made through add() and not removed, or null. Any thread.
  std::shared_ptr<const ib::Registration> find(const void* p, std::size_t n) const;

  /// A registration's handle and the range it covers; handle 0 for none.
  struct Range {
    std::uint64_t handle = 0;
    std::uintptr_t begin = 0, end = 0;
  };
  /// A registration covering [p, p+n) made through add() and not removed, with or without a
  /// device. Any thread.
  Range range_of(const void* p, std::size_t n) const;
  /// Whether `handle` (from add()) is still registered. Any thread.
  bool holds(std::uint64_t handle) const;
  /// How many registrations have ended: a transport that keeps state per handle compares it with
  /// the count it last saw to find the handles it must drop. Any thread.
  std::uint64_t removals() const noexcept { return removals_.load(std::memory_order_acquire); }

  /// Bytes sent zero-copy from registered buffers (counted by the transport).
  void count_zero_copy(std::size_t n) noexcept {
    zero_copy_.fetch_add(n, std::memory_order_relaxed);
  }
  std::uint64_t zero_copy_bytes() const noexcept {
    return zero_copy_.load(std::memory_order_relaxed);
  }

 private:
  struct Entry {
    std::uintptr_t begin, end;
    std::shared_ptr<const ib::Registration> reg;  // null without a device
  };
  ib::RegCache* cache_;
  mutable std::mutex m_;
  std::map<std::uint64_t, Entry> entries_;  // by handle; users register a handful of buffers
  std::uint64_t next_ = 1;
  std::atomic<std::uint64_t> zero_copy_{0};
  std::atomic<std::uint64_t> removals_{0};
};

}  // namespace coccl::transport
