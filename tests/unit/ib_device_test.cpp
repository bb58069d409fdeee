// The ib transport on a real RDMA device: device choice, registration with the device, and a
// pair of connections in one process carrying puts split over several queue pairs. These run in
// the Soft-RoCE guest (tests/rdma); on a machine without a device they skip, saying why, and the
// test of what forcing ib does there runs instead.
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <coccl/coccl.hpp>
#include <coccl/error.hpp>
#include <cstring>
#include <optional>
#include <vector>

#include "collectives/comm_params.hpp"
#include "transport/ib.hpp"

namespace coccl::transport {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class IbDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    dev_ = ib::Device::get(&why);
    if (!dev_) GTEST_SKIP() << "no usable RDMA device here: " << why;
  }
  std::shared_ptr<ib::Device> dev_;
};

TEST(IbUnavailable, ForcingIbWithoutADeviceFailsCommunicatorCreationWithTheReason) {
  std::string why;
  if (ib::Device::get(&why)) GTEST_SKIP() << "this machine has an RDMA device";
  params::transport.set_override("ib");
  try {
    Communicator::create(UniqueId::create(), 0, 1);
    ADD_FAILURE() << "a communicator was created over ib without a device";
  } catch (const std::system_error& e) {
    // The reason ("the ib transport is not available: <why>") is in the creation's WARN line.
    EXPECT_EQ(e.code(), make_error_code(errc::unsupported)) << e.what();
  }
  params::transport.set_override(std::nullopt);
}

TEST_F(IbDevice, UsesAnActivePortAndOnRoceARoceV2Gid) {
  EXPECT_FALSE(dev_->name().empty());
  EXPECT_GE(dev_->port(), 1);
  if (dev_->ethernet()) {
    EXPECT_TRUE(ib::is_roce_v2(dev_->name(), dev_->port(), dev_->gid_index()));
  }
}

TEST_F(IbDevice, RegisteringABufferTwiceReusesTheMemoryRegion) {
  std::vector<std::byte> buf(1 << 20);
  auto& cache = ib::registrations(dev_);
  auto a = cache.get(buf.data(), buf.size());
  auto b = cache.get(buf.data() + 4096, 8192);
  EXPECT_EQ(a, b);
  ASSERT_NE(a->handle, nullptr);
  EXPECT_EQ(static_cast<ibv_mr*>(a->handle)->lkey, a->lkey);
  cache.forget(buf.data(), buf.size());
  EXPECT_EQ(cache.find(buf.data(), buf.size()), nullptr);
}

// Two connected IbConnections in this process, driven by hand: the poller while someone waits,
// the io_context for the completion channel's events.
struct Pair {
  static constexpr std::size_t slots = 4;
  static constexpr std::size_t slot_bytes = 256 << 10;
  static constexpr std::size_t block_min = 64 << 10;

  asio::io_context ctx;
  IbPoller poller;
  std::string failure[2];
  std::unique_ptr<IbConnection> conn[2];
  std::shared_ptr<UserBuffers> buffers;

  Pair(const std::shared_ptr<ib::Device>& dev, int qps, bool bad_rkey = false)
      : buffers(std::make_shared<UserBuffers>(&ib::registrations(dev))) {
    tcp::acceptor acc(ctx, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    tcp::socket s0(ctx), s1(ctx);
    s0.connect(acc.local_endpoint());
    acc.accept(s1);
    auto l0 = std::make_unique<ib::Link>(dev, slots, slot_bytes, qps, block_min);
    auto l1 = std::make_unique<ib::Link>(dev, slots, slot_bytes, qps, block_min);
    ib::LinkAddress a1 = l1->address();
    if (bad_rkey) a1.rkey ^= 0x5a5a;
    l0->connect(a1);
    l1->connect(l0->address());
    conn[0] = std::make_unique<IbConnection>(
        0, 1, transport::Stream(std::move(s0)), std::move(l0), 4096, poller, buffers,
        [this](int, std::error_code, const std::string& w) { failure[0] = w; });
    conn[1] = std::make_unique<IbConnection>(
        1, 0, transport::Stream(std::move(s1)), std::move(l1), 4096, poller, buffers,
        [this](int, std::error_code, const std::string& w) { failure[1] = w; });
    conn[0]->start();
    conn[1]->start();
  }

  // Runs until `done` or a minute passes (a hang fails the test rather than blocking it).
  bool drive(const bool& done) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done && std::chrono::steady_clock::now() < until) {
      poller.poll();
      ctx.poll();
    }
    return done;
  }
};

