#include "transport/ib.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/error.hpp>
#include <cstring>
#include <numeric>

#include "runtime/log.hpp"
#include "transport/link_setup.hpp"

namespace coccl::params {

config::Param<std::int64_t> ib_qps_per_peer{
    "COCCL_IB_QPS_PER_PEER", 2,
    "data queue pairs per ib connection; a large put is split across them",
    "NCCL_IB_QPS_PER_CONNECTION"};
config::Param<std::int64_t> ib_split_bytes{
    "COCCL_IB_SPLIT_BYTES", 64 << 10,
    "smallest piece of a put split across the queue pairs of an ib connection"};
config::Param<std::int64_t> ib_zcopy_min{
    "COCCL_IB_ZCOPY_MIN", 64 << 10,
    "smallest transfer an ib connection moves as a block: zero-copy when both buffers are "
    "registered (register_buffer), after a rendezvous; every rank must use the same value"};

}  // namespace coccl::params

namespace coccl::transport {

namespace {

// wr_id of send work requests; receives use their buffer index (below 2^32).
constexpr std::uint64_t wr_data = 1ull << 62;  // | queue pair index
constexpr std::uint64_t wr_ctrl = 2ull << 62;
constexpr std::uint64_t wr_block = 3ull << 62;  // | block id << 5 | queue pair index
constexpr std::uint64_t wr_kind = 3ull << 62;
constexpr std::uint64_t wr_qp_mask = 0x1f;
// Channel events are acknowledged in batches (ibv_ack_cq_events takes a mutex).
constexpr unsigned ack_batch = 16;
// The immediate: the put's sequence number (or the block's id) modulo 2^24, then a byte holding
// the piece count, with block_flag set for a block's write.
constexpr std::uint32_t seq_mask = 0xffffff;
constexpr std::uint32_t block_flag = 0x80;
static_assert(ib::max_qps < static_cast<int>(block_flag) && ib::max_qps <= 32);

struct SlotHeader {
  std::uint64_t size;
  std::uint32_t fingerprint;
};
static_assert(sizeof(SlotHeader) <= ib::slot_header);

}  // namespace

IbConnection::IbConnection(int self, int peer, Stream socket, std::unique_ptr<ib::Link> link,
                           std::size_t split_bytes, IbPoller& poller,
                           std::shared_ptr<UserBuffers> buffers, FailureHandler on_failure)
    : SocketConnection(self, peer, std::move(socket), std::move(on_failure)),
      link_(std::move(link)),
      buffers_(std::move(buffers)),
      slots_(link_->slots()),
      slot_bytes_(link_->stride() - ib::slot_header),
      split_bytes_(std::max<std::size_t>(4096, split_bytes)),
      poller_(poller),
      events_(socket_.get_executor(), link_->channel()->fd),
      in_flight_(static_cast<std::size_t>(link_->qps()), 0),
      arrived_(slots_, 0),
      pieces_(slots_, 0) {
  arm();
  watch();
}

IbConnection::~IbConnection() {
  gate_.close();
  poller_.forget(this);
  // The descriptor belongs to the completion channel: give it back before the Link destroys it.
  boost::system::error_code ignored;
  events_.cancel(ignored);
  events_.release();
  // ibv_destroy_cq waits until every event of the queue has been acknowledged.
  if (unacked_events_) link_->verbs().ack_cq_events(link_->cq(), unacked_events_);
}

void IbConnection::watch() {
  events_.async_wait(asio::posix::stream_descriptor::wait_read,
                     [this, pass = gate_.enter()](boost::system::error_code ec) {
                       if (!pass.open() || ec) return;
                       ibv_cq* cq = nullptr;
                       void* context = nullptr;
                       while (link_->verbs().get_cq_event(link_->channel(), &cq, &context) == 0)
                         ++unacked_events_;
                       if (unacked_events_ >= ack_batch) {
                         link_->verbs().ack_cq_events(link_->cq(), unacked_events_);
                         unacked_events_ = 0;
                       }
                       armed_ = false;
                       drain();
                       arm();
                       wake(false);
                       watch();
                     });
}

bool IbConnection::drain() {
  std::array<ibv_wc, 16> wc;
  bool any = false;
  for (;;) {
    int n = ibv_poll_cq(link_->cq(), static_cast<int>(wc.size()), wc.data());
    if (n <= 0) return any;
    any = true;
    for (int i = 0; i < n; ++i) on_completion(wc[i]);
  }
}

bool IbConnection::progress() {
  bool any = drain();
  if (!any) arm();
  return any;
}

void IbConnection::arm() {
  if (armed_ || closed_) return;
  if (ibv_req_notify_cq(link_->cq(), 0) != 0) {
    close(make_error_code(errc::internal),
          "rank " + std::to_string(peer_) + ": ibv_req_notify_cq failed");
    return;
  }
  armed_ = true;
  // A completion that came before the arming raises no event.
  drain();
}

bool IbConnection::check() {
  bool any = progress();
  bool ready = (recv_waiter_ && (closed_ || departed_ || can_recv())) ||
               (credit_waiter_ && (closed_ || departed_ || can_put()));
  if (ready) wake(true);
  return any || ready;
}

void IbConnection::wake(bool now) {
  auto fire = [&](Waiter& w, bool cond) {
    if (!w || !(closed_ || departed_ || cond)) return;
    if (!now) {
      resume(w);
      return;
    }
    // Inline on the poller's latency path; taken out first, as the coroutine may park again.
    Resume h(std::move(*w));
    w.reset();
    std::move(h)(boost::system::error_code{});
  };
  fire(recv_waiter_, can_recv());
  fire(credit_waiter_, can_put());
}

void IbConnection::on_completion(const ibv_wc& wc) {
  if (wc.status != IBV_WC_SUCCESS) {
    on_error(wc);
    return;
  }
  switch (wc.wr_id & wr_kind) {
    case wr_data:
      --in_flight_[wc.wr_id & ~wr_kind];
      return;
    case wr_ctrl:
      --ctrl_in_flight_;
      send_credit();
      flush_control();
      return;
    case wr_block: {
      --in_flight_[wc.wr_id & wr_qp_mask];
      const std::uint64_t id = (wc.wr_id & ~wr_kind) >> 5;
      auto f = std::find_if(flights_.begin(), flights_.end(),
                            [&](const Flight& x) { return x.id == id; });
      if (f != flights_.end() && --f->left == 0) flights_.erase(f);
      return;
    }
    default:
      break;
  }
  // A receive: a piece of a put (RDMA_WRITE_WITH_IMM) or a credit (SEND). The receive goes up
  // again first; the peer's bounds (see Link) guarantee it is there before it is needed.
  const std::size_t index = wc.wr_id;
  if (closed_) return;
  if (!link_->post_recv(index)) post_failed("ibv_post_recv");
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && (ntohl(wc.imm_data) & block_flag)) {
    on_block_write(ntohl(wc.imm_data));
  } else if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    std::uint32_t imm = ntohl(wc.imm_data);
    std::uint64_t seq = released_ + (((imm >> 8) - released_) & seq_mask);
    std::uint32_t pieces = imm & 0xff;
    std::size_t slot = seq % slots_;
    if (seq - released_ >= slots_ || pieces == 0 ||
        pieces > static_cast<std::uint32_t>(link_->qps()) ||
        (pieces_[slot] && pieces_[slot] != pieces) || arrived_[slot] >= pieces) {
      close(make_error_code(errc::bad_message),
            "rank " + std::to_string(peer_) + ": ib protocol error (a write without credit)");
      return;
    }
    pieces_[slot] = pieces;
    ++arrived_[slot];
  } else if (wc.opcode == IBV_WC_RECV && wc.byte_len == sizeof(Control)) {
    Control m;
    std::memcpy(&m, link_->recv_buffer(index), sizeof m);
    on_control(m);
  } else if (wc.opcode == IBV_WC_RECV) {
    std::uint64_t released = 0;
    std::memcpy(&released, link_->recv_buffer(index), sizeof released);
    if (wc.byte_len != sizeof released || released > sent_) {
      close(make_error_code(errc::bad_message),
            "rank " + std::to_string(peer_) + ": ib protocol error (a bad credit)");
      return;
    }
    acked_ = std::max(acked_, released);
  }
}

