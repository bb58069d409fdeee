// Tests for transport/hmac.hpp against the FIPS 180-2 example vectors and RFC 4231.
#include "transport/hmac.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace coccl::detail {
namespace {

std::string hex(const Digest& d) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  for (std::uint8_t b : d) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 0xf]);
  }
  return s;
}

std::span<const std::uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

std::string sha256_hex(std::string_view s) { return hex(sha256(s.data(), s.size())); }

std::string hmac_hex(const std::vector<std::uint8_t>& key, std::span<const std::uint8_t> data) {
  return hex(hmac_sha256(key, {data}));
}

TEST(Sha256, HashesAbc) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, HashesEmptyMessage) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, HashesTwoBlockMessage) {
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, HashesOneMillionAsFedInUnevenPieces) {
  const std::string chunk(997, 'a');
  // Piece sizes that cross block boundaries at every offset, plus zero-length updates.
  const std::size_t sizes[] = {1, 63, 64, 65, 0, 127, 3, 997, 200};
  Sha256 h;
  std::size_t remaining = 1'000'000;
  for (std::size_t i = 0; remaining != 0; ++i) {
    const std::size_t n = std::min(sizes[i % std::size(sizes)], remaining);
    h.update(chunk.data(), n);
    remaining -= n;
  }
  EXPECT_EQ(hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalMatchesOneShotAtEveryPaddingBoundary) {
  const std::string msg(130, 'x');
  for (std::size_t len = 0; len <= msg.size(); ++len) {
    Sha256 h;
    h.update(msg.data(), len / 2);
    h.update(msg.data() + len / 2, len - len / 2);
    EXPECT_EQ(h.finish(), sha256(msg.data(), len)) << "length " << len;
  }
}

// The FIPS vectors above run through Rounds::automatic, which takes the CPU's SHA extensions
// where it has them (cpu_rounds()); these run the plain rounds too, and compare the two on every
// length from 0 to 5 blocks, fed whole and in pieces.
std::string sha256_portable_hex(std::string_view s) {
  Sha256 h(Sha256::Rounds::portable);
  h.update(s.data(), s.size());
  return hex(h.finish());
}

TEST(Sha256, PlainRoundsHashTheFipsVectors) {
  EXPECT_EQ(sha256_portable_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_portable_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, CpuRoundsEqualThePlainOnesAtEveryLength) {
  std::vector<std::uint8_t> data(5 * Sha256::block_size + 1);
  std::uint32_t x = 12345;
  for (std::uint8_t& b : data) {
    x = x * 1103515245u + 12345u;
    b = static_cast<std::uint8_t>(x >> 16);
  }
  for (std::size_t n = 0; n < data.size(); ++n) {
    Sha256 plain(Sha256::Rounds::portable), cpu, pieces;
    plain.update(data.data(), n);
    cpu.update(data.data(), n);
    for (std::size_t at = 0; at < n; at += 7)
      pieces.update(data.data() + at, std::min<std::size_t>(7, n - at));
    const Digest want = plain.finish();
    EXPECT_EQ(hex(cpu.finish()), hex(want))
        << n << " bytes (cpu rounds: " << Sha256::cpu_rounds() << ")";
    EXPECT_EQ(hex(pieces.finish()), hex(want)) << n << " bytes in pieces";
  }
}

TEST(HmacSha256, Rfc4231Case1) {
  EXPECT_EQ(hmac_hex(std::vector<std::uint8_t>(20, 0x0b), bytes("Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(HmacSha256, Rfc4231Case2ShortKey) {
  EXPECT_EQ(hmac_hex({'J', 'e', 'f', 'e'}, bytes("what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(HmacSha256, Rfc4231Case3) {
  const std::vector<std::uint8_t> data(50, 0xdd);
  EXPECT_EQ(hmac_hex(std::vector<std::uint8_t>(20, 0xaa), data),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
}

TEST(HmacSha256, Rfc4231Case4) {
  std::vector<std::uint8_t> key;
  for (std::uint8_t i = 1; i <= 25; ++i) key.push_back(i);
  const std::vector<std::uint8_t> data(50, 0xcd);
  EXPECT_EQ(hmac_hex(key, data),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
}

TEST(HmacSha256, Rfc4231Case6KeyLongerThanBlock) {
  EXPECT_EQ(hmac_hex(std::vector<std::uint8_t>(131, 0xaa),
                     bytes("Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacSha256, Rfc4231Case7KeyAndDataLongerThanBlock) {
  EXPECT_EQ(hmac_hex(std::vector<std::uint8_t>(131, 0xaa),
                     bytes("This is a test using a larger than block-size key and a larger than "
                           "block-size data. The key needs to be hashed before being used by the "
                           "HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacSha256, SplitPartsEqualTheirConcatenation) {
  const std::vector<std::uint8_t> key(32, 0x42);
  const std::string_view whole = "header bytes|payload bytes that follow the header";
  const Digest expected = hmac_sha256(key, {bytes(whole)});
  EXPECT_EQ(hmac_sha256(key, {bytes(whole.substr(0, 13)), bytes(whole.substr(13))}), expected);
  EXPECT_EQ(hmac_sha256(key, {bytes(""), bytes(whole.substr(0, 1)), bytes(whole.substr(1, 20)),
                              bytes(""), bytes(whole.substr(21))}),
            expected);
}

TEST(EqualConstantTime, TrueForEqualBytes) {
  EXPECT_TRUE(equal_constant_time(bytes("same tag"), bytes("same tag")));
  EXPECT_TRUE(equal_constant_time(bytes(""), bytes("")));
}

TEST(EqualConstantTime, FalseWhenAnyByteDiffers) {
  EXPECT_FALSE(equal_constant_time(bytes("same tag"), bytes("Same tag")));
  EXPECT_FALSE(equal_constant_time(bytes("same tag"), bytes("same taG")));
}

TEST(EqualConstantTime, FalseForDifferentLengths) {
  EXPECT_FALSE(equal_constant_time(bytes("same tag"), bytes("same ta")));
  EXPECT_FALSE(equal_constant_time(bytes(""), bytes("x")));
}

TEST(RandomBytes, TwoCallsGiveDifferentBytes) {
  std::array<std::uint8_t, 32> first{};
  std::array<std::uint8_t, 32> second{};
  random_bytes(first);
  random_bytes(second);
  EXPECT_NE(first, second);
}

TEST(RandomBytes, FillsALargeBuffer) {
  // Larger than the 256 bytes getrandom guarantees in one call, to exercise the short-read loop.
  std::vector<std::uint8_t> buf(1 << 20, 0);
  random_bytes(buf);
  std::size_t zeros = 0;
  for (std::uint8_t b : buf) zeros += (b == 0);
  EXPECT_LT(zeros, buf.size() / 128);
}

}  // namespace
}  // namespace coccl::detail
