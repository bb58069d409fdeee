// all_reduce: one-shot, direct (reduce-scatter + all-gather among all ranks), ring and recursive
// doubling.
#include "collectives/algo/common.hpp"
#include "collectives/algorithms.hpp"

namespace coccl::detail::algo {

namespace {

// Direct all_reduce, reduce-scatter phase, sending side: each peer gets its segment of our input.
Task direct_rs_send(Op& op, std::size_t max_chunks) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t k = op.per_chunk(), e = op.elt();
  for (std::size_t c = 0; c < max_chunks; ++c)
    for (int i = 1; i < n; ++i) {
      int p = (r + i) % n;
      Range s = segment(a.count, n, p);
      if (c * k >= s.size()) continue;
      std::size_t elems = std::min(k, s.size() - c * k);
      co_await op.put(p, cbytes(a.send) + (s.begin + c * k) * e, elems * e);
    }
}

// Receiving side: reduce our segment from every rank's contribution.
Task direct_rs_recv(Op& op, Range mine, std::vector<int> order) {
  const auto& a = op.args();
  const std::size_t k = op.per_chunk(), e = op.elt();
  for (std::size_t off = 0; off < mine.size(); off += k) {
    std::size_t elems = std::min(k, mine.size() - off);
    std::byte* dst = bytes(a.recv) + (mine.begin + off) * e;
    co_await reduce_from_all(op, dst, cbytes(a.send) + (mine.begin + off) * e, elems, order,
                             base_op(a.op));
    finish_avg(op, dst, elems);
  }
}

// All-gather phase: our reduced segment to every peer, theirs into place (blocks zero-copy where
// the receive buffers are registered).
Task direct_all_gather(Op& op, Range mine) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t e = op.elt();
  std::vector<Block> sends, recvs;
  for (int i = 1; i < n; ++i) {
    const int p = (r + i) % n;
    const Range s = segment(a.count, n, p);
    sends.push_back({p, bytes(a.recv) + mine.begin * e, mine.size()});
    recvs.push_back({p, bytes(a.recv) + s.begin * e, s.size()});
  }
  co_await exchange(op, std::move(sends), std::move(recvs));
}

}  // namespace

// Every rank sends its whole buffer to every other and reduces all of them: one round, for small
// sizes.
Task all_reduce_oneshot(Op& op) {
  const auto& a = op.args();
  co_await op.connect_all();
  std::size_t k = op.per_chunk();
  auto order = all_ranks(op.n());
  for (std::size_t off = 0; off < a.count; off += k) {
    std::size_t elems = std::min(k, a.count - off);
    const std::byte* own = cbytes(a.send) + off * op.elt();
    for (int i = 1; i < op.n(); ++i)
      co_await op.put((op.rank() + i) % op.n(), own, elems * op.elt());
    std::byte* dst = bytes(a.recv) + off * op.elt();
    co_await reduce_from_all(op, dst, own, elems, order, base_op(a.op));
    finish_avg(op, dst, elems);
  }
}

// Reduce-scatter then all-gather, each rank talking to all others at once: rank p reduces
// segment p. Suits shared memory, where all pairs share the same memory system.
Task all_reduce_direct(Op& op) {
  const auto& a = op.args();
  co_await op.connect_all();
  const int n = op.n();
  Range mine = segment(a.count, n, op.rank());
  std::size_t max_chunks = chunks_of(segment(a.count, n, 0).size(), op.per_chunk());
  auto order = all_ranks(n);
  {
    std::vector<Task> tasks;
    tasks.push_back(direct_rs_send(op, max_chunks));
    tasks.push_back(direct_rs_recv(op, mine, order));
    co_await all_of(std::move(tasks));
  }
  co_await direct_all_gather(op, mine);
}

