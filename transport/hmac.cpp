// transport/hmac.cpp: SHA-256 per FIPS 180-4 section 6.2, HMAC per RFC 2104.
#include "transport/hmac.hpp"

#include <sys/random.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

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

// FIPS 180-4 6.2.2 for `count` blocks, in plain C++.
void compress_portable(std::array<std::uint32_t, 8>& state, const std::uint8_t* block,
                       std::size_t count) noexcept {
  for (; count > 0; --count, block += Sha256::block_size) {
    std::array<std::uint32_t, 64> w;
    for (std::size_t t = 0; t < 16; ++t) w[t] = load_be32(block + 4 * t);
    for (std::size_t t = 16; t < 64; ++t) {
      const std::uint32_t s0 =
          std::rotr(w[t - 15], 7) ^ std::rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const std::uint32_t s1 = std::rotr(w[t - 2], 17) ^ std::rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = s1 + w[t - 7] + s0 + w[t - 16];
    }

    std::uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    std::uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
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
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
  }
}

#if defined(__x86_64__)
// The same with the SHA extensions (Intel's SHA-NI). The state is kept as two vectors, ABEF and
// CDGH, as sha256rnds2 wants them; each step of the loop below does four rounds, its message
// words (big-endian in the block) plus their round constants in one vector, and extends the
// schedule four words at a time: w[t-16] + s0(w[t-15]) (sha256msg1), + w[t-7] (the words that
// straddle the two previous vectors), + s1(w[t-2]) (sha256msg2).
__attribute__((target("sha,sse4.1,ssse3"))) void compress_cpu(std::array<std::uint32_t, 8>& state,
                                                              const std::uint8_t* block,
                                                              std::size_t count) noexcept {
  const __m128i byte_swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  __m128i dcba = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[0]));
  __m128i hgfe = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[4]));
  const __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
  const __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
  for (; count > 0; --count, block += Sha256::block_size) {
    const __m128i abef_before = abef, cdgh_before = cdgh;
    __m128i w[4];  // the last four vectors of the schedule, w[i % 4]
    for (int i = 0; i < 16; ++i) {
      __m128i words;
      if (i < 4) {
        words = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * i)),
                                 byte_swap);
      } else {
        const __m128i partial = _mm_add_epi32(_mm_sha256msg1_epu32(w[i % 4], w[(i + 1) % 4]),
                                              _mm_alignr_epi8(w[(i + 3) % 4], w[(i + 2) % 4], 4));
        words = _mm_sha256msg2_epu32(partial, w[(i + 3) % 4]);
      }
      w[i % 4] = words;
      __m128i k = _mm_add_epi32(
          words, _mm_loadu_si128(reinterpret_cast<const __m128i*>(&round_constants[4 * i])));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, k);
      k = _mm_shuffle_epi32(k, 0x0E);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, k);
    }
    abef = _mm_add_epi32(abef, abef_before);
    cdgh = _mm_add_epi32(cdgh, cdgh_before);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  dcba = _mm_blend_epi16(feba, dchg, 0xF0);
  hgfe = _mm_alignr_epi8(dchg, feba, 8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[0]), dcba);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[4]), hgfe);
}

bool cpu_has_sha() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool ssse3 = c & (1u << 9), sse41 = c & (1u << 19);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return ssse3 && sse41 && (b & (1u << 29));
}
#else
void compress_cpu(std::array<std::uint32_t, 8>& state, const std::uint8_t* block,
                  std::size_t count) noexcept {
  compress_portable(state, block, count);
}
bool cpu_has_sha() noexcept { return false; }
#endif

}  // namespace

bool Sha256::cpu_rounds() noexcept {
  static const bool has = cpu_has_sha();
  return has;
}

Sha256::Sha256(Rounds rounds) noexcept
    : state_(initial_state), cpu_(rounds == Rounds::automatic && cpu_rounds()), buffer_{} {}

void Sha256::compress(const std::uint8_t* blocks, std::size_t count) noexcept {
  if (cpu_)
    compress_cpu(state_, blocks, count);
  else
    compress_portable(state_, blocks, count);
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
    compress(buffer_.data(), 1);
    buffered_ = 0;
  }
  // Whole blocks are hashed straight from the caller's memory rather than copied through buffer_.
  if (len >= block_size) {
    compress(in, len / block_size);
    in += len / block_size * block_size;
    len %= block_size;
  }
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
    compress(buffer_.data(), 1);
    buffered_ = 0;
  }
  std::memset(buffer_.data() + buffered_, 0, block_size - 8 - buffered_);
  store_be32(buffer_.data() + block_size - 8, static_cast<std::uint32_t>(total_bits >> 32));
  store_be32(buffer_.data() + block_size - 4, static_cast<std::uint32_t>(total_bits));
  compress(buffer_.data(), 1);
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
