// The schedule of device operations across hosts (collectives/net_plan), run on the CPU: every
// rank's plan is followed the way its staging kernel follows it (each round's pieces copied into
// a staging area, the round's host operation run across the ranks, the results copied out), with
// a small staging area so that operations take many rounds and end in partial ones. Every
// collective, send/recv groups of random transfers (several per pair, to self, empty ones),
// all_to_allv with gaps and all_to_allv planned from exchanged device counts must leave exactly
// the expected bytes; send/recv rounds must pair transfers of equal sizes on both sides.
#include "collectives/net_plan.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "collectives/comm.hpp"

namespace coccl::detail {
namespace {

using Bytes = std::vector<char>;

struct Rank {
  kernels::NetPlan plan{};
  Bytes in, out;  // the staging areas
};

// Runs one round's host operations across the ranks (int32 sums for the reductions).
void run_round(const std::vector<OpArgs>& ops, const std::vector<bool>& active) {
  const int n = static_cast<int>(ops.size());
  int first = 0;
  while (first < n && !active[first]) ++first;
  ASSERT_LT(first, n);
  const OpKind kind = ops[first].kind;
  if (kind == OpKind::p2p) {
    std::map<std::pair<int, int>, std::vector<const Transfer*>> sends, recvs;
    for (int r = 0; r < n; ++r)
      if (active[r])
        for (const Transfer& o : ops[r].p2p)
          (o.is_send ? sends[{r, o.peer}] : recvs[{o.peer, r}]).push_back(&o);
    for (auto& [pair, list] : sends) {
      auto& match = recvs[pair];
      ASSERT_EQ(list.size(), match.size()) << "transfers " << pair.first << "->" << pair.second;
      for (std::size_t i = 0; i < list.size(); ++i) {
        ASSERT_EQ(list[i]->count, match[i]->count) << pair.first << "->" << pair.second;
        std::memcpy(match[i]->buffer, list[i]->buffer, list[i]->count);
      }
      match.clear();
    }
    for (auto& [pair, list] : recvs) EXPECT_TRUE(list.empty()) << "unmatched receive";
    return;
  }
  for (int r = 0; r < n; ++r) ASSERT_TRUE(active[r]) << "collective rounds differ between ranks";
  const std::size_t c = ops[0].count;
  for (int r = 1; r < n; ++r) ASSERT_EQ(ops[r].count, c);
  auto in = [&](int q) { return static_cast<const std::int32_t*>(ops[q].send); };
  auto out = [&](int r) { return static_cast<std::int32_t*>(ops[r].recv); };
  const int root = ops[0].root;
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < c; ++i) switch (kind) {
        case OpKind::all_reduce:
        case OpKind::reduce: {
          if (kind == OpKind::reduce && r != root) break;
          std::int32_t sum = 0;
          for (int q = 0; q < n; ++q) sum += in(q)[i];
          out(r)[i] = sum;
          break;
        }
        case OpKind::broadcast:
          out(r)[i] = in(root)[i];
          break;
        case OpKind::all_gather:
          for (int q = 0; q < n; ++q) out(r)[q * c + i] = in(q)[i];
          break;
        case OpKind::gather:
          if (r == root)
            for (int q = 0; q < n; ++q) out(r)[q * c + i] = in(q)[i];
          break;
        case OpKind::reduce_scatter: {
          std::int32_t sum = 0;
          for (int q = 0; q < n; ++q) sum += in(q)[r * c + i];
          out(r)[i] = sum;
          break;
        }
        case OpKind::all_to_all:
          for (int q = 0; q < n; ++q) out(r)[q * c + i] = in(q)[r * c + i];
          break;
        case OpKind::scatter:
          out(r)[i] = in(root)[r * c + i];
          break;
        default:
          FAIL() << "unexpected kind";
      }
}

// Follows every rank's plan of `args` (one OpArgs per rank) through staging of `slot` bytes.
// Follows every rank's `plans` from round k0 (`args` give each round's host operation its kind).
void follow_plans(const std::vector<kernels::NetPlan>& plans, const std::vector<OpArgs>& args,
                  std::size_t slot, std::uint64_t k0) {
  const int n = static_cast<int>(args.size());
  std::vector<Rank> ranks(n);
  std::uint64_t rounds = 0;
  for (int r = 0; r < n; ++r) {
    ranks[r].plan = plans[r];
    ranks[r].in.assign(slot, 0);
    ranks[r].out.assign(slot, 0);
    rounds = std::max(rounds, ranks[r].plan.rounds);
  }
  for (std::uint64_t k = k0; k < rounds; ++k) {
    std::vector<OpArgs> ops(n);
    std::vector<bool> active(n);
    for (int r = 0; r < n; ++r) {
      Rank& x = ranks[r];
      active[r] = k < x.plan.rounds;
      if (!active[r]) continue;
      std::uint32_t index = 0;
      for (std::uint32_t s = 0; s < x.plan.nin; ++s)
        for (std::uint32_t j = 0; j < x.plan.in[s].repeat; ++j, ++index) {
          std::uint64_t at = 0, dev = 0, len = 0;
          if (!kernels::net_piece(x.plan, x.plan.in[s], index, j, k, at, dev, len)) continue;
          ASSERT_LE(at + len, slot);
          std::memcpy(x.in.data() + at, x.plan.in[s].dev + dev, len);
        }
      ops[r] = net_round(x.plan, args[r], x.in.data(), x.out.data(), k);
    }
    run_round(ops, active);
    if (::testing::Test::HasFatalFailure()) return;
    for (int r = 0; r < n; ++r) {
      Rank& x = ranks[r];
      if (!active[r]) continue;
      std::uint32_t index = 0;
      for (std::uint32_t s = 0; s < x.plan.nout; ++s)
        for (std::uint32_t j = 0; j < x.plan.out[s].repeat; ++j, ++index) {
          std::uint64_t at = 0, dev = 0, len = 0;
          if (!kernels::net_piece(x.plan, x.plan.out[s], index, j, k, at, dev, len)) continue;
          ASSERT_LE(at + len, slot);
          std::memcpy(x.plan.out[s].dev + dev, x.out.data() + at, len);
        }
    }
  }
}

std::int32_t value(int rank, std::size_t i) { return rank * 1000003 + static_cast<int>(i) * 7 + 1; }

struct CollCase {
  OpKind kind;
  bool whole_in, whole_out;  // buffers of n * count elements
};

void follow(const std::vector<OpArgs>& args, std::size_t slot) {
  const int n = static_cast<int>(args.size());
  std::vector<kernels::NetPlan> plans(n);
  for (int r = 0; r < n; ++r) ASSERT_FALSE(make_net_plan(args[r], r, n, slot, plans[r]));
  follow_plans(plans, args, slot, 0);
}

TEST(NetPlan, EveryCollectiveLeavesTheReferenceThroughManyRounds) {
  const CollCase cases[] = {
      {OpKind::all_reduce, false, false},    {OpKind::broadcast, false, false},
      {OpKind::reduce, false, false},        {OpKind::all_gather, false, true},
      {OpKind::reduce_scatter, true, false}, {OpKind::all_to_all, true, true},
      {OpKind::gather, false, true},         {OpKind::scatter, true, false}};
  for (int n : {2, 3, 5})
    for (const CollCase& cc : cases)
      for (std::size_t count : {std::size_t{1}, std::size_t{47}, std::size_t{1000}})
        for (int root : {0, n - 1}) {
          SCOPED_TRACE(std::string(name_of(cc.kind)) + " n=" + std::to_string(n) +
                       " count=" + std::to_string(count) + " root=" + std::to_string(root));
          const std::size_t ni = cc.whole_in ? n * count : count;
          const std::size_t no = cc.whole_out ? n * count : count;
          std::vector<std::vector<std::int32_t>> in(n, std::vector<std::int32_t>(ni)),
              out(n, std::vector<std::int32_t>(no, -7));
          std::vector<OpArgs> args(n);
          for (int r = 0; r < n; ++r) {
            for (std::size_t i = 0; i < ni; ++i) in[r][i] = value(r, i);
            args[r].kind = cc.kind;
            args[r].send = in[r].data();
            args[r].recv = out[r].data();
            args[r].count = count;
            args[r].type = DataType::int32;
            args[r].root = root;
          }
          // 3 x 64 bytes a rank per round: 48 elements a piece, so most cases take many rounds.
          follow(args, 3 * 64 * static_cast<std::size_t>(n));
          if (HasFatalFailure()) return;
          for (int r = 0; r < n; ++r)
            for (std::size_t e = 0; e < no; ++e) {
              const std::size_t q = e / count, i = e % count;
              std::int32_t want = -7;
              switch (cc.kind) {
                case OpKind::all_reduce:
                case OpKind::reduce:
                  if (cc.kind == OpKind::all_reduce || r == root) {
                    want = 0;
                    for (int s = 0; s < n; ++s) want += value(s, e);
                  }
                  break;
                case OpKind::broadcast:
                  want = value(root, e);
                  break;
                case OpKind::all_gather:
                  want = value(static_cast<int>(q), i);
                  break;
                case OpKind::gather:
                  if (r == root) want = value(static_cast<int>(q), i);
                  break;
                case OpKind::reduce_scatter:
                  want = 0;
                  for (int s = 0; s < n; ++s) want += value(s, r * count + e);
                  break;
                case OpKind::all_to_all:
                  want = value(static_cast<int>(q), r * count + i);
                  break;
                case OpKind::scatter:
                  want = value(root, r * count + e);
                  break;
                default:
                  break;
              }
              ASSERT_EQ(out[r][e], want) << "rank " << r << " element " << e;
            }
        }
}

TEST(NetPlan, RandomSendRecvGroupsPairEqualRoundsOnBothSides) {
  std::mt19937 rng(20261124);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 4);
    struct Transfer {
      int src, dst;
      std::size_t bytes;
    };
    std::vector<Transfer> transfers;
    const int count = 1 + static_cast<int>(rng() % 12);
    for (int t = 0; t < count; ++t) {
      const std::size_t sizes[] = {0, 1, 63, 64, 65, 700, 5000};
      transfers.push_back(
          {static_cast<int>(rng() % n), static_cast<int>(rng() % n), sizes[rng() % 7]});
    }
    std::vector<Bytes> sent(transfers.size()), got(transfers.size());
    std::vector<OpArgs> args(n);
    for (int r = 0; r < n; ++r) args[r].kind = OpKind::p2p;
    for (std::size_t t = 0; t < transfers.size(); ++t) {
      const Transfer& x = transfers[t];
      sent[t].resize(x.bytes);
      for (auto& b : sent[t]) b = static_cast<char>(rng());
      got[t].assign(x.bytes, 0);
      args[x.src].p2p.push_back(
          coccl::Transfer{true, sent[t].data(), x.bytes, DataType::int8, x.dst});
      args[x.dst].p2p.push_back(
          coccl::Transfer{false, got[t].data(), x.bytes, DataType::int8, x.src});
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    follow(args, 2 * 64 * static_cast<std::size_t>(n));
    if (HasFatalFailure()) return;
    for (std::size_t t = 0; t < transfers.size(); ++t)
      EXPECT_EQ(got[t], sent[t]) << "transfer " << t;
  }
}

