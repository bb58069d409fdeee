#include "transport/ib_mr.hpp"

#include <coccl/error.hpp>
#include <system_error>

namespace coccl::transport::ib {

RegCache::RegCache(Register reg, Deregister dereg)
    : reg_(std::move(reg)), dereg_(std::make_shared<Deregister>(std::move(dereg))) {}

RegCache::~RegCache() = default;

RegCache::Map::iterator RegCache::first_near(std::uintptr_t a) {
  // Entries do not overlap each other, so only the one starting at or before `a` can reach it
  // from the left.
  auto it = map_.upper_bound(a);
  if (it != map_.begin() && std::prev(it)->second->end >= a) --it;
  return it;
}

std::shared_ptr<const Registration> RegCache::get(void* addr, std::size_t len) {
  if (len == 0)
    throw std::system_error(make_error_code(errc::invalid_argument), "registering 0 bytes");
  std::lock_guard lock(m_);
  auto a = reinterpret_cast<std::uintptr_t>(addr);
  auto b = a + len;
  auto it = first_near(a);
  if (it != map_.end() && it->second->covers(addr, len)) return it->second;
  // Merge with every registration that overlaps or touches the range: one larger registration
  // replaces them, so the cache never holds two that cover the same byte.
  auto first = it;
  while (it != map_.end() && it->first <= b) {
    a = std::min(a, it->second->begin);
    b = std::max(b, it->second->end);
    ++it;
  }
  Registration r;
  try {
    r = reg_(reinterpret_cast<void*>(a), b - a);
  } catch (...) {
    const auto exact = reinterpret_cast<std::uintptr_t>(addr);
    if (a == exact && b == exact + len) throw;
    // A neighbour's memory may have been freed without forget() (the union then spans unmapped
    // pages): register just the range asked for; the neighbours leave the cache below.
    a = exact;
    b = exact + len;
    r = reg_(addr, len);
  }
  r.begin = a;
  r.end = b;
  std::shared_ptr<const Registration> h(new Registration(r), [d = dereg_](const Registration* p) {
    (*d)(*p);
    delete p;
  });
  map_.erase(first, it);
  map_.emplace(a, h);
  return h;
}

std::shared_ptr<const Registration> RegCache::find(const void* addr, std::size_t len) const {
  std::lock_guard lock(m_);
  auto a = reinterpret_cast<std::uintptr_t>(addr);
  auto it = map_.upper_bound(a);
  if (it == map_.begin()) return nullptr;
  --it;
  return it->second->covers(addr, len) ? it->second : nullptr;
}

void RegCache::forget(const void* addr, std::size_t len) {
  std::lock_guard lock(m_);
  auto a = reinterpret_cast<std::uintptr_t>(addr);
  auto b = a + len;
  auto it = map_.upper_bound(a);
  if (it != map_.begin() && std::prev(it)->second->end > a) --it;
  while (it != map_.end() && it->first < b) it = map_.erase(it);
}

std::size_t RegCache::size() const {
  std::lock_guard lock(m_);
  return map_.size();
}

}  // namespace coccl::transport::ib
