#include "transport/wire.hpp"

#include <ifaddrs.h>
#include <net/if.h>

#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <coccl/error.hpp>
#include <cstring>
#include <system_error>

#include "transport/hmac.hpp"

namespace coccl::params {

config::Param<std::string> socket_ifname{
    "COCCL_SOCKET_IFNAME", "",
    "network interface(s) for sockets: a name prefix such as eth, ^lo to exclude, =eth0 exact",
    "NCCL_SOCKET_IFNAME"};

}  // namespace coccl::params

namespace coccl::transport {
namespace {

constexpr std::uint32_t frame_magic = 0x324c4343u;     // "CCL2"
constexpr std::uint32_t dialler_magic = 0x44434343u;   // "CCCD"
constexpr std::uint32_t listener_magic = 0x4c434343u;  // "CCCL"
constexpr std::uint32_t wire_version = 2;

struct Header {
  std::uint32_t magic;
  std::uint32_t type;
  std::uint64_t length;
  std::uint64_t counter;
};
static_assert(sizeof(Header) == 24);

using Nonce = Channel::Nonce;

std::span<const std::uint8_t> bytes_of(const void* p, std::size_t n) {
  return {static_cast<const std::uint8_t*>(p), n};
}

std::span<const std::uint8_t> text(const char* s) { return bytes_of(s, std::strlen(s)); }

detail::Digest connection_key(const Secret& secret, const Nonce& dialler, const Nonce& listener) {
  return detail::hmac_sha256(secret, {text("coccl connection key v2"), dialler, listener});
}

detail::Digest listener_proof(const detail::Digest& key) {
  return detail::hmac_sha256(key, {text("coccl listener proof")});
}

// Direction labels keep a frame sent one way from being reflected back the other way.
std::uint8_t direction(bool from_dialler) { return from_dialler ? 'd' : 'l'; }

detail::Digest header_tag(const detail::Digest& key, std::uint8_t dir, const Header& h) {
  const std::uint8_t label[2] = {dir, 'h'};
  return detail::hmac_sha256(key, {label, bytes_of(&h, sizeof h)});
}

detail::Digest payload_tag(const detail::Digest& key, std::uint8_t dir, const Header& h,
                           std::span<const std::uint8_t> payload) {
  const std::uint8_t label[2] = {dir, 'p'};
  return detail::hmac_sha256(key, {label, bytes_of(&h, sizeof h), payload});
}

[[noreturn]] void reject(const std::string& what) {
  throw std::system_error(make_error_code(errc::bad_message), what);
}

bool matches(const std::string& name, const std::string& spec) {
  if (spec.empty()) return true;
  std::string list = spec;
  bool exclude = false;
  if (list[0] == '^') {
    exclude = true;
    list.erase(0, 1);
  }
  bool exact = false;
  if (!list.empty() && list[0] == '=') {
    exact = true;
    list.erase(0, 1);
  }
  bool hit = false;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string item = list.substr(start, comma - start);
    if (!item.empty() && (exact ? name == item : name.rfind(item, 0) == 0)) hit = true;
    start = comma + 1;
  }
  return exclude ? !hit : hit;
}

}  // namespace

std::array<std::uint8_t, Channel::dialler_hello_size> Channel::dialler_hello(const Nonce& mine) {
  std::array<std::uint8_t, dialler_hello_size> hello{};
  std::memcpy(hello.data(), &dialler_magic, 4);
  std::memcpy(hello.data() + 4, &wire_version, 4);
  std::memcpy(hello.data() + 8, mine.data(), mine.size());
  return hello;
}

void Channel::check_dialler_start(std::span<const std::uint8_t, 8> start) {
  std::uint32_t magic, version;
  std::memcpy(&magic, start.data(), 4);
  std::memcpy(&version, start.data() + 4, 4);
  if (magic != dialler_magic || version != wire_version)
    reject("not a coccl bootstrap connection (bad handshake)");
}

Channel Channel::listener_side(const Secret& secret,
                               std::span<const std::uint8_t, dialler_hello_size> hello,
                               const Nonce& mine,
                               std::array<std::uint8_t, listener_hello_size>& answer) {
  check_dialler_start(hello.first<8>());
  Nonce theirs;
  std::memcpy(theirs.data(), hello.data() + 8, theirs.size());
  detail::Digest key = connection_key(secret, theirs, mine);
  detail::Digest proof = listener_proof(key);
  std::memcpy(answer.data(), &listener_magic, 4);
  std::memcpy(answer.data() + 4, &wire_version, 4);
  std::memcpy(answer.data() + 8, mine.data(), mine.size());
  std::memcpy(answer.data() + 8 + nonce_size, proof.data(), proof.size());
  return Channel(key, false);
}