TEST(NetPlan, AllToAllvWithGapsMovesExactlyTheCountedElements) {
  const int n = 4;
  auto cnt = [](int from, int to) { return static_cast<std::size_t>((from * 7 + to * 13) % 90); };
  std::vector<std::vector<std::int32_t>> in(n), out(n);
  std::vector<std::vector<std::size_t>> sc(n, std::vector<std::size_t>(n)), sd = sc, rc = sc,
                                                                            rd = sc;
  std::vector<OpArgs> args(n);
  for (int r = 0; r < n; ++r) {
    std::size_t so = 0, ro = 0;
    for (int q = n - 1; q >= 0; --q) {
      sc[r][q] = cnt(r, q), sd[r][q] = so, so += sc[r][q] + 3;
      rc[r][q] = cnt(q, r), rd[r][q] = ro, ro += rc[r][q] + 5;
    }
    in[r].resize(so);
    out[r].assign(ro, -1);
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < sc[r][q]; ++i) in[r][sd[r][q] + i] = value(r, q * 100 + i);
    args[r].kind = OpKind::all_to_allv;
    args[r].type = DataType::int32;
    args[r].send = in[r].data();
    args[r].recv = out[r].data();
    args[r].send_counts = sc[r];
    args[r].send_displs = sd[r];
    args[r].recv_counts = rc[r];
    args[r].recv_displs = rd[r];
  }
  follow(args, 64 * n);
  if (HasFatalFailure()) return;
  for (int r = 0; r < n; ++r) {
    std::vector<std::int32_t> want(out[r].size(), -1);
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < rc[r][q]; ++i) want[rd[r][q] + i] = value(q, r * 100 + i);
    EXPECT_EQ(out[r], want) << "rank " << r;
  }
}

