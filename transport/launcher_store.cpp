// TcpStoreClient: torch.distributed's TCPStore wire protocol, client side.
//
// Every request is one byte of query type followed by its arguments; strings and byte vectors
// travel as a 64-bit length and the bytes, integers in the host's byte order (the store and its
// clients run on the same architecture, and torch makes the same assumption). A connection starts
// with VALIDATE (a fixed magic number) and a PING whose nonce the server echoes. GET is preceded
// by WAIT on the key, which the server answers once the key exists. A deadline closes the
// connection (the server drops a closed client's pending WAIT), so a client that timed out stays
// failed.
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <coccl/error.hpp>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "transport/launcher.hpp"

namespace coccl::transport {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

enum class Query : std::uint8_t {
  validate = 0,
  set = 1,
  get = 3,
  add = 4,
  wait = 6,
  ping = 13,
};
enum class WaitReply : std::uint8_t { stop_waiting = 0 };
constexpr std::uint32_t validation_magic = 0x3C85F7CE;
// A UniqueId's text is 256 bytes; anything far larger is not an answer to our queries.
constexpr std::uint64_t max_value_bytes = 1 << 20;

[[noreturn]] void fail(errc e, const std::string& what) {
  throw std::system_error(make_error_code(e), what);
}

class Request {
 public:
  explicit Request(Query q) { bytes_.push_back(static_cast<std::uint8_t>(q)); }
  std::size_t queries() const { return queries_; }
  template <typename T>
  Request& value(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof v);
    return *this;
  }
  // Starts another request in the same buffer.
  Request& query(Query q) {
    bytes_.push_back(static_cast<std::uint8_t>(q));
    ++queries_;
    return *this;
  }
  Request& text(std::string_view s) {
    value<std::uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  const std::vector<std::uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
  std::size_t queries_ = 1;
};

}  // namespace

struct TcpStoreClient::State {
  asio::io_context io;
  tcp::socket sock{io};
  std::string where;
  std::chrono::milliseconds timeout;
  std::uint64_t requests = 0;

  // Runs the io_context until `done` or the deadline; on the deadline the socket is closed, which
  // completes the pending operation with operation_aborted. Returns false on the deadline.
  bool run_until(const bool& done, std::chrono::steady_clock::time_point deadline) {
    io.restart();
    while (!done) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        boost::system::error_code ignored;
        sock.close(ignored);
        io.restart();
        io.run();
        return false;
      }
      io.run_one_for(deadline - now);
    }
    return true;
  }

  void send(const Request& r, std::chrono::steady_clock::time_point deadline) {
    requests += r.queries();
    bool done = false;
    boost::system::error_code ec;
    asio::async_write(sock, asio::buffer(r.bytes()), [&](boost::system::error_code e, std::size_t) {
      ec = e;
      done = true;
    });
    if (!run_until(done, deadline))
      fail(errc::timed_out, "TCPStore at " + where + ": send timed out");
    if (ec) fail(errc::peer_lost, "TCPStore at " + where + ": " + ec.message());
  }

  // Reads exactly `n` bytes. Returns false when the deadline passed first.
  bool recv(void* p, std::size_t n, std::chrono::steady_clock::time_point deadline) {
    bool done = false;
    boost::system::error_code ec;
    asio::async_read(sock, asio::buffer(p, n), [&](boost::system::error_code e, std::size_t) {
      ec = e;
      done = true;
    });
    if (!run_until(done, deadline)) return false;
    if (ec == asio::error::eof || ec == asio::error::connection_reset)
      fail(errc::peer_lost, "TCPStore at " + where + " closed the connection");
    if (ec) fail(errc::peer_lost, "TCPStore at " + where + ": " + ec.message());
    return true;
  }

  // The reader the answer decoders use, bounded by `deadline`.
  StoreRead reader(std::chrono::steady_clock::time_point deadline) {
    return [this, deadline](void* p, std::size_t n) { return recv(p, n, deadline); };
  }

  // One WAIT naming every one of `keys` (not empty), answered once they all exist.
  void wait(std::span<const std::string> keys, std::chrono::steady_clock::time_point until) {
    Request w(Query::wait);
    w.value<std::uint64_t>(keys.size());
    for (const std::string& k : keys) w.text(k);
    send(w, until);
    read_wait_answer(reader(until), keys.front(), where, timeout);
  }

  std::chrono::steady_clock::time_point deadline() const {
    return std::chrono::steady_clock::now() + timeout;
  }
};

