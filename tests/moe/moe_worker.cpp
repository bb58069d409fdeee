// moe_worker: one rank of the host-memory MoE exchange tests (tests/moe/moe_host_test.cpp).
//
//   moe_worker <scenario> <rank> <nranks> <unique-id-hex>
//
// Exits 0 only if every check against tests/moe/moe_reference.hpp passed; prints one FAIL line
// per failed check.
#include <coccl/coccl.hpp>
#include <coccl/moe.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/moe/moe_reference.hpp"

namespace {

using coccl::DataType;
using namespace coccl::moe_test;

int failures = 0;
int me = 0;

void fail(const std::string& what) {
  std::printf("FAIL rank=%d %s\n", me, what.c_str());
  std::fflush(stdout);
  ++failures;
}

// all_to_allv with counts of `kind`, int64 or int32 counts, packed or spread displacements.
template <class Count>
void a2av_round(coccl::Communicator& comm, coccl::moe::AllToAllv& a2a, Counts kind,
                std::int64_t max, int round, bool spread) {
  const int n = comm.size();
  std::vector<Count> sc(n), sd(n), rc(n, -7), rd(n);
  std::int64_t so = 0;
  for (int q = 0; q < n; ++q) {
    sc[q] = static_cast<Count>(a2av_count(kind, me, q, round, max));
    sd[q] = static_cast<Count>(so);
    so += sc[q] + (spread ? 3 : 0);
  }
  for (int q = 0; q < n; ++q) rd[q] = static_cast<Count>((n - 1 - q) * (max + 2));
  std::vector<std::int32_t> send(so + 1), recv(n * (max + 2) + 1, -1);
  for (int q = 0; q < n; ++q)
    for (Count i = 0; i < sc[q]; ++i) send[sd[q] + i] = a2av_value(me, q, i, round);
  a2a.run(send.data(), sc.data(), spread ? sd.data() : nullptr, recv.data(), rc.data(),
          spread ? rd.data() : nullptr);
  std::int64_t at = 0;
  for (int q = 0; q < n; ++q) {
    const std::int64_t want = a2av_count(kind, q, me, round, max);
    if (rc[q] != want) {
      fail("a2av round=" + std::to_string(round) + " recv_counts[" + std::to_string(q) +
           "]=" + std::to_string(rc[q]) + " want " + std::to_string(want));
      return;
    }
    const std::int64_t base = spread ? rd[q] : at;
    for (std::int64_t i = 0; i < want; ++i) {
      if (recv[base + i] != a2av_value(q, me, i, round)) {
        fail("a2av round=" + std::to_string(round) + " from " + std::to_string(q) + " element " +
             std::to_string(i));
        return;
      }
    }
    at += want;
  }
}

void run_a2av(coccl::Communicator& comm) {
  const std::int64_t max = 1000;
  coccl::moe::AllToAllv a2a(comm, max, DataType::int32);
  for (int round = 0; round < 6; ++round) {
    a2av_round<std::int64_t>(comm, a2a, Counts::random, max, round, round % 2 == 1);
    a2av_round<std::int32_t>(comm, a2a, Counts::random, max, round, round % 2 == 0);
  }
  for (int round = 0; round < comm.size(); ++round)
    a2av_round<std::int64_t>(comm, a2a, Counts::skewed, max, round, false);
  a2av_round<std::int64_t>(comm, a2a, Counts::at_max, max, 0, true);
  a2av_round<std::int32_t>(comm, a2a, Counts::zeros, max, 0, false);
  if (a2a.device_bytes() != 0) fail("host all_to_allv allocated device memory");
}

// A count above the maximum on rank 0 fails the call on every rank, and the object stays usable.
void run_a2av_over_max(coccl::Communicator& comm) {
  const int n = comm.size();
  coccl::moe::AllToAllv a2a(comm, 10, DataType::int32);
  std::vector<std::int64_t> sc(n, 1), rc(n);
  if (me == 0) sc[n - 1] = 11;
  std::vector<std::int32_t> send(64), recv(64);
  try {
    a2a.run(send.data(), sc.data(), nullptr, recv.data(), rc.data(), nullptr);
    fail("a count above max_count was accepted");
  } catch (const std::system_error& e) {
    if (e.code() != coccl::make_error_code(coccl::errc::invalid_argument))
      fail(std::string("unexpected error ") + e.what());
  }
  a2av_round<std::int64_t>(comm, a2a, Counts::at_max, 10, 1, false);
}

void check_dispatch(const MoeCase& c, const coccl::moe::Received& got) {
  const Expected want = expected_dispatch(c, me);
  const int El = c.num_experts / c.nranks;
  if (got.local_experts != El || got.first_expert != me * El) fail("local experts");
  for (int j = 0; j <= El; ++j) {
    if (got.expert_offsets[j] != want.offsets[j]) {
      fail("round=" + std::to_string(c.round) + " expert_offsets[" + std::to_string(j) + "]=" +
           std::to_string(got.expert_offsets[j]) + " want " + std::to_string(want.offsets[j]));
      return;
    }
    if (j < El && got.expert_counts[j] != want.counts[j]) fail("expert_counts");
  }
  std::vector<std::vector<char>> xs(c.nranks);
  for (int q = 0; q < c.nranks; ++q) xs[q] = tokens_x(c, q);
  const std::size_t row = row_bytes(c);
  for (std::size_t r = 0; r < want.rows.size(); ++r) {
    const coccl::moe::Row& g = got.rows[r];
    const coccl::moe::Row& w = want.rows[r];
    if (g.rank != w.rank || g.token != w.token || g.slot != w.slot || g.expert != w.expert) {
      fail("round=" + std::to_string(c.round) + " row " + std::to_string(r) + " metadata");
      return;
    }
    if (std::memcmp(static_cast<const char*>(got.x) + r * row, xs[w.rank].data() + w.token * row,
                    row) != 0) {
      fail("round=" + std::to_string(c.round) + " row " + std::to_string(r) + " data");
      return;
    }
  }
}

void run_dispatch_combine(coccl::Communicator& comm, DataType type, Routing routing) {
  const int n = comm.size();
  MoeCase c{n, 24, 40, type, 4, 4 * n, routing, 0};
  if (routing == Routing::skewed) c.top_k = 3;
  coccl::moe::Dispatcher moe(comm, {c.max_tokens, c.hidden, c.type, c.top_k, c.num_experts, 0});
  for (int round = 0; round < 4; ++round) {
    c.round = round;
    const std::vector<char> x = tokens_x(c, me);
    const std::vector<std::int32_t> idx = routing_of(c, me);
    const std::vector<float> w = weights_of(c, me);
    const int tokens = tokens_of(c, me);
    const coccl::moe::Received got = moe.dispatch(x.data(), tokens, idx.data());
    check_dispatch(c, got);
    const std::size_t row = row_bytes(c);
    const int rows = got.expert_offsets[got.local_experts];
    std::vector<char> y(std::max(rows, 1) * row);
    for (int r = 0; r < rows; ++r)
      expert_apply(type, got.rows[r].expert, static_cast<const char*>(got.x) + r * row,
                   y.data() + r * row, c.hidden);
    std::vector<char> out(tokens * row + 1);
    moe.combine(y.data(), w.data(), out.data());
    const std::vector<char> want = expected_combine(c, me, false);
    if (std::memcmp(out.data(), want.data(), want.size()) != 0)
      fail("combine round=" + std::to_string(round) +
           " type=" + std::string(coccl::to_string(type)));
  }
}

// A rank receiving more than its capacity fails dispatch on every rank.
void run_dispatch_over_capacity(coccl::Communicator& comm) {
  const int n = comm.size();
  MoeCase c{n, 16, 8, DataType::float32, 2, 2 * n, Routing::skewed, 0};
  coccl::moe::Dispatcher moe(comm, {c.max_tokens, c.hidden, c.type, c.top_k, c.num_experts, 5});
  const std::vector<char> x = tokens_x(c, me);
  const std::vector<std::int32_t> idx = routing_of(c, me);
  try {
    moe.dispatch(x.data(), tokens_of(c, me), idx.data());
    fail("dispatch over capacity was accepted");
  } catch (const std::system_error& e) {
    if (e.code() != coccl::make_error_code(coccl::errc::invalid_argument))
      fail(std::string("unexpected error ") + e.what());
  }
}

}  // namespace

