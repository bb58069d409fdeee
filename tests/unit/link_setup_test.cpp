// Each transport's LinkSetup on its own, without Peers: the two ends exchange their addresses as
// the link request and reply would carry them, build their connections over a connected socket
// pair, and a put from one end arrives intact at the other. Malformed addresses and kinds this
// rank cannot make fail with a clear error.
#include "transport/link_setup.hpp"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_future.hpp>
#include <coccl/error.hpp>
#include <future>
#include <string>
#include <vector>

namespace coccl {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using transport::LinkKind;

constexpr std::size_t slot_bytes = 4096;

// One end's environment; its poller is driven by the proxy thread.
struct End {
  transport::LinkPoller poller, ib_poller;
  transport::LinkEnv env;
  std::vector<std::string> failures;
  End(runtime::ProxyThread& thread, int rank) {
    env.thread = &thread;
    env.rank = rank;
    env.slot_bytes = slot_bytes;
    env.poller = &poller;
    env.ib_poller = &ib_poller;
    env.user_buffers = transport::make_user_buffers(nullptr);
    env.on_failure = [this](int peer, std::error_code, const std::string& why) {
      failures.push_back("peer " + std::to_string(peer) + ": " + why);
    };
  }
};

std::pair<tcp::socket, tcp::socket> socket_pair(runtime::ProxyThread& thread) {
  tcp::acceptor acceptor(thread.context(), {asio::ip::address_v4::loopback(), 0});
  tcp::socket dialler(thread.context()), answerer(thread.context());
  dialler.connect(acceptor.local_endpoint());
  acceptor.accept(answerer);
  return {std::move(dialler), std::move(answerer)};
}

class EveryKind : public ::testing::TestWithParam<LinkKind> {};

TEST_P(EveryKind, BothEndsMakeALinkThatCarriesAPutIntact) {
  runtime::ProxyThread thread(0);
  End a(thread, 0), b(thread, 1);
  // Named members, not a structured binding: clang 14 (the ASan tree) cannot capture a binding.
  auto pair = socket_pair(thread);
  auto& sa = pair.first;
  auto& sb = pair.second;
  auto dialler = transport::make_link_setup(GetParam(), a.env, 1, 4);
  auto answerer = transport::make_link_setup(GetParam(), b.env, 0, 4);
  // The handshake as Peers runs it: offer, accept, complete; then both ends build.
  const auto request = dialler->offer();
  const auto reply = answerer->accept(request);
  dialler->complete(reply);
  EXPECT_FALSE(dialler->confirms());
  std::vector<std::byte> sent(3000);
  for (std::size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<std::byte>(i * 7 + 1);
  // Connections live and die on the proxy thread, whose loop also drives the pollers.
  auto body = [&]() -> asio::awaitable<std::vector<std::byte>> {
    thread.add_poller(&a.poller);
    thread.add_poller(&b.poller);
    auto ca = dialler->make(1, transport::Stream(std::move(sa)), {});
    auto cb = answerer->make(0, transport::Stream(std::move(sb)), {});
    co_await ca->put(sent.data(), sent.size(), 42);
    transport::Chunk c = co_await cb->wait();
    EXPECT_EQ(c.fingerprint, 42u);
    std::vector<std::byte> out(c.data, c.data + c.size);
    cb->release();
    ca->close(make_error_code(errc::aborted), "test over");
    cb->close(make_error_code(errc::aborted), "test over");
    ca.reset();
    cb.reset();
    thread.remove_poller(&a.poller);
    thread.remove_poller(&b.poller);
    co_return out;
  };
  const std::vector<std::byte> got =
      asio::co_spawn(thread.executor(), body(), asio::use_future).get();
  EXPECT_EQ(got, sent);
}

INSTANTIATE_TEST_SUITE_P(LinkSetup, EveryKind, ::testing::Values(LinkKind::tcp, LinkKind::shm),
                         [](const auto& info) {
                           return std::string(info.param == LinkKind::tcp ? "tcp" : "shm");
                         });

TEST(LinkSetup, ATcpRequestCarryingAnAddressIsRefused) {
  runtime::ProxyThread thread(0);
  End b(thread, 1);
  auto answerer = transport::make_link_setup(LinkKind::tcp, b.env, 0, 4);
  const std::vector<std::uint8_t> junk{1, 2, 3};
  try {
    answerer->accept(junk);
    ADD_FAILURE() << "a tcp link took an address";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::bad_message)) << e.what();
  }
}

TEST(LinkSetup, AShmSegmentThatDoesNotExistIsAClearError) {
  runtime::ProxyThread thread(0);
  End b(thread, 1);
  auto answerer = transport::make_link_setup(LinkKind::shm, b.env, 0, 4);
  const std::string name = "/coccl-no-such-segment-" + std::to_string(::getpid());
  const std::vector<std::uint8_t> address(name.begin(), name.end());
  try {
    answerer->accept(address);
    ADD_FAILURE() << "mapped a segment that does not exist";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("coccl-no-such-segment"), std::string::npos) << e.what();
  }
}

TEST(LinkSetup, AnIbLinkWithoutADeviceIsUnsupported) {
  runtime::ProxyThread thread(0);
  End a(thread, 0);
  try {
    transport::make_link_setup(LinkKind::ib, a.env, 1, 4);
    ADD_FAILURE() << "an ib set-up without a device";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::unsupported)) << e.what();
  }
}

TEST(LinkSetup, AnUnknownKindIsABadMessage) {
  runtime::ProxyThread thread(0);
  End a(thread, 0);
  try {
    transport::make_link_setup(static_cast<LinkKind>(9), a.env, 1, 4);
    ADD_FAILURE() << "a set-up of kind 9";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::bad_message)) << e.what();
  }
}

}  // namespace
}  // namespace coccl