TcpStoreClient::TcpStoreClient(const std::string& host, std::uint16_t port,
                               std::chrono::milliseconds timeout)
    : s_(std::make_unique<State>()) {
  s_->where = host + ":" + std::to_string(port);
  s_->timeout = timeout;
  const auto until = s_->deadline();
  tcp::resolver resolver(s_->io);
  boost::system::error_code ec;
  auto endpoints = resolver.resolve(host, std::to_string(port), ec);
  if (ec) fail(errc::invalid_argument, "TCPStore address " + s_->where + ": " + ec.message());
  // The launcher may start its store a moment after its workers: retry refused connections.
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    bool done = false;
    asio::async_connect(s_->sock, endpoints,
                        [&](boost::system::error_code e, const tcp::endpoint&) {
                          ec = e;
                          done = true;
                        });
    if (!s_->run_until(done, until))
      fail(errc::timed_out, "TCPStore at " + s_->where + " did not accept a connection in time");
    if (!ec) break;
    if (std::chrono::steady_clock::now() + pause >= until)
      fail(errc::timed_out, "TCPStore at " + s_->where + ": " + ec.message());
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
    s_->sock = tcp::socket(s_->io);
  }
  s_->sock.set_option(tcp::no_delay(true), ec);
  s_->send(Request(Query::validate).value(validation_magic), until);
  const std::uint32_t nonce = static_cast<std::uint32_t>(::getpid()) ^ 0x636f63u;
  s_->send(Request(Query::ping).value(nonce), until);
  read_ping_answer(s_->reader(until), nonce, s_->where);
}

TcpStoreClient::~TcpStoreClient() = default;

std::uint64_t TcpStoreClient::requests() const noexcept { return s_->requests; }

void TcpStoreClient::set(std::string_view key, std::string_view value) {
  s_->send(Request(Query::set).text(key).text(value), s_->deadline());
}

std::string TcpStoreClient::get(std::string_view key) {
  const std::string k(key);
  return get_many(std::span<const std::string>(&k, 1)).front();
}

void TcpStoreClient::wait(std::span<const std::string> keys) {
  if (!keys.empty()) s_->wait(keys, s_->deadline());
}

std::vector<std::string> TcpStoreClient::get_many(std::span<const std::string> keys) {
  std::vector<std::string> out;
  if (keys.empty()) return out;
  const auto until = s_->deadline();
  s_->wait(keys, until);
  // The server answers one connection's requests in order, so the GETs can go out as one write.
  Request gets(Query::get);
  gets.text(keys.front());
  for (std::size_t i = 1; i < keys.size(); ++i) gets.query(Query::get).text(keys[i]);
  s_->send(gets, until);
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(read_get_answer(s_->reader(until), k, s_->where));
  return out;
}

std::int64_t TcpStoreClient::add(std::string_view key, std::int64_t delta) {
  const auto until = s_->deadline();
  s_->send(Request(Query::add).text(key).value(delta), until);
  return read_add_answer(s_->reader(until), s_->where);
}

namespace {

template <typename T>
T read_value(const StoreRead& read, const std::string& where, const char* what) {
  T v{};
  if (!read(&v, sizeof v)) fail(errc::timed_out, "TCPStore at " + where + ": no answer to " + what);
  return v;
}

}  // namespace

void read_ping_answer(const StoreRead& read, std::uint32_t nonce, const std::string& where) {
  if (read_value<std::uint32_t>(read, where, "PING") != nonce)
    fail(errc::bad_message, where + " is not a TCPStore (wrong PING answer)");
}

void read_wait_answer(const StoreRead& read, std::string_view key, const std::string& where,
                      std::chrono::milliseconds timeout) {
  WaitReply r{};
  if (!read(&r, sizeof r))
    fail(errc::timed_out, "TCPStore at " + where + ": key '" + std::string(key) +
                              "' did not appear within " + std::to_string(timeout.count()) + " ms");
  if (r != WaitReply::stop_waiting)
    fail(errc::bad_message, "TCPStore at " + where + ": bad WAIT answer");
}

