// Correctness scenarios: every collective against the reference of reference.hpp.
//
// Flags: "quick" runs fewer types (for transport and algorithm variants); "nolarge" skips the
// sizes that span many slots.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "tests/multirank/worker.hpp"

namespace coccl::test {
namespace {

constexpr std::size_t small_counts[] = {0, 1, 7, 1023};
// Spans many 256 KiB slots in every type wider than a byte; odd, so no chunking divides it.
constexpr std::size_t large_count = 600001;
// Per-peer count of the collectives whose buffers hold nranks * count elements.
constexpr std::size_t large_per_peer = 150001;
constexpr std::byte poison{0xcd};

constexpr DataType all_types[] = {DataType::int8,    DataType::uint8,       DataType::int32,
                                  DataType::uint32,  DataType::int64,       DataType::uint64,
                                  DataType::float16, DataType::bfloat16,    DataType::float32,
                                  DataType::float64, DataType::float8_e4m3, DataType::float8_e5m2};
constexpr DataType quick_types[] = {DataType::uint8, DataType::int32, DataType::bfloat16,
                                    DataType::float32, DataType::float8_e5m2};
constexpr ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::max, ReduceOp::min,
                                ReduceOp::avg};

std::vector<DataType> reduce_types(const Worker& w) {
  if (w.has("quick")) return {std::begin(quick_types), std::end(quick_types)};
  return {std::begin(all_types), std::end(all_types)};
}

std::vector<DataType> copy_types(const Worker& w) {
  if (w.has("quick")) return {DataType::uint8, DataType::float64};
  return {DataType::uint8, DataType::float16, DataType::int32, DataType::float64};
}

bool large(const Worker& w) { return !w.has("nolarge"); }

// Never empty, so a zero count still passes a real pointer.
Bytes buffer(std::size_t bytes, std::byte fill = poison) {
  return Bytes(std::max<std::size_t>(bytes, 1), fill);
}

Bytes copy_data(int rank, std::uint64_t salt, std::size_t first, std::size_t bytes) {
  Bytes b = buffer(bytes);
  fill_copy(rank, salt, b.data(), first, bytes);
  return b;
}

std::string place(bool in_place) { return in_place ? "in_place" : "out_of_place"; }

std::uint64_t next_salt() {
  static std::uint64_t salt = 1;
  return ++salt;
}

void all_reduce_case(Worker& w, DataType t, ReduceOp op, std::size_t count, bool in_place) {
  const std::uint64_t salt = next_salt();
  const std::size_t bytes = count * size_of(t);
  Bytes send = buffer(bytes), recv = buffer(bytes);
  fill_reduce(t, op, w.rank, salt, send.data(), 0, count);
  const std::string what = describe("all_reduce", t, op, count, place(in_place));
  if (in_place) {
    recv = send;
    w.comm.all_reduce(recv.data(), recv.data(), count, t, op);
  } else {
    const Bytes before = send;
    w.comm.all_reduce(send.data(), recv.data(), count, t, op);
    w.expect_equal(what + " (send buffer kept)", t, send.data(), before.data(), count);
  }
  const Bytes want = reduce_reference(t, op, w.n, salt, 0, count);
  w.expect_equal(what, t, recv.data(), want.data(), count);
}

}  // namespace

void run_all_reduce(Worker& w) {
  for (DataType t : reduce_types(w))
    for (ReduceOp op : all_ops)
      for (std::size_t count : small_counts)
        for (bool in_place : {false, true}) all_reduce_case(w, t, op, count, in_place);
  if (!large(w)) return;
  const std::pair<DataType, ReduceOp> big[] = {
      {DataType::float32, ReduceOp::sum}, {DataType::bfloat16, ReduceOp::avg},
      {DataType::int32, ReduceOp::max},   {DataType::float64, ReduceOp::prod},
      {DataType::uint8, ReduceOp::min},   {DataType::float8_e4m3, ReduceOp::sum},
      {DataType::float16, ReduceOp::avg}, {DataType::int64, ReduceOp::sum}};
  const std::size_t k = w.has("quick") ? 3 : std::size(big);
  for (std::size_t i = 0; i < k; ++i)
    all_reduce_case(w, big[i].first, big[i].second, large_count, i % 2 == 1);
}

