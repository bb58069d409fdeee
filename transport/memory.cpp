#include "transport/memory.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio/append.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/post.hpp>
#include <cstring>
#include <new>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace coccl::params {

config::Param<std::int64_t> memory_stream_bytes{
    "COCCL_MEMORY_STREAM_BYTES", 256 << 10,
    "bytes one direction of an in-memory stream (coccl-sim) holds before a write waits, as a "
    "socket buffer would"};

}  // namespace coccl::params

namespace coccl::transport::memory {

namespace {

using boost::system::error_code;

// A parked read or write. Held in an optional and never assigned (Boost 1.81's
// any_completion_handler move assignment recurses without end).
template <typename Buffers>
struct Parked {
  Buffers buffers;
  Stream::Handler handler;
  std::uint64_t ticket;  // tells a stale cancellation from one meant for this operation
};

// A completion, run on the executor of the end whose operation it is: clears the operation's
// cancellation slot, then calls its handler.
struct Finish {
  Stream::Handler handler;
  error_code ec;
  std::size_t n;
  asio::any_io_executor ex;

  using executor_type = asio::associated_executor_t<Stream::Handler, asio::any_io_executor>;
  executor_type get_executor() const noexcept { return asio::get_associated_executor(handler, ex); }
  void operator()() {
    handler.get_cancellation_slot().clear();
    std::move(handler)(ec, n);
  }
};

struct Shared;

// VirtualTime's state: whether one is alive, its time, and the streams holding bytes that are
// not readable yet.
struct Clock {
  std::mutex mutex;
  std::atomic<bool> on{false};
  std::atomic<std::uint64_t> now{0};
  std::vector<std::weak_ptr<Shared>> pending;
  // The round VirtualTime::poll serves (its thread's alone). It and `pending` trade places each
  // round and are emptied, never freed, so neither regrows from nothing every round.
  std::vector<std::weak_ptr<Shared>> due;
};

Clock& clock() {
  // Never destroyed: streams may be closed by static destructors at exit.
  static Clock* c = new Clock;
  return *c;
}

// One write's bytes, queued until read, with its place in the stream, the writer's round then,
// whether it starts a message, and when it becomes readable. A stream allocates for the bytes in
// flight only, so a drained link end holds none: in coccl-sim most of the tens of link ends a
// rank has are idle most of the time, and a buffer kept for each cost kilobytes per end.
struct Chunk {
  Chunk* next;
  std::uint64_t begin, end, stamp, ready;
  bool first;

  std::uint8_t* bytes() noexcept { return reinterpret_cast<std::uint8_t*>(this + 1); }

  // The header and `n` bytes in one allocation.
  static Chunk* make(std::size_t n) { return new (::operator new(sizeof(Chunk) + n)) Chunk{}; }
  static void free(Chunk* c) noexcept { ::operator delete(static_cast<void*>(c)); }
};
static_assert(std::is_trivially_destructible_v<Chunk>);  // freed without its destructor

// One direction of a stream: bytes written by one end and not yet read by the other.
struct Direction {
  Chunk* head = nullptr;  // the oldest write still (partly) unread
  Chunk* tail = nullptr;
  std::uint64_t written = 0, consumed = 0;  // bytes since the stream opened
  // Counting, when either end has a Traffic (owned by Shared, which outlives this).
  Traffic* writer = nullptr;
  Traffic* reader = nullptr;
  bool writer_gone = false;  // the writing end closed: reads drain what is queued, then eof
  bool reader_gone = false;  // the reading end closed: writes fail with broken_pipe
  // Made under VirtualTime: what is written at time t becomes readable at t + 1.
  bool timed = false;
  // The last write was partial: a composed write (asio::async_write) carries on with the rest,
  // which is the same message.
  bool continuing = false;
  std::optional<Parked<Stream::MutableBuffers>> read;  // the reading end's, while none readable
  // The writing end's, while full. Apart, because a writer rarely waits while an idle link's
  // reader always does.
  std::unique_ptr<Parked<Stream::ConstBuffers>> write;

  Direction() = default;
  Direction(const Direction&) = delete;
  Direction& operator=(const Direction&) = delete;
  ~Direction() { discard(); }

  std::size_t unread() const noexcept { return static_cast<std::size_t>(written - consumed); }

