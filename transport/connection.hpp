// A connection to one peer rank: ordered puts into the peer's receive ring, each with a
// notification the peer waits on, plus control frames (abort notices) on the same link.
//
// This is coccl's single connection model (after NCCLX's CTran mapper): the receive ring is the
// peer's registered buffer, a put copies a chunk into the next ring slot and notifies the peer, the
// peer waits for the notification, uses the chunk in place (reduces from it or copies it out) and
// releases the slot, which returns a credit to the sender. tcp carries a put as header + payload;
// shm copies into a ring mapped from the peer's memory and publishes it with a release store.
//
// All members are called on the owning communicator's proxy thread. Per direction, at most one
// coroutine at a time waits (the algorithms give each peer one sending and one receiving
// coroutine), so puts and waits stay in order.
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

namespace coccl::transport {

namespace asio = boost::asio;

/// Thrown by put() and wait() when the connection (and so the communicator) has failed. It carries
/// the communicator-level description: which peer, what happened.
class LinkError : public std::system_error {
 public:
  LinkError(std::error_code ec, const std::string& what) : std::system_error(ec, what) {}
};

/// A received chunk, valid until release().
struct Chunk {
  std::byte* data;
  std::size_t size;
  std::uint32_t fingerprint;
};

/// The receiver's offer of a block, as the sender sees it (see Connection::next_offer).
struct BlockOffer {
  std::size_t size;
  std::uint32_t fingerprint;
};

/// Called once when the link fails: peer EOF/reset, an abort notice, a protocol error.
using FailureHandler = std::function<void(int peer, std::error_code, const std::string&)>;

class Connection {
 public:
  Connection(int self, int peer, FailureHandler on_failure)
      : self_(self), peer_(peer), on_failure_(std::move(on_failure)) {}
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int peer() const noexcept { return peer_; }
  /// "tcp" or "shm".
  virtual const char* kind() const noexcept = 0;
  /// Largest single put.
  virtual std::size_t slot_bytes() const noexcept = 0;

  /// Copies [src, src+n) into the peer's next ring slot and notifies it. Completes once `src`
  /// may be reused. `fingerprint` identifies the operation; the receiver checks it. Throws
  /// LinkError when the link has failed.
  virtual asio::awaitable<void> put(const void* src, std::size_t n, std::uint32_t fingerprint) = 0;

  /// Waits for the next chunk from the peer. Throws LinkError when the link has failed.
  virtual asio::awaitable<Chunk> wait() = 0;

  /// Releases the oldest chunk returned by wait() or take_peeked(); its slot goes back to the
  /// sender.
  virtual void release() = 0;

  // Without suspending, for operations that run to completion in one call when their peers are
  // ready (collectives/fast_path.hpp). Links that cannot tell without waiting (their data comes
  // through the io_context) keep these defaults and are never used that way. Called only while no
  // coroutine is parked on the link, and never interleaved with put()/wait() of another operation.

  /// True if this link implements the three calls below, has not failed and can take them now
  /// (a tcp link: nothing queued to write, its reader not inside a frame too large to buffer).
  virtual bool pollable() const noexcept { return false; }
  /// put(), if a slot of the peer's ring is free now and the link is healthy: true once it is
  /// published; false, with nothing sent, otherwise (no room yet, or the link failed: put() then
  /// says why). A chunk of one part, as try_put_gathered() sends it.
  bool try_put(const void* src, std::size_t n, std::uint32_t fingerprint) {
    return try_put_gathered(src, n, nullptr, 0, fingerprint);
  }
  /// try_put() of one chunk made of two parts, `head` then `src` (both reusable once it returns
  /// true), copied into one chunk by the link (tcp: into the frames it holds back; shm: into the
  /// peer's slot). This default returns false without sending anything.
  virtual bool try_put_gathered(const void* /*head*/, std::size_t /*head_n*/, const void* /*src*/,
                                std::size_t /*n*/, std::uint32_t /*fingerprint*/) {
    return false;
  }
  /// The next chunk, if it has arrived and the link is healthy, without taking it; nothing
  /// otherwise (not yet, or the link failed: wait() then says why).
  virtual std::optional<Chunk> peek() { return std::nullopt; }
  /// Takes the chunk that peek() just returned, as wait() would have returned it.
  virtual void take_peeked() {}
  /// Learns now how many of the peer's slots are free, so that the next try_put() need not ask:
  /// for a caller that is waiting anyway (the answer comes from memory the peer writes).
  virtual void learn_credit() noexcept {}
  /// A poll (peek(), try_put()) costs no system call; a waiter polling a link that says no yields
  /// its core sooner.
  virtual bool polls_cheaply() const noexcept { return true; }
  /// Largest put that try_put() and peek() move (both ends of a link agree); a larger block takes
  /// the ordinary path.
  virtual std::size_t poll_bytes() const noexcept { return slot_bytes(); }
  /// Called once after an operation's last try_put(), peek() or release() on the fast path (on
  /// success or before it hands the rest to put() and wait()): sends what the link held back so
  /// that it left in one go (tcp). Links that send at once keep this default.
  virtual void flush() {}

