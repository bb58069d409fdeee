// Grouped send/recv and the barrier.
#include "collectives/algo/common.hpp"

namespace coccl::detail::algo {

namespace {

// A peer's transfers in order; blocks (see Connection) zero-copy where possible.
Task p2p_sends(Op& op, int peer, std::vector<const Transfer*> list) {
  Connection* l = co_await op.link(peer);
  bool written = false;
  for (const Transfer* p : list) {
    // Apart, not `a && co_await b`: GCC 12 miscompiles co_await inside && and || operands.
    bool sent = false;
    if (l->uses_blocks(p->count))
      sent = co_await op.send_block(l, peer, cbytes(p->buffer), p->count);
    if (sent) {
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
    bool landed = false;
    if (offers[i]) landed = co_await l->landed(*offers[i]);
    if (landed) continue;
    co_await op.recv(peer, bytes(list[i]->buffer), list[i]->count);
  }
}

}  // namespace

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

}  // namespace coccl::detail::algo