  // What a read may take now.
  std::size_t readable() const noexcept {
    if (!timed || !clock().on.load(std::memory_order_relaxed)) return unread();
    const std::uint64_t now = clock().now.load(std::memory_order_relaxed);
    std::uint64_t end = consumed;
    for (const Chunk* c = head; c && c->ready <= now; c = c->next) end = c->end;
    return static_cast<std::size_t>(end - consumed);
  }
  bool delayed() const noexcept { return readable() < unread(); }

  std::size_t put(const Stream::ConstBuffers& from, std::size_t most) {
    const std::size_t asked = from.size();
    const std::size_t n = std::min(asked, most);
    if (n == 0) return 0;
    Chunk* c = Chunk::make(n);
    std::size_t at = 0;
    for (std::size_t i = 0; i < from.count && at < n; ++i) {
      const std::size_t give = std::min(from.at[i].size(), n - at);
      std::memcpy(c->bytes() + at, from.at[i].data(), give);
      at += give;
    }
    c->begin = written;
    c->end = written + n;
    c->stamp = writer ? writer->stamp() : Traffic::first_stamp();
    c->ready = timed ? clock().now.load(std::memory_order_relaxed) + 1 : 0;
    c->first = !continuing;
    continuing = n < asked;
    (tail ? tail->next : head) = c;
    tail = c;
    written += n;
    if (writer) writer->sent(n, c->first);
    return n;
  }

  std::size_t take(const Stream::MutableBuffers& into) {
    const std::size_t most = readable();
    std::size_t n = 0;
    Chunk* c = head;
    std::size_t offset = c ? static_cast<std::size_t>(consumed - c->begin) : 0;
    for (std::size_t i = 0; i < into.count && n < most; ++i) {
      auto* out = static_cast<std::uint8_t*>(into.at[i].data());
      std::size_t room = std::min(into.at[i].size(), most - n);
      while (room > 0) {
        const std::size_t give =
            std::min(room, static_cast<std::size_t>(c->end - c->begin) - offset);
        std::memcpy(out, c->bytes() + offset, give);
        out += give;
        room -= give;
        n += give;
        offset += give;
        if (c->begin + offset == c->end) {
          c = c->next;
          offset = 0;
        }
      }
    }
    if (n > 0) consume(n);
    return n;
  }

  // The reader took the next `n` bytes: counts them and frees the writes it finished.
  void consume(std::size_t n) {
    const std::uint64_t from = consumed, to = consumed + n;
    if (reader) {
      std::uint64_t messages = 0;
      for (const Chunk* c = head; c && c->begin < to; c = c->next) {
        if (c->first && c->begin >= from) ++messages;
        reader->heard(c->stamp);
      }
      reader->received(n, messages);
    }
    while (head && head->end <= to) pop();
    consumed = to;
  }

  void pop() noexcept {
    Chunk* c = head;
    head = c->next;
    if (!head) tail = nullptr;
    Chunk::free(c);
  }

  void discard() noexcept {
    while (head) pop();
    consumed = written;
  }
};

struct Shared {
  std::mutex mutex;
  std::size_t capacity;
  std::array<asio::any_io_executor, 2> ex;          // each end's executor
  std::array<std::shared_ptr<Traffic>, 2> traffic;  // each end's party (null: not counted)
  std::array<Direction, 2> dir;                     // dir[i]: written by end i, read by end 1 - i
  std::uint64_t tickets = 0;
  bool pending = false;  // listed in the clock's pending streams
};

// Under the stream's lock: lists a stream whose bytes are not all readable yet with the clock.
void keep_pending(const std::shared_ptr<Shared>& s) {
  if (s->pending || (!s->dir[0].delayed() && !s->dir[1].delayed())) return;
  s->pending = true;
  Clock& c = clock();
  std::lock_guard lock(c.mutex);
  c.pending.push_back(s);
}

// Completions gathered under the lock and posted after it is released. Held inline: one call
// completes at most the four operations a stream can have parked (a read and a write each way),
// and most calls one, so a heap list would cost an allocation per message.
class Completions {
 public:
  Completions() = default;
  Completions(const Completions&) = delete;
  Completions& operator=(const Completions&) = delete;