void IbConnection::on_error(const ibv_wc& wc) {
  // Work requests flushed after a failure complete with an error too: only the first counts.
  if (closed_) return;
  // A peer that said goodbye has destroyed its queue pairs; that is no failure by itself.
  if (departed_) {
    fail_waiters_soft();
    return;
  }
  const std::uint64_t kind = wc.wr_id & wr_kind;
  const char* what = kind == wr_data    ? "RDMA write"
                     : kind == wr_block ? "RDMA write of a block"
                     : kind == wr_ctrl  ? "control send"
                                        : "receive";
  close(make_error_code(errc::peer_lost),
        "lost rank " + std::to_string(peer_) + ": " + what + " completed with status '" +
            link_->verbs().wc_status_str(wc.status) + "' (" + std::to_string(wc.status) +
            ", device " + link_->device().name() + ", queue pair " + std::to_string(wc.qp_num) +
            ")");
}

void IbConnection::post_failed(const char* what) {
  int e = errno;
  close(make_error_code(errc::peer_lost),
        "rank " + std::to_string(peer_) + ": " + what + " failed: " + std::strerror(e));
  throw_failure();
}

bool IbConnection::can_put() const noexcept {
  switch (send_wait_) {
    case SendWait::offer:
      return !grants_.empty();
    case SendWait::write_room:
      return flights_.size() <= ib::block_window;
    case SendWait::flushed:
      return flights_.empty();
    case SendWait::slot:
      break;
  }
  if (sent_ - acked_ >= slots_) return false;
  // Send completions can trail the peer's credits: bound the writes in flight per queue pair
  // as well, so a queue pair's send queue never overflows.
  return std::all_of(in_flight_.begin(), in_flight_.end(),
                     [&](std::size_t n) { return n < slots_; });
}

