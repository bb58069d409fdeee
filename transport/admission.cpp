#include "transport/admission.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <optional>

#include "runtime/deadline.hpp"
#include "runtime/log.hpp"

namespace coccl::params {

config::Param<std::int64_t> bootstrap_pending_max{
    "COCCL_BOOTSTRAP_PENDING_MAX", 64,
    "connections a bootstrap root or rank listener holds before they authenticate; beyond it the "
    "listener accepts more only as they authenticate, or closes one whose grace is over "
    "(COCCL_BOOTSTRAP_SILENT_GRACE, COCCL_BOOTSTRAP_PENDING_GRACE), so strangers cost bounded "
    "memory and descriptors"};
config::Param<double> bootstrap_pending_grace{
    "COCCL_BOOTSTRAP_PENDING_GRACE", 1.0,
    "seconds a connection whose handshake the listener has answered, but which has not "
    "authenticated yet, is safe from being closed to make room for a newer one "
    "(COCCL_BOOTSTRAP_PENDING_MAX); an honest peer authenticates one round trip after the answer"};
config::Param<double> bootstrap_silent_grace{
    "COCCL_BOOTSTRAP_SILENT_GRACE", 0.05,
    "seconds a new connection that has not opened its handshake is safe from being closed to make "
    "room for a newer one; an honest peer opens it as it connects (and a rank closed this early "
    "dials the bootstrap root again)"};
config::Param<double> bootstrap_auth_timeout{
    "COCCL_BOOTSTRAP_AUTH_TIMEOUT", 10.0,
    "seconds a new connection to a bootstrap root or rank listener has to authenticate before it "
    "is closed (at most COCCL_TIMEOUT)"};

}  // namespace coccl::params

namespace coccl::transport {

namespace {
// Warnings about dropped connections: this many in full per interval, then one summary line.
constexpr int drop_warnings_per_interval = 5;
constexpr std::chrono::seconds drop_warning_interval{10};
}  // namespace

std::chrono::steady_clock::duration auth_timeout() {
  auto limit = runtime::seconds_to_duration(std::max(0.001, params::bootstrap_auth_timeout.get()));
  return std::min(limit, runtime::default_timeout());
}

struct Admission::State {
  std::size_t max;
  std::chrono::steady_clock::duration grace;   // for a connection this listener answered
  std::chrono::steady_clock::duration silent;  // for one that has not opened its handshake
  std::list<std::shared_ptr<Ticket::Entry>> waiting;
  // A pending when_room(): its callback and the timer that ends the first grace to run out.
  std::function<void()> ready;
  std::optional<asio::steady_timer> timer;
  asio::any_io_executor ex;

  // Hands the pending request its room (posted: the caller may be inside admit or a release).
  void give_room() {
    if (!ready) return;
    if (timer) timer->cancel();
    asio::post(ex, std::exchange(ready, nullptr));
  }
  // When `e`'s grace ends.
  std::chrono::steady_clock::time_point due(const Ticket::Entry& e) const;
  // The waiting connection whose grace ends first (waiting must not be empty).
  std::list<std::shared_ptr<Ticket::Entry>>::iterator first_due();
  void arm(const std::shared_ptr<State>& self);
};

struct Admission::Ticket::Entry {
  std::weak_ptr<State> state;
  std::weak_ptr<Stream> socket;
  std::list<std::shared_ptr<Entry>>::iterator where;
  std::chrono::steady_clock::time_point admitted;
  std::chrono::steady_clock::time_point answered;  // max(): not yet
  bool listed = false;
};

std::chrono::steady_clock::time_point Admission::State::due(const Ticket::Entry& e) const {
  if (e.answered == std::chrono::steady_clock::time_point::max()) return e.admitted + silent;
  return e.answered + grace;
}

std::list<std::shared_ptr<Admission::Ticket::Entry>>::iterator Admission::State::first_due() {
  auto first = waiting.begin();
  for (auto it = waiting.begin(); it != waiting.end(); ++it)
    if (due(**it) < due(**first)) first = it;
  return first;
}

void Admission::State::arm(const std::shared_ptr<State>& self) {
  if (!timer) timer.emplace(ex);
  timer->expires_at(due(**first_due()));
  timer->async_wait([weak = std::weak_ptr<State>(self)](boost::system::error_code ec) {
    auto state = weak.lock();
    if (ec || !state || !state->ready) return;
    if (state->waiting.size() < state->max) {
      state->give_room();
      return;
    }
    auto it = state->first_due();
    if (std::chrono::steady_clock::now() < state->due(**it)) {
      state->arm(state);
      return;
    }
    // Its grace is over: it gives way to the next connection.
    auto gone = *it;
    state->waiting.erase(it);
    gone->listed = false;
    if (auto s = gone->socket.lock()) {
      boost::system::error_code ignored;
      s->close(ignored);
    }
    state->give_room();
  });
}

void Admission::Ticket::answered() noexcept {
  if (!entry_ || !entry_->listed) return;
  entry_->answered = std::chrono::steady_clock::now();
  // A pending request's timer may be set for this connection's silent grace.
  if (auto state = entry_->state.lock(); state && state->ready) state->arm(state);
}

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  release();
  entry_ = std::move(other.entry_);
  return *this;
}

