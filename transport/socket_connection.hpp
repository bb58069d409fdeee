// The part of a connection that lives on a byte stream (a TCP socket, or a memory stream): an
// ordered write queue, a reader coroutine that dispatches incoming frames, peer-loss detection (EOF
// or reset) and abort notices. The tcp transport carries its data on it; shm uses it only for
// liveness and abort notices.
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/steady_timer.hpp>
#include <coccl/error.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.hpp"
#include "runtime/gate.hpp"
#include "transport/connection.hpp"
#include "transport/stream.hpp"

namespace coccl::transport {

/// Frame header on an established connection (not authenticated: the link was authenticated
/// when it was set up, and the data path must stay cheap).
struct LinkHeader {
  enum Type : std::uint32_t { put = 1, credit = 2, abort = 3, bye = 4 };
  std::uint32_t type;
  std::uint32_t fingerprint;
  std::uint64_t length;
};

/// The reason text of an abort notice is at most this long; a longer one is a protocol error.
inline constexpr std::size_t max_abort_text = 4096;
/// The length of an abort notice's reason, checked before the text is read. Throws
/// std::system_error(errc::bad_message) when it exceeds max_abort_text.
std::size_t abort_text_size(const LinkHeader& h);
/// The error an abort notice names: its code when it is one of coccl's, else errc::remote_error.
errc abort_code(std::uint32_t code) noexcept;

/// Why a credit for `n` slots is refused when `in_use` of the peer's slots hold this side's chunks
/// (a credit for slots never filled would wrap the count in use, and no put could go again);
/// empty when it is in order.
std::string credit_refusal(std::uint64_t n, std::uint64_t in_use);

/// A put of at most this many bytes is copied and completes at once, on either tcp engine, so that
/// the frames an operation queues in one go leave together.
inline constexpr std::size_t copied_put_max = 4096;
/// A copy of [src, src + n) that a queued frame owns (null for n = 0).
std::unique_ptr<std::byte[]> copy_payload(const void* src, std::size_t n);

using Resume = asio::any_completion_handler<void(boost::system::error_code)>;
// A parked waiter. Held in an optional and never assigned: Boost 1.81's any_completion_handler
// move assignment wraps the source in itself and recurses without end.
using Waiter = std::optional<Resume>;

class SocketConnection : public Connection, private runtime::Deferred {
 public:
  /// What the reader buffers of the stream: enough for the frames of a small operation, or, for a
  /// link that carries data on a tcp socket (`carries_data`), for a put of several KiB with the
  /// frames around it, so that the fast path can take it without waiting.
  static constexpr std::size_t small_read_buffer = 256;
  static constexpr std::size_t data_read_buffer = 16384;

  SocketConnection(int self, int peer, Stream socket, FailureHandler on_failure,
                   bool carries_data = false);
  ~SocketConnection() override;

  void send_abort(std::error_code ec, const std::string& why) override;
  void close(std::error_code ec, const std::string& why) override;
  void send_goodbye() override;
  bool notice_pending() const noexcept override { return !notice_.empty(); }

  /// Starts the reader coroutine; call once the derived object is fully built.
  void start();

 protected:
  // Queues a frame; `done` (optional) runs once its bytes are handed to the kernel. Frames queued
  // while the handler that queues them runs go out together, in one write, once it returns.
  void enqueue(LinkHeader h, const void* data, std::size_t n, Resume done);
  // Queues a frame whose payload is copied now (at most copied_put_max bytes): the caller may
  // reuse `data` at once. A goodbye still sends it first.
  void enqueue_copy(LinkHeader h, const void* data, std::size_t n);
  // Queues a credit for n more slots, added to one already queued behind the write in flight.
  void enqueue_credit(std::uint64_t n);
  // Reads the payload of a put frame (tcp) with read_body(); links that carry data elsewhere (shm,
  // ib) keep this default, which rejects it. Only for a put too large for the reader's buffer:
  // the others come whole to on_put_buffered().
  virtual asio::awaitable<void> on_put(const LinkHeader& h, const runtime::Gate::Pass& pass);
  // A put frame whose payload (h.length bytes at `payload`) the reader holds whole; throws
  // std::system_error(bad_message) where the put is out of order. The default rejects it.
  virtual void on_put_buffered(const LinkHeader& h, const std::byte* payload);

