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

#include "transport/tcp.hpp"
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
// Entries of a link's table of registered buffers: distinct user buffers it sends from.
constexpr unsigned fixed_slots = 32;

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

// Socket 0 is the TcpConnection's own: Asio's reactor reads it, and the fast path of small
// operations reads and writes it directly from whichever thread holds the proxy thread's role
// (the ring takes submissions from the proxy thread alone, so a socket of the ring could not be
// used there). Small puts, credits for its chunks, abort and goodbye notices travel on it. The
// lanes, sockets 1 and up, belong to the ring: each has a multishot receive into its provided
// buffers, and large puts go round socket 0 and the lanes.
class UringTcpConnection final : public TcpConnection, public runtime::Poller {
 public:
  UringTcpConnection(int self, int peer, Stream control, std::vector<asio::ip::tcp::socket> lanes,
                     UringRingPtr ring, std::size_t slots, std::size_t slot_bytes,
                     runtime::ProxyThread& thread, std::shared_ptr<UserBuffers> user_buffers,
                     FailureHandler on_failure);
  ~UringTcpConnection() override;

  void release() override;
  void close(std::error_code ec, const std::string& why) override;
  // The fast path reads socket 0 alone (the lanes are reaped by the proxy thread): the puts it
  // moves are those that travel there, below the zero-copy size too. Both ends agree where they
  // run with the same COCCL_TCP_ZC_MIN; where they do not, a fast operation waiting for a chunk
  // that took a lane hands over when its spin ends.
  std::size_t poll_bytes() const noexcept override {
    return std::min(TcpConnection::poll_bytes(), zc_min_ - 1);
  }
  bool settled() const noexcept override {
    return TcpConnection::settled() && zc_wait_.empty() && lanes_idle();
  }
  bool poll() override {
    if (!fixed_.empty()) drop_ended_registrations();
    return reap() > 0;
  }
  // The ring takes submissions and runs its deferred completions on the thread that enabled it.
  bool thread_bound() const override { return ring_ && ring_->deferred; }
  bool waiting() const override {
    return recv_waiter_ || credit_waiter_ || !zc_wait_.empty() ||
           std::any_of(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.sending; });
  }

 private:
  // A frame to send on a lane: a large put (borrowing the caller's buffer until its completion)
  // or a credit. Heap-allocated and kept until its last completion: the kernel reads the header
  // (and the iovecs) from here.
  struct Out {
    LinkHeader header;
    const void* data;
    std::size_t size;
    Resume done;  // resumes the put; empty for credits
    bool zc = false;
    bool fixed = false;  // sent from the ring's registered buffers
    bool failed = false;
  };
  // An entry of the ring's table of registered buffers: the user registration it holds (0 for a
  // free entry), or one the kernel refused to register, kept so that it is not tried again.
  struct Fixed {
    std::uint64_t handle = 0;
    bool refused = false;
  };
  struct Lane {
    int fd = -1;
    // Receive: the provided buffers and the frame being parsed.
    io_uring_buf_ring* buf_ring = nullptr;
    std::unique_ptr<std::byte[]> buffers;
    std::array<std::byte, sizeof(LinkHeader)> head{};
    std::size_t head_got = 0;
    LinkHeader frame{};
    std::size_t body_got = 0;
    std::size_t slot = 0;  // of the put being received
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
  static constexpr std::size_t no_slot = static_cast<std::size_t>(-1);

  void enqueue_put(const LinkHeader& h, const void* src, std::size_t n, Resume done) override;
  std::size_t slot_for(const LinkHeader& h) override;
  void land(std::size_t slot, std::uint32_t size, std::uint32_t fingerprint) override;
  void on_goodbye() override;
  // The slot of the put whose framed length is `length`, arriving on `socket`, marked as being
  // received; no_slot where the put is outside the window of credited slots or its slot is taken.
  std::size_t claim(std::uint64_t length, std::size_t socket);

  io_uring* uring() { return &ring_->ring; }
  io_uring_sqe* sqe();
  void submit();
  void arm(std::size_t j);
  void arm_event();
  std::size_t reap();
  void handle(std::uint64_t data, int res, unsigned flags);
  void on_recv(std::size_t j, int res, unsigned flags);
  void consume(std::size_t j, const std::byte* p, std::size_t n);
  void begin_frame(std::size_t j);
  void end_frame(Lane& l);
  void ended(std::size_t j, int res);
  void protocol_error(const std::string& what);
  void on_sent(Out* o, int res, unsigned flags);
  void on_notified(Out* o);
  void finish(std::unique_ptr<Out> o);
  void send_failed(int res);
  void enqueue_lane(std::size_t j, std::unique_ptr<Out> o);
  // Starts the sends of every lane with frames queued and none in flight, in one submission,
  // once the handler queuing them returns.
  void schedule_sends();
  // Prepares the next send of lane j, if it has frames and none in flight; true if it did.
  bool send_next(std::size_t j);
  bool lanes_idle() const noexcept {
    return std::all_of(lanes_.begin(), lanes_.end(),
                       [](const Lane& l) { return !l.sending && l.queue.empty(); });
  }
  // After a goodbye on socket 0: every lane has ended too, so nothing more will come.
  bool departed_now() const noexcept {
    return std::all_of(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.ended; });
  }
  void release_resources();
  // The index in the ring's buffer table of the user registration covering [p, p+n), registered
  // there on first use; -1 where none covers it or the kernel refused it.
  int fixed_index(const void* p, std::size_t n);
  // Empties the table's entries whose user registration has ended.
  void drop_ended_registrations();
  std::string lost(const std::string& what) const {
    return "lost rank " + std::to_string(peer_) + " (" + what + ")";
  }

  UringRingPtr ring_;
  asio::posix::stream_descriptor event_;
  std::uint64_t event_value_ = 0;
  asio::steady_timer lane_linger_;
  std::vector<Lane> lanes_;  // lane j is socket j + 1, file j of the ring
  std::size_t zc_min_;
  std::size_t inflight_ = 0;                  // completions still to come that refer to our memory
  std::deque<std::unique_ptr<Out>> zc_wait_;  // sent zero-copy, notification not yet in
  // Per slot: free (its chunk counted in filled_, or not arrived), being received, or landed and
  // waiting for the chunks before it; and the socket its chunk came on (its credit goes back
  // there, with that socket's ACK, which a zero-copy send waits for).
  enum class Slot : std::uint8_t { free, receiving, landed };
  std::vector<Slot> slot_state_;
  std::vector<std::uint8_t> carried_;
  std::uint64_t striped_ = 0;  // large puts sent, which go round the sockets
  bool sends_due_ = false;     // schedule_sends() posted a submission that has not run
  runtime::Gate lanes_gate_;   // closed by the destructor: handlers still queued then do nothing
  std::shared_ptr<UserBuffers> user_buffers_;
  std::vector<Fixed> fixed_;    // the ring's buffer table, made on first use
  bool fixed_refused_ = false;  // the kernel refused the table itself
  std::uint64_t removals_seen_ = 0;
};

