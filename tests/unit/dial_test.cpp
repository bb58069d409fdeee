// transport::dial against an address where nobody listens: every attempt is refused until the
// deadline, which must end the dial with errc::timed_out. The deadline's timer and the refusal
// often complete together; the timer's handler must then not touch the socket the dial has already
// freed (the sanitizer build checks this over many dials).
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <coccl/error.hpp>

#include "transport/bootstrap.hpp"

namespace coccl {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

TEST(Dial, RefusedUntilTheDeadlineEndsWithTimedOutEveryTime) {
  asio::io_context io;
  asio::ip::tcp::acceptor a(io, {asio::ip::address_v4::loopback(), 0});
  const asio::ip::tcp::endpoint ep = a.local_endpoint();
  a.close();
  for (int i = 0; i < 40; ++i) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(5 + i % 7 * 9);
    auto f =
        asio::co_spawn(io, transport::dial(io.get_executor(), transport::PeerInfo::from(ep), until),
                       asio::use_future);
    io.restart();
    io.run();
    try {
      f.get();
      ADD_FAILURE() << "dial " << i << " connected to a closed port";
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::timed_out)) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(ep.port())), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace coccl
