#include "transport/memory.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio/append.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/post.hpp>
#include <cstring>
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

// One direction of a stream: bytes written by one end and not yet read by the other.
struct Direction {
  std::vector<std::uint8_t> bytes;
  std::size_t head = 0;      // bytes[head..] are unread
  bool writer_gone = false;  // the writing end closed: reads drain what is queued, then eof
  bool reader_gone = false;  // the reading end closed: writes fail with broken_pipe
  std::optional<Parked<Stream::MutableBuffers>> read;  // the reading end's, while empty
  std::optional<Parked<Stream::ConstBuffers>> write;   // the writing end's, while full

  std::size_t unread() const noexcept { return bytes.size() - head; }

  std::size_t put(const Stream::ConstBuffers& from, std::size_t most) {
    // Compacts before growing, so that a queue in steady use stays near its capacity.
    if (head > 0 && head >= bytes.size() / 2) {
      bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(head));
      head = 0;
    }
    std::size_t n = 0;
    for (std::size_t i = 0; i < from.count && n < most; ++i) {
      const std::size_t take = std::min(from.at[i].size(), most - n);
      const auto* p = static_cast<const std::uint8_t*>(from.at[i].data());
      bytes.insert(bytes.end(), p, p + take);
      n += take;
    }
    return n;
  }

  std::size_t take(const Stream::MutableBuffers& into) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < into.count && unread() > 0; ++i) {
      const std::size_t give = std::min(into.at[i].size(), unread());
      std::memcpy(into.at[i].data(), bytes.data() + head, give);
      head += give;
      n += give;
    }
    if (unread() == 0) {
      bytes.clear();
      head = 0;
      // A burst (a large frame) need not hold its memory for the life of the stream.
      if (bytes.capacity() > (64u << 10)) bytes.shrink_to_fit();
    }
    return n;
  }

  void discard() {
    bytes.clear();
    bytes.shrink_to_fit();
    head = 0;
  }
};

struct Shared {
  std::mutex mutex;
  std::size_t capacity;
  std::array<asio::any_io_executor, 2> ex;  // each end's executor
  std::array<Direction, 2> dir;             // dir[i]: written by end i, read by end 1 - i
  std::uint64_t tickets = 0;
};

// Completions gathered under the lock and posted after it is released.
class Completions {
 public:
  void add(asio::any_io_executor ex, Stream::Handler handler, error_code ec, std::size_t n) {
    list_.push_back(Finish{std::move(handler), ec, n, std::move(ex)});
  }
  ~Completions() {
    for (auto& f : list_) {
      auto ex = f.ex;
      asio::post(ex, std::move(f));
    }
  }

 private:
  std::vector<Finish> list_;
};

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
    if (d.unread() > 0) {
      const std::size_t n = d.take(buffers);
      done.add(mine(), std::move(handler), {}, n);
      serve_write(d, done);
      return;
    }
    if (d.writer_gone) return done.add(mine(), std::move(handler), asio::error::eof, 0);
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
      serve_read(d, done);
      return;
    }
    const std::uint64_t ticket = ++s_->tickets;
    arm_cancel(handler, side_, false, ticket);
    d.write.emplace(Parked<Stream::ConstBuffers>{buffers, std::move(handler), ticket});
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
    serve_read(d, done);
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
    // The peer's read waits only while nothing is queued: it reads the end of the stream.
    if (out.read) finish(out.read, theirs(), asio::error::eof, 0, done);
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

  template <typename Op>
  static void finish(std::optional<Op>& op, asio::any_io_executor ex, error_code ec, std::size_t n,
                     Completions& done) {
    done.add(std::move(ex), std::move(op->handler), ec, n);
    op.reset();
  }

  // Bytes just queued in `d`: the reader parked on it takes them.
  void serve_read(Direction& d, Completions& done) {
    if (!d.read || d.unread() == 0) return;
    const std::size_t n = d.take(d.read->buffers);
    finish(d.read, theirs(), {}, n, done);
  }

  // Room just made in `d`: the writer parked on it fills it.
  void serve_write(Direction& d, Completions& done) {
    if (!d.write || d.unread() >= s_->capacity) return;
    const std::size_t n = d.put(d.write->buffers, s_->capacity - d.unread());
    finish(d.write, theirs(), {}, n, done);
  }

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
                                    std::size_t capacity) {
  auto shared = std::make_shared<Shared>();
  shared->capacity = std::max<std::size_t>(1, capacity);
  shared->ex = {std::move(a), std::move(b)};
  return {Stream(std::make_unique<End>(shared, 0)), Stream(std::make_unique<End>(shared, 1))};
}

std::shared_ptr<Listener> Listener::open(asio::any_io_executor ex) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::shared_ptr<Listener> l(new Listener(std::move(ex), r.next++));
  r.listeners.emplace(l->number_, l);
  return l;
}

Listener::~Listener() { close(); }

void Listener::async_accept(Acceptor::AcceptHandler handler) {
  std::optional<Stream> ready;
  {
    std::lock_guard lock(mutex_);
    if (open_ && backlog_.empty()) {
      waiter_.emplace(std::move(handler));
      return;
    }
    if (open_) {
      ready.emplace(std::move(backlog_.front()));
      backlog_.pop_front();
    }
  }
  const error_code ec = ready ? error_code() : error_code(asio::error::operation_aborted);
  asio::post(ex_, asio::append(std::move(handler), ec, ready ? std::move(*ready) : Stream()));
}

void Listener::close() {
  std::deque<Stream> dropped;
  std::optional<Acceptor::AcceptHandler> waiter;
  {
    std::lock_guard lock(mutex_);
    if (!open_) return;
    open_ = false;
    dropped.swap(backlog_);
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

std::optional<Stream> Listener::connect(std::uint64_t number, asio::any_io_executor ex) {
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
    auto [mine, theirs] = make_pair(std::move(ex), l->ex_, default_capacity());
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

}  // namespace coccl::transport::memory
