#include "transport/tcp_uring.hpp"

#include <coccl/error.hpp>
#include <cstring>
#include <mutex>

#include "runtime/log.hpp"

#if COCCL_HAVE_URING
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/append.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <deque>

#include "transport/socket_connection.hpp"
#endif

namespace coccl::params {

config::Param<std::string> tcp_engine{
    "COCCL_TCP_ENGINE", "auto",
    "what drives tcp links: uring (io_uring: multishot receives, zero-copy sends, several "
    "sockets per peer), asio (one socket per peer on Boost.Asio) or auto (uring where the kernel "
    "allows it, else asio)"};
config::Param<std::int64_t> tcp_zc_min{
    "COCCL_TCP_ZC_MIN", 1 << 20,
    "smallest put the uring engine sends zero-copy (IORING_OP_SEND_ZC) from the caller's buffer; "
    "smaller ones are copied into the socket"};

}  // namespace coccl::params

namespace coccl::transport {

#if COCCL_HAVE_URING

namespace {

constexpr unsigned ring_entries = 256;
// Per socket: provided buffers the multishot receive fills (the kernel picks one per completion).
constexpr unsigned buffers_per_socket = 16;
constexpr std::size_t buffer_bytes = 64 << 10;
constexpr std::size_t max_sockets = 16;
constexpr std::size_t buf_ring_bytes = buffers_per_socket * sizeof(io_uring_buf);

// Completion tags in the low bits of user_data: send operations are tagged with the address of
// their Out (at least 8-aligned), receives with their socket's index.
constexpr std::uint64_t tag_send = 0;
constexpr std::uint64_t tag_header = 1;  // a failed header send (its success posts nothing)
constexpr std::uint64_t tag_recv = 2;
constexpr std::uint64_t tag_cancel = 3;
constexpr std::uint64_t tag_mask = 7;

std::string errno_text(int e) { return std::strerror(e); }

std::string probe() {
  io_uring ring;
  int r = io_uring_queue_init(8, &ring, 0);
  if (r < 0) return "io_uring_queue_init: " + errno_text(-r);
  std::string why;
  if (io_uring_probe* p = io_uring_get_probe_ring(&ring)) {
    const std::pair<int, const char*> ops[] = {{IORING_OP_SEND_ZC, "SEND_ZC"},
                                               {IORING_OP_RECV, "RECV"},
                                               {IORING_OP_SENDMSG, "SENDMSG"},
                                               {IORING_OP_SEND, "SEND"}};
    for (auto [op, name] : ops)
      if (!io_uring_opcode_supported(p, op)) why = std::string("the kernel lacks ") + name;
    io_uring_free_probe(p);
  } else {
    why = "the kernel cannot list its io_uring operations";
  }
  if (why.empty()) {
    // Provided buffer rings (and with SEND_ZC, multishot receives) need Linux 6.0.
    void* mem = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      why = "mmap: " + errno_text(errno);
    } else {
      io_uring_buf_reg reg{};
      reg.ring_addr = reinterpret_cast<std::uint64_t>(mem);
      reg.ring_entries = 8;
      reg.bgid = 0;
      r = io_uring_register_buf_ring(&ring, &reg, 0);
      if (r < 0) why = "provided buffer rings: " + errno_text(-r);
      ::munmap(mem, 4096);
    }
  }
  io_uring_queue_exit(&ring);
  return why;
}

}  // namespace

const std::string& uring_unavailable() {
  static const std::string why = probe();
  return why;
}

TcpEngine tcp_engine(int rank) {
  const std::string want = params::tcp_engine.get();
  if (want != "auto" && want != "uring" && want != "asio")
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "COCCL_TCP_ENGINE=" + want + ": expected uring, asio or auto");
  static std::once_flag logged;
  if (want == "asio") {
    std::call_once(logged,
                   [rank] { COCCL_INFO(net, rank, "tcp engine: asio (COCCL_TCP_ENGINE=asio)"); });
    return TcpEngine::asio;
  }
  const std::string& why = uring_unavailable();
  if (!why.empty() && want == "uring")
    throw std::system_error(make_error_code(errc::unsupported),
                            "COCCL_TCP_ENGINE=uring, but io_uring is unavailable: " + why);
  std::call_once(logged, [rank, &why] {
    if (why.empty())
      COCCL_INFO(net, rank, "tcp engine: io_uring");
    else
      COCCL_INFO(net, rank, "tcp engine: asio (io_uring unavailable: %s)", why.c_str());
  });
  return why.empty() ? TcpEngine::uring : TcpEngine::asio;
}

class UringRing {
 public:
  UringRing() = default;
  ~UringRing() {
    if (ready) io_uring_queue_exit(&ring);
    if (event_fd >= 0) ::close(event_fd);
  }
  UringRing(const UringRing&) = delete;
  UringRing& operator=(const UringRing&) = delete;

  io_uring ring{};
  bool ready = false;
  // SINGLE_ISSUER and DEFER_TASKRUN, disabled until the link's thread enables it.
  bool deferred = false;
  int event_fd = -1;
};

void UringRingDeleter::operator()(UringRing* r) const noexcept { delete r; }

