// The registration cache, with a fake device (ib_device_test checks it with real verbs): hits
// cost nothing, overlapping and adjacent ranges merge into one registration, forgotten memory is
// deregistered once no holder is left. Also the table of user-registered buffers on top of it.
#include <gtest/gtest.h>

#include <coccl/error.hpp>
#include <vector>

#include "transport/ib_mr.hpp"
#include "transport/user_buffers.hpp"

namespace coccl::transport::ib {
namespace {

// Fake device: records registrations and deregistrations; keys count up.
struct FakeDevice {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> registered;
  std::vector<std::uint32_t> deregistered;
  std::uint32_t next_key = 1;

  RegCache cache() {
    return RegCache(
        [this](void* p, std::size_t n) {
          auto a = reinterpret_cast<std::uintptr_t>(p);
          registered.emplace_back(a, a + n);
          std::uint32_t k = next_key++;
          return Registration{0, 0, k, k + 1000, nullptr};
        },
        [this](const Registration& r) { deregistered.push_back(r.lkey); });
  }
};

class RegCacheTest : public ::testing::Test {
 protected:
  FakeDevice dev;
  std::vector<std::byte> mem = std::vector<std::byte>(1 << 16);
  std::byte* at(std::size_t off) { return mem.data() + off; }
  std::uintptr_t addr(std::size_t off) { return reinterpret_cast<std::uintptr_t>(at(off)); }
};

TEST_F(RegCacheTest, RegisteringTheSameBufferAgainReturnsTheSameRegistration) {
  RegCache c = dev.cache();
  auto a = c.get(at(0), 4096);
  auto b = c.get(at(0), 4096);
  EXPECT_EQ(a, b);
  EXPECT_EQ(dev.registered.size(), 1u);
  EXPECT_EQ(a->lkey, 1u);
  EXPECT_EQ(a->rkey, 1001u);
}

TEST_F(RegCacheTest, ARangeInsideARegistrationIsAHit) {
  RegCache c = dev.cache();
  auto a = c.get(at(0), 8192);
  auto b = c.get(at(100), 50);
  EXPECT_EQ(a, b);
  EXPECT_EQ(dev.registered.size(), 1u);
  EXPECT_EQ(c.find(at(8000), 192), a);
  EXPECT_EQ(c.find(at(8000), 193), nullptr);
}

TEST_F(RegCacheTest, OverlappingRangesMergeIntoOneRegistration) {
  RegCache c = dev.cache();
  auto a = c.get(at(0), 4096);
  auto b = c.get(at(2048), 4096);
  ASSERT_EQ(dev.registered.size(), 2u);
  EXPECT_EQ(dev.registered[1], std::make_pair(addr(0), addr(6144)));
  EXPECT_EQ(b->begin, addr(0));
  EXPECT_EQ(b->end, addr(6144));
  EXPECT_EQ(c.size(), 1u);
  // The replaced registration stays valid while held (work requests may still use it).
  EXPECT_TRUE(dev.deregistered.empty());
  a.reset();
  EXPECT_EQ(dev.deregistered, std::vector<std::uint32_t>{1});
}

TEST_F(RegCacheTest, ARangeSpanningSeveralRegistrationsReplacesThemAll) {
  RegCache c = dev.cache();
  c.get(at(0), 1024);
  c.get(at(4096), 1024);
  c.get(at(10000), 100);
  auto all = c.get(at(512), 8192);
  EXPECT_EQ(all->begin, addr(0));
  EXPECT_EQ(all->end, addr(8704));
  EXPECT_EQ(c.size(), 2u);  // the merged one and the one at 10000
  EXPECT_EQ(dev.deregistered.size(), 2u);
}

TEST_F(RegCacheTest, AdjacentRangesMerge) {
  RegCache c = dev.cache();
  c.get(at(0), 4096);
  auto b = c.get(at(4096), 4096);
  EXPECT_EQ(b->begin, addr(0));
  EXPECT_EQ(b->end, addr(8192));
  EXPECT_EQ(c.size(), 1u);
}

TEST_F(RegCacheTest, ForgettingFreedMemoryDeregistersEveryOverlappingRegistration) {
  RegCache c = dev.cache();
  c.get(at(0), 1024);
  c.get(at(2048), 1024);
  c.get(at(8192), 1024);
  c.forget(at(512), 2048);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(dev.deregistered, (std::vector<std::uint32_t>{1, 2}));
  EXPECT_EQ(c.find(at(0), 1), nullptr);
  EXPECT_NE(c.find(at(8192), 1024), nullptr);
}

TEST_F(RegCacheTest, AHeldRegistrationOutlivesForgetAndTheCache) {
  std::shared_ptr<const Registration> held;
  {
    RegCache c = dev.cache();
    held = c.get(at(0), 4096);
    c.forget(at(0), 4096);
    EXPECT_TRUE(dev.deregistered.empty());
  }
  EXPECT_TRUE(dev.deregistered.empty());
  held.reset();
  EXPECT_EQ(dev.deregistered, std::vector<std::uint32_t>{1});
}

TEST_F(RegCacheTest, DestroyingTheCacheDeregistersWhatOnlyItHeld) {
  {
    RegCache c = dev.cache();
    c.get(at(0), 4096);
    c.get(at(8192), 4096);
  }
  EXPECT_EQ(dev.deregistered.size(), 2u);
}

TEST_F(RegCacheTest, AFailedRegistrationLeavesTheCacheAsItWas) {
  RegCache c([](void*, std::size_t) -> Registration { throw std::runtime_error("no memory"); },
             [](const Registration&) {});
  EXPECT_THROW(c.get(at(0), 4096), std::runtime_error);
  EXPECT_EQ(c.size(), 0u);
}

TEST_F(RegCacheTest, WhenTheUnionIsRefusedTheRangeAloneIsRegistered) {
  // The first buffer is then "freed" without forget(): the device refuses its pages from then on.
  bool freed = false;
  RegCache c(
      [&](void* p, std::size_t) {
        if (freed && reinterpret_cast<std::uintptr_t>(p) < addr(4096))
          throw std::system_error(EFAULT, std::system_category(), "bad address");
        return Registration{0, 0, 7, 8, nullptr};
      },
      [](const Registration&) {});
  c.get(at(0), 4096);
  freed = true;
  auto r = c.get(at(4096), 4096);  // touches the stale one: the union is refused
  EXPECT_EQ(r->begin, addr(4096));
  EXPECT_EQ(r->end, addr(8192));
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.find(at(0), 16), nullptr);
  // A refused range of its own is still an error.
  EXPECT_THROW(c.get(at(1024), 100), std::system_error);
}

TEST_F(RegCacheTest, ZeroBytesIsAnInvalidArgument) {
  RegCache c = dev.cache();
  try {
    c.get(at(0), 0);
    ADD_FAILURE() << "registered 0 bytes";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
  }
}

// ---- UserBuffers: what register_buffer records ----------------------------------------------

TEST_F(RegCacheTest, AUserBufferIsFoundForAnyRangeInsideItAndNotBeyond) {
  RegCache c = dev.cache();
  UserBuffers u(&c);
  u.add(at(4096), 8192);
  EXPECT_NE(u.find(at(4096), 8192), nullptr);
  EXPECT_NE(u.find(at(5000), 100), nullptr);
  EXPECT_EQ(u.find(at(4096), 8193), nullptr);
  EXPECT_EQ(u.find(at(4095), 2), nullptr);
  // Registered with the cache, not only recorded.
  EXPECT_EQ(dev.registered.size(), 1u);
}

TEST_F(RegCacheTest, RemovingAUserBufferForgetsItAndDeregistersIt) {
  RegCache c = dev.cache();
  UserBuffers u(&c);
  auto h = u.add(at(0), 4096);
  u.remove(h);
  EXPECT_EQ(u.find(at(0), 4096), nullptr);
  EXPECT_EQ(c.find(at(0), 4096), nullptr);
  EXPECT_EQ(dev.deregistered, std::vector<std::uint32_t>{1});
  u.remove(h);  // a second remove is harmless
  EXPECT_EQ(dev.deregistered.size(), 1u);
}

TEST_F(RegCacheTest, AnOverlappingUserBufferStaysUsableWhenTheOtherIsRemoved) {
  RegCache c = dev.cache();
  UserBuffers u(&c);
  auto a = u.add(at(0), 8192);
  u.add(at(4096), 8192);  // merges with the first in the cache
  u.remove(a);
  EXPECT_EQ(u.find(at(0), 4096), nullptr);
  auto r = u.find(at(4096), 8192);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->covers(at(4096), 8192));
}

