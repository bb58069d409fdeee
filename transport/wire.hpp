// Authenticated framed messages over a TCP socket, used by the bootstrap and connection setup.
//
// Every connection starts with a nonce exchange: the dialler sends a fresh random nonce, the
// listener answers with its own nonce and a proof (an HMAC under the connection key). The
// connection key is HMAC-SHA256(secret, label | dialler nonce | listener nonce), so it is new for
// every connection even when a secret is reused across runs. Each frame then carries a 24-byte
// header (magic, type, payload length, per-direction counter), an HMAC of the header, the payload
// and an HMAC of header and payload, both under the connection key and the direction.
//
// Consequences: a frame captured on one connection (or in an earlier run) fails authentication on
// any other; a frame replayed or reordered on its own connection has the wrong counter; and the
// payload is allocated only after its header authenticated, so a peer without the secret costs a
// fixed few hundred bytes, never the length it announces. A bad frame is rejected with
// errc::bad_message and the caller drops the connection.
#pragma once

#include <array>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/config.hpp"
#include "transport/stream.hpp"

namespace coccl::transport {

namespace asio = boost::asio;
using Secret = std::array<std::uint8_t, 16>;

/// Frame types of the bootstrap and connection-setup protocols.
enum class FrameType : std::uint32_t {
  hello = 1,         // rank -> root: rank, nranks, PeerInfo
  table = 2,         // root/parent -> rank: the address table
  connect = 3,       // lower rank -> higher rank: open a peer connection
  accept = 4,        // higher rank -> lower rank: connection accepted, transport parameters
  ctrl = 5,          // a control message on an established connection
  status_query = 6,  // coccl-status -> root or rank: what are you doing?
  status = 7,        // the answer: the root's view of the rendezvous, or the rank's CommStatus
  notice = 8,        // a rank that has failed -> a peer or the root: who and why; on a fresh
                     // connection, or in answer to a connection request
  recover = 9,  // rank -> rank listener, and the answer: liveness probe or shrink (recovery.hpp)
  stripe = 10,  // lower rank -> higher rank: an extra socket of a tcp link being made
  share = 11,   // root k -> its first rank -> root 0: root k's part of the address table
  close = 12,   // rank -> peer's listener: close our idle link? answered with a status frame
  whois = 13,   // rank -> rank listener, and the answer: where does rank r listen (directory.hpp)
  hellos = 14,  // a host's leader -> root: hellos of ranks of its host (bootstrap.hpp)
};

struct Frame {
  FrameType type;
  std::vector<std::uint8_t> payload;
};

/// One side of an authenticated connection: the connection key and the frame counters of both
/// directions. Made by the handshake (initiate/respond); not thread-safe.
///
/// The coroutines read and write the socket; the static and const members below them are the pure
/// steps that check what the peer sent, usable without a socket (the fuzz targets call them).
class Channel {
 public:
  /// Length of each side's nonce.
  static constexpr std::size_t nonce_size = 16;
  using Nonce = std::array<std::uint8_t, nonce_size>;
  /// Bytes each side sends in the handshake before any frame.
  static constexpr std::size_t dialler_hello_size = 8 + nonce_size;
  static constexpr std::size_t listener_hello_size = 8 + nonce_size + 32;
  /// A frame on the wire: a head (header and header tag), the payload, then the payload tag.
  static constexpr std::size_t head_size = 24 + 32;
  static constexpr std::size_t tag_size = 32;

  /// The dialler's side: sends its nonce, reads the listener's and checks the listener's proof.
  /// Throws std::system_error(errc::bad_message) when the listener does not know the secret, and
  /// boost::system::system_error on socket errors. Both sides copy the secret: the handshake may
  /// outlive its caller's object (a listener destroyed while a stranger's hello is in flight).
  static asio::awaitable<Channel> initiate(Stream& socket, Secret secret);
  /// The listener's side: reads the dialler's nonce (a fixed, small number of bytes), answers with
  /// its own nonce and proof. The dialler has proved nothing yet: the first frame read on the
  /// channel authenticates it.
  static asio::awaitable<Channel> respond(Stream& socket, Secret secret);

  /// The dialler's hello for its nonce `mine`.
  static std::array<std::uint8_t, dialler_hello_size> dialler_hello(const Nonce& mine);
  /// Checks the first 8 bytes of a dialler's hello (magic and version), read before the rest so
  /// that a stranger is dropped at once. Throws errc::bad_message.
  static void check_dialler_start(std::span<const std::uint8_t, 8> start);
  /// The listener's channel for a dialler's `hello` and the listener's nonce `mine`; `answer`
  /// receives the bytes to send back. Throws errc::bad_message on a hello that is not coccl's.
  static Channel listener_side(const Secret& secret,
                               std::span<const std::uint8_t, dialler_hello_size> hello,
                               const Nonce& mine,
                               std::array<std::uint8_t, listener_hello_size>& answer);
  /// The dialler's channel once the listener `answer`ed its nonce `mine`. Throws
  /// errc::bad_message when the answer is not coccl's or the listener's proof is wrong.
  static Channel dialler_side(const Secret& secret, const Nonce& mine,
                              std::span<const std::uint8_t, listener_hello_size> answer);