void run_broadcast(Worker& w) {
  auto one = [&w](DataType t, std::size_t count, int root, bool in_place) {
    const std::uint64_t salt = next_salt();
    const std::size_t bytes = count * size_of(t);
    const Bytes data = copy_data(root, salt, 0, bytes);
    Bytes recv = buffer(bytes);
    const void* send = nullptr;  // read on root only
    if (w.rank == root && in_place) recv = data;
    if (w.rank == root)
      send = in_place ? recv.data() : data.data();
    else if (in_place)
      send = recv.data();
    w.comm.broadcast(send, recv.data(), count, t, root);
    w.expect_equal(describe("broadcast", t, ReduceOp::sum, count,
                            "root=" + std::to_string(root) + " " + place(in_place)),
                   t, recv.data(), data.data(), count);
  };
  for (int root = 0; root < w.n; ++root)
    for (DataType t : copy_types(w))
      for (std::size_t count : small_counts)
        for (bool in_place : {false, true}) one(t, count, root, in_place);
  if (large(w)) {
    one(DataType::float32, large_count, 0, false);
    one(DataType::int64, large_count, w.n - 1, true);
  }
}

void run_reduce(Worker& w) {
  auto one = [&w](DataType t, ReduceOp op, std::size_t count, int root, bool in_place) {
    const std::uint64_t salt = next_salt();
    const std::size_t bytes = count * size_of(t);
    Bytes send = buffer(bytes), recv = buffer(bytes);
    fill_reduce(t, op, w.rank, salt, send.data(), 0, count);
    const Bytes mine = send;
    const std::string what =
        describe("reduce", t, op, count, "root=" + std::to_string(root) + " " + place(in_place));
    if (in_place) {
      recv = send;
      w.comm.reduce(recv.data(), recv.data(), count, t, op, root);
    } else {
      // recv is used on root only: other ranks pass none.
      w.comm.reduce(send.data(), w.rank == root ? recv.data() : nullptr, count, t, op, root);
      w.expect_equal(what + " (send buffer kept)", t, send.data(), mine.data(), count);
    }
    if (w.rank == root) {
      const Bytes want = reduce_reference(t, op, w.n, salt, 0, count);
      w.expect_equal(what, t, recv.data(), want.data(), count);
    } else if (in_place) {
      w.expect_equal(what + " (non-root buffer kept)", t, recv.data(), mine.data(), count);
    }
  };
  int k = 0;
  for (DataType t : reduce_types(w))
    for (ReduceOp op : all_ops) {
      for (std::size_t count : small_counts) one(t, op, count, k % w.n, k % 2 == 0), ++k;
    }
  if (large(w)) {
    one(DataType::float32, ReduceOp::sum, large_count, w.n - 1, false);
    one(DataType::int32, ReduceOp::max, large_count, 0, true);
  }
}

void run_all_gather(Worker& w) {
  auto one = [&w](DataType t, std::size_t count, bool in_place) {
    const std::uint64_t salt = next_salt();
    const std::size_t bytes = count * size_of(t);
    const Bytes mine = copy_data(w.rank, salt, 0, bytes);
    Bytes recv = buffer(bytes * w.n);
    if (in_place) {
      std::memcpy(recv.data() + w.rank * bytes, mine.data(), bytes);
      w.comm.all_gather(recv.data() + w.rank * bytes, recv.data(), count, t);
    } else {
      w.comm.all_gather(mine.data(), recv.data(), count, t);
    }
    for (int r = 0; r < w.n; ++r) {
      const Bytes want = copy_data(r, salt, 0, bytes);
      w.expect_equal(describe("all_gather", t, ReduceOp::sum, count,
                              place(in_place) + " from_rank=" + std::to_string(r)),
                     t, recv.data() + r * bytes, want.data(), count);
    }
  };
  for (DataType t : copy_types(w))
    for (std::size_t count : small_counts)
      for (bool in_place : {false, true}) one(t, count, in_place);
  if (large(w)) {
    one(DataType::float32, large_per_peer, false);
    one(DataType::uint8, large_per_peer, true);
  }
}