TEST_F(RegCacheTest, RegisteringAUserBufferAgainCostsNoNewRegistration) {
  RegCache c = dev.cache();
  UserBuffers u(&c);
  u.add(at(0), 16384);
  u.add(at(0), 16384);
  u.add(at(1024), 4096);
  EXPECT_EQ(dev.registered.size(), 1u);
}

TEST_F(RegCacheTest, BadUserBuffersAreInvalidArguments) {
  RegCache c = dev.cache();
  UserBuffers u(&c);
  for (auto [p, n] : {std::pair<void*, std::size_t>{nullptr, 16},
                      {at(0), 0},
                      {reinterpret_cast<void*>(~std::uintptr_t{0} - 8), 64}}) {
    try {
      u.add(p, n);
      ADD_FAILURE() << "registered " << p << " + " << n;
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
    }
  }
  EXPECT_TRUE(dev.registered.empty());
}

TEST_F(RegCacheTest, WithoutADeviceUserBuffersAreRecordedButNeverUsedForZeroCopy) {
  UserBuffers u(nullptr);
  auto h = u.add(at(0), 4096);
  EXPECT_EQ(u.find(at(0), 4096), nullptr);
  u.remove(h);
  EXPECT_EQ(u.zero_copy_bytes(), 0u);
}

}  // namespace
}  // namespace coccl::transport::ib
