// all_gather (direct, Bruck, ring) and reduce_scatter (direct, ring, recursive doubling).
#include <memory>

#include "collectives/algo/common.hpp"

namespace coccl::detail::algo {

Task all_gather_direct(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t e = op.elt();
  std::byte* mine = bytes(a.recv) + r * a.count * e;
  if (a.count != 0 && cbytes(a.send) != mine) std::memmove(mine, a.send, a.count * e);
  std::vector<Block> sends, recvs;
  for (int i = 1; i < n; ++i) {
    int p = (r + i) % n;
    sends.push_back({p, mine, a.count});
    recvs.push_back({p, bytes(a.recv) + p * a.count * e, a.count});
  }
  co_await exchange(op, std::move(sends), std::move(recvs));
}

namespace {

Task rs_send(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t k = op.per_chunk(), e = op.elt();
  for (std::size_t off = 0; off < a.count; off += k)
    for (int i = 1; i < n; ++i) {
      int p = (r + i) % n;
      co_await op.put(p, cbytes(a.send) + (p * a.count + off) * e, std::min(k, a.count - off) * e);
    }
}

Task rs_recv(Op& op) {
  const auto& a = op.args();
  const std::size_t k = op.per_chunk(), e = op.elt();
  auto order = all_ranks(op.n());
  for (std::size_t off = 0; off < a.count; off += k) {
    std::size_t elems = std::min(k, a.count - off);
    std::byte* dst = bytes(a.recv) + off * e;
    co_await reduce_from_all(op, dst, cbytes(a.send) + (op.rank() * a.count + off) * e, elems,
                             order, base_op(a.op));
    finish_avg(op, dst, elems);
  }
}

}  // namespace

Task reduce_scatter_direct(Op& op) {
  co_await op.connect_all();
  std::vector<Task> tasks;
  tasks.push_back(rs_send(op));
  tasks.push_back(rs_recv(op));
  co_await all_of(std::move(tasks));
}

// Bruck: ceil(log2 n) rounds; in the round of distance d a rank sends the first min(d, n - d)
// blocks it holds (its own, then those of the ranks after it) to rank r - d and appends as many
// from rank r + d; then the blocks are rotated into place. For small blocks on many ranks.
Task all_gather_bruck(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t e = op.elt(), block = a.count * e;
  std::vector<int> peers;
  for (int d = 1; d < n; d *= 2) {
    peers.push_back((r - d + n) % n);
    peers.push_back((r + d) % n);
  }
  co_await op.connect(peers);
  std::vector<std::byte> held(static_cast<std::size_t>(n) * block);
  if (block) std::memcpy(held.data(), a.send, block);
  for (int d = 1; d < n; d *= 2) {
    const std::size_t cnt = static_cast<std::size_t>(std::min(d, n - d));
    std::vector<Task> tasks;
    tasks.push_back(op.send((r - d + n) % n, held.data(), cnt * a.count));
    tasks.push_back(op.recv((r + d) % n, held.data() + d * block, cnt * a.count));
    co_await all_of(std::move(tasks));
  }
  for (int i = 0; i < n && block; ++i)
    std::memcpy(bytes(a.recv) + ((r + i) % n) * block, held.data() + i * block, block);
}

// Ring: n - 1 steps, each passing one block to the right neighbour; two links a rank.
Task all_gather_ring(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const std::size_t e = op.elt();
  std::vector<int> neighbours{right, left};
  co_await op.connect(std::move(neighbours));
  std::byte* mine = bytes(a.recv) + r * a.count * e;
  if (a.count != 0 && cbytes(a.send) != mine) std::memmove(mine, a.send, a.count * e);
  for (int s = 0; s + 1 < n; ++s) {
    const int out = (r - s + n) % n, in = (r - s - 1 + n) % n;
    std::vector<Block> sends, recvs;
    sends.push_back({right, bytes(a.recv) + out * a.count * e, a.count});
    recvs.push_back({left, bytes(a.recv) + in * a.count * e, a.count});
    co_await exchange(op, std::move(sends), std::move(recvs));
  }
}

// Ring: in step s a rank passes its partial sum of block r - s - 1 to the right and adds the left
// neighbour's into block r - s - 2; after n - 1 steps it holds the whole sum of block r. The first
// step sends our block straight from the input; a partial sum is sent the step after it is made,
// so two blocks of scratch alternate; the last step reduces into the receive buffer. Each
// reduction reads our own contribution from the input, which is never copied (in place, the
// receive buffer is our own block of the input, read only by that last reduction).
Task reduce_scatter_ring(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const std::size_t e = op.elt(), block = a.count * e;
  std::vector<int> neighbours{right, left};
  co_await op.connect(std::move(neighbours));
  std::unique_ptr<std::byte[]> scratch(n > 2 ? new std::byte[2 * block] : nullptr);
  for (int s = 0; s + 1 < n; ++s) {
    const int out = (r - s - 1 + n) % n, in = (r - s - 2 + 2 * n) % n;
    const std::byte* from =
        s == 0 ? cbytes(a.send) + out * block : scratch.get() + ((s - 1) % 2) * block;
    std::byte* to = s + 2 == n ? bytes(a.recv) : scratch.get() + (s % 2) * block;
    std::vector<Task> tasks;
    tasks.push_back(op.send(right, from, a.count));
    tasks.push_back(ring_reduce_recv(op, left, to, cbytes(a.send) + in * block, a.count));
    co_await all_of(std::move(tasks));
  }
  finish_avg(op, bytes(a.recv), a.count);
}

// Small sizes on many ranks: a recursive-doubling all_reduce of the whole input, keeping this
// rank's block: n times the bytes of a direct exchange, but O(log n) peers and rounds.
Task reduce_scatter_rd(Op& op) {
  const auto& a = op.args();
  const int n = op.n();
  const std::size_t e = op.elt();
  std::vector<std::byte> whole(static_cast<std::size_t>(n) * a.count * e);
  OpArgs b = a;
  b.kind = OpKind::all_reduce;
  b.count = static_cast<std::size_t>(n) * a.count;
  b.recv = whole.data();
  Op all(op.comm(), b);
  co_await all_reduce_rd(all);
  if (a.count) std::memcpy(a.recv, whole.data() + op.rank() * a.count * e, a.count * e);
}

}  // namespace coccl::detail::algo