void Admission::Ticket::release() noexcept {
  if (!entry_) return;
  if (entry_->listed)
    if (auto state = entry_->state.lock()) {
      state->waiting.erase(entry_->where);
      if (state->waiting.size() < state->max) state->give_room();
    }
  entry_->listed = false;
  entry_.reset();
}

Admission::Admission(std::size_t max, std::chrono::steady_clock::duration grace,
                     std::chrono::steady_clock::duration silent)
    : state_(std::make_shared<State>()) {
  state_->max = max ? max
                    : static_cast<std::size_t>(
                          std::max<std::int64_t>(1, params::bootstrap_pending_max.get()));
  state_->grace = grace >= std::chrono::steady_clock::duration::zero()
                      ? grace
                      : runtime::seconds_to_duration(
                            std::clamp(params::bootstrap_pending_grace.get(), 0.0, 1e6));
  state_->silent = silent >= std::chrono::steady_clock::duration::zero()
                       ? silent
                       : runtime::seconds_to_duration(
                             std::clamp(params::bootstrap_silent_grace.get(), 0.0, 1e6));
}

Admission::~Admission() {
  // A pending request is dropped unrun: the listener that asked is going too.
  state_->ready = nullptr;
  if (state_->timer) state_->timer->cancel();
}

void Admission::when_room(asio::any_io_executor ex, std::function<void()> ready) {
  state_->ex = std::move(ex);
  state_->ready = std::move(ready);
  if (state_->waiting.size() < state_->max) {
    state_->give_room();
    return;
  }
  state_->arm(state_);
}

Admission::Ticket Admission::admit(const std::shared_ptr<Stream>& socket) {
  while (state_->waiting.size() >= state_->max) evict_oldest();
  auto entry = std::make_shared<Ticket::Entry>();
  entry->state = state_;
  entry->socket = socket;
  entry->admitted = std::chrono::steady_clock::now();
  entry->answered = std::chrono::steady_clock::time_point::max();
  entry->where = state_->waiting.insert(state_->waiting.end(), entry);
  entry->listed = true;
  Ticket t;
  t.entry_ = std::move(entry);
  return t;
}

bool Admission::evict_oldest() {
  if (state_->waiting.empty()) return false;
  auto entry = state_->waiting.front();
  state_->waiting.pop_front();
  entry->listed = false;
  if (auto s = entry->socket.lock()) {
    boost::system::error_code ignored;
    s->close(ignored);
  }
  state_->give_room();
  return true;
}

std::size_t Admission::waiting() const noexcept { return state_->waiting.size(); }

void DropLog::dropped(const std::string& why) {
  auto now = std::chrono::steady_clock::now();
  if (now - window_start_ >= drop_warning_interval) {
    if (suppressed_ > 0)
      COCCL_WARN(
          boot, rank_, "%s: %llu more connections dropped in the last %lld s", who_.c_str(),
          static_cast<unsigned long long>(suppressed_),
          static_cast<long long>(
              std::chrono::duration_cast<std::chrono::seconds>(now - window_start_).count()));
    window_start_ = now;
    written_ = 0;
    suppressed_ = 0;
  }
  if (written_ < drop_warnings_per_interval) {
    ++written_;
    COCCL_WARN(boot, rank_, "%s: dropped a connection: %s%s", who_.c_str(), why.c_str(),
               written_ == drop_warnings_per_interval ? " (further drops are summarised)" : "");
    return;
  }
  ++suppressed_;
}

bool out_of_resources(const boost::system::error_code& ec) {
  if (ec.category() != boost::system::system_category()) return false;
  int v = ec.value();
  return v == EMFILE || v == ENFILE || v == ENOBUFS || v == ENOMEM;
}

std::chrono::milliseconds accept_retry_delay(const boost::system::error_code& ec) {
  if (ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor)
    return std::chrono::milliseconds(0);
  if (out_of_resources(ec)) return std::chrono::milliseconds(100);
  // Transient per-connection errors (ECONNABORTED, EPROTO...): a short pause keeps a persistent
  // one from spinning the proxy thread.
  return std::chrono::milliseconds(5);
}

}  // namespace coccl::transport
