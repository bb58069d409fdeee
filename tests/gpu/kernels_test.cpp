// tests/gpu/kernels_test.cpp: the CUDA kernels against the host reference (collectives/
// reduce_cpu), on one GPU for the element-wise kernels and on two GPUs of one process for the peer
// collectives. Skips when the GPUs are not there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/reduce_cpu.hpp"
#include "kernels/launch.hpp"
#include "tests/gpu/gpu_harness.hpp"

namespace coccl {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::Group;
using Bytes = std::vector<unsigned char>;

constexpr std::size_t oneshot_max = 256 * 1024;
// A small staging area (2 KiB slices) makes every bulk test run many tiles and blocks.
constexpr std::size_t small_staging = 1 << 20;

constexpr DataType all_types[] = {DataType::int8,     DataType::uint8,       DataType::int32,
                                  DataType::uint32,   DataType::int64,       DataType::uint64,
                                  DataType::float16,  DataType::float32,     DataType::float64,
                                  DataType::bfloat16, DataType::float8_e4m3, DataType::float8_e5m2};
constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::max, ReduceOp::min,
                                ReduceOp::avg};

kernels::stream_t as_stream(cudaStream_t s) { return reinterpret_cast<kernels::stream_t>(s); }

std::string name_of(DataType t, ReduceOp op) {
  return std::string(to_string(t)) + "/" + std::string(to_string(op));
}

// Random finite values small enough that no product of 8 of them overflows a float type (so no
// inf * 0 NaN, whose bit pattern the reference and CUDA spell differently).
Bytes random_values(DataType t, std::size_t count, std::mt19937_64& rng) {
  const std::size_t es = size_of(t);
  Bytes out(count * es);
  std::uniform_real_distribution<float> small(-4.0f, 4.0f);
  for (std::size_t i = 0; i < count; ++i) {
    unsigned char* p = out.data() + i * es;
    const float f = small(rng);
    switch (t) {
      case DataType::float16: {
        const std::uint16_t v = detail::float_to_half(f);
        std::memcpy(p, &v, 2);
        break;
      }
      case DataType::bfloat16: {
        const std::uint16_t v = detail::float_to_bf16(f);
        std::memcpy(p, &v, 2);
        break;
      }
      case DataType::float8_e4m3:
        *p = detail::float_to_e4m3(f);
        break;
      case DataType::float8_e5m2:
        *p = detail::float_to_e5m2(f);
        break;
      case DataType::float32: {
        const float v = f * 25.0f;
        std::memcpy(p, &v, 4);
        break;
      }
      case DataType::float64: {
        const double v = static_cast<double>(f) * 25.0 + static_cast<double>(small(rng)) * 1e-9;
        std::memcpy(p, &v, 8);
        break;
      }
      default: {
        const std::uint64_t v = rng();
        std::memcpy(p, &v, es);
        break;
      }
    }
  }
  return out;
}

// The expected all-reduce / reduce result: reduce_n in rank order, then divide_by for avg.
Bytes reference(const std::vector<Bytes>& inputs, std::size_t count, DataType t, ReduceOp op,
                bool divide_avg) {
  Bytes out(count * size_of(t));
  std::vector<const void*> srcs;
  for (const Bytes& b : inputs) srcs.push_back(b.data());
  detail::reduce_n(out.data(), srcs.data(), static_cast<int>(srcs.size()), count, t, op);
  if (divide_avg && op == ReduceOp::avg) {
    detail::divide_by(out.data(), count, t, static_cast<int>(inputs.size()));
  }
  return out;
}

// First differing element, or -1.
long first_mismatch(const Bytes& got, const Bytes& want, std::size_t es) {
  if (got.size() != want.size()) return 0;
  for (std::size_t i = 0; i < got.size(); i += es) {
    if (std::memcmp(got.data() + i, want.data() + i, es) != 0) return static_cast<long>(i / es);
  }
  return -1;
}

#define EXPECT_BYTES_EQ(got, want, es, what)                           \
  do {                                                                 \
    const long bad_ = first_mismatch((got), (want), (es));             \
    EXPECT_EQ(bad_, -1) << (what) << ": first wrong element " << bad_; \
  } while (0)

class OneGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_test::gpu_count() < 1) GTEST_SKIP() << "needs a CUDA GPU";
    COCCL_CUDA_CHECK(cudaSetDevice(0));
  }
  std::mt19937_64 rng_{42};
};

class TwoGpus : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_test::gpu_count() < 2) GTEST_SKIP() << "needs 2 CUDA GPUs";
    if (!gpu_test::enable_peers(2)) GTEST_SKIP() << "GPUs 0 and 1 have no peer access";
  }
  std::mt19937_64 rng_{7};
};

// One suite per collective (ctest -R '^AllReduceKernel\\.' runs one alone); the tests that mix
// collectives stay in TwoGpus.
class AllReduceKernel : public TwoGpus {};
class AllGatherKernel : public TwoGpus {};
class AllToAllKernel : public TwoGpus {};
class ReduceScatterKernel : public TwoGpus {};
class BroadcastKernel : public TwoGpus {};
class ReduceKernel : public TwoGpus {};
class GatherKernel : public TwoGpus {};
class ScatterKernel : public TwoGpus {};
class SendRecvKernel : public TwoGpus {};