UringRingPtr make_uring_ring(std::string& why) {
  UringRingPtr r(new UringRing);
  // Completions wait in the kernel until the engine asks for them (DEFER_TASKRUN), where they would
  // otherwise run as task work at the proxy thread's next system call: a multishot receive then
  // took the socket's lock while the sending rank's loopback transmit held it, and 48% of an
  // 8-byte all_reduce's samples were spin locks (76-94 us against 30 us). Such a ring takes
  // submissions from one thread, the one that enables it (R_DISABLED until then): the link's
  // proxy thread. Kernels before 6.1 refuse the flags; the ring is then an ordinary one.
  int e = io_uring_queue_init(ring_entries, &r->ring,
                              IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
                                  IORING_SETUP_TASKRUN_FLAG | IORING_SETUP_R_DISABLED);
  if (e == -EINVAL)
    e = io_uring_queue_init(ring_entries, &r->ring, 0);
  else if (e >= 0)
    r->deferred = true;
  if (e < 0) {
    why = "io_uring_queue_init: " + errno_text(-e);
    return nullptr;
  }
  r->ready = true;
  r->event_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (r->event_fd < 0) {
    why = "eventfd: " + errno_text(errno);
    return nullptr;
  }
  e = io_uring_register_eventfd(&r->ring, r->event_fd);
  if (e < 0) {
    why = "io_uring_register_eventfd: " + errno_text(-e);
    return nullptr;
  }
  return r;
}

namespace {

class UringTcpConnection final : public Connection, public runtime::Poller {
 public:
  UringTcpConnection(int self, int peer, std::vector<asio::ip::tcp::socket> sockets,
                     UringRingPtr ring, std::size_t slots, std::size_t slot_bytes,
                     runtime::ProxyThread& thread, FailureHandler on_failure);
  ~UringTcpConnection() override;

  const char* kind() const noexcept override { return "tcp"; }
  std::size_t slot_bytes() const noexcept override { return slot_bytes_; }
  asio::awaitable<void> put(const void* src, std::size_t n, std::uint32_t fingerprint) override;
  asio::awaitable<Chunk> wait() override;
  void release() override;
  void send_abort(std::error_code ec, const std::string& why) override;
  void send_goodbye() override;
  bool notice_pending() const noexcept override { return !notice_.empty(); }
  void close(std::error_code ec, const std::string& why) override;

  bool settled() const noexcept override {
    return !closed_ && filled_ == released_ && sent_ == acked_ && !recv_waiter_ &&
           !credit_waiter_ && zc_wait_.empty() &&
           std::all_of(socks_.begin(), socks_.end(),
                       [](const Sock& s) { return !s.sending && s.queue.empty(); });
  }
  bool poll() override { return reap() > 0; }
  // The ring takes submissions and runs its deferred completions on the thread that enabled it.
  bool thread_bound() const override { return ring_ && ring_->deferred; }
  bool waiting() const override {
    if (recv_waiter_ || credit_waiter_ || !zc_wait_.empty()) return true;
    return std::any_of(socks_.begin(), socks_.end(), [](const Sock& s) { return s.sending; });
  }

 private:
  // A frame to send. Heap-allocated and kept until its last completion: the kernel reads the
  // header (and the iovecs) from here.
  struct Out {
    LinkHeader header;
    const void* data;
    std::size_t size;
    Resume done;  // resumes the put; empty for control frames and copied puts
    bool zc = false;
    bool failed = false;
    std::unique_ptr<std::byte[]> copy{};  // owns `data` for a copied put
  };
  struct Sock {
    int fd = -1;
    // Receive: the provided buffers and the frame being parsed.
    io_uring_buf_ring* buf_ring = nullptr;
    std::unique_ptr<std::byte[]> buffers;
    std::array<std::byte, sizeof(LinkHeader)> head{};
    std::size_t head_got = 0;
    LinkHeader frame{};
    std::size_t body_got = 0;
    std::byte* body = nullptr;
    std::string text;
    std::uint64_t chunk = 0;  // the put being received
    bool armed = false;
    bool ended = false;
    // Send: frames in order; the front `batch` are in flight while `sending`, in one SENDMSG
    // gathered from `iov` (or one zero-copy send).
    std::deque<std::unique_ptr<Out>> queue;
    bool sending = false;
    std::size_t batch = 0;
    std::vector<iovec> iov;
    msghdr msg{};
  };

  io_uring* uring() { return &ring_->ring; }
  io_uring_sqe* sqe();
  void submit();
  void arm(std::size_t i);
  void arm_event();
  std::size_t reap();
  void handle(std::uint64_t data, int res, unsigned flags);
  void on_recv(std::size_t i, int res, unsigned flags);
  void consume(std::size_t i, const std::byte* p, std::size_t n);
  void begin_frame(Sock& s);
  void end_frame(Sock& s);
  void ended(std::size_t i, int res);
  void protocol_error(const std::string& what);
  void on_sent(Out* o, int res, unsigned flags);
  void on_notified(Out* o);
  void finish(std::unique_ptr<Out> o);
  void send_failed(int res);
  void enqueue(std::size_t i, std::unique_ptr<Out> o);
  // Starts the sends of every socket with frames queued and none in flight, in one submission,
  // once the handler queuing them returns (so that an operation's frames leave together).
  void schedule_sends();
  // Prepares the next send of socket i, if it has frames and none in flight; true if it did.
  bool send_next(std::size_t i);
  // After close() with a goodbye: no socket has a frame queued or in flight.
  bool drained() const noexcept {
    return std::all_of(socks_.begin(), socks_.end(),
                       [](const Sock& s) { return !s.sending && s.queue.empty(); });
  }
  void finish_close();
  void release_resources();
  bool departed_now() const;
  asio::awaitable<void> park(Waiter& slot, bool (UringTcpConnection::*ready)() const);
  bool can_put() const noexcept { return sent_ - acked_ < slots_; }
  // A put frame's length field: over several sockets its put index (mod 2^32) in the upper half,
  // since chunks may take any socket and must come out in put order.
  std::uint64_t frame_length(std::uint64_t k, std::size_t n) const noexcept {
    return socks_.size() > 1 ? (static_cast<std::uint64_t>(static_cast<std::uint32_t>(k)) << 32) | n
                             : n;
  }
  bool can_recv() const noexcept { return filled_ != consumed_; }
  static asio::awaitable<void> suspend(Waiter& slot);
  void resume(Waiter& w, boost::system::error_code ec = {});
  void resume_now(Resume& r, boost::system::error_code ec);
  void fail_waiters();
  void fail_waiters_soft();
  [[noreturn]] void throw_failure() const { throw LinkError(error_, error_text_); }
  [[noreturn]] void fail_departed(const char* needed);
  std::string lost(const std::string& what) const {
    return "lost rank " + std::to_string(peer_) + " (" + what + ")";
  }