Channel Channel::dialler_side(const Secret& secret, const Nonce& mine,
                              std::span<const std::uint8_t, listener_hello_size> answer) {
  std::uint32_t magic, version;
  std::memcpy(&magic, answer.data(), 4);
  std::memcpy(&version, answer.data() + 4, 4);
  if (magic != listener_magic || version != wire_version)
    reject("the listener does not speak the coccl bootstrap protocol (version " +
           std::to_string(wire_version) + ")");
  Nonce theirs;
  std::memcpy(theirs.data(), answer.data() + 8, theirs.size());
  detail::Digest key = connection_key(secret, mine, theirs);
  detail::Digest want = listener_proof(key);
  if (!detail::equal_constant_time(answer.subspan<8 + nonce_size>(), want))
    reject("the listener failed authentication (it does not hold this communicator's secret)");
  return Channel(key, true);
}

asio::awaitable<Channel> Channel::initiate(Stream& socket, Secret secret) {
  Nonce mine;
  detail::random_bytes(mine);
  std::array<std::uint8_t, dialler_hello_size> hello = dialler_hello(mine);
  co_await asio::async_write(socket, asio::buffer(hello), asio::use_awaitable);
  std::array<std::uint8_t, listener_hello_size> answer{};
  co_await asio::async_read(socket, asio::buffer(answer), asio::use_awaitable);
  co_return dialler_side(secret, mine, answer);
}

asio::awaitable<Channel> Channel::respond(Stream& socket, Secret secret) {
  std::array<std::uint8_t, dialler_hello_size> hello{};
  // Magic and version first, so that a stranger writing anything else is dropped at once.
  co_await asio::async_read(socket, asio::buffer(hello.data(), 8), asio::use_awaitable);
  check_dialler_start(std::span(hello).first<8>());
  co_await asio::async_read(socket, asio::buffer(hello.data() + 8, nonce_size),
                            asio::use_awaitable);
  Nonce mine;
  detail::random_bytes(mine);
  std::array<std::uint8_t, listener_hello_size> answer{};
  Channel channel = listener_side(secret, hello, mine, answer);
  co_await asio::async_write(socket, asio::buffer(answer), asio::use_awaitable);
  co_return channel;
}

std::vector<std::uint8_t> Channel::seal(FrameType type, std::span<const std::uint8_t> payload) {
  Header h{frame_magic, static_cast<std::uint32_t>(type), payload.size(), sent_++};
  const std::uint8_t dir = direction(dialler_);
  detail::Digest htag = header_tag(key_, dir, h);
  detail::Digest ptag = payload_tag(key_, dir, h, payload);
  std::vector<std::uint8_t> out(sizeof h + htag.size() + payload.size() + ptag.size());
  std::uint8_t* p = out.data();
  std::memcpy(p, &h, sizeof h);
  std::memcpy(p + sizeof h, htag.data(), htag.size());
  // memcpy with a null source is undefined even for zero bytes (an empty payload).
  if (!payload.empty()) std::memcpy(p + sizeof h + htag.size(), payload.data(), payload.size());
  std::memcpy(p + sizeof h + htag.size() + payload.size(), ptag.data(), ptag.size());
  return out;
}

asio::awaitable<void> write_frame(Stream& socket, Channel& channel, FrameType type,
                                  std::span<const std::uint8_t> payload) {
  std::vector<std::uint8_t> bytes = channel.seal(type, payload);
  co_await asio::async_write(socket, asio::buffer(bytes), asio::use_awaitable);
}

Channel::Head Channel::open_head(std::span<const std::uint8_t, head_size> head,
                                 std::size_t max_payload) const {
  Header h;
  std::memcpy(&h, head.data(), sizeof h);
  const std::uint8_t dir = direction(!dialler_);
  // Nothing the header announces is believed before its tag checks out.
  if (h.magic != frame_magic ||
      !detail::equal_constant_time(head.subspan<sizeof h>(), header_tag(key_, dir, h)))
    reject("frame failed authentication (wrong secret, or captured on another connection)");
  if (h.counter != received_)
    reject("frame replayed or out of order (counter " + std::to_string(h.counter) + ", expected " +
           std::to_string(received_) + ")");
  if (h.length > max_payload)
    reject("frame of " + std::to_string(h.length) + " bytes exceeds the limit of " +
           std::to_string(max_payload));
  return {static_cast<FrameType>(h.type), static_cast<std::size_t>(h.length)};
}

