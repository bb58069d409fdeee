#include "collectives/algorithms.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>

#include "collectives/comm.hpp"
#include "collectives/op_check.hpp"
#include "collectives/reduce_cpu.hpp"
#include "runtime/log.hpp"

namespace coccl::detail {
namespace {

using transport::Chunk;
using transport::Connection;
using Task = asio::awaitable<void>;

/// Elements [begin, end) of segment `i` when `count` is split into `n` near-equal segments.
struct Range {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};
Range segment(std::size_t count, int n, int i) {
  std::size_t base = count / n, extra = count % n;
  std::size_t b = i * base + std::min<std::size_t>(i, extra);
  return {b, b + base + (static_cast<std::size_t>(i) < extra ? 1 : 0)};
}

std::size_t chunks_of(std::size_t elems, std::size_t per_chunk) {
  return (elems + per_chunk - 1) / per_chunk;
}

/// Per-operation helpers: links, chunked puts and checked waits.
class Op {
 public:
  Op(CommImpl& c, const OpArgs& a)
      : c_(c), a_(a), fp_(c.fingerprint()), elt_(size_of(a.type)), n_(c.size()), r_(c.rank()) {}

  CommImpl& comm() { return c_; }
  int n() const { return n_; }
  int rank() const { return r_; }
  std::size_t elt() const { return elt_; }
  const OpArgs& args() const { return a_; }

  // Elements per chunk: one receive slot, whole elements.
  std::size_t per_chunk() {
    if (!per_chunk_) per_chunk_ = std::max<std::size_t>(1, slot_bytes_ / elt_);
    return per_chunk_;
  }

  // The link to `peer`; the first call of an operation sends the peer this rank's header
  // (op_check.hpp) ahead of any data. Algorithms link their peers before they start concurrent
  // coroutines, so that put never overlaps another on the same link.
  asio::awaitable<Connection*> link(int peer) {
    Connection* l = nullptr;
    try {
      l = co_await c_.peers().get(peer, a_.count * elt_);
      slot_bytes_ = l->slot_bytes();
    } catch (const LinkError&) {
      throw;
    } catch (const std::system_error& e) {
      raise(e.code(), e.what());
    } catch (const boost::system::system_error& e) {
      raise(make_error_code(errc::peer_lost), e.what());
    }
    if (std::optional<OpHeader> h = c_.checks().to_send(peer))
      co_await l->put(&*h, sizeof *h, op_header_fingerprint);
    co_return l;
  }

  // Takes `peer`'s header, once per operation and before any of its data, and fails the
  // operation (errc::mismatch) unless it describes the same operation as this rank's.
  Task take_header(Connection* l, int peer) {
    if (!c_.checks().to_take(peer)) co_return;
    Chunk ch = co_await l->wait();
    const OpHeader& mine = c_.checks().sent(peer);
    OpHeader theirs{};
    if (ch.fingerprint == op_header_fingerprint && ch.size == sizeof theirs)
      std::memcpy(&theirs, ch.data, sizeof theirs);
    l->release();
    std::string why = compare_op_headers(mine, theirs, r_, peer);
    if (!why.empty()) raise(make_error_code(errc::mismatch), why);
  }

  // Confirms every peer linked in this operation: a rank that only sent to a peer learns here
  // that the peer expected exactly that.
  Task settle() {
    for (int peer : c_.checks().untaken()) co_await take_header(co_await link(peer), peer);
  }

  // Resolves every peer link up front so per_chunk() is known before chunking starts.
  Task connect(std::vector<int> peers) {
    for (int p : peers)
      if (p != r_) co_await link(p);
  }
  Task connect_all() {
    for (int p = 0; p < n_; ++p)
      if (p != r_) co_await link(p);
    if (!slot_bytes_) slot_bytes_ = 1 << 20;  // single rank: no links; any chunking works
  }

  [[noreturn]] void raise(std::error_code ec, const std::string& why) {
    c_.fail(ec, why);
    c_.check();
    throw LinkError(ec, why);
  }