  UringRingPtr ring_;
  runtime::ProxyThread& thread_;
  asio::any_io_executor ex_;
  asio::posix::stream_descriptor event_;
  std::uint64_t event_value_ = 0;
  asio::steady_timer linger_;
  std::vector<Sock> socks_;
  std::size_t zc_min_;
  std::size_t inflight_ = 0;                  // completions still to come that refer to our memory
  std::deque<std::unique_ptr<Out>> zc_wait_;  // sent zero-copy, notification not yet in

  std::size_t slots_;
  std::size_t slot_bytes_;
  std::unique_ptr<std::byte[]> slot_ring_;
  std::vector<std::uint32_t> sizes_;
  std::vector<std::uint32_t> fingerprints_;
  // Per slot: free (its chunk counted in filled_, or not arrived), being received, or landed and
  // waiting for the chunks before it.
  enum class Slot : std::uint8_t { free, receiving, landed };
  std::vector<Slot> slot_state_;
  std::vector<std::uint8_t> carried_;  // per slot: the socket its chunk came on
  std::uint64_t striped_ = 0;          // large puts sent, which go round the sockets
  std::uint64_t filled_ = 0, consumed_ = 0, released_ = 0;
  std::uint64_t sent_ = 0, acked_ = 0;

  Waiter recv_waiter_;
  Waiter credit_waiter_;
  bool closed_ = false;
  bool finished_ = false;
  bool sends_due_ = false;   // schedule_sends() posted a submission that has not run
  bool notice_bye_ = false;  // notice_ is a goodbye
  bool bye_seen_ = false;    // the peer said goodbye on socket 0
  bool departed_ = false;    // ... and every socket has delivered all it carried
  std::error_code error_;
  std::string error_text_;
  std::string notice_;  // abort notice waiting for the frame in flight on socket 0
  runtime::Gate gate_;  // closed by the destructor: handlers still queued then do nothing
};

UringTcpConnection::UringTcpConnection(int self, int peer,
                                       std::vector<asio::ip::tcp::socket> sockets,
                                       UringRingPtr ring, std::size_t slots, std::size_t slot_bytes,
                                       runtime::ProxyThread& thread, FailureHandler on_failure)
    : Connection(self, peer, std::move(on_failure)),
      ring_(std::move(ring)),
      thread_(thread),
      ex_(thread.executor()),
      event_(thread.executor()),
      linger_(thread.executor()),
      socks_(sockets.size()),
      zc_min_(static_cast<std::size_t>(std::max<std::int64_t>(1, params::tcp_zc_min.get()))),
      slots_(slots),
      slot_bytes_(slot_bytes),
      slot_ring_(new std::byte[slots * slot_bytes]),
      sizes_(slots),
      fingerprints_(slots),
      slot_state_(slots, Slot::free),
      carried_(slots, 0) {
  std::vector<int> fds;
  for (std::size_t i = 0; i < sockets.size(); ++i) {
    boost::system::error_code ignored;
    sockets[i].set_option(asio::ip::tcp::no_delay(true), ignored);
    socks_[i].fd = sockets[i].release();
    fds.push_back(socks_[i].fd);
  }
  // A constructor that throws runs no destructor: give back what was taken so far.
  auto fail = [this](int err, const char* what) {
    release_resources();
    throw std::system_error(err, std::system_category(), what);
  };
  int e = io_uring_register_files(uring(), fds.data(), static_cast<unsigned>(fds.size()));
  if (e < 0) fail(-e, "io_uring_register_files");
  for (std::size_t i = 0; i < socks_.size(); ++i) {
    Sock& s = socks_[i];
    void* mem =
        ::mmap(nullptr, buf_ring_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) fail(errno, "mmap");
    s.buf_ring = static_cast<io_uring_buf_ring*>(mem);
    io_uring_buf_reg reg{};
    reg.ring_addr = reinterpret_cast<std::uint64_t>(mem);
    reg.ring_entries = buffers_per_socket;
    reg.bgid = static_cast<std::uint16_t>(i);
    e = io_uring_register_buf_ring(uring(), &reg, 0);
    if (e < 0) fail(-e, "io_uring_register_buf_ring");
    s.buffers.reset(new std::byte[buffers_per_socket * buffer_bytes]);
    io_uring_buf_ring_init(s.buf_ring);
    const int mask = io_uring_buf_ring_mask(buffers_per_socket);
    for (unsigned b = 0; b < buffers_per_socket; ++b)
      io_uring_buf_ring_add(s.buf_ring, s.buffers.get() + b * buffer_bytes, buffer_bytes,
                            static_cast<unsigned short>(b), mask, static_cast<int>(b));
    io_uring_buf_ring_advance(s.buf_ring, buffers_per_socket);
  }
  // The ring's one submitter is the thread that enables it: this one, the link's proxy thread
  // (Peers makes its links there, and every operation of the link runs there).
  if (ring_->deferred) {
    e = io_uring_enable_rings(uring());
    if (e < 0) fail(-e, "io_uring_enable_rings");
  }
  event_.assign(::dup(ring_->event_fd));
  thread_.add_poller(this);
  for (std::size_t i = 0; i < socks_.size(); ++i) arm(i);
  submit();
  arm_event();
}

UringTcpConnection::~UringTcpConnection() {
  gate_.close();
  thread_.remove_poller(this);
  boost::system::error_code ignored;
  event_.close(ignored);
  for (Sock& s : socks_)
    if (s.fd >= 0) ::shutdown(s.fd, SHUT_RDWR);
  // The kernel may still read headers from our Outs and write into our buffers: cancel what is
  // pending and wait (bounded) for every operation to report back before freeing them.
  if (io_uring_sqe* q = io_uring_get_sqe(uring())) {
    io_uring_prep_cancel64(q, 0, IORING_ASYNC_CANCEL_ANY);
    io_uring_sqe_set_data64(q, tag_cancel);
    io_uring_submit(uring());
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (inflight_ > 0 && std::chrono::steady_clock::now() < until) {
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec ts{0, 20'000'000};
    if (io_uring_wait_cqe_timeout(uring(), &cqe, &ts) < 0 || !cqe) continue;
    const std::uint64_t data = cqe->user_data;
    const unsigned flags = cqe->flags;
    io_uring_cqe_seen(uring(), cqe);
    switch (data & tag_mask) {
      case tag_recv:
        if (!(flags & IORING_CQE_F_MORE)) --inflight_;
        break;
      case tag_send:
        if (!(flags & IORING_CQE_F_NOTIF) && (flags & IORING_CQE_F_MORE)) break;
        --inflight_;
        break;
      default:
        break;
    }
  }
  release_resources();
}

void UringTcpConnection::release_resources() {
  ring_.reset();
  for (Sock& s : socks_) {
    if (s.buf_ring) ::munmap(s.buf_ring, buf_ring_bytes);
    if (s.fd >= 0) ::close(s.fd);
    s.buf_ring = nullptr;
    s.fd = -1;
  }
}

io_uring_sqe* UringTcpConnection::sqe() {
  io_uring_sqe* q = io_uring_get_sqe(uring());
  if (!q) {
    io_uring_submit(uring());
    q = io_uring_get_sqe(uring());
  }
  if (!q)
    throw std::system_error(make_error_code(errc::internal), "io_uring submission queue full");
  return q;
}

void UringTcpConnection::submit() {
  int e = io_uring_submit(uring());
  if (e < 0 && e != -EBUSY && e != -EAGAIN && !closed_)
    close(make_error_code(errc::internal), "io_uring_submit: " + errno_text(-e));
}

void UringTcpConnection::arm(std::size_t i) {
  io_uring_sqe* q = sqe();
  io_uring_prep_recv_multishot(q, static_cast<int>(i), nullptr, 0, 0);
  q->flags |= IOSQE_FIXED_FILE | IOSQE_BUFFER_SELECT;
  q->buf_group = static_cast<std::uint16_t>(i);
  io_uring_sqe_set_data64(q, (static_cast<std::uint64_t>(i) << 3) | tag_recv);
  socks_[i].armed = true;
  ++inflight_;
}

void UringTcpConnection::arm_event() {
  event_.async_read_some(asio::buffer(&event_value_, sizeof event_value_),
                         [this, pass = gate_.enter()](boost::system::error_code ec, std::size_t) {
                           if (!pass.open() || ec) return;
                           reap();
                           arm_event();
                         });
}

std::size_t UringTcpConnection::reap() {
  std::size_t n = 0;
  // A deferring ring flags the completions it holds; they are run, here and on this thread only,
  // by one system call.
  if (ring_->deferred && (IO_URING_READ_ONCE(*uring()->sq.kflags) & IORING_SQ_TASKRUN))
    io_uring_get_events(uring());
  // io_uring_cq_ready reads the ring's tail from shared memory: polling an idle link costs no
  // system call.
  while (io_uring_cq_ready(uring()) > 0) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_peek_cqe(uring(), &cqe) != 0 || !cqe) break;
    const std::uint64_t data = cqe->user_data;
    const int res = cqe->res;
    const unsigned flags = cqe->flags;
    io_uring_cqe_seen(uring(), cqe);
    handle(data, res, flags);
    ++n;
  }
  return n;
}

