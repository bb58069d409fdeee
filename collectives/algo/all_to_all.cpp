// all_to_all and all_to_allv: every rank exchanges a block with every other, directly or, for
// small blocks among many ranks, by Bruck's algorithm.
#include "collectives/algo/common.hpp"

namespace coccl::detail::algo {

Task all_to_all_direct(Op& op, const std::vector<std::size_t>& sc,
                       const std::vector<std::size_t>& sd, const std::vector<std::size_t>& rc,
                       const std::vector<std::size_t>& rd) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t e = op.elt();
  if (rc[r]) std::memmove(bytes(a.recv) + rd[r] * e, cbytes(a.send) + sd[r] * e, rc[r] * e);
  std::vector<Block> sends, recvs;
  for (int i = 1; i < n; ++i) {
    int p = (r + i) % n;
    if (sc[p]) sends.push_back({p, const_cast<std::byte*>(cbytes(a.send)) + sd[p] * e, sc[p]});
    int q = (r + n - i) % n;
    if (rc[q]) recvs.push_back({q, bytes(a.recv) + rd[q] * e, rc[q]});
  }
  co_await exchange(op, std::move(sends), std::move(recvs));
}

// Place i of `held` first holds the block for rank r + i. In round k (d = 2^k) the places with
// bit k set go to rank r + d, packed, and the same places come back from rank r - d: a block
// moves by the bits of its distance, lowest first, so at the end place i holds the block rank
// r - i sent to this rank. n/2 blocks a round instead of one message to every peer.
Task all_to_all_bruck(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t block = a.count * op.elt();
  std::vector<int> peers;
  for (int d = 1; d < n; d *= 2) {
    peers.push_back((r + d) % n);
    peers.push_back((r - d + n) % n);
  }
  co_await op.connect(peers);
  // A round moves the places in [1, n) with one bit set: at most n/2 of them.
  const std::size_t round = static_cast<std::size_t>(n / 2) * block;
  std::vector<std::byte> held(static_cast<std::size_t>(n) * block), out(round), in(round);
  // Zero-count operations may pass null buffers, which memcpy must never see.
  auto copy = [block](std::byte* to, const std::byte* from) {
    if (block) std::memcpy(to, from, block);
  };
  for (int i = 0; i < n; ++i) copy(held.data() + i * block, cbytes(a.send) + ((r + i) % n) * block);
  for (int d = 1; d < n; d *= 2) {
    std::size_t moved = 0;
    for (int i = d; i < n; ++i)
      if (i & d) copy(out.data() + moved++ * block, held.data() + i * block);
    std::vector<Task> tasks;
    tasks.push_back(op.send((r + d) % n, out.data(), moved * a.count));
    tasks.push_back(op.recv((r - d + n) % n, in.data(), moved * a.count));
    co_await all_of(std::move(tasks));
    moved = 0;
    for (int i = d; i < n; ++i)
      if (i & d) copy(held.data() + i * block, in.data() + moved++ * block);
  }
  for (int i = 0; i < n; ++i)
    copy(bytes(a.recv) + ((r - i + n) % n) * block, held.data() + i * block);
}

}  // namespace coccl::detail::algo