TEST_F(OneGpu, ReduceMatchesHostReferenceForEveryTypeAndOpAtAnyAlignment) {
  constexpr int nsrc = 3;
  for (DataType t : all_types) {
    const std::size_t es = size_of(t);
    for (ReduceOp op : all_ops) {
      // Offsets 0 take the 16-byte path; an element offset takes the narrow one. Odd count: tail.
      for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
        const std::size_t count = 4099;
        std::vector<Bytes> in;
        std::vector<DeviceBuffer> bufs;
        std::vector<const void*> srcs;
        for (int s = 0; s < nsrc; ++s) {
          in.push_back(random_values(t, count, rng_));
          bufs.emplace_back(0, (count + 2) * es);
          bufs.back().upload(in.back().data(), count * es, (offset * s) * es);
          srcs.push_back(bufs.back().get() + offset * s * es);
        }
        DeviceBuffer dst(0, (count + 2) * es);
        dst.fill(0xa5);
        ASSERT_EQ(
            0, kernels::reduce(dst.get() + offset * es, srcs.data(), nsrc, count, t, op, nullptr));
        COCCL_CUDA_CHECK(cudaDeviceSynchronize());
        const Bytes got = dst.download((count + 2) * es);
        EXPECT_BYTES_EQ(Bytes(got.begin() + offset * es, got.begin() + (offset + count) * es),
                        reference(in, count, t, op, false), es, name_of(t, op));
        // Nothing outside [offset, offset + count) was written.
        for (std::size_t i = 0; i < offset * es; ++i) EXPECT_EQ(got[i], 0xa5);
        for (std::size_t i = (offset + count) * es; i < got.size(); ++i) EXPECT_EQ(got[i], 0xa5);
      }
    }
  }
}

TEST_F(OneGpu, DivideByTruncatesIntegersAndRoundsFloatsOnce) {
  for (DataType t : all_types) {
    const std::size_t es = size_of(t);
    const std::size_t count = 1029;
    Bytes data = random_values(t, count, rng_);
    DeviceBuffer buf(0, count * es);
    buf.upload(data.data(), data.size());
    ASSERT_EQ(0, kernels::divide_by(buf.get(), count, t, 3, nullptr));
    COCCL_CUDA_CHECK(cudaDeviceSynchronize());
    detail::divide_by(data.data(), count, t, 3);
    EXPECT_BYTES_EQ(buf.download(count * es), data, es, std::string(to_string(t)));
  }
}

TEST_F(OneGpu, CopyMovesExactlyTheBytesAtAnyAlignment) {
  const std::size_t bytes = 100003;
  Bytes src = random_values(DataType::uint8, bytes, rng_);
  DeviceBuffer a(0, bytes + 16);
  DeviceBuffer b(0, bytes + 16);
  a.upload(src.data(), bytes, 3);
  b.fill(0);
  ASSERT_EQ(0, kernels::copy(b.get() + 5, a.get() + 3, bytes, nullptr));
  COCCL_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(b.download(bytes, 5), src);
  EXPECT_EQ(b.download(5), Bytes(5, 0));
}

TEST_F(OneGpu, InvalidArgumentsAreRejectedWithoutLaunching) {
  const void* srcs[1] = {nullptr};
  EXPECT_EQ(1, kernels::reduce(nullptr, srcs, 1, 4, DataType::float32, ReduceOp::sum, nullptr));
  EXPECT_EQ(1, kernels::reduce(nullptr, srcs, 0, 4, DataType::float32, ReduceOp::sum, nullptr));
  EXPECT_EQ(1, kernels::divide_by(nullptr, 4, static_cast<DataType>(12), 2, nullptr));
  device::Workspace ws;
  EXPECT_EQ(
      1, kernels::all_reduce_oneshot(srcs, srcs, 1, DataType::float32, ReduceOp::sum, ws, nullptr));
}

// One all-reduce on both GPUs: inputs at element offset `offset`, in place or not; checks both
// ranks against the reference and that nothing around the output was written.
void check_all_reduce(Group& g, bool oneshot, DataType t, ReduceOp op, std::size_t count,
                      std::size_t offset, bool in_place, std::mt19937_64& rng) {
  const std::size_t es = size_of(t);
  const std::size_t bytes = (count + offset + 1) * es;
  std::vector<Bytes> in;
  std::vector<DeviceBuffer> send;
  std::vector<DeviceBuffer> recv;
  for (int r = 0; r < 2; ++r) {
    in.push_back(random_values(t, count, rng));
    send.emplace_back(r, bytes);
    send.back().fill(0x5a);
    send.back().upload(in.back().data(), count * es, offset * es);
    recv.emplace_back(r, bytes);
    recv.back().fill(0x5a);
  }
  g.each([&](int r) {
    const char* s = send[r].get() + offset * es;
    char* d = (in_place ? send[r].get() : recv[r].get()) + offset * es;
    const int rc = oneshot ? kernels::all_reduce_oneshot(s, d, count, t, op, g.workspace(r),
                                                         as_stream(g.stream(r)))
                           : kernels::all_reduce_twoshot(s, d, count, t, op, g.workspace(r),
                                                         as_stream(g.stream(r)));
    ASSERT_EQ(rc, 0);
  });
  g.sync();
  const Bytes want = reference(in, count, t, op, true);
  for (int r = 0; r < 2; ++r) {
    const DeviceBuffer& out = in_place ? send[r] : recv[r];
    const Bytes got = out.download(bytes);
    EXPECT_BYTES_EQ(
        Bytes(got.begin() + offset * es, got.begin() + (offset + count) * es), want, es,
        name_of(t, op) + " rank " + std::to_string(r) + " count " + std::to_string(count));
    for (std::size_t i = 0; i < offset * es; ++i) ASSERT_EQ(got[i], 0x5a);
    for (std::size_t i = (offset + count) * es; i < bytes; ++i) ASSERT_EQ(got[i], 0x5a);
  }
}

