#include "transport/ib.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/error.hpp>
#include <cstring>
#include <numeric>

#include "runtime/log.hpp"

namespace coccl::transport {

namespace {

// wr_id of send work requests; receives use their buffer index (below 2^32).
constexpr std::uint64_t wr_data = 1ull << 62;  // | queue pair index
constexpr std::uint64_t wr_ctrl = 2ull << 62;
constexpr std::uint64_t wr_kind = 3ull << 62;
// Channel events are acknowledged in batches (ibv_ack_cq_events takes a mutex).
constexpr unsigned ack_batch = 16;
// The immediate: the put's sequence number modulo 2^24, then the piece count.
constexpr std::uint32_t seq_mask = 0xffffff;

struct SlotHeader {
  std::uint64_t size;
  std::uint32_t fingerprint;
};
static_assert(sizeof(SlotHeader) <= ib::slot_header);

}  // namespace

bool IbPoller::poll() {
  // As in ShmPoller: resumed coroutines may re-activate connections, so scan a snapshot.
  if (active_.empty()) return false;
  scan_.swap(active_);
  active_.clear();
  bool progress = false;
  for (IbConnection* c : scan_) {
    if (c->check()) progress = true;
    // A connection leaves the list armed: its completions (credits, send completions) must
    // still be processed when nobody waits on it.
    if (c->has_waiter())
      activate(c);
    else
      c->arm();
  }
  scan_.clear();
  return progress;
}

bool IbPoller::waiting() const {
  // An armed connection wakes the event loop through its channel: the thread may sleep.
  return std::any_of(active_.begin(), active_.end(),
                     [](const IbConnection* c) { return !c->armed(); });
}

void IbPoller::activate(IbConnection* c) {
  if (std::find(active_.begin(), active_.end(), c) == active_.end()) active_.push_back(c);
}

void IbPoller::forget(IbConnection* c) {
  active_.erase(std::remove(active_.begin(), active_.end(), c), active_.end());
  scan_.erase(std::remove(scan_.begin(), scan_.end(), c), scan_.end());
}

IbConnection::IbConnection(int self, int peer, asio::ip::tcp::socket socket,
                           std::unique_ptr<ib::Link> link, std::size_t split_bytes,
                           IbPoller& poller, FailureHandler on_failure)
    : SocketConnection(self, peer, std::move(socket), std::move(on_failure)),
      link_(std::move(link)),
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
  *alive_ = false;
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
                     [this, alive = alive_](boost::system::error_code ec) {
                       if (!*alive || ec) return;
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
      return;
    default:
      break;
  }
  // A receive: a piece of a put (RDMA_WRITE_WITH_IMM) or a credit (SEND). The receive goes up
  // again first; the peer's bounds (see Link) guarantee it is there before it is needed.
  const std::size_t index = wc.wr_id;
  if (closed_) return;
  if (!link_->post_recv(index)) post_failed("ibv_post_recv");
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
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
  const char* what = (wc.wr_id & wr_kind) == wr_data   ? "RDMA write"
                     : (wc.wr_id & wr_kind) == wr_ctrl ? "credit send"
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
  if (sent_ - acked_ >= slots_) return false;
  // Send completions can trail the peer's credits: bound the writes in flight per queue pair
  // as well, so a queue pair's send queue never overflows.
  return std::all_of(in_flight_.begin(), in_flight_.end(),
                     [&](std::size_t n) { return n < slots_; });
}

bool IbConnection::can_recv() const noexcept {
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
  // Split so that every piece is at least COCCL_IB_SPLIT_BYTES, one piece per queue pair.
  const std::size_t total = ib::slot_header + n;
  const std::size_t qps = in_flight_.size();
  const std::size_t count = std::clamp<std::size_t>(total / split_bytes_, 1, qps);
  const std::size_t piece = ((total + count - 1) / count + 63) / 64 * 64;
  // The least loaded queue pairs take the pieces; ties rotate so that equal load spreads.
  std::vector<std::size_t> order(qps);
  std::iota(order.begin(), order.end(), 0);
  std::rotate(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(next_qp_ % qps),
              order.end());
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return in_flight_[a] < in_flight_[b]; });
  ++next_qp_;
  const std::uint32_t imm =
      static_cast<std::uint32_t>((sent_ & seq_mask) << 8) | static_cast<std::uint32_t>(count);
  for (std::size_t i = 0, off = 0; i < count; ++i, off += piece) {
    const std::size_t len = std::min(piece, total - off);
    const std::size_t q = order[i];
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(stage + off), static_cast<std::uint32_t>(len),
                link_->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = wr_data | q;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = link_->peer_ring() + slot * link_->stride() + off;
    wr.wr.rdma.rkey = link_->peer_rkey();
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(link_->qp(static_cast<int>(q)), &wr, &bad) != 0) post_failed("ibv_post_send");
    ++in_flight_[q];
  }
  ++sent_;
  // Completions are picked up by the poller while someone waits, else by the channel's event.
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
  std::byte* buf = link_->ctrl_buffer(ctrl_next_++ % ib::ctrl_slots);
  std::memcpy(buf, &released_, sizeof released_);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), sizeof released_, link_->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = wr_ctrl;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(link_->qp(0), &wr, &bad) != 0) {
    int e = errno;
    close(make_error_code(errc::peer_lost),
          "rank " + std::to_string(peer_) +
              ": ibv_post_send of a credit failed: " + std::strerror(e));
    return;
  }
  credited_ = released_;
  ++ctrl_in_flight_;
}

}  // namespace coccl::transport
