// The tcp link on Asio (transport/tcp.hpp), one end real and the other played by hand over an
// in-memory stream: frames that arrive together, or a byte at a time, come out whole and in
// order; releases return credits; small puts complete at once and their frames still reach the
// peer in order, before a goodbye given in the same breath; a queue longer than one write goes out
// whole; a credit for slots never filled fails the link as a protocol error; chunks held while
// later ones fill the released slots keep their bytes. Over a real socket,
// the fast path's calls (TcpLinkPolled) take whole frames without the loop and leave the rest to
// the reader.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <coccl/error.hpp>
#include <cstdint>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.hpp"
#include "transport/memory.hpp"
#include "transport/tcp.hpp"
#include "transport/tcp_uring.hpp"

namespace coccl {
namespace {

namespace asio = boost::asio;
using transport::LinkHeader;
using transport::Stream;

constexpr std::size_t slots = 4;
constexpr std::size_t slot_bytes = 4096;

std::vector<std::uint8_t> payload(std::size_t n, std::uint8_t first) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(first + i * 7);
  return v;
}

void append_frame(std::vector<std::uint8_t>& out, LinkHeader h,
                  const std::vector<std::uint8_t>& body = {}) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&h);
  out.insert(out.end(), p, p + sizeof h);
  out.insert(out.end(), body.begin(), body.end());
}

// Runs `io`'s handlers until `done` holds (a link's reader always waits, so the context never
// runs out of work); false if it does not within 10 s.
template <typename Done>
bool drive_until(asio::io_context& io, Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < until) {
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(10));
  }
  return done();
}

struct Failure {
  std::optional<std::error_code> ec;
  std::string why;
};

// One link end under test on `a`; the test plays the peer on `peer`.
struct Link {
  asio::io_context io;
  std::optional<Stream> peer;
  std::unique_ptr<transport::TcpConnection> conn;
  Failure failure;

  explicit Link(std::size_t ring_slots = slots) {
    auto [a, b] = transport::memory::make_pair(io.get_executor(), io.get_executor(), 1 << 20);
    peer.emplace(std::move(b));
    conn = std::make_unique<transport::TcpConnection>(
        0, 1, std::move(a), ring_slots, slot_bytes,
        [this](int, std::error_code ec, const std::string& why) {
          failure.ec = ec;
          failure.why = why;
        });
    conn->start();
  }

  template <typename Done>
  bool run_until(Done done) {
    return drive_until(io, done);
  }

  // Writes `bytes` as the peer, in pieces of `piece` bytes (each its own write).
  void send(const std::vector<std::uint8_t>& bytes, std::size_t piece) {
    asio::co_spawn(
        io,
        [&, piece]() -> asio::awaitable<void> {
          for (std::size_t at = 0; at < bytes.size(); at += piece)
            co_await asio::async_write(
                *peer, asio::buffer(bytes.data() + at, std::min(piece, bytes.size() - at)),
                asio::use_awaitable);
        },
        asio::detached);
  }

  // Reads one frame as the peer: its header and body.
  std::pair<LinkHeader, std::vector<std::uint8_t>> receive() {
    LinkHeader h{};
    std::vector<std::uint8_t> body;
    bool got = false;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          co_await asio::async_read(*peer, asio::buffer(&h, sizeof h), asio::use_awaitable);
          if (h.type == LinkHeader::put) {
            body.resize(h.length);
            co_await asio::async_read(*peer, asio::buffer(body), asio::use_awaitable);
          }
          got = true;
        },
        asio::detached);
    EXPECT_TRUE(run_until([&] { return got; })) << "no frame came";
    return {h, body};
  }
};