  void add(asio::any_io_executor ex, Stream::Handler handler, error_code ec, std::size_t n) {
    // Emplaced, never assigned (Boost 1.81's any_completion_handler move assignment).
    list_.at(count_++).emplace(Finish{std::move(handler), ec, n, std::move(ex)});
  }
  ~Completions() {
    for (std::size_t i = 0; i < count_; ++i) {
      auto ex = list_[i]->ex;
      asio::post(ex, std::move(*list_[i]));
    }
  }

 private:
  std::array<std::optional<Finish>, 4> list_;
  std::size_t count_ = 0;
};

// `op` is the optional or unique_ptr that parks an operation.
template <typename Slot>
void finish(Slot& op, asio::any_io_executor ex, error_code ec, std::size_t n, Completions& done) {
  done.add(std::move(ex), std::move(op->handler), ec, n);
  op.reset();
}

// Bytes of dir[i] became readable: the reader parked on it (end 1 - i) takes them.
void serve_read(Shared& s, int i, Completions& done) {
  Direction& d = s.dir[i];
  if (!d.read || d.readable() == 0) return;
  const std::size_t n = d.take(d.read->buffers);
  finish(d.read, s.ex[1 - i], {}, n, done);
}

// Room was made in dir[i]: the writer parked on it (end i) fills it.
void serve_write(Shared& s, int i, Completions& done) {
  Direction& d = s.dir[i];
  if (!d.write || d.unread() >= s.capacity) return;
  const std::size_t n = d.put(d.write->buffers, s.capacity - d.unread());
  finish(d.write, s.ex[i], {}, n, done);
}

class End final : public Stream::Impl {
 public:
  End(std::shared_ptr<Shared> shared, int side) : s_(std::move(shared)), side_(side) {}
  ~End() override {
    error_code ignored;
    close(ignored);
  }

  Stream::executor_type get_executor() override { return s_->ex[side_]; }

  void async_read_some(Stream::MutableBuffers buffers, Stream::Handler handler) override {
    Completions done;
    std::lock_guard lock(s_->mutex);
    Direction& d = s_->dir[1 - side_];
    if (!open_) return done.add(mine(), std::move(handler), asio::error::bad_descriptor, 0);
    if (buffers.size() == 0) return done.add(mine(), std::move(handler), {}, 0);
    if (d.readable() > 0) {
      const std::size_t n = d.take(buffers);
      done.add(mine(), std::move(handler), {}, n);
      serve_write(*s_, 1 - side_, done);
      keep_pending(s_);
      return;
    }
    if (d.writer_gone && d.unread() == 0)
      return done.add(mine(), std::move(handler), asio::error::eof, 0);
    const std::uint64_t ticket = ++s_->tickets;
    arm_cancel(handler, 1 - side_, true, ticket);
    d.read.emplace(Parked<Stream::MutableBuffers>{buffers, std::move(handler), ticket});
  }

  void async_write_some(Stream::ConstBuffers buffers, Stream::Handler handler) override {
    Completions done;
    std::lock_guard lock(s_->mutex);
    Direction& d = s_->dir[side_];
    if (!open_) return done.add(mine(), std::move(handler), asio::error::bad_descriptor, 0);
    if (d.reader_gone) return done.add(mine(), std::move(handler), asio::error::broken_pipe, 0);
    if (buffers.size() == 0) return done.add(mine(), std::move(handler), {}, 0);
    if (d.unread() < s_->capacity) {
      const std::size_t n = d.put(buffers, s_->capacity - d.unread());
      done.add(mine(), std::move(handler), {}, n);
      serve_read(*s_, side_, done);
      keep_pending(s_);
      return;
    }
    const std::uint64_t ticket = ++s_->tickets;
    arm_cancel(handler, side_, false, ticket);
    d.write = std::make_unique<Parked<Stream::ConstBuffers>>(
        Parked<Stream::ConstBuffers>{buffers, std::move(handler), ticket});
  }

