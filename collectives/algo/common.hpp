// What every host-memory algorithm family (collectives/algo/*.cpp) shares: the per-operation
// helper Op (links, chunked puts, checked waits), segment arithmetic, concurrent tasks, the block
// exchange and the in-order reduction, and each family's entry points for the dispatcher in
// collectives/algorithms.cpp.
#pragma once

#include <algorithm>
#include <boost/asio/awaitable.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "collectives/comm.hpp"
#include "collectives/op_check.hpp"
#include "collectives/reduce_cpu.hpp"

namespace coccl::detail::algo {

using transport::Chunk;
using transport::Connection;
using Task = asio::awaitable<void>;

/// Elements [begin, end) of segment `i` when `count` is split into `n` near-equal segments.
struct Range {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};
inline Range segment(std::size_t count, int n, int i) {
  std::size_t base = count / n, extra = count % n;
  std::size_t b = i * base + std::min<std::size_t>(i, extra);
  return {b, b + base + (static_cast<std::size_t>(i) < extra ? 1 : 0)};
}

inline std::size_t chunks_of(std::size_t elems, std::size_t per_chunk) {
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
  // operation (errc::mismatch) unless it describes the same operation as this rank's. A header
  // joined with data (op_compact_fingerprint, op_joined_fingerprint) keeps its slot: the data is
  // the peer's next chunk, which take() returns and release() gives back.
  Task take_header(Connection* l, int peer) {
    if (!c_.checks().to_take(peer)) co_return;
    Chunk ch = co_await l->wait();
    const OpHeader& mine = c_.checks().sent(peer);
    bool joined = false;
    std::size_t header_bytes = 0;
    const OpHeader theirs =
        header_of(ch.data, ch.size, ch.fingerprint, joined, header_bytes).value_or(OpHeader{});
    if (!joined) l->release();
    std::string why = compare_op_headers(mine, theirs, r_, peer);
    if (!why.empty()) raise(make_error_code(errc::mismatch), why);
    if (joined)
      joined_.push_back(
          {peer, Chunk{ch.data + header_bytes, ch.size - header_bytes, theirs.joined_fingerprint}});
  }

  // Confirms every peer linked in this operation: a rank that only sent to a peer learns here
  // that the peer expected exactly that.
  Task settle() {
    for (int peer : c_.checks().untaken()) co_await take_header(co_await link(peer), peer);
    // Data joined to a header that agrees is data this rank expects, and take() has taken it; a
    // peer that says otherwise breaks the protocol.
    if (!joined_.empty())
      raise(make_error_code(errc::mismatch), "rank " + std::to_string(joined_.front().first) +
                                                 " sent data with its header that this rank's " +
                                                 c_.op_name() + " does not take");
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
    Chunk ch{};
    if (!take_joined(peer, ch)) ch = co_await l->wait();
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
  // Data that came joined to its header (take_header), per peer, until take() returns it.
  std::vector<std::pair<int, Chunk>> joined_;

  bool take_joined(int peer, Chunk& ch) {
    for (auto it = joined_.begin(); it != joined_.end(); ++it)
      if (it->first == peer) {
        ch = it->second;
        joined_.erase(it);
        return true;
      }
    return false;
  }
};

/// Runs tasks concurrently and waits for all; rethrows the first failure. A failing task has
/// already failed the communicator, which closes every link, so the others end promptly.
Task all_of(std::vector<Task> tasks);

inline const std::byte* cbytes(const void* p) { return static_cast<const std::byte*>(p); }
inline std::byte* bytes(void* p) { return static_cast<std::byte*>(p); }

/// Copies the caller's send buffer into its receive buffer when they differ. A zero-count
/// operation may pass null buffers, which memcpy must never see.
void copy_in_place(const OpArgs& a, std::size_t elt);

// `elems` elements at `ptr`, to be sent to or received from `peer` by exchange().
struct Block {
  int peer;
  std::byte* ptr;
  std::size_t elems;
};

// Sends every block of `sends` and receives every block of `recvs`: one block per peer each way,
// a sending and a receiving coroutine, chunk-major over peers so no pair can starve another
// (every rank follows the same order). Blocks large enough for the link's block protocol go
// zero-copy where both buffers are registered (see Connection); the rest goes chunk by chunk.
Task exchange(Op& op, std::vector<Block> sends, std::vector<Block> recvs);

// Reduces chunk `len` elements of every rank into dst, sources in rank order so every rank
// computes bit-identical results. `own` is this rank's contribution; it may alias `dst`.
Task reduce_from_all(Op& op, std::byte* dst, const std::byte* own, std::size_t elems,
                     const std::vector<int>& peers_in_order, ReduceOp rop);

// Recursive doubling's partner of rank `r` (below the largest power of two) in the round of bit
// `m`. In Gray-code order (`gray`; few ranks, see rd_in_gray_order) ranks sit on the hypercube at
// corner r ^ (r >> 1), so ring neighbours are partners too (consecutive Gray codes differ in one
// bit, the last and the first as well) and the check of ring neighbours that every operation makes
// (run_op) rides on the algorithm's own messages. Otherwise the partner is r XOR m, an entry the
// directory of a large communicator keeps (transport/directory.cpp).
inline int rd_partner(int r, int m, bool gray) {
  if (!gray) return r ^ m;
  int corner = (r ^ (r >> 1)) ^ m, rank = 0;
  for (; corner != 0; corner >>= 1) rank ^= corner;
  return rank;
}

// 0, 1, ..., n - 1.
std::vector<int> all_ranks(int n);

// avg reduces as sum and divides at the end (finish_avg).
inline ReduceOp base_op(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

// Divides the `elems` reduced elements at `p` by the rank count when the operation is avg.
void finish_avg(Op& op, std::byte* p, std::size_t elems);

// One reduce-scatter step's receiving side: the `count` elements at `dst` become the chunks taken
// from `left` reduced with the elements at `own` (this rank's input; may be `dst`).
Task ring_reduce_recv(Op& op, int left, std::byte* dst, const std::byte* own, std::size_t count);

// ---- each family's algorithms, chosen by collectives/algorithms.cpp ----------------------------

// all_reduce.cpp
Task all_reduce_oneshot(Op& op);
Task all_reduce_direct(Op& op);
Task all_reduce_ring(Op& op);
Task all_reduce_rd(Op& op);

// gather_scatter.cpp: all_gather and reduce_scatter
Task all_gather_direct(Op& op);
Task all_gather_bruck(Op& op);
Task all_gather_ring(Op& op);
Task reduce_scatter_direct(Op& op);
Task reduce_scatter_ring(Op& op);
Task reduce_scatter_rd(Op& op);

// rooted.cpp: broadcast, reduce, gather and scatter
Task broadcast_chain(Op& op);
Task broadcast_tree(Op& op);
Task reduce_chain(Op& op);
Task reduce_tree(Op& op);
Task gather_direct(Op& op);
Task scatter_direct(Op& op);

// all_to_all.cpp: `sc`/`sd` are the counts and displacements (elements) this rank sends to each
// rank, `rc`/`rd` those it receives from each.
Task all_to_all_direct(Op& op, const std::vector<std::size_t>& sc,
                       const std::vector<std::size_t>& sd, const std::vector<std::size_t>& rc,
                       const std::vector<std::size_t>& rd);
// Bruck's all_to_all of equal blocks: ceil(log2 n) rounds with ranks r + 2^k and r - 2^k.
Task all_to_all_bruck(Op& op);

// p2p.cpp: grouped send/recv (an Op over p2p_as_bytes(args)) and the barrier
OpArgs p2p_as_bytes(const OpArgs& a);
Task send_recv_group(Op& op);
Task barrier_dissemination(Op& op);

}  // namespace coccl::detail::algo
