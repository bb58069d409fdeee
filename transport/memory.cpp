#include "transport/memory.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/post.hpp>
#include <condition_variable>
#include <cstring>
#include <new>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "runtime/handoff.hpp"

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
// cancellation slot, then calls its handler. The handler runs there directly, not dispatched to
// its own associated executor: coccl's streams are used by coroutines and handlers on the end's
// executor (no strands), and the dispatch through the type-erased executor cost an allocation and
// a second hand-off per message (coccl-sim moves millions).
struct Finish {
  Stream::Handler handler;
  error_code ec;
  std::size_t n;
  asio::any_io_executor ex;

  void operator()() {
    handler.get_cancellation_slot().clear();
    std::move(handler)(ec, n);
  }
};

struct Shared;

// A stream's place among the streams one round serves: the dialling party's name and how many
// streams it dialled before (transport/traffic.hpp), then the order in which streams were made,
// which decides only between parties without a name. Served in the order in which they were
// written, the streams of two threads would interleave as the threads happened to run, and a
// party taking its round's messages in another order can answer otherwise (a credit that goes
// alone rather than with data): counts would change from run to run and with the thread count.
struct Order {
  std::uint64_t party, stream, made;
  bool operator<(const Order& o) const noexcept {
    return std::tie(party, stream, made) < std::tie(o.party, o.stream, o.made);
  }
};

struct Due {
  Order order;
  std::weak_ptr<Shared> stream;
};

// VirtualTime's state: whether one is alive, its time, and the streams holding bytes that are
// not readable yet.
struct Clock {
  std::mutex mutex;
  std::atomic<bool> on{false};
  std::atomic<std::uint64_t> now{0};
  std::vector<Due> pending;
  // The round being served, by the thread that advanced the time (no other advances it before
  // that thread reports again). It and `pending` trade places each round and are emptied, never
  // freed, so neither regrows from nothing every round.
  std::vector<Due> due;
  std::atomic<std::uint64_t> made{0};  // streams made, for Order::made
  // The VirtualTime's threads, under `mutex`; and for note_post(), which runs on every
  // completion, the same in a fixed array read without the lock (set before `on`, cleared after).
  std::vector<VirtualTime::Participant*> members;
  static constexpr std::size_t most_members = 64;
  std::array<std::atomic<VirtualTime::Participant*>, most_members> posted_to{};
  std::atomic<std::size_t> count{0};
  std::atomic<int> holds{0};
  // settle(): it waits, under `mutex`, for a thread to find the network quiet.
  bool settling = false;
  std::condition_variable settled;
};

Clock& clock() {
  // Never destroyed: streams may be closed by static destructors at exit.
  static Clock* c = new Clock;
  return *c;
}

}  // namespace

struct VirtualTime::Participant final : runtime::Poller {
  explicit Participant(runtime::ProxyThread& t) : thread(t), context(&t.context()) {}
  runtime::ProxyThread& thread;
  const asio::execution_context* context;
  // Completions the network posted to this thread, how many of them it has run, and how many it
  // had run when it last reported having nothing to run (under the clock's lock; `unreported`
  // while it serves a round). The time advances only when every thread has run all that was
  // posted to it and reported since: a thread that looked idle an instant before a completion
  // reached its queue does not count as idle.
  std::atomic<std::uint64_t> posted{0};
  std::atomic<std::uint64_t> ran{0};
  static constexpr std::uint64_t unreported = ~std::uint64_t{0};
  std::uint64_t reported = unreported;

  bool poll() override;
  bool waiting() const override { return false; }
};

