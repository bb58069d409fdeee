// all_to_all and all_to_allv: every rank exchanges a block with every other.
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

}  // namespace coccl::detail::algo