bool IbConnection::can_recv() const noexcept {
  if (recv_wait_ == RecvWait::block) return !offered_.empty() && offered_.front().settled();
  std::size_t slot = consumed_ % slots_;
  // Every slot may be handed out and not yet released; then the next one is not in yet.
  return consumed_ < released_ + slots_ && pieces_[slot] != 0 && arrived_[slot] == pieces_[slot];
}

asio::awaitable<void> IbConnection::put(const void* src, std::size_t n, std::uint32_t fp) {
  if (n > slot_bytes_) throw LinkError(make_error_code(errc::internal), "put larger than a slot");
  co_await park_for_credit();
  if (departed_) fail_departed("was sending to it");
  if (closed_) throw_failure();
  const std::size_t slot = sent_ % slots_;
  std::byte* stage = link_->send_slot(slot);
  SlotHeader h{n, fp};
  std::memcpy(stage, &h, sizeof h);
  if (n) std::memcpy(stage + ib::slot_header, src, n);
  const std::uint32_t imm = static_cast<std::uint32_t>((sent_ & seq_mask) << 8);
  post_writes(reinterpret_cast<std::uintptr_t>(stage), link_->lkey(), ib::slot_header + n,
              link_->peer_ring() + slot * link_->stride(), link_->peer_rkey(), imm, wr_data);
  ++sent_;
  // Completions are picked up by the poller while someone waits, else by the channel's event.
}

