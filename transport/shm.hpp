// shm transport for ranks on one host: each side owns a receive ring in a shared-memory segment
// that the peer maps; a put is a memcpy into the peer's next slot followed by a release store of
// the slot's sequence number; the receiver polls the next slot (through ShmPoller on its proxy
// thread), uses it in place and publishes its tail to return the slot. The TCP socket that set the
// link up stays open to detect a dead peer and carry abort notices.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "runtime/config.hpp"
#include "transport/link_poller.hpp"
#include "transport/socket_connection.hpp"

namespace coccl::transport {

class ShmConnection;
struct ShmRing;
struct ShmSlot;

/// A shared-memory segment: created here (owner) or mapped from a peer.
class ShmSegment {
 public:
  /// Creates a segment of `bytes`, named uniquely; the name travels to the peer.
  static std::unique_ptr<ShmSegment> create(std::size_t bytes);
  /// Maps a peer's segment by name and unlinks the name (it is no longer needed once mapped).
  static std::unique_ptr<ShmSegment> open(const std::string& name, std::size_t bytes);
  ~ShmSegment();
  void* data() const noexcept { return data_; }
  const std::string& name() const noexcept { return name_; }
  /// Removes the name (idempotent); mapped memory stays valid.
  void unlink() noexcept;

 private:
  ShmSegment(std::string name, void* data, std::size_t bytes, bool owner)
      : name_(std::move(name)), data_(data), bytes_(bytes), owner_(owner) {}
  std::string name_;
  void* data_;
  std::size_t bytes_;
  bool owner_;
  bool linked_ = true;
};

/// The poller of a communicator's shm connections.
using ShmPoller = LinkPoller;

class ShmConnection final : public SocketConnection, public PolledLink {
 public:
  /// Bytes of a ring segment for these parameters.
  static std::size_t segment_bytes(std::size_t slots, std::size_t slot_bytes);

  /// `own` is this side's receive ring (created here), `peer` the peer's (mapped).
  ShmConnection(int self, int peer, Stream socket, std::size_t slots, std::size_t slot_bytes,
                std::unique_ptr<ShmSegment> own, std::unique_ptr<ShmSegment> peer_ring,
                ShmPoller& poller, FailureHandler on_failure);
  ~ShmConnection() override;

  const char* kind() const noexcept override { return "shm"; }
  std::size_t slot_bytes() const noexcept override { return slot_bytes_; }
  asio::awaitable<void> put(const void* src, std::size_t n, std::uint32_t fingerprint) override;
  asio::awaitable<Chunk> wait() override;
  void release() override;
  bool settled() const noexcept override;
  bool pollable() const noexcept override { return !closed_ && !departed_; }
  bool try_put_gathered(const void* head, std::size_t head_n, const void* src, std::size_t n,
                        std::uint32_t fingerprint) override;
  std::optional<Chunk> peek() override;
  void take_peeked() override { ++consumed_; }
  void learn_credit() noexcept override;

  /// Called by the poller: resumes waiters whose condition holds; true if it resumed any.
  bool check() override;
  bool has_waiter() const noexcept override {
    return recv_waiter_.has_value() || credit_waiter_.has_value();
  }

 private:
  bool can_put() const noexcept override;
  bool can_recv() const noexcept override;
  void before_park() override { poller_.activate(this); }
  void resume_inline(Waiter& w);
  // Copies a chunk (`head_n` bytes of `head`, then `n` of `src`) into the peer's next slot and
  // publishes it (a slot is free).
  void publish(const void* src, std::size_t n, std::uint32_t fingerprint,
               const void* head = nullptr, std::size_t head_n = 0);
  Chunk chunk_at(std::uint64_t i) const;
  // Slot of chunk `i` in `ring` (a segment: this side's or the peer's).
  ShmSlot& slot(void* ring, std::uint64_t i) const noexcept;
  // Whether chunk `i` of this side's ring is published.
  bool published(std::uint64_t i) const noexcept;

  std::size_t slots_;
  std::size_t slot_bytes_;
  std::uint64_t slot_mask_;  // slots_ - 1 when slots_ is a power of two, else 0
  std::size_t stride_;       // bytes from one slot to the next
  std::unique_ptr<ShmSegment> own_;
  std::unique_ptr<ShmSegment> peer_;
  ShmRing* recv_ring_;
  ShmRing* send_ring_;
  ShmPoller& poller_;
  std::uint64_t sent_ = 0;               // puts published into the peer's ring
  std::uint64_t consumed_ = 0;           // chunks handed out by wait()
  std::uint64_t released_ = 0;           // chunks released
  mutable std::uint64_t tail_seen_ = 0;  // the peer's tail as last read (can_put)
};

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<std::string> shm_dir;  // COCCL_SHM_DIR

}  // namespace coccl::params