// all_to_allv with counts known on the device: the plan both sides build from the exchanged
// counts (net_a2av_plan), its transfers from round 1 on.
TEST(NetPlan, AllToAllvFromExchangedCountsMovesExactlyTheCountedElements) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 5);
    std::vector<std::vector<std::int64_t>> sc(n, std::vector<std::int64_t>(n));
    for (auto& row : sc)
      for (auto& c : row) c = rng() % 3 == 0 ? 0 : static_cast<std::int64_t>(rng() % 200);
    const std::uint32_t elt = trial % 2 ? 4 : 2;
    const std::size_t slot = 64 * static_cast<std::size_t>(n) * 2;
    std::vector<Bytes> in(n), out(n);
    std::vector<kernels::NetPlan> plans(n);
    std::vector<OpArgs> shapes(n);
    std::vector<std::vector<std::uint64_t>> sd(n), rd(n);
    for (int r = 0; r < n; ++r) {
      std::vector<std::int64_t> rc(n);
      std::uint64_t so = 0, ro = 0;
      for (int q = 0; q < n; ++q) {
        rc[q] = sc[q][r];
        sd[r].push_back(so), so += static_cast<std::uint64_t>(sc[r][q]) + 1;  // gaps of one
        rd[r].push_back(ro), ro += static_cast<std::uint64_t>(rc[q]);         // packed
      }
      in[r].resize(so * elt);
      for (std::size_t i = 0; i < in[r].size(); ++i) in[r][i] = static_cast<char>(r * 31 + i);
      out[r].assign(ro * elt, 0);
      kernels::net_a2av_plan(plans[r], n, slot / n / 64 * 64, elt, in[r].data(), out[r].data(),
                             sc[r].data(), sd[r].data(), rc.data(), rd[r].data());
      shapes[r].kind = OpKind::p2p;
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    follow_plans(plans, shapes, slot, 1);
    if (HasFatalFailure()) return;
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q) {
        const Bytes want(in[q].begin() + sd[q][r] * elt,
                         in[q].begin() + (sd[q][r] + sc[q][r]) * elt);
        const Bytes got(out[r].begin() + rd[r][q] * elt,
                        out[r].begin() + (rd[r][q] + sc[q][r]) * elt);
        EXPECT_EQ(got, want) << "from " << q << " to " << r;
      }
  }
}