std::vector<std::byte> pattern(std::size_t n, std::size_t seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte((i * 31 + seed * 7) & 0xff);
  return v;
}

const std::vector<std::size_t> sizes{0, 1, 63, 4096, 4097, 65536, 200000, Pair::slot_bytes};
constexpr int rounds = 3;  // wraps the four-slot ring several times

asio::awaitable<void> send_all(IbConnection* c, bool* done) {
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto data = pattern(sizes[i], r * 100 + i);
      co_await c->put(data.data(), data.size(), static_cast<std::uint32_t>(r * 100 + i));
    }
  *done = true;
}

asio::awaitable<void> receive_all(IbConnection* c, int* bad, bool* done) {
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Chunk ch = co_await c->wait();
      auto want = pattern(sizes[i], r * 100 + i);
      if (ch.size != want.size() || ch.fingerprint != static_cast<std::uint32_t>(r * 100 + i) ||
          (ch.size && std::memcmp(ch.data, want.data(), ch.size) != 0))
        ++*bad;
      c->release();
    }
  *done = true;
}

class IbPair : public IbDevice, public ::testing::WithParamInterface<int> {};

TEST_P(IbPair, PutsOfEverySizeArriveWholeAndInOrderBothWays) {
  Pair p(dev_, GetParam());
  bool sent[2] = {false, false}, received[2] = {false, false};
  int bad[2] = {0, 0};
  for (int s = 0; s < 2; ++s) {
    asio::co_spawn(p.ctx, send_all(p.conn[s].get(), &sent[s]), asio::detached);
    asio::co_spawn(p.ctx, receive_all(p.conn[1 - s].get(), &bad[1 - s], &received[1 - s]),
                   asio::detached);
  }
  ASSERT_TRUE(p.drive(received[0])) << p.failure[0] << p.failure[1];
  ASSERT_TRUE(p.drive(received[1])) << p.failure[0] << p.failure[1];
  EXPECT_TRUE(sent[0] && sent[1]);
  EXPECT_EQ(bad[0], 0);
  EXPECT_EQ(bad[1], 0);
  EXPECT_EQ(p.failure[0], "");
  EXPECT_EQ(p.failure[1], "");
}

INSTANTIATE_TEST_SUITE_P(QueuePairs, IbPair, ::testing::Values(1, 4),
                         [](const auto& info) { return std::to_string(info.param) + "qps"; });

// ---- blocks: the rendezvous, zero-copy between registered buffers, staged otherwise -------------

// Small transfers, blocks at the threshold and above, more of them than the offer window.
const std::vector<std::size_t> block_sizes{1000, Pair::block_min, 300001, 3 << 20, 70000};
constexpr int block_rounds = 3;
constexpr std::uint32_t block_fp = 0xb10c;

struct BlockCase {
  const char* name;
  bool reg_src, reg_dst;
};

asio::awaitable<void> send_blocks(IbConnection* c, std::vector<std::vector<std::byte>>* bufs,
                                  int* bad, bool* done) {
  for (auto& b : *bufs) {
    if (c->uses_blocks(b.size())) {
      BlockOffer o = co_await c->next_offer();
      if (o.size != b.size() || o.fingerprint != block_fp) ++*bad;
      if (co_await c->write_block(b.data(), b.size())) continue;
    }
    for (std::size_t off = 0; off < b.size(); off += Pair::slot_bytes)
      co_await c->put(b.data() + off, std::min(Pair::slot_bytes, b.size() - off), block_fp);
  }
  co_await c->flush_blocks();
  *done = true;
}

