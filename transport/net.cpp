#include "transport/net.hpp"

#include <unistd.h>

#include <boost/asio/append.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/error.hpp>
#include <cstring>

#include "runtime/deadline.hpp"
#include "transport/admission.hpp"
#include "transport/bootstrap.hpp"
#include "transport/memory.hpp"

namespace coccl::transport {

namespace {

using tcp = asio::ip::tcp;

// Completes an accept on a tcp acceptor with the socket as a Stream. A struct, not a lambda: a
// lambda holding an any_completion_handler looks copyable to Asio, and copying one wraps it in
// itself.
struct TcpAccepted {
  std::shared_ptr<tcp::socket> socket;
  Acceptor::AcceptHandler handler;

  void operator()(boost::system::error_code ec) {
    asio::dispatch(asio::append(std::move(handler), ec, Stream(std::move(*socket))));
  }
};

using local = asio::local::stream_protocol;

// A unix socket as a Stream (the meeting of one host's ranks, Acceptor::listen_local).
class UnixStream final : public Stream::Impl {
 public:
  explicit UnixStream(local::socket socket) : socket_(std::move(socket)) {}
  Stream::executor_type get_executor() override { return socket_.get_executor(); }
  // The buffer arrays go by value: Asio keeps its own copy of the sequence for the operation.
  void async_read_some(Stream::MutableBuffers buffers, Stream::Handler handler) override {
    socket_.async_read_some(buffers.at, std::move(handler));
  }
  void async_write_some(Stream::ConstBuffers buffers, Stream::Handler handler) override {
    socket_.async_write_some(buffers.at, std::move(handler));
  }
  std::size_t write_some_now(asio::const_buffer buffer, boost::system::error_code& ec) override {
    socket_.non_blocking(true, ec);
    if (ec) return 0;
    return socket_.write_some(buffer, ec);
  }
  void close(boost::system::error_code& ec) override { socket_.close(ec); }
  bool is_open() const override { return socket_.is_open(); }

 private:
  local::socket socket_;
};

struct UnixAccepted {
  std::shared_ptr<local::socket> socket;
  Acceptor::AcceptHandler handler;

