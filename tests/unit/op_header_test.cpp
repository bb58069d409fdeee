// The operation headers ranks exchange before any data (collectives/op_check.hpp): the compact
// form the fast path joins with a few bytes of data carries exactly what the full one does for
// the operations it may describe, and a receiver refuses one that is cut short or of another
// version instead of reading past it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "collectives/comm.hpp"
#include "collectives/op_check.hpp"

namespace coccl::detail {
namespace {

OpArgs collective(OpKind kind, std::size_t count) {
  OpArgs a;
  a.kind = kind;
  a.type = DataType::float32;
  a.op = ReduceOp::max;
  a.root = 3;
  a.count = count;
  return a;
}

// Every field of two headers, joined_fingerprint included (the struct has no padding).
static_assert(sizeof(OpHeader) == 80);
void expect_same(const OpHeader& a, const OpHeader& b) {
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0)
      << "kind " << a.kind << "/" << b.kind << " pair_seq " << a.pair_seq << "/" << b.pair_seq
      << " op_seq " << a.op_seq << "/" << b.op_seq << " count " << a.count << "/" << b.count
      << " joined_fingerprint " << a.joined_fingerprint << "/" << b.joined_fingerprint;
}

TEST(CompactHeader, CollectivesRoundTripExactlyWithTheirData) {
  for (OpKind kind : {OpKind::all_reduce, OpKind::all_gather, OpKind::reduce_scatter,
                      OpKind::all_to_all, OpKind::broadcast, OpKind::reduce, OpKind::barrier}) {
    SCOPED_TRACE(name_of(kind));
    const OpArgs a = collective(kind, 4);
    // Sequence numbers past 32 bits keep every bit.
    OpHeader mine = make_op_header(a, (1ull << 40) + 7, (1ull << 33) + 5, 1);
    ASSERT_TRUE(compactable(mine));
    std::byte chunk[compact_header_bytes + 16];
    std::byte head[compact_header_bytes];
    write_compact_header(mine, 0xabcd1234u, head);
    std::memcpy(chunk, head, sizeof head);
    for (std::size_t i = 0; i < 16; ++i) chunk[sizeof head + i] = std::byte(i);
    bool joined = false;
    std::size_t header_bytes = 0;
    const auto theirs =
        header_of(chunk, sizeof chunk, op_compact_fingerprint, joined, header_bytes);
    ASSERT_TRUE(theirs);
    EXPECT_TRUE(joined);
    EXPECT_EQ(header_bytes, compact_header_bytes);
    mine.joined_fingerprint = 0xabcd1234u;
    expect_same(*theirs, mine);
    EXPECT_TRUE(op_headers_agree(mine, *theirs));
    EXPECT_EQ(compare_op_headers(mine, *theirs, 0, 1), "");
  }
}

TEST(CompactHeader, OnlyHeadersItCarriesWholeAreCompactable) {
  EXPECT_FALSE(compactable(make_op_header(collective(OpKind::all_reduce, 1ull << 32), 1, 1, 1)))
      << "a count of 2^32 does not fit";
  EXPECT_TRUE(
      compactable(make_op_header(collective(OpKind::all_reduce, (1ull << 32) - 1), 1, 1, 1)));

  OpArgs p2p;
  p2p.kind = OpKind::p2p;
  p2p.p2p.push_back(Transfer{true, nullptr, 8, DataType::uint8, 1});
  EXPECT_FALSE(compactable(make_op_header(p2p, 1, 1, 1))) << "messages carry signatures";

  OpArgs v = collective(OpKind::all_to_allv, 0);
  v.send_counts = v.recv_counts = {1, 2};
  v.send_displs = v.recv_displs = {0, 1};
  EXPECT_FALSE(compactable(make_op_header(v, 1, 1, 1))) << "all_to_allv carries signatures";

  OpHeader odd = make_op_header(collective(OpKind::all_reduce, 4), 1, 1, 1);
  odd.type = 300;
  EXPECT_FALSE(compactable(odd));
  odd = make_op_header(collective(OpKind::all_reduce, 4), 1, 1, 1);
  odd.magic = 0;
  EXPECT_FALSE(compactable(odd));
}

TEST(CompactHeader, ShortOrForeignChunksAreRefused) {
  const OpHeader h = make_op_header(collective(OpKind::all_reduce, 2), 9, 9, 1);
  std::byte head[compact_header_bytes];
  write_compact_header(h, 1, head);
  bool joined = false;
  std::size_t header_bytes = 0;
  for (std::size_t size = 0; size < compact_header_bytes; ++size)
    EXPECT_FALSE(header_of(head, size, op_compact_fingerprint, joined, header_bytes)) << size;
  // Byte 3 is the version: another one is not read as this one.
  std::byte other[compact_header_bytes];
  std::memcpy(other, head, sizeof other);
  other[3] = std::byte{2};
  EXPECT_FALSE(header_of(other, sizeof other, op_compact_fingerprint, joined, header_bytes));
  // The same bytes under another fingerprint are no header at all.
  EXPECT_FALSE(header_of(head, sizeof head, 0x12345678u, joined, header_bytes));
}

TEST(CompactHeader, FullHeadersStillDecodeWithTheirLength) {
  OpHeader h = make_op_header(collective(OpKind::all_gather, 3), 4, 5, 1);
  bool joined = true;
  std::size_t header_bytes = 0;
  auto alone = header_of(&h, sizeof h, op_header_fingerprint, joined, header_bytes);
  ASSERT_TRUE(alone);
  EXPECT_FALSE(joined);
  EXPECT_EQ(header_bytes, sizeof(OpHeader));
  expect_same(*alone, h);

  std::byte chunk[sizeof(OpHeader) + 12];
  h.joined_fingerprint = 77;
  std::memcpy(chunk, &h, sizeof h);
  auto with_data = header_of(chunk, sizeof chunk, op_joined_fingerprint, joined, header_bytes);
  ASSERT_TRUE(with_data);
  EXPECT_TRUE(joined);
  EXPECT_EQ(header_bytes, sizeof(OpHeader));
  expect_same(*with_data, h);
}

// The fast path's byte comparison of a peer's compact header decides exactly as the decoded
// comparison (op_headers_agree plus the joined data's fingerprint) for every field but the
// sender's own op_seq, which neither compares.
TEST(CompactHeader, ByteComparisonAgreesWithTheDecodedOne) {
  const OpArgs a = collective(OpKind::all_reduce, 6);
  const std::uint32_t data_fp = 0x5eed1234u;
  const OpHeader mine = make_op_header(a, 40, (1ull << 35) + 3, 1);
  std::byte mine_bytes[compact_header_bytes];
  write_compact_header(mine, data_fp, mine_bytes);

  struct Variant {
    const char* what;
    OpHeader theirs;
    std::uint32_t fp;
    bool agrees;
  };
  std::vector<Variant> variants;
  OpHeader h = make_op_header(a, 977, mine.pair_seq, 0);
  variants.push_back({"another op_seq only", h, data_fp, true});
  variants.push_back({"another data fingerprint", h, data_fp + 1, false});
  h = make_op_header(a, 40, mine.pair_seq + 1, 0);
  variants.push_back({"another pair_seq", h, data_fp, false});
  h = make_op_header(collective(OpKind::all_reduce, 7), 40, mine.pair_seq, 0);
  variants.push_back({"another count", h, data_fp, false});
  OpArgs typed = a;
  typed.type = DataType::int32;
  variants.push_back({"another type", make_op_header(typed, 40, mine.pair_seq, 0), data_fp, false});
  OpArgs summed = a;
  summed.op = ReduceOp::sum;
  variants.push_back(
      {"another operator", make_op_header(summed, 40, mine.pair_seq, 0), data_fp, false});
  variants.push_back({"another kind",
                      make_op_header(collective(OpKind::all_gather, 6), 40, mine.pair_seq, 0),
                      data_fp, false});

  for (const Variant& v : variants) {
    SCOPED_TRACE(v.what);
    std::byte theirs[compact_header_bytes];
    write_compact_header(v.theirs, v.fp, theirs);
    bool joined = false;
    std::size_t header_bytes = 0;
    const auto decoded =
        header_of(theirs, sizeof theirs, op_compact_fingerprint, joined, header_bytes);
    ASSERT_TRUE(decoded);
    const bool decoded_agrees =
        op_headers_agree(mine, *decoded) && decoded->joined_fingerprint == data_fp;
    EXPECT_EQ(decoded_agrees, v.agrees);
    EXPECT_EQ(compact_header_agrees(mine_bytes, theirs), v.agrees);
  }
  // Another version (byte 3) is never taken for this one.
  std::byte other[compact_header_bytes];
  std::memcpy(other, mine_bytes, sizeof other);
  other[3] = std::byte{2};
  EXPECT_FALSE(compact_header_agrees(mine_bytes, other));
}

}  // namespace
}  // namespace coccl::detail
