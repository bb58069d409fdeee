#include "collectives/colltrace.hpp"

#include <cstdio>

namespace coccl::detail {

CollTrace::Entry& CollTrace::begin(std::uint64_t seq, const char* op, std::size_t count, int type,
                                   int root, std::chrono::steady_clock::time_point now) {
  ++recorded_;
  const std::size_t at = next_;
  next_ = at + 1 == capacity_ ? 0 : at + 1;
  Entry& e = ring_.size() < capacity_ ? ring_.emplace_back() : ring_[at];
  // Field by field: an entry built aside and copied in was read back in 16-byte pieces of the
  // 8-byte stores that built it, which stalls the load (no store forwarding), and that was 15% of
  // a small blocking all_reduce on one rank.
  e.seq = seq;
  e.op = op;
  e.count = count;
  e.type = type;
  e.root = root;
  e.state = State::started;
  e.started = now;
  e.ended = {};
  return e;
}

CollTrace::Entry* CollTrace::running(std::uint64_t seq) noexcept {
  if (recorded_ == 0) return nullptr;
  Entry& e = ring_[next_ == 0 ? capacity_ - 1 : next_ - 1];
  return e.seq == seq && e.state == State::started ? &e : nullptr;
}

void CollTrace::restart(std::uint64_t seq, std::chrono::steady_clock::time_point at) {
  if (Entry* e = running(seq)) e->started = at;
}

void CollTrace::end(std::uint64_t seq, bool ok, std::chrono::steady_clock::time_point at) {
  // Operations end in the order they begin, so the newest entry is the one to close.
  Entry* e = running(seq);
  if (!e) return;
  e->state = ok ? State::done : State::failed;
  e->ended = at;
}

std::string CollTrace::json(int rank) const {
  static const char* names[] = {"enqueued", "started", "done", "failed"};
  std::string out = "{\"rank\":" + std::to_string(rank) + ",\"ops\":[";
  std::size_t n = recorded_ < capacity_ ? recorded_ : capacity_;
  auto now = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    const Entry& e = ring_[(recorded_ - n + i) % capacity_];
    auto end = e.state == State::started ? now : e.ended;
    long long us = std::chrono::duration_cast<std::chrono::microseconds>(end - e.started).count();
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s{\"seq\":%llu,\"op\":\"%s\",\"count\":%zu,\"type\":%d,\"root\":%d,"
                  "\"state\":\"%s\",\"us\":%lld}",
                  i ? "," : "", static_cast<unsigned long long>(e.seq), e.op, e.count, e.type,
                  e.root, names[static_cast<int>(e.state)], us);
    out += buf;
  }
  return out + "]}";
}

std::vector<TraceEntry> CollTrace::entries() const {
  std::vector<TraceEntry> out;
  const std::size_t n = recorded_ < capacity_ ? recorded_ : capacity_;
  out.reserve(n);
  const auto now = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    const Entry& e = ring_[(recorded_ - n + i) % capacity_];
    TraceEntry t;
    t.seq = e.seq;
    t.op = e.op;
    t.count = e.count;
    t.type = e.type;
    t.root = e.root;
    t.state = e.state == State::started  ? TraceEntry::State::started
              : e.state == State::done   ? TraceEntry::State::done
              : e.state == State::failed ? TraceEntry::State::failed
                                         : TraceEntry::State::enqueued;
    const auto end = e.state == State::started ? now : e.ended;
    t.us = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(end - e.started).count());
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace coccl::detail
