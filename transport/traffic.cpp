#include "transport/traffic.hpp"

#include <algorithm>

namespace coccl::transport {

namespace {

constexpr int round_bits = 40;
constexpr std::uint64_t round_mask = (std::uint64_t{1} << round_bits) - 1;

std::atomic<std::uint64_t>& phase() {
  static std::atomic<std::uint64_t> p{0};
  return p;
}

std::uint64_t pack(std::uint64_t phase, std::uint64_t round) {
  return (phase << round_bits) | (round & round_mask);
}

// The round in `packed` if it belongs to phase `now`, else 0.
std::uint64_t round_in(std::uint64_t packed, std::uint64_t now) {
  return (packed >> round_bits) == now ? packed & round_mask : 0;
}

}  // namespace

std::uint64_t Traffic::stamp() const noexcept {
  const std::uint64_t now = phase().load(std::memory_order_relaxed);
  return pack(now, round_in(round_.load(std::memory_order_relaxed), now));
}

std::uint64_t Traffic::first_stamp() noexcept {
  return pack(phase().load(std::memory_order_relaxed), 0);
}

void Traffic::heard(std::uint64_t stamp) noexcept {
  const std::uint64_t now = phase().load(std::memory_order_relaxed);
  const std::uint64_t want = round_in(stamp, now) + 1;
  std::uint64_t cur = round_.load(std::memory_order_relaxed);
  for (;;) {
    const std::uint64_t mine = round_in(cur, now);
    if ((cur >> round_bits) == now && mine >= want) return;
    if (round_.compare_exchange_weak(cur, pack(now, std::max(mine, want)),
                                     std::memory_order_relaxed))
      return;
  }
}

std::shared_ptr<Traffic> Traffic::spawn() {
  // Parties coccl-sim names directly stay below 2^40; a spawned one carries its rank in the
  // bits above.
  auto child = std::make_shared<Traffic>();
  child->id_ = id_ + ((spawned_.fetch_add(1, std::memory_order_relaxed) + 1) << 40);
  return child;
}

Traffic::Counts Traffic::counts() const noexcept {
  Counts c;
  c.messages_sent = messages_sent_.load(std::memory_order_relaxed);
  c.messages_received = messages_received_.load(std::memory_order_relaxed);
  c.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  c.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  c.streams = streams_.load(std::memory_order_relaxed);
  c.round =
      round_in(round_.load(std::memory_order_relaxed), phase().load(std::memory_order_relaxed));
  return c;
}

void Traffic::next_phase() noexcept { phase().fetch_add(1, std::memory_order_relaxed); }

}  // namespace coccl::transport
