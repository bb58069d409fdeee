// Traffic: what one party of the in-memory network (a rank, or a bootstrap root) sent and
// received, for coccl-sim, which runs many ranks in one process and measures how the real code
// grows with their number.
//
// A memory stream whose ends are given a Traffic (transport/memory.hpp) counts every write that
// starts a message (a write that carries on one the stream could only partly take is the same
// message) and every byte, at both ends, and carries the writer's round out of band beside the
// bytes it queues: a reader's round becomes max(its own, the writer's + 1) when it takes them
// (Lamport's clock), so the largest round of any party is the number of message hops on the
// critical path. Nothing of this travels on the wire, and tcp, shm and ib never count.
//
// The clock is only as good as the order in which the parties run. In one process with no
// latency, one party's concurrent exchanges run one after another, and a party's clock then
// chains exchanges that a real network would run side by side (a root answering N hellos in turn
// would reach round 2N). coccl-sim therefore runs the in-memory network in virtual time
// (memory::VirtualTime): a message written at time t is read at t + 1 or later, and the time
// advances only when nothing else can run, as on a network where every message takes one round.
//
// Counted: what a rank's Peers opens and accepts (the rendezvous, the address table, link set-up
// and links, notices, closes) and what a root started with a Traffic accepts. Not counted: status
// queries (coccl-status, and the questions a failing rank asks to name the cause) and recovery's
// probes, which dial with no Traffic.
//
// Counters are atomic: the two ends of a stream may live on different proxy threads, and the
// counting end is not always the reading one (a write serves a parked read).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace coccl::transport {

class Traffic {
 public:
  struct Counts {
    std::uint64_t messages_sent = 0;
    std::uint64_t messages_received = 0;
    std::uint64_t bytes_sent = 0;
    std::uint64_t bytes_received = 0;
    std::uint64_t streams = 0;  // stream ends opened (dialled or accepted)
    std::uint64_t round = 0;    // in the current phase (see next_phase)
  };

  /// A write of `bytes` (> 0); `first`: it starts a message.
  void sent(std::size_t bytes, bool first) noexcept {
    bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
    if (first) messages_sent_.fetch_add(1, std::memory_order_relaxed);
  }
  /// A read of `bytes` holding the start of `messages` messages.
  void received(std::size_t bytes, std::uint64_t messages) noexcept {
    bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
    messages_received_.fetch_add(messages, std::memory_order_relaxed);
  }
  /// A stream end of this party was opened.
  void opened() noexcept { streams_.fetch_add(1, std::memory_order_relaxed); }

  /// The round a message written now carries.
  std::uint64_t stamp() const noexcept;
  /// What a message of a party that is not counted carries: round 0 of this phase.
  static std::uint64_t first_stamp() noexcept;

  /// A message stamped `stamp` was taken: this party's round is at least one past it.
  void heard(std::uint64_t stamp) noexcept;

  Counts counts() const noexcept;

  /// The party's host on the in-memory network: coccl-sim gives the ranks of one simulated host
  /// one value, which their address entries then carry; 0 (the default) keeps this process's
  /// identity. Set before the party's communicators are made.
  void set_host(std::uint64_t host) noexcept { host_ = host; }
  std::uint64_t host() const noexcept { return host_; }

  /// The party's name, which orders its streams among those of other parties where an order
  /// must not depend on which thread ran first (memory::VirtualTime serves each round's streams
  /// in that order). coccl-sim names every party, distinctly and the same from run to run; 0
  /// (the default) names none.
  void set_id(std::uint64_t id) noexcept { id_ = id; }
  std::uint64_t id() const noexcept { return id_; }
  /// How many streams this party dialled before (its own order, since a party runs on one
  /// thread): with id(), a stream's place in a round.
  std::uint64_t next_stream() noexcept { return dialled_.fetch_add(1, std::memory_order_relaxed); }
  /// A party started by this one (the roots a rank starts for its splits), named after it and
  /// after how many it started before: a name as stable as this one's.
  std::shared_ptr<Traffic> spawn();

  /// Starts a new phase: every party's round counts from 0 again, and a message stamped in an
  /// earlier phase counts as one sent at round 0 of this one. For a simulation that separates
  /// its phases (every rank finished the previous one).
  static void next_phase() noexcept;

 private:
  std::atomic<std::uint64_t> messages_sent_{0};
  std::atomic<std::uint64_t> messages_received_{0};
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> bytes_received_{0};
  std::atomic<std::uint64_t> streams_{0};
  std::uint64_t host_ = 0;
  std::uint64_t id_ = 0;
  std::atomic<std::uint64_t> dialled_{0};
  std::atomic<std::uint64_t> spawned_{0};
  // The phase in the top bits, the round in the rest: a round of an earlier phase reads as 0
  // without next_phase() touching every party.
  std::atomic<std::uint64_t> round_{0};
};

}  // namespace coccl::transport