  // Waits for the next chunk from `peer` and checks that it belongs to this operation and has
  // the expected size.
  asio::awaitable<Chunk> take(int peer, std::size_t expect_bytes) {
    Connection* l = co_await link(peer);
    co_await take_header(l, peer);
    Chunk ch = co_await l->wait();
    if (ch.fingerprint != fp_ || ch.size != expect_bytes) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "rank %d sent data of another operation (fingerprint %08x, %zu bytes) while "
                    "this rank runs %s #%llu (fingerprint %08x, %zu bytes)",
                    peer, ch.fingerprint, ch.size, c_.op_name(),
                    static_cast<unsigned long long>(c_.seq()), fp_, expect_bytes);
      raise(make_error_code(errc::mismatch), buf);
    }
    co_return ch;
  }

  Task put(int peer, const void* p, std::size_t bytes) {
    Connection* l = co_await link(peer);
    co_await l->put(p, bytes, fp_);
  }

  // The link exists: take() made it.
  void release(int peer) { c_.peers().existing(peer)->release(); }

  // Sends a block (see Connection) of `bytes` from `src` over `l` to `peer`, after checking the
  // receiver's offer against this operation. True if it went zero-copy (flush_blocks() before
  // the operation ends); false: send it as chunks.
  asio::awaitable<bool> send_block(Connection* l, int peer, const std::byte* src,
                                   std::size_t bytes) {
    transport::BlockOffer o = co_await l->next_offer();
    if (o.fingerprint != fp_ || o.size != bytes) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "rank %d offered to receive %zu bytes of another operation (fingerprint "
                    "%08x) while this rank sends %zu bytes in %s #%llu (fingerprint %08x)",
                    peer, o.size, o.fingerprint, bytes, c_.op_name(),
                    static_cast<unsigned long long>(c_.seq()), fp_);
      raise(make_error_code(errc::mismatch), buf);
    }
    co_return co_await l->write_block(src, bytes);
  }

  std::uint32_t fingerprint() const { return fp_; }

  // Sends `elems` elements in chunks.
  Task send(int peer, const std::byte* p, std::size_t elems) {
    std::size_t k = per_chunk();
    for (std::size_t off = 0; off < elems; off += k)
      co_await put(peer, p + off * elt_, std::min(k, elems - off) * elt_);
  }

  // Receives `elems` elements in chunks and copies them out.
  Task recv(int peer, std::byte* p, std::size_t elems) {
    std::size_t k = per_chunk();
    for (std::size_t off = 0; off < elems; off += k) {
      std::size_t len = std::min(k, elems - off) * elt_;
      Chunk ch = co_await take(peer, len);
      std::memcpy(p + off * elt_, ch.data, len);
      release(peer);
    }
  }

  std::vector<std::byte>& scratch(std::size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_;
  }

 private:
  CommImpl& c_;
  const OpArgs& a_;
  std::uint32_t fp_;
  std::size_t elt_;
  int n_, r_;
  std::size_t slot_bytes_ = 0;
  std::size_t per_chunk_ = 0;
  std::vector<std::byte> scratch_;
};

