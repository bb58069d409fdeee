#include "transport/link_poller.hpp"

#include <algorithm>

namespace coccl::transport {

bool LinkPoller::poll() {
  // Waiters resume inline (no post): a resumed coroutine may wait again, which re-activates its
  // link, so work on a snapshot of the list.
  if (active_.empty()) return false;
  scan_.swap(active_);
  active_.clear();
  bool progress = false;
  for (PolledLink* l : scan_) {
    if (l->check()) progress = true;
    if (l->has_waiter())
      activate(l);
    else
      l->idle();
  }
  scan_.clear();
  set_dormant(active_.empty());
  return progress;
}

bool LinkPoller::waiting() const {
  return std::any_of(active_.begin(), active_.end(),
                     [](const PolledLink* l) { return !l->wakes_thread(); });
}

void LinkPoller::activate(PolledLink* l) {
  if (std::find(active_.begin(), active_.end(), l) != active_.end()) return;
  active_.push_back(l);
  set_dormant(false);
}

void LinkPoller::forget(PolledLink* l) {
  active_.erase(std::remove(active_.begin(), active_.end(), l), active_.end());
  scan_.erase(std::remove(scan_.begin(), scan_.end(), l), scan_.end());
  // Inside poll() the list is empty until the scan re-activates links; poll() decides then.
  if (active_.empty() && scan_.empty()) set_dormant(true);
}

}  // namespace coccl::transport