UringTcpConnection::UringTcpConnection(int self, int peer, Stream control,
                                       std::vector<asio::ip::tcp::socket> lanes, UringRingPtr ring,
                                       std::size_t slots, std::size_t slot_bytes,
                                       runtime::ProxyThread& thread,
                                       std::shared_ptr<UserBuffers> user_buffers,
                                       FailureHandler on_failure)
    : TcpConnection(self, peer, std::move(control), slots, slot_bytes, std::move(on_failure),
                    &thread),
      ring_(std::move(ring)),
      event_(thread.executor()),
      lane_linger_(thread.executor()),
      lanes_(lanes.size()),
      zc_min_(static_cast<std::size_t>(std::max<std::int64_t>(1, params::tcp_zc_min.get()))),
      slot_state_(slots, Slot::free),
      carried_(slots, 0),
      user_buffers_(std::move(user_buffers)) {
  put_index_ = true;
  std::vector<int> fds;
  for (std::size_t j = 0; j < lanes.size(); ++j) {
    boost::system::error_code ignored;
    lanes[j].set_option(asio::ip::tcp::no_delay(true), ignored);
    lanes_[j].fd = lanes[j].release();
    fds.push_back(lanes_[j].fd);
  }
  // A constructor that throws runs no destructor: give back what was taken so far.
  auto fail = [this](int err, const char* what) {
    release_resources();
    throw std::system_error(err, std::system_category(), what);
  };
  int e = io_uring_register_files(uring(), fds.data(), static_cast<unsigned>(fds.size()));
  if (e < 0) fail(-e, "io_uring_register_files");
  for (std::size_t j = 0; j < lanes_.size(); ++j) {
    Lane& l = lanes_[j];
    void* mem =
        ::mmap(nullptr, buf_ring_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) fail(errno, "mmap");
    l.buf_ring = static_cast<io_uring_buf_ring*>(mem);
    io_uring_buf_reg reg{};
    reg.ring_addr = reinterpret_cast<std::uint64_t>(mem);
    reg.ring_entries = buffers_per_socket;
    reg.bgid = static_cast<std::uint16_t>(j);
    e = io_uring_register_buf_ring(uring(), &reg, 0);
    if (e < 0) fail(-e, "io_uring_register_buf_ring");
    l.buffers.reset(new std::byte[buffers_per_socket * buffer_bytes]);
    io_uring_buf_ring_init(l.buf_ring);
    const int mask = io_uring_buf_ring_mask(buffers_per_socket);
    for (unsigned b = 0; b < buffers_per_socket; ++b)
      io_uring_buf_ring_add(l.buf_ring, l.buffers.get() + b * buffer_bytes, buffer_bytes,
                            static_cast<unsigned short>(b), mask, static_cast<int>(b));
    io_uring_buf_ring_advance(l.buf_ring, buffers_per_socket);
  }
  // The ring's one submitter is the thread that enables it: this one, the link's proxy thread
  // (Peers makes its links there, and every operation of the link runs there).
  if (ring_->deferred) {
    e = io_uring_enable_rings(uring());
    if (e < 0) fail(-e, "io_uring_enable_rings");
  }
  event_.assign(::dup(ring_->event_fd));
  loop_->add_poller(this);
  for (std::size_t j = 0; j < lanes_.size(); ++j) arm(j);
  submit();
  arm_event();
}

