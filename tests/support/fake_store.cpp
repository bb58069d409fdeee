// The fake TCPStore: one coroutine per client on a private io_context. WAIT answers once every
// key named exists (from a later SET or ADD if need be); a client that asks anything before a
// valid VALIDATE is dropped, as torch's own server does.
#include "fake_store.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace coccl::test {

namespace asio = boost::asio;
using asio::ip::tcp;

struct FakeStore::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io, tcp::endpoint(asio::ip::address_v4::loopback(), 0)};
  mutable std::mutex mu;
  std::map<std::string, std::string> data;
  int validated = 0;
  // Waiters are woken by cancelling this timer whenever a key changes.
  asio::steady_timer changed{io, asio::steady_timer::time_point::max()};
  std::thread thread;

  template <typename T>
  static asio::awaitable<T> value(tcp::socket& s) {
    T v{};
    co_await asio::async_read(s, asio::buffer(&v, sizeof v), asio::use_awaitable);
    co_return v;
  }
  static asio::awaitable<std::string> text(tcp::socket& s) {
    const auto n = co_await value<std::uint64_t>(s);
    if (n > (1u << 20)) throw std::runtime_error("fake store: oversized string");
    std::string out(n, '\0');
    if (n) co_await asio::async_read(s, asio::buffer(out), asio::use_awaitable);
    co_return out;
  }
  template <typename T>
  static asio::awaitable<void> reply(tcp::socket& s, T v) {
    co_await asio::async_write(s, asio::buffer(&v, sizeof v), asio::use_awaitable);
  }

  void notify() { changed.cancel(); }
  bool has_all(const std::vector<std::string>& keys) const {
    std::lock_guard lock(mu);
    for (const auto& k : keys)
      if (!data.count(k)) return false;
    return true;
  }

  asio::awaitable<void> serve(tcp::socket s) {
    try {
      if (co_await value<std::uint8_t>(s) != 0) co_return;
      if (co_await value<std::uint32_t>(s) != 0x3C85F7CE) co_return;
      {
        std::lock_guard lock(mu);
        ++validated;
      }
      for (;;) {
        const auto q = co_await value<std::uint8_t>(s);
        if (q == 13) {  // PING
          co_await reply(s, co_await value<std::uint32_t>(s));
        } else if (q == 1) {  // SET
          std::string k = co_await text(s);
          std::string v = co_await text(s);
          {
            std::lock_guard lock(mu);
            data[k] = v;
          }
          notify();
        } else if (q == 3) {  // GET
          std::string k = co_await text(s);
          std::string v;
          {
            std::lock_guard lock(mu);
            v = data.at(k);
          }
          const std::uint64_t n = v.size();
          std::string out(reinterpret_cast<const char*>(&n), sizeof n);
          out += v;
          co_await asio::async_write(s, asio::buffer(out), asio::use_awaitable);
        } else if (q == 4) {  // ADD
          std::string k = co_await text(s);
          const auto delta = co_await value<std::int64_t>(s);
          std::int64_t now;
          {
            std::lock_guard lock(mu);
            auto& v = data[k];
            now = (v.empty() ? 0 : std::stoll(v)) + delta;
            v = std::to_string(now);
          }
          notify();
          co_await reply(s, now);
        } else if (q == 6) {  // WAIT
          const auto n = co_await value<std::uint64_t>(s);
          std::vector<std::string> keys;
          for (std::uint64_t i = 0; i < n; ++i) keys.push_back(co_await text(s));
          while (!has_all(keys)) {
            boost::system::error_code ec;
            co_await changed.async_wait(asio::redirect_error(asio::use_awaitable, ec));
          }
          co_await reply(s, std::uint8_t{0});
        } else {
          co_return;
        }
      }
    } catch (const std::exception&) {
      // The client went away or broke the protocol: drop it.
    }
  }

  asio::awaitable<void> accept() {
    for (;;) {
      tcp::socket s = co_await acceptor.async_accept(asio::use_awaitable);
      asio::co_spawn(io, serve(std::move(s)), asio::detached);
    }
  }
};

FakeStore::FakeStore() : impl_(std::make_unique<Impl>()) {
  asio::co_spawn(impl_->io, impl_->accept(), asio::detached);
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

FakeStore::~FakeStore() {
  impl_->io.stop();
  impl_->thread.join();
}

std::uint16_t FakeStore::port() const { return impl_->acceptor.local_endpoint().port(); }

std::map<std::string, std::string> FakeStore::contents() const {
  std::lock_guard lock(impl_->mu);
  return impl_->data;
}

int FakeStore::validated_clients() const {
  std::lock_guard lock(impl_->mu);
  return impl_->validated;
}

}  // namespace coccl::test
