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

constexpr std::uint32_t frame_magic = 0x4c43434fu;  // "OCCL"

struct Header {
  std::uint32_t magic;
  std::uint32_t type;
  std::uint64_t length;
};
static_assert(sizeof(Header) == 16);

detail::Digest tag_of(const Secret& secret, const Header& h, std::span<const std::uint8_t> p) {
  return detail::hmac_sha256(
      secret, {std::span(reinterpret_cast<const std::uint8_t*>(&h), sizeof h), p});
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

asio::awaitable<void> write_frame(asio::ip::tcp::socket& socket, const Secret& secret,
                                  FrameType type, std::span<const std::uint8_t> payload) {
  Header h{frame_magic, static_cast<std::uint32_t>(type), payload.size()};
  detail::Digest tag = tag_of(secret, h, payload);
  std::array<asio::const_buffer, 3> bufs{asio::buffer(&h, sizeof h),
                                         asio::buffer(payload.data(), payload.size()),
                                         asio::buffer(tag)};
  co_await asio::async_write(socket, bufs, asio::use_awaitable);
}

asio::awaitable<Frame> read_frame(asio::ip::tcp::socket& socket, const Secret& secret,
                                  std::size_t max_payload) {
  Header h{};
  co_await asio::async_read(socket, asio::buffer(&h, sizeof h), asio::use_awaitable);
  if (h.magic != frame_magic || h.length > max_payload)
    throw std::system_error(make_error_code(errc::bad_message), "bad frame header");
  Frame f{static_cast<FrameType>(h.type), std::vector<std::uint8_t>(h.length)};
  detail::Digest tag{};
  std::array<asio::mutable_buffer, 2> bufs{asio::buffer(f.payload), asio::buffer(tag)};
  co_await asio::async_read(socket, bufs, asio::use_awaitable);
  detail::Digest want = tag_of(secret, h, f.payload);
  if (!detail::equal_constant_time(tag, want))
    throw std::system_error(make_error_code(errc::bad_message), "frame failed authentication");
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