UringTcpConnection::~UringTcpConnection() {
  lanes_gate_.close();
  loop_->remove_poller(this);
  boost::system::error_code ignored;
  event_.close(ignored);
  for (Lane& l : lanes_)
    if (l.fd >= 0) ::shutdown(l.fd, SHUT_RDWR);
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
  for (Lane& l : lanes_) {
    if (l.buf_ring) ::munmap(l.buf_ring, buf_ring_bytes);
    if (l.fd >= 0) ::close(l.fd);
    l.buf_ring = nullptr;
    l.fd = -1;
  }
}

std::size_t UringTcpConnection::claim(std::uint64_t length, std::size_t socket) {
  // The index names the put's place in put order, read against the window of slots this side
  // credited; a peer that ignores credits, sends a chunk twice or sends oversized frames is
  // broken.
  const auto seq = static_cast<std::uint32_t>(length >> 32);
  const std::uint64_t chunk =
      filled_ + static_cast<std::uint32_t>(seq - static_cast<std::uint32_t>(filled_));
  const std::size_t slot = chunk % slots_;
  if ((length & 0xffffffffu) > slot_bytes_ || chunk - released_ >= slots_ ||
      slot_state_[slot] != Slot::free)
    return no_slot;
  slot_state_[slot] = Slot::receiving;
  carried_[slot] = static_cast<std::uint8_t>(socket);
  return slot;
}

std::size_t UringTcpConnection::slot_for(const LinkHeader& h) {
  const std::size_t slot = claim(h.length, 0);
  if (slot == no_slot)
    throw std::system_error(make_error_code(errc::bad_message), "put without credit");
  return slot;
}