void UringTcpConnection::handle(std::uint64_t data, int res, unsigned flags) {
  switch (data & tag_mask) {
    case tag_recv:
      on_recv(static_cast<std::size_t>(data >> 3), res, flags);
      break;
    case tag_send: {
      Out* o = reinterpret_cast<Out*>(data & ~tag_mask);
      if (flags & IORING_CQE_F_NOTIF)
        on_notified(o);
      else
        on_sent(o, res, flags);
      break;
    }
    default:
      // A failed header send: its linked payload send reports the failure (cancelled).
      break;
  }
}

void UringTcpConnection::on_recv(std::size_t i, int res, unsigned flags) {
  Sock& s = socks_[i];
  if (!(flags & IORING_CQE_F_MORE)) {
    s.armed = false;
    --inflight_;
  }
  if (flags & IORING_CQE_F_BUFFER) {
    const unsigned bid = flags >> IORING_CQE_BUFFER_SHIFT;
    std::byte* buf = s.buffers.get() + static_cast<std::size_t>(bid) * buffer_bytes;
    if (res > 0) consume(i, buf, static_cast<std::size_t>(res));
    // Parsing copied everything out: the buffer goes straight back to the kernel.
    io_uring_buf_ring_add(s.buf_ring, buf, buffer_bytes, static_cast<unsigned short>(bid),
                          io_uring_buf_ring_mask(buffers_per_socket), 0);
    io_uring_buf_ring_advance(s.buf_ring, 1);
  }
  if (res > 0 || res == -ENOBUFS) {
    // A multishot receive ends when the provided buffers ran out (or the kernel chose to): re-arm.
    if (!s.armed && !closed_ && !s.ended) {
      arm(i);
      submit();
    }
    return;
  }
  s.ended = true;
  ended(i, res);
}