std::size_t IbConnection::post_writes(std::uintptr_t from, std::uint32_t lkey, std::size_t total,
                                      std::uint64_t remote, std::uint32_t rkey, std::uint32_t imm,
                                      std::uint64_t wr_id) {
  // Split so that every piece is at least COCCL_IB_SPLIT_BYTES, one piece per queue pair (and
  // none larger than one RDMA write may be; uses_blocks() keeps blocks within that).
  const std::size_t qps = in_flight_.size();
  const std::size_t count = std::clamp<std::size_t>(
      std::max(total / split_bytes_, (total + ib::max_write_bytes - 1) / ib::max_write_bytes), 1,
      qps);
  const std::size_t piece = ((total + count - 1) / count + 63) / 64 * 64;
  // The least loaded queue pairs take the pieces; ties rotate so that equal load spreads.
  std::vector<std::size_t> order(qps);
  std::iota(order.begin(), order.end(), 0);
  std::rotate(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(next_qp_ % qps),
              order.end());
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return in_flight_[a] < in_flight_[b]; });
  ++next_qp_;
  for (std::size_t i = 0, off = 0; i < count; ++i, off += piece) {
    const std::size_t len = std::min(piece, total - off);
    const std::size_t q = order[i];
    ibv_sge sge{from + off, static_cast<std::uint32_t>(len), lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id | q;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm | static_cast<std::uint32_t>(count));
    wr.wr.rdma.remote_addr = remote + off;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(link_->qp(static_cast<int>(q)), &wr, &bad) != 0) post_failed("ibv_post_send");
    ++in_flight_[q];
  }
  return count;
}

asio::awaitable<Chunk> IbConnection::wait() {
  co_await park_for_data();
  // Chunks that fully arrived are delivered even after the peer left or the link closed.
  if (!can_recv()) {
    if (departed_) fail_departed("was waiting for data from it");
    throw_failure();
  }
  std::byte* data = link_->ring_slot(consumed_ % slots_);
  ++consumed_;
  SlotHeader h;
  std::memcpy(&h, data, sizeof h);
  if (h.size > slot_bytes_) {
    close(make_error_code(errc::bad_message),
          "rank " + std::to_string(peer_) + ": ib protocol error (chunk larger than a slot)");
    throw_failure();
  }
  co_return Chunk{data + ib::slot_header, static_cast<std::size_t>(h.size), h.fingerprint};
}

void IbConnection::release() {
  std::size_t slot = released_ % slots_;
  arrived_[slot] = 0;
  pieces_[slot] = 0;
  ++released_;
  send_credit();
}

void IbConnection::send_credit() {
  if (closed_ || departed_ || credited_ == released_) return;
  // All control buffers in flight: this credit goes with the next control completion (credits
  // are cumulative, so one message covers every release since the last).
  if (ctrl_in_flight_ == ib::ctrl_slots) return;
  if (!post_control(&released_, sizeof released_, "a credit")) return;
  credited_ = released_;
}

bool IbConnection::post_control(const void* msg, std::size_t n, const char* what) {
  std::byte* buf = link_->ctrl_buffer(ctrl_next_++ % ib::ctrl_slots);
  std::memcpy(buf, msg, n);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), static_cast<std::uint32_t>(n), link_->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = wr_ctrl;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(link_->qp(0), &wr, &bad) != 0) {
    int e = errno;
    close(make_error_code(errc::peer_lost), "rank " + std::to_string(peer_) +
                                                ": ibv_post_send of " + what +
                                                " failed: " + std::strerror(e));
    return false;
  }
  ++ctrl_in_flight_;
  return true;
}

// ---- blocks -----------------------------------------------------------------------------------

bool IbConnection::uses_blocks(std::size_t n) const noexcept {
  return n >= link_->block_min() && n <= ib::max_write_bytes * in_flight_.size();
}