  // For the fast path (Connection::try_put and peek), on a tcp socket only. The frames of a fast
  // operation are held back and leave in one write at its next peek() or flush(); credits for the
  // chunks it releases join them.
  // True where the fast path may use the link now: a socket, a healthy link, no write waiting for
  // room in the socket.
  bool fast_writable() const noexcept;
  // Holds back a frame (the payload copied: n bytes at data, then more_n at more) / a credit for n
  // slots, to leave with the next write_held().
  void hold_frame(LinkHeader h, const void* data, std::size_t n, const void* more = nullptr,
                  std::size_t more_n = 0);
  void hold_credit(std::uint64_t n);
  // Writes what is held back without waiting; what the socket does not take now is queued, to
  // go before anything queued later.
  void write_held();
  // The end of a fast operation on the link (Connection::flush): what is held back leaves, and the
  // reader takes what pump() read beyond the operation.
  void end_fast();
  // A put is held back (credits alone wait for the operation's flush()).
  bool holds_put() const noexcept { return held_put_; }
  // The credits of the last fast operation wait for this link's next frame (end_fast()).
  bool credit_waits() const noexcept { return credit_waits_; }
  // Whether credits for n slots, the last fast operation's, may wait for the link's next frame:
  // the peer still has a slot for its next operation's put without them. (Its chunks that came
  // ahead of this rank are of operations that this rank's next frame answers anyway.)
  virtual bool credit_may_wait(std::uint64_t) const noexcept { return false; }
  // Takes, without waiting, what the socket has now and delivers the frames that it completes
  // (on_put_buffered, on_credit, goodbye). Frames only the reader coroutine takes (a put too
  // large to buffer, an abort notice, an error) are left to it, and it is woken.
  void pump();
  // The fast path uses the link (from its first put or peek until flush()): frames and credits
  // are held back meanwhile.
  void begin_fast();
  bool fast_active() const noexcept { return fast_active_; }
  // The reader coroutine is reading a body too large for the buffer: the stream is its own.
  bool reader_busy() const noexcept { return reader_busy_; }
  // pump() left the reader a frame or an error that it has not taken yet (a put too large to
  // buffer, an abort notice, the peer's end): past the chunks already delivered, only the reader
  // can go on, on the loop's thread.
  bool reader_owed() const noexcept { return reader_owed_; }
  // Reads the next n bytes of the stream into dst: those the reader already holds, then the rest
  // (straight into dst where it is large, with up to `spare` bytes more that dst has room for,
  // which the reader keeps). Returns the stream's error, if any; touches nothing of this object
  // once `pass` reads closed.
  asio::awaitable<boost::system::error_code> read_body(const runtime::Gate::Pass& pass, void* dst,
                                                       std::size_t n, std::size_t spare = 0);
  // A credit frame (tcp); the others return credits through their own channel.
  virtual void on_credit(std::uint64_t) {}
  // A slot of the peer's ring is free for the next put / the next chunk is ready to hand out.
  virtual bool can_put() const noexcept = 0;
  virtual bool can_recv() const noexcept = 0;
  // Runs before a coroutine parks: a polled link makes its poller visit it.
  virtual void before_park() {}
  // Parks the calling coroutine in credit_waiter_ / recv_waiter_ until can_put() / can_recv()
  // holds, the link closed or the peer left; the caller then checks which.
  asio::awaitable<void> park_for_credit();
  asio::awaitable<void> park_for_data();
  // Parks the calling coroutine in `slot` until resume().
  static asio::awaitable<void> suspend(Waiter& slot);
  // Fails the waiters.
  void fail_waiters();
  // Wakes them without an error so they re-check their condition.
  void fail_waiters_soft();
  // Nothing queued or being written (credits included).
  bool idle_writer() const noexcept { return head_ == queue_.size() && !writing_; }
  // Resumes a suspended coroutine with `ec` from the executor (never inline).
  void resume(Waiter& w, boost::system::error_code ec = {});
  void resume_now(Resume& r, boost::system::error_code ec);
  // Throws the stored failure.
  [[noreturn]] void throw_failure() const;
  // After a goodbye or EOF from a departed peer: nothing more will come. Fails the link (and so
  // the communicator) only if someone still needs the peer, then throws.
  [[noreturn]] void fail_departed(const char* needed);