void expect_three_chunks(std::size_t piece) {
  SCOPED_TRACE("pieces of " + std::to_string(piece) + " bytes");
  Link link;
  const std::vector<std::vector<std::uint8_t>> sent = {payload(8, 1), payload(300, 2),
                                                       payload(slot_bytes, 3)};
  std::vector<std::uint8_t> wire;
  for (std::size_t k = 0; k < sent.size(); ++k)
    append_frame(wire,
                 LinkHeader{LinkHeader::put, static_cast<std::uint32_t>(11 + k), sent[k].size()},
                 sent[k]);
  link.send(wire, piece);
  std::vector<std::vector<std::uint8_t>> got;
  std::vector<std::uint32_t> fingerprints;
  bool all = false;
  asio::co_spawn(
      link.io,
      [&]() -> asio::awaitable<void> {
        for (std::size_t k = 0; k < sent.size(); ++k) {
          transport::Chunk c = co_await link.conn->wait();
          const auto* p = reinterpret_cast<const std::uint8_t*>(c.data);
          got.emplace_back(p, p + c.size);
          fingerprints.push_back(c.fingerprint);
          link.conn->release();
        }
        all = true;
      },
      asio::detached);
  ASSERT_TRUE(link.run_until([&] { return all; })) << link.failure.why;
  ASSERT_FALSE(link.failure.ec) << link.failure.why;
  ASSERT_EQ(got.size(), sent.size());
  for (std::size_t k = 0; k < sent.size(); ++k) {
    EXPECT_EQ(got[k], sent[k]) << "chunk " << k;
    EXPECT_EQ(fingerprints[k], 11 + k);
  }
  // Every release returns a credit; those queued together merge.
  std::uint64_t credits = 0;
  while (credits < sent.size()) {
    auto [h, body] = link.receive();
    ASSERT_EQ(h.type, LinkHeader::credit);
    ASSERT_GT(h.length, 0u);
    credits += h.length;
  }
  EXPECT_EQ(credits, sent.size());
}

TEST(TcpLink, FramesArrivingTogetherOrAByteAtATimeComeOutWholeAndInOrder) {
  expect_three_chunks(1 << 20);
  expect_three_chunks(1);
  expect_three_chunks(5);
}

// Chunks held while others arrive into the slots already released, the ring wrapping twice:
// each keeps its bytes until its release, whether the link gives each chunk memory of its own
// (a ring of at most 64 KiB) or keeps one whole ring (a larger one).
void expect_held_chunks_intact(std::size_t ring_slots) {
  SCOPED_TRACE(std::to_string(ring_slots) + " slots");
  Link link(ring_slots);
  std::vector<std::vector<std::uint8_t>> sent;
  for (std::size_t k = 0; k < 3 * ring_slots; ++k)
    sent.push_back(
        payload(k % 3 == 0 ? slot_bytes : 40 + 97 * k % 4000, static_cast<std::uint8_t>(k)));
  std::vector<transport::Chunk> held;
  std::size_t next = 0, checked = 0;
  // Link::send writes from the vector it is given, later: each stays until the end.
  std::deque<std::vector<std::uint8_t>> wires;
  auto put_frames = [&](std::size_t count) {
    std::vector<std::uint8_t>& wire = wires.emplace_back();
    for (; count > 0; --count, ++next)
      append_frame(wire,
                   LinkHeader{LinkHeader::put, static_cast<std::uint32_t>(next), sent[next].size()},
                   sent[next]);
    link.send(wire, 1000);
  };
  auto take = [&](std::size_t count) {
    bool done = false;
    asio::co_spawn(
        link.io,
        [&, count]() -> asio::awaitable<void> {
          for (std::size_t k = 0; k < count; ++k) held.push_back(co_await link.conn->wait());
          done = true;
        },
        asio::detached);
    ASSERT_TRUE(link.run_until([&] { return done; })) << link.failure.why;
  };
  // Checks and releases the oldest `count` chunks held.
  auto give_back = [&](std::size_t count) {
    for (std::size_t k = 0; k < count; ++k, ++checked) {
      const transport::Chunk c = held.front();
      held.erase(held.begin());
      const auto* p = reinterpret_cast<const std::uint8_t*>(c.data);
      EXPECT_EQ(std::vector<std::uint8_t>(p, p + c.size), sent[checked]) << "chunk " << checked;
      EXPECT_EQ(c.fingerprint, checked);
      link.conn->release();
    }
  };
  put_frames(ring_slots);
  take(ring_slots);
  while (next < sent.size()) {
    const std::size_t half = ring_slots / 2;
    give_back(half);
    put_frames(half);
    take(half);
  }
  give_back(held.size());
  EXPECT_EQ(checked, sent.size());
  EXPECT_FALSE(link.failure.ec) << link.failure.why;
}