// Ring reduce-scatter + all-gather: each rank talks only to its neighbours; bandwidth-optimal
// over a network.
Task all_reduce_ring(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<int> neighbours(2);
  neighbours[0] = right;
  neighbours[1] = left;
  co_await op.connect(neighbours);
  const std::size_t e = op.elt();
  // Nothing is copied in place first: the first step sends our own segment from the input, each
  // reduction reads our contribution from the input and writes the receive buffer, and the
  // all-gather fills the rest, so every segment of the result is written once.
  for (int step = 0; step < 2 * (n - 1); ++step) {
    bool reducing = step < n - 1;
    int s = reducing ? step : step - (n - 1);
    int send_seg = reducing ? (r - s + n) % n : (r + 1 - s + n) % n;
    int recv_seg = reducing ? (r - s - 1 + 2 * n) % n : (r - s + n) % n;
    Range out = segment(a.count, n, send_seg), in = segment(a.count, n, recv_seg);
    if (!reducing) {
      // All-gather steps move segments between receive buffers: blocks where they are large.
      std::vector<Block> sends, recvs;
      sends.push_back({right, bytes(a.recv) + out.begin * e, out.size()});
      recvs.push_back({left, bytes(a.recv) + in.begin * e, in.size()});
      co_await exchange(op, std::move(sends), std::move(recvs));
      continue;
    }
    std::vector<Task> tasks;
    const std::byte* from = step == 0 ? cbytes(a.send) : cbytes(a.recv);
    tasks.push_back(op.send(right, from + out.begin * e, out.size()));
    tasks.push_back(ring_reduce_recv(op, left, bytes(a.recv) + in.begin * e,
                                     cbytes(a.send) + in.begin * e, in.size()));
    co_await all_of(std::move(tasks));
    if (step == n - 2) {
      // This rank now holds the full reduction of segment recv_seg.
      finish_avg(op, bytes(a.recv) + in.begin * e, in.size());
    }
  }
}

// Recursive doubling: log2(n) rounds, each with one peer (rd_partner: the rank whose Gray code
// differs in bit k; with many ranks, the rank whose number does). Ranks past the largest power of
// two first fold their data into the rank 2^k below them and get the result back at the end. Both
// partners of a round combine the same two operands (IEEE operations commute), so every rank ends
// with bit-identical results. For small sizes on many ranks: O(log n) peers and rounds.
Task all_reduce_rd(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t e = op.elt();
  int pof2 = 1;
  while (pof2 <= n / 2) pof2 *= 2;
  const int rem = n - pof2;
  const bool gray = rd_in_gray_order(op.comm());
  std::vector<int> peers;
  if (r >= pof2) {
    peers.push_back(r - pof2);
  } else {
    if (r < rem) peers.push_back(r + pof2);
    for (int m = 1; m < pof2; m <<= 1) peers.push_back(rd_partner(r, m, gray));
  }
  co_await op.connect(peers);
  copy_in_place(a, e);
  const std::size_t k = op.per_chunk();
  const ReduceOp rop = base_op(a.op);
  for (std::size_t off = 0; off < a.count; off += k) {
    const std::size_t elems = std::min(k, a.count - off), len = elems * e;
    std::byte* buf = bytes(a.recv) + off * e;
    if (r >= pof2) {
      co_await op.put(r - pof2, buf, len);
      Chunk ch = co_await op.take(r - pof2, len);
      std::memcpy(buf, ch.data, len);
      op.release(r - pof2);
      finish_avg(op, buf, elems);
      continue;
    }
    if (r < rem) {
      Chunk ch = co_await op.take(r + pof2, len);
      reduce2(buf, buf, ch.data, elems, a.type, rop);
      op.release(r + pof2);
    }
    for (int m = 1; m < pof2; m <<= 1) {
      const int p = rd_partner(r, m, gray);
      co_await op.put(p, buf, len);
      Chunk ch = co_await op.take(p, len);
      if (r < p)
        reduce2(buf, buf, ch.data, elems, a.type, rop);
      else
        reduce2(buf, ch.data, buf, elems, a.type, rop);
      op.release(p);
    }
    if (r < rem) co_await op.put(r + pof2, buf, len);
    finish_avg(op, buf, elems);
  }
}

}  // namespace coccl::detail::algo
