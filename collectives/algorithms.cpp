// Chooses and starts each operation's algorithm; the algorithms live by family in
// collectives/algo/.
#include "collectives/algorithms.hpp"

#include <string_view>

#include "collectives/algo/common.hpp"
#include "runtime/log.hpp"

namespace coccl::detail {
namespace {

// COCCL_ALGO when it names one of `names`, else null.
const char* forced_among(CommImpl& c, std::initializer_list<const char*> names) {
  if (c.forced_algo().empty()) return nullptr;
  for (const char* name : names)
    if (c.forced_algo() == name) return name;
  return nullptr;
}

// Whether the communicator is small enough to link every rank with every other.
bool few_ranks(CommImpl& c) { return c.size() <= c.direct_max_ranks(); }

}  // namespace

const char* choose_all_reduce(CommImpl& c, std::size_t bytes) {
  if (const char* f = forced_among(c, {"oneshot", "direct", "ring", "rd"})) return f;
  // Small: one round with every peer, except over the network between a power of two ranks (4
  // and more), where recursive doubling's log2(n) messages a rank spare the kernel its work per
  // message, most of a small operation's time over tcp (4 ranks: 3 sends and receives a rank
  // with one round, 2 with recursive doubling). Its pairs then include the ring neighbours (Gray
  // order, algo::rd_partner), which other rank counts would have to message besides.
  if (bytes <= c.oneshot_max()) {
    const int n = c.size();
    if (!few_ranks(c)) return "rd";
    return !c.one_host() && n >= 4 && (n & (n - 1)) == 0 ? "rd" : "oneshot";
  }
  return c.one_host() && few_ranks(c) ? "direct" : "ring";
}

bool rd_in_gray_order(CommImpl& c) { return few_ranks(c); }

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

const char* choose_all_to_all(CommImpl& c, std::size_t total_bytes) {
  if (const char* f = forced_among(c, {"direct", "bruck"})) return f;
  return !few_ranks(c) && total_bytes <= c.oneshot_max() ? "bruck" : "direct";
}

const char* choose_rooted(CommImpl& c) {
  if (const char* f = forced_among(c, {"chain", "tree"})) return f;
  return few_ranks(c) ? "chain" : "tree";
}

namespace {

using namespace algo;

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
      if (n > 1 && std::string_view(choose_all_to_all(c, n * a.count * op.elt())) == "bruck") {
        co_await all_to_all_bruck(op);
        co_return;
      }
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
