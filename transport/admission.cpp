#include "transport/admission.hpp"

#include <cerrno>

#include "runtime/deadline.hpp"
#include "runtime/log.hpp"

namespace coccl::params {

config::Param<std::int64_t> bootstrap_pending_max{
    "COCCL_BOOTSTRAP_PENDING_MAX", 64,
    "connections a bootstrap root or rank listener holds before they authenticate; a newer one "
    "closes the oldest, so strangers cost bounded memory and descriptors"};
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
  std::list<std::shared_ptr<Ticket::Entry>> waiting;
};

struct Admission::Ticket::Entry {
  std::weak_ptr<State> state;
  std::weak_ptr<Stream> socket;
  std::list<std::shared_ptr<Entry>>::iterator where;
  bool listed = false;
};

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  release();
  entry_ = std::move(other.entry_);
  return *this;
}

void Admission::Ticket::release() noexcept {
  if (!entry_) return;
  if (entry_->listed)
    if (auto state = entry_->state.lock()) state->waiting.erase(entry_->where);
  entry_->listed = false;
  entry_.reset();
}

Admission::Admission(std::size_t max) : state_(std::make_shared<State>()) {
  state_->max = max ? max
                    : static_cast<std::size_t>(
                          std::max<std::int64_t>(1, params::bootstrap_pending_max.get()));
}

Admission::Ticket Admission::admit(const std::shared_ptr<Stream>& socket) {
  while (state_->waiting.size() >= state_->max) evict_oldest();
  auto entry = std::make_shared<Ticket::Entry>();
  entry->state = state_;
  entry->socket = socket;
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
