// The fixed secret and nonces of the wire fuzz target, shared with the seed writer so that its
// seeds are frames of the very connection the target sets up.
#pragma once

#include <array>

#include "transport/wire.hpp"

namespace coccl::fuzz::wire {

using transport::Channel;
using transport::Secret;

constexpr Secret secret{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
constexpr Channel::Nonce dialler_nonce{0xd1, 0xd2, 0xd3, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8,
                                       0xd9, 0xda, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xd0};
constexpr Channel::Nonce listener_nonce{0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
                                        0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x10};

struct Pair {
  Channel dialler;
  Channel listener;
};

// The two ends of one connection, made by the real handshake steps with fixed nonces.
inline Pair connected() {
  auto hello = Channel::dialler_hello(dialler_nonce);
  std::array<std::uint8_t, Channel::listener_hello_size> answer{};
  Channel listener = Channel::listener_side(secret, hello, listener_nonce, answer);
  Channel dialler = Channel::dialler_side(secret, dialler_nonce, answer);
  return {dialler, listener};
}

}  // namespace coccl::fuzz::wire
