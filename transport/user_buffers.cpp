#include "transport/user_buffers.hpp"

#include <coccl/error.hpp>
#include <system_error>

namespace coccl::transport {

std::uint64_t UserBuffers::add(void* p, std::size_t n) {
  if (!p || n == 0)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "register_buffer: the buffer must be non-null and non-empty");
  auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a + n < a)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "register_buffer: the range wraps around the address space");
  // Registered outside the lock: pinning may take long, and find() runs on proxy threads.
  std::shared_ptr<const ib::Registration> reg;
  if (cache_) reg = cache_->get(p, n);
  std::lock_guard lock(m_);
  std::uint64_t h = next_++;
  entries_.emplace(h, Entry{a, a + n, std::move(reg)});
  return h;
}

void UserBuffers::remove(std::uint64_t handle) noexcept {
  Entry e;
  {
    std::lock_guard lock(m_);
    auto it = entries_.find(handle);
    if (it == entries_.end()) return;
    e = std::move(it->second);
    entries_.erase(it);
    removals_.fetch_add(1, std::memory_order_release);
  }
  // The memory may be freed next: no cached registration may outlive it. Another handle over an
  // overlapping range keeps its own registration (it holds it), so it stays usable.
  if (cache_) cache_->forget(reinterpret_cast<const void*>(e.begin), e.end - e.begin);
}

std::shared_ptr<const ib::Registration> UserBuffers::find(const void* p, std::size_t n) const {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(m_);
  for (const auto& [h, e] : entries_)
    if (e.reg && a >= e.begin && a + n <= e.end && e.reg->covers(p, n)) return e.reg;
  return nullptr;
}

UserBuffers::Range UserBuffers::range_of(const void* p, std::size_t n) const {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(m_);
  for (const auto& [h, e] : entries_)
    if (a >= e.begin && a <= e.end && n <= e.end - a) return Range{h, e.begin, e.end};
  return {};
}

bool UserBuffers::holds(std::uint64_t handle) const {
  std::lock_guard lock(m_);
  return entries_.count(handle) != 0;
}

}  // namespace coccl::transport
