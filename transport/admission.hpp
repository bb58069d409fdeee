// What strangers may cost a listener (the bootstrap root and each rank's peer listener).
//
// Anyone who can reach the port can connect. Until a connection has authenticated it is held in
// an Admission: at most COCCL_BOOTSTRAP_PENDING_MAX at once, each for at most
// COCCL_BOOTSTRAP_AUTH_TIMEOUT. When that many wait, the listener accepts the next connection
// only once one of them authenticates or one's grace is over (then that one is closed): a
// connection that has not opened its handshake has COCCL_BOOTSTRAP_SILENT_GRACE (an honest peer
// opens it as it connects), one the listener has answered COCCL_BOOTSTRAP_PENDING_GRACE (an honest
// peer authenticates a round trip later). A burst of honest peers (thousands of ranks saying
// hello to the root at once) waits in the kernel's backlog and all get in; silent strangers give
// way after the short grace, so a flood of them is accepted (and closed) quickly; a stranger that
// opens the handshake and stalls holds its place for the longer one. DropLog keeps the warnings
// about dropped connections from flooding the log, and accept_retry_delay lets an accept loop ride
// out errors such as running out of descriptors instead of ending.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>

#include "runtime/config.hpp"
#include "transport/stream.hpp"

namespace coccl::transport {

namespace asio = boost::asio;

/// How long a new connection has to authenticate: COCCL_BOOTSTRAP_AUTH_TIMEOUT, at most
/// COCCL_TIMEOUT.
std::chrono::steady_clock::duration auth_timeout();

/// The unauthenticated connections of one listener, oldest first. Single-threaded (the
/// listener's proxy thread).
class Admission {
 public:
  /// Holds `max` connections at most (COCCL_BOOTSTRAP_PENDING_MAX when 0). A waiting connection
  /// is safe from eviction for `silent` from its admission until answered() (a negative value:
  /// COCCL_BOOTSTRAP_SILENT_GRACE), then for `grace` (COCCL_BOOTSTRAP_PENDING_GRACE).
  explicit Admission(std::size_t max = 0,
                     std::chrono::steady_clock::duration grace = std::chrono::seconds(-1),
                     std::chrono::steady_clock::duration silent = std::chrono::seconds(-1));
  ~Admission();
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  /// A connection's place in the queue; leaving it (authenticated or dropped) is destruction or
  /// release().
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&&) noexcept = default;
    Ticket& operator=(Ticket&&) noexcept;
    ~Ticket() { release(); }
    void release() noexcept;
    /// The listener has answered the connection's opening of the handshake: its longer grace
    /// starts.
    void answered() noexcept;

   private:
    friend class Admission;
    struct Entry;
    std::shared_ptr<Entry> entry_;
  };

  /// Admits a freshly accepted stream. When `max` are already waiting the oldest is closed
  /// first (its reader fails and drops it); an accept loop that asks when_room() first never
  /// makes that happen to a connection within its grace.
  Ticket admit(const std::shared_ptr<Stream>& socket);
  /// Calls `ready` (through `ex`, never from within this call) once the next connection may be
  /// accepted: at once while fewer than `max` wait; else when one of them leaves, or when one's
  /// grace is over, which closes it. One request at a time (a second replaces the
  /// first); none is called once this Admission is destroyed.
  void when_room(asio::any_io_executor ex, std::function<void()> ready);
  /// Closes the oldest waiting connection, freeing its descriptor; false when none waits.
  bool evict_oldest();
  /// Connections waiting now.
  std::size_t waiting() const noexcept;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

/// Rate-limited warnings about dropped connections: the first few of each interval are written
/// whole, the rest only counted and summarised in one line when the next interval starts.
class DropLog {
 public:
  /// `who` starts every line ("bootstrap root", "listener").
  DropLog(int rank, std::string who) : rank_(rank), who_(std::move(who)) {}
  void dropped(const std::string& why);

 private:
  int rank_;
  std::string who_;
  std::chrono::steady_clock::time_point window_start_{};
  int written_ = 0;
  std::uint64_t suppressed_ = 0;
};

/// After an accept error: how long to wait before accepting again, or nullopt-like zero when the
/// acceptor was closed and the loop should end. Out of descriptors (EMFILE, ENFILE) or memory
/// waits longer, giving running operations time to release some.
std::chrono::milliseconds accept_retry_delay(const boost::system::error_code& ec);

/// True for the errors of a process (or system) that ran out of descriptors or socket memory.
bool out_of_resources(const boost::system::error_code& ec);

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<std::int64_t> bootstrap_pending_max;  // COCCL_BOOTSTRAP_PENDING_MAX
extern config::Param<double> bootstrap_auth_timeout;       // COCCL_BOOTSTRAP_AUTH_TIMEOUT
extern config::Param<double> bootstrap_pending_grace;      // COCCL_BOOTSTRAP_PENDING_GRACE
extern config::Param<double> bootstrap_silent_grace;       // COCCL_BOOTSTRAP_SILENT_GRACE

}  // namespace coccl::params
