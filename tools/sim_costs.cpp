#include "sim_costs.hpp"

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

namespace coccl::sim {

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using clock = std::chrono::steady_clock;

constexpr int warmup = 200;
constexpr int round_trips = 2000;
constexpr std::size_t message_bytes = 64;
constexpr std::size_t bulk_chunk = 1 << 20;
constexpr std::size_t bulk_bytes = std::size_t{128} << 20;
constexpr int connections = 300;

double seconds_since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

// A connected pair of loopback sockets, Nagle off (each message leaves at once).
struct Pair {
  asio::io_context io;
  tcp::socket a{io}, b{io};
  Pair() {
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    a.connect(acceptor.local_endpoint());
    acceptor.accept(b);
    a.set_option(tcp::no_delay(true));
    b.set_option(tcp::no_delay(true));
  }
};

double message_cost() {
  Pair p;
  std::thread echo([&] {
    std::array<std::byte, message_bytes> buf{};
    for (int i = 0; i < warmup + round_trips; ++i) {
      asio::read(p.b, asio::buffer(buf));
      asio::write(p.b, asio::buffer(buf));
    }
  });
  std::array<std::byte, message_bytes> buf{};
  clock::time_point start;
  for (int i = 0; i < warmup + round_trips; ++i) {
    if (i == warmup) start = clock::now();
    asio::write(p.a, asio::buffer(buf));
    asio::read(p.a, asio::buffer(buf));
  }
  const double s = seconds_since(start);
  echo.join();
  return s / (2.0 * round_trips);
}

double byte_cost() {
  Pair p;
  std::thread sink([&] {
    std::vector<std::byte> buf(bulk_chunk);
    for (std::size_t got = 0; got < bulk_bytes; got += bulk_chunk)
      asio::read(p.b, asio::buffer(buf));
  });
  std::vector<std::byte> buf(bulk_chunk, std::byte{1});
  const auto start = clock::now();
  for (std::size_t sent = 0; sent < bulk_bytes; sent += bulk_chunk)
    asio::write(p.a, asio::buffer(buf));
  sink.join();
  return seconds_since(start) / static_cast<double>(bulk_bytes);
}

double connect_cost() {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  const tcp::endpoint where = acceptor.local_endpoint();
  std::thread listener([&] {
    for (int i = 0; i < connections; ++i) {
      tcp::socket s(io);
      acceptor.accept(s);
    }
  });
  const auto start = clock::now();
  for (int i = 0; i < connections; ++i) {
    tcp::socket s(io);
    s.connect(where);
  }
  listener.join();
  return seconds_since(start) / connections;
}

}  // namespace

Costs measure_tcp_costs() {
  Costs c;
  c.message_s = message_cost();
  c.byte_s = byte_cost();
  c.connect_s = connect_cost();
  return c;
}

}  // namespace coccl::sim
