// The error code a throwing call reports, for tests that expect one.
#pragma once

#include <system_error>
#include <utility>

namespace coccl::test {

/// Runs `f`; the code of the std::system_error it throws, or an empty code when it returns. Any
/// other exception escapes (and fails the test).
template <typename F>
std::error_code code_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const std::system_error& e) {
    return e.code();
  }
  return {};
}

}  // namespace coccl::test