void Channel::open_payload(std::span<const std::uint8_t, head_size> head,
                           std::span<const std::uint8_t> payload,
                           std::span<const std::uint8_t, tag_size> tag) {
  Header h;
  std::memcpy(&h, head.data(), sizeof h);
  if (!detail::equal_constant_time(tag, payload_tag(key_, direction(!dialler_), h, payload)))
    reject("frame payload failed authentication");
  ++received_;
}

asio::awaitable<Frame> read_frame(Stream& socket, Channel& channel, std::size_t max_payload) {
  std::array<std::uint8_t, Channel::head_size> head{};
  co_await asio::async_read(socket, asio::buffer(head), asio::use_awaitable);
  Channel::Head h = channel.open_head(head, max_payload);
  Frame f{h.type, std::vector<std::uint8_t>(h.length)};
  std::array<std::uint8_t, Channel::tag_size> tag{};
  std::array<asio::mutable_buffer, 2> bufs{asio::buffer(f.payload), asio::buffer(tag)};
  co_await asio::async_read(socket, bufs, asio::use_awaitable);
  channel.open_payload(head, f.payload, tag);
  co_return f;
}

void Reader::need(std::size_t n) const {
  if (b_.size() - pos_ < n)
    throw std::system_error(make_error_code(errc::bad_message), "truncated message");
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * bytes.size());
  for (std::uint8_t b : bytes) {
    text += digits[b >> 4];
    text += digits[b & 15];
  }
  return text;
}

bool from_hex(std::string_view text, std::span<std::uint8_t> out, bool any_case) {
  if (text.size() != 2 * out.size()) return false;
  auto digit = [any_case](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (any_case && c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return true;
}

std::vector<asio::ip::address> local_addresses() {
  std::string spec = params::socket_ifname.get();
  std::vector<asio::ip::address> chosen, loopback;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {asio::ip::address_v4::loopback()};
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    std::string name = i->ifa_name;
    asio::ip::address addr;
    if (fam == AF_INET) {
      auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      asio::ip::address_v4::bytes_type b;
      std::memcpy(b.data(), &sin->sin_addr, 4);
      addr = asio::ip::address_v4(b);
    } else {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
      asio::ip::address_v6::bytes_type b;
      std::memcpy(b.data(), &sin6->sin6_addr, 16);
      auto v6 = asio::ip::address_v6(b, sin6->sin6_scope_id);
      if (v6.is_link_local()) continue;
      addr = v6;
    }
    if (!spec.empty()) {
      if (matches(name, spec)) chosen.push_back(addr);
    } else if (i->ifa_flags & IFF_LOOPBACK) {
      if (fam == AF_INET) loopback.push_back(addr);
    } else if (name.rfind("docker", 0) != 0 && name.rfind("veth", 0) != 0 && fam == AF_INET) {
      chosen.push_back(addr);
    }
  }
  ::freeifaddrs(list);
  if (chosen.empty()) chosen = loopback;
  if (chosen.empty()) chosen.push_back(asio::ip::address_v4::loopback());
  return chosen;
}

HostPort split_endpoint(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size())
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "expected host:port, got '" + text + "'");
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  // Digits only: std::stoul would take "-1", " 80" or "80x" and wrap what is out of range.
  const std::string digits = text.substr(colon + 1);
  unsigned long port = 0;
  for (char c : digits) {
    if (c < '0' || c > '9' || port > 65535) {
      port = 65536;
      break;
    }
    port = port * 10 + static_cast<unsigned long>(c - '0');
  }
  if (port > 65535)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "port of '" + text + "' is not a number in [0, 65535]");
  return {std::move(host), static_cast<std::uint16_t>(port)};
}

asio::ip::tcp::endpoint parse_endpoint(const std::string& text) {
  HostPort hp = split_endpoint(text);
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(hp.host, ec);
  if (ec) {
    // A host name: resolve it synchronously; this runs once per communicator at setup.
    asio::io_context io;
    asio::ip::tcp::resolver r(io);
    auto res = r.resolve(hp.host, std::to_string(hp.port), ec);
    if (ec || res.empty())
      throw std::system_error(make_error_code(errc::invalid_argument),
                              "cannot resolve '" + hp.host + "'");
    return *res.begin();
  }
  return {addr, hp.port};
}

}  // namespace coccl::transport
