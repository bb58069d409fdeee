// ib transport, part 3: the verbs resources of one connection and how they are connected.
//
// A Link owns, for one peer: a completion queue with its completion channel, `qps` reliable-
// connected queue pairs, and one registered buffer holding the receive ring (the peer writes
// into it), the send staging slots, the control send buffers and the receive buffers. The two
// sides exchange their LinkAddress over the bootstrap link (see Peers) and then connect().
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "transport/ib_mr.hpp"
#include "transport/ib_verbs.hpp"

namespace coccl::transport::ib {

/// Bytes of the header at the start of every ring slot: payload size and fingerprint. It travels
/// with the first piece of the payload, so a put is one RDMA write per piece.
inline constexpr std::size_t slot_header = 64;
/// Control buffers: each holds one credit message.
inline constexpr std::size_t ctrl_slots = 4;
inline constexpr std::size_t ctrl_bytes = 64;
/// Most pieces a put is split into (the count travels in the low bits of the immediate).
inline constexpr int max_qps = 16;
/// Block transfers (see IbConnection): how many offers a receiver may have outstanding beyond
/// the one it waits for, and the largest single RDMA write of a block.
inline constexpr std::size_t block_window = 4;
inline constexpr std::size_t max_write_bytes = std::size_t(1) << 30;

/// What the peer needs to reach this side.
struct LinkAddress {
  ibv_gid gid{};
  std::uint16_t lid = 0;
  std::uint8_t mtu = 0;  // ibv_mtu
  std::uint64_t ring = 0;
  std::uint32_t rkey = 0;
  std::uint64_t slots = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t block_min = 0;
  std::vector<std::uint32_t> qpn;
  std::vector<std::uint32_t> psn;

  std::vector<std::uint8_t> encode() const;
  /// Throws errc::bad_message on a malformed address.
  static LinkAddress decode(std::span<const std::uint8_t> bytes);
};

class Link {
 public:
  /// Creates the resources with every queue pair in INIT and its receives posted. Transfers of
  /// `block_min` bytes and more are blocks (both sides must agree). Throws std::system_error
  /// naming the verbs call that failed.
  Link(std::shared_ptr<Device> device, std::size_t slots, std::size_t slot_bytes, int qps,
       std::size_t block_min);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  LinkAddress address() const;
  /// Moves every queue pair to RTR then RTS towards `peer`. Throws on a mismatched address or a
  /// failed transition.
  void connect(const LinkAddress& peer);

  const Device& device() const noexcept { return *device_; }
  const Verbs& verbs() const noexcept { return device_->verbs(); }
  ibv_cq* cq() const noexcept { return cq_; }
  ibv_comp_channel* channel() const noexcept { return channel_; }
  int qps() const noexcept { return static_cast<int>(qp_.size()); }
  ibv_qp* qp(int i) const noexcept { return qp_[i]; }
  std::size_t slots() const noexcept { return slots_; }
  std::size_t stride() const noexcept { return stride_; }
  std::size_t block_min() const noexcept { return block_min_; }
  /// Receives posted per queue pair: enough that none is ever missing (see the constructor).
  std::size_t recv_depth() const noexcept { return recv_depth_; }
  std::uint32_t lkey() const noexcept { return mr_->lkey; }
  std::byte* ring_slot(std::size_t i) const noexcept { return ring_ + i * stride_; }
  std::byte* send_slot(std::size_t i) const noexcept { return send_ + i * stride_; }
  std::byte* ctrl_buffer(std::size_t i) const noexcept { return ctrl_ + i * ctrl_bytes; }
  std::byte* recv_buffer(std::size_t i) const noexcept { return recv_ + i * ctrl_bytes; }
  std::uint64_t peer_ring() const noexcept { return peer_ring_; }
  std::uint32_t peer_rkey() const noexcept { return peer_rkey_; }

  /// Posts receive `index` (queue pair index / recv_depth) again. False if the post failed.
  bool post_recv(std::size_t index);

 private:
  void release() noexcept;

  std::shared_ptr<Device> device_;
  std::size_t slots_;
  std::size_t slot_bytes_;
  std::size_t stride_;
  std::size_t block_min_;
  std::size_t recv_depth_;
  std::size_t send_depth_;
  std::byte* memory_ = nullptr;
  std::size_t memory_bytes_ = 0;
  std::shared_ptr<const Registration> mr_;
  std::byte* ring_ = nullptr;
  std::byte* send_ = nullptr;
  std::byte* ctrl_ = nullptr;
  std::byte* recv_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::vector<ibv_qp*> qp_;
  std::vector<std::uint32_t> psn_;
  std::uint64_t peer_ring_ = 0;
  std::uint32_t peer_rkey_ = 0;
};

/// The process's registration cache for the device (every Link registers through it).
RegCache& registrations(const std::shared_ptr<Device>& device);

}  // namespace coccl::transport::ib
