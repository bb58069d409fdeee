#include "transport/ib_link.hpp"

#include <fcntl.h>

#include <coccl/error.hpp>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>

#include "transport/hmac.hpp"
#include "transport/wire.hpp"

namespace coccl::transport::ib {

namespace {

std::system_error verbs_error(const std::string& what) {
  int e = errno ? errno : EIO;
  return std::system_error(e, std::system_category(), "ib: " + what);
}

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

RegCache& registrations(const std::shared_ptr<Device>& device) {
  // One device per process (Device::get), so one cache; it keeps the device open while it lives.
  static std::once_flag once;
  static RegCache* cache;
  std::call_once(once, [&] {
    cache = new RegCache(
        [device](void* addr, std::size_t len) {
          ibv_mr* mr = device->verbs().reg_mr(device->pd(), addr, len,
                                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
          if (!mr) throw verbs_error("ibv_reg_mr of " + std::to_string(len) + " bytes failed");
          return Registration{0, 0, mr->lkey, mr->rkey, mr};
        },
        [device](const Registration& r) {
          device->verbs().dereg_mr(static_cast<ibv_mr*>(r.handle));
        });
  });
  return *cache;
}

std::vector<std::uint8_t> LinkAddress::encode() const {
  Writer w;
  w.put(gid).put(lid).put(mtu).put(ring).put(rkey).put(slots).put(slot_bytes).put(block_min);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(qpn.size()));
  for (std::size_t i = 0; i < qpn.size(); ++i) w.put(qpn[i]).put(psn[i]);
  return std::move(w.bytes());
}

LinkAddress LinkAddress::decode(std::span<const std::uint8_t> bytes) {
  Reader r(bytes);
  LinkAddress a;
  a.gid = r.get<ibv_gid>();
  a.lid = r.get<std::uint16_t>();
  a.mtu = r.get<std::uint8_t>();
  a.ring = r.get<std::uint64_t>();
  a.rkey = r.get<std::uint32_t>();
  a.slots = r.get<std::uint64_t>();
  a.slot_bytes = r.get<std::uint64_t>();
  a.block_min = r.get<std::uint64_t>();
  auto n = r.get<std::uint32_t>();
  if (n < 1 || n > static_cast<std::uint32_t>(max_qps))
    throw std::system_error(make_error_code(errc::bad_message), "ib address: bad queue pair count");
  for (std::uint32_t i = 0; i < n; ++i) {
    a.qpn.push_back(r.get<std::uint32_t>());
    a.psn.push_back(r.get<std::uint32_t>());
  }
  if (!r.done())
    throw std::system_error(make_error_code(errc::bad_message), "ib address: trailing bytes");
  return a;
}

Link::Link(std::shared_ptr<Device> device, std::size_t slots, std::size_t slot_bytes, int qps,
           std::size_t block_min)
    : device_(std::move(device)),
      slots_(slots),
      slot_bytes_(slot_bytes),
      stride_(slot_header + round_up(slot_bytes, 64)),
      block_min_(block_min),
      // Per queue pair the peer can have unprocessed: one piece of each of `slots` puts and of
      // `block_window + 1` block writes; on queue pair 0 also up to `slots` credit messages (each
      // carries a larger released count than the one before, and none exceeds what the peer
      // sent), `block_window + 2` offers and `block_window + 1` declines (see IbConnection).
      recv_depth_(2 * slots + 2 + 3 * (block_window + 2)),
      // Sends per queue pair: `slots` puts, the control messages, the writes of
      // `block_window + 1` blocks.
      send_depth_(slots + ctrl_slots + block_window + 1) {
  if (qps < 1 || qps > max_qps)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "COCCL_IB_QPS_PER_PEER must be 1.." + std::to_string(max_qps));
  const Verbs& v = verbs();
  const std::size_t recvs = recv_depth_ * static_cast<std::size_t>(qps);
  const std::size_t cqe = static_cast<std::size_t>(qps) * (send_depth_ + recv_depth_);
  if (send_depth_ > static_cast<std::size_t>(device_->max_qp_wr()) ||
      recv_depth_ > static_cast<std::size_t>(device_->max_qp_wr()) ||
      cqe > static_cast<std::size_t>(device_->max_cqe()))
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "ib: COCCL_SLOTS=" + std::to_string(slots) +
                                " needs more work "
                                "requests than " +
                                device_->name() + " allows");
  memory_bytes_ =
      round_up(2 * slots * stride_ + ctrl_slots * ctrl_bytes + recvs * ctrl_bytes, 4096);
  memory_ = static_cast<std::byte*>(std::aligned_alloc(4096, memory_bytes_));
  if (!memory_) throw std::bad_alloc();
  std::memset(memory_, 0, memory_bytes_);
  ring_ = memory_;
  send_ = ring_ + slots * stride_;
  ctrl_ = send_ + slots * stride_;
  recv_ = ctrl_ + ctrl_slots * ctrl_bytes;
  try {
    mr_ = registrations(device_).get(memory_, memory_bytes_);
    channel_ = v.create_comp_channel(device_->context());
    if (!channel_) throw verbs_error("ibv_create_comp_channel failed");
    // The channel is read by the proxy thread's event loop, which must never block on it.
    int flags = ::fcntl(channel_->fd, F_GETFL);
    if (flags < 0 || ::fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0)
      throw verbs_error("making the completion channel non-blocking failed");
    cq_ = v.create_cq(device_->context(), static_cast<int>(cqe), nullptr, channel_, 0);
    if (!cq_) throw verbs_error("ibv_create_cq of " + std::to_string(cqe) + " entries failed");
    for (int q = 0; q < qps; ++q) {
      ibv_qp_init_attr ia{};
      ia.send_cq = cq_;
      ia.recv_cq = cq_;
      ia.qp_type = IBV_QPT_RC;
      ia.cap.max_send_wr = static_cast<std::uint32_t>(send_depth_);
      ia.cap.max_recv_wr = static_cast<std::uint32_t>(recv_depth_);
      ia.cap.max_send_sge = 1;
      ia.cap.max_recv_sge = 1;
      ibv_qp* qp = v.create_qp(device_->pd(), &ia);
      if (!qp) throw verbs_error("ibv_create_qp failed");
      qp_.push_back(qp);
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.pkey_index = 0;
      a.port_num = device_->port();
      a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
      if (v.modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
        throw verbs_error("moving a queue pair to INIT failed");
      std::array<std::uint8_t, 4> rnd{};
      detail::random_bytes(rnd);
      psn_.push_back(
          (std::uint32_t(rnd[0]) | std::uint32_t(rnd[1]) << 8 | std::uint32_t(rnd[2]) << 16) &
          0xffffff);
    }
    // Receives go up before the peer learns our address, so none can be missing when its
    // first message arrives.
    for (std::size_t i = 0; i < recvs; ++i)
      if (!post_recv(i)) throw verbs_error("ibv_post_recv failed");
  } catch (...) {
    release();
    throw;
  }
}

Link::~Link() { release(); }

void Link::release() noexcept {
  const Verbs& v = verbs();
  for (ibv_qp* qp : qp_) v.destroy_qp(qp);
  qp_.clear();
  if (cq_) v.destroy_cq(cq_);
  cq_ = nullptr;
  if (channel_) v.destroy_comp_channel(channel_);
  channel_ = nullptr;
  if (memory_) {
    // The memory is freed: its registration leaves the cache (released with the last holder).
    mr_.reset();
    registrations(device_).forget(memory_, memory_bytes_);
    std::free(memory_);
    memory_ = nullptr;
  }
}

bool Link::post_recv(std::size_t index) {
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(recv_buffer(index)),
              static_cast<std::uint32_t>(ctrl_bytes), mr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = index;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp_[index / recv_depth_], &wr, &bad) == 0;
}