std::uint64_t IbConnection::offer(void* dst, std::size_t n, std::uint32_t fingerprint) {
  Offered o{next_offer_id_++, reinterpret_cast<std::uintptr_t>(dst), n, fingerprint,
            buffers_->find(dst, n)};
  offered_.push_back(std::move(o));
  send_offers();
  return offered_.back().id;
}

void IbConnection::send_offers() {
  // The window bounds the offers (and the block writes they allow) the peer can have unprocessed.
  while (offers_sent_ < next_offer_id_ && offers_sent_ < landing_ + ib::block_window + 1) {
    const Offered& o = offered_[offers_sent_ - offered_.front().id];
    Control m{};
    m.type = o.reg ? Control::offer_registered : Control::offer_staged;
    m.fingerprint = o.fingerprint;
    m.id = o.id;
    m.addr = o.addr;
    m.size = o.size;
    m.rkey = o.reg ? o.reg->rkey : 0;
    send_control(m);
    ++offers_sent_;
  }
}

asio::awaitable<bool> IbConnection::landed(std::uint64_t id) {
  if (offered_.empty() || offered_.front().id != id)
    throw LinkError(make_error_code(errc::internal), "ib: blocks landed out of order");
  landing_ = std::max(landing_, id + 1);
  send_offers();
  recv_wait_ = RecvWait::block;
  co_await park_for_data();
  recv_wait_ = RecvWait::chunk;
  // A block that fully arrived is delivered even after the peer left or the link closed.
  if (!offered_.front().settled()) {
    if (departed_) fail_departed("was waiting for a block from it");
    throw_failure();
  }
  const bool direct = offered_.front().reg && !offered_.front().declined;
  offered_.pop_front();
  co_return direct;
}

asio::awaitable<BlockOffer> IbConnection::next_offer() {
  send_wait_ = SendWait::offer;
  co_await park_for_credit();
  send_wait_ = SendWait::slot;
  if (grants_.empty()) {
    if (departed_) fail_departed("was sending to it");
    throw_failure();
  }
  co_return BlockOffer{static_cast<std::size_t>(grants_.front().size), grants_.front().fingerprint};
}

asio::awaitable<bool> IbConnection::write_block(const void* src, std::size_t n) {
  if (grants_.empty() || grants_.front().size != n)
    throw LinkError(make_error_code(errc::internal), "ib: a block written without its offer");
  const Grant g = grants_.front();
  grants_.pop_front();
  std::shared_ptr<const ib::Registration> reg;
  if (g.direct) reg = buffers_->find(src, n);
  if (!reg) {
    // The receiver waits for this block's writes: tell it they will not come.
    if (g.direct) {
      Control m{};
      m.type = Control::decline;
      m.id = g.id;
      send_control(m);
    }
    co_return false;
  }
  send_wait_ = SendWait::write_room;
  co_await park_for_credit();
  send_wait_ = SendWait::slot;
  if (departed_) fail_departed("was sending to it");
  if (closed_) throw_failure();
  const std::size_t pieces = post_writes(
      reinterpret_cast<std::uintptr_t>(src), reg->lkey, n, g.addr, g.rkey,
      static_cast<std::uint32_t>((g.id & seq_mask) << 8) | block_flag, wr_block | (g.id << 5));
  flights_.push_back(Flight{g.id, pieces, std::move(reg)});
  buffers_->count_zero_copy(n);
  co_return true;
}

asio::awaitable<void> IbConnection::flush_blocks() {
  send_wait_ = SendWait::flushed;
  co_await park_for_credit();
  send_wait_ = SendWait::slot;
  if (!flights_.empty()) {
    if (departed_) fail_departed("was sending to it");
    throw_failure();
  }
}