std::string read_get_answer(const StoreRead& read, std::string_view key, const std::string& where) {
  const auto n = read_value<std::uint64_t>(read, where, "GET");
  if (n > max_value_bytes)
    fail(errc::bad_message, "TCPStore at " + where + ": value of '" + std::string(key) + "' is " +
                                std::to_string(n) + " bytes");
  std::string value(n, '\0');
  if (n && !read(value.data(), n))
    fail(errc::timed_out, "TCPStore at " + where + ": GET answer cut short");
  return value;
}

std::int64_t read_add_answer(const StoreRead& read, const std::string& where) {
  return read_value<std::int64_t>(read, where, "ADD");
}

namespace {

class StoreBook final : public AddressBook {
 public:
  StoreBook(TcpStoreClient& store, std::string key, int rank, int nranks)
      : store_(store), key_(std::move(key)), rank_(rank), nranks_(nranks) {}

  void publish(const PeerInfo& self) override {
    store_.set(entry_key(rank_), encode_book_entry(self));
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(self.host_hash));
    host_key_ = key_ + "/host/" + hash;
    // Counted before arriving, so that once the last rank has arrived both counts are final.
    if (store_.add(host_key_, 1) == 1) store_.add(key_ + "/hosts", 1);
    const std::int64_t arrived = store_.add(key_ + "/arrived", 1);
    if (arrived > nranks_)
      bad_message("the launcher's store counts " + std::to_string(arrived) + " ranks under " +
                  key_ + ", of " + std::to_string(nranks_) +
                  " (two jobs, or two ranks of one number, share its keys)");
    const std::string ready = key_ + "/ready";
    // The last rank to arrive ends the barrier; the others only need the flag to exist.
    if (arrived == nranks_) {
      store_.set(ready, "1");
      return;
    }
    try {
      store_.wait(std::span<const std::string>(&ready, 1));
    } catch (const std::system_error& e) {
      if (e.code() != make_error_code(errc::timed_out)) throw;
      throw std::system_error(e.code(), "bootstrap: " + std::to_string(arrived) + " of " +
                                            std::to_string(nranks_) +
                                            " ranks had put their address in the launcher's "
                                            "store when this rank did, and not all came (" +
                                            e.what() + ")");
    }
  }

  PeerInfo lookup(int rank) override {
    return decode_book_entry(store_.get(entry_key(rank)), rank);
  }

  std::vector<PeerInfo> lookup_many(std::span<const int> ranks) override {
    std::vector<std::string> keys;
    keys.reserve(ranks.size());
    for (int r : ranks) keys.push_back(entry_key(r));
    const std::vector<std::string> values = store_.get_many(keys);
    std::vector<PeerInfo> out;
    out.reserve(ranks.size());
    for (std::size_t i = 0; i < ranks.size(); ++i)
      out.push_back(decode_book_entry(values[i], ranks[i]));
    return out;
  }

  bool counts_hosts() override { return true; }

  std::optional<HostCount> hosts() override {
    if (host_key_.empty()) return std::nullopt;  // not published yet: nothing counted
    // ADD of 0 reads a counter as the integer it is.
    const std::int64_t hosts = store_.add(key_ + "/hosts", 0);
    const std::int64_t here = store_.add(host_key_, 0);
    if (hosts < 1 || hosts > nranks_ || here < 1 || here > nranks_)
      bad_message("the launcher's store counts " + std::to_string(hosts) + " hosts and " +
                  std::to_string(here) + " ranks on this one, of " + std::to_string(nranks_));
    return HostCount{static_cast<std::uint32_t>(hosts), static_cast<std::uint32_t>(here)};
  }

 private:
  std::string entry_key(int rank) const { return key_ + "/addr/" + std::to_string(rank); }

  TcpStoreClient& store_;
  std::string key_;
  std::string host_key_;
  int rank_, nranks_;
};

}  // namespace

std::unique_ptr<AddressBook> store_book(TcpStoreClient& store, std::string key, int rank,
                                        int nranks) {
  return std::make_unique<StoreBook>(store, std::move(key), rank, nranks);
}

}  // namespace coccl::transport