void UringTcpConnection::consume(std::size_t i, const std::byte* p, std::size_t n) {
  Sock& s = socks_[i];
  while (n > 0 && !closed_) {
    if (s.head_got < s.head.size()) {
      const std::size_t take = std::min(n, s.head.size() - s.head_got);
      std::memcpy(s.head.data() + s.head_got, p, take);
      s.head_got += take;
      p += take;
      n -= take;
      if (s.head_got == s.head.size()) {
        std::memcpy(&s.frame, s.head.data(), sizeof s.frame);
        s.body_got = 0;
        begin_frame(s);
      }
      continue;
    }
    const std::size_t take = std::min<std::size_t>(n, s.frame.length - s.body_got);
    if (s.frame.type == LinkHeader::put)
      std::memcpy(s.body + s.body_got, p, take);
    else
      s.text.append(reinterpret_cast<const char*>(p), take);
    s.body_got += take;
    p += take;
    n -= take;
    if (s.body_got == s.frame.length) end_frame(s);
  }
}

void UringTcpConnection::begin_frame(Sock& s) {
  switch (s.frame.type) {
    case LinkHeader::put: {
      // Over several sockets a put names its place in put order (frame_length()); over one, chunks
      // land in order, each the next one due.
      s.chunk = filled_;
      if (socks_.size() > 1) {
        const auto seq = static_cast<std::uint32_t>(s.frame.length >> 32);
        s.chunk = filled_ + static_cast<std::uint32_t>(seq - static_cast<std::uint32_t>(filled_));
        s.frame.length &= 0xffffffffu;
      }
      // The sender holds a credit for this chunk's slot, so it is free; a peer that ignores
      // credits, sends a chunk twice or sends oversized frames is broken.
      const std::size_t slot = s.chunk % slots_;
      if (s.frame.length > slot_bytes_ || s.chunk - released_ >= slots_ ||
          slot_state_[slot] != Slot::free) {
        protocol_error("put without credit");
        return;
      }
      slot_state_[slot] = Slot::receiving;
      carried_[slot] = static_cast<std::uint8_t>(&s - socks_.data());
      s.body = slot_ring_.get() + slot * slot_bytes_;
      if (s.frame.length == 0) end_frame(s);
      return;
    }
    case LinkHeader::credit:
      if (std::string why = credit_refusal(s.frame.length, sent_ - acked_); !why.empty()) {
        protocol_error(why);
        return;
      }
      acked_ += s.frame.length;
      s.head_got = 0;
      resume(credit_waiter_);
      return;
    case LinkHeader::bye:
      bye_seen_ = true;
      s.head_got = 0;
      departed_ = departed_now();
      // Waiters re-check: data already here is still delivered; anything more fails.
      fail_waiters_soft();
      return;
    case LinkHeader::abort:
      if (s.frame.length > max_abort_text) {
        protocol_error("abort notice too long");
        return;
      }
      s.text.clear();
      if (s.frame.length == 0) end_frame(s);
      return;
    default:
      protocol_error("unknown frame type " + std::to_string(s.frame.type));
  }
}

void UringTcpConnection::end_frame(Sock& s) {
  s.head_got = 0;
  if (s.frame.type == LinkHeader::abort) {
    close(make_error_code(abort_code(s.frame.fingerprint)),
          "rank " + std::to_string(peer_) + " aborted: " + s.text);
    return;
  }
  const std::size_t slot = s.chunk % slots_;
  sizes_[slot] = static_cast<std::uint32_t>(s.frame.length);
  fingerprints_[slot] = s.frame.fingerprint;
  slot_state_[slot] = Slot::landed;
  // Chunks become visible in put order: one that overtook its predecessor on another socket
  // waits for it.
  bool more = false;
  while (slot_state_[filled_ % slots_] == Slot::landed) {
    slot_state_[filled_ % slots_] = Slot::free;
    ++filled_;
    more = true;
  }
  if (more) resume(recv_waiter_);
}

bool UringTcpConnection::departed_now() const {
  if (!bye_seen_) return false;
  // Socket 0 carried the goodbye after its last chunk; the others are done once they end.
  for (std::size_t i = 1; i < socks_.size(); ++i)
    if (!socks_[i].ended) return false;
  return true;
}

void UringTcpConnection::ended(std::size_t i, int res) {
  if (closed_) return;
  if (bye_seen_) {
    departed_ = departed_now();
    fail_waiters_soft();
    return;
  }
  const std::string what =
      "connection " + (res == 0 ? std::string("End of file") : errno_text(-res));
  if (i == 0) {
    close(make_error_code(errc::peer_lost), lost(what));
    return;
  }
  // The peer's abort notice or goodbye travels on socket 0 and may still be on its way: give it a
  // moment (it names the real cause), then fail anyway.
  linger_.expires_after(std::chrono::milliseconds(200));
  linger_.async_wait([this, pass = gate_.enter(), what](boost::system::error_code e) {
    if (e || !pass.open() || closed_ || bye_seen_) return;
    close(make_error_code(errc::peer_lost), lost(what));
  });
}

void UringTcpConnection::protocol_error(const std::string& what) {
  close(make_error_code(errc::bad_message),
        "rank " + std::to_string(peer_) + ": protocol error: " + what);
}