LinkAddress Link::address() const {
  LinkAddress a;
  a.gid = device_->gid();
  a.lid = device_->lid();
  a.mtu = static_cast<std::uint8_t>(device_->mtu());
  a.ring = reinterpret_cast<std::uintptr_t>(ring_);
  a.rkey = mr_->rkey;
  a.slots = slots_;
  a.slot_bytes = slot_bytes_;
  a.block_min = block_min_;
  for (std::size_t q = 0; q < qp_.size(); ++q) {
    a.qpn.push_back(qp_[q]->qp_num);
    a.psn.push_back(psn_[q]);
  }
  return a;
}

void Link::connect(const LinkAddress& peer) {
  if (peer.qpn.size() != qp_.size() || peer.slots != slots_ || peer.slot_bytes != slot_bytes_ ||
      peer.block_min != block_min_)
    throw std::system_error(make_error_code(errc::bad_message),
                            "ib: the peer uses different link settings (COCCL_SLOTS, "
                            "COCCL_SLOT_BYTES, COCCL_IB_QPS_PER_PEER or COCCL_IB_ZCOPY_MIN)");
  peer_ring_ = peer.ring;
  peer_rkey_ = peer.rkey;
  const Verbs& v = verbs();
  // Both sides use the smaller of the two active MTUs.
  auto mtu = static_cast<ibv_mtu>(std::min<int>(peer.mtu, device_->mtu()));
  for (std::size_t q = 0; q < qp_.size(); ++q) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = peer.qpn[q];
    a.rq_psn = peer.psn[q];
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = device_->port();
    if (device_->ethernet()) {
      a.ah_attr.is_global = 1;
      a.ah_attr.grh.dgid = peer.gid;
      a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(device_->gid_index());
      a.ah_attr.grh.hop_limit = 64;
    } else {
      a.ah_attr.dlid = peer.lid;
    }
    if (v.modify_qp(qp_[q], &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
      throw verbs_error("moving a queue pair to RTR failed");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = psn_[q];
    a.max_rd_atomic = 1;
    if (v.modify_qp(qp_[q], &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
      throw verbs_error("moving a queue pair to RTS failed");
  }
}

}  // namespace coccl::transport::ib