TEST(NetPlan, TooManyTransfersOneWayAreUnsupported) {
  std::vector<char> b(8);
  OpArgs a;
  a.kind = OpKind::p2p;
  for (int i = 0; i <= kernels::net_max_segs; ++i)
    a.p2p.push_back(Transfer{true, b.data(), 8, DataType::int8, 1});
  kernels::NetPlan p;
  EXPECT_EQ(make_net_plan(a, 0, 2, 4096, p), make_error_code(errc::unsupported));
  a.p2p.pop_back();
  EXPECT_FALSE(make_net_plan(a, 0, 2, 4096, p));
  EXPECT_EQ(p.nin, static_cast<std::uint32_t>(kernels::net_max_segs));
}

TEST(NetPlan, AGroupWithOnlyEmptyTransfersHasNoRounds) {
  OpArgs a;
  a.kind = OpKind::p2p;
  a.p2p.push_back(Transfer{true, nullptr, 0, DataType::int8, 1});
  a.p2p.push_back(Transfer{false, nullptr, 0, DataType::int8, 1});
  kernels::NetPlan p;
  EXPECT_FALSE(make_net_plan(a, 0, 2, 4096, p));
  EXPECT_EQ(p.rounds, 0u);
}

}  // namespace
}  // namespace coccl::detail
