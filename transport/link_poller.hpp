// The one poller of the links that the proxy thread drives by polling (shm rings, verbs
// completion queues): a link joins the poller's list when a coroutine parks on it and stays while
// someone waits, so that an idle link costs nothing.
#pragma once

#include <vector>

#include "runtime/engine.hpp"

namespace coccl::transport {

/// A link whose waiters a LinkPoller resumes. Lives on the poller's proxy thread.
class PolledLink {
 public:
  /// Resumes waiters whose condition holds; true if anything progressed.
  virtual bool check() = 0;
  /// Whether a coroutine is parked on the link.
  virtual bool has_waiter() const noexcept = 0;
  /// Called when the link leaves the list with nobody waiting: a link with an event source of its
  /// own (ib's completion channel) arms it here, so that work arriving later is still seen.
  virtual void idle() {}
  /// True while the link's own event source would wake the proxy thread, which may then sleep
  /// although the link is in the list.
  virtual bool wakes_thread() const noexcept { return false; }

 protected:
  ~PolledLink() = default;
};

/// Polls the links of one communicator that have a waiter. Lives on its proxy thread; a link
/// joins through activate() before its coroutine parks and must forget() itself when destroyed.
/// Without such links it is dormant: the proxy thread's loop passes it by.
class LinkPoller final : public runtime::Poller {
 public:
  LinkPoller() { set_dormant(true); }
  bool poll() override;
  bool waiting() const override;
  void activate(PolledLink* l);
  void forget(PolledLink* l);

 private:
  std::vector<PolledLink*> active_;
  std::vector<PolledLink*> scan_;
};

}  // namespace coccl::transport