void run_reduce_scatter(Worker& w) {
  auto one = [&w](DataType t, ReduceOp op, std::size_t count, bool in_place) {
    const std::uint64_t salt = next_salt();
    const std::size_t bytes = count * size_of(t);
    Bytes send = buffer(bytes * w.n), recv = buffer(bytes);
    fill_reduce(t, op, w.rank, salt, send.data(), 0, count * w.n);
    std::byte* out = recv.data();
    if (in_place) {
      out = send.data() + w.rank * bytes;
      w.comm.reduce_scatter(send.data(), out, count, t, op);
    } else {
      w.comm.reduce_scatter(send.data(), recv.data(), count, t, op);
    }
    const Bytes want = reduce_reference(t, op, w.n, salt, w.rank * count, count);
    w.expect_equal(describe("reduce_scatter", t, op, count, place(in_place)), t, out, want.data(),
                   count);
  };
  int k = 0;
  for (DataType t : reduce_types(w))
    for (ReduceOp op : all_ops)
      for (std::size_t count : small_counts) one(t, op, count, k++ % 2 == 0);
  if (large(w)) {
    one(DataType::float32, ReduceOp::sum, large_per_peer, false);
    one(DataType::int64, ReduceOp::min, large_per_peer, true);
  }
}

void check_all_to_all(Worker& w, DataType t, std::size_t count) {
  const std::uint64_t salt = next_salt();
  const std::size_t bytes = count * size_of(t);
  const Bytes send = copy_data(w.rank, salt, 0, bytes * w.n);
  Bytes recv = buffer(bytes * w.n);
  w.comm.all_to_all(send.data(), recv.data(), count, t);
  for (int p = 0; p < w.n; ++p) {
    const Bytes want = copy_data(p, salt, w.rank * bytes, bytes);
    w.expect_equal(
        describe("all_to_all", t, ReduceOp::sum, count, "from_rank=" + std::to_string(p)), t,
        recv.data() + p * bytes, want.data(), count);
  }
}

void run_all_to_all(Worker& w) {
  for (DataType t : copy_types(w))
    for (std::size_t count : small_counts) check_all_to_all(w, t, count);
  if (large(w)) check_all_to_all(w, DataType::int32, large_per_peer);
}

void run_all_to_allv(Worker& w) {
  const int n = w.n;
  // Count of elements rank s sends to rank d, for each pattern.
  auto pattern_count = [n](int pattern, int s, int d) -> std::size_t {
    switch (pattern) {
      case 0:
        return static_cast<std::size_t>((s * 3 + d * 5) % 4) * 5;  // zeros included
      case 1:
        if (s == 0 || d == n - 1) return 0;  // rank 0 sends nothing, rank n-1 gets nothing
        return s == 1 && d == 0 ? 200003 : static_cast<std::size_t>(s + 2 * d + 1);
      default:
        return 0;  // nothing moves at all
    }
  };
  auto one = [&](int pattern, DataType t) {
    const std::uint64_t salt = next_salt();
    const std::size_t elt = size_of(t);
    std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
    // Segments are laid out in reverse peer order with gaps, so displacements matter.
    std::size_t send_total = 0, recv_total = 0;
    for (int p = n - 1; p >= 0; --p) {
      sc[p] = pattern_count(pattern, w.rank, p);
      rc[p] = pattern_count(pattern, p, w.rank);
      sd[p] = send_total + 3;
      rd[p] = recv_total + 2;
      send_total = sd[p] + sc[p];
      recv_total = rd[p] + rc[p];
    }
    Bytes send = buffer(send_total * elt), recv = buffer(recv_total * elt);
    Bytes want = buffer(recv_total * elt);
    auto first = [](int dst) { return static_cast<std::size_t>(dst) << 32; };
    for (int p = 0; p < n; ++p) {
      fill_copy(w.rank, salt, send.data() + sd[p] * elt, first(p), sc[p] * elt);
      fill_copy(p, salt, want.data() + rd[p] * elt, first(w.rank), rc[p] * elt);
    }
    w.comm.all_to_allv(send.data(), sc, sd, recv.data(), rc, rd, t);
    w.expect_equal(describe("all_to_allv", t, ReduceOp::sum, recv_total,
                            "pattern=" + std::to_string(pattern) + " (whole buffer, gaps kept)"),
                   t, recv.data(), want.data(), recv_total);
  };
  for (int pattern = 0; pattern < 3; ++pattern)
    for (DataType t : {DataType::uint8, DataType::float32, DataType::int64}) one(pattern, t);
}

