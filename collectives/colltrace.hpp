// CollTrace: a ring of a communicator's recent operations with their state and times, dumped as
// JSON when an operation fails or times out, so a hang names the stuck rank and operation.
#pragma once

#include <chrono>
#include <coccl/status.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace coccl::detail {

class CollTrace {
 public:
  enum class State { enqueued, started, done, failed };
  struct Entry {
    std::uint64_t seq = 0;
    const char* op = "";
    std::size_t count = 0;
    int type = 0;
    int root = 0;
    State state = State::enqueued;
    std::chrono::steady_clock::time_point started{}, ended{};
  };

  // The ring grows to `capacity` as operations are recorded: a communicator that runs few
  // operations (thousands of them per process in coccl-sim) holds only those.
  explicit CollTrace(std::size_t capacity) : capacity_(capacity ? capacity : 1) {}

  Entry& begin(std::uint64_t seq, const char* op, std::size_t count, int type, int root,
               std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());
  /// Sets the start of the newest entry if it is `seq`'s (begun with a provisional time).
  void restart(std::uint64_t seq, std::chrono::steady_clock::time_point at);
  /// Closes the newest entry if it is `seq`'s, ended at `at` (now when not given).
  void end(std::uint64_t seq, bool ok,
           std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now());
  /// The ring as a JSON object: {"rank":R,"ops":[{"seq":..,"op":..,"state":..,"us":..},..]}.
  std::string json(int rank) const;
  /// The ring, oldest first, as the public API shows it.
  std::vector<TraceEntry> entries() const;

 private:
  // The newest entry, if it is `seq`'s and still running.
  Entry* running(std::uint64_t seq) noexcept;

  std::size_t capacity_;
  std::vector<Entry> ring_;  // entry i of the record at i % capacity_
  std::uint64_t recorded_ = 0;
  // recorded_ % capacity_, kept rather than computed: a division per operation was 9% of a
  // fast-path call.
  std::size_t next_ = 0;
};

}  // namespace coccl::detail
