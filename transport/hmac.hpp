// transport/hmac.hpp: SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104) and the helpers that the
// bootstrap needs to authenticate its messages: a constant-time comparison and a source of
// cryptographically random bytes.
//
// Everything here is self-contained so that authenticating bootstrap traffic does not add a
// dependency on a crypto library. None of it is on the data path.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

namespace coccl::detail {

/// A SHA-256 digest (and therefore an HMAC-SHA256 tag).
using Digest = std::array<std::uint8_t, 32>;

/// Incremental SHA-256. Feed any number of `update` calls, then call `finish` once; after
/// `finish` the object holds no meaningful state until it is assigned a fresh `Sha256{}`.
/// Not thread-safe; copies are independent (a copy taken mid-stream forks the hash).
class Sha256 {
 public:
  static constexpr std::size_t block_size = 64;

  /// How the blocks are compressed: with the CPU's SHA extensions where it has them (x86 SHA-NI;
  /// coccl-sim's link handshakes spent about 6% of their CPU here), or always with the plain
  /// rounds (the tests compare the two). Both give the same digest.
  enum class Rounds { automatic, portable };

  explicit Sha256(Rounds rounds = Rounds::automatic) noexcept;

  /// True when Rounds::automatic uses the CPU's SHA extensions on this machine.
  static bool cpu_rounds() noexcept;

  /// Appends `len` bytes at `data` to the message. `data` may be null when `len` is zero.
  void update(const void* data, std::size_t len) noexcept;

  /// Pads the message and returns its digest.
  Digest finish() noexcept;

 private:
  void compress(const std::uint8_t* blocks, std::size_t count) noexcept;

  std::array<std::uint32_t, 8> state_;
  bool cpu_;
  std::array<std::uint8_t, block_size> buffer_;
  std::size_t buffered_ = 0;
  // The length field of the padding counts bits modulo 2^64; bytes modulo 2^61 suffice for it.
  std::uint64_t total_bytes_ = 0;
};

/// SHA-256 of `len` bytes at `data` in one call.
Digest sha256(const void* data, std::size_t len) noexcept;

/// HMAC-SHA256 with `key` over the concatenation of `parts`, so that a header and a payload can be
/// authenticated without first copying them together. Keys longer than the 64-byte block are
/// hashed first, as RFC 2104 requires.
Digest hmac_sha256(std::span<const std::uint8_t> key,
                   std::initializer_list<std::span<const std::uint8_t>> parts) noexcept;

/// True when `a` and `b` hold the same bytes. For equal lengths the time taken does not depend on
/// where (or whether) they differ, so comparing a received tag does not leak how many leading
/// bytes a forger guessed right. Different lengths return false at once: lengths are not secret.
bool equal_constant_time(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) noexcept;

/// Fills `out` with cryptographically random bytes from getrandom(2), retrying on EINTR and on
/// short reads. Throws std::system_error (system_category) if the kernel refuses.
void random_bytes(std::span<std::uint8_t> out);

}  // namespace coccl::detail