TEST(TcpLink, ChunksHeldKeepTheirBytesWhileLaterOnesFillTheReleasedSlots) {
  expect_held_chunks_intact(slots);
  expect_held_chunks_intact(32);
}

TEST(TcpLink, SmallPutsCompleteAtOnceAndTheirFramesPrecedeAGoodbyeGivenRightAfter) {
  Link link;
  const auto small = payload(8, 4), other = payload(4096, 5);
  bool completed = false;
  asio::co_spawn(
      link.io,
      [&]() -> asio::awaitable<void> {
        co_await link.conn->put(small.data(), small.size(), 21);
        co_await link.conn->put(other.data(), other.size(), 22);
        completed = true;
        // In the same handler: nothing of the puts has been written yet.
        link.conn->send_goodbye();
        link.conn->close(make_error_code(errc::aborted), "destroyed");
      },
      asio::detached);
  // The puts complete without the peer reading anything (copied, not written yet).
  while (!completed && link.io.poll_one() > 0) {
  }
  EXPECT_TRUE(completed);
  auto [h1, b1] = link.receive();
  EXPECT_EQ(h1.type, LinkHeader::put);
  EXPECT_EQ(h1.fingerprint, 21u);
  EXPECT_EQ(b1, small);
  auto [h2, b2] = link.receive();
  EXPECT_EQ(h2.type, LinkHeader::put);
  EXPECT_EQ(h2.fingerprint, 22u);
  EXPECT_EQ(b2, other);
  auto [h3, b3] = link.receive();
  EXPECT_EQ(h3.type, LinkHeader::bye);
}

// More frames queued at once than one write takes (32): the queue drops the frames written while
// the rest wait, and every frame still goes out once, in order, with its own payload.
TEST(TcpLink, AQueueLongerThanOneWriteGoesOutWholeAndInOrder) {
  const std::size_t count = 45;
  Link link(64);
  bool queued = false;
  asio::co_spawn(
      link.io,
      [&]() -> asio::awaitable<void> {
        for (std::size_t k = 0; k < count; ++k) {
          const auto body = payload(16 + k, static_cast<std::uint8_t>(k));
          co_await link.conn->put(body.data(), body.size(), static_cast<std::uint32_t>(100 + k));
        }
        queued = true;
      },
      asio::detached);
  ASSERT_TRUE(link.run_until([&] { return queued; }));
  for (std::size_t k = 0; k < count; ++k) {
    auto [h, body] = link.receive();
    ASSERT_EQ(h.type, LinkHeader::put) << "frame " << k;
    EXPECT_EQ(h.fingerprint, 100 + k);
    EXPECT_EQ(body, payload(16 + k, static_cast<std::uint8_t>(k))) << "frame " << k;
  }
  EXPECT_FALSE(link.failure.ec) << link.failure.why;
}

TEST(TcpLink, ACreditForSlotsNeverFilledFailsTheLinkAsAProtocolError) {
  Link link;
  std::vector<std::uint8_t> wire;
  append_frame(wire, LinkHeader{LinkHeader::credit, 0, 1});
  link.send(wire, wire.size());
  ASSERT_TRUE(link.run_until([&] { return link.failure.ec.has_value(); }));
  EXPECT_EQ(*link.failure.ec, make_error_code(errc::bad_message));
  EXPECT_NE(link.failure.why.find("a credit for 1 slots, with 0 in use"), std::string::npos)
      << link.failure.why;
}

// ---- The io_uring link over two sockets: puts carry their index in put order -------------------

