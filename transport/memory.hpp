// The in-memory network: byte streams and listeners inside one process, for many ranks of one
// process (coccl-sim, tests) running the real bootstrap, link handshake and tcp links without
// sockets or file descriptors.
//
// A memory stream is a pair of byte queues, one each way, with what code written for tcp expects:
// bytes arrive in order and may be read in pieces; a write completes once its bytes are queued,
// and waits while the queue holds `capacity` bytes (back-pressure, like a socket buffer); closing
// one end is an end of stream (asio::error::eof) for the other's reads once it has read what was
// queued, and makes the other's writes fail with broken_pipe. Completions are posted to the
// executor of the end whose operation completes, never run inside the other end's call. The two
// ends may live on different threads: each stream's queues are guarded by a mutex of their own
// (this is a test network; the library's tcp, shm and ib paths take no locks).
//
// Listeners are found by number in a process-wide registry (PeerInfo family_memory, see
// transport/net.hpp); dialling a number nobody listens on is refused, as tcp would.
//
// An end may be given the Traffic of the party that owns it (transport/traffic.hpp): the stream
// then counts that party's messages, bytes and rounds. A stream with no Traffic at either end
// counts nothing.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/config.hpp"
#include "runtime/engine.hpp"
#include "transport/net.hpp"
#include "transport/stream.hpp"
#include "transport/traffic.hpp"

namespace coccl::transport::memory {

/// COCCL_MEMORY_STREAM_BYTES: what one direction of a memory stream holds before a write waits.
std::size_t default_capacity();

/// Two connected memory streams: the first on `a`, counted in `traffic_a` (may be null), the
/// second on `b`, counted in `traffic_b`; each direction holds at most `capacity` (at least 1)
/// bytes written and not yet read.
/// Under VirtualTime, `traffic_a` (the dialler's party) places the stream among a round's streams
/// (Traffic::id(), Traffic::next_stream()).
std::pair<Stream, Stream> make_pair(asio::any_io_executor a, asio::any_io_executor b,
                                    std::size_t capacity,
                                    std::shared_ptr<Traffic> traffic_a = nullptr,
                                    std::shared_ptr<Traffic> traffic_b = nullptr);

/// Virtual time on the in-memory network (coccl-sim). While one exists, the streams made from
/// then on deliver what is written at time t from time t + 1 on, and the time advances when every
/// one of its proxy threads has nothing else to run: a network on which every message takes one
/// round and computing takes none, so that ranks run side by side as they would with latency, and
/// a party's round (transport/traffic.hpp) counts hops, not the order in which the threads
/// happened to run them. Every end of those streams must live on one of its threads. One at a
/// time; its destruction makes every byte still held back readable.
///
/// With several threads, a thread that finds nothing to run reports so, and the last of them to
/// report advances the time and serves the streams that were held back; each thread gets its
/// round's completions together, in an order that does not depend on how the threads ran: the
/// streams by their dialling party's name and how many it dialled before (Traffic::set_id), so
/// that with named parties the counts and rounds are the same on one thread or several, run
/// after run. A completion the network posts to a thread after it reported
/// withdraws its report until it has run. Work handed to a thread from elsewhere (an application
/// thread posting to its executor, a timer) is not seen that way: to start such work on several
/// threads at one time, hold() the time, hand the work over, and release() it; every thread then
/// reports afresh once it has run what it was handed.
class VirtualTime {
 public:
  /// On `thread` alone. Make and destroy it on that thread.
  explicit VirtualTime(runtime::ProxyThread& thread);
  /// On every thread of `threads` (distinct). Made and destroyed from a thread that is none of
  /// them: each joins and leaves on its own thread, and the call waits for that.
  explicit VirtualTime(const std::vector<runtime::ProxyThread*>& threads);
  ~VirtualTime();
  VirtualTime(const VirtualTime&) = delete;
  VirtualTime& operator=(const VirtualTime&) = delete;

  /// Waits until the network is quiet: every thread has run what the network posted to it and
  /// found nothing else to run, and no byte written is held back. From a thread that is none of
  /// its threads, not during a hold(). What a party sends last (a credit nobody waits for) is
  /// then read, so counts taken afterwards do not depend on when they were taken.
  void settle();

  /// Rounds elapsed (any thread).
  static std::uint64_t now() noexcept;

  /// Keeps the time where it is until release() (any thread; they nest).
  void hold() noexcept;
  /// Ends a hold(). After the last one, the time advances only once every thread has run what
  /// was queued for it before the release and found nothing more to run.
  void release();

  struct Participant;  // one thread's idle hook (memory.cpp)

 private:
  void join(std::size_t i);
  // Every thread reports again once it has run what it was handed before now (a nudge queued
  // behind it); `settling`: the first to find the network quiet then ends settle(); `releasing`:
  // ends a hold first, and does nothing more unless it was the last.
  void report_afresh(bool settling, bool releasing);
  void leave(std::size_t i);
  std::vector<std::unique_ptr<Participant>> participants_;
};

/// A listener of the memory network. Thread-safe: dialled from any thread, accepting on its own
/// executor.
class Listener : public std::enable_shared_from_this<Listener> {
 public:
  /// Listens under a new number, accepting on `ex`; the streams it accepts are counted in
  /// `traffic` (may be null).
  static std::shared_ptr<Listener> open(asio::any_io_executor ex,
                                        std::shared_ptr<Traffic> traffic = nullptr);
  /// Listens under `number`, which open() never hands out (its top bit is set); null when another
  /// listens there.
  static std::shared_ptr<Listener> open_at(std::uint64_t number, asio::any_io_executor ex,
                                           std::shared_ptr<Traffic> traffic = nullptr);
  /// The top bit of the numbers open_at() takes.
  static constexpr std::uint64_t named = std::uint64_t{1} << 63;
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  std::uint64_t number() const noexcept { return number_; }
  /// The next dialled stream (one accept at a time); operation_aborted once closed.
  void async_accept(Acceptor::AcceptHandler handler);
  /// Stops listening: a pending accept completes with operation_aborted, streams dialled and not
  /// yet accepted are closed (their diallers read an end of stream), later dials are refused.
  void close();
  bool is_open() const;

  /// Dials listener `number`: the dialler's end on `ex`, counted in `traffic` (may be null), or
  /// nullopt when nobody listens there.
  static std::optional<Stream> connect(std::uint64_t number, asio::any_io_executor ex,
                                       std::shared_ptr<Traffic> traffic = nullptr);

 private:
  Listener(asio::any_io_executor ex, std::uint64_t number, std::shared_ptr<Traffic> traffic)
      : ex_(std::move(ex)), number_(number), traffic_(std::move(traffic)) {}

  asio::any_io_executor ex_;
  std::uint64_t number_;
  std::shared_ptr<Traffic> traffic_;
  mutable std::mutex mutex_;
  bool open_ = true;
  // backlog_[taken_..] were dialled and not yet accepted. Not a deque, which allocates a block
  // on construction: every rank of coccl-sim has a listener, mostly with nothing dialled.
  std::vector<Stream> backlog_;
  std::size_t taken_ = 0;
  // Never assigned: Boost 1.81's any_completion_handler move assignment recurses without end.
  std::optional<Acceptor::AcceptHandler> waiter_;
};

}  // namespace coccl::transport::memory

namespace coccl::params {

extern config::Param<std::int64_t> memory_stream_bytes;  // COCCL_MEMORY_STREAM_BYTES

}  // namespace coccl::params
