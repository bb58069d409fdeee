#include "transport/wire.hpp"

#include <ifaddrs.h>
#include <net/if.h>

#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <coccl/error.hpp>
#include <cstring>
#include <system_error>

#include "runtime/params.hpp"
#include "transport/hmac.hpp"

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

using Nonce = std::array<std::uint8_t, Channel::nonce_size>;

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

asio::awaitable<Channel> Channel::initiate(asio::ip::tcp::socket& socket, const Secret& secret) {
  Nonce mine;
  detail::random_bytes(mine);
  std::array<std::uint8_t, dialler_hello_size> hello{};
  std::memcpy(hello.data(), &dialler_magic, 4);
  std::memcpy(hello.data() + 4, &wire_version, 4);
  std::memcpy(hello.data() + 8, mine.data(), mine.size());
  co_await asio::async_write(socket, asio::buffer(hello), asio::use_awaitable);
  std::array<std::uint8_t, listener_hello_size> answer{};
  co_await asio::async_read(socket, asio::buffer(answer), asio::use_awaitable);
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
  if (!detail::equal_constant_time(std::span(answer).subspan(8 + nonce_size), want))
    reject("the listener failed authentication (it does not hold this communicator's secret)");
  co_return Channel(key, true);
}

asio::awaitable<Channel> Channel::respond(asio::ip::tcp::socket& socket, const Secret& secret) {
  std::array<std::uint8_t, dialler_hello_size> hello{};
  // Magic and version first, so that a stranger writing anything else is dropped at once.
  co_await asio::async_read(socket, asio::buffer(hello.data(), 8), asio::use_awaitable);
  std::uint32_t magic, version;
  std::memcpy(&magic, hello.data(), 4);
  std::memcpy(&version, hello.data() + 4, 4);
  if (magic != dialler_magic || version != wire_version)
    reject("not a coccl bootstrap connection (bad handshake)");
  co_await asio::async_read(socket, asio::buffer(hello.data() + 8, nonce_size),
                            asio::use_awaitable);
  Nonce theirs, mine;
  std::memcpy(theirs.data(), hello.data() + 8, theirs.size());
  detail::random_bytes(mine);
  detail::Digest key = connection_key(secret, theirs, mine);
  detail::Digest proof = listener_proof(key);
  std::array<std::uint8_t, listener_hello_size> answer{};
  std::memcpy(answer.data(), &listener_magic, 4);
  std::memcpy(answer.data() + 4, &wire_version, 4);
  std::memcpy(answer.data() + 8, mine.data(), mine.size());
  std::memcpy(answer.data() + 8 + nonce_size, proof.data(), proof.size());
  co_await asio::async_write(socket, asio::buffer(answer), asio::use_awaitable);
  co_return Channel(key, false);
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

asio::awaitable<void> write_frame(asio::ip::tcp::socket& socket, Channel& channel, FrameType type,
                                  std::span<const std::uint8_t> payload) {
  std::vector<std::uint8_t> bytes = channel.seal(type, payload);
  co_await asio::async_write(socket, asio::buffer(bytes), asio::use_awaitable);
}

asio::awaitable<Frame> read_frame(asio::ip::tcp::socket& socket, Channel& channel,
                                  std::size_t max_payload) {
  Header h{};
  detail::Digest htag{};
  std::array<asio::mutable_buffer, 2> head{asio::buffer(&h, sizeof h), asio::buffer(htag)};
  co_await asio::async_read(socket, head, asio::use_awaitable);
  const std::uint8_t dir = direction(!channel.dialler_);
  // Nothing the header announces is believed before its tag checks out.
  if (h.magic != frame_magic ||
      !detail::equal_constant_time(htag, header_tag(channel.key_, dir, h)))
    reject("frame failed authentication (wrong secret, or captured on another connection)");
  if (h.counter != channel.received_)
    reject("frame replayed or out of order (counter " + std::to_string(h.counter) + ", expected " +
           std::to_string(channel.received_) + ")");
  if (h.length > max_payload)
    reject("frame of " + std::to_string(h.length) + " bytes exceeds the limit of " +
           std::to_string(max_payload));
  Frame f{static_cast<FrameType>(h.type), std::vector<std::uint8_t>(h.length)};
  detail::Digest tag{};
  std::array<asio::mutable_buffer, 2> bufs{asio::buffer(f.payload), asio::buffer(tag)};
  co_await asio::async_read(socket, bufs, asio::use_awaitable);
  if (!detail::equal_constant_time(tag, payload_tag(channel.key_, dir, h, f.payload)))
    reject("frame payload failed authentication");
  ++channel.received_;
  co_return f;
}

void Reader::need(std::size_t n) const {
  if (b_.size() - pos_ < n)
    throw std::system_error(make_error_code(errc::bad_message), "truncated message");
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

asio::ip::tcp::endpoint parse_endpoint(const std::string& text) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size())
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "expected host:port, got '" + text + "'");
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  unsigned long port = std::stoul(text.substr(colon + 1));
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (ec) {
    // A host name: resolve it synchronously; this runs once per communicator at setup.
    asio::io_context io;
    asio::ip::tcp::resolver r(io);
    auto res = r.resolve(host, std::to_string(port), ec);
    if (ec || res.empty())
      throw std::system_error(make_error_code(errc::invalid_argument),
                              "cannot resolve '" + host + "'");
    return *res.begin();
  }
  return {addr, static_cast<unsigned short>(port)};
}

}  // namespace coccl::transport
