#include "collectives/algo/common.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace coccl::detail::algo {

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

void copy_in_place(const OpArgs& a, std::size_t elt) {
  if (a.send != a.recv && a.count != 0) std::memcpy(a.recv, a.send, a.count * elt);
}

namespace {

// Blocks large enough for the link's block protocol go first (zero-copy where both buffers are
// registered, see Connection); what remains is sent chunk by chunk.
Task exchange_send(Op& op, std::vector<Block> sends) {
  const std::size_t k = op.per_chunk(), e = op.elt();
  std::vector<Block> staged;
  std::vector<Connection*> written;
  for (auto& b : sends) {
    Connection* l = co_await op.link(b.peer);
    // Apart, not `a && co_await b`: GCC 12 miscompiles co_await inside && and || operands.
    bool sent = false;
    if (l->uses_blocks(b.elems * e)) sent = co_await op.send_block(l, b.peer, b.ptr, b.elems * e);
    if (sent) {
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

}  // namespace

Task exchange(Op& op, std::vector<Block> sends, std::vector<Block> recvs) {
  for (const auto& b : sends) co_await op.link(b.peer);
  for (const auto& b : recvs) co_await op.link(b.peer);
  std::vector<Task> tasks;
  if (!sends.empty()) tasks.push_back(exchange_send(op, std::move(sends)));
  if (!recvs.empty()) tasks.push_back(exchange_recv(op, std::move(recvs)));
  co_await all_of(std::move(tasks));
}

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

void finish_avg(Op& op, std::byte* p, std::size_t elems) {
  if (op.args().op == ReduceOp::avg) divide_by(p, elems, op.args().type, op.n());
}

Task ring_reduce_recv(Op& op, int left, std::byte* dst, const std::byte* own, std::size_t count) {
  const auto& a = op.args();
  const std::size_t k = op.per_chunk(), e = op.elt();
  for (std::size_t off = 0; off < count; off += k) {
    std::size_t elems = std::min(k, count - off);
    Chunk ch = co_await op.take(left, elems * e);
    reduce2(dst + off * e, own + off * e, ch.data, elems, a.type, base_op(a.op));
    op.release(left);
  }
}

}  // namespace coccl::detail::algo