void run_gather(Worker& w) {
  auto one = [&w](DataType t, std::size_t count, int root) {
    const std::uint64_t salt = next_salt();
    const std::size_t bytes = count * size_of(t);
    const Bytes mine = copy_data(w.rank, salt, 0, bytes);
    Bytes recv = buffer(bytes * w.n);
    w.comm.gather(mine.data(), w.rank == root ? recv.data() : nullptr, count, t, root);
    if (w.rank != root) return;
    for (int r = 0; r < w.n; ++r) {
      const Bytes want = copy_data(r, salt, 0, bytes);
      w.expect_equal(describe("gather", t, ReduceOp::sum, count,
                              "root=" + std::to_string(root) + " from_rank=" + std::to_string(r)),
                     t, recv.data() + r * bytes, want.data(), count);
    }
  };
  for (int root = 0; root < w.n; ++root)
    for (DataType t : copy_types(w))
      for (std::size_t count : small_counts) one(t, count, root);
  if (large(w)) one(DataType::float32, large_per_peer, w.n - 1);
}

void run_scatter(Worker& w) {
  auto one = [&w](DataType t, std::size_t count, int root) {
    const std::uint64_t salt = next_salt();
    const std::size_t bytes = count * size_of(t);
    const Bytes all = copy_data(root, salt, 0, bytes * w.n);
    Bytes recv = buffer(bytes);
    w.comm.scatter(w.rank == root ? all.data() : nullptr, recv.data(), count, t, root);
    w.expect_equal(describe("scatter", t, ReduceOp::sum, count, "root=" + std::to_string(root)), t,
                   recv.data(), all.data() + w.rank * bytes, count);
  };
  for (int root = 0; root < w.n; ++root)
    for (DataType t : copy_types(w))
      for (std::size_t count : small_counts) one(t, count, root);
  if (large(w)) one(DataType::float32, large_per_peer, 0);
}