  Stream socket_;
  // The proxy thread whose loop reads this link (null where no one borrows its role): told of
  // coroutines parked on the link (ProxyThread::io_parked).
  runtime::ProxyThread* loop_ = nullptr;
  // The coroutine waiting for the next chunk, and the one waiting for a free slot of the peer's
  // ring (at most one each: see Connection).
  Waiter recv_waiter_;
  Waiter credit_waiter_;
  bool closed_ = false;
  // The peer said goodbye (destroyed its communicator): nothing more may be put to it.
  bool bye_seen_ = false;
  // ... and everything it sent before has arrived (on_goodbye()): nothing more will come.
  bool departed_ = false;
  // Put frames carry their index in put order (mod 2^32) in the upper half of their length (a
  // link whose puts travel over several sockets and must come out in put order): put_length()
  // frames put k of n bytes, put_bytes() is a frame's payload size.
  bool put_index_ = false;
  std::uint64_t put_length(std::uint64_t k, std::size_t n) const noexcept {
    return put_index_ ? (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k)) << 32) | n : n;
  }
  std::uint64_t put_bytes(const LinkHeader& h) const noexcept {
    return put_index_ ? (h.length & 0xffffffffu) : h.length;
  }
  // The peer's goodbye came on this stream, after everything it sent on it. A link whose peer
  // sends on other streams too waits for them before it counts the peer departed.
  virtual void on_goodbye() {
    departed_ = true;
    // Waiters re-check: data already here is still delivered; anything more fails.
    fail_waiters_soft();
  }
  std::error_code error_;
  std::string error_text_;

 private:
  struct Pending {
    LinkHeader header;
    const void* data;
    std::size_t size;
    Resume done;
    std::unique_ptr<std::byte[]> copy;  // owns `data` for enqueue_copy()
    bool raw = false;  // `data` is frames already framed (write_held()): no header of its own
  };
  // What the reader's buffer starts with once parse() has delivered every whole frame in it.
  enum class Front {
    more,   // part of a frame (or nothing): read more
    large,  // the header (taken, in `h`) of a frame whose body the buffer cannot hold
    stop,   // for pump(): a frame that only the reader coroutine takes (not taken)
    closed  // an abort notice closed the link
  };
  Front parse(bool on_loop, LinkHeader& h);
  asio::awaitable<void> read_loop(runtime::Gate::Pass pass);
  // Moves the unread bytes of the buffer to its front.
  void compact() noexcept;
  // Reads what the socket holds now into the buffer's free end (compacted first), without
  // waiting: would_block when there is nothing.
  boost::system::error_code read_now(asio::ip::tcp::socket& tcp);
  // Makes the parked reader coroutine look at its buffer again (pump() filled it).
  void wake_reader();
  // Starts a write once the current handler returns, unless one is in flight or due.
  void schedule_write();
  void write_next();
  // The write of the batch in flight finished.
  void written(boost::system::error_code ec);
  void queue_broken(boost::system::error_code ec);
  void clear_queue() noexcept {
    queue_.clear();
    head_ = 0;
  }
  void finish_close();

  // Frames to write, oldest at head_: a vector, since a deque allocates about 600 bytes even
  // empty and a rank of a large job holds dozens of links. The frames in flight (the batch_ from
  // head_ on) write their headers from in_flight_, so the vector may grow under them.
  std::vector<Pending> queue_;
  std::size_t head_ = 0;
  std::size_t batch_ = 0;
  std::vector<LinkHeader> in_flight_;
  std::vector<asio::const_buffer> gather_;
  std::string notice_;       // abort or goodbye notice waiting for the frames in flight
  bool notice_bye_ = false;  // notice_ is a goodbye
  // Bounds how long a close waits for those frames; made when first needed, since most links
  // never close with frames pending and a timer is a tenth of an idle link (coccl-sim).
  std::unique_ptr<asio::steady_timer> linger_;
  asio::steady_timer& linger();
  bool writing_ = false;
  bool write_due_ = false;  // schedule_write() posted a write that has not started
  // Bytes read from the stream and not yet taken: the reader asks the stream for as much as fits,
  // so that the small frames of an operation (header, data, credits) come in one read.
  std::size_t read_cap_;
  std::unique_ptr<std::byte[]> read_buf_;
  std::size_t read_at_ = 0, read_end_ = 0;
  // On a tcp socket the reader waits for the socket to be readable, parked in read_waiter_, and
  // then reads without waiting: no read is in flight while it is parked, so pump() may read the
  // socket too. read_armed_: the wait for readability is queued; read_error_: an error pump()
  // met, for the reader to report.
  Waiter read_waiter_;
  bool read_armed_ = false;
  bool reader_busy_ = false;
  bool reader_owed_ = false;  // see reader_owed()
  boost::system::error_code read_error_;
  // Frames the fast path holds back (write_held()).
  std::vector<std::byte> held_;
  bool fast_active_ = false;
  bool held_put_ = false;
  bool held_credit_last_ = false;  // the last frame held is a credit
  // held_ is the credits of the last fast operation, waiting for the link's next frame (or the
  // loop's deferral: listed says the link is on loop_'s list).
  bool credit_waits_ = false;
  bool deferral_listed_ = false;
  void run_deferred() override;
  runtime::Gate gate_;  // closed by the destructor: handlers still queued then do nothing
};

}  // namespace coccl::transport
