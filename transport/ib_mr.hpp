// ib transport, part 2: the memory registration cache.
//
// Registering memory with an RDMA device pins it and is expensive, so registrations are cached:
// asking for a range that an existing registration covers returns that one (free); a range that
// overlaps or touches others gets one registration of the union, which replaces them in the cache
// (when the device refuses the union, the range alone is registered and replaces them).
// A registration is a shared handle: the device registration is released when the cache no longer
// lists it and nobody holds it any more (a replaced registration may still back work requests in
// flight). forget() is called when the memory is freed, so no registration outlives its memory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

namespace coccl::transport::ib {

/// A registered range and its keys.
struct Registration {
  std::uintptr_t begin;
  std::uintptr_t end;
  std::uint32_t lkey;
  std::uint32_t rkey;
  void* handle;  // the device's registration (ibv_mr*)

  bool covers(const void* p, std::size_t n) const noexcept {
    auto a = reinterpret_cast<std::uintptr_t>(p);
    return a >= begin && a + n <= end;
  }
};

class RegCache {
 public:
  /// Registers [addr, addr+len) with the device; throws on failure. Fills lkey, rkey, handle.
  using Register = std::function<Registration(void* addr, std::size_t len)>;
  /// Releases a registration made by Register.
  using Deregister = std::function<void(const Registration&)>;

  RegCache(Register reg, Deregister dereg);
  /// Drops the cache's references; registrations still held elsewhere go when their holders do.
  ~RegCache();
  RegCache(const RegCache&) = delete;
  RegCache& operator=(const RegCache&) = delete;

  /// A registration covering [addr, addr+len) (len > 0), registered now if none is cached.
  /// Thread-safe. Throws what Register throws.
  std::shared_ptr<const Registration> get(void* addr, std::size_t len);

  /// The cached registration covering [addr, addr+len), or null; never registers. Thread-safe.
  std::shared_ptr<const Registration> find(const void* addr, std::size_t len) const;

  /// [addr, addr+len) is being freed: every cached registration overlapping it leaves the cache
  /// (and is released once no holder remains). Thread-safe.
  void forget(const void* addr, std::size_t len);

  /// Registrations in the cache.
  std::size_t size() const;

 private:
  using Map = std::map<std::uintptr_t, std::shared_ptr<const Registration>>;  // by begin
  // First entry that may overlap or touch [a, b).
  Map::iterator first_near(std::uintptr_t a);

  Register reg_;
  std::shared_ptr<Deregister> dereg_;  // shared with the handles' deleters
  mutable std::mutex m_;
  Map map_;
};

}  // namespace coccl::transport::ib