  std::size_t write_some_now(asio::const_buffer buffer, error_code& ec) override {
    Completions done;
    std::lock_guard lock(s_->mutex);
    Direction& d = s_->dir[side_];
    ec = {};
    if (!open_) {
      ec = asio::error::bad_descriptor;
      return 0;
    }
    if (d.reader_gone) {
      ec = asio::error::broken_pipe;
      return 0;
    }
    Stream::ConstBuffers one;
    one.at[0] = buffer;
    one.count = 1;
    const std::size_t n = d.put(one, s_->capacity - std::min(s_->capacity, d.unread()));
    serve_read(*s_, side_, done);
    keep_pending(s_);
    return n;
  }

  void close(error_code& ec) override {
    ec = {};
    Completions done;
    std::lock_guard lock(s_->mutex);
    if (!open_) return;
    open_ = false;
    Direction& out = s_->dir[side_];
    out.writer_gone = true;
    if (out.write) finish(out.write, mine(), asio::error::operation_aborted, 0, done);
    // The peer's read waits while nothing is readable; with nothing queued either, it reads the
    // end of the stream (else it does once it has read what is queued).
    if (out.read && out.unread() == 0) finish(out.read, theirs(), asio::error::eof, 0, done);
    Direction& in = s_->dir[1 - side_];
    in.reader_gone = true;
    in.discard();
    if (in.read) finish(in.read, mine(), asio::error::operation_aborted, 0, done);
    if (in.write) finish(in.write, theirs(), asio::error::broken_pipe, 0, done);
  }

  bool is_open() const override { return open_; }

 private:
  asio::any_io_executor mine() const { return s_->ex[side_]; }
  asio::any_io_executor theirs() const { return s_->ex[1 - side_]; }

  // A cancellation of the parked operation (per-operation cancellation, e.g. a parallel group)
  // completes it with operation_aborted. Emitted on this end's executor; `ticket` keeps a late
  // emission from touching a later operation.
  void arm_cancel(Stream::Handler& handler, int direction, bool read, std::uint64_t ticket) {
    auto slot = handler.get_cancellation_slot();
    if (!slot.is_connected()) return;
    slot.assign([weak = std::weak_ptr<Shared>(s_), direction, read, ticket,
                 ex = mine()](asio::cancellation_type) {
      auto s = weak.lock();
      if (!s) return;
      Completions done;
      std::lock_guard lock(s->mutex);
      Direction& d = s->dir[direction];
      if (read && d.read && d.read->ticket == ticket)
        finish(d.read, ex, asio::error::operation_aborted, 0, done);
      if (!read && d.write && d.write->ticket == ticket)
        finish(d.write, ex, asio::error::operation_aborted, 0, done);
    });
  }