TEST_F(AllReduceKernel, OneshotAllReduceMatchesReferenceForEveryTypeAndOp) {
  Group g(2, oneshot_max, small_staging);
  for (DataType t : all_types) {
    for (ReduceOp op : all_ops) check_all_reduce(g, true, t, op, 1001, 1, false, rng_);
  }
}

TEST_F(AllReduceKernel, OneshotAllReduceHandlesEdgeSizesAndInPlace) {
  Group g(2, oneshot_max, small_staging);
  for (std::size_t count : {1, 2, 3, 7, 8, 9, 4095, 65535, 65536}) {
    for (std::size_t offset : {0, 1, 3}) {
      check_all_reduce(g, true, DataType::float32, ReduceOp::sum, count, offset, count % 2 == 1,
                       rng_);
    }
  }
  check_all_reduce(g, true, DataType::uint8, ReduceOp::max, oneshot_max, 0, false, rng_);
}

TEST_F(AllReduceKernel, OneshotAllReduceRejectsMessagesOverItsScratch) {
  Group g(2, oneshot_max, small_staging);
  DeviceBuffer buf(0, oneshot_max + 4);
  EXPECT_EQ(
      1, kernels::all_reduce_oneshot(buf.get(), buf.get(), oneshot_max / 4 + 1, DataType::float32,
                                     ReduceOp::sum, g.workspace(0), as_stream(g.stream(0))));
}

TEST_F(AllReduceKernel, TwoshotAllReduceMatchesReferenceForEveryTypeAndOp) {
  Group g(2, oneshot_max, small_staging);
  for (DataType t : all_types) {
    for (ReduceOp op : all_ops) check_all_reduce(g, false, t, op, 100003, 1, false, rng_);
  }
}

TEST_F(AllReduceKernel, TwoshotAllReduceHandlesEdgeSizesOffsetsAndInPlace) {
  Group g(2, oneshot_max, small_staging);
  for (std::size_t count : {1, 3, 4, 5, 1023, 1024, 1025, 262147, 3000001}) {
    for (std::size_t offset : {0, 1, 2}) {
      check_all_reduce(g, false, DataType::float32, ReduceOp::sum, count, offset, offset == 2,
                       rng_);
    }
  }
  check_all_reduce(g, false, DataType::bfloat16, ReduceOp::avg, 5000011, 1, true, rng_);
}

TEST_F(AllReduceKernel, TwoshotAllReduceWithDefaultStaging) {
  Group g(2, oneshot_max, device::default_staging_bytes);
  check_all_reduce(g, false, DataType::float32, ReduceOp::sum, 20000003, 0, false, rng_);
  check_all_reduce(g, false, DataType::float16, ReduceOp::max, 777777, 1, false, rng_);
}

TEST_F(AllGatherKernel, AllGatherPlacesEveryRanksBlockInRankOrder) {
  Group g(2, oneshot_max, small_staging);
  for (std::size_t es : {1, 2, 4, 8}) {
    for (std::size_t count : {1, 5, 1000, 300001}) {
      for (bool in_place : {false, true}) {
        std::vector<Bytes> in;
        std::vector<DeviceBuffer> send;
        std::vector<DeviceBuffer> recv;
        for (int r = 0; r < 2; ++r) {
          in.push_back(random_values(DataType::uint8, count * es, rng_));
          send.emplace_back(r, count * es + es);
          send.back().upload(in.back().data(), count * es, es);
          recv.emplace_back(r, 2 * count * es + es);
          recv.back().fill(0x33);
          if (in_place) recv.back().upload(in.back().data(), count * es, es + r * count * es);
        }
        g.each([&](int r) {
          const char* s = in_place ? recv[r].get() + es + r * count * es : send[r].get() + es;
          ASSERT_EQ(0, kernels::all_gather(s, recv[r].get() + es, count, es, g.workspace(r),
                                           as_stream(g.stream(r))));
        });
        g.sync();
        Bytes want(in[0]);
        want.insert(want.end(), in[1].begin(), in[1].end());
        for (int r = 0; r < 2; ++r) {
          EXPECT_EQ(recv[r].download(2 * count * es, es), want)
              << "elem " << es << " count " << count << " rank " << r;
          EXPECT_EQ(recv[r].download(es), Bytes(es, 0x33));
        }
      }
    }
  }
}

