#include "transport/socket_connection.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <coccl/error.hpp>
#include <cstring>

#include "runtime/log.hpp"

namespace coccl::transport {

std::size_t abort_text_size(const LinkHeader& h) {
  if (h.length > max_abort_text)
    throw std::system_error(make_error_code(errc::bad_message),
                            "abort notice of " + std::to_string(h.length) + " bytes");
  return static_cast<std::size_t>(h.length);
}

errc abort_code(std::uint32_t code) noexcept {
  if (code < 1 || code > static_cast<std::uint32_t>(errc::cuda_error)) return errc::remote_error;
  return static_cast<errc>(code);
}

SocketConnection::SocketConnection(int self, int peer, Stream socket, FailureHandler on_failure)
    : Connection(self, peer, std::move(on_failure)),
      socket_(std::move(socket)),
      linger_(socket_.get_executor()) {
  boost::system::error_code ignored;
  if (auto* tcp = socket_.tcp()) tcp->set_option(asio::ip::tcp::no_delay(true), ignored);
}

SocketConnection::~SocketConnection() {
  // The reader coroutine may still be parked in the executor; it checks its pass before touching
  // this object.
  gate_.close();
  boost::system::error_code ignored;
  socket_.close(ignored);
}

void SocketConnection::start() {
  asio::co_spawn(socket_.get_executor(), read_loop(gate_.enter()), asio::detached);
}

asio::awaitable<void> SocketConnection::read_loop(runtime::Gate::Pass pass) {
  for (;;) {
    LinkHeader h{};
    boost::system::error_code ec;
    try {
      // The end of a link comes as an error here (eof, or aborted by close()): taken as a code,
      // not thrown, since every link of a destroyed communicator ends this way (coccl-sim closes
      // millions, and the throw cost more than the close).
      ec = co_await read_body(pass, &h, sizeof h);
      if (!pass.open()) co_return;
      if (!ec) switch (h.type) {
          case LinkHeader::put:
            co_await on_put(h, pass);
            break;
          case LinkHeader::credit:
            on_credit(h.length);
            break;
          case LinkHeader::bye:
            departed_ = true;
            // Waiters re-check: data already here is still delivered; anything more fails.
            fail_waiters_soft();
            break;
          case LinkHeader::abort: {
            std::string text(abort_text_size(h), '\0');
            ec = co_await read_body(pass, text.data(), text.size());
            if (!pass.open()) co_return;
            if (ec) break;
            close(make_error_code(abort_code(h.fingerprint)),
                  "rank " + std::to_string(peer_) + " aborted: " + text);
            co_return;
          }
          default:
            throw std::system_error(make_error_code(errc::bad_message));
        }
    } catch (const boost::system::system_error& e) {
      ec = e.code();
    } catch (const std::system_error& e) {
      if (!pass.open()) co_return;
      close(e.code(), "rank " + std::to_string(peer_) + ": protocol error: " + e.what());
      co_return;
    }
    if (!pass.open()) co_return;
    if (ec) {
      if (departed_) {
        fail_waiters_soft();
        co_return;
      }
      if (!closed_)
        close(make_error_code(errc::peer_lost),
              "lost rank " + std::to_string(peer_) + " (connection " + ec.message() + ")");
      co_return;
    }
  }
}

asio::awaitable<boost::system::error_code> SocketConnection::read_body(
    const runtime::Gate::Pass& pass, void* dst, std::size_t n, std::size_t spare) {
  auto* out = static_cast<std::byte*>(dst);
  boost::system::error_code ec;
  for (;;) {
    const std::size_t take = std::min(n, read_end_ - read_at_);
    std::memcpy(out, read_buf_.data() + read_at_, take);
    read_at_ += take;
    out += take;
    n -= take;
    if (n == 0) co_return ec;
    // The buffer is empty here. A large rest (a put's payload) is read straight into place, so
    // that a chunk is copied once, together with what follows it where dst has room to spare
    // (the rest of its slot): those bytes go to the buffer, and the next frames need no read of
    // their own.
    read_at_ = read_end_ = 0;
    if (n >= read_buf_.size()) {
      const std::size_t extra = std::min(spare, read_buf_.size());
      const std::size_t got = co_await asio::async_read(
          socket_, asio::buffer(out, n + extra), asio::transfer_at_least(n),
          asio::redirect_error(asio::use_awaitable, ec));
      if (!pass.open() || ec) co_return ec;
      std::memcpy(read_buf_.data(), out + n, got - n);
      read_end_ = got - n;
      co_return ec;
    }
    const std::size_t got = co_await socket_.async_read_some(
        asio::buffer(read_buf_), asio::redirect_error(asio::use_awaitable, ec));
    if (!pass.open() || ec) co_return ec;
    read_end_ = got;
  }
}

void SocketConnection::enqueue(LinkHeader h, const void* data, std::size_t n, Resume done) {
  queue_.push_back(Pending{h, data, n, std::move(done), nullptr});
  schedule_write();
}

std::string credit_refusal(std::uint64_t n, std::uint64_t in_use) {
  if (n <= in_use) return {};
  return "a credit for " + std::to_string(n) + " slots, with " + std::to_string(in_use) + " in use";
}

std::unique_ptr<std::byte[]> copy_payload(const void* src, std::size_t n) {
  if (n == 0) return nullptr;
  std::unique_ptr<std::byte[]> copy(new std::byte[n]);
  std::memcpy(copy.get(), src, n);
  return copy;
}

void SocketConnection::enqueue_copy(LinkHeader h, const void* data, std::size_t n) {
  auto copy = copy_payload(data, n);
  const void* at = copy.get();
  queue_.push_back(Pending{h, at, n, Resume(), std::move(copy)});
  schedule_write();
}

void SocketConnection::enqueue_credit(std::uint64_t n) {
  // Frames behind the batch in flight have not been handed to the stream yet.
  if (queue_.size() > head_ + (writing_ ? batch_ : 0) &&
      queue_.back().header.type == LinkHeader::credit) {
    queue_.back().header.length += n;
    return;
  }
  enqueue(LinkHeader{LinkHeader::credit, 0, n}, nullptr, 0, {});
}

void SocketConnection::schedule_write() {
  if (writing_ || write_due_ || closed_) return;
  // Posted, not started here: the frames an operation queues in one go (its header and its first
  // data, the credits of the chunks it took) then leave in one write and arrive in one read.
  write_due_ = true;
  asio::post(socket_.get_executor(), [this, pass = gate_.enter()] {
    if (!pass.open()) return;
    write_due_ = false;
    if (!writing_ && !closed_) write_next();
  });
}

void SocketConnection::write_next() {
  // After close(), only the frames it kept to go before its notice are written.
  if (head_ == queue_.size() || (closed_ && notice_.empty())) {
    writing_ = false;
    return;
  }
  writing_ = true;
  // Up to 32 frames in one write: 64 buffers, the most a socket write gathers.
  batch_ = std::min<std::size_t>(queue_.size() - head_, 32);
  in_flight_.resize(batch_);
  gather_.clear();
  for (std::size_t k = 0; k < batch_; ++k) {
    const Pending& p = queue_[head_ + k];
    in_flight_[k] = p.header;
    gather_.push_back(asio::buffer(&in_flight_[k], sizeof(LinkHeader)));
    if (p.size > 0) gather_.push_back(asio::buffer(p.data, p.size));
  }
  asio::async_write(socket_, gather_,
                    [this, pass = gate_.enter()](boost::system::error_code ec, std::size_t) {
                      if (pass.open()) written(ec);
                    });
}

void SocketConnection::written(boost::system::error_code ec) {
  writing_ = false;
  // Posted, not run here (resume_now), so the queue may change below before they run.
  for (std::size_t k = 0; k < batch_; ++k) resume_now(queue_[head_ + k].done, ec);
  head_ += batch_;
  batch_ = 0;
  if (head_ == queue_.size()) {
    clear_queue();
  } else if (head_ >= 32 && 2 * head_ >= queue_.size()) {
    // A queue that never drains (a long pipelined operation) drops what it has written rather
    // than grow. The frames left are moved into a new vector, not erased in place: erase
    // move-assigns them, and Boost 1.81's any_completion_handler move assignment wraps the source
    // in itself and recursed without end here (a crash of every long operation whose queue held
    // 32 frames written and more to go).
    std::vector<Pending> rest;
    rest.reserve(queue_.size() - head_);
    for (std::size_t i = head_; i < queue_.size(); ++i) rest.push_back(std::move(queue_[i]));
    queue_.swap(rest);
    head_ = 0;
  }
  if (closed_) {
    // close() waited for these frames (and any it kept) so that its notice lands whole after
    // them.
    if (ec || head_ == queue_.size()) {
      clear_queue();
      finish_close();
    } else {
      write_next();
    }
    return;
  }
  if (ec) {
    queue_broken(ec);
    return;
  }
  write_next();
}

void SocketConnection::queue_broken(boost::system::error_code ec) {
  // A peer that said goodbye may be gone before our last credits reach it; that is not a
  // failure.
  if (departed_) {
    clear_queue();
    fail_waiters_soft();
    return;
  }
  // The peer reset the link. Its abort notice, if it sent one, is still in our receive buffer:
  // give the reader a moment to deliver it (it names the real cause), then fail anyway.
  linger_.expires_after(std::chrono::milliseconds(200));
  linger_.async_wait(
      [this, pass = gate_.enter(), text = ec.message()](boost::system::error_code e) {
        if (e || !pass.open() || closed_) return;
        close(make_error_code(errc::peer_lost),
              "lost rank " + std::to_string(peer_) + " (send " + text + ")");
      });
}

void SocketConnection::finish_close() {
  boost::system::error_code ignored;
  if (!notice_.empty()) {
    socket_.write_some_now(asio::buffer(notice_), ignored);
    notice_.clear();
  }
  linger_.cancel();
  if (auto* tcp = socket_.tcp()) tcp->shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

void SocketConnection::send_abort(std::error_code ec, const std::string& why) {
  if (closed_) return;
  std::string text = why.substr(0, max_abort_text);
  // The peer fails with the same coccl error (a lost rank stays "peer lost" everywhere).
  auto code = ec.category() == error_category() ? static_cast<std::uint32_t>(ec.value())
                                                : static_cast<std::uint32_t>(errc::remote_error);
  LinkHeader h{LinkHeader::abort, code, text.size()};
  notice_.assign(reinterpret_cast<const char*>(&h), sizeof h);
  notice_ += text;
  notice_bye_ = false;
  // The notice must not land inside another frame: while one is being written it waits for
  // close() to finish that frame. Writes are non-blocking so that a stopped peer with a full
  // socket buffer cannot hang an abort.
  if (writing_) return;
  boost::system::error_code ignored;
  socket_.write_some_now(asio::buffer(notice_), ignored);
  notice_.clear();
}

void SocketConnection::resume(Waiter& w, boost::system::error_code ec) {
  if (!w) return;
  resume_now(*w, ec);
  w.reset();
}

void SocketConnection::resume_now(Resume& r, boost::system::error_code ec) {
  if (!r) return;
  // Through append, not a lambda: a lambda holding an any_completion_handler looks copyable to
  // Asio, and copying one wraps it in itself.
  asio::post(socket_.get_executor(), asio::append(std::move(r), ec));
}

void SocketConnection::close(std::error_code ec, const std::string& why) {
  if (closed_) return;
  closed_ = true;
  error_ = ec;
  error_text_ = why;
  COCCL_INFO(net, self_, "connection to rank %d closed: %s", peer_, why.c_str());
  for (std::size_t i = head_; i < queue_.size(); ++i)
    if (queue_[i].done) resume_now(queue_[i].done, asio::error::operation_aborted);
  fail_waiters();
  if (!notice_.empty() && (writing_ || head_ != queue_.size())) {
    // The notice goes after the frames in flight, whole. Before a goodbye, the copied frames
    // queued behind them go too: their puts have completed, so the peer is owed them. A frame
    // that borrows its caller's memory (its put just failed) and all after it are dropped.
    std::size_t keep = writing_ ? batch_ : 0;
    if (notice_bye_)
      while (head_ + keep < queue_.size() &&
             (queue_[head_ + keep].copy || queue_[head_ + keep].size == 0))
        ++keep;
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(head_ + keep), queue_.end());
    if (head_ == queue_.size()) {
      clear_queue();
      finish_close();
    } else {
      if (!writing_) write_next();
      // A peer that never drains its socket cannot hold this past a second.
      linger_.expires_after(std::chrono::seconds(1));
      linger_.async_wait([this, pass = gate_.enter()](boost::system::error_code e) {
        if (!e && pass.open()) finish_close();
      });
    }
  } else {
    clear_queue();
    finish_close();
  }
  report_failure(ec, why);
}

void SocketConnection::throw_failure() const { throw LinkError(error_, error_text_); }

void SocketConnection::fail_departed(const char* needed) {
  if (!closed_)
    close(
        make_error_code(errc::peer_lost),
        "rank " + std::to_string(peer_) + " destroyed its communicator while this rank " + needed);
  throw_failure();
}

void SocketConnection::send_goodbye() {
  if (closed_) return;
  LinkHeader h{LinkHeader::bye, 0, 0};
  if (writing_ || head_ != queue_.size()) {
    // Frames are in flight or queued (a credit, the data of a put that completed): the goodbye
    // follows them whole, as an abort notice would (close() lingers for them). Dropped, the peer
    // would read the end of the stream as a lost rank.
    if (notice_.empty()) {
      notice_.assign(reinterpret_cast<const char*>(&h), sizeof h);
      notice_bye_ = true;
    }
    return;
  }
  boost::system::error_code ignored;
  socket_.write_some_now(asio::buffer(&h, sizeof h), ignored);
}

asio::awaitable<void> SocketConnection::on_put(const LinkHeader&, const runtime::Gate::Pass&) {
  throw std::system_error(make_error_code(errc::bad_message),
                          std::string("data frame on an ") + kind() + " link");
  co_return;
}

asio::awaitable<void> SocketConnection::suspend(Waiter& slot) {
  co_await asio::async_initiate<decltype(asio::use_awaitable), void(boost::system::error_code)>(
      [&slot](auto handler) { slot.emplace(std::move(handler)); }, asio::use_awaitable);
}

asio::awaitable<void> SocketConnection::park_for_credit() {
  while (!closed_ && !departed_ && !can_put()) {
    blocked_since_ = std::chrono::steady_clock::now();
    before_park();
    try {
      co_await suspend(credit_waiter_);
    } catch (const boost::system::system_error&) {
    }
    blocked_since_.reset();
  }
}

asio::awaitable<void> SocketConnection::park_for_data() {
  while (!closed_ && !departed_ && !can_recv()) {
    blocked_since_ = std::chrono::steady_clock::now();
    before_park();
    try {
      co_await suspend(recv_waiter_);
    } catch (const boost::system::system_error&) {
    }
    blocked_since_.reset();
  }
}

void SocketConnection::fail_waiters_soft() {
  resume(recv_waiter_);
  resume(credit_waiter_);
}

void SocketConnection::fail_waiters() {
  resume(recv_waiter_, asio::error::operation_aborted);
  resume(credit_waiter_, asio::error::operation_aborted);
}

}  // namespace coccl::transport