void UringTcpConnection::land(std::size_t slot, std::uint32_t size, std::uint32_t fingerprint) {
  filled_info_[slot] = SlotInfo{size, fingerprint};
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

void UringTcpConnection::on_goodbye() {
  // Socket 0 carried the goodbye after its last chunk; a lane is done once it ends.
  departed_ = departed_now();
  fail_waiters_soft();
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

void UringTcpConnection::arm(std::size_t j) {
  io_uring_sqe* q = sqe();
  io_uring_prep_recv_multishot(q, static_cast<int>(j), nullptr, 0, 0);
  q->flags |= IOSQE_FIXED_FILE | IOSQE_BUFFER_SELECT;
  q->buf_group = static_cast<std::uint16_t>(j);
  io_uring_sqe_set_data64(q, (static_cast<std::uint64_t>(j) << 3) | tag_recv);
  lanes_[j].armed = true;
  ++inflight_;
}

void UringTcpConnection::arm_event() {
  event_.async_read_some(
      asio::buffer(&event_value_, sizeof event_value_),
      [this, pass = lanes_gate_.enter()](boost::system::error_code ec, std::size_t) {
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

void UringTcpConnection::on_recv(std::size_t j, int res, unsigned flags) {
  Lane& l = lanes_[j];
  if (!(flags & IORING_CQE_F_MORE)) {
    l.armed = false;
    --inflight_;
  }
  if (flags & IORING_CQE_F_BUFFER) {
    const unsigned bid = flags >> IORING_CQE_BUFFER_SHIFT;
    std::byte* buf = l.buffers.get() + static_cast<std::size_t>(bid) * buffer_bytes;
    if (res > 0) consume(j, buf, static_cast<std::size_t>(res));
    // Parsing copied everything out: the buffer goes straight back to the kernel.
    io_uring_buf_ring_add(l.buf_ring, buf, buffer_bytes, static_cast<unsigned short>(bid),
                          io_uring_buf_ring_mask(buffers_per_socket), 0);
    io_uring_buf_ring_advance(l.buf_ring, 1);
  }
  if (res > 0 || res == -ENOBUFS) {
    // A multishot receive ends when the provided buffers ran out (or the kernel chose to): re-arm.
    if (!l.armed && !closed_ && !l.ended) {
      arm(j);
      submit();
    }
    return;
  }
  l.ended = true;
  ended(j, res);
}

void UringTcpConnection::consume(std::size_t j, const std::byte* p, std::size_t n) {
  Lane& l = lanes_[j];
  while (n > 0 && !closed_) {
    if (l.head_got < l.head.size()) {
      const std::size_t take = std::min(n, l.head.size() - l.head_got);
      std::memcpy(l.head.data() + l.head_got, p, take);
      l.head_got += take;
      p += take;
      n -= take;
      if (l.head_got == l.head.size()) {
        std::memcpy(&l.frame, l.head.data(), sizeof l.frame);
        l.body_got = 0;
        begin_frame(j);
      }
      continue;
    }
    const std::size_t take = std::min<std::size_t>(n, l.frame.length - l.body_got);
    std::memcpy(slot_data(l.slot, l.frame.length) + l.body_got, p, take);
    l.body_got += take;
    p += take;
    n -= take;
    if (l.body_got == l.frame.length) end_frame(l);
  }
}

void UringTcpConnection::begin_frame(std::size_t j) {
  Lane& l = lanes_[j];
  switch (l.frame.type) {
    case LinkHeader::put:
      // The sender holds a credit for this chunk's slot, so it is free.
      l.slot = claim(l.frame.length, j + 1);
      if (l.slot == no_slot) {
        protocol_error("put without credit");
        return;
      }
      l.frame.length &= 0xffffffffu;
      if (l.frame.length == 0) end_frame(l);
      return;
    case LinkHeader::credit:
      if (std::string why = credit_refusal(l.frame.length, sent_ - acked_); !why.empty()) {
        protocol_error(why);
        return;
      }
      acked_ += l.frame.length;
      l.head_got = 0;
      resume(credit_waiter_);
      return;
    default:
      // Notices travel on socket 0.
      protocol_error("frame of type " + std::to_string(l.frame.type) + " on socket " +
                     std::to_string(j + 1));
  }
}

void UringTcpConnection::end_frame(Lane& l) {
  l.head_got = 0;
  land(l.slot, static_cast<std::uint32_t>(l.frame.length), l.frame.fingerprint);
}

void UringTcpConnection::ended(std::size_t j, int res) {
  if (closed_) return;
  if (bye_seen_) {
    departed_ = departed_now();
    fail_waiters_soft();
    return;
  }
  const std::string what = "connection on socket " + std::to_string(j + 1) + " " +
                           (res == 0 ? std::string("End of file") : errno_text(-res));
  // The peer's abort notice or goodbye travels on socket 0 and may still be on its way: give it a
  // moment (it names the real cause), then fail anyway.
  lane_linger_.expires_after(std::chrono::milliseconds(200));
  lane_linger_.async_wait([this, pass = lanes_gate_.enter(), what](boost::system::error_code e) {
    if (e || !pass.open() || closed_ || bye_seen_) return;
    close(make_error_code(errc::peer_lost), lost(what));
  });
}

void UringTcpConnection::protocol_error(const std::string& what) {
  close(make_error_code(errc::bad_message),
        "rank " + std::to_string(peer_) + ": protocol error: " + what);
}

void UringTcpConnection::enqueue_lane(std::size_t j, std::unique_ptr<Out> o) {
  lanes_[j].queue.push_back(std::move(o));
  if (!lanes_[j].sending) schedule_sends();
}

void UringTcpConnection::schedule_sends() {
  if (sends_due_ || closed_) return;
  sends_due_ = true;
  // Posted: a credit released by a thread that borrowed the proxy thread's role (the fast path)
  // is sent by the proxy thread, the ring's one submitter.
  asio::post(loop_->executor(), [this, pass = lanes_gate_.enter()] {
    if (!pass.open()) return;
    sends_due_ = false;
    if (closed_) return;
    bool any = false;
    for (std::size_t j = 0; j < lanes_.size(); ++j) any |= send_next(j);
    if (any) submit();
  });
}

bool UringTcpConnection::send_next(std::size_t j) {
  Lane& l = lanes_[j];
  if (l.sending || l.queue.empty() || closed_) return false;
  l.sending = true;
  Out& o = *l.queue.front();
  const auto fd = static_cast<int>(j);
  const auto tag = reinterpret_cast<std::uint64_t>(&o);
  if (o.zc) {
    l.batch = 1;
    // Header then payload, linked so that nothing comes between them on the socket.
    io_uring_sqe* h = sqe();
    io_uring_prep_send(h, fd, &o.header, sizeof o.header, MSG_WAITALL | MSG_MORE | MSG_NOSIGNAL);
    h->flags |= IOSQE_FIXED_FILE | IOSQE_IO_LINK | IOSQE_CQE_SKIP_SUCCESS;
    io_uring_sqe_set_data64(h, tag | tag_header);
    const int index = fixed_index(o.data, o.size);
    o.fixed = index >= 0;
    io_uring_sqe* d = sqe();
    if (o.fixed)
      io_uring_prep_send_zc_fixed(d, fd, o.data, o.size, MSG_WAITALL | MSG_NOSIGNAL, 0,
                                  static_cast<unsigned>(index));
    else
      io_uring_prep_send_zc(d, fd, o.data, o.size, MSG_WAITALL | MSG_NOSIGNAL, 0);
    d->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(d, tag | tag_send);
  } else {
    // The copying frames at the front go in one SENDMSG (up to 32: 64 iovecs); its completion
    // carries the front frame's tag.
    l.batch = 0;
    l.iov.clear();
    while (l.batch < l.queue.size() && l.batch < 32 && !l.queue[l.batch]->zc) {
      Out& f = *l.queue[l.batch++];
      l.iov.push_back({&f.header, sizeof f.header});
      if (f.size > 0) l.iov.push_back({const_cast<void*>(f.data), f.size});
    }
    l.msg = msghdr{};
    l.msg.msg_iov = l.iov.data();
    l.msg.msg_iovlen = l.iov.size();
    io_uring_sqe* q = sqe();
    io_uring_prep_sendmsg(q, fd, &l.msg, MSG_WAITALL | MSG_NOSIGNAL);
    q->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(q, tag | tag_send);
  }
  ++inflight_;
  return true;
}

void UringTcpConnection::on_sent(Out* o, int res, unsigned flags) {
  --inflight_;
  std::size_t j = 0;
  while (j < lanes_.size() && (lanes_[j].queue.empty() || lanes_[j].queue.front().get() != o)) ++j;
  if (j == lanes_.size()) return;  // cannot happen: every send is the front of its lane's queue
  Lane& l = lanes_[j];
  l.sending = false;
  const bool zc = o->zc;
  std::size_t expected = 0;
  for (std::size_t k = 0; k < l.batch; ++k)
    expected += zc ? l.queue[k]->size : sizeof(LinkHeader) + l.queue[k]->size;
  const bool failed = res < 0 || static_cast<std::size_t>(res) != expected;
  for (std::size_t k = 0; k < l.batch; ++k) {
    std::unique_ptr<Out> own = std::move(l.queue.front());
    l.queue.pop_front();
    own->failed = failed;
    if (zc && (flags & IORING_CQE_F_MORE)) {
      // The kernel still reads the caller's buffer: the put completes with the notification.
      ++inflight_;
      zc_wait_.push_back(std::move(own));
    } else {
      finish(std::move(own));
    }
  }
  l.batch = 0;
  if (closed_) return;
  if (failed) {
    send_failed(res < 0 ? -res : EPIPE);
    return;
  }
  if (send_next(j)) submit();
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
  if (o->fixed && !o->failed) user_buffers_->count_zero_copy(o->size);
  if (o->done)
    resume_now(o->done, o->failed ? boost::system::error_code(asio::error::broken_pipe)
                                  : boost::system::error_code());
}

int UringTcpConnection::fixed_index(const void* p, std::size_t n) {
  if (!user_buffers_ || fixed_refused_) return -1;
  drop_ended_registrations();
  const UserBuffers::Range r = user_buffers_->range_of(p, n);
  if (r.handle == 0) return -1;
  for (std::size_t k = 0; k < fixed_.size(); ++k)
    if (fixed_[k].handle == r.handle) return fixed_[k].refused ? -1 : static_cast<int>(k);
  if (fixed_.empty()) {
    // Sparse: entries are filled one by one as buffers are first sent from.
    if (int e = io_uring_register_buffers_sparse(uring(), fixed_slots); e < 0) {
      fixed_refused_ = true;
      COCCL_INFO(net, self_, "link to rank %d: no registered buffers on its io_uring (%s)", peer_,
                 errno_text(-e).c_str());
      return -1;
    }
    fixed_.resize(fixed_slots);
  }
  auto entry = std::find_if(fixed_.begin(), fixed_.end(), [](const Fixed& f) { return !f.handle; });
  // A full table: this buffer's pages are pinned per send, as an unregistered buffer's are.
  if (entry == fixed_.end()) return -1;
  const auto k = static_cast<unsigned>(entry - fixed_.begin());
  iovec iov{reinterpret_cast<void*>(r.begin), r.end - r.begin};
  __u64 tag = 0;
  entry->handle = r.handle;
  if (int e = io_uring_register_buffers_update_tag(uring(), k, &iov, &tag, 1); e < 0) {
    entry->refused = true;
    COCCL_INFO(net, self_,
               "link to rank %d: io_uring refused a registered buffer of %zu bytes (%s); its "
               "zero-copy sends pin it per send",
               peer_, iov.iov_len, errno_text(-e).c_str());
    return -1;
  }
  return static_cast<int>(k);
}

void UringTcpConnection::drop_ended_registrations() {
  const std::uint64_t removals = user_buffers_->removals();
  if (removals == removals_seen_) return;
  removals_seen_ = removals;
  for (std::size_t k = 0; k < fixed_.size(); ++k) {
    Fixed& f = fixed_[k];
    if (!f.handle || user_buffers_->holds(f.handle)) continue;
    // The user may free the memory now. Sends still in flight from the entry keep its pages
    // until they complete (the kernel holds a reference); the table lets go of them here.
    if (!f.refused) {
      iovec none{nullptr, 0};
      __u64 tag = 0;
      io_uring_register_buffers_update_tag(uring(), static_cast<unsigned>(k), &none, &tag, 1);
    }
    f = Fixed{};
  }
}

void UringTcpConnection::send_failed(int err) {
  // A peer that said goodbye may be gone before our last credits reach it; that is not a
  // failure. A put still queued to it fails (put() then names the departure).
  if (bye_seen_) {
    for (Lane& l : lanes_)
      while (!l.queue.empty() && !(l.sending && l.queue.size() == l.batch)) {
        l.queue.back()->failed = true;
        finish(std::move(l.queue.back()));
        l.queue.pop_back();
      }
    fail_waiters_soft();
    return;
  }
  // The peer reset the link. Its abort notice, if it sent one, may still be on its way on socket
  // 0: give the reader a moment to deliver it (it names the real cause), then fail anyway.
  lane_linger_.expires_after(std::chrono::milliseconds(200));
  lane_linger_.async_wait(
      [this, pass = lanes_gate_.enter(), text = errno_text(err)](boost::system::error_code e) {
        if (e || !pass.open() || closed_) return;
        close(make_error_code(errc::peer_lost), lost("send " + text));
      });
}

void UringTcpConnection::enqueue_put(const LinkHeader& h, const void* src, std::size_t n,
                                     Resume done) {
  // A put the fast path may wait for stays on socket 0 (so does an operation's header: its frames
  // to this peer then leave in one write); larger ones go round socket 0 and the lanes (on socket
  // 0 they are written as on the Asio engine).
  const std::size_t socket = n <= poll_bytes() ? 0 : striped_++ % (lanes_.size() + 1);
  if (socket == 0) {
    TcpConnection::enqueue_put(h, src, n, std::move(done));
    return;
  }
  auto o = std::unique_ptr<Out>(new Out{h, src, n, std::move(done)});
  o->zc = n >= zc_min_;
  enqueue_lane(socket - 1, std::move(o));
}

void UringTcpConnection::release() {
  // The credit goes back on the socket that carried the chunk: it carries that socket's ACK with
  // it, which a zero-copy send waits for before the kernel lets go of the sender's buffer.
  const std::size_t socket = carried_[released_ % slots_];
  if (socket == 0) {
    TcpConnection::release();
    return;
  }
  ++released_;
  if (closed_ || bye_seen_) return;
  // Credits add up: one still queued behind the sends in flight takes this one too.
  Lane& l = lanes_[socket - 1];
  for (std::size_t k = l.sending ? l.batch : 0; k < l.queue.size(); ++k)
    if (l.queue[k]->header.type == LinkHeader::credit) {
      ++l.queue[k]->header.length;
      return;
    }
  enqueue_lane(socket - 1, std::unique_ptr<Out>(new Out{LinkHeader{LinkHeader::credit, 0, 1},
                                                        nullptr, 0, Resume()}));
}

void UringTcpConnection::close(std::error_code ec, const std::string& why) {
  if (closed_) return;
  // The lanes' puts fail and the lanes end now; the peer reads their end as this side's going,
  // once socket 0's notice (abort or goodbye) names it, or as a loss 200 ms later.
  for (Lane& l : lanes_) {
    for (auto& o : l.queue)
      if (o->done) resume_now(o->done, asio::error::operation_aborted);
    l.queue.erase(l.queue.begin() + static_cast<std::ptrdiff_t>(l.sending ? l.batch : 0),
                  l.queue.end());
    ::shutdown(l.fd, SHUT_RDWR);
  }
  for (auto& o : zc_wait_)
    if (o->done) resume_now(o->done, asio::error::operation_aborted);
  lane_linger_.cancel();
  TcpConnection::close(ec, why);
}

}  // namespace

std::unique_ptr<Connection> make_uring_connection(
    int self, int peer, Stream control, std::vector<asio::ip::tcp::socket> lanes, UringRingPtr ring,
    std::size_t slots, std::size_t slot_bytes, runtime::ProxyThread& thread,
    std::shared_ptr<UserBuffers> user_buffers, FailureHandler on_failure) {
  if (!control.tcp() || lanes.empty() || lanes.size() + 1 > max_sockets)
    throw std::system_error(make_error_code(errc::internal), "tcp link socket count");
  auto c = std::make_unique<UringTcpConnection>(self, peer, std::move(control), std::move(lanes),
                                                std::move(ring), slots, slot_bytes, thread,
                                                std::move(user_buffers), std::move(on_failure));
  c->start();
  return c;
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

std::unique_ptr<Connection> make_uring_connection(int, int, Stream,
                                                  std::vector<asio::ip::tcp::socket>, UringRingPtr,
                                                  std::size_t, std::size_t, runtime::ProxyThread&,
                                                  std::shared_ptr<UserBuffers>, FailureHandler) {
  throw std::system_error(make_error_code(errc::unsupported), uring_unavailable());
}

#endif

}  // namespace coccl::transport
