#include "collectives/fast_path.hpp"

#include <sched.h>

#include <cstring>
#include <string_view>

#include "collectives/algo/common.hpp"
#include "collectives/algorithms.hpp"
#include "collectives/comm.hpp"
#include "collectives/reduce_cpu.hpp"

namespace coccl::params {

config::Param<std::int64_t> fast_max_bytes{
    "COCCL_FAST_MAX_BYTES", 64 << 10,
    "largest message (bytes a rank sends each peer) of a host all_reduce, all_gather, "
    "reduce_scatter or all_to_all run on the fast path: at once, on the calling thread, when the "
    "communicator is idle and its peers are on shm or tcp links (tcp up to 16 KiB); 0 turns the "
    "fast path off"};

}  // namespace coccl::params

namespace coccl::detail {

namespace {

using transport::Chunk;
using transport::Connection;

const std::byte* cbytes(const void* p) { return static_cast<const std::byte*>(p); }
std::byte* bytes(void* p) { return static_cast<std::byte*>(p); }

// Polls a waiting fast-path operation spins on before it yields between polls (each poll is a
// pause and a look at the peers' rings: some tens of nanoseconds).
constexpr unsigned spin_polls = 256;
// The same where a poll makes system calls (tcp: a read of each socket waited on, a microsecond or
// more each): 256 of those held a core for a millisecond that a peer on the same machine (ranks
// acting as hosts) needed; 4 ranks on 2 cores took 0.5 ms per 8-byte all_reduce.
constexpr unsigned costly_spin_polls = 4;

}  // namespace

FastOp::FastOp(CommImpl& comm) : c_(comm) {}

bool FastOp::prepare(const OpArgs& a, std::chrono::steady_clock::time_point now) {
  const int n = c_.size();
  const std::size_t e = size_of(a.type), block = a.count * e;
  // A zero-count all_to_all sends its headers to the ring neighbours only; the fast path, which
  // sends one to every peer, leaves empty operations to the slow path.
  if (a.count == 0 || block > c_.fast_max_bytes()) return false;
  const std::size_t total = static_cast<std::size_t>(n) * block;
  bool staged = false;
  switch (a.kind) {
    case OpKind::all_reduce:
      if (n > 1) {
        // Recursive doubling between a power of two ranks in Gray-code order only: its rounds
        // then include the check of ring neighbours the slow path makes (run_op), which the
        // rounds that fold in ranks past a power of two, or pairs r XOR 2^k, would miss.
        const std::string_view algo = choose_all_reduce(c_, block);
        if (algo == "rd" && (n & (n - 1)) == 0 && rd_in_gray_order(c_))
          staged = true;
        else if (algo != "oneshot")
          return false;
      }
      break;
    case OpKind::reduce_scatter:
      if (n > 1 && std::string_view(choose_reduce_scatter(c_, total)) != "direct") return false;
      break;
    case OpKind::all_gather:
      if (n > 1 && std::string_view(choose_all_gather(c_, total)) != "direct") return false;
      break;
    case OpKind::all_to_all:
      if (n > 1 && std::string_view(choose_all_to_all(c_, total)) != "direct") return false;
      break;
    default:
      return false;
  }
  spin_limit_ = spin_polls;
  if (n == 1) {
    run_ = &peers_;
    return true;
  }
  // As run_op's Use: the links resolved here stay open until end().
  use_.emplace(c_.peers());
  if (staged) {
    if (rd_.empty()) plan_rd();
    run_ = &rd_;
  } else {
    // An entry is made only for a link that is ready, as far as the links go: a large
    // communicator whose links are made lazily never holds one per rank here. Entry i - 1 is
    // always peer (r + i) mod n (the rank and size do not change), so its rank and checks are
    // set once.
    const int r = c_.rank();
    for (int i = static_cast<int>(peers_.size()) + 1; i < n; ++i) {
      // (r + i) mod n without a division (a tenth of this call).
      const int p = r + i < n ? r + i : r + i - n;
      if (!c_.peers().ready(p, now)) break;
      Peer& made = peers_.emplace_back();
      made.rank = p;
      made.pair = &c_.checks().pair(p);
    }
    run_ = &peers_;
  }
  if ((!staged && peers_.size() + 1 < static_cast<std::size_t>(n)) || !resolve(*run_, block, now)) {
    use_.reset();
    return false;
  }
  return true;
}

bool FastOp::resolve(std::vector<Peer>& entries, std::size_t block,
                     std::chrono::steady_clock::time_point now) {
  for (Peer& peer : entries) {
    Connection* l = c_.peers().ready(peer.rank, now);
    if (!l || !l->pollable() || block > l->poll_bytes()) return false;
    peer.link = l;
    peer.send_bytes = block;
    peer.recv_bytes = block;
    // The header rides with the data, compact (see Connection::try_put_gathered), wherever both
    // fit a put: on tcp every frame is a system call and every slot a credit to return; on shm
    // one publication (with up to 16 bytes of data, one cache line) where header and data apart
    // cost two and more lines (2 ranks, 64 and 512 bytes: 0.29 and 0.31 us apart, 0.22 and 0.25
    // joined). start() confirms it.
    peer.joined = compact_header_bytes + block <= l->poll_bytes();
    if (!l->polls_cheaply()) spin_limit_ = costly_spin_polls;
  }
  return true;
}

void FastOp::plan_rd() {
  const int n = c_.size(), r = c_.rank();
  for (int m = 1; m < n; m <<= 1) {
    Peer& p = rd_.emplace_back();
    p.rank = algo::rd_partner(r, m, true);
    p.pair = &c_.checks().pair(p.rank);
  }
}

OpArgs& FastOp::adopt(OpArgs&& a) noexcept {
  args_ = std::move(a);
  a_ = &args_;
  return args_;
}

void FastOp::start(const OpArgs& a) {
  a_ = &a;
  const int n = c_.size(), r = c_.rank();
  elt_ = size_of(a.type);
  const std::size_t block = a.count * elt_;
  fp_ = c_.fingerprint();
  stuck_ = false;
  at_ = 0;
  reduces_ = a.kind == OpKind::all_reduce || a.kind == OpKind::reduce_scatter;
  for (Peer& p : *run_) {
    // Recorded as sent now, as the slow path's link() would; put by step() or finish().
    p.header = c_.checks().to_send(*p.pair, p.rank);
    p.sent = p.got = 0;
    // Every operation the fast path takes has a compactable header; one that had not would go
    // apart from its data.
    p.joined = p.joined && compactable(*p.header);
    if (p.joined) write_compact_header(*p.header, fp_, p.compact);
    if (staged()) {
      // Recursive doubling works in the receive buffer (the input copied there first): each
      // round sends what it holds and reduces the peer's chunk into it.
      p.src = bytes(a.recv);
      p.dst = nullptr;
      continue;
    }
    switch (a.kind) {
      case OpKind::all_reduce:
        p.src = cbytes(a.send);
        p.dst = nullptr;
        break;
      case OpKind::reduce_scatter:
        p.src = cbytes(a.send) + p.rank * block;
        p.dst = nullptr;
        break;
      case OpKind::all_gather:
        p.src = bytes(a.recv) + r * block;
        p.dst = bytes(a.recv) + p.rank * block;
        break;
      default:  // all_to_all
        p.src = cbytes(a.send) + p.rank * block;
        p.dst = bytes(a.recv) + p.rank * block;
        break;
    }
  }
  if (reduces_ && !staged()) srcs_.resize(static_cast<std::size_t>(n));
  copy_own();
}

void FastOp::deliver(Peer& p, std::byte* data) {
  if (p.dst) {
    std::memcpy(p.dst, data, p.recv_bytes);
    p.link->release();
  } else {
    p.chunk = Chunk{data, p.recv_bytes, fp_};
  }
  p.got = 2;
}

void FastOp::copy_own() {
  const OpArgs& a = *a_;
  const std::size_t block = a.count * elt_;
  const int r = c_.rank();
  switch (a.kind) {
    case OpKind::all_gather:
    case OpKind::all_to_all: {
      // This rank's own block goes into place first; all_gather sends it from there.
      std::byte* mine = bytes(a.recv) + r * block;
      const std::byte* from = cbytes(a.send) + (a.kind == OpKind::all_to_all ? r * block : 0);
      if (from != mine) std::memmove(mine, from, block);
      break;
    }
    case OpKind::all_reduce:
      if (staged() && a.send != a.recv) std::memcpy(a.recv, a.send, block);
      break;
    default:
      break;
  }
}

bool FastOp::poll(Peer& p) {
  // A link that failed, or that only its reader can serve now (tcp), hands the operation over.
  if (!p.link->pollable()) {
    stuck_ = true;
    return false;
  }
  if (p.sent == 0) {
    if (p.joined) {
      if (p.link->try_put_gathered(p.compact, sizeof p.compact, p.src, p.send_bytes,
                                   op_compact_fingerprint))
        p.sent = 2;
    } else if (p.link->try_put(p.header, sizeof *p.header, op_header_fingerprint)) {
      p.sent = 1;
    }
  }
  if (p.sent == 1 && p.link->try_put(p.src, p.send_bytes, fp_)) p.sent = 2;
  if (p.got == 0) {
    if (std::optional<Chunk> ch = p.link->peek()) {
      // The peer's header, alone or joined with its data (whichever path it took). One that
      // disagrees, or data of another operation, stays in the ring: finish() takes it and fails
      // the operation with the full description. The common case, the compact header this
      // rank sent the peer come back but for its op_seq, is compared as bytes.
      bool joined = false;
      std::size_t header_bytes = 0;
      if (p.joined && ch->fingerprint == op_compact_fingerprint &&
          ch->size == compact_header_bytes + p.recv_bytes &&
          compact_header_agrees(p.compact, ch->data)) {
        joined = true;
        header_bytes = compact_header_bytes;
      } else {
        const std::optional<OpHeader> theirs =
            header_of(ch->data, ch->size, ch->fingerprint, joined, header_bytes);
        if (!theirs || !op_headers_agree(*p.header, *theirs) ||
            (joined &&
             (ch->size != header_bytes + p.recv_bytes || theirs->joined_fingerprint != fp_))) {
          stuck_ = true;
          return false;
        }
      }
      OpChecks::to_take(*p.pair);
      p.link->take_peeked();
      if (joined) {
        deliver(p, ch->data + header_bytes);
      } else {
        p.link->release();
        p.got = 1;
      }
    }
  }
  if (p.got == 1) {
    if (std::optional<Chunk> ch = p.link->peek()) {
      if (ch->fingerprint != fp_ || ch->size != p.recv_bytes) {
        stuck_ = true;
        return false;
      }
      p.link->take_peeked();
      deliver(p, ch->data);
    }
  }
  return true;
}

bool FastOp::step() {
  if (staged()) {
    // One round at a time: a round sends what the last one left in the buffer.
    for (; at_ < rd_.size(); ++at_) {
      Peer& p = rd_[at_];
      if (!poll(p) || p.sent != 2 || p.got != 2) return false;
      reduce_round(p);
    }
    combine();
    return true;
  }
  bool complete = true;
  for (Peer& p : peers_) {
    if (!poll(p)) return false;
    complete = complete && p.sent == 2 && p.got == 2;
  }
  if (!complete) return false;
  combine();
  return true;
}

void FastOp::reduce_round(Peer& p) {
  const OpArgs& a = *a_;
  std::byte* buf = bytes(a.recv);
  // Both partners combine the same two operands in the same order (the lower rank's first), so
  // every rank ends with the same bits, as on the slow path.
  if (c_.rank() < p.rank)
    reduce2(buf, buf, p.chunk.data, a.count, a.type, algo::base_op(a.op));
  else
    reduce2(buf, p.chunk.data, buf, a.count, a.type, algo::base_op(a.op));
  p.link->release();
}

void FastOp::combine() {
  if (!reduces_) return;
  const OpArgs& a = *a_;
  const int n = c_.size(), r = c_.rank();
  if (staged()) {
    // The rounds reduced into the receive buffer as they went.
    if (a.op == ReduceOp::avg) divide_by(a.recv, a.count, a.type, n);
    return;
  }
  const std::size_t block = a.count * elt_;
  const std::byte* own = cbytes(a.send) + (a.kind == OpKind::reduce_scatter ? r * block : 0);
  std::byte* dst = bytes(a.recv);
  if (n == 1) {
    if (own != dst) std::memmove(dst, own, block);
    return;
  }
  // reduce_n lets the result alias the first source only.
  if (own == dst && r != 0) {
    own_copy_.assign(own, own + block);
    own = own_copy_.data();
  }
  srcs_[static_cast<std::size_t>(r)] = own;
  for (const Peer& p : peers_) srcs_[static_cast<std::size_t>(p.rank)] = p.chunk.data;
  reduce_n(dst, srcs_.data(), n, a.count, a.type, algo::base_op(a.op));
  for (const Peer& p : peers_) p.link->release();
  if (a.op == ReduceOp::avg) divide_by(dst, a.count, a.type, n);
}

bool FastOp::run_for(std::chrono::nanoseconds budget, const runtime::ProxyThread& thread,
                     bool yield) {
  const bool done = spin(budget, thread, yield);
  // What the links held back (tcp: the last credits, or frames of an operation handed over)
  // leaves now.
  for (Peer& p : *run_) p.link->flush();
  return done;
}

bool FastOp::spin(std::chrono::nanoseconds budget, const runtime::ProxyThread& thread, bool yield) {
  waited_since_.reset();
  if (step()) return true;
  if (stuck_) return false;
  // Waiting for the peers: the read of their rings' tails, a cache miss (they write them on
  // every release), is taken here rather than by a later try_put on the critical path.
  for (Peer& p : *run_) p.link->learn_credit();
  // The clock is read first once the wait has lasted some polls (its start in the trace, and the
  // spin's budget), and then only now and then: a read costs as much as a few polls (read at the
  // start of every wait, it was 5% of a 2-rank 8-byte all_reduce, most of whose waits end within
  // a few polls), a yield far more.
  std::chrono::steady_clock::time_point until{};
  for (unsigned i = 1;; ++i) {
    // With a core per rank the spin yields too once it has lasted (some microseconds; a peer's
    // operation takes well under one): a peer that another thread pushed off its core (a proxy
    // thread back from its nap, another process) waits on a run queue, and a spin that never
    // yields can keep it there for a whole time slice. Without this, 2 ranks on 2 cores ran an
    // 8-byte blocking all_reduce at 0.3 us in some runs and at 2 to 47 us in others.
    const bool yielding = yield || i > spin_limit_;
    if (yielding)
      ::sched_yield();
    else
      runtime::cpu_relax();
    if (step()) return true;
    if (stuck_) return false;
    if ((i & 7) != 0) continue;
    if (thread.wanted()) return false;
    if (!waited_since_) {
      waited_since_ = std::chrono::steady_clock::now();
      until = *waited_since_ + budget;
      continue;
    }
    if ((i & ((yielding ? 8 : 1024) - 1)) != 0) continue;
    if (std::chrono::steady_clock::now() >= until) return false;
  }
}

boost::asio::awaitable<void> FastOp::finish() {
  algo::Op op(c_, *a_);
  // One round with every peer (every send, then every take), or recursive doubling's rounds from
  // the one under way.
  std::vector<Peer>& entries = *run_;
  const std::size_t rounds = staged() ? entries.size() : 1;
  for (; at_ < rounds; ++at_) {
    const std::size_t first = staged() ? at_ : 0, last = staged() ? at_ + 1 : entries.size();
    for (std::size_t i = first; i < last; ++i) {
      Peer& p = entries[i];
      // The header was recorded as sent by start(): link() sends nothing more.
      Connection* l = co_await op.link(p.rank);
      if (p.sent == 0) {
        co_await l->put(p.header, sizeof *p.header, op_header_fingerprint);
        p.sent = 1;
      }
      if (p.sent == 1) {
        co_await l->put(p.src, p.send_bytes, fp_);
        p.sent = 2;
      }
    }
    for (std::size_t i = first; i < last; ++i) {
      Peer& p = entries[i];
      if (p.got == 2) continue;
      // Takes the header first if step() has not.
      Chunk ch = co_await op.take(p.rank, p.recv_bytes);
      deliver(p, ch.data);
    }
    if (staged()) reduce_round(entries[at_]);
  }
  combine();
  co_await op.settle();
}

void FastOp::end() noexcept {
  use_.reset();
  if (a_ == &args_) args_ = OpArgs{};
  a_ = nullptr;
}

}  // namespace coccl::detail