void UringTcpConnection::enqueue(std::size_t i, std::unique_ptr<Out> o) {
  socks_[i].queue.push_back(std::move(o));
  if (!socks_[i].sending) schedule_sends();
}

void UringTcpConnection::schedule_sends() {
  if (sends_due_ || closed_) return;
  sends_due_ = true;
  asio::post(ex_, [this, pass = gate_.enter()] {
    if (!pass.open()) return;
    sends_due_ = false;
    if (closed_) return;
    bool any = false;
    for (std::size_t i = 0; i < socks_.size(); ++i) any |= send_next(i);
    if (any) submit();
  });
}

bool UringTcpConnection::send_next(std::size_t i) {
  Sock& s = socks_[i];
  // After close(), only the frames it kept to go before its goodbye are sent.
  if (s.sending || s.queue.empty() || (closed_ && !notice_bye_)) return false;
  s.sending = true;
  Out& o = *s.queue.front();
  const auto fd = static_cast<int>(i);
  const auto tag = reinterpret_cast<std::uint64_t>(&o);
  if (o.zc) {
    s.batch = 1;
    // Header then payload, linked so that nothing comes between them on the socket.
    io_uring_sqe* h = sqe();
    io_uring_prep_send(h, fd, &o.header, sizeof o.header, MSG_WAITALL | MSG_MORE | MSG_NOSIGNAL);
    h->flags |= IOSQE_FIXED_FILE | IOSQE_IO_LINK | IOSQE_CQE_SKIP_SUCCESS;
    io_uring_sqe_set_data64(h, tag | tag_header);
    io_uring_sqe* d = sqe();
    io_uring_prep_send_zc(d, fd, o.data, o.size, MSG_WAITALL | MSG_NOSIGNAL, 0);
    d->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(d, tag | tag_send);
  } else {
    // The copied frames at the front go in one SENDMSG (up to 32: 64 iovecs); its completion
    // carries the front frame's tag.
    s.batch = 0;
    s.iov.clear();
    while (s.batch < s.queue.size() && s.batch < 32 && !s.queue[s.batch]->zc) {
      Out& f = *s.queue[s.batch++];
      s.iov.push_back({&f.header, sizeof f.header});
      if (f.size > 0) s.iov.push_back({const_cast<void*>(f.data), f.size});
    }
    s.msg = msghdr{};
    s.msg.msg_iov = s.iov.data();
    s.msg.msg_iovlen = s.iov.size();
    io_uring_sqe* q = sqe();
    io_uring_prep_sendmsg(q, fd, &s.msg, MSG_WAITALL | MSG_NOSIGNAL);
    q->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(q, tag | tag_send);
  }
  ++inflight_;
  return true;
}

void UringTcpConnection::on_sent(Out* o, int res, unsigned flags) {
  --inflight_;
  std::size_t i = 0;
  while (i < socks_.size() && (socks_[i].queue.empty() || socks_[i].queue.front().get() != o)) ++i;
  if (i == socks_.size()) return;  // cannot happen: every send is the front of its socket's queue
  Sock& s = socks_[i];
  s.sending = false;
  const bool zc = o->zc;
  std::size_t expected = 0;
  for (std::size_t k = 0; k < s.batch; ++k)
    expected += zc ? s.queue[k]->size : sizeof(LinkHeader) + s.queue[k]->size;
  const bool failed = res < 0 || static_cast<std::size_t>(res) != expected;
  for (std::size_t k = 0; k < s.batch; ++k) {
    std::unique_ptr<Out> own = std::move(s.queue.front());
    s.queue.pop_front();
    own->failed = failed;
    if (zc && (flags & IORING_CQE_F_MORE)) {
      // The kernel still reads the caller's buffer: the put completes with the notification.
      ++inflight_;
      zc_wait_.push_back(std::move(own));
    } else {
      finish(std::move(own));
    }
  }
  s.batch = 0;
  if (closed_) {
    // close() waited for the frames in flight (and, before a goodbye, every frame it kept) so
    // that its notice lands whole after them.
    if (failed || !notice_bye_) {
      if (i == 0 && !notice_.empty()) finish_close();
    } else if (drained()) {
      finish_close();
    } else if (send_next(i)) {
      submit();
    }
    return;
  }
  if (failed) {
    send_failed(res < 0 ? -res : EPIPE);
    return;
  }
  if (send_next(i)) submit();
}

void UringTcpConnection::on_notified(Out* o) {
  --inflight_;
  auto it = std::find_if(zc_wait_.begin(), zc_wait_.end(),
                         [o](const std::unique_ptr<Out>& w) { return w.get() == o; });
  if (it == zc_wait_.end()) return;
  std::unique_ptr<Out> own = std::move(*it);
  zc_wait_.erase(it);
  finish(std::move(own));
}

void UringTcpConnection::finish(std::unique_ptr<Out> o) {
  if (o->done)
    resume_now(o->done, o->failed ? boost::system::error_code(asio::error::broken_pipe)
                                  : boost::system::error_code());
}

void UringTcpConnection::send_failed(int err) {
  // A peer that said goodbye may be gone before our last credits reach it; that is not a
  // failure.
  if (bye_seen_) {
    for (Sock& s : socks_)
      while (!s.queue.empty() && !(s.sending && s.queue.size() == 1)) {
        finish(std::move(s.queue.back()));
        s.queue.pop_back();
      }
    fail_waiters_soft();
    return;
  }
  // The peer reset the link. Its abort notice, if it sent one, may still be in our receive
  // buffers: give the reaper a moment to deliver it (it names the real cause), then fail anyway.
  linger_.expires_after(std::chrono::milliseconds(200));
  linger_.async_wait(
      [this, pass = gate_.enter(), text = errno_text(err)](boost::system::error_code e) {
        if (e || !pass.open() || closed_) return;
        close(make_error_code(errc::peer_lost), lost("send " + text));
      });
}

