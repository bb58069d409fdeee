// The TCPStore client of Communicator::from_env() against a server speaking torch's protocol:
// values round-trip, a get waits for a later set, and a missing key, a silent port or a port that
// is not a store fail with coccl's errors within the deadline.
#include "transport/launcher.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <coccl/error.hpp>
#include <thread>

#include "tests/support/fake_store.hpp"

namespace coccl::test {
namespace {

using namespace std::chrono_literals;
using transport::TcpStoreClient;

errc code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().category(), error_category()) << e.what();
    return static_cast<errc>(e.code().value());
  }
  ADD_FAILURE() << "no error";
  return errc::internal;
}

TEST(TcpStoreClient, SetGetAndAddRoundTrip) {
  FakeStore store;
  TcpStoreClient c("127.0.0.1", store.port(), 5s);
  c.set("k", std::string("v\0w", 3));
  EXPECT_EQ(c.get("k"), std::string("v\0w", 3));
  c.set("k", "");
  EXPECT_EQ(c.get("k"), "");
  EXPECT_EQ(c.add("n", 5), 5);
  EXPECT_EQ(c.add("n", -2), 3);
  EXPECT_EQ(store.contents().at("n"), "3");
}

TEST(TcpStoreClient, GetWaitsForAKeySetLaterByAnotherClient) {
  FakeStore store;
  TcpStoreClient reader("127.0.0.1", store.port(), 10s);
  std::thread writer([&] {
    TcpStoreClient w("127.0.0.1", store.port(), 10s);
    std::this_thread::sleep_for(100ms);
    w.set("late", "here");
  });
  EXPECT_EQ(reader.get("late"), "here");
  writer.join();
}

TEST(TcpStoreClient, MissingKeyTimesOutAndTheClientStaysFailed) {
  FakeStore store;
  TcpStoreClient c("127.0.0.1", store.port(), 300ms);
  EXPECT_EQ(code_of([&] { c.get("never"); }), errc::timed_out);
  EXPECT_EQ(code_of([&] { c.set("x", "y"); }), errc::peer_lost);
}

TEST(TcpStoreClient, NobodyListeningTimesOut) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::address_v4::loopback(), 0});
  const auto port = a.local_endpoint().port();
  a.close();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(code_of([&] { TcpStoreClient("127.0.0.1", port, 300ms); }), errc::timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST(TcpStoreClient, APortThatIsNotAStoreIsRefused) {
  // A server that answers every connection with bytes that are not the PING echo.
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::address_v4::loopback(), 0});
  std::thread server([&] {
    auto s = a.accept();
    const char junk[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    boost::asio::write(s, boost::asio::buffer(junk));
    std::this_thread::sleep_for(200ms);
  });
  EXPECT_EQ(code_of([&] { TcpStoreClient("127.0.0.1", a.local_endpoint().port(), 2s); }),
            errc::bad_message);
  server.join();
}

TEST(TcpStoreClient, AServerThatHangsUpIsAPeerLoss) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::address_v4::loopback(), 0});
  std::thread server([&] { a.accept().close(); });
  EXPECT_EQ(code_of([&] { TcpStoreClient("127.0.0.1", a.local_endpoint().port(), 2s); }),
            errc::peer_lost);
  server.join();
}

}  // namespace
}  // namespace coccl::test