extern "C" int moe_c_api_scenario(int rank, int nranks, const char* id);

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: moe_worker <scenario> <rank> <nranks> <id-hex>\n");
    return 2;
  }
  const std::string scenario = argv[1];
  me = std::atoi(argv[2]);
  const int n = std::atoi(argv[3]);
  if (scenario == "c_api") {
    // The C interface makes its own communicator from the id.
    failures = moe_c_api_scenario(me, n, argv[4]);
    if (failures == 0) std::printf("rank %d: all checks passed\n", me);
    return failures ? 1 : 0;
  }
  try {
    auto comm = coccl::Communicator::create(coccl::UniqueId::from_string(argv[4]), me, n);
    if (scenario == "a2av") {
      run_a2av(comm);
    } else if (scenario == "a2av_over_max") {
      run_a2av_over_max(comm);
    } else if (scenario == "dispatch_combine") {
      for (DataType t : {DataType::bfloat16, DataType::float32, DataType::float16})
        run_dispatch_combine(comm, t, Routing::random);
      run_dispatch_combine(comm, DataType::bfloat16, Routing::sparse);
    } else if (scenario == "dispatch_skewed") {
      run_dispatch_combine(comm, DataType::bfloat16, Routing::skewed);
    } else if (scenario == "dispatch_over_capacity") {
      run_dispatch_over_capacity(comm);
    } else {
      std::fprintf(stderr, "unknown scenario '%s'\n", scenario.c_str());
      return 2;
    }
    comm.destroy();
  } catch (const std::exception& e) {
    std::printf("EXCEPTION rank=%d: %s\n", me, e.what());
    return 2;
  }
  if (failures) return 1;
  std::printf("rank %d: all checks passed\n", me);
  return 0;
}