  void operator()(boost::system::error_code ec) {
    asio::dispatch(asio::append(std::move(handler), ec,
                                Stream(std::make_unique<UnixStream>(std::move(*socket)))));
  }
};

// An abstract socket's name: a leading NUL, so that nothing appears in the file system.
local::endpoint abstract_endpoint(const std::string& name) {
  return local::endpoint(std::string(1, '\0') + name);
}

// A name on the in-memory network, as a listener number open_at() takes.
std::uint64_t memory_name(const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a: the names are digests already
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

PeerInfo memory_address(std::uint64_t number) {
  PeerInfo p{};
  p.family = family_memory;
  std::memcpy(p.addr.data(), &number, sizeof number);
  p.host_hash = host_hash();
  p.pid = ::getpid();
  return p;
}

std::uint64_t memory_number(const PeerInfo& p) noexcept {
  std::uint64_t number;
  std::memcpy(&number, p.addr.data(), sizeof number);
  return number;
}

std::string address_text(const PeerInfo& p) {
  if (is_memory(p)) return "memory:" + std::to_string(memory_number(p));
  return endpoint_text(p.endpoint());
}

Acceptor::Acceptor(asio::any_io_executor ex) : ex_(ex), tcp_(ex) {}

Acceptor::~Acceptor() {
  boost::system::error_code ignored;
  close(ignored);
}

void Acceptor::listen(const tcp::endpoint& endpoint, bool reuse_address,
                      boost::system::error_code& ec) {
  tcp_.open(endpoint.protocol(), ec);
  if (!ec && reuse_address) tcp_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) tcp_.bind(endpoint, ec);
  if (!ec) tcp_.listen(asio::socket_base::max_listen_connections, ec);
}

void Acceptor::listen_memory(std::shared_ptr<Traffic> traffic) {
  memory_ = memory::Listener::open(ex_, std::move(traffic));
}

bool Acceptor::listen_local(const std::string& name, bool memory,
                            std::shared_ptr<Traffic> traffic) {
  if (memory) {
    memory_ = memory::Listener::open_at(memory_name(name), ex_, std::move(traffic));
    return memory_ != nullptr;
  }
  local_.emplace(ex_);
  boost::system::error_code ec;
  local_->open(local(), ec);
  if (!ec) local_->bind(abstract_endpoint(name), ec);
  if (!ec) local_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) local_.reset();
  return !ec;
}

PeerInfo Acceptor::local_info() const {
  if (memory_) return memory_address(memory_->number());
  return PeerInfo::from(tcp_.local_endpoint());
}

void Acceptor::start_accept(AcceptHandler handler) {
  if (memory_) return memory_->async_accept(std::move(handler));
  if (local_) {
    auto socket = std::make_shared<local::socket>(ex_);
    return local_->async_accept(*socket, UnixAccepted{socket, std::move(handler)});
  }
  auto socket = std::make_shared<tcp::socket>(ex_);
  tcp_.async_accept(*socket, TcpAccepted{socket, std::move(handler)});
}

void Acceptor::close(boost::system::error_code& ec) {
  if (memory_) {
    memory_->close();
    ec = {};
    return;
  }
  if (local_) {
    local_->close(ec);
    return;
  }
  tcp_.close(ec);
}

bool Acceptor::is_open() const {
  if (memory_) return memory_->is_open();
  if (local_) return local_->is_open();
  return tcp_.is_open();
}

namespace {

// The in-memory network refuses at once where nobody listens; like tcp, a refusal is retried
// until the deadline unless the peer is known to have listened.
asio::awaitable<std::shared_ptr<Stream>> dial_memory(asio::any_io_executor ex, PeerInfo peer,
                                                     std::chrono::steady_clock::time_point until,
                                                     bool listening,
                                                     std::shared_ptr<Traffic> traffic) {
  for (;;) {
    if (auto s = memory::Listener::connect(memory_number(peer), ex, traffic))
      co_return std::make_shared<Stream>(std::move(*s));
    if (listening)
      throw std::system_error(make_error_code(errc::peer_lost),
                              address_text(peer) + " refused the connection: the rank has gone");
    if (std::chrono::steady_clock::now() >= until)
      throw std::system_error(make_error_code(errc::timed_out),
                              "cannot connect to " + address_text(peer) +
                                  " within COCCL_TIMEOUT (nobody listens there)");
    asio::steady_timer t(ex, std::chrono::milliseconds(20));
    co_await t.async_wait(asio::use_awaitable);
  }
}

}  // namespace

asio::awaitable<std::shared_ptr<Stream>> dial_local(asio::any_io_executor ex, std::string name,
                                                    bool memory, std::shared_ptr<Traffic> traffic) {
  if (memory) {
    auto s = memory::Listener::connect(memory_name(name) | memory::Listener::named, ex,
                                       std::move(traffic));
    co_return s ? std::make_shared<Stream>(std::move(*s)) : nullptr;
  }
  local::socket socket(ex);
  boost::system::error_code ec;
  co_await socket.async_connect(abstract_endpoint(name),
                                asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return nullptr;
  co_return std::make_shared<Stream>(std::make_unique<UnixStream>(std::move(socket)));
}

asio::awaitable<std::shared_ptr<Stream>> dial(asio::any_io_executor ex, PeerInfo peer,
                                              std::chrono::steady_clock::time_point until,
                                              bool listening, std::shared_ptr<Traffic> traffic) {
  if (is_memory(peer))
    co_return co_await dial_memory(ex, peer, until, listening, std::move(traffic));
  // The root may not listen yet (launchers start ranks in any order): retry refusals. A rank in
  // the address table listened before it said hello, so its refusal means it has gone.
  const tcp::endpoint ep = peer.endpoint();
  for (;;) {
    auto sock = std::make_shared<tcp::socket>(ex);
    boost::system::error_code ec;
    {
      runtime::CloseAfter guard(*sock, until - std::chrono::steady_clock::now());
      co_await sock->async_connect(ep, asio::redirect_error(asio::use_awaitable, ec));
      if (guard.fired()) ec = asio::error::timed_out;
    }
    if (!ec) co_return std::make_shared<Stream>(std::move(*sock));
    if (out_of_resources(ec))
      throw std::system_error(std::error_code(ec.value(), std::system_category()),
                              "cannot connect to " + address_text(peer) +
                                  ": this process is out of file descriptors or socket memory "
                                  "(raise ulimit -n)");
    if (listening && ec == asio::error::connection_refused)
      throw std::system_error(make_error_code(errc::peer_lost),
                              address_text(peer) + " refused the connection: the process has gone");
    if (std::chrono::steady_clock::now() >= until || ec == asio::error::timed_out)
      throw std::system_error(make_error_code(errc::timed_out),
                              "cannot connect to " + address_text(peer) +
                                  " within COCCL_TIMEOUT (" + ec.message() + ")");
    asio::steady_timer t(ex, std::chrono::milliseconds(20));
    co_await t.async_wait(asio::use_awaitable);
  }
}

}  // namespace coccl::transport