TEST_F(AllToAllKernel, AllToAllSendsBlockRToRankR) {
  Group g(2, oneshot_max, small_staging);
  for (std::size_t es : {1, 4, 8}) {
    for (std::size_t count : {1, 7, 4096, 250001}) {
      std::vector<Bytes> in;
      std::vector<DeviceBuffer> send;
      std::vector<DeviceBuffer> recv;
      for (int r = 0; r < 2; ++r) {
        in.push_back(random_values(DataType::uint8, 2 * count * es, rng_));
        send.emplace_back(r, 2 * count * es);
        send.back().upload(in.back().data(), 2 * count * es);
        recv.emplace_back(r, 2 * count * es);
        recv.back().fill(0);
      }
      g.each([&](int r) {
        ASSERT_EQ(0, kernels::all_to_all(send[r].get(), recv[r].get(), count, es, g.workspace(r),
                                         as_stream(g.stream(r))));
      });
      g.sync();
      const std::size_t blk = count * es;
      for (int r = 0; r < 2; ++r) {
        Bytes want;
        for (int src = 0; src < 2; ++src) {
          want.insert(want.end(), in[src].begin() + r * blk, in[src].begin() + (r + 1) * blk);
        }
        EXPECT_EQ(recv[r].download(2 * blk), want) << "elem " << es << " count " << count;
      }
    }
  }
}

TEST_F(ReduceScatterKernel, ReduceScatterMatchesReferenceForEveryTypeAndOp) {
  Group g(2, oneshot_max, small_staging);
  for (DataType t : all_types) {
    for (ReduceOp op : all_ops) {
      const std::size_t es = size_of(t);
      const std::size_t count = t == DataType::float32 ? 200003 : 3001;
      std::vector<Bytes> in;
      std::vector<DeviceBuffer> send;
      std::vector<DeviceBuffer> recv;
      for (int r = 0; r < 2; ++r) {
        in.push_back(random_values(t, 2 * count, rng_));
        send.emplace_back(r, 2 * count * es + es);
        send.back().upload(in.back().data(), 2 * count * es, es);
        recv.emplace_back(r, count * es);
        recv.back().fill(0x77);
      }
      g.each([&](int r) {
        ASSERT_EQ(0, kernels::reduce_scatter(send[r].get() + es, recv[r].get(), count, t, op,
                                             g.workspace(r), as_stream(g.stream(r))));
      });
      g.sync();
      const Bytes full = reference(in, 2 * count, t, op, true);
      for (int r = 0; r < 2; ++r) {
        const Bytes want(full.begin() + r * count * es, full.begin() + (r + 1) * count * es);
        EXPECT_BYTES_EQ(recv[r].download(count * es), want, es,
                        name_of(t, op) + " rank " + std::to_string(r));
      }
    }
  }
}

TEST_F(ReduceScatterKernel, ReduceScatterRunsInPlace) {
  Group g(2, oneshot_max, small_staging);
  for (std::size_t count : {1, 1001, 200003}) {
    const DataType t = DataType::float32;
    const std::size_t es = size_of(t);
    std::vector<Bytes> in;
    std::vector<DeviceBuffer> buf;
    for (int r = 0; r < 2; ++r) {
      in.push_back(random_values(t, 2 * count, rng_));
      buf.emplace_back(r, 2 * count * es);
      buf.back().upload(in.back().data(), 2 * count * es);
    }
    g.each([&](int r) {
      ASSERT_EQ(0, kernels::reduce_scatter(buf[r].get(), buf[r].get() + r * count * es, count, t,
                                           ReduceOp::sum, g.workspace(r), as_stream(g.stream(r))));
    });
    g.sync();
    const Bytes full = reference(in, 2 * count, t, ReduceOp::sum, true);
    for (int r = 0; r < 2; ++r) {
      const Bytes want(full.begin() + r * count * es, full.begin() + (r + 1) * count * es);
      EXPECT_BYTES_EQ(buf[r].download(count * es, r * count * es), want, es,
                      "count " + std::to_string(count) + " rank " + std::to_string(r));
    }
  }
}

TEST_F(BroadcastKernel, BroadcastCopiesTheRootsBufferToEveryRankFromEveryRoot) {
  Group g(2, oneshot_max, small_staging);
  for (int root = 0; root < 2; ++root) {
    for (std::size_t bytes : {1, 7, 16, 1000, 300001}) {
      for (bool in_place : {false, true}) {
        const Bytes in = random_values(DataType::uint8, bytes, rng_);
        std::vector<DeviceBuffer> send;
        std::vector<DeviceBuffer> recv;
        for (int r = 0; r < 2; ++r) {
          send.emplace_back(r, bytes + 3);
          send.back().upload(in.data(), bytes, 3);
          recv.emplace_back(r, bytes + 2);
          recv.back().fill(0x44);
          if (in_place && r == root) recv.back().upload(in.data(), bytes, 1);
        }
        g.each([&](int r) {
          const char* s = r != root ? nullptr : in_place ? recv[r].get() + 1 : send[r].get() + 3;
          ASSERT_EQ(0, kernels::broadcast(s, recv[r].get() + 1, bytes, root, g.workspace(r),
                                          as_stream(g.stream(r))));
        });
        g.sync();
        for (int r = 0; r < 2; ++r) {
          Bytes want(bytes + 2, 0x44);
          std::copy(in.begin(), in.end(), want.begin() + 1);
          EXPECT_EQ(recv[r].download(bytes + 2), want)
              << "root " << root << " bytes " << bytes << " rank " << r;
        }
      }
    }
  }
}

