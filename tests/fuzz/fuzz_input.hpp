// Reading structured values from a fuzzer's input, shared by the fuzz targets.
//
// Each target is a libFuzzer entry point (LLVMFuzzerTestOneInput). A target accepts the errors a
// decoder documents for bad input and lets anything else escape: an unexpected exception type
// aborts the run, and libFuzzer (or the replay driver) reports it as a crash.
#pragma once

#include <algorithm>
#include <coccl/error.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace coccl::fuzz {

/// Consumes the input front to back; reading past the end yields zeros (and empty ranges), so a
/// short input is still a valid one.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : bytes_(data, size) {}

  template <typename T>
  T get() {
    T v{};
    const std::size_t n = std::min(sizeof v, left());
    if (n) std::memcpy(&v, bytes_.data() + pos_, n);
    pos_ += n;
    return v;
  }
  /// Up to `n` bytes.
  std::span<const std::uint8_t> take(std::size_t n) {
    n = std::min(n, left());
    auto out = bytes_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  /// A length-prefixed piece (one length byte), at most what is left.
  std::span<const std::uint8_t> piece() { return take(get<std::uint8_t>()); }
  std::span<const std::uint8_t> rest() { return take(left()); }
  std::size_t left() const { return bytes_.size() - pos_; }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
};

inline std::string text_of(std::span<const std::uint8_t> b) {
  return std::string(b.begin(), b.end());
}

/// A broken property: reported like a crash.
[[noreturn]] inline void violated(const char* what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

/// Runs `f`; a std::system_error carrying `allowed` is the documented answer to bad input, and
/// anything else escapes.
template <typename F>
bool rejects(errc allowed, F&& f) {
  try {
    f();
    return false;
  } catch (const std::system_error& e) {
    if (e.code() != make_error_code(allowed)) throw;
    return true;
  }
}

}  // namespace coccl::fuzz
