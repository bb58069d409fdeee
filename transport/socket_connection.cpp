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

#include "runtime/engine.hpp"
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

SocketConnection::SocketConnection(int self, int peer, Stream socket, FailureHandler on_failure,
                                   bool carries_data)
    : Connection(self, peer, std::move(on_failure)),
      socket_(std::move(socket)),
      read_cap_(carries_data && socket_.tcp() ? data_read_buffer : small_read_buffer),
      read_buf_(new std::byte[read_cap_]) {
  boost::system::error_code ignored;
  if (auto* tcp = socket_.tcp()) {
    tcp->set_option(asio::ip::tcp::no_delay(true), ignored);
    // The reader and the fast path read without waiting (read_now); Asio's own asynchronous
    // operations do not depend on this mode.
    tcp->non_blocking(true, ignored);
  }
}

SocketConnection::~SocketConnection() {
  // The reader coroutine may still be parked in the executor; it checks its pass before touching
  // this object.
  gate_.close();
  if (deferral_listed_) loop_->cancel_deferred(this);
  boost::system::error_code ignored;
  socket_.close(ignored);
}

void SocketConnection::start() {
  asio::co_spawn(socket_.get_executor(), read_loop(gate_.enter()), asio::detached);
}

SocketConnection::Front SocketConnection::parse(bool on_loop, LinkHeader& h) {
  for (;;) {
    const std::size_t avail = read_end_ - read_at_;
    if (avail < sizeof h) return Front::more;
    const std::byte* at = read_buf_.get() + read_at_;
    std::memcpy(&h, at, sizeof h);
    // A frame is taken from the buffer only once it has been delivered: one whose delivery
    // throws (out of order) stays, and the reader meets it again and closes the link.
    switch (h.type) {
      case LinkHeader::credit:
        on_credit(h.length);
        read_at_ += sizeof h;
        break;
      case LinkHeader::bye:
        read_at_ += sizeof h;
        bye_seen_ = true;
        on_goodbye();
        break;
      case LinkHeader::put: {
        const std::uint64_t n = put_bytes(h);
        if (n > read_cap_ - sizeof h) {
          if (!on_loop) return Front::stop;
          read_at_ += sizeof h;
          return Front::large;
        }
        if (avail - sizeof h < n) return Front::more;
        on_put_buffered(h, at + sizeof h);
        read_at_ += sizeof h + n;
        break;
      }
      case LinkHeader::abort: {
        const std::size_t size = abort_text_size(h);
        if (!on_loop) return Front::stop;
        if (size > read_cap_ - sizeof h) {
          read_at_ += sizeof h;
          return Front::large;
        }
        if (avail - sizeof h < size) return Front::more;
        std::string text(reinterpret_cast<const char*>(at + sizeof h), size);
        read_at_ += sizeof h + size;
        close(make_error_code(abort_code(h.fingerprint)),
              "rank " + std::to_string(peer_) + " aborted: " + text);
        return Front::closed;
      }
      default:
        throw std::system_error(make_error_code(errc::bad_message));
    }
  }
}

void SocketConnection::compact() noexcept {
  // The part of a frame still to come keeps its first bytes, moved to the front.
  if (read_at_ == read_end_) {
    read_at_ = read_end_ = 0;
  } else if (read_at_ > 0) {
    std::memmove(read_buf_.get(), read_buf_.get() + read_at_, read_end_ - read_at_);
    read_end_ -= read_at_;
    read_at_ = 0;
  }
}

boost::system::error_code SocketConnection::read_now(asio::ip::tcp::socket& tcp) {
  compact();
  boost::system::error_code ec;
  read_end_ += tcp.read_some(asio::buffer(read_buf_.get() + read_end_, read_cap_ - read_end_), ec);
  return ec;
}

void SocketConnection::wake_reader() {
  if (!read_waiter_) return;
  resume(read_waiter_);
}