  std::shared_ptr<Shared> s_;
  int side_;
  bool open_ = true;
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, std::weak_ptr<Listener>> listeners;
  std::uint64_t next = 1;
};

Registry& registry() {
  // Never destroyed: listeners may be closed by static destructors at exit.
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

std::size_t default_capacity() {
  return static_cast<std::size_t>(std::max<std::int64_t>(1, params::memory_stream_bytes.get()));
}

std::pair<Stream, Stream> make_pair(asio::any_io_executor a, asio::any_io_executor b,
                                    std::size_t capacity, std::shared_ptr<Traffic> traffic_a,
                                    std::shared_ptr<Traffic> traffic_b) {
  auto shared = std::make_shared<Shared>();
  shared->capacity = std::max<std::size_t>(1, capacity);
  shared->ex = {std::move(a), std::move(b)};
  shared->traffic = {std::move(traffic_a), std::move(traffic_b)};
  for (int i = 0; i < 2; ++i) {
    shared->dir[i].writer = shared->traffic[i].get();
    shared->dir[i].reader = shared->traffic[1 - i].get();
    shared->dir[i].timed = clock().on.load(std::memory_order_relaxed);
    if (shared->traffic[i]) shared->traffic[i]->opened();
  }
  return {Stream(std::make_unique<End>(shared, 0)), Stream(std::make_unique<End>(shared, 1))};
}

std::shared_ptr<Listener> Listener::open(asio::any_io_executor ex,
                                         std::shared_ptr<Traffic> traffic) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::shared_ptr<Listener> l(new Listener(std::move(ex), r.next++, std::move(traffic)));
  r.listeners.emplace(l->number_, l);
  return l;
}

std::shared_ptr<Listener> Listener::open_at(std::uint64_t number, asio::any_io_executor ex,
                                            std::shared_ptr<Traffic> traffic) {
  number |= named;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto& slot = r.listeners[number];
  if (slot.lock()) return nullptr;
  std::shared_ptr<Listener> l(new Listener(std::move(ex), number, std::move(traffic)));
  slot = l;
  return l;
}

Listener::~Listener() { close(); }

void Listener::async_accept(Acceptor::AcceptHandler handler) {
  std::optional<Stream> ready;
  {
    std::lock_guard lock(mutex_);
    if (open_ && taken_ == backlog_.size()) {
      waiter_.emplace(std::move(handler));
      return;
    }
    if (open_) {
      ready.emplace(std::move(backlog_[taken_++]));
      if (taken_ == backlog_.size()) {
        std::vector<Stream>().swap(backlog_);
        taken_ = 0;
      }
    }
  }
  const error_code ec = ready ? error_code() : error_code(asio::error::operation_aborted);
  asio::post(ex_, asio::append(std::move(handler), ec, ready ? std::move(*ready) : Stream()));
}

void Listener::close() {
  std::vector<Stream> dropped;
  std::optional<Acceptor::AcceptHandler> waiter;
  {
    std::lock_guard lock(mutex_);
    if (!open_) return;
    open_ = false;
    dropped.swap(backlog_);
    taken_ = 0;
    if (waiter_) {
      waiter.emplace(std::move(*waiter_));
      waiter_.reset();
    }
  }
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    r.listeners.erase(number_);
  }
  if (waiter)
    asio::post(ex_, asio::append(std::move(*waiter), error_code(asio::error::operation_aborted),
                                 Stream()));
}

bool Listener::is_open() const {
  std::lock_guard lock(mutex_);
  return open_;
}

std::optional<Stream> Listener::connect(std::uint64_t number, asio::any_io_executor ex,
                                        std::shared_ptr<Traffic> traffic) {
  std::shared_ptr<Listener> l;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.listeners.find(number);
    if (it != r.listeners.end()) l = it->second.lock();
  }
  if (!l) return std::nullopt;
  std::optional<Acceptor::AcceptHandler> waiter;
  std::optional<Stream> accepted;
  std::optional<Stream> dialled;
  {
    std::lock_guard lock(l->mutex_);
    if (!l->open_) return std::nullopt;
    auto [mine, theirs] =
        make_pair(std::move(ex), l->ex_, default_capacity(), std::move(traffic), l->traffic_);
    dialled.emplace(std::move(mine));
    if (l->waiter_) {
      waiter.emplace(std::move(*l->waiter_));
      l->waiter_.reset();
      accepted.emplace(std::move(theirs));
    } else {
      l->backlog_.push_back(std::move(theirs));
    }
  }
  if (waiter)
    asio::post(l->ex_, asio::append(std::move(*waiter), error_code(), std::move(*accepted)));
  return dialled;
}

VirtualTime::VirtualTime(runtime::ProxyThread& thread) : thread_(thread) {
  clock().on.store(true, std::memory_order_relaxed);
  thread_.add_idle_poller(this);
}

VirtualTime::~VirtualTime() {
  thread_.remove_idle_poller(this);
  // From here on every byte is readable once written; the readers parked on bytes held back
  // until now take them.
  clock().on.store(false, std::memory_order_relaxed);
  poll();
}

std::uint64_t VirtualTime::now() noexcept { return clock().now.load(std::memory_order_relaxed); }

bool VirtualTime::poll() {
  Clock& c = clock();
  {
    std::lock_guard lock(c.mutex);
    if (c.pending.empty()) return false;
    c.due.swap(c.pending);
    c.now.fetch_add(1, std::memory_order_relaxed);
  }
  for (const auto& weak : c.due) {
    auto s = weak.lock();
    if (!s) continue;
    Completions done;
    std::lock_guard lock(s->mutex);
    s->pending = false;
    for (int i = 0; i < 2; ++i) {
      serve_read(*s, i, done);
      serve_write(*s, i, done);
    }
    // Written meanwhile (from another thread), or by the parked writer just served.
    keep_pending(s);
  }
  // A weak_ptr keeps a destroyed stream's block (make_shared) allocated.
  c.due.clear();
  return true;
}

}  // namespace coccl::transport::memory