TEST_F(ReduceKernel, ReduceToRootMatchesReferenceForEveryTypeOpAndRoot) {
  Group g(2, oneshot_max, small_staging);
  for (int root = 0; root < 2; ++root) {
    for (DataType t : all_types) {
      for (ReduceOp op : all_ops) {
        const std::size_t es = size_of(t);
        const std::size_t count = t == DataType::float32 ? 200003 : 3001;
        const bool in_place = op == ReduceOp::max;
        std::vector<Bytes> in;
        std::vector<DeviceBuffer> send;
        std::vector<DeviceBuffer> recv;
        for (int r = 0; r < 2; ++r) {
          in.push_back(random_values(t, count, rng_));
          send.emplace_back(r, (count + 1) * es);
          send.back().upload(in.back().data(), count * es, es);
          recv.emplace_back(r, (count + 1) * es);
          recv.back().fill(0x66);
        }
        g.each([&](int r) {
          char* out = r != root ? nullptr : in_place ? send[r].get() + es : recv[r].get() + es;
          ASSERT_EQ(0, kernels::reduce_to_root(send[r].get() + es, out, count, t, op, root,
                                               g.workspace(r), as_stream(g.stream(r))));
        });
        g.sync();
        const Bytes want = reference(in, count, t, op, true);
        const DeviceBuffer& out = in_place ? send[root] : recv[root];
        EXPECT_BYTES_EQ(out.download(count * es, es), want, es,
                        name_of(t, op) + " root " + std::to_string(root));
        // The non-root's buffers are untouched.
        const int other = 1 - root;
        EXPECT_EQ(recv[other].download((count + 1) * es), Bytes((count + 1) * es, 0x66));
        EXPECT_EQ(send[other].download(count * es, es), in[other]);
      }
    }
  }
}

TEST_F(GatherKernel, GatherPlacesEveryRanksBlockAtTheRoot) {
  Group g(2, oneshot_max, small_staging);
  for (int root = 0; root < 2; ++root) {
    for (std::size_t es : {1, 2, 8}) {
      for (std::size_t count : {1, 5, 1000, 300001}) {
        const bool in_place = count == 1000;
        std::vector<Bytes> in;
        std::vector<DeviceBuffer> send;
        std::vector<DeviceBuffer> recv;
        for (int r = 0; r < 2; ++r) {
          in.push_back(random_values(DataType::uint8, count * es, rng_));
          send.emplace_back(r, count * es + es);
          send.back().upload(in.back().data(), count * es, es);
          recv.emplace_back(r, 2 * count * es + es);
          recv.back().fill(0x33);
          if (in_place && r == root)
            recv.back().upload(in.back().data(), count * es, es + r * count * es);
        }
        g.each([&](int r) {
          const char* s =
              in_place && r == root ? recv[r].get() + es + r * count * es : send[r].get() + es;
          char* d = r == root ? recv[r].get() + es : nullptr;
          ASSERT_EQ(0,
                    kernels::gather(s, d, count, es, root, g.workspace(r), as_stream(g.stream(r))));
        });
        g.sync();
        Bytes want(in[0]);
        want.insert(want.end(), in[1].begin(), in[1].end());
        EXPECT_EQ(recv[root].download(2 * count * es, es), want)
            << "root " << root << " elem " << es << " count " << count;
        EXPECT_EQ(recv[1 - root].download(2 * count * es + es), Bytes(2 * count * es + es, 0x33));
      }
    }
  }
}

TEST_F(ScatterKernel, ScatterSendsTheRootsBlockRToRankR) {
  Group g(2, oneshot_max, small_staging);
  for (int root = 0; root < 2; ++root) {
    for (std::size_t es : {1, 4, 8}) {
      for (std::size_t count : {1, 7, 4096, 250001}) {
        const bool in_place = count == 7;
        const Bytes in = random_values(DataType::uint8, 2 * count * es, rng_);
        std::vector<DeviceBuffer> send;
        std::vector<DeviceBuffer> recv;
        for (int r = 0; r < 2; ++r) {
          send.emplace_back(r, 2 * count * es);
          send.back().upload(in.data(), 2 * count * es);
          recv.emplace_back(r, count * es);
          recv.back().fill(0);
        }
        g.each([&](int r) {
          const char* s = r == root ? send[r].get() : nullptr;
          char* d = in_place && r == root ? send[r].get() + r * count * es : recv[r].get();
          ASSERT_EQ(
              0, kernels::scatter(s, d, count, es, root, g.workspace(r), as_stream(g.stream(r))));
        });
        g.sync();
        const std::size_t blk = count * es;
        for (int r = 0; r < 2; ++r) {
          const Bytes want(in.begin() + r * blk, in.begin() + (r + 1) * blk);
          const Bytes got =
              in_place && r == root ? send[r].download(blk, r * blk) : recv[r].download(blk);
          EXPECT_EQ(got, want) << "root " << root << " elem " << es << " count " << count;
        }
      }
    }
  }
}