// A uring link end (rank 0) on a proxy thread, over two loopback sockets whose other ends the test
// writes by hand as rank 1.
struct UringLink {
  runtime::ProxyThread thread{0};
  asio::io_context io;  // the hand-played peer's sockets (used blocking)
  std::vector<asio::ip::tcp::socket> peer;
  std::unique_ptr<transport::Connection> conn;
  std::mutex m;
  Failure failure;

  // Runs `f` on the link's proxy thread and waits for it.
  template <typename F>
  void on_thread(F f) {
    std::promise<void> done;
    asio::post(thread.executor(), [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }

  UringLink() {
    asio::ip::tcp::acceptor listener(io, {asio::ip::address_v4::loopback(), 0});
    std::vector<asio::ip::tcp::socket> mine;
    for (int i = 0; i < 2; ++i) {
      asio::ip::tcp::socket a(thread.context()), b(io);
      b.connect(listener.local_endpoint());
      listener.accept(a);
      mine.push_back(std::move(a));
      peer.push_back(std::move(b));
    }
    on_thread([&] {
      std::string why;
      auto ring = transport::make_uring_ring(why);
      ASSERT_TRUE(ring) << why;
      transport::Stream control(std::move(mine[0]));
      std::vector<asio::ip::tcp::socket> lanes;
      lanes.push_back(std::move(mine[1]));
      conn = transport::make_uring_connection(
          0, 1, std::move(control), std::move(lanes), std::move(ring), slots, slot_bytes, thread,
          nullptr, [this](int, std::error_code ec, const std::string& text) {
            std::lock_guard lock(m);
            failure.ec = ec;
            failure.why = text;
          });
    });
  }
  ~UringLink() {
    on_thread([&] { conn.reset(); });
  }

  // Writes a put frame for put `k` (its index in put order) on socket `i`, as rank 1.
  void put(std::size_t i, std::uint32_t k, const std::vector<std::uint8_t>& body) {
    std::vector<std::uint8_t> wire;
    append_frame(wire, LinkHeader{LinkHeader::put, 7, (std::uint64_t{k} << 32) | body.size()},
                 body);
    asio::write(peer[i], asio::buffer(wire));
  }

  std::optional<std::error_code> failed() {
    std::lock_guard lock(m);
    return failure.ec;
  }

  // Waits up to 5 s for the link to fail, and checks that it failed with a protocol error whose
  // reason names `what`.
  void expect_protocol_error(const std::string& what) {
    for (int i = 0; i < 500 && !failed(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(failed());
    EXPECT_EQ(*failed(), make_error_code(errc::bad_message));
    std::lock_guard lock(m);
    EXPECT_NE(failure.why.find(what), std::string::npos) << failure.why;
  }
};

// The fast path's calls (try_put, peek, flush) on a link over a real tcp socket, the test playing
// the peer on the other socket and running the link's loop between calls.
struct PolledLink {
  asio::io_context io;
  asio::ip::tcp::socket peer{io};
  std::unique_ptr<transport::TcpConnection> conn;
  Failure failure;

  explicit PolledLink(std::size_t bytes = 64 << 10) {
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
    asio::ip::tcp::socket mine(io);
    mine.connect(acceptor.local_endpoint());
    acceptor.accept(peer);
    conn = std::make_unique<transport::TcpConnection>(
        0, 1, Stream(std::move(mine)), slots, bytes,
        [this](int, std::error_code ec, const std::string& why) {
          failure.ec = ec;
          failure.why = why;
        });
    conn->start();
    io.poll();
  }

  // Calls peek() until a chunk comes (running the loop between tries, as the proxy thread would
  // between fast operations only if `loop`); nothing if none within 10 s.
  std::optional<transport::Chunk> peek_for(bool loop) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      if (auto c = conn->peek()) return c;
      if (loop) io.poll();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return std::nullopt;
  }

  void send(const std::vector<std::uint8_t>& bytes) { asio::write(peer, asio::buffer(bytes)); }

  // Reads one frame as the peer, with the link's loop idle (the link writes the fast path's
  // frames itself); a header of type 0 if it does not come whole within 10 s.
  std::pair<LinkHeader, std::vector<std::uint8_t>> receive() {
    LinkHeader h{};
    if (!read_exact(&h, sizeof h)) return {LinkHeader{}, {}};
    std::vector<std::uint8_t> body(h.type == LinkHeader::put ? h.length : 0);
    if (!read_exact(body.data(), body.size())) return {LinkHeader{}, {}};
    return {h, body};
  }

  bool read_exact(void* dst, std::size_t n) {
    peer.non_blocking(true);
    auto* out = static_cast<std::uint8_t*>(dst);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (n > 0) {
      boost::system::error_code ec;
      const std::size_t got = peer.read_some(asio::buffer(out, n), ec);
      out += got;
      n -= got;
      if (ec == asio::error::would_block) {
        if (std::chrono::steady_clock::now() > until) {
          ADD_FAILURE() << "the peer read nothing for 10 s, " << n << " bytes short";
          return false;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      } else if (ec) {
        ADD_FAILURE() << "the peer's read failed: " << ec.message();
        return false;
      }
    }
    return true;
  }

  template <typename Done>
  bool run_until(Done done) {
    return drive_until(io, done);
  }
};

TEST(TcpLinkPolled, SmallChunksComeWithoutTheLoopAndALargeOneIsLeftToTheReader) {
  PolledLink link;
  ASSERT_TRUE(link.conn->pollable());
  const auto small = payload(8, 1), mid = payload(300, 2), large = payload(40000, 3);
  std::vector<std::uint8_t> wire;
  append_frame(wire, LinkHeader{LinkHeader::put, 21, small.size()}, small);
  append_frame(wire, LinkHeader{LinkHeader::put, 22, mid.size()}, mid);
  // Larger than the reader's buffer: only the reader coroutine reads it, straight into its slot.
  append_frame(wire, LinkHeader{LinkHeader::put, 23, large.size()}, large);
  link.send(wire);

  for (const auto& [want, fp] : {std::pair{&small, 21u}, std::pair{&mid, 22u}}) {
    auto c = link.peek_for(false);
    ASSERT_TRUE(c) << "no chunk without the loop";
    EXPECT_EQ(c->fingerprint, fp);
    ASSERT_EQ(c->size, want->size());
    EXPECT_EQ(std::memcmp(c->data, want->data(), want->size()), 0);
    link.conn->take_peeked();
    link.conn->release();
  }
  // The large frame stops the fast path: peek() has nothing, and the link hands itself over
  // until the reader has taken the frame.
  EXPECT_FALSE(link.conn->peek());
  EXPECT_FALSE(link.conn->pollable());
  // Its end: the two credits leave in one frame, and the reader is woken for the large chunk.
  link.conn->flush();
  const auto [credit, none] = link.receive();
  EXPECT_EQ(credit.type, LinkHeader::credit);
  EXPECT_EQ(credit.length, 2u);
  std::optional<transport::Chunk> got;
  asio::co_spawn(
      link.io, [&]() -> asio::awaitable<void> { got = co_await link.conn->wait(); },
      asio::detached);
  ASSERT_TRUE(link.run_until([&] { return got.has_value(); }));
  EXPECT_EQ(got->fingerprint, 23u);
  ASSERT_EQ(got->size, large.size());
  EXPECT_EQ(std::memcmp(got->data, large.data(), large.size()), 0);
  link.conn->release();
  // The reader took the frame: the link can be polled again.
  EXPECT_TRUE(link.conn->pollable());
  EXPECT_FALSE(link.failure.ec) << link.failure.why;
}

TEST(TcpLinkPolled, PutsAreHeldUntilThePeekAndGoInOneWrite) {
  PolledLink link;
  const auto a = payload(80, 4), b = payload(8, 5);
  ASSERT_TRUE(link.conn->try_put(a.data(), a.size(), 31));
  ASSERT_TRUE(link.conn->try_put(b.data(), b.size(), 32));
  EXPECT_FALSE(link.conn->peek());  // writes both, finds nothing yet
  link.conn->flush();
  for (const auto& [want, fp] : {std::pair{&a, 31u}, std::pair{&b, 32u}}) {
    const auto [h, body] = link.receive();
    EXPECT_EQ(h.type, LinkHeader::put);
    EXPECT_EQ(h.fingerprint, fp);
    EXPECT_EQ(body, *want);
  }
  // Both slots of the four used: two more puts fit, a third waits for a credit that pump() takes
  // without the loop.
  ASSERT_TRUE(link.conn->try_put(b.data(), b.size(), 33));
  ASSERT_TRUE(link.conn->try_put(b.data(), b.size(), 34));
  EXPECT_FALSE(link.conn->try_put(b.data(), b.size(), 35));
  std::vector<std::uint8_t> wire;
  append_frame(wire, LinkHeader{LinkHeader::credit, 0, 3});
  link.send(wire);
  bool put = false;
  for (int i = 0; i < 10000 && !put; ++i) {
    put = link.conn->try_put(b.data(), b.size(), 35);
    if (!put) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  EXPECT_TRUE(put);
  link.conn->flush();
  for (std::uint32_t fp : {33u, 34u, 35u}) EXPECT_EQ(link.receive().first.fingerprint, fp);
  EXPECT_FALSE(link.failure.ec) << link.failure.why;
}

TEST(TcpLinkPolled, AFrameSplitIntoPiecesIsTakenWhenWhole) {
  PolledLink link;
  const auto body = payload(1000, 6);
  std::vector<std::uint8_t> wire;
  append_frame(wire, LinkHeader{LinkHeader::put, 41, body.size()}, body);
  for (std::size_t at = 0; at < wire.size(); at += 333) {
    EXPECT_FALSE(link.conn->peek());
    link.send({wire.begin() + static_cast<std::ptrdiff_t>(at),
               wire.begin() + static_cast<std::ptrdiff_t>(std::min(at + 333, wire.size()))});
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto c = link.peek_for(false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->fingerprint, 41u);
  ASSERT_EQ(c->size, body.size());
  EXPECT_EQ(std::memcmp(c->data, body.data(), body.size()), 0);
  link.conn->take_peeked();
  link.conn->release();
  link.conn->flush();
  EXPECT_EQ(link.receive().first.type, LinkHeader::credit);
}

// Each stops the fast path at once (the link is no longer pollable, so the operation is handed
// over instead of polling for what will never come until its spin ends), and the reader fails the
// link with the reason.
TEST(TcpLinkPolled, AnEndAnAbortOrAProtocolErrorMetByThePeekFailsTheLinkThroughTheReader) {
  const char* variants[] = {"the peer closes", "a credit for slots never filled",
                            "the peer's abort notice"};
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variants[variant]);
    PolledLink link;
    const auto body = payload(16, 7);
    const std::string why = "rank 1 failed";
    std::vector<std::uint8_t> wire;
    append_frame(wire, LinkHeader{LinkHeader::put, 51, body.size()}, body);
    if (variant == 1) append_frame(wire, LinkHeader{LinkHeader::credit, 0, 1});
    if (variant == 2)
      append_frame(wire,
                   LinkHeader{LinkHeader::abort, static_cast<std::uint32_t>(errc::mismatch),
                              static_cast<std::uint32_t>(why.size())},
                   std::vector<std::uint8_t>(why.begin(), why.end()));
    link.send(wire);
    if (variant == 0) link.peer.close();
    // The chunk that came before the end is delivered.
    auto c = link.peek_for(false);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->fingerprint, 51u);
    link.conn->take_peeked();
    // What follows is the reader's: the next peek finds nothing and the link hands over, before
    // the loop has run.
    for (int i = 0; i < 1000 && link.conn->pollable(); ++i) {
      EXPECT_FALSE(link.conn->peek());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_FALSE(link.conn->pollable());
    EXPECT_FALSE(link.failure.ec) << link.failure.why;
    link.conn->flush();
    ASSERT_TRUE(link.run_until([&] { return link.failure.ec.has_value(); }));
    const errc want[] = {errc::peer_lost, errc::bad_message, errc::mismatch};
    EXPECT_EQ(*link.failure.ec, make_error_code(want[variant])) << link.failure.why;
    if (variant == 2) {
      EXPECT_NE(link.failure.why.find(why), std::string::npos) << link.failure.why;
    }
    EXPECT_FALSE(link.conn->pollable());
  }
}

// A credit that the slow path queued and the loop has not written yet goes with the fast path's
// frames, ahead of them.
TEST(TcpLinkPolled, ACreditQueuedBeforeTheFastPathLeavesFirst) {
  PolledLink link;
  const auto body = payload(8, 8);
  std::vector<std::uint8_t> wire;
  append_frame(wire, LinkHeader{LinkHeader::put, 61, body.size()}, body);
  link.send(wire);
  std::optional<transport::Chunk> got;
  asio::co_spawn(
      link.io, [&]() -> asio::awaitable<void> { got = co_await link.conn->wait(); },
      asio::detached);
  ASSERT_TRUE(link.run_until([&] { return got.has_value(); }));
  link.conn->release();  // queued; its write is posted, not run
  ASSERT_TRUE(link.conn->pollable());
  ASSERT_TRUE(link.conn->try_put(body.data(), body.size(), 62));
  EXPECT_FALSE(link.conn->peek());
  link.conn->flush();
  const auto first = link.receive();
  EXPECT_EQ(first.first.type, LinkHeader::credit);
  EXPECT_EQ(first.first.length, 1u);
  const auto second = link.receive();
  EXPECT_EQ(second.first.type, LinkHeader::put);
  EXPECT_EQ(second.first.fingerprint, 62u);
  // The posted write finds nothing left; the link stays healthy.
  link.io.poll();
  EXPECT_TRUE(link.conn->pollable());
  EXPECT_FALSE(link.failure.ec) << link.failure.why;
}

// A peer that destroyed its communicator right after its last puts (a header and its data, say):
// the chunks and the goodbye come in one read, and each chunk is still taken on the fast path;
// nothing more can be put to it.
TEST(TcpLinkPolled, ChunksThatCameWithTheGoodbyeAreStillTaken) {
  PolledLink link;
  const auto first = payload(24, 9), second = payload(40, 10);
  std::vector<std::uint8_t> wire;
  append_frame(wire, LinkHeader{LinkHeader::put, 71, first.size()}, first);
  append_frame(wire, LinkHeader{LinkHeader::put, 72, second.size()}, second);
  append_frame(wire, LinkHeader{LinkHeader::bye, 0, 0});
  link.send(wire);
  for (const auto& [want, fp] : {std::pair{&first, 71u}, std::pair{&second, 72u}}) {
    auto c = link.peek_for(false);
    ASSERT_TRUE(c) << "a chunk sent before the goodbye was not delivered";
    EXPECT_EQ(c->fingerprint, fp);
    ASSERT_EQ(c->size, want->size());
    EXPECT_EQ(std::memcmp(c->data, want->data(), want->size()), 0);
    link.conn->take_peeked();
    link.conn->release();
  }
  // Nothing left to take and the peer gone: the link hands over, and puts are refused.
  EXPECT_FALSE(link.conn->pollable());
  EXPECT_FALSE(link.conn->try_put(first.data(), first.size(), 73));
  link.conn->flush();
  EXPECT_FALSE(link.failure.ec) << link.failure.why;
}

bool uring_here() { return transport::uring_unavailable().empty(); }

TEST(UringTcpLink, PutsOvertakingEachOtherAcrossSocketsComeOutInPutOrder) {
  if (!uring_here()) GTEST_SKIP() << transport::uring_unavailable();
  UringLink link;
  // Put 1 arrives first, on socket 1; put 0 then on socket 0; put 2 on socket 1 again.
  const auto p0 = payload(8, 1), p1 = payload(100, 2), p2 = payload(3000, 3);
  link.put(1, 1, p1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  link.put(0, 0, p0);
  link.put(1, 2, p2);
  std::vector<std::vector<std::uint8_t>> got;
  auto done = asio::co_spawn(
      link.thread.executor(),
      [&]() -> asio::awaitable<void> {
        for (int k = 0; k < 3; ++k) {
          transport::Chunk c = co_await link.conn->wait();
          const auto* p = reinterpret_cast<const std::uint8_t*>(c.data);
          got.emplace_back(p, p + c.size);
          link.conn->release();
        }
      },
      asio::use_future);
  ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  done.get();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], p0);
  EXPECT_EQ(got[1], p1);
  EXPECT_EQ(got[2], p2);
  EXPECT_FALSE(link.failed());
}

TEST(UringTcpLink, APutOutsideTheCreditedSlotsOrSentTwiceIsAProtocolError) {
  if (!uring_here()) GTEST_SKIP() << transport::uring_unavailable();
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "beyond the window" : "the same put twice");
    UringLink link;
    if (variant == 0) {
      // Four slots: put 4 needs a credit for put 0's slot, which was never returned.
      link.put(0, 4, payload(8, 1));
    } else {
      link.put(0, 1, payload(8, 1));
      link.put(1, 1, payload(8, 2));
    }
    link.expect_protocol_error("put without credit");
  }
}

// The goodbye comes on socket 0 after the peer's last put there, but a put it made before on a
// socket of the ring may still be on its way: the link keeps delivering until every socket has
// ended, and only then fails a wait for more, naming the departure.
TEST(UringTcpLink, AfterAGoodbyeAPutStillOnAnotherSocketIsDeliveredBeforeTheDeparture) {
  if (!uring_here()) GTEST_SKIP() << transport::uring_unavailable();
  UringLink link;
  const auto p0 = payload(8, 1), p1 = payload(3000, 2);
  std::vector<std::uint8_t> wire;
  append_frame(wire, LinkHeader{LinkHeader::put, 7, p0.size()}, p0);
  append_frame(wire, LinkHeader{LinkHeader::bye, 0, 0});
  asio::write(link.peer[0], asio::buffer(wire));
  link.peer[0].shutdown(asio::ip::tcp::socket::shutdown_both);
  std::vector<std::vector<std::uint8_t>> got;
  std::string end;
  auto done = asio::co_spawn(
      link.thread.executor(),
      [&]() -> asio::awaitable<void> {
        try {
          for (;;) {
            transport::Chunk c = co_await link.conn->wait();
            const auto* p = reinterpret_cast<const std::uint8_t*>(c.data);
            got.emplace_back(p, p + c.size);
            link.conn->release();
          }
        } catch (const transport::LinkError& e) {
          end = e.what();
        }
      },
      asio::use_future);
  // Put 1 follows on socket 1 well after the goodbye has been read, then that socket ends too.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  link.put(1, 1, p1);
  link.peer[1].shutdown(asio::ip::tcp::socket::shutdown_both);
  ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  done.get();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], p0);
  EXPECT_EQ(got[1], p1);
  EXPECT_NE(end.find("destroyed its communicator"), std::string::npos) << end;
}

// Notices travel on socket 0 only; an abort notice on a socket of the ring is a protocol error,
// not an abort.
TEST(UringTcpLink, ANoticeOnASocketOfTheRingIsAProtocolError) {
  if (!uring_here()) GTEST_SKIP() << transport::uring_unavailable();
  UringLink link;
  std::vector<std::uint8_t> wire;
  append_frame(wire, LinkHeader{LinkHeader::abort, 0, 2}, {'n', 'o'});
  asio::write(link.peer[1], asio::buffer(wire));
  link.expect_protocol_error("on socket 1");
}

}  // namespace
}  // namespace coccl
