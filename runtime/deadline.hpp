// Deadlines: every wait in the library has one. A wait either completes, or its deadline turns it
// into errc::timed_out (never a hang).
#pragma once

#include <algorithm>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/append.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <ctime>
#include <deque>
#include <memory>
#include <optional>

#include "runtime/config.hpp"

namespace coccl::runtime {

namespace asio = boost::asio;

/// `s` seconds as a duration, within [0, 10^9 s]: NaN and negative values are 0, and larger
/// values (up to infinity) are 10^9 s, some 31 years, beyond which the count would overflow.
std::chrono::steady_clock::duration seconds_to_duration(double s) noexcept;

/// steady_clock's time as of the kernel's last tick (CLOCK_MONOTONIC_COARSE: the clock that
/// steady_clock reads on Linux, a few milliseconds behind at most), for bookkeeping that counts in
/// seconds (a link's last use) on paths where a precise read (about 20 ns) is a sizeable part of
/// the work.
inline std::chrono::steady_clock::time_point coarse_now() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
}

/// COCCL_TIMEOUT as a duration.
std::chrono::steady_clock::duration default_timeout();

/// The time left until `until`, at least 1 ms: a limit for a CloseAfter that still lets an
/// operation already late start (and fail on its own terms) rather than close at once.
inline std::chrono::steady_clock::duration time_left(std::chrono::steady_clock::time_point until) {
  return std::max<std::chrono::steady_clock::duration>(until - std::chrono::steady_clock::now(),
                                                       std::chrono::milliseconds(1));
}

/// Closes an I/O object (socket, acceptor) if it is still open when `limit` passes, so a silent or
/// half-open peer fails the pending operation instead of holding it forever.
/// Call and destroy it on the I/O object's executor (single-threaded): the object may be freed as
/// soon as the CloseAfter is gone, even if the timer already fired and its handler is queued.
template <typename IoObject>
class CloseAfter {
 public:
  CloseAfter(IoObject& io, std::chrono::steady_clock::duration limit)
      : timer_(io.get_executor(), limit), state_(std::make_shared<State>(State{&io, false})) {
    timer_.async_wait([state = state_](boost::system::error_code ec) {
      // A handler already queued when the guard went away must not touch the object.
      if (ec || state->io == nullptr) return;
      state->fired = true;
      boost::system::error_code ignored;
      state->io->close(ignored);
    });
  }
  ~CloseAfter() {
    state_->io = nullptr;
    timer_.cancel();
  }
  CloseAfter(const CloseAfter&) = delete;
  CloseAfter& operator=(const CloseAfter&) = delete;
  /// True if the deadline passed and the object was closed.
  bool fired() const noexcept { return state_->fired; }

 private:
  struct State {
    IoObject* io;
    bool fired;
  };
  asio::steady_timer timer_;
  std::shared_ptr<State> state_;
};

/// A single-threaded queue of values with one waiter at a time and a deadline per wait. Values
/// pushed before anyone waits are kept in order.
template <typename T>
class Mailbox {
 public:
  explicit Mailbox(asio::any_io_executor ex) : ex_(std::move(ex)) {}

  void push(T v) {
    items_.push_back(std::move(v));
    wake({});
  }
  /// Values pushed and not yet taken.
  std::size_t size() const noexcept { return items_.size(); }
  /// Fails the current and every later wait with `ec`.
  void fail(boost::system::error_code ec) {
    failure_ = ec;
    wake(ec);
  }

  /// Waits for a value; throws boost::system::system_error(timed_out) when `limit` passes, or the
  /// failure given to fail().
  asio::awaitable<T> pop(std::chrono::steady_clock::duration limit) {
    if (items_.empty() && !failure_) {
      asio::steady_timer timer(ex_, limit);
      timer.async_wait([this](boost::system::error_code ec) {
        if (!ec) wake(asio::error::timed_out);
      });
      co_await asio::async_initiate<decltype(asio::use_awaitable), void(boost::system::error_code)>(
          [this](auto h) { waiter_.emplace(std::move(h)); }, asio::use_awaitable);
    }
    if (items_.empty())
      throw boost::system::system_error(failure_ ? *failure_ : asio::error::timed_out);
    T v = std::move(items_.front());
    items_.pop_front();
    co_return v;
  }

 private:
  void wake(boost::system::error_code ec) {
    if (!waiter_) return;
    // Through append: a lambda holding an any_completion_handler looks copyable to Asio.
    asio::post(ex_, asio::append(std::move(*waiter_), ec));
    waiter_.reset();
  }

  asio::any_io_executor ex_;
  std::deque<T> items_;
  std::optional<boost::system::error_code> failure_;
  // Never assigned: Boost 1.81's any_completion_handler move assignment recurses without end.
  std::optional<asio::any_completion_handler<void(boost::system::error_code)>> waiter_;
};

}  // namespace coccl::runtime

namespace coccl::params {

extern config::Param<double> timeout_s;  // COCCL_TIMEOUT

}  // namespace coccl::params