// Rank 0 sends three buffers to rank 1 (matched in order), rank 1 sends one back, both copy one
// buffer to themselves: all in one group per rank, launched without host synchronisation.
TEST_F(SendRecvKernel, SendRecvMatchesTransfersInOrderInBothDirections) {
  Group g(2, oneshot_max, small_staging);
  const std::size_t sizes[] = {5, 300001, 0, 64};
  const std::size_t back = 123457;
  std::vector<Bytes> fwd;
  std::vector<DeviceBuffer> src0;
  std::vector<DeviceBuffer> dst1;
  for (std::size_t sz : sizes) {
    fwd.push_back(random_values(DataType::uint8, sz, rng_));
    src0.emplace_back(0, sz + 1);
    src0.back().upload(fwd.back().data(), sz, 1);
    dst1.emplace_back(1, sz + 2);
    dst1.back().fill(0x11);
  }
  const Bytes rev = random_values(DataType::uint8, back, rng_);
  DeviceBuffer src1(1, back);
  src1.upload(rev.data(), back);
  DeviceBuffer dst0(0, back);
  dst0.fill(0);
  const Bytes self = random_values(DataType::uint8, 999, rng_);
  std::vector<DeviceBuffer> self_src;
  std::vector<DeviceBuffer> self_dst;
  for (int r = 0; r < 2; ++r) {
    self_src.emplace_back(r, 999);
    self_src.back().upload(self.data(), 999);
    self_dst.emplace_back(r, 999);
    self_dst.back().fill(0);
  }
  for (int round = 0; round < 3; ++round) {
    g.each([&](int r) {
      std::vector<kernels::P2p> ops;
      ops.push_back({false, self_dst[r].get(), 999, r});
      if (r == 0) {
        ops.push_back({false, dst0.get(), back, 1});
        for (std::size_t i = 0; i < 4; ++i) ops.push_back({true, src0[i].get() + 1, sizes[i], 1});
      } else {
        for (std::size_t i = 0; i < 4; ++i) ops.push_back({false, dst1[i].get() + 2, sizes[i], 0});
        ops.push_back({true, src1.get(), back, 0});
      }
      ops.push_back({true, self_src[r].get(), 999, r});
      ASSERT_EQ(0, kernels::send_recv(ops.data(), static_cast<int>(ops.size()), g.workspace(r),
                                      as_stream(g.stream(r))));
    });
  }
  g.sync();
  for (std::size_t i = 0; i < 4; ++i) {
    Bytes want(sizes[i] + 2, 0x11);
    std::copy(fwd[i].begin(), fwd[i].end(), want.begin() + 2);
    EXPECT_EQ(dst1[i].download(sizes[i] + 2), want) << "transfer " << i;
  }
  EXPECT_EQ(dst0.download(back), rev);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(self_dst[r].download(999), self);
}

// Only ranks of a transfer launch it; interleaved with collectives on the same workspace and no
// host synchronisation, the pair counters and the collective epochs must not trip over each other
// (a send that overwrote staging a collective still reads would show in the sums).
TEST_F(SendRecvKernel, SendRecvInterleavedWithCollectivesNeverOverwritesUnreadData) {
  Group g(2, oneshot_max, small_staging);
  const std::size_t large = 300000;
  std::vector<DeviceBuffer> a;
  std::vector<DeviceBuffer> b;
  std::vector<std::vector<double>> init(2);
  for (int r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < large; ++i) init[r].push_back(double((i * 3 + r) % 5) + 1);
    a.emplace_back(r, large * 8);
    a.back().upload(init[r].data(), large * 8);
    b.emplace_back(r, large * 8);
  }
  constexpr int rounds = 20;
  for (int k = 0; k < rounds; ++k) {
    g.each([&](int r) {
      auto s = as_stream(g.stream(r));
      ASSERT_EQ(0, kernels::all_reduce_twoshot(a[r].get(), a[r].get(), large, DataType::float64,
                                               ReduceOp::sum, g.workspace(r), s));
      // Swap a into the peer's b, then reduce b (equal to a) onto root k % 2 into a there.
      const kernels::P2p ops[] = {{true, a[r].get(), large * 8, 1 - r},
                                  {false, b[r].get(), large * 8, 1 - r}};
      ASSERT_EQ(0, kernels::send_recv(ops, 2, g.workspace(r), s));
      ASSERT_EQ(
          0, kernels::reduce_to_root(b[r].get(), r == k % 2 ? a[r].get() : nullptr, large,
                                     DataType::float64, ReduceOp::max, k % 2, g.workspace(r), s));
      ASSERT_EQ(0, kernels::broadcast(a[r].get(), a[r].get(), large * 8, k % 2, g.workspace(r), s));
    });
  }
  g.sync();
  for (int r = 0; r < 2; ++r) {
    const Bytes got = a[r].download(large * 8);
    for (std::size_t i = 0; i < large; ++i) {
      double v;
      std::memcpy(&v, got.data() + i * 8, 8);
      ASSERT_EQ(v, (init[0][i] + init[1][i]) * std::ldexp(1.0, rounds - 1)) << r << " " << i;
    }
  }
}

