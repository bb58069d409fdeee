// Rooted collectives: broadcast and reduce (chain or binary tree), gather and scatter.
#include "collectives/algo/common.hpp"

namespace coccl::detail::algo {

namespace {

// The binary tree of a rooted collective, ranks numbered from the root: v's children are 2v + 1
// and 2v + 2, so a rank has at most three links and the tree is log2(n) deep.
struct TreeNode {
  int parent = -1;
  std::vector<int> children;
};
TreeNode tree_node(int n, int r, int root) {
  TreeNode t;
  const int v = (r - root + n) % n;
  if (v > 0) t.parent = ((v - 1) / 2 + root) % n;
  for (int c : {2 * v + 1, 2 * v + 2})
    if (c < n) t.children.push_back((c + root) % n);
  return t;
}

}  // namespace

// Pipelined binary tree from the root: each rank forwards every chunk to its children as it
// arrives. For many ranks, where a chain is n hops deep.
Task broadcast_tree(Op& op) {
  const auto& a = op.args();
  const TreeNode t = tree_node(op.n(), op.rank(), a.root);
  const std::size_t e = op.elt();
  std::vector<int> peers = t.children;
  if (t.parent >= 0) peers.push_back(t.parent);
  co_await op.connect(peers);
  const std::size_t k = op.per_chunk();
  for (std::size_t off = 0; off < a.count; off += k) {
    const std::size_t len = std::min(k, a.count - off) * e;
    std::byte* dst = bytes(a.recv) + off * e;
    // Only the root reads the send buffer: elsewhere it may be null (as NCCL allows), and an
    // offset from null is undefined.
    const std::byte* src = nullptr;
    if (t.parent >= 0) {
      src = (co_await op.take(t.parent, len)).data;
    } else {
      src = cbytes(a.send) + off * e;
    }
    for (int c : t.children) co_await op.put(c, src, len);
    if (src != dst) std::memcpy(dst, src, len);
    if (t.parent >= 0) op.release(t.parent);
  }
}

// Pipelined binary tree toward the root: each rank combines its part with its children's partial
// results (in child order) and passes the result up.
Task reduce_tree(Op& op) {
  const auto& a = op.args();
  const TreeNode t = tree_node(op.n(), op.rank(), a.root);
  const std::size_t e = op.elt();
  std::vector<int> peers = t.children;
  if (t.parent >= 0) peers.push_back(t.parent);
  co_await op.connect(peers);
  const std::size_t k = op.per_chunk();
  auto& tmp = op.scratch(k * e);
  for (std::size_t off = 0; off < a.count; off += k) {
    const std::size_t elems = std::min(k, a.count - off), len = elems * e;
    const std::byte* part = cbytes(a.send) + off * e;
    for (int c : t.children) {
      Chunk ch = co_await op.take(c, len);
      reduce2(tmp.data(), part, ch.data, elems, a.type, base_op(a.op));
      op.release(c);
      part = tmp.data();
    }
    if (t.parent >= 0) {
      co_await op.put(t.parent, part, len);
      continue;
    }
    std::byte* dst = bytes(a.recv) + off * e;
    if (part != dst) std::memcpy(dst, part, len);
    finish_avg(op, dst, elems);
  }
}

// Pipelined chain from the root: each rank forwards every chunk to the next as it arrives.
Task broadcast_chain(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const int pos = (r - a.root + n) % n;
  const int next = pos + 1 < n ? (r + 1) % n : -1;
  const int prev = pos > 0 ? (r + n - 1) % n : -1;
  const std::size_t e = op.elt();
  if (next >= 0) co_await op.link(next);
  if (prev >= 0) co_await op.link(prev);
  if (n == 1 || (next < 0 && prev < 0)) {
    copy_in_place(a, e);
    co_return;
  }
  const std::size_t k = op.per_chunk();
  for (std::size_t off = 0; off < a.count; off += k) {
    std::size_t len = std::min(k, a.count - off) * e;
    std::byte* dst = bytes(a.recv) + off * e;
    if (prev < 0) {
      co_await op.put(next, cbytes(a.send) + off * e, len);
      if (a.send != a.recv) std::memcpy(dst, cbytes(a.send) + off * e, len);
      continue;
    }
    Chunk ch = co_await op.take(prev, len);
    if (next >= 0) co_await op.put(next, ch.data, len);
    std::memcpy(dst, ch.data, len);
    op.release(prev);
  }
}

// Pipelined chain toward the root: the farthest rank starts, each rank combines its part and
// passes the partial result on.
Task reduce_chain(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const int pos = (r - a.root + n) % n;
  const int toward_root = pos > 0 ? (r + n - 1) % n : -1;
  const int from_far = pos + 1 < n ? (r + 1) % n : -1;
  const std::size_t e = op.elt();
  if (toward_root >= 0) co_await op.link(toward_root);
  if (from_far >= 0) co_await op.link(from_far);
  if (n == 1) {
    copy_in_place(a, e);
    finish_avg(op, bytes(a.recv), a.count);
    co_return;
  }
  const std::size_t k = op.per_chunk();
  auto& tmp = op.scratch(k * e);
  for (std::size_t off = 0; off < a.count; off += k) {
    std::size_t elems = std::min(k, a.count - off), len = elems * e;
    const std::byte* own = cbytes(a.send) + off * e;
    if (from_far < 0) {
      co_await op.put(toward_root, own, len);
      continue;
    }
    Chunk ch = co_await op.take(from_far, len);
    if (toward_root >= 0) {
      reduce2(tmp.data(), own, ch.data, elems, a.type, base_op(a.op));
      op.release(from_far);
      co_await op.put(toward_root, tmp.data(), len);
    } else {
      std::byte* dst = bytes(a.recv) + off * e;
      reduce2(dst, own, ch.data, elems, a.type, base_op(a.op));
      op.release(from_far);
      finish_avg(op, dst, elems);
    }
  }
}

Task gather_direct(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t e = op.elt();
  std::vector<Block> sends, recvs;
  if (r == a.root) {
    std::byte* mine = bytes(a.recv) + r * a.count * e;
    if (a.count != 0 && cbytes(a.send) != mine) std::memmove(mine, a.send, a.count * e);
    for (int p = 0; p < n; ++p)
      if (p != r) recvs.push_back({p, bytes(a.recv) + p * a.count * e, a.count});
  } else {
    sends.push_back({a.root, const_cast<std::byte*>(cbytes(a.send)), a.count});
  }
  co_await exchange(op, std::move(sends), std::move(recvs));
}

Task scatter_direct(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t e = op.elt();
  std::vector<Block> sends, recvs;
  if (r == a.root) {
    const std::byte* mine = cbytes(a.send) + r * a.count * e;
    if (a.count != 0 && mine != a.recv) std::memmove(a.recv, mine, a.count * e);
    for (int p = 0; p < n; ++p)
      if (p != r)
        sends.push_back({p, const_cast<std::byte*>(cbytes(a.send)) + p * a.count * e, a.count});
  } else {
    recvs.push_back({a.root, bytes(a.recv), a.count});
  }
  co_await exchange(op, std::move(sends), std::move(recvs));
}

}  // namespace coccl::detail::algo