asio::awaitable<void> UringTcpConnection::put(const void* src, std::size_t n, std::uint32_t fp) {
  if (n > slot_bytes_) throw LinkError(make_error_code(errc::internal), "put larger than a slot");
  co_await park(credit_waiter_, &UringTcpConnection::can_put);
  if (departed_) fail_departed("was sending to it");
  if (closed_) throw_failure();
  const std::uint64_t k = sent_++;
  const bool copied = n < zc_min_ && n <= copied_put_max;
  // Small puts go on socket 0, so that an operation's frames to this peer (its header, its data)
  // leave in one send; larger ones go round the sockets.
  const std::size_t i = copied ? 0 : striped_++ % socks_.size();
  const LinkHeader header{LinkHeader::put, fp, frame_length(k, n)};
  if (copied) {
    // A small put is copied behind the frames already queued and completes now: the operation
    // goes on to queue its next frames, and they leave together. If the send fails, the link
    // closes and whoever waits on it next learns why.
    auto o = std::unique_ptr<Out>(new Out{header, nullptr, n, Resume()});
    o->copy = copy_payload(src, n);
    o->data = o->copy.get();
    enqueue(i, std::move(o));
    co_return;
  }
  bool failed = false;
  try {
    co_await asio::async_initiate<decltype(asio::use_awaitable), void(boost::system::error_code)>(
        [&](auto handler) {
          auto o = std::unique_ptr<Out>(new Out{header, src, n, Resume(std::move(handler))});
          o->zc = n >= zc_min_;
          enqueue(i, std::move(o));
        },
        asio::use_awaitable);
  } catch (const boost::system::system_error&) {
    failed = true;
  }
  // A failed send closes the link shortly (after the reaper had a chance to deliver the peer's
  // abort notice): wait for that, so the error reported is the real one.
  while (failed && !closed_ && !departed_ && !bye_seen_) {
    try {
      co_await suspend(credit_waiter_);
    } catch (const boost::system::system_error&) {
    }
  }
  if (failed && !closed_) fail_departed("was sending to it");
  if (closed_) throw_failure();
}

asio::awaitable<Chunk> UringTcpConnection::wait() {
  co_await park(recv_waiter_, &UringTcpConnection::can_recv);
  // Chunks that fully arrived are delivered even after the peer left or the link closed: a peer
  // that sent everything and then destroyed its communicator did nothing wrong.
  if (filled_ == consumed_) {
    if (departed_) fail_departed("was waiting for data from it");
    throw_failure();
  }
  const std::size_t slot = consumed_ % slots_;
  ++consumed_;
  co_return Chunk{slot_ring_.get() + slot * slot_bytes_, sizes_[slot], fingerprints_[slot]};
}

void UringTcpConnection::release() {
  // The credit goes back on the socket that carried the chunk: it carries that socket's ACK with
  // it, which a zero-copy send waits for before the kernel lets go of the sender's buffer.
  const std::size_t i = carried_[released_++ % slots_];
  if (closed_ || bye_seen_) return;
  // Credits add up: one still queued behind the sends in flight takes this one too.
  Sock& s = socks_[i];
  for (std::size_t k = s.sending ? s.batch : 0; k < s.queue.size(); ++k)
    if (s.queue[k]->header.type == LinkHeader::credit) {
      ++s.queue[k]->header.length;
      return;
    }
  enqueue(
      i, std::unique_ptr<Out>(new Out{LinkHeader{LinkHeader::credit, 0, 1}, nullptr, 0, Resume()}));
}

