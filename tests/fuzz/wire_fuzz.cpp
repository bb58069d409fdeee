// Fuzz target: the authenticated framing of transport/wire (handshake answers, frame heads,
// payload tags, counters). The first byte picks what the rest of the input is:
//   0  a dialler's hello, as a listener reads it
//   1  a listener's answer, as the dialler reads it
//   2  a stream of frames arriving on an established channel (listener side, then dialler side)
//   3  messages sealed by one side and opened by the other, with one byte of the wire changed
// Bad input must be errc::bad_message; a sealed frame must open to what was sealed, and a frame
// with any byte changed must be rejected.
#include <array>

#include "tests/fuzz/fuzz_input.hpp"
#include "tests/fuzz/wire_fixture.hpp"
#include "transport/wire.hpp"

using namespace coccl;
using namespace coccl::transport;
using namespace coccl::fuzz::wire;

namespace {

constexpr std::size_t max_payload = 4096;

template <std::size_t N>
std::array<std::uint8_t, N> padded(std::span<const std::uint8_t> b) {
  std::array<std::uint8_t, N> out{};
  std::copy_n(b.begin(), std::min(N, b.size()), out.begin());
  return out;
}

// Reads frames from `wire` as `reader` would off its socket, until the input ends or a frame is
// rejected (the connection would then be dropped).
void read_stream(Channel reader, std::span<const std::uint8_t> wire) {
  std::size_t pos = 0;
  while (wire.size() - pos >= Channel::head_size) {
    auto head = wire.subspan(pos).first<Channel::head_size>();
    Channel::Head h{};
    if (fuzz::rejects(errc::bad_message, [&] { h = reader.open_head(head, max_payload); })) return;
    if (h.length > max_payload) fuzz::violated("open_head accepted an oversized frame");
    pos += Channel::head_size;
    if (wire.size() - pos < h.length + Channel::tag_size) return;
    auto payload = wire.subspan(pos, h.length);
    auto tag = wire.subspan(pos + h.length).first<Channel::tag_size>();
    if (fuzz::rejects(errc::bad_message, [&] { reader.open_payload(head, payload, tag); })) return;
    pos += h.length + Channel::tag_size;
  }
}

// The handshake's HMACs are the same for every input: made once, copied per input.
const Pair& fresh() {
  static const Pair p = connected();
  return p;
}

void round_trip(fuzz::Input& in) {
  Pair p = fresh();
  const bool from_dialler = in.get<std::uint8_t>() & 1;
  Channel& sender = from_dialler ? p.dialler : p.listener;
  Channel& receiver = from_dialler ? p.listener : p.dialler;
  // A few messages an input: each costs four HMACs, and more would only repeat the first.
  for (int i = 0; i < 4 && in.left(); ++i) {
    const auto type = static_cast<FrameType>(in.get<std::uint8_t>());
    auto payload = in.piece();
    const auto flip = in.get<std::uint16_t>();
    std::vector<std::uint8_t> wire = sender.seal(type, payload);
    // flip's top bit asks for a damaged frame, the rest picks the byte and the bits.
    const bool damage = flip & 0x8000;
    if (damage)
      wire[(flip & 0x7fff) % wire.size()] ^= static_cast<std::uint8_t>(1 + (flip >> 8) % 255);
    auto head = std::span<const std::uint8_t>(wire).first<Channel::head_size>();
    Channel::Head h{};
    const bool bad_head =
        fuzz::rejects(errc::bad_message, [&] { h = receiver.open_head(head, max_payload); });
    if (bad_head) {
      if (!damage) fuzz::violated("an intact frame's head was rejected");
      return;
    }
    if (!damage && (h.type != type || h.length != payload.size()))
      fuzz::violated("the head does not announce what was sealed");
    if (h.length != payload.size()) fuzz::violated("a damaged length authenticated");
    auto body = std::span<const std::uint8_t>(wire).subspan(Channel::head_size, h.length);
    auto tag = std::span<const std::uint8_t>(wire).last<Channel::tag_size>();
    const bool bad_payload =
        fuzz::rejects(errc::bad_message, [&] { receiver.open_payload(head, body, tag); });
    if (bad_payload != damage)
      fuzz::violated(damage ? "a damaged frame was accepted" : "an intact frame was rejected");
    if (damage) return;
    if (!std::equal(body.begin(), body.end(), payload.begin(), payload.end()))
      fuzz::violated("the payload changed on the way");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  switch (in.get<std::uint8_t>() % 4) {
    case 0: {
      auto hello = padded<Channel::dialler_hello_size>(in.rest());
      std::array<std::uint8_t, Channel::listener_hello_size> answer{};
      fuzz::rejects(errc::bad_message, [&] {
        Channel::check_dialler_start(std::span<const std::uint8_t>(hello).first<8>());
        Channel::listener_side(secret, hello, listener_nonce, answer);
      });
      break;
    }
    case 1: {
      auto answer = padded<Channel::listener_hello_size>(in.rest());
      fuzz::rejects(errc::bad_message,
                    [&] { Channel::dialler_side(secret, dialler_nonce, answer); });
      break;
    }
    case 2: {
      auto wire = in.rest();
      Pair p = fresh();
      read_stream(p.listener, wire);
      read_stream(p.dialler, wire);
      break;
    }
    case 3:
      round_trip(in);
      break;
  }
  return 0;
}