namespace {

// With several threads under virtual time: the thread of `ex`, counted as owing one more
// completion (null with one thread or none).
VirtualTime::Participant* note_post(const asio::any_io_executor& ex) {
  Clock& c = clock();
  const std::size_t n = c.count.load(std::memory_order_acquire);
  if (n < 2) return nullptr;
  const asio::execution_context* target = &asio::query(ex, asio::execution::context);
  for (std::size_t i = 0; i < n; ++i) {
    VirtualTime::Participant* p = c.posted_to[i].load(std::memory_order_relaxed);
    if (p && p->context == target) {
      p->posted.fetch_add(1, std::memory_order_acq_rel);
      return p;
    }
  }
  return nullptr;
}

// Posts a completion of the network to `ex`; under virtual time on several threads, its thread
// counts it as run once it has run (and what it wrote is pending by then).
template <typename Handler>
void post_noted(const asio::any_io_executor& ex, Handler&& handler) {
  VirtualTime::Participant* p = note_post(ex);
  if (!p) return asio::post(ex, std::forward<Handler>(handler));
  asio::post(ex, [h = std::forward<Handler>(handler), p]() mutable {
    std::move(h)();
    p->ran.fetch_add(1, std::memory_order_acq_rel);
  });
}

// While a round is served, the completions for each thread gather here and go to it as one
// handler once every stream is served: a thread must not start on round t + 1 while round t's
// messages still arrive, or a party would act on some of them before the others came (a host
// leader, for one, would write its followers' hellos to the root in more frames than it does when
// they arrive together).
struct Batch {
  const asio::execution_context* context;
  asio::any_io_executor ex;
  std::vector<Finish> list;
};
thread_local std::vector<Batch>* gathering = nullptr;
thread_local std::size_t gathering_hint = 0;  // the streams of the round being served

// An accept's completion, run on the listener's executor (as Finish runs on the end's).
auto accepted(Acceptor::AcceptHandler handler, error_code ec, Stream s) {
  return [handler = std::move(handler), ec, s = std::move(s)]() mutable {
    std::move(handler)(ec, std::move(s));
  };
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
  Order order;
  std::uint64_t tickets = 0;
  bool pending = false;  // listed in the clock's pending streams
};

// Under the stream's lock: lists a stream whose bytes are not all readable yet with the clock.
void keep_pending(const std::shared_ptr<Shared>& s) {
  if (s->pending || (!s->dir[0].delayed() && !s->dir[1].delayed())) return;
  s->pending = true;
  Clock& c = clock();
  std::lock_guard lock(c.mutex);
  c.pending.push_back(Due{s->order, s});
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
      Finish& f = *list_[i];
      if (gathering) {
        const asio::execution_context* target = &asio::query(f.ex, asio::execution::context);
        auto b = std::find_if(gathering->begin(), gathering->end(),
                              [target](const Batch& x) { return x.context == target; });
        if (b == gathering->end()) {
          b = gathering->insert(gathering->end(), Batch{target, f.ex, {}});
          // About one completion a stream served: no regrowth from nothing in a large round.
          b->list.reserve(gathering_hint);
        }
        b->list.push_back(std::move(f));
        continue;
      }
      auto ex = f.ex;
      post_noted(ex, std::move(f));
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
  shared->order = {traffic_a ? traffic_a->id() : 0, traffic_a ? traffic_a->next_stream() : 0,
                   clock().made.fetch_add(1, std::memory_order_relaxed)};
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
  post_noted(ex_, accepted(std::move(handler), ec, ready ? std::move(*ready) : Stream()));
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
    post_noted(ex_,
               accepted(std::move(*waiter), error_code(asio::error::operation_aborted), Stream()));
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
    post_noted(l->ex_, memory::accepted(std::move(*waiter), error_code(), std::move(*accepted)));
  return dialled;
}

namespace {

// Serves the streams of one round: their readers take what became readable and their parked
// writers what room was made. `together`: each thread gets its completions as one handler.
void serve(std::vector<Due>& due, bool together) {
  std::sort(due.begin(), due.end(), [](const Due& a, const Due& b) { return a.order < b.order; });
  std::vector<Batch> batches;
  if (together) {
    gathering = &batches;
    gathering_hint = due.size();
  }
  for (const Due& d : due) {
    auto s = d.stream.lock();
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
  due.clear();
  gathering = nullptr;
  for (Batch& b : batches)
    post_noted(b.ex, [list = std::move(b.list)]() mutable {
      for (Finish& f : list) f();
    });
}

}  // namespace

bool VirtualTime::Participant::poll() {
  Clock& c = clock();
  {
    std::lock_guard lock(c.mutex);
    reported = ran.load(std::memory_order_acquire);
    if (c.holds.load(std::memory_order_acquire) > 0 || (c.pending.empty() && !c.settling))
      return false;
    for (const Participant* p : c.members) {
      const std::uint64_t done = p->ran.load(std::memory_order_acquire);
      if (p->reported != done || p->posted.load(std::memory_order_acquire) != done) return false;
    }
    if (c.pending.empty()) {
      // Every thread idle and nothing in flight: what settle() waits for.
      c.settling = false;
      c.settled.notify_all();
      return false;
    }
    c.due.swap(c.pending);
    c.now.fetch_add(1, std::memory_order_relaxed);
    // Busy serving: no other thread advances the time (or touches `due`) until this one reports
    // again.
    reported = unreported;
  }
  serve(c.due, true);
  return true;
}

VirtualTime::VirtualTime(runtime::ProxyThread& thread) {
  participants_.push_back(std::make_unique<Participant>(thread));
  join(0);
  clock().on.store(true, std::memory_order_relaxed);
}

VirtualTime::VirtualTime(const std::vector<runtime::ProxyThread*>& threads) {
  if (threads.empty() || threads.size() > Clock::most_members)
    throw std::invalid_argument("VirtualTime: 1 to 64 threads");
  for (runtime::ProxyThread* t : threads) {
    if (t->in_thread()) throw std::invalid_argument("VirtualTime: made on one of its threads");
    participants_.push_back(std::make_unique<Participant>(*t));
  }
  for (std::size_t i = 0; i < participants_.size(); ++i)
    runtime::run_on(participants_[i]->thread, [this, i] { join(i); });
  clock().on.store(true, std::memory_order_relaxed);
}

void VirtualTime::join(std::size_t i) {
  Participant* p = participants_[i].get();
  Clock& c = clock();
  {
    std::lock_guard lock(c.mutex);
    c.members.push_back(p);
    c.posted_to[i].store(p, std::memory_order_relaxed);
    c.count.store(c.members.size(), std::memory_order_release);
  }
  p->thread.add_idle_poller(p);
}

void VirtualTime::leave(std::size_t i) {
  Participant* p = participants_[i].get();
  p->thread.remove_idle_poller(p);
  Clock& c = clock();
  std::lock_guard lock(c.mutex);
  c.members.erase(std::remove(c.members.begin(), c.members.end(), p), c.members.end());
}

VirtualTime::~VirtualTime() {
  Clock& c = clock();
  {
    // No completion posted from now on counts toward a thread.
    std::lock_guard lock(c.mutex);
    c.count.store(0, std::memory_order_release);
    for (auto& slot : c.posted_to) slot.store(nullptr, std::memory_order_relaxed);
    c.holds.store(0, std::memory_order_relaxed);
  }
  // Destroyed on its one thread (made there), or from outside its threads.
  if (participants_.front()->thread.in_thread()) {
    leave(0);
  } else {
    for (std::size_t i = 0; i < participants_.size(); ++i)
      runtime::run_on(participants_[i]->thread, [this, i] { leave(i); });
    // A completion counted just before the count went to 0 was posted by a handler then under
    // way, which ended before its own thread's leave: this second round on every thread comes
    // after it in its queue, and once it has run nothing refers to the participants.
    for (const auto& p : participants_) runtime::run_on(p->thread, [] {});
  }
  // From here on every byte is readable once written; the readers parked on bytes held back
  // until now take them.
  c.on.store(false, std::memory_order_relaxed);
  {
    std::lock_guard lock(c.mutex);
    c.due.swap(c.pending);
  }
  serve(c.due, false);
}

void VirtualTime::report_afresh(bool settling, bool releasing) {
  Clock& c = clock();
  {
    std::lock_guard lock(c.mutex);
    // The last hold ends under the same lock as the reports: a thread that reported idle while
    // held, before work reached its queue, must not find the holds gone and its report still
    // standing.
    if (releasing && c.holds.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    for (Participant* p : c.members) p->reported = Participant::unreported;
    // The nudges count as owed before the lock is let go: a thread that looked for work just
    // before something reached its queue (a coroutine spawned there, which the network does not
    // count) and reports now cannot pass for idle until its nudge, queued behind that work, ran.
    for (const auto& p : participants_) p->posted.fetch_add(1, std::memory_order_acq_rel);
    if (settling) c.settling = true;
  }
  // Each thread's queue runs in order, so its nudge comes after what was handed to it before;
  // the nudge also wakes a thread that sleeps.
  for (const auto& p : participants_)
    asio::post(p->thread.executor(),
               [q = p.get()] { q->ran.fetch_add(1, std::memory_order_acq_rel); });
}

void VirtualTime::settle() {
  // Reports from before the call say nothing of what is in flight now.
  report_afresh(true, false);
  Clock& c = clock();
  std::unique_lock lock(c.mutex);
  c.settled.wait(lock, [&c] { return !c.settling; });
}

std::uint64_t VirtualTime::now() noexcept { return clock().now.load(std::memory_order_relaxed); }

void VirtualTime::hold() noexcept {
  // Under the lock a round's start takes: a thread that found every thread idle and no hold has
  // advanced the time by the time this returns, and none advances it after, so now() read after
  // hold() stays put until release(). Without it a round could start between a thread's check of
  // the holds and its step of the time, after the caller read now().
  Clock& c = clock();
  std::lock_guard lock(c.mutex);
  c.holds.fetch_add(1, std::memory_order_acq_rel);
}

void VirtualTime::release() {
  // A report from before the hold's work was queued says nothing about it; threads that went to
  // sleep while held wake.
  report_afresh(false, true);
}

}  // namespace coccl::transport::memory