  /// Best effort: tells the peer why this communicator is failing (the peer fails with
  /// errc::remote_error and this text).
  virtual void send_abort(std::error_code ec, const std::string& why) = 0;

  /// Tells the peer this rank is leaving in good order (destroy): chunks already sent stay
  /// deliverable there, and the peer fails only if it waits for more.
  virtual void send_goodbye() = 0;
  /// An abort notice still waits for a frame in flight to finish (close() lingers for it).
  virtual bool notice_pending() const noexcept { return false; }

  /// Fails every pending and future put/wait with `ec`/`why` and closes the link. Idempotent.
  virtual void close(std::error_code ec, const std::string& why) = 0;

  // Block transfers: one whole buffer moved from the sender's memory to the receiver's, zero-copy
  // where the link and both buffers allow it (ib, both buffers registered by the user), as
  // ordinary chunks otherwise. Blocks are matched in order per direction. For each block the
  // receiver calls offer() (never waits; it may offer several blocks ahead) and later landed();
  // the sender calls next_offer() then write_block(), and flush_blocks() before reusing sources.
  // Links that move no blocks return false from uses_blocks() and never see the other calls.

  /// True if a transfer of `n` bytes on this link is a block (both sides decide alike).
  virtual bool uses_blocks(std::size_t /*n*/) const noexcept { return false; }
  /// Receiver: the next block is `n` bytes into `dst`. Returns its id (ids count up from 0).
  virtual std::uint64_t offer(void* /*dst*/, std::size_t /*n*/, std::uint32_t /*fingerprint*/) {
    no_blocks();
  }
  /// Receiver: waits until block `id` (the oldest not yet landed) is settled: true if its bytes
  /// are in `dst`, false if the sender sends them as chunks (take them with wait()).
  virtual asio::awaitable<bool> landed(std::uint64_t /*id*/) { no_blocks(); }
  /// Sender: waits for the receiver's offer of the next block.
  virtual asio::awaitable<BlockOffer> next_offer() { no_blocks(); }
  /// Sender: answers that offer with `src` (n bytes, matching it). Starts writing straight into
  /// the receiver's buffer and returns true when both buffers are registered; otherwise returns
  /// false (the receiver has been told): send the bytes with put().
  virtual asio::awaitable<bool> write_block(const void* /*src*/, std::size_t /*n*/) { no_blocks(); }
  /// Sender: waits until every block write started has finished reading its source.
  virtual asio::awaitable<void> flush_blocks() { no_blocks(); }

  /// Nothing is in flight either way: every chunk this side put was released by the peer, every
  /// chunk that arrived here was released, and no put or wait is parked. Two settled ends may
  /// close the link and lose nothing (Peers closes idle links). Links that cannot tell say no.
  virtual bool settled() const noexcept { return false; }

  /// While failures are held, a failure of the link (the peer closing it, EOF) is kept instead of
  /// reported: a link being closed by agreement ends without failing the communicator.
  void hold_failures() noexcept { holding_ = true; }
  /// Stops holding; a failure held meanwhile is reported now.
  void release_failures() {
    holding_ = false;
    if (held_) {
      auto [ec, why] = std::move(*held_);
      held_.reset();
      report_failure(ec, why);
    }
  }

  /// When a put or wait has been blocked on this peer since, if one is.
  std::optional<std::chrono::steady_clock::time_point> blocked_since() const noexcept {
    return blocked_since_;
  }

 protected:
  [[noreturn]] static void no_blocks() {
    throw LinkError(std::make_error_code(std::errc::operation_not_supported),
                    "block transfer on a link without blocks");
  }

  // Reports the first failure to the communicator.
  void report_failure(std::error_code ec, const std::string& why) {
    if (reported_) return;
    if (holding_) {
      if (!held_) held_.emplace(ec, why);
      return;
    }
    reported_ = true;
    if (on_failure_) on_failure_(peer_, ec, why);
  }

  int self_;
  int peer_;
  std::optional<std::chrono::steady_clock::time_point> blocked_since_;

 private:
  FailureHandler on_failure_;
  bool reported_ = false;
  bool holding_ = false;
  std::optional<std::pair<std::error_code, std::string>> held_;
};

}  // namespace coccl::transport