TEST_F(AllToAllKernel, AllToAllvMovesUnevenBlocksToTheirDisplacements) {
  Group g(2, oneshot_max, small_staging);
  for (std::size_t scale : {0, 1, 777, 100003}) {
    const std::size_t es = 4;
    // Rank r sends (r + 2q + 1) * scale elements to rank q; blocks in reverse order with gaps.
    auto cnt = [&](int from, int to) { return (from + 2 * to + 1) * scale; };
    std::vector<kernels::AllToAllvLayout> lay(2);
    std::vector<Bytes> in;
    std::vector<DeviceBuffer> send;
    std::vector<DeviceBuffer> recv;
    std::vector<std::size_t> recv_total(2);
    for (int r = 0; r < 2; ++r) {
      std::size_t so = 0;
      std::size_t ro = 0;
      for (int q = 1; q >= 0; --q) {
        lay[r].send_counts[q] = cnt(r, q), lay[r].send_displs[q] = so;
        so += cnt(r, q) + 3;
        lay[r].recv_counts[q] = cnt(q, r), lay[r].recv_displs[q] = ro;
        ro += cnt(q, r) + 1;
      }
      in.push_back(random_values(DataType::uint32, so, rng_));
      send.emplace_back(r, so * es);
      send.back().upload(in.back().data(), so * es);
      recv.emplace_back(r, ro * es);
      recv.back().fill(0x55);
      recv_total[r] = ro;
    }
    g.each([&](int r) {
      ASSERT_EQ(0, kernels::all_to_allv(send[r].get(), recv[r].get(), lay[r], es, g.workspace(r),
                                        as_stream(g.stream(r))));
    });
    g.sync();
    for (int r = 0; r < 2; ++r) {
      Bytes want(recv_total[r] * es, 0x55);
      for (int q = 0; q < 2; ++q) {
        const std::size_t from = lay[q].send_displs[r] * es;
        std::copy(in[q].begin() + from, in[q].begin() + from + cnt(q, r) * es,
                  want.begin() + lay[r].recv_displs[q] * es);
      }
      EXPECT_EQ(recv[r].download(recv_total[r] * es), want) << "scale " << scale << " rank " << r;
    }
  }
}

// Broadcast and reduce (and a send) captured once and replayed 100 times: in place, each replay
// doubles the root's data, so any stale or missing peer data shows.
TEST_F(TwoGpus, CapturedBroadcastReduceAndSendReplayHundredTimes) {
  Group g(2, oneshot_max, small_staging);
  const std::size_t count = 100003;
  std::vector<DeviceBuffer> a;
  std::vector<DeviceBuffer> c;
  std::vector<double> init;
  for (std::size_t i = 0; i < count; ++i) init.push_back(double(i % 17) + 1);
  for (int r = 0; r < 2; ++r) {
    a.emplace_back(r, count * 8);
    a.back().upload(init.data(), count * 8);
    c.emplace_back(r, count * 8);
    c.back().fill(0);
  }
  std::vector<cudaGraphExec_t> exec(2);
  g.each([&](int r) {
    cudaStream_t s = g.stream(r);
    COCCL_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    ASSERT_EQ(
        0, kernels::broadcast(a[r].get(), a[r].get(), count * 8, 0, g.workspace(r), as_stream(s)));
    ASSERT_EQ(0, kernels::reduce_to_root(a[r].get(), r == 0 ? a[r].get() : nullptr, count,
                                         DataType::float64, ReduceOp::sum, 0, g.workspace(r),
                                         as_stream(s)));
    const kernels::P2p op{r == 0, r == 0 ? a[r].get() : c[r].get(), count * 8, 1 - r};
    ASSERT_EQ(0, kernels::send_recv(&op, 1, g.workspace(r), as_stream(s)));
    cudaGraph_t graph = nullptr;
    COCCL_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    COCCL_CUDA_CHECK(cudaGraphInstantiate(&exec[r], graph, 0));
    COCCL_CUDA_CHECK(cudaGraphDestroy(graph));
  });
  constexpr int replays = 100;
  for (int k = 0; k < replays; ++k) {
    g.each([&](int r) { COCCL_CUDA_CHECK(cudaGraphLaunch(exec[r], g.stream(r))); });
  }
  g.sync();
  const Bytes root = a[0].download(count * 8);
  const Bytes other = a[1].download(count * 8);
  const Bytes sent = c[1].download(count * 8);
  for (std::size_t i = 0; i < count; ++i) {
    double v;
    std::memcpy(&v, root.data() + i * 8, 8);
    ASSERT_EQ(v, init[i] * std::ldexp(1.0, replays)) << "root " << i;
    std::memcpy(&v, other.data() + i * 8, 8);
    ASSERT_EQ(v, init[i] * std::ldexp(1.0, replays - 1)) << "other " << i;
    std::memcpy(&v, sent.data() + i * 8, 8);
    ASSERT_EQ(v, init[i] * std::ldexp(1.0, replays)) << "sent " << i;
  }
  g.each([&](int r) { COCCL_CUDA_CHECK(cudaGraphExecDestroy(exec[r])); });
}

