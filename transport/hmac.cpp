// transport/hmac.cpp: SHA-256 per FIPS 180-4 section 6.2, HMAC per RFC 2104.
#include "transport/hmac.hpp"

#include <sys/random.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace coccl::detail {

namespace {

// FIPS 180-4 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64
// primes.
constexpr std::array<std::uint32_t, 64> round_constants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

// FIPS 180-4 5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8
// primes.
constexpr std::array<std::uint32_t, 8> initial_state = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

constexpr std::uint8_t hmac_inner_pad = 0x36;
constexpr std::uint8_t hmac_outer_pad = 0x5c;

std::uint32_t load_be32(const std::uint8_t* p) noexcept {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

void store_be32(std::uint8_t* p, std::uint32_t v) noexcept {
  p[0] = static_cast<std::uint8_t>(v >> 24);
  p[1] = static_cast<std::uint8_t>(v >> 16);
  p[2] = static_cast<std::uint8_t>(v >> 8);
  p[3] = static_cast<std::uint8_t>(v);
}

// A plain memset of key material that is about to go out of scope is a dead store the optimiser
// may drop; writing through a volatile pointer keeps it.
void wipe(void* p, std::size_t len) noexcept {
  auto* bytes = static_cast<volatile std::uint8_t*>(p);
  for (std::size_t i = 0; i < len; ++i) bytes[i] = 0;
}

}  // namespace

Sha256::Sha256() noexcept : state_(initial_state), buffer_{} {}

void Sha256::compress(const std::uint8_t* block) noexcept {
  std::array<std::uint32_t, 64> w;
  for (std::size_t t = 0; t < 16; ++t) w[t] = load_be32(block + 4 * t);
  for (std::size_t t = 16; t < 64; ++t) {
    const std::uint32_t s0 = std::rotr(w[t - 15], 7) ^ std::rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const std::uint32_t s1 = std::rotr(w[t - 2], 17) ^ std::rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = s1 + w[t - 7] + s0 + w[t - 16];
  }

  std::uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  std::uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (std::size_t t = 0; t < 64; ++t) {
    const std::uint32_t big_s1 = std::rotr(e, 6) ^ std::rotr(e, 11) ^ std::rotr(e, 25);
    const std::uint32_t ch = (e & f) ^ (~e & g);
    const std::uint32_t t1 = h + big_s1 + ch + round_constants[t] + w[t];
    const std::uint32_t big_s0 = std::rotr(a, 2) ^ std::rotr(a, 13) ^ std::rotr(a, 22);
    const std::uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const std::uint32_t t2 = big_s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(const void* data, std::size_t len) noexcept {
  if (len == 0) return;
  auto* in = static_cast<const std::uint8_t*>(data);
  total_bytes_ += len;

  if (buffered_ != 0) {
    const std::size_t take = std::min(len, block_size - buffered_);
    std::memcpy(buffer_.data() + buffered_, in, take);
    buffered_ += take;
    in += take;
    len -= take;
    if (buffered_ < block_size) return;
    compress(buffer_.data());
    buffered_ = 0;
  }
  // Whole blocks are hashed straight from the caller's memory rather than copied through buffer_.
  for (; len >= block_size; in += block_size, len -= block_size) compress(in);
  if (len != 0) {
    std::memcpy(buffer_.data(), in, len);
    buffered_ = len;
  }
}

Digest Sha256::finish() noexcept {
  const std::uint64_t total_bits = total_bytes_ * 8;

  // FIPS 180-4 5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, then the 64-bit big-endian bit count.
  // If the 0x80 byte leaves no room for the count, the padding spills into one more block.
  buffer_[buffered_++] = 0x80;
  if (buffered_ > block_size - 8) {
    std::memset(buffer_.data() + buffered_, 0, block_size - buffered_);
    compress(buffer_.data());
    buffered_ = 0;
  }
  std::memset(buffer_.data() + buffered_, 0, block_size - 8 - buffered_);
  store_be32(buffer_.data() + block_size - 8, static_cast<std::uint32_t>(total_bits >> 32));
  store_be32(buffer_.data() + block_size - 4, static_cast<std::uint32_t>(total_bits));
  compress(buffer_.data());
  buffered_ = 0;

  Digest out;
  for (std::size_t i = 0; i < state_.size(); ++i) store_be32(out.data() + 4 * i, state_[i]);
  return out;
}

Digest sha256(const void* data, std::size_t len) noexcept {
  Sha256 h;
  h.update(data, len);
  return h.finish();
}

Digest hmac_sha256(std::span<const std::uint8_t> key,
                   std::initializer_list<std::span<const std::uint8_t>> parts) noexcept {
  // RFC 2104: K0 is the key, or its hash when longer than a block, zero-padded to a block.
  std::array<std::uint8_t, Sha256::block_size> key_block{};
  if (key.size() > Sha256::block_size) {
    const Digest hashed = sha256(key.data(), key.size());
    std::memcpy(key_block.data(), hashed.data(), hashed.size());
  } else if (!key.empty()) {
    std::memcpy(key_block.data(), key.data(), key.size());
  }

  std::array<std::uint8_t, Sha256::block_size> pad;
  for (std::size_t i = 0; i < pad.size(); ++i) pad[i] = key_block[i] ^ hmac_inner_pad;
  Sha256 inner;
  inner.update(pad.data(), pad.size());
  for (const auto& part : parts) inner.update(part.data(), part.size());
  const Digest inner_digest = inner.finish();

  for (std::size_t i = 0; i < pad.size(); ++i) pad[i] = key_block[i] ^ hmac_outer_pad;
  Sha256 outer;
  outer.update(pad.data(), pad.size());
  outer.update(inner_digest.data(), inner_digest.size());

  wipe(key_block.data(), key_block.size());
  wipe(pad.data(), pad.size());
  return outer.finish();
}

bool equal_constant_time(std::span<const std::uint8_t> a,
                         std::span<const std::uint8_t> b) noexcept {
  if (a.size() != b.size()) return false;
  // Accumulate every difference instead of returning at the first one, so the loop always runs to
  // the end; the single branch is on the accumulated result only.
  std::uint8_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<std::uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

void random_bytes(std::span<std::uint8_t> out) {
  std::size_t filled = 0;
  while (filled < out.size()) {
    // getrandom may return fewer bytes than asked for large requests or when a signal arrives
    // mid-read, so loop until the span is full.
    const ssize_t n = ::getrandom(out.data() + filled, out.size() - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::system_category(), "getrandom");
    }
    filled += static_cast<std::size_t>(n);
  }
}

}  // namespace coccl::detail