asio::awaitable<void> receive_blocks(IbConnection* c, std::vector<std::vector<std::byte>>* bufs,
                                     int* bad, bool* done) {
  std::vector<std::optional<std::uint64_t>> ids;
  for (auto& b : *bufs)
    ids.push_back(c->uses_blocks(b.size()) ? std::optional(c->offer(b.data(), b.size(), block_fp))
                                           : std::nullopt);
  for (std::size_t i = 0; i < bufs->size(); ++i) {
    auto& b = (*bufs)[i];
    bool landed = false;
    if (ids[i]) landed = co_await c->landed(*ids[i]);
    if (landed) continue;
    for (std::size_t off = 0; off < b.size(); off += Pair::slot_bytes) {
      Chunk ch = co_await c->wait();
      const std::size_t len = std::min(Pair::slot_bytes, b.size() - off);
      if (ch.size != len || ch.fingerprint != block_fp) ++*bad;
      std::memcpy(b.data() + off, ch.data, std::min(ch.size, len));
      c->release();
    }
  }
  *done = true;
}

void PrintTo(const BlockCase& c, std::ostream* os) { *os << c.name; }

class IbBlocks : public IbDevice, public ::testing::WithParamInterface<BlockCase> {};

TEST_P(IbBlocks, ArriveWholeZeroCopyOnlyWhenBothBuffersAreRegistered) {
  const BlockCase bc = GetParam();
  Pair p(dev_, 2);
  std::vector<std::vector<std::byte>> src, dst;
  std::vector<std::uint64_t> handles;
  std::uint64_t block_bytes = 0;
  for (int r = 0; r < block_rounds; ++r)
    for (std::size_t i = 0; i < block_sizes.size(); ++i) {
      src.push_back(pattern(block_sizes[i], r * 10 + i));
      dst.emplace_back(block_sizes[i], std::byte{0});
      if (block_sizes[i] >= Pair::block_min) block_bytes += block_sizes[i];
    }
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (bc.reg_src) handles.push_back(p.buffers->add(src[i].data(), src[i].size()));
    if (bc.reg_dst) handles.push_back(p.buffers->add(dst[i].data(), dst[i].size()));
  }
  bool sent = false, received = false;
  int bad_send = 0, bad_recv = 0;
  asio::co_spawn(p.ctx, send_blocks(p.conn[0].get(), &src, &bad_send, &sent), asio::detached);
  asio::co_spawn(p.ctx, receive_blocks(p.conn[1].get(), &dst, &bad_recv, &received),
                 asio::detached);
  ASSERT_TRUE(p.drive(received)) << p.failure[0] << p.failure[1];
  ASSERT_TRUE(p.drive(sent)) << p.failure[0] << p.failure[1];
  EXPECT_EQ(bad_send, 0);
  EXPECT_EQ(bad_recv, 0);
  for (std::size_t i = 0; i < src.size(); ++i) EXPECT_TRUE(src[i] == dst[i]) << "transfer " << i;
  EXPECT_EQ(p.buffers->zero_copy_bytes(), bc.reg_src && bc.reg_dst ? block_bytes : 0u);
  EXPECT_EQ(p.failure[0], "");
  EXPECT_EQ(p.failure[1], "");
  for (auto h : handles) p.buffers->remove(h);
}

INSTANTIATE_TEST_SUITE_P(Registration, IbBlocks,
                         ::testing::Values(BlockCase{"both", true, true},
                                           BlockCase{"sender", true, false},
                                           BlockCase{"receiver", false, true},
                                           BlockCase{"neither", false, false}),
                         [](const auto& info) { return std::string(info.param.name); });

asio::awaitable<void> put_once(IbConnection* c, bool* done) {
  std::vector<std::byte> data(1000, std::byte{1});
  try {
    co_await c->put(data.data(), data.size(), 1);
  } catch (const LinkError&) {
  }
  *done = true;
}

TEST_F(IbDevice, AFailedCompletionFailsTheConnectionNamingThePeerAndTheStatus) {
  Pair p(dev_, 1, /*bad_rkey=*/true);
  bool posted = false;
  asio::co_spawn(p.ctx, put_once(p.conn[0].get(), &posted), asio::detached);
  bool failed = false;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!failed && std::chrono::steady_clock::now() < until) {
    p.conn[0]->check();
    p.ctx.poll();
    failed = !p.failure[0].empty();
  }
  ASSERT_TRUE(failed);
  EXPECT_NE(p.failure[0].find("rank 1"), std::string::npos) << p.failure[0];
  EXPECT_NE(p.failure[0].find("remote access error"), std::string::npos) << p.failure[0];
}

}  // namespace
}  // namespace coccl::transport
