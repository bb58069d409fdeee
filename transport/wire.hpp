// Authenticated framed messages over a TCP socket, used by the bootstrap and connection setup.
//
// A frame is a 16-byte header (magic, type, payload length), the payload, and an HMAC-SHA256 tag
// over header and payload keyed with the communicator's secret. A frame whose magic, length bound
// or tag is wrong is rejected with errc::bad_message and the caller drops the connection: a stray
// or hostile peer can cost a socket, never a wrong message.
#pragma once

#include <array>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace coccl::transport {

namespace asio = boost::asio;
using Secret = std::array<std::uint8_t, 16>;

/// Frame types of the bootstrap and connection-setup protocols.
enum class FrameType : std::uint32_t {
  hello = 1,    // rank -> root: rank, nranks, PeerInfo
  table = 2,    // root/parent -> rank: the address table
  connect = 3,  // lower rank -> higher rank: open a peer connection
  accept = 4,   // higher rank -> lower rank: connection accepted, transport parameters
  ctrl = 5,     // a control message on an established connection
};

struct Frame {
  FrameType type;
  std::vector<std::uint8_t> payload;
};

/// Writes one frame. Throws boost::system::system_error on socket errors.
asio::awaitable<void> write_frame(asio::ip::tcp::socket& socket, const Secret& secret,
                                  FrameType type, std::span<const std::uint8_t> payload);

/// Reads one frame of at most `max_payload` bytes and checks its tag. Throws
/// std::system_error(errc::bad_message) on a malformed or unauthenticated frame and
/// boost::system::system_error on socket errors.
asio::awaitable<Frame> read_frame(asio::ip::tcp::socket& socket, const Secret& secret,
                                  std::size_t max_payload);

/// Little helpers to build and parse payloads field by field.
class Writer {
 public:
  template <typename T>
  Writer& put(const T& v) {
    auto p = reinterpret_cast<const std::uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
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

/// Addresses of this host's interfaces chosen by COCCL_SOCKET_IFNAME (NCCL syntax: a list of
/// prefixes, ^ to exclude, = for exact names). Without it: interfaces other than loopback and
/// docker bridges, falling back to loopback.
std::vector<asio::ip::address> local_addresses();

/// Parses "host:port", "[v6]:port" or "ip:port".
asio::ip::tcp::endpoint parse_endpoint(const std::string& text);

}  // namespace coccl::transport