void IbConnection::on_control(const Control& m) {
  switch (m.type) {
    case Control::offer_registered:
    case Control::offer_staged:
      // Offers come in id order, within the window.
      if (m.id != next_grant_id_ || grants_.size() > ib::block_window + 1)
        return protocol_error("an offer out of order");
      grants_.push_back(
          Grant{m.id, m.addr, m.size, m.rkey, m.fingerprint, m.type == Control::offer_registered});
      ++next_grant_id_;
      return;
    case Control::decline: {
      auto o = std::find_if(offered_.begin(), offered_.end(),
                            [&](const Offered& x) { return x.id == m.id; });
      if (o == offered_.end() || o->id >= offers_sent_ || !o->reg || o->declined || o->arrived)
        return protocol_error("a decline of no registered offer");
      o->declined = true;
      return;
    }
    default:
      return protocol_error("an unknown control message");
  }
}

void IbConnection::on_block_write(std::uint32_t imm) {
  const std::uint32_t id = imm >> 8, pieces = imm & (block_flag - 1);
  auto o = std::find_if(offered_.begin(), offered_.end(), [&](const Offered& x) {
    return (x.id & seq_mask) == id && x.id < offers_sent_;
  });
  if (o == offered_.end() || !o->reg || o->declined || pieces == 0 ||
      pieces > static_cast<std::uint32_t>(link_->qps()) || (o->pieces && o->pieces != pieces) ||
      o->arrived >= pieces)
    return protocol_error("a block write without an offer");
  o->pieces = pieces;
  ++o->arrived;
}

void IbConnection::protocol_error(const char* what) {
  close(make_error_code(errc::bad_message),
        "rank " + std::to_string(peer_) + ": ib protocol error (" + what + ")");
}

void IbConnection::send_control(const Control& m) {
  control_queue_.push_back(m);
  flush_control();
}

void IbConnection::flush_control() {
  while (!closed_ && !control_queue_.empty() && ctrl_in_flight_ < ib::ctrl_slots) {
    const Control m = control_queue_.front();
    control_queue_.pop_front();
    if (!post_control(&m, sizeof m, "a control message")) return;
  }
}

namespace {

// An ib link: queue pairs on both ends, their addresses exchanged in the request and reply; the
// dialler confirms once its queue pairs can receive, before the answerer may write.
class IbSetup final : public LinkSetup {
 public:
  IbSetup(const LinkEnv& env, std::size_t slots) : env_(env), slots_(slots) {}

  std::vector<std::uint8_t> offer() override {
    make_link();
    return link_->address().encode();
  }
  std::vector<std::uint8_t> accept(std::span<const std::uint8_t> theirs) override {
    make_link();
    link_->connect(ib::LinkAddress::decode(theirs));
    return link_->address().encode();
  }
  void complete(std::span<const std::uint8_t> theirs) override {
    link_->connect(ib::LinkAddress::decode(theirs));
  }
  bool confirms() const override { return true; }
  std::unique_ptr<Connection> make(int peer, Stream control, std::vector<Stream> further) override {
    if (!further.empty())
      throw std::system_error(make_error_code(errc::internal), "an ib link has one socket");
    const std::size_t split =
        static_cast<std::size_t>(std::max<std::int64_t>(4096, params::ib_split_bytes.get()));
    auto c =
        std::make_unique<IbConnection>(env_.rank, peer, std::move(control), std::move(link_), split,
                                       *env_.ib_poller, env_.user_buffers, env_.on_failure);
    c->start();
    return c;
  }

 private:
  void make_link() {
    const int qps = static_cast<int>(params::ib_qps_per_peer.get());
    const std::size_t block_min =
        static_cast<std::size_t>(std::max<std::int64_t>(4096, params::ib_zcopy_min.get()));
    link_ = std::make_unique<ib::Link>(env_.ib_device, slots_, env_.slot_bytes, qps, block_min);
  }

  LinkEnv env_;
  std::size_t slots_;
  std::unique_ptr<ib::Link> link_;
};

}  // namespace

std::unique_ptr<LinkSetup> make_ib_setup(const LinkEnv& env, std::size_t slots) {
  return std::make_unique<IbSetup>(env, slots);
}

}  // namespace coccl::transport