  /// The bytes of the next outgoing frame (advances the send counter).
  std::vector<std::uint8_t> seal(FrameType type, std::span<const std::uint8_t> payload);

  /// What the head of an incoming frame announces, once it authenticated.
  struct Head {
    FrameType type;
    std::size_t length;
  };
  /// Authenticates the head of the next incoming frame (key, direction, counter) and checks that
  /// its payload is at most `max_payload` bytes. Throws errc::bad_message.
  Head open_head(std::span<const std::uint8_t, head_size> head, std::size_t max_payload) const;
  /// Authenticates the payload and payload tag that follow `head` (accepted by open_head) and
  /// counts the frame as received. Throws errc::bad_message.
  void open_payload(std::span<const std::uint8_t, head_size> head,
                    std::span<const std::uint8_t> payload,
                    std::span<const std::uint8_t, tag_size> tag);

  /// True once a frame from the peer has authenticated.
  bool peer_authenticated() const noexcept { return received_ > 0; }

 private:
  Channel(const std::array<std::uint8_t, 32>& key, bool dialler) : key_(key), dialler_(dialler) {}
  std::array<std::uint8_t, 32> key_;
  bool dialler_;
  std::uint64_t sent_ = 0;
  std::uint64_t received_ = 0;
};

/// Writes one frame. Throws boost::system::system_error on socket errors.
asio::awaitable<void> write_frame(Stream& socket, Channel& channel, FrameType type,
                                  std::span<const std::uint8_t> payload);

/// Reads the next frame of at most `max_payload` bytes. The header is authenticated (key,
/// direction, counter) before the payload is allocated. Throws std::system_error(errc::bad_message)
/// on a malformed, unauthenticated, replayed or reordered frame and boost::system::system_error on
/// socket errors.
asio::awaitable<Frame> read_frame(Stream& socket, Channel& channel, std::size_t max_payload);

/// Little helpers to build and parse payloads field by field.
class Writer {
 public:
  // resize + memcpy rather than vector::insert of a byte range: GCC 12 at -O1 with
  // -fsanitize=thread mis-reads the inlined insert as an overflow (-Wstringop-overflow).
  template <typename T>
  Writer& put(const T& v) {
    const std::size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
    return *this;
  }
  Writer& put_bytes(std::span<const std::uint8_t> b) {
    put<std::uint32_t>(static_cast<std::uint32_t>(b.size()));
    bytes_.insert(bytes_.end(), b.begin(), b.end());
    return *this;
  }
  std::vector<std::uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
};

/// Reads fields written by Writer; throws errc::bad_message when the payload is too short.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> b) : b_(b) {}
  template <typename T>
  T get() {
    T v;
    need(sizeof(T));
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::vector<std::uint8_t> get_bytes() {
    auto n = get<std::uint32_t>();
    need(n);
    std::vector<std::uint8_t> out(b_.begin() + pos_, b_.begin() + pos_ + n);
    pos_ += n;
    return out;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  void need(std::size_t n) const;
  std::span<const std::uint8_t> b_;
  std::size_t pos_ = 0;
};

/// `bytes` as lower-case hex, two digits a byte in order.
std::string to_hex(std::span<const std::uint8_t> bytes);
/// Reads `text`, two hex digits a byte, into `out`; false when `text` is not 2 * out.size()
/// digits (lower-case only unless `any_case`).
bool from_hex(std::string_view text, std::span<std::uint8_t> out, bool any_case);

/// Addresses of this host's interfaces chosen by COCCL_SOCKET_IFNAME (NCCL syntax: a list of
/// prefixes, ^ to exclude, = for exact names). Without it: interfaces other than loopback and
/// docker bridges, falling back to loopback.
std::vector<asio::ip::address> local_addresses();

/// The parts of an endpoint's text.
struct HostPort {
  std::string host;  // without the brackets of "[v6]"
  std::uint16_t port;
};
/// Splits "host:port", "[v6]:port" or "ip:port" without resolving the host. Throws
/// std::system_error(errc::invalid_argument) when there is no port or the port is not a decimal
/// number in [0, 65535].
HostPort split_endpoint(const std::string& text);

/// Parses "host:port", "[v6]:port" or "ip:port", resolving a host name. Throws
/// std::system_error(errc::invalid_argument) on bad text or a name that does not resolve.
asio::ip::tcp::endpoint parse_endpoint(const std::string& text);

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<std::string> socket_ifname;  // COCCL_SOCKET_IFNAME

}  // namespace coccl::params