/// Runs tasks concurrently and waits for all; rethrows the first failure. A failing task has
/// already failed the communicator, which closes every link, so the others end promptly.
Task all_of(std::vector<Task> tasks) {
  if (tasks.empty()) co_return;
  if (tasks.size() == 1) {
    co_await std::move(tasks[0]);
    co_return;
  }
  auto ex = co_await asio::this_coro::executor;
  using Deferred = decltype(asio::co_spawn(ex, std::move(tasks[0]), asio::deferred));
  std::vector<Deferred> ops;
  for (auto& t : tasks) ops.push_back(asio::co_spawn(ex, std::move(t), asio::deferred));
  auto [order, errors] = co_await asio::experimental::make_parallel_group(std::move(ops))
                             .async_wait(asio::experimental::wait_for_all(), asio::use_awaitable);
  (void)order;
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

const std::byte* cbytes(const void* p) { return static_cast<const std::byte*>(p); }
std::byte* bytes(void* p) { return static_cast<std::byte*>(p); }

/// Copies the caller's send buffer into its receive buffer when they differ. A zero-count
/// operation may pass null buffers, which memcpy must never see.
void copy_in_place(const OpArgs& a, std::size_t elt) {
  if (a.send != a.recv && a.count != 0) std::memcpy(a.recv, a.send, a.count * elt);
}

// One block per peer each way; a sending and a receiving coroutine per operation, chunk-major
// over peers so no pair can starve another (every rank follows the same order).
struct Block {
  int peer;
  std::byte* ptr;
  std::size_t elems;
};

// Blocks large enough for the link's block protocol go first (zero-copy where both buffers are
// registered, see Connection); what remains is sent chunk by chunk.
Task exchange_send(Op& op, std::vector<Block> sends) {
  const std::size_t k = op.per_chunk(), e = op.elt();
  std::vector<Block> staged;
  std::vector<Connection*> written;
  for (auto& b : sends) {
    Connection* l = co_await op.link(b.peer);
    if (l->uses_blocks(b.elems * e) && co_await op.send_block(l, b.peer, b.ptr, b.elems * e)) {
      written.push_back(l);
      continue;
    }
    staged.push_back(b);
  }
  std::size_t most = 0;
  for (auto& b : staged) most = std::max(most, chunks_of(b.elems, k));
  for (std::size_t c = 0; c < most; ++c)
    for (auto& b : staged)
      if (c * k < b.elems)
        co_await op.put(b.peer, b.ptr + c * k * e, std::min(k, b.elems - c * k) * e);
  for (Connection* l : written) co_await l->flush_blocks();
}

Task exchange_recv(Op& op, std::vector<Block> recvs) {
  const std::size_t k = op.per_chunk(), e = op.elt();
  // Every block is offered before waiting for any, so no sender waits on another's offer.
  std::vector<std::optional<std::uint64_t>> offers;
  for (auto& b : recvs) {
    Connection* l = co_await op.link(b.peer);
    offers.push_back(l->uses_blocks(b.elems * e)
                         ? std::optional(l->offer(b.ptr, b.elems * e, op.fingerprint()))
                         : std::nullopt);
  }
  std::vector<Block> staged;
  for (std::size_t i = 0; i < recvs.size(); ++i)
    if (!offers[i] || !co_await op.comm().peers().existing(recvs[i].peer)->landed(*offers[i]))
      staged.push_back(recvs[i]);
  std::size_t most = 0;
  for (auto& b : staged) most = std::max(most, chunks_of(b.elems, k));
  for (std::size_t c = 0; c < most; ++c)
    for (auto& b : staged)
      if (c * k < b.elems) {
        std::size_t len = std::min(k, b.elems - c * k) * e;
        Chunk ch = co_await op.take(b.peer, len);
        std::memcpy(b.ptr + c * k * e, ch.data, len);
        op.release(b.peer);
      }
}

Task exchange(Op& op, std::vector<Block> sends, std::vector<Block> recvs) {
  for (const auto& b : sends) co_await op.link(b.peer);
  for (const auto& b : recvs) co_await op.link(b.peer);
  std::vector<Task> tasks;
  if (!sends.empty()) tasks.push_back(exchange_send(op, std::move(sends)));
  if (!recvs.empty()) tasks.push_back(exchange_recv(op, std::move(recvs)));
  co_await all_of(std::move(tasks));
}

// ---- all_reduce -------------------------------------------------------------------------------

// Reduces chunk `len` elements of every rank into dst, sources in rank order so every rank
// computes bit-identical results. `own` is this rank's contribution; it may alias `dst`.
Task reduce_from_all(Op& op, std::byte* dst, const std::byte* own, std::size_t elems,
                     const std::vector<int>& peers_in_order, ReduceOp rop) {
  std::size_t len = elems * op.elt();
  std::vector<const void*> srcs(op.n());
  // reduce_n allows dst to alias only the first source; copy our part aside when it would alias
  // another one.
  if (own == dst && op.rank() != 0) {
    auto& tmp = op.scratch(len);
    std::memcpy(tmp.data(), own, len);
    own = tmp.data();
  }
  for (int p : peers_in_order) {
    if (p == op.rank()) {
      srcs[p] = own;
      continue;
    }
    Chunk ch = co_await op.take(p, len);
    srcs[p] = ch.data;
  }
  reduce_n(dst, srcs.data(), op.n(), elems, op.args().type, rop);
  for (int p : peers_in_order)
    if (p != op.rank()) op.release(p);
}

std::vector<int> all_ranks(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

ReduceOp base_op(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

void finish_avg(Op& op, std::byte* p, std::size_t elems) {
  if (op.args().op == ReduceOp::avg) divide_by(p, elems, op.args().type, op.n());
}

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

// One reduce-scatter step's receiving side: reduce into elements `in` of `base`.
Task ring_reduce_recv(Op& op, int left, std::byte* base, Range in) {
  const auto& a = op.args();
  const std::size_t k = op.per_chunk(), e = op.elt();
  for (std::size_t off = 0; off < in.size(); off += k) {
    std::size_t elems = std::min(k, in.size() - off);
    std::byte* dst = base + (in.begin + off) * e;
    Chunk ch = co_await op.take(left, elems * e);
    reduce2(dst, dst, ch.data, elems, a.type, base_op(a.op));
    op.release(left);
  }
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
  copy_in_place(a, e);
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
    tasks.push_back(op.send(right, cbytes(a.recv) + out.begin * e, out.size()));
    tasks.push_back(ring_reduce_recv(op, left, bytes(a.recv), in));
    co_await all_of(std::move(tasks));
    if (step == n - 2) {
      // This rank now holds the full reduction of segment recv_seg.
      finish_avg(op, bytes(a.recv) + in.begin * e, in.size());
    }
  }
}

// Recursive doubling: log2(n) rounds, each with one peer (rank XOR 2^k). Ranks past the largest
// power of two first fold their data into the rank 2^k below them and get the result back at the
// end. Both partners of a round combine the same two operands (IEEE operations commute), so every
// rank ends with bit-identical results. For small sizes on many ranks: O(log n) peers and rounds.
Task all_reduce_rd(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const std::size_t e = op.elt();
  int pof2 = 1;
  while (pof2 <= n / 2) pof2 *= 2;
  const int rem = n - pof2;
  std::vector<int> peers;
  if (r >= pof2) {
    peers.push_back(r - pof2);
  } else {
    if (r < rem) peers.push_back(r + pof2);
    for (int m = 1; m < pof2; m <<= 1) peers.push_back(r ^ m);
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
      const int p = r ^ m;
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

// ---- rooted and personalised collectives ------------------------------------------------------

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
    const std::byte* src = cbytes(a.send) + off * e;
    if (t.parent >= 0) src = (co_await op.take(t.parent, len)).data;
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
// neighbour's into block r - s - 2; after n - 1 steps it holds the whole sum of block r.
Task reduce_scatter_ring(Op& op) {
  const auto& a = op.args();
  const int n = op.n(), r = op.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const std::size_t e = op.elt();
  std::vector<int> neighbours{right, left};
  co_await op.connect(std::move(neighbours));
  std::vector<std::byte> part(static_cast<std::size_t>(n) * a.count * e);
  if (!part.empty()) std::memcpy(part.data(), a.send, part.size());
  for (int s = 0; s + 1 < n; ++s) {
    const int out = (r - s - 1 + n) % n, in = (r - s - 2 + 2 * n) % n;
    std::vector<Task> tasks;
    tasks.push_back(op.send(right, part.data() + out * a.count * e, a.count));
    tasks.push_back(
        ring_reduce_recv(op, left, part.data(), Range{in * a.count, (in + 1) * a.count}));
    co_await all_of(std::move(tasks));
  }
  if (a.count) std::memcpy(a.recv, part.data() + r * a.count * e, a.count * e);
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

// A peer's transfers in order; blocks (see Connection) zero-copy where possible.
Task p2p_sends(Op& op, int peer, std::vector<const Transfer*> list) {
  Connection* l = co_await op.link(peer);
  bool written = false;
  for (const Transfer* p : list) {
    if (l->uses_blocks(p->count) && co_await op.send_block(l, peer, cbytes(p->buffer), p->count)) {
      written = true;
      continue;
    }
    co_await op.send(peer, cbytes(p->buffer), p->count);
  }
  if (written) co_await l->flush_blocks();
}

Task p2p_recvs(Op& op, int peer, std::vector<const Transfer*> list) {
  Connection* l = co_await op.link(peer);
  // Every block is offered up front (the link sends the offers as its window allows).
  std::vector<std::optional<std::uint64_t>> offers;
  for (const Transfer* p : list)
    offers.push_back(l->uses_blocks(p->count)
                         ? std::optional(l->offer(p->buffer, p->count, op.fingerprint()))
                         : std::nullopt);
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (offers[i] && co_await l->landed(*offers[i])) continue;
    co_await op.recv(peer, bytes(list[i]->buffer), list[i]->count);
  }
}

// Each peer gets one sending and one receiving coroutine that handle its transfers in order, so
// transfers to different peers never wait on each other.
Task send_recv_group(Op& op) {
  const auto& a = op.args();
  std::map<int, std::vector<const Transfer*>> sends, recvs;
  std::vector<const Transfer*> self_sends, self_recvs;
  for (const auto& p : a.p2p) {
    if (p.peer == op.rank())
      (p.is_send ? self_sends : self_recvs).push_back(&p);
    else
      (p.is_send ? sends : recvs)[p.peer].push_back(&p);
  }
  for (std::size_t i = 0; i < self_sends.size(); ++i)
    if (self_sends[i]->count != 0)
      std::memmove(self_recvs[i]->buffer, self_sends[i]->buffer,
                   self_sends[i]->count * size_of(self_sends[i]->type));
  std::vector<Task> tasks;
  for (auto& [peer, list] : sends) tasks.push_back(p2p_sends(op, peer, list));
  for (auto& [peer, list] : recvs) tasks.push_back(p2p_recvs(op, peer, list));
  // Links first (sequentially) so chunk sizes are known; then everything at once.
  for (auto& [peer, list] : sends) co_await op.link(peer);
  for (auto& [peer, list] : recvs) co_await op.link(peer);
  co_await all_of(std::move(tasks));
}

// Dissemination barrier: log2(n) rounds of empty messages.
Task barrier_dissemination(Op& op) {
  const int n = op.n(), r = op.rank();
  for (int d = 1; d < n; d *= 2) {
    co_await op.put((r + d) % n, nullptr, 0);
    co_await op.take((r - d % n + n) % n, 0);
    op.release((r - d % n + n) % n);
  }
}

// Element size differs per p2p transfer: chunking uses the byte-sized view.
OpArgs p2p_as_bytes(const OpArgs& a) {
  OpArgs b = a;
  b.type = DataType::uint8;
  for (auto& p : b.p2p) {
    p.count *= size_of(p.type);
    p.type = DataType::uint8;
  }
  return b;
}

}  // namespace

namespace {

// COCCL_ALGO when it names one of `names`, else null.
const char* forced_among(CommImpl& c, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (c.forced_algo() == name) return name;
  return nullptr;
}

// Whether the communicator is small enough to link every rank with every other.
bool few_ranks(CommImpl& c) { return c.size() <= c.direct_max_ranks(); }

}  // namespace

const char* choose_all_reduce(CommImpl& c, std::size_t bytes) {
  if (const char* f = forced_among(c, {"oneshot", "direct", "ring", "rd"})) return f;
  if (bytes <= c.oneshot_max()) return few_ranks(c) ? "oneshot" : "rd";
  return c.one_host() && few_ranks(c) ? "direct" : "ring";
}

const char* choose_all_gather(CommImpl& c, std::size_t total_bytes) {
  if (const char* f = forced_among(c, {"direct", "ring", "bruck"})) return f;
  if (few_ranks(c)) return "direct";
  return total_bytes <= c.oneshot_max() ? "bruck" : "ring";
}

const char* choose_reduce_scatter(CommImpl& c, std::size_t total_bytes) {
  if (const char* f = forced_among(c, {"direct", "ring", "rd"})) return f;
  if (few_ranks(c)) return "direct";
  return total_bytes <= c.oneshot_max() ? "rd" : "ring";
}

const char* choose_rooted(CommImpl& c) {
  if (const char* f = forced_among(c, {"chain", "tree"})) return f;
  return few_ranks(c) ? "chain" : "tree";
}

namespace {

Task run_algorithm(CommImpl& c, const OpArgs& a) {
  const int n = c.size();
  switch (a.kind) {
    case OpKind::all_reduce: {
      Op op(c, a);
      if (n == 1) {
        copy_in_place(a, op.elt());
        co_return;
      }
      std::string_view algo = choose_all_reduce(c, a.count * op.elt());
      COCCL_TRACE(coll, c.rank(), "all_reduce #%llu %zu x %d: %s",
                  static_cast<unsigned long long>(c.seq()), a.count, static_cast<int>(a.type),
                  algo.data());
      if (algo == "oneshot")
        co_await all_reduce_oneshot(op);
      else if (algo == "direct")
        co_await all_reduce_direct(op);
      else if (algo == "rd")
        co_await all_reduce_rd(op);
      else
        co_await all_reduce_ring(op);
      co_return;
    }
    case OpKind::broadcast: {
      Op op(c, a);
      if (n > 1 && std::string_view(choose_rooted(c)) == "tree")
        co_await broadcast_tree(op);
      else
        co_await broadcast_chain(op);
      co_return;
    }
    case OpKind::reduce: {
      Op op(c, a);
      if (n > 1 && std::string_view(choose_rooted(c)) == "tree")
        co_await reduce_tree(op);
      else
        co_await reduce_chain(op);
      co_return;
    }
    case OpKind::all_gather: {
      Op op(c, a);
      const std::string_view algo = n > 1 ? choose_all_gather(c, n * a.count * op.elt()) : "direct";
      if (algo == "bruck")
        co_await all_gather_bruck(op);
      else if (algo == "ring")
        co_await all_gather_ring(op);
      else
        co_await all_gather_direct(op);
      co_return;
    }
    case OpKind::reduce_scatter: {
      Op op(c, a);
      if (n == 1) {
        if (a.send != a.recv && a.count != 0) std::memmove(a.recv, a.send, a.count * op.elt());
        co_return;
      }
      const std::string_view algo = choose_reduce_scatter(c, n * a.count * op.elt());
      if (algo == "ring")
        co_await reduce_scatter_ring(op);
      else if (algo == "rd")
        co_await reduce_scatter_rd(op);
      else
        co_await reduce_scatter_direct(op);
      co_return;
    }
    case OpKind::all_to_all: {
      Op op(c, a);
      std::vector<std::size_t> counts(n, a.count), displs(n);
      for (int i = 0; i < n; ++i) displs[i] = i * a.count;
      co_await all_to_all_direct(op, counts, displs, counts, displs);
      co_return;
    }
    case OpKind::all_to_allv: {
      Op op(c, a);
      co_await all_to_all_direct(op, a.send_counts, a.send_displs, a.recv_counts, a.recv_displs);
      co_return;
    }
    case OpKind::gather: {
      Op op(c, a);
      co_await gather_direct(op);
      co_return;
    }
    case OpKind::scatter: {
      Op op(c, a);
      co_await scatter_direct(op);
      co_return;
    }
    case OpKind::p2p: {
      OpArgs b = p2p_as_bytes(a);
      Op op(c, b);
      co_await send_recv_group(op);
      co_return;
    }
    case OpKind::barrier: {
      Op op(c, a);
      co_await barrier_dissemination(op);
      co_return;
    }
  }
}

}  // namespace

asio::awaitable<void> run_op(CommImpl& c, const OpArgs& a) {
  // The links this operation gets are not closed (budget, idleness) until it ends.
  transport::Peers::Use use(c.peers());
  Op op(c, a);
  // Every collective checks its ring neighbours whatever its algorithm, so ranks whose views of
  // the operation (root, count, kind) give them different peers still meet one that sees the
  // difference: some neighbouring pair differs. Its failure reaches the others as an abort.
  // all_to_allv checks every pair, zero counts included: a rank expecting nothing from a peer
  // must still hear that the peer sends it nothing.
  if (a.kind == OpKind::all_to_allv) {
    co_await op.connect_all();
  } else if (a.kind != OpKind::p2p && c.size() > 1) {
    std::vector<int> neighbours{(c.rank() + 1) % c.size(), (c.rank() + c.size() - 1) % c.size()};
    co_await op.connect(std::move(neighbours));
  }
  co_await run_algorithm(c, a);
  co_await op.settle();
}

}  // namespace coccl::detail
