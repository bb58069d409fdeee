// How a rank listens and dials. The address family of a PeerInfo chooses the network: 4 and 6
// are tcp; family_memory is the in-memory network of this process (transport/memory.hpp), on
// which many ranks of one process form communicators without sockets (coccl-sim, tests).
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "transport/bootstrap_messages.hpp"
#include "transport/stream.hpp"
#include "transport/traffic.hpp"

namespace coccl::transport {

namespace memory {
class Listener;
}

/// PeerInfo::family of an address on the in-memory network (its listener's number in addr).
inline constexpr std::uint8_t family_memory = 'm';

/// True for an address on the in-memory network.
inline bool is_memory(const PeerInfo& p) noexcept { return p.family == family_memory; }
/// The address of in-memory listener `number` (this host, this process).
PeerInfo memory_address(std::uint64_t number);
/// The number of an in-memory address's listener.
std::uint64_t memory_number(const PeerInfo& p) noexcept;
/// "address:port", or "memory:N", for messages.
std::string address_text(const PeerInfo& p);

/// A listener on either network.
class Acceptor {
 public:
  using executor_type = asio::any_io_executor;
  using AcceptHandler = asio::any_completion_handler<void(boost::system::error_code, Stream)>;

  explicit Acceptor(asio::any_io_executor ex);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  /// Listens on `endpoint` (port 0 picks one), with SO_REUSEADDR when `reuse_address`.
  void listen(const asio::ip::tcp::endpoint& endpoint, bool reuse_address,
              boost::system::error_code& ec);
  /// Listens on the in-memory network under a new number; the streams it accepts are counted in
  /// `traffic` (may be null).
  void listen_memory(std::shared_ptr<Traffic> traffic = nullptr);
  /// Listens at `name` for processes of this host only, so that ranks of one host can meet
  /// without the network: an abstract unix socket (it goes with the process and leaves no file
  /// behind), or with `memory` a name on the in-memory network, whose accepted streams are counted
  /// in `traffic`. False, listening nowhere, when another listens there already.
  bool listen_local(const std::string& name, bool memory, std::shared_ptr<Traffic> traffic);

  /// Where it listens, as the address table holds it. Throws boost::system::system_error.
  PeerInfo local_info() const;

  /// Accepts the next connection; completion signature void(error_code, Stream). Closing the
  /// acceptor completes it with operation_aborted.
  template <typename Token>
  auto async_accept(Token&& token) {
    return asio::async_initiate<Token, void(boost::system::error_code, Stream)>(
        [this](auto handler) { start_accept(AcceptHandler(std::move(handler))); }, token);
  }

  void close(boost::system::error_code& ec);
  bool is_open() const;
  executor_type get_executor() { return ex_; }

 private:
  void start_accept(AcceptHandler handler);

  asio::any_io_executor ex_;
  asio::ip::tcp::acceptor tcp_;
  std::optional<asio::local::stream_protocol::acceptor> local_;
  std::shared_ptr<memory::Listener> memory_;
};

/// Connects to `peer`, retrying refusals (the listener may not be up yet) until `until`. Throws
/// std::system_error: errc::timed_out naming the address when the deadline passes, or a system
/// error (EMFILE...) when this process is out of descriptors or socket memory. `listening`: the
/// peer is known to have listened (a rank of the address table), so a refusal is errc::peer_lost
/// at once. A stream on the in-memory network is counted in `traffic` (may be null; tcp streams
/// are never counted).
asio::awaitable<std::shared_ptr<Stream>> dial(asio::any_io_executor ex, PeerInfo peer,
                                              std::chrono::steady_clock::time_point until,
                                              bool listening = false,
                                              std::shared_ptr<Traffic> traffic = nullptr);

/// Dials the local listener `name` (Acceptor::listen_local, same `memory`); the stream is counted
/// in `traffic` on the in-memory network. Null when nobody listens there.
asio::awaitable<std::shared_ptr<Stream>> dial_local(asio::any_io_executor ex, std::string name,
                                                    bool memory, std::shared_ptr<Traffic> traffic);

}  // namespace coccl::transport