void UringTcpConnection::send_abort(std::error_code ec, const std::string& why) {
  if (closed_) return;
  std::string text = why.substr(0, max_abort_text);
  // The peer fails with the same coccl error (a lost rank stays "peer lost" everywhere).
  auto code = ec.category() == error_category() ? static_cast<std::uint32_t>(ec.value())
                                                : static_cast<std::uint32_t>(errc::remote_error);
  LinkHeader h{LinkHeader::abort, code, text.size()};
  notice_.assign(reinterpret_cast<const char*>(&h), sizeof h);
  notice_ += text;
  notice_bye_ = false;
  // The notice must not land inside another frame: while one is in flight on socket 0 it waits
  // for close() to let that frame finish. Non-blocking, so that a stopped peer with a full socket
  // buffer cannot hang an abort.
  if (socks_[0].sending) return;
  (void)::send(socks_[0].fd, notice_.data(), notice_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  notice_.clear();
}

void UringTcpConnection::send_goodbye() {
  if (closed_) return;
  LinkHeader h{LinkHeader::bye, 0, 0};
  if (!drained()) {
    // Frames are in flight or queued (a credit, the data of a put that completed): the goodbye
    // follows them, as an abort notice would (close() lingers for them). Dropped, the peer would
    // read the end of the stream as a lost rank.
    if (notice_.empty()) {
      notice_.assign(reinterpret_cast<const char*>(&h), sizeof h);
      notice_bye_ = true;
    }
    return;
  }
  (void)::send(socks_[0].fd, &h, sizeof h, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void UringTcpConnection::close(std::error_code ec, const std::string& why) {
  if (closed_) return;
  closed_ = true;
  error_ = ec;
  error_text_ = why;
  COCCL_INFO(net, self_, "connection to rank %d closed: %s", peer_, why.c_str());
  for (Sock& s : socks_)
    for (auto& o : s.queue)
      if (o->done) resume_now(o->done, asio::error::operation_aborted);
  for (auto& o : zc_wait_)
    if (o->done) resume_now(o->done, asio::error::operation_aborted);
  fail_waiters();
  if (notice_bye_ && !notice_.empty()) {
    // Before a goodbye, the copied frames go too: their puts have completed, so the peer is owed
    // them. A frame that borrows its caller's memory (its put just failed) and all after it on
    // its socket are dropped.
    for (Sock& s : socks_) {
      std::size_t keep = s.sending ? s.batch : 0;
      while (keep < s.queue.size() && (s.queue[keep]->copy || s.queue[keep]->size == 0)) ++keep;
      s.queue.erase(s.queue.begin() + static_cast<std::ptrdiff_t>(keep), s.queue.end());
    }
    if (drained()) {
      finish_close();
    } else {
      bool any = false;
      for (std::size_t i = 0; i < socks_.size(); ++i) any |= send_next(i);
      if (any) submit();
      linger_.expires_after(std::chrono::seconds(1));
      linger_.async_wait([this, pass = gate_.enter()](boost::system::error_code e) {
        if (!e && pass.open()) finish_close();
      });
    }
  } else if (socks_[0].sending && !notice_.empty()) {
    // Let the frame in flight on socket 0 finish so the abort notice follows it whole; a peer
    // that never drains its socket cannot hold this past a second.
    linger_.expires_after(std::chrono::seconds(1));
    linger_.async_wait([this, pass = gate_.enter()](boost::system::error_code e) {
      if (!e && pass.open()) finish_close();
    });
  } else {
    finish_close();
  }
  report_failure(ec, why);
}

void UringTcpConnection::finish_close() {
  if (finished_) return;
  finished_ = true;
  if (!notice_.empty()) {
    (void)::send(socks_[0].fd, notice_.data(), notice_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    notice_.clear();
  }
  linger_.cancel();
  // Shutting the sockets down ends the receives and any send still in flight; their completions
  // arrive and are dropped (the link is closed).
  for (Sock& s : socks_) ::shutdown(s.fd, SHUT_RDWR);
}

void UringTcpConnection::fail_departed(const char* needed) {
  if (!closed_)
    close(
        make_error_code(errc::peer_lost),
        "rank " + std::to_string(peer_) + " destroyed its communicator while this rank " + needed);
  throw_failure();
}

asio::awaitable<void> UringTcpConnection::suspend(Waiter& slot) {
  co_await asio::async_initiate<decltype(asio::use_awaitable), void(boost::system::error_code)>(
      [&slot](auto handler) { slot.emplace(std::move(handler)); }, asio::use_awaitable);
}

asio::awaitable<void> UringTcpConnection::park(Waiter& slot,
                                               bool (UringTcpConnection::*ready)() const) {
  while (!closed_ && !departed_ && !(this->*ready)()) {
    blocked_since_ = std::chrono::steady_clock::now();
    try {
      co_await suspend(slot);
    } catch (const boost::system::system_error&) {
    }
    blocked_since_.reset();
  }
}

void UringTcpConnection::resume(Waiter& w, boost::system::error_code ec) {
  if (!w) return;
  resume_now(*w, ec);
  w.reset();
}

void UringTcpConnection::resume_now(Resume& r, boost::system::error_code ec) {
  if (!r) return;
  // Through append, not a lambda: a lambda holding an any_completion_handler looks copyable to
  // Asio, and copying one wraps it in itself.
  asio::post(ex_, asio::append(std::move(r), ec));
}

void UringTcpConnection::fail_waiters_soft() {
  resume(recv_waiter_);
  resume(credit_waiter_);
}

void UringTcpConnection::fail_waiters() {
  resume(recv_waiter_, asio::error::operation_aborted);
  resume(credit_waiter_, asio::error::operation_aborted);
}

}  // namespace

std::unique_ptr<Connection> make_uring_connection(int self, int peer,
                                                  std::vector<asio::ip::tcp::socket> sockets,
                                                  UringRingPtr ring, std::size_t slots,
                                                  std::size_t slot_bytes,
                                                  runtime::ProxyThread& thread,
                                                  FailureHandler on_failure) {
  if (sockets.empty() || sockets.size() > max_sockets)
    throw std::system_error(make_error_code(errc::internal), "tcp link socket count");
  return std::make_unique<UringTcpConnection>(self, peer, std::move(sockets), std::move(ring),
                                              slots, slot_bytes, thread, std::move(on_failure));
}

#else  // !COCCL_HAVE_URING

const std::string& uring_unavailable() {
  static const std::string why = "this build has no io_uring support (liburing not found)";
  return why;
}

TcpEngine tcp_engine(int rank) {
  const std::string want = params::tcp_engine.get();
  if (want != "auto" && want != "uring" && want != "asio")
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "COCCL_TCP_ENGINE=" + want + ": expected uring, asio or auto");
  if (want == "uring")
    throw std::system_error(make_error_code(errc::unsupported),
                            "COCCL_TCP_ENGINE=uring, but " + uring_unavailable());
  static std::once_flag logged;
  std::call_once(logged, [rank] {
    COCCL_INFO(net, rank, "tcp engine: asio (%s)", uring_unavailable().c_str());
  });
  return TcpEngine::asio;
}

class UringRing {};
void UringRingDeleter::operator()(UringRing* r) const noexcept { delete r; }

UringRingPtr make_uring_ring(std::string& why) {
  why = uring_unavailable();
  return nullptr;
}

std::unique_ptr<Connection> make_uring_connection(int, int, std::vector<asio::ip::tcp::socket>,
                                                  UringRingPtr, std::size_t, std::size_t,
                                                  runtime::ProxyThread&, FailureHandler) {
  throw std::system_error(make_error_code(errc::unsupported), uring_unavailable());
}

#endif

}  // namespace coccl::transport