asio::awaitable<void> SocketConnection::read_loop(runtime::Gate::Pass pass) {
  for (;;) {
    boost::system::error_code ec;
    // Whatever pump() left is taken in this round.
    reader_owed_ = false;
    try {
      LinkHeader h{};
      switch (parse(true, h)) {
        case Front::closed:
          co_return;
        case Front::more:
          if (auto* tcp = socket_.tcp()) {
            ec = std::exchange(read_error_, {});
            if (!ec) ec = read_now(*tcp);
            if (ec != asio::error::would_block) break;
            ec = {};
            // Nothing to read: wait until the socket is readable (or pump() woke it), with no
            // read in flight. The wait is queued once and outlives a wake by pump(); a read that
            // found nothing comes before it, so no arrival goes unseen (the reactor is
            // edge-triggered).
            if (!read_armed_) {
              read_armed_ = true;
              tcp->async_wait(asio::ip::tcp::socket::wait_read,
                              [this, p = gate_.enter()](boost::system::error_code e) {
                                if (!p.open()) return;
                                read_armed_ = false;
                                if (!read_waiter_) return;
                                // Resumed here, not posted: one hop fewer per arrival. Nothing
                                // of this object is touched after.
                                Resume r(std::move(*read_waiter_));
                                read_waiter_.reset();
                                std::move(r)(e);
                              });
            }
            auto parked = asio::redirect_error(asio::use_awaitable, ec);
            co_await asio::async_initiate<decltype(parked), void(boost::system::error_code)>(
                [this](auto handler) { read_waiter_.emplace(std::move(handler)); }, parked);
            if (!pass.open()) co_return;
          } else {
            // An idle link waits here, in this frame alone: a rank of a large job holds dozens
            // of idle links, and a nested frame for each cost about as much as its ring
            // (coccl-sim).
            compact();
            // Taken into a local first: a link destroyed meanwhile must not be written to.
            const std::size_t got = co_await socket_.async_read_some(
                asio::buffer(read_buf_.get() + read_end_, read_cap_ - read_end_),
                asio::redirect_error(asio::use_awaitable, ec));
            if (!pass.open()) co_return;
            read_end_ += got;
          }
          break;
        case Front::large:
          reader_busy_ = true;
          if (h.type == LinkHeader::put) {
            co_await on_put(h, pass);
            if (!pass.open()) co_return;
          } else {
            std::string text(abort_text_size(h), '\0');
            ec = co_await read_body(pass, text.data(), text.size());
            if (!pass.open()) co_return;
            if (!ec) {
              close(make_error_code(abort_code(h.fingerprint)),
                    "rank " + std::to_string(peer_) + " aborted: " + text);
              co_return;
            }
          }
          reader_busy_ = false;
          break;
        case Front::stop:
          throw std::system_error(make_error_code(errc::internal), "reader stopped");
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
      // After a goodbye the stream's end is expected.
      if (bye_seen_) {
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

void SocketConnection::pump() {
  auto* tcp = socket_.tcp();
  if (!tcp || reader_busy_ || reader_owed_ || closed_ || read_error_) return;
  LinkHeader h{};
  for (int round = 0;; ++round) {
    Front f;
    try {
      f = parse(false, h);
    } catch (const std::system_error&) {
      // The reader meets the same frame and closes the link with the reason.
      reader_owed_ = true;
      wake_reader();
      return;
    }
    if (f != Front::more) {
      reader_owed_ = true;
      wake_reader();
      return;
    }
    if (round == 1) return;
    const auto ec = read_now(*tcp);
    if (ec == asio::error::would_block) return;
    if (ec) {
      read_error_ = ec;
      reader_owed_ = true;
      wake_reader();
      return;
    }
  }
}

asio::awaitable<boost::system::error_code> SocketConnection::read_body(
    const runtime::Gate::Pass& pass, void* dst, std::size_t n, std::size_t spare) {
  auto* out = static_cast<std::byte*>(dst);
  boost::system::error_code ec;
  for (;;) {
    const std::size_t take = std::min(n, read_end_ - read_at_);
    std::memcpy(out, read_buf_.get() + read_at_, take);
    read_at_ += take;
    out += take;
    n -= take;
    if (n == 0) co_return ec;
    // The buffer is empty here. A large rest (a put's payload) is read straight into place, so
    // that a chunk is copied once, together with what follows it where dst has room to spare
    // (the rest of its slot): those bytes go to the buffer, and the next frames need no read of
    // their own.
    read_at_ = read_end_ = 0;
    if (n >= read_cap_) {
      const std::size_t extra = std::min(spare, read_cap_);
      const std::size_t got = co_await asio::async_read(
          socket_, asio::buffer(out, n + extra), asio::transfer_at_least(n),
          asio::redirect_error(asio::use_awaitable, ec));
      if (!pass.open() || ec) co_return ec;
      std::memcpy(read_buf_.get(), out + n, got - n);
      read_end_ = got - n;
      co_return ec;
    }
    const std::size_t got = co_await socket_.async_read_some(
        asio::buffer(read_buf_.get(), read_cap_), asio::redirect_error(asio::use_awaitable, ec));
    if (!pass.open() || ec) co_return ec;
    read_end_ = got;
  }
}

void SocketConnection::enqueue(LinkHeader h, const void* data, std::size_t n, Resume done) {
  if (!held_.empty()) write_held();
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
  if (!held_.empty()) write_held();
  auto copy = copy_payload(data, n);
  const void* at = copy.get();
  queue_.push_back(Pending{h, at, n, Resume(), std::move(copy)});
  schedule_write();
}

void SocketConnection::enqueue_credit(std::uint64_t n) {
  if (!held_.empty()) write_held();
  // Frames behind the batch in flight have not been handed to the stream yet.
  if (queue_.size() > head_ + (writing_ ? batch_ : 0) &&
      queue_.back().header.type == LinkHeader::credit) {
    queue_.back().header.length += n;
    return;
  }
  enqueue(LinkHeader{LinkHeader::credit, 0, n}, nullptr, 0, {});
}

bool SocketConnection::fast_writable() const noexcept {
  return socket_.tcp() && !closed_ && !bye_seen_ && !writing_;
}

void SocketConnection::begin_fast() {
  if (fast_active_) return;
  fast_active_ = true;
  // Frames queued and not yet written (the credits of the last operation, whose write the loop
  // has not started yet) go first, with the fast path's: their puts completed, so they are
  // copied or borrowed from callers that wait for `done`, run now that the bytes are copied.
  if (writing_) return;
  for (std::size_t i = head_; i < queue_.size(); ++i) {
    Pending& p = queue_[i];
    if (p.raw)
      held_.insert(held_.end(), static_cast<const std::byte*>(p.data),
                   static_cast<const std::byte*>(p.data) + p.size);
    else
      hold_frame(p.header, p.data, p.size);
    if (p.done) resume_now(p.done, {});
  }
  held_credit_last_ = false;
  clear_queue();
}

void SocketConnection::hold_frame(LinkHeader h, const void* data, std::size_t n, const void* more,
                                  std::size_t more_n) {
  if (h.type == LinkHeader::put) held_put_ = true;
  held_credit_last_ = false;
  const std::size_t at = held_.size();
  held_.resize(at + sizeof h + n + more_n);
  std::memcpy(held_.data() + at, &h, sizeof h);
  if (n > 0) std::memcpy(held_.data() + at + sizeof h, data, n);
  if (more_n > 0) std::memcpy(held_.data() + at + sizeof h + n, more, more_n);
}

void SocketConnection::hold_credit(std::uint64_t n) {
  // Consecutive credits add up: one frame for the chunks an operation releases.
  if (held_credit_last_) {
    LinkHeader last;
    std::byte* at = held_.data() + held_.size() - sizeof last;
    std::memcpy(&last, at, sizeof last);
    last.length += n;
    std::memcpy(at, &last, sizeof last);
    return;
  }
  hold_frame(LinkHeader{LinkHeader::credit, 0, n}, nullptr, 0);
  held_credit_last_ = true;
}

void SocketConnection::write_held() {
  held_put_ = held_credit_last_ = credit_waits_ = false;
  if (held_.empty()) return;
  std::size_t done = 0;
  if (auto* tcp = socket_.tcp(); tcp && idle_writer() && !closed_) {
    boost::system::error_code ec;
    done = tcp->write_some(asio::buffer(held_), ec);
    // An error (the peer gone) is left to the queued write of the rest, which reports it as any
    // write does.
    if (ec) done = 0;
  }
  if (done < held_.size()) {
    const std::size_t rest = held_.size() - done;
    auto copy = copy_payload(held_.data() + done, rest);
    const void* at = copy.get();
    queue_.push_back(Pending{LinkHeader{}, at, rest, Resume(), std::move(copy), true});
    schedule_write();
  }
  held_.clear();
}

void SocketConnection::end_fast() {
  const bool ended = fast_active_;
  fast_active_ = false;
  // An operation that leaves only credits lets them wait for the link's next frame, where the peer
  // keeps a slot for its next put without them (credit_may_wait): the next operation's frame to
  // the peer carries them, and an operation costs one send a peer, as Open MPI's eager messages
  // do. A peer that needs them (a larger operation takes every slot) waits at most until this
  // rank writes to the link, reads it or parks on it, or the loop finds nothing to do
  // (run_deferred). Called again outside an operation, flush() sends them.
  LinkHeader credit{};
  if (ended && loop_ && held_credit_last_ && held_.size() == sizeof credit) {
    std::memcpy(&credit, held_.data(), sizeof credit);
    credit_waits_ = credit_may_wait(credit.length);
  }
  if (credit_waits_ && !deferral_listed_) {
    loop_->defer(this);
    deferral_listed_ = true;
  }
  if (!credit_waits_) write_held();
  // What pump() read beyond the operation stays in the buffer; the reader takes it from there.
  if (read_at_ != read_end_) wake_reader();
}

void SocketConnection::run_deferred() {
  deferral_listed_ = false;
  if (credit_waits_) write_held();
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
    if (!p.raw) gather_.push_back(asio::buffer(&in_flight_[k], sizeof(LinkHeader)));
    if (p.size > 0) gather_.push_back(asio::buffer(p.data, p.size));
  }
  if (auto* tcp = socket_.tcp()) {
    // A socket with room takes the batch now, without a trip through the loop: the writer is idle
    // again at once (the fast path of small operations needs it so). What it does not take is
    // written when it has room.
    boost::system::error_code ec;
    const std::size_t total = asio::buffer_size(gather_);
    std::size_t n = tcp->write_some(gather_, ec);
    if (!ec && n == total) {
      written({});
      return;
    }
    if (ec && ec != asio::error::would_block) {
      written(ec);
      return;
    }
    if (ec) n = 0;
    std::size_t i = 0;
    while (i < gather_.size() && n >= gather_[i].size()) n -= gather_[i++].size();
    gather_.erase(gather_.begin(), gather_.begin() + static_cast<std::ptrdiff_t>(i));
    if (n > 0) gather_.front() += n;
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
    // Drained: the vectors go back to the heap, since most links of a large job sit idle after an
    // operation or two (coccl-sim), and a few allocations weigh nothing beside a write.
    std::vector<Pending>().swap(queue_);
    std::vector<LinkHeader>().swap(in_flight_);
    std::vector<asio::const_buffer>().swap(gather_);
    head_ = 0;
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
  if (bye_seen_) {
    clear_queue();
    fail_waiters_soft();
    return;
  }
  // The peer reset the link. Its abort notice, if it sent one, is still in our receive buffer:
  // give the reader a moment to deliver it (it names the real cause), then fail anyway.
  linger().expires_after(std::chrono::milliseconds(200));
  linger().async_wait(
      [this, pass = gate_.enter(), text = ec.message()](boost::system::error_code e) {
        if (e || !pass.open() || closed_) return;
        close(make_error_code(errc::peer_lost),
              "lost rank " + std::to_string(peer_) + " (send " + text + ")");
      });
}

asio::steady_timer& SocketConnection::linger() {
  if (!linger_) linger_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  return *linger_;
}

void SocketConnection::finish_close() {
  boost::system::error_code ignored;
  if (!notice_.empty()) {
    socket_.write_some_now(asio::buffer(notice_), ignored);
    notice_.clear();
  }
  if (linger_) linger_->cancel();
  if (auto* tcp = socket_.tcp()) tcp->shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

void SocketConnection::send_abort(std::error_code ec, const std::string& why) {
  if (closed_) return;
  write_held();
  std::string text = why.substr(0, max_abort_text);
  // The peer fails with the same coccl error (a lost rank stays "peer lost" everywhere).
  auto code = ec.category() == error_category() ? static_cast<std::uint32_t>(ec.value())
                                                : static_cast<std::uint32_t>(errc::remote_error);
  LinkHeader h{LinkHeader::abort, code, text.size()};
  notice_.assign(reinterpret_cast<const char*>(&h), sizeof h);
  notice_ += text;
  notice_bye_ = false;
  // The notice must not land inside another frame: while one is being written it waits for
  // close() to finish that frame (or the rest of frames the fast path wrote in part). Writes are
  // non-blocking so that a stopped peer with a full socket buffer cannot hang an abort.
  if (writing_ || (head_ != queue_.size() && queue_[head_].raw)) return;
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
  write_held();
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
    // The rest of what the fast path wrote in part goes too, or the notice would land inside a
    // frame.
    while (head_ + keep < queue_.size() && queue_[head_ + keep].raw) ++keep;
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
      linger().expires_after(std::chrono::seconds(1));
      linger().async_wait([this, pass = gate_.enter()](boost::system::error_code e) {
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
  write_held();
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

void SocketConnection::on_put_buffered(const LinkHeader&, const std::byte*) {
  throw std::system_error(make_error_code(errc::bad_message),
                          std::string("data frame on an ") + kind() + " link");
}

asio::awaitable<void> SocketConnection::suspend(Waiter& slot) {
  co_await asio::async_initiate<decltype(asio::use_awaitable), void(boost::system::error_code)>(
      [&slot](auto handler) { slot.emplace(std::move(handler)); }, asio::use_awaitable);
}

namespace {

// A coroutine parked on a link that the loop's event sources serve, for as long as its frame
// holds this (a frame destroyed unresumed ends it too).
class IoParked {
 public:
  explicit IoParked(runtime::ProxyThread* t) noexcept : t_(t) {
    if (t_) t_->io_parked(1);
  }
  ~IoParked() {
    if (t_) t_->io_parked(-1);
  }
  IoParked(const IoParked&) = delete;
  IoParked& operator=(const IoParked&) = delete;

 private:
  runtime::ProxyThread* t_;
};

}  // namespace

asio::awaitable<void> SocketConnection::park_for_credit() {
  if (!held_.empty()) write_held();
  while (!closed_ && !bye_seen_ && !can_put()) {
    blocked_since_ = std::chrono::steady_clock::now();
    before_park();
    try {
      IoParked parked(loop_);
      co_await suspend(credit_waiter_);
    } catch (const boost::system::system_error&) {
    }
    blocked_since_.reset();
  }
}

asio::awaitable<void> SocketConnection::park_for_data() {
  if (!held_.empty()) write_held();
  while (!closed_ && !departed_ && !can_recv()) {
    blocked_since_ = std::chrono::steady_clock::now();
    before_park();
    try {
      IoParked parked(loop_);
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
