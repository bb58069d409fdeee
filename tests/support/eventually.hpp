// Waiting in tests for what another thread will do, without sleeping a guessed time: a loaded
// machine may take far longer than an idle one.
#pragma once

#include <chrono>
#include <thread>

namespace coccl::test {

/// Polls `holds` every millisecond until it returns true or `limit` passes; returns its last
/// answer.
template <typename Pred>
bool eventually(Pred holds, std::chrono::steady_clock::duration limit = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!holds() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return holds();
}

}  // namespace coccl::test