// Back-to-back collectives with no host synchronisation in between: the epochs and parities must
// keep a fast rank from overwriting data a slow one still reads.
TEST_F(TwoGpus, BackToBackMixedCollectivesNeverOverwriteUnreadData) {
  Group g(2, oneshot_max, small_staging);
  const std::size_t small = 5000;
  const std::size_t large = 300000;
  std::vector<DeviceBuffer> a;
  std::vector<DeviceBuffer> b;
  std::vector<std::vector<double>> init_a(2);
  std::vector<std::vector<double>> init_b(2);
  for (int r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < small; ++i) init_a[r].push_back(double((i * 7 + r) % 11) + 1);
    for (std::size_t i = 0; i < large; ++i) init_b[r].push_back(double((i * 3 + r) % 5) + 1);
    a.emplace_back(r, small * 8);
    a.back().upload(init_a[r].data(), small * 8);
    b.emplace_back(r, large * 8);
    b.back().upload(init_b[r].data(), large * 8);
  }
  constexpr int rounds = 40;
  for (int k = 0; k < rounds; ++k) {
    g.each([&](int r) {
      auto s = as_stream(g.stream(r));
      ASSERT_EQ(0, kernels::all_reduce_oneshot(a[r].get(), a[r].get(), small, DataType::float64,
                                               ReduceOp::sum, g.workspace(r), s));
      ASSERT_EQ(0, kernels::all_reduce_twoshot(b[r].get(), b[r].get(), large, DataType::float64,
                                               ReduceOp::sum, g.workspace(r), s));
      ASSERT_EQ(0, kernels::all_reduce_oneshot(a[r].get(), a[r].get(), small, DataType::float64,
                                               ReduceOp::max, g.workspace(r), s));
    });
  }
  g.sync();
  // Each round doubles the (equal after round one) values of b; max keeps a's sum.
  for (int r = 0; r < 2; ++r) {
    const Bytes ga = a[r].download(small * 8);
    const Bytes gb = b[r].download(large * 8);
    for (std::size_t i = 0; i < small; ++i) {
      double v;
      std::memcpy(&v, ga.data() + i * 8, 8);
      ASSERT_EQ(v, (init_a[0][i] + init_a[1][i]) * std::ldexp(1.0, rounds - 1)) << i;
    }
    for (std::size_t i = 0; i < large; ++i) {
      double v;
      std::memcpy(&v, gb.data() + i * 8, 8);
      ASSERT_EQ(v, (init_b[0][i] + init_b[1][i]) * std::ldexp(1.0, rounds - 1)) << i;
    }
  }
}

// A captured graph replays the same launches; the epochs live on the device, so each replay
// synchronises afresh. In-place sums double the data per replay, so a replay that read stale or
// missing peer data would show in the result.
TEST_F(TwoGpus, CapturedGraphReplaysHundredTimesCorrectly) {
  Group g(2, oneshot_max, small_staging);
  const std::size_t small = 3001;
  const std::size_t large = 250007;
  std::vector<DeviceBuffer> a;
  std::vector<DeviceBuffer> b;
  std::vector<DeviceBuffer> gathered;
  std::vector<std::vector<double>> init_a(2);
  std::vector<std::vector<double>> init_b(2);
  for (int r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < small; ++i) init_a[r].push_back(double((i + 3 * r) % 9) + 1);
    for (std::size_t i = 0; i < large; ++i) init_b[r].push_back(double((i * 5 + r) % 13) + 1);
    a.emplace_back(r, small * 8);
    a.back().upload(init_a[r].data(), small * 8);
    b.emplace_back(r, large * 8);
    b.back().upload(init_b[r].data(), large * 8);
    gathered.emplace_back(r, 2 * small * 8);
  }
  std::vector<cudaGraphExec_t> exec(2);
  g.each([&](int r) {
    cudaStream_t s = g.stream(r);
    COCCL_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    ASSERT_EQ(0, kernels::all_reduce_oneshot(a[r].get(), a[r].get(), small, DataType::float64,
                                             ReduceOp::sum, g.workspace(r), as_stream(s)));
    ASSERT_EQ(0, kernels::all_reduce_twoshot(b[r].get(), b[r].get(), large, DataType::float64,
                                             ReduceOp::sum, g.workspace(r), as_stream(s)));
    ASSERT_EQ(0, kernels::all_gather(a[r].get(), gathered[r].get(), small, 8, g.workspace(r),
                                     as_stream(s)));
    cudaGraph_t graph = nullptr;
    COCCL_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    COCCL_CUDA_CHECK(cudaGraphInstantiate(&exec[r], graph, 0));
    COCCL_CUDA_CHECK(cudaGraphDestroy(graph));
  });
  constexpr int replays = 100;
  for (int k = 0; k < replays; ++k) {
    g.each([&](int r) { COCCL_CUDA_CHECK(cudaGraphLaunch(exec[r], g.stream(r))); });
  }
  g.sync();
  const double scale = std::ldexp(1.0, replays - 1);
  for (int r = 0; r < 2; ++r) {
    const Bytes ga = a[r].download(small * 8);
    const Bytes gb = b[r].download(large * 8);
    const Bytes gg = gathered[r].download(2 * small * 8);
    for (std::size_t i = 0; i < small; ++i) {
      double v;
      std::memcpy(&v, ga.data() + i * 8, 8);
      ASSERT_EQ(v, (init_a[0][i] + init_a[1][i]) * scale) << "rank " << r << " a " << i;
      for (int q = 0; q < 2; ++q) {
        std::memcpy(&v, gg.data() + (q * small + i) * 8, 8);
        ASSERT_EQ(v, (init_a[0][i] + init_a[1][i]) * scale) << "rank " << r << " gather " << i;
      }
    }
    for (std::size_t i = 0; i < large; ++i) {
      double v;
      std::memcpy(&v, gb.data() + i * 8, 8);
      ASSERT_EQ(v, (init_b[0][i] + init_b[1][i]) * scale) << "rank " << r << " b " << i;
    }
  }
  g.each([&](int r) { COCCL_CUDA_CHECK(cudaGraphExecDestroy(exec[r])); });
}

}  // namespace
}  // namespace coccl