void run_send_recv(Worker& w) {
  const int n = w.n, me = w.rank;
  auto first = [](int dst, int k) {
    return (static_cast<std::size_t>(dst) << 32) | (static_cast<std::size_t>(k) << 31);
  };
  {  // A ring: everyone sends to the next rank and receives from the previous one.
    const std::uint64_t salt = next_salt();
    const DataType t = DataType::float32;
    const std::size_t count = 1023, bytes = count * 4;
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    const Bytes out = copy_data(me, salt, first(next, 0), bytes);
    Bytes in = buffer(bytes);
    w.comm.send_recv({Communicator::recv_op(in.data(), count, t, prev),
                      Communicator::send_op(out.data(), count, t, next)});
    const Bytes want = copy_data(prev, salt, first(me, 0), bytes);
    w.expect_equal(describe("send_recv", t, ReduceOp::sum, count, "ring"), t, in.data(),
                   want.data(), count);
  }
  {  // All pairs, self included, two transfers per direction (matched in order), one group.
    const std::uint64_t salt = next_salt();
    const DataType t = DataType::int32;
    auto count_of = [](int s, int d, int k) -> std::size_t {
      return k == 0 ? static_cast<std::size_t>((s * 7 + d * 3) % 5) * 3
                    : static_cast<std::size_t>(1000 + s + 3 * d);
    };
    std::vector<Bytes> out, in;
    std::vector<Transfer> ops;
    out.reserve(2 * n);
    in.reserve(2 * n);
    for (int p = n - 1; p >= 0; --p)
      for (int k = 0; k < 2; ++k) {
        in.push_back(buffer(count_of(p, me, k) * 4));
        ops.push_back(Communicator::recv_op(in.back().data(), count_of(p, me, k), t, p));
      }
    for (int p = 0; p < n; ++p)
      for (int k = 0; k < 2; ++k) {
        out.push_back(copy_data(me, salt, first(p, k), count_of(me, p, k) * 4));
        ops.push_back(Communicator::send_op(out.back().data(), count_of(me, p, k), t, p));
      }
    w.comm.send_recv(ops);
    std::size_t i = 0;
    for (int p = n - 1; p >= 0; --p)
      for (int k = 0; k < 2; ++k, ++i) {
        const Bytes want = copy_data(p, salt, first(me, k), count_of(p, me, k) * 4);
        w.expect_equal(
            describe("send_recv", t, ReduceOp::sum, count_of(p, me, k),
                     "all_pairs from_rank=" + std::to_string(p) + " transfer=" + std::to_string(k)),
            t, in[i].data(), want.data(), count_of(p, me, k));
      }
  }
  if (large(w) && n > 1) {  // Only ranks 0 and n-1 take part; the others skip the group.
    const std::uint64_t salt = next_salt();
    const DataType t = DataType::float32;
    const std::size_t count = large_count, bytes = count * 4;
    const int peer = me == 0 ? n - 1 : 0;
    if (me == 0 || me == n - 1) {
      const Bytes out = copy_data(me, salt, 0, bytes);
      Bytes in = buffer(bytes);
      w.comm.send_recv({Communicator::send_op(out.data(), count, t, peer),
                        Communicator::recv_op(in.data(), count, t, peer)});
      const Bytes want = copy_data(peer, salt, 0, bytes);
      w.expect_equal(describe("send_recv", t, ReduceOp::sum, count, "pair 0<->n-1"), t, in.data(),
                     want.data(), count);
    }
  }
  {  // The single-transfer forms: rank 0 sends to rank 1.
    const std::uint64_t salt = next_salt();
    const std::size_t count = 7;
    if (me == 0 && n > 1) {
      const Bytes out = copy_data(0, salt, 0, count * 8);
      w.comm.send(out.data(), count, DataType::float64, 1);
    } else if (me == 1) {
      Bytes in = buffer(count * 8);
      w.comm.recv(in.data(), count, DataType::float64, 0);
      const Bytes want = copy_data(0, salt, 0, count * 8);
      w.expect_equal(describe("send/recv", DataType::float64, ReduceOp::sum, count),
                     DataType::float64, in.data(), want.data(), count);
    }
  }
  w.comm.barrier();
}

void run_barrier(Worker& w) {
  using namespace std::chrono;
  // steady_clock is CLOCK_MONOTONIC, one clock for every process of this machine.
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(milliseconds(15 * ((w.rank + round) % w.n)));
    const std::int64_t entered =
        duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
    w.comm.barrier();
    const std::int64_t left =
        duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
    std::vector<std::int64_t> all(w.n);
    w.comm.all_gather(&entered, all.data(), 1, DataType::int64);
    const std::int64_t last = *std::max_element(all.begin(), all.end());
    if (left < last)
      w.fail("coll=barrier round=" + std::to_string(round),
             "left the barrier " + std::to_string(last - left) +
                 " ns before the last rank entered it");
  }
}

}  // namespace coccl::test
