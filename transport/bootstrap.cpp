#include "transport/bootstrap.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/error.hpp>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "runtime/log.hpp"
#include "transport/admission.hpp"
#include "transport/directory.hpp"
#include "transport/hmac.hpp"
#include "transport/host_leader.hpp"
#include "transport/peers.hpp"
#include "transport/tcp.hpp"

namespace coccl::params {

config::Param<std::string> hostid{
    "COCCL_HOSTID", "",
    "host identity: ranks with equal values are on one host (empty: the host name and boot id), "
    "so one machine can act as several hosts and take the network path between its ranks",
    "NCCL_HOSTID"};

}  // namespace coccl::params

namespace coccl::transport {

namespace {

constexpr std::uint32_t id_magic = 0x31444343u;  // "CCD1"
// A status answer holding a record per rank of the root's share (the first format, "CWVR", had
// one per rank of the communicator).
constexpr std::uint32_t root_view_magic = 0x32565743;  // "CWV2"

// A connection that carried hellos: a rank's own, or its host's leader's. The root sends the
// entries its ranks keep back on it once the communicator forms. Frames go out one at a time
// (the first rank's connection also carries what the root relays to the other roots).
struct Carrier {
  Carrier(std::shared_ptr<Stream> s, Channel c) : sock(std::move(s)), channel(std::move(c)) {}
  std::shared_ptr<Stream> sock;
  Channel channel;
  std::vector<int> ranks;  // the hellos it carried that counted
  std::deque<std::pair<FrameType, std::vector<std::uint8_t>>> outbox;
  bool writing = false;
};

struct Root : std::enable_shared_from_this<Root> {
  Root(asio::any_io_executor ex, const Secret& s)
      : acceptor(ex), secret(s), deadline(ex), retry(ex), drops(-1, "bootstrap root") {}
  Acceptor acceptor;
  Secret secret;
  asio::steady_timer deadline;
  asio::steady_timer retry;  // pause after an accept error
  Admission admission;
  DropLog drops;
  int nranks = -1;
  // Several roots (ncclCommInitRankScalable): this is root `index` of `roots`, serving the hellos
  // of ranks [first, last). `ids` is the digest of the id list that every hello and share must
  // carry.
  int roots = 1;
  int index = 0;
  int first = 0, last = 0;
  std::uint64_t ids = 0;
  bool full = false;  // every rank keeps every entry (COCCL_DIRECTORY_FULL)
  int arrived = 0;
  bool complete = false;    // every rank of the share arrived
  bool formed = false;      // ...and every other root's: the tables went out
  bool expired = false;     // COCCL_TIMEOUT passed first: no more hellos, status queries only
  bool rank0_lost = false;  // formed, but the share's first rank did not take its table
  bool rank0_left = false;  // it took the table, then its connection ended without a goodbye
  std::map<int, std::string> failures;  // ranks whose set-up failed, and why (their notices)
  bool done = false;                    // serving nothing more
  // What the root holds is sized by its share, not by the communicator, so that many roots of a
  // large communicator each hold O(N/roots log N). Per rank of the share [first, last), at
  // rank - first: its entry (listener, and the ranks on its host once the share is complete),
  // whether its hello came, and whose connection carried it. Every access by a rank that came on
  // the wire checks in_share first.
  std::vector<DirectoryEntry> own;
  std::vector<bool> seen;
  std::vector<std::int32_t> via;
  // The entries of other shares that this share's ranks keep (every other rank when full),
  // sorted by rank; each root's part is filled by its share (root_take_share). `awaiting`: the
  // roots whose part has not come yet.
  std::vector<DirectoryEntry> foreign;
  std::set<int> awaiting;
  // The roots' barrier (Share): tokens received per round, rounds sent, and the aggregate of
  // the shares heard from (this one included once complete).
  std::vector<bool> tokens;
  int rounds_sent = 0;
  std::uint64_t low_host = ~0ull, high_host = 0;
  std::uint32_t hosts = 0;
  std::vector<std::shared_ptr<Carrier>> carriers;
  // Once formed: every entry this share's ranks keep, for a rank whose leader went (root_reroute).
  DirectoryFrame held;
  // The first rank of this root's share: its hello is direct, it relays what this root sends the
  // other roots, and it holds the connection while its communicator lives.
  std::shared_ptr<Carrier> first_rank;

  // Sets the communicator's shape from its first hello or share.
  void shape(int n, int nroots, int at, std::uint64_t digest) {
    nranks = n;
    roots = nroots;
    index = at;
    ids = digest;
    first = share_begin(at, n, nroots);
    last = share_begin(at + 1, n, nroots);
    full = static_cast<std::int64_t>(n) <= params::directory_full.get();
    own.resize(static_cast<std::size_t>(last - first));
    for (int r = first; r < last; ++r) own[r - first] = {r, PeerInfo{}, 0};
    seen.assign(own.size(), false);
    via.assign(own.size(), -1);
    tokens.assign(barrier_rounds(nroots), false);
    auto keep = [&](int r) {
      if (in_share(r)) return;  // in `own`: each rank keeps itself, so all of the share's are
      foreign.push_back({r, PeerInfo{}, 0});
      awaiting.insert(root_of(r, n, nroots));
    };
    if (full) {
      foreign.reserve(static_cast<std::size_t>(n) - own.size());
      for (int r = 0; r < n; ++r) keep(r);
    } else {
      for (int r : range_needs(first, last, n)) keep(r);
    }
  }

  bool in_share(int rank) const { return rank >= first && rank < last; }

  // The entries of root k's share (k != index) that this share's ranks keep.
  std::span<DirectoryEntry> foreign_of(int k) {
    const int b = share_begin(k, nranks, roots), e = share_begin(k + 1, nranks, roots);
    auto by_rank = [](const DirectoryEntry& d, int r) { return d.rank < r; };
    auto lo = std::lower_bound(foreign.begin(), foreign.end(), b, by_rank);
    auto hi = std::lower_bound(lo, foreign.end(), e, by_rank);
    return {lo, hi};
  }

  void finish() {
    done = true;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    deadline.cancel();
    retry.cancel();
    for (auto& c : carriers) c->sock->close(ignored);
    carriers.clear();
    if (first_rank) first_rank->sock->close(ignored);
  }
};

// Queues a frame on `c` and writes what is queued, in order, unless a write is under way.
asio::awaitable<void> carrier_write_loop(std::shared_ptr<Root> root, std::shared_ptr<Carrier> c) {
  while (!c->outbox.empty()) {
    auto [type, payload] = std::move(c->outbox.front());
    c->outbox.pop_front();
    try {
      runtime::CloseAfter guard(*c->sock, runtime::default_timeout());
      co_await write_frame(*c->sock, c->channel, type, payload);
    } catch (const std::exception& e) {
      COCCL_WARN(boot, -1, "bootstrap root %d: writing to the connection of rank %d failed: %s",
                 root->index, c->ranks.empty() ? -1 : c->ranks.front(), e.what());
      c->outbox.clear();
    }
  }
  c->writing = false;
}

void carrier_send(const std::shared_ptr<Root>& root, const std::shared_ptr<Carrier>& c,
                  FrameType type, std::vector<std::uint8_t> payload) {
  c->outbox.emplace_back(type, std::move(payload));
  if (c->writing) return;
  c->writing = true;
  asio::co_spawn(root->acceptor.get_executor(), carrier_write_loop(root, c), asio::detached);
}

// The root's answer to a status query: how far the rendezvous got and who of its share has
// arrived. Its records cover the share only; failures are few (at most 1024) and go as pairs.
std::vector<std::uint8_t> encode_root_view(const Root& root) {
  Writer w;
  const int n = std::max(root.nranks, 0);
  w.put(root_view_magic).put<std::int32_t>(n).put<std::int32_t>(root.roots);
  w.put<std::int32_t>(root.index).put<std::int32_t>(root.arrived);
  w.put<std::uint8_t>(root.rank0_lost ? 1 : root.rank0_left ? 2 : 0);
  w.put<std::uint8_t>(root.formed ? 1 : 0);
  w.put<std::int32_t>(root.first).put<std::int32_t>(root.last);
  for (std::size_t i = 0; i < root.own.size(); ++i) {
    w.put<std::uint8_t>(root.seen[i] ? 1 : 0);
    w.put(root.own[i].info);
    w.put<std::int32_t>(root.via[i]);
  }
  w.put<std::uint32_t>(static_cast<std::uint32_t>(root.failures.size()));
  for (const auto& [rank, why] : root.failures) {
    w.put<std::int32_t>(rank);
    w.put_bytes({reinterpret_cast<const std::uint8_t*>(why.data()), why.size()});
  }
  // The roots it still waits for: their entries, or a barrier token (once this share is in).
  std::set<int> waiting = root.awaiting;
  if (root.complete && !root.formed)
    for (std::size_t j = 0; j < root.tokens.size(); ++j)
      if (!root.tokens[j])
        waiting.insert(
            static_cast<int>((root.index - (1LL << j) % root.roots + root.roots) % root.roots));
  w.put<std::uint32_t>(static_cast<std::uint32_t>(waiting.size()));
  for (int k : waiting) w.put<std::int32_t>(k);
  return std::move(w.bytes());
}

}  // namespace

RootView decode_root_view(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  if (r.get<std::uint32_t>() != root_view_magic) bad_message("not a root's status answer");
  RootView v;
  v.nranks = r.get<std::int32_t>();
  v.roots = r.get<std::int32_t>();
  v.index = r.get<std::int32_t>();
  v.arrived = r.get<std::int32_t>();
  const auto rank0 = r.get<std::uint8_t>();
  if (rank0 > 2) bad_message("root's status answer has an unknown state of rank 0");
  v.rank0_lost = rank0 == 1;
  v.rank0_left = rank0 == 2;
  const auto formed = r.get<std::uint8_t>();
  if (formed > 1) bad_message("root's status answer has an unknown state");
  v.formed = formed == 1;
  v.first = r.get<std::int32_t>();
  v.last = r.get<std::int32_t>();
  // The share must be root `index`'s of `roots` (so within the communicator), and its records
  // (1 + sizeof(PeerInfo) + 4 bytes each) must fit the payload: checked before anything is
  // allocated for them. With no hello yet the root is shaped as one root of no ranks.
  const std::size_t per_rank = 1 + sizeof(PeerInfo) + sizeof(std::int32_t);
  if (v.nranks < 0 || v.roots < 1 || v.roots > std::max(v.nranks, 1) || v.index < 0 ||
      v.index >= v.roots || v.first != share_begin(v.index, v.nranks, v.roots) ||
      v.last != share_begin(v.index + 1, v.nranks, v.roots) ||
      static_cast<std::size_t>(v.last - v.first) > payload.size() / per_rank || v.arrived < 0 ||
      v.arrived > v.last - v.first)
    bad_message("root's status answer has an impossible size");
  v.records.resize(static_cast<std::size_t>(v.last - v.first));
  int seen = 0;
  for (RootView::Record& rec : v.records) {
    const auto s = r.get<std::uint8_t>();
    if (s > 1) bad_message("root's status answer has an unknown state of a rank");
    rec.seen = s == 1;
    rec.listener = r.get<PeerInfo>();
    rec.via = r.get<std::int32_t>();
    // A hello is carried by a rank of the same share (a leader meets only its root's ranks).
    if (rec.seen ? rec.via < v.first || rec.via >= v.last : rec.via != -1)
      bad_message("root's status answer names a carrier outside its share");
    seen += rec.seen ? 1 : 0;
  }
  if (seen != v.arrived) bad_message("root's status answer counts other ranks than it has seen");
  // Each failure takes at least its rank and its text's length.
  const auto failures = r.get<std::uint32_t>();
  if (failures > payload.size() / (2 * sizeof(std::uint32_t)))
    bad_message("root's status answer names more failures than it holds");
  for (std::uint32_t i = 0; i < failures; ++i) {
    const int rank = r.get<std::int32_t>();
    auto text = r.get_bytes();
    if (rank < 0 || rank >= v.nranks) bad_message("root's status answer names a rank out of range");
    if (!v.failed.emplace(rank, std::string(text.begin(), text.end())).second)
      bad_message("root's status answer names a failed rank twice");
  }
  const auto waiting = r.get<std::uint32_t>();
  if (waiting >= static_cast<std::uint32_t>(v.roots))
    bad_message("root's status answer waits for too many roots");
  for (std::uint32_t i = 0; i < waiting; ++i) {
    const int k = r.get<std::int32_t>();
    if (k < 0 || k >= v.roots || k == v.index || (!v.awaiting.empty() && k <= v.awaiting.back()))
      bad_message("root's status answer names no other root, or one twice");
    v.awaiting.push_back(k);
  }
  if (!r.done()) bad_message("trailing bytes after the root's status answer");
  return v;
}

namespace {

// The share's first rank acknowledges its table; one that died after its hello does not (the
// write of the table may still have succeeded into the socket's buffer).
asio::awaitable<bool> root_table_taken(std::shared_ptr<Root> root) {
  auto c = root->first_rank;
  try {
    runtime::CloseAfter guard(*c->sock, runtime::default_timeout());
    Frame f = co_await read_frame(*c->sock, c->channel, max_small_frame);
    co_return f.type == FrameType::status&& f.payload.empty();
  } catch (const std::exception& e) {
    COCCL_WARN(boot, -1, "bootstrap root %d: rank %d did not take its table: %s", root->index,
               root->first, e.what());
  }
  co_return false;
}

// Ranks that wait for a table that will not come ask who is missing when they give up: the root
// answers for one more COCCL_TIMEOUT, then closes. Each of them gives up COCCL_TIMEOUT after its
// hello, and then takes up to a second to ask: the margin keeps the root up for the last of them.
void root_linger(const std::shared_ptr<Root>& root) {
  root->deadline.expires_after(runtime::default_timeout() + std::chrono::seconds(5));
  root->deadline.async_wait([root](boost::system::error_code e) {
    if (!e) root->finish();
  });
}

// Once formed, the root serves status queries until the share's first rank says goodbye
// (Peers::leave_root); that rank holds its connection for the life of its communicator and writes
// nothing else on it. A connection that ends without the goodbye means the rank is gone.
asio::awaitable<bool> root_hears_goodbye(std::shared_ptr<Root> root) {
  auto c = root->first_rank;
  try {
    Frame f = co_await read_frame(*c->sock, c->channel, max_small_frame);
    co_return f.type == FrameType::close&& f.payload.empty();
  } catch (const std::exception&) {
  }
  co_return false;
}

asio::awaitable<void> root_watch_first_rank(std::shared_ptr<Root> root) {
  const bool goodbye = co_await root_hears_goodbye(root);
  if (goodbye || root->done) {
    root->finish();
    co_return;
  }
  root->rank0_left = true;
  root_linger(root);
}

// Every rank of every share has arrived, and this root holds every entry its ranks keep: each
// connection that carried hellos gets the entries of its ranks.
asio::awaitable<void> root_form(std::shared_ptr<Root> root) {
  root->formed = true;
  root->deadline.cancel();
  DirectoryFrame& held = root->held;
  held.header.nranks = static_cast<std::uint32_t>(root->nranks);
  held.header.full = root->full ? 1 : 0;
  held.header.hosts =
      root->low_host == root->high_host ? 1u : std::max<std::uint32_t>(root->hosts, 2);
  {
    // Every entry the share's ranks keep, in rank order: the other shares' below this one, its
    // own, the others' above. From now on `held` alone has the other shares' entries.
    const std::vector<DirectoryEntry> foreign = std::exchange(root->foreign, {});
    auto above = std::lower_bound(foreign.begin(), foreign.end(), root->first,
                                  [](const DirectoryEntry& d, int r) { return d.rank < r; });
    held.entries.reserve(foreign.size() + root->own.size());
    held.entries.insert(held.entries.end(), foreign.begin(), above);
    held.entries.insert(held.entries.end(), root->own.begin(), root->own.end());
    held.entries.insert(held.entries.end(), above, foreign.end());
  }
  for (const std::shared_ptr<Carrier>& c : std::exchange(root->carriers, {})) {
    std::vector<std::uint8_t> payload;
    try {
      payload = directory_for(held, needs_of(c->ranks, root->nranks));
    } catch (const std::exception& e) {
      COCCL_WARN(boot, -1, "bootstrap root %d: %s", root->index, e.what());
      continue;
    }
    carrier_send(root, c, FrameType::table, std::move(payload));
  }
  const bool taken = co_await root_table_taken(root);
  if (taken) {
    co_await root_watch_first_rank(root);
  } else {
    root->rank0_lost = true;
    root_linger(root);
  }
}

// A share from this root to root `k`, with the communicator's settings and nothing else yet.
Share share_for(const Root& root, int k) {
  Share s;
  s.nranks = root.nranks;
  s.roots = static_cast<std::uint32_t>(root.roots);
  s.from = static_cast<std::uint32_t>(root.index);
  s.to = static_cast<std::uint32_t>(k);
  s.ids = root.ids;
  s.full = root.full ? 1 : 0;
  return s;
}

// Sends the barrier tokens that are due, and forms once every token and entry is in.
void root_advance(const std::shared_ptr<Root>& root) {
  if (!root->complete || root->formed || root->expired || root->done) return;
  const int rounds = static_cast<int>(root->tokens.size());
  while (root->rounds_sent < rounds &&
         (root->rounds_sent == 0 || root->tokens[root->rounds_sent - 1])) {
    Share t = share_for(*root,
                        static_cast<int>((root->index + (1LL << root->rounds_sent)) % root->roots));
    t.round = static_cast<std::uint32_t>(root->rounds_sent);
    t.low_host = root->low_host;
    t.high_host = root->high_host;
    t.hosts = root->hosts;
    carrier_send(root, root->first_rank, FrameType::share, encode_share(t));
    ++root->rounds_sent;
  }
  if (root->rounds_sent < rounds || !root->awaiting.empty()) return;
  for (bool got : root->tokens)
    if (!got) return;
  asio::co_spawn(root->acceptor.get_executor(), root_form(root), asio::detached);
}

// Every rank of this root's share has arrived: count its hosts, send the other roots the entries
// they need (through the share's first rank), and go on with the barrier.
void root_share_complete(const std::shared_ptr<Root>& root) {
  root->complete = true;
  std::unordered_map<std::uint64_t, std::uint32_t> on_host;
  for (const DirectoryEntry& e : root->own) ++on_host[e.info.host_hash];
  for (DirectoryEntry& e : root->own) e.host_ranks = on_host[e.info.host_hash];
  for (const auto& [host, count] : on_host) {
    root->low_host = std::min(root->low_host, host);
    root->high_host = std::max(root->high_host, host);
  }
  root->hosts = std::max(root->hosts, static_cast<std::uint32_t>(on_host.size()));
  if (root->roots > 1) {
    // Which of this share's ranks each other root's ranks keep: by symmetry, those of this
    // share that keep one of that root's ranks.
    std::map<int, std::vector<DirectoryEntry>> out;
    std::vector<int> needs;
    for (const DirectoryEntry& e : root->own) {
      const int r = e.rank;
      if (root->full) {
        for (int k = 0; k < root->roots; ++k)
          if (k != root->index) out[k].push_back(e);
        continue;
      }
      needs.clear();
      directory_needs(r, root->nranks, needs);
      std::sort(needs.begin(), needs.end());
      int last_to = -1;
      for (int y : needs) {
        if (y >= root->first && y < root->last) continue;
        const int k = root_of(y, root->nranks, root->roots);
        if (k == last_to) continue;
        auto& list = out[k];
        if (list.empty() || list.back().rank != r) list.push_back(e);
        last_to = k;
      }
    }
    for (auto& [k, entries] : out) {
      Share s = share_for(*root, k);
      s.entries = std::move(entries);
      carrier_send(root, root->first_rank, FrameType::share, encode_share(s));
    }
  }
  root_advance(root);
}

// Another root's entries, or its barrier token, relayed by the first rank of its share. Answered
// with an empty status frame when taken, else a notice with the reason (the relaying rank fails
// with it).
asio::awaitable<void> root_take_share(std::shared_ptr<Root> root, std::shared_ptr<Stream> sock,
                                      Channel channel, std::vector<std::uint8_t> payload) {
  std::string refusal;
  Share share{};
  try {
    share = decode_share(payload);
  } catch (const std::exception& e) {
    refusal = e.what();
  }
  const int from = static_cast<int>(share.from);
  const std::string whose =
      refusal.empty() ? "root " + std::to_string(from) + " of " + std::to_string(share.roots)
                      : std::string();
  if (refusal.empty()) {
    if (root->done || root->formed || root->expired) {
      refusal = "root " + std::to_string(root->index) +
                " no longer takes shares (the communicator formed, or its COCCL_TIMEOUT passed)";
    } else {
      if (root->nranks < 0)
        root->shape(share.nranks, static_cast<int>(share.roots), static_cast<int>(share.to),
                    share.ids);
      if (static_cast<int>(share.to) != root->index) {
        refusal = whose + " sent root " + std::to_string(share.to) +
                  "'s share to another root (the ids are not in the same order on every rank)";
      } else if (share.nranks != root->nranks || static_cast<int>(share.roots) != root->roots ||
                 share.ids != root->ids) {
        refusal = "the ranks of " + whose +
                  " were given other ids, or another number of ranks, than the ranks that "
                  "reached root " +
                  std::to_string(root->index) + " (" + std::to_string(root->roots) + " ids, " +
                  std::to_string(root->nranks) +
                  " ranks): every rank must pass the same ids in the same order";
      } else if ((share.full != 0) != root->full) {
        refusal = whose + " and root " + std::to_string(root->index) +
                  " disagree on COCCL_DIRECTORY_FULL: set it alike for every process";
      } else if (share.round != Share::no_round) {
        const int j = static_cast<int>(share.round);
        const int expected =
            static_cast<int>((root->index - (1LL << j) % root->roots + root->roots) % root->roots);
        if (from != expected)
          refusal = whose + " sent a barrier token of round " + std::to_string(j) + " out of turn";
        else if (root->tokens[j])
          refusal = "a second barrier token of round " + std::to_string(j) + " from " + whose;
      } else if (!root->awaiting.count(from)) {
        refusal = "entries from " + whose + " that root " + std::to_string(root->index) +
                  " did not wait for";
      } else {
        const std::span<const DirectoryEntry> wanted = root->foreign_of(from);
        bool same = wanted.size() == share.entries.size();
        for (std::size_t i = 0; same && i < wanted.size(); ++i)
          same = share.entries[i].rank == wanted[i].rank;
        if (!same)
          refusal = "entries from " + whose + " are not the ones root " +
                    std::to_string(root->index) + "'s ranks keep";
      }
    }
  }
  if (!refusal.empty()) {
    COCCL_WARN(boot, -1, "bootstrap root: refused a share: %s", refusal.c_str());
    // Recorded under the relaying rank (the sender's first), which fails with it.
    const int relay = whose.empty()
                          ? root->first
                          : share_begin(from, share.nranks, static_cast<int>(share.roots));
    if (root->nranks > 0 && root->failures.size() < 1024)
      root->failures[std::clamp(relay, 0, root->nranks - 1)] = refusal;
  } else if (share.round != Share::no_round) {
    root->tokens[share.round] = true;
    root->low_host = std::min(root->low_host, share.low_host);
    root->high_host = std::max(root->high_host, share.high_host);
    root->hosts = std::max(root->hosts, share.hosts);
  } else {
    // Exactly the entries of `from` that this root waits for, in the same order (checked above).
    std::ranges::copy(share.entries, root->foreign_of(from).begin());
    root->awaiting.erase(from);
  }
  try {
    runtime::CloseAfter guard(*sock, auth_timeout());
    const std::vector<std::uint8_t> answer(refusal.begin(), refusal.end());
    co_await write_frame(*sock, channel, refusal.empty() ? FrameType::status : FrameType::notice,
                         answer);
  } catch (const std::exception& e) {
    COCCL_WARN(boot, -1, "bootstrap root: answering a share failed: %s", e.what());
  }
  if (refusal.empty()) root_advance(root);
}

// Takes one hello: true when it counted. `via`: the rank whose connection carried it; `direct`:
// that connection is the hello's rank's own, not a host leader's. The first rank of this root's
// share relays and holds the root's connection, so its hello must not come through a leader.
bool root_admit(Root& root, const Hello& hello, int via, bool direct) {
  const int rank = hello.rank, nranks = hello.nranks;
  if (nranks <= 0 || rank < 0 || rank >= nranks || hello.roots < 1 ||
      hello.roots > static_cast<std::uint32_t>(nranks) ||
      (root.nranks > 0 && nranks != root.nranks)) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped hello with rank %d of %d (expected size %d)",
               rank, nranks, root.nranks);
    return false;
  }
  const int roots = static_cast<int>(hello.roots);
  const int at = root_of(rank, nranks, roots);
  if (root.nranks < 0) root.shape(nranks, roots, at, hello.ids);
  std::string refusal;
  if (roots != root.roots || hello.ids != root.ids)
    refusal = "rank " + std::to_string(rank) + " was given other ids (" + std::to_string(roots) +
              ") than the ranks that reached this root before it (" + std::to_string(root.roots) +
              "): every rank must pass the same ids in the same "
              "order";
  else if (!root.in_share(rank))
    refusal = "rank " + std::to_string(rank) + " says hello to root " + std::to_string(root.index) +
              ", but its share belongs to root " + std::to_string(at);
  else if (!direct && rank == root.first)
    refusal = "rank " + std::to_string(rank) +
              " holds its root's connection, so it must say hello itself, not through its "
              "host's leader";
  if (!refusal.empty()) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped a hello: %s", refusal.c_str());
    if (root.failures.size() < 1024) root.failures[rank] = refusal;
    return false;
  }
  const int i = rank - root.first;
  if (root.seen[i]) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped a second hello from rank %d", rank);
    return false;
  }
  root.seen[i] = true;
  root.own[i].info = hello.info;
  root.via[i] = via;
  ++root.arrived;
  return true;
}

// A host's leader: its frames of hellos until the share is complete or the leader closes (it
// failed; its host's other ranks then say hello themselves). The connection stays open for the
// tables: the root's life bounds it.
asio::awaitable<void> root_serve_leader(std::shared_ptr<Root> root, std::shared_ptr<Stream> sock,
                                        Channel channel, std::vector<std::uint8_t> payload) {
  std::shared_ptr<Carrier> carrier;
  for (;;) {
    std::vector<Hello> hellos;
    try {
      hellos = decode_hellos(payload);
    } catch (const std::exception& e) {
      if (!root->done) root->drops.dropped(drop_reason(e));
      co_return;
    }
    if (root->done || root->complete || root->expired) co_return;
    if (!carrier) {
      // The leader's own hello comes first on its connection.
      carrier = std::make_shared<Carrier>(sock, std::move(channel));
      root->carriers.push_back(carrier);
    }
    for (const Hello& h : hellos)
      if (root_admit(*root, h, carrier->ranks.empty() ? h.rank : carrier->ranks.front(), false))
        carrier->ranks.push_back(h.rank);
    if (root->arrived == root->last - root->first) {
      root_share_complete(root);
      co_return;
    }
    try {
      Frame f = co_await read_frame(*sock, carrier->channel, max_table_frame);
      if (f.type != FrameType::hellos) bad_message("expected more hellos from a host's leader");
      payload = std::move(f.payload);
    } catch (const std::exception&) {
      // Closed by the leader (it failed), or the link failed.
      co_return;
    }
  }
}

bool same_peer(const PeerInfo& a, const PeerInfo& b) {
  return a.addr == b.addr && a.family == b.family && a.port == b.port &&
         a.host_hash == b.host_hash && a.pid == b.pid;
}

// A rank whose hello a host's leader carried says hello itself: the leader went before it passed
// the rank its table (or the rank gave up waiting for it). The table goes on this connection
// instead, at once when formed. Only the same rank of this share, seen before, with the same
// listener is taken.
void root_reroute(const std::shared_ptr<Root>& root, std::shared_ptr<Stream> sock, Channel channel,
                  const Hello& h) {
  const int r = h.rank;
  const int i = r - root->first;
  const bool same = root->in_share(r) && root->seen[i] && h.nranks == root->nranks &&
                    static_cast<int>(h.roots) == root->roots && h.ids == root->ids &&
                    same_peer(h.info, root->own[i].info);
  if (!same || root->via[i] == r) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped a second hello from rank %d", r);
    return;
  }
  COCCL_INFO(boot, -1, "bootstrap root: rank %d, carried by rank %d, now says hello itself", r,
             root->via[i]);
  root->via[i] = r;
  auto c = std::make_shared<Carrier>(std::move(sock), std::move(channel));
  c->ranks.push_back(r);
  if (!root->formed) {
    root->carriers.push_back(c);
    return;
  }
  try {
    const int one[] = {r};
    carrier_send(root, c, FrameType::table, directory_for(root->held, needs_of(one, root->nranks)));
  } catch (const std::exception& e) {
    COCCL_WARN(boot, -1, "bootstrap root %d: %s", root->index, e.what());
  }
}

// `ticket`: the connection's place among those not yet authenticated (admitted by the accept loop,
// so that it counts before the next accept).
asio::awaitable<void> root_handle(std::shared_ptr<Root> root, std::shared_ptr<Stream> sock,
                                  Admission::Ticket ticket) {
  Hello hello{};
  std::optional<Channel> channel;
  std::vector<std::uint8_t> share;
  std::optional<std::vector<std::uint8_t>> batch;  // a host leader's first frame of hellos
  try {
    runtime::CloseAfter guard(*sock, auth_timeout());
    channel.emplace(co_await Channel::respond(*sock, root->secret));
    ticket.answered();
    Frame f = co_await read_frame(*sock, *channel, max_table_frame);
    ticket.release();
    if (f.type == FrameType::status_query) {
      if (!f.payload.empty()) bad_message("a status query carries nothing");
      auto view = encode_root_view(*root);
      co_await write_frame(*sock, *channel, FrameType::status, view);
      co_return;
    }
    if (f.type == FrameType::notice) {
      // A rank whose set-up failed says why, for peers that find it gone (Peers::get).
      const int from = notice_sender(f.payload);
      if (root->nranks > 0 && from >= 0 && from < root->nranks && root->failures.size() < 1024)
        root->failures[from] = decode_notice(f.payload);
      co_return;
    }
    if (f.type == FrameType::share) {
      share = std::move(f.payload);
    } else if (f.type == FrameType::hellos) {
      batch = std::move(f.payload);
    } else {
      if (f.type != FrameType::hello || f.payload.size() > max_small_frame)
        bad_message("expected a hello");
      hello = decode_hello(f.payload);
    }
  } catch (const std::exception& e) {
    // Wrong secret, garbage, a replayed frame, or a connection that never spoke (or was evicted
    // by newer ones): drop it, keep serving the rest.
    if (!root->done) root->drops.dropped(drop_reason(e));
    co_return;
  }
  if (!share.empty()) {
    co_await root_take_share(root, sock, std::move(*channel), std::move(share));
    co_return;
  }
  if (batch) {
    co_await root_serve_leader(root, sock, std::move(*channel), std::move(*batch));
    co_return;
  }
  if (root->done || root->expired) co_return;
  // The share's arrays are indexed from its first rank: a rank from the wire outside the share
  // goes to root_admit, which refuses it.
  if (root->in_share(hello.rank) && root->seen[hello.rank - root->first]) {
    root_reroute(root, sock, std::move(*channel), hello);
    co_return;
  }
  if (root->complete) co_return;
  if (!root_admit(*root, hello, hello.rank, true)) co_return;
  auto carrier = std::make_shared<Carrier>(sock, std::move(*channel));
  carrier->ranks.push_back(hello.rank);
  root->carriers.push_back(carrier);
  if (hello.rank == root->first) root->first_rank = carrier;
  if (root->arrived == root->last - root->first) root_share_complete(root);
}

asio::awaitable<void> root_accept(std::shared_ptr<Root> root) {
  while (!root->done) {
    boost::system::error_code ec;
    {
      // Beyond COCCL_BOOTSTRAP_PENDING_MAX unauthenticated connections, the next waits in the
      // kernel's backlog (admission.hpp).
      asio::steady_timer room(root->acceptor.get_executor(), asio::steady_timer::time_point::max());
      root->admission.when_room(room.get_executor(), [&room] { room.cancel(); });
      co_await room.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      ec.clear();
    }
    if (root->done) co_return;
    Stream accepted =
        co_await root->acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (root->done) co_return;
    if (!ec) {
      auto sock = std::make_shared<Stream>(std::move(accepted));
      auto ticket = root->admission.admit(sock);
      asio::co_spawn(root->acceptor.get_executor(), root_handle(root, sock, std::move(ticket)),
                     asio::detached);
      continue;
    }
    // An accept error ends nothing: ranks may still be on their way.
    auto delay = accept_retry_delay(ec);
    if (delay.count() == 0) co_return;
    root->drops.dropped("accept failed: " + ec.message());
    // Out of descriptors: a stranger still waiting to authenticate is the one to give up.
    if (out_of_resources(ec)) root->admission.evict_oldest();
    root->retry.expires_after(delay);
    co_await root->retry.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

}  // namespace

asio::ip::tcp::endpoint PeerInfo::endpoint() const {
  if (family == 4) {
    asio::ip::address_v4::bytes_type b;
    std::memcpy(b.data(), addr.data(), 4);
    return {asio::ip::address_v4(b), port};
  }
  asio::ip::address_v6::bytes_type b;
  std::memcpy(b.data(), addr.data(), 16);
  return {asio::ip::address_v6(b), port};
}

PeerInfo PeerInfo::from(const asio::ip::tcp::endpoint& ep) {
  PeerInfo p{};
  if (ep.address().is_v4()) {
    auto b = ep.address().to_v4().to_bytes();
    std::memcpy(p.addr.data(), b.data(), 4);
    p.family = 4;
  } else {
    auto b = ep.address().to_v6().to_bytes();
    std::memcpy(p.addr.data(), b.data(), 16);
    p.family = 6;
  }
  p.port = ep.port();
  p.host_hash = transport::host_hash();
  p.pid = ::getpid();
  return p;
}

RootAddress decode(const UniqueId& id) {
  Reader r(id.bytes);
  if (r.get<std::uint32_t>() != id_magic)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "not a coccl UniqueId (was it created by UniqueId::create?)");
  RootAddress root;
  root.secret = r.get<Secret>();
  PeerInfo p = r.get<PeerInfo>();
  if (is_memory(p)) {
    root.address = memory_address(memory_number(p));
    return root;
  }
  if (p.family != 4 && p.family != 6)
    throw std::system_error(make_error_code(errc::invalid_argument), "corrupt UniqueId");
  root.address = PeerInfo::from(p.endpoint());
  return root;
}

UniqueId encode(const RootAddress& root) {
  Writer w;
  w.put(id_magic).put(root.secret).put(root.address);
  UniqueId id;
  std::memcpy(id.bytes.data(), w.bytes().data(), w.bytes().size());
  return id;
}

std::uint64_t host_hash() {
  static const std::uint64_t h = [] {
    // COCCL_HOSTID names the host outright (its own prefix keeps it apart from any machine's).
    std::string text = params::hostid.get();
    if (!text.empty()) {
      text = "hostid|" + text;
    } else {
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      text = host;
      std::ifstream boot("/proc/sys/kernel/random/boot_id");
      std::string id;
      std::getline(boot, id);
      text += "|" + id;
    }
    auto d = detail::sha256(text.data(), text.size());
    std::uint64_t v;
    std::memcpy(&v, d.data(), sizeof v);
    return v;
  }();
  return h;
}

std::uint64_t ids_digest(const std::vector<RootAddress>& roots) {
  if (roots.size() == 1) return 0;
  Writer w;
  for (const RootAddress& r : roots) w.put(r.secret).put(r.address.addr).put(r.address.port);
  auto d = detail::sha256(w.bytes().data(), w.bytes().size());
  std::uint64_t v;
  std::memcpy(&v, d.data(), sizeof v);
  return v;
}

namespace {
// Serves the rendezvous on the root's listener until it is done or COCCL_TIMEOUT passes.
void serve(std::shared_ptr<Root> root, runtime::ProxyThread& thread);
}  // namespace

asio::ip::tcp::endpoint start_root(runtime::ProxyThread& thread,
                                   const asio::ip::tcp::endpoint& endpoint, const Secret& secret) {
  auto root = std::make_shared<Root>(thread.executor(), secret);
  boost::system::error_code ec;
  root->acceptor.listen(endpoint, true, ec);
  if (ec)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "bootstrap root cannot listen on " + endpoint_text(endpoint) + ": " +
                                ec.message() +
                                (ec == asio::error::address_in_use
                                     ? " (another process, or an earlier job, holds the port)"
                                     : ""));
  serve(root, thread);
  return root->acceptor.local_info().endpoint();
}

PeerInfo start_memory_root(runtime::ProxyThread& thread, const Secret& secret,
                           std::shared_ptr<Traffic> traffic) {
  auto root = std::make_shared<Root>(thread.executor(), secret);
  root->acceptor.listen_memory(std::move(traffic));
  serve(root, thread);
  return root->acceptor.local_info();
}

namespace {

void serve(std::shared_ptr<Root> root, runtime::ProxyThread& thread) {
  // Nobody completed the rendezvous in time: stop serving (ranks fail with their own deadline).
  root->deadline.expires_after(runtime::default_timeout());
  root->deadline.async_wait([root](boost::system::error_code ec) {
    if (ec || root->done || root->formed) return;
    COCCL_WARN(boot, -1, "bootstrap root: %d of %d ranks arrived before COCCL_TIMEOUT",
               root->arrived, root->nranks);
    // The ranks that did arrive give up at about this time and ask who is missing (Peers::
    // rendezvous): keep answering that for one more COCCL_TIMEOUT, then close.
    root->expired = true;
    root->deadline.expires_after(runtime::default_timeout());
    root->deadline.async_wait([root](boost::system::error_code e) {
      if (!e) root->finish();
    });
  });
  asio::co_spawn(thread.executor(), root_accept(root), asio::detached);
}

}  // namespace

asio::awaitable<void> Peers::rendezvous(std::vector<RootAddress> roots) {
  if (roots.empty() || static_cast<int>(roots.size()) > nranks_)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "bootstrap: " + std::to_string(roots.size()) + " ids for " +
                                std::to_string(nranks_) + " ranks (1 to nranks are usable)");
  root_ = roots.front();
  roots_ = roots;
  std::exception_ptr failed;
  std::string why;
  try {
    co_await join(std::move(roots));
  } catch (const std::exception& e) {
    failed = std::current_exception();
    why = e.what();
  }
  if (failed) {
    if (leader_) std::exchange(leader_, nullptr)->stop();
    co_await tell_root(why);
    std::rethrow_exception(failed);
  }
}

void Peers::form(const DirectoryFrame& frame) {
  if (frame.header.nranks != static_cast<std::uint32_t>(nranks_))
    bad_message("a table of " + std::to_string(frame.header.nranks) +
                " ranks for a communicator of " + std::to_string(nranks_));
  directory_.assign(frame, rank_);
  table_formed();
  COCCL_INFO(boot, rank_, "formed from the launcher's table, without a root: %d ranks, %u hosts",
             nranks_, frame.header.hosts);
}

namespace {

// Delivers one of root `from`'s shares to root `to` (whose id this rank holds), authenticated
// with that root's secret. Throws with the root's refusal, or the failure to reach it.
asio::awaitable<void> relay_share(asio::any_io_executor ex, RootAddress to, int to_index, int from,
                                  std::vector<std::uint8_t> payload,
                                  std::chrono::steady_clock::time_point until,
                                  std::shared_ptr<Traffic> traffic) {
  const std::string what = "bootstrap: relaying root " + std::to_string(from) +
                           "'s share to root " + std::to_string(to_index) + " at " +
                           address_text(to.address);
  Frame answer;
  try {
    auto sock = co_await transport::dial(ex, to.address, until, false, traffic);
    runtime::CloseAfter guard(*sock, runtime::time_left(until));
    Channel channel = co_await Channel::initiate(*sock, to.secret);
    co_await write_frame(*sock, channel, FrameType::share, payload);
    answer = co_await read_frame(*sock, channel, max_small_frame);
  } catch (const std::exception& e) {
    throw std::system_error(make_error_code(errc::peer_lost), what + " failed: " + e.what());
  }
  if (answer.type == FrameType::notice)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            what + ": refused: " + printable(answer.payload));
  if (answer.type != FrameType::status || !answer.payload.empty())
    bad_message(what + ": expected the root to take it");
}

// Waits, until `until`, for the coroutines counted in `pending` (the timer is cancelled when the
// count reaches zero).
asio::awaitable<void> wait_for_all(std::shared_ptr<int> pending,
                                   std::shared_ptr<asio::steady_timer> done,
                                   std::chrono::steady_clock::time_point until) {
  if (*pending == 0) co_return;
  done->expires_at(until);
  boost::system::error_code ignored;
  co_await done->async_wait(asio::redirect_error(asio::use_awaitable, ignored));
}

}  // namespace

asio::awaitable<std::pair<std::shared_ptr<Stream>, Channel>> dial_root(
    asio::any_io_executor ex, const RootAddress& root, std::chrono::steady_clock::time_point until,
    std::shared_ptr<Traffic> traffic, int rank) {
  const auto limit = runtime::default_timeout();
  std::shared_ptr<Stream> sock;
  std::optional<Channel> channel;
  // A root that closes the connection before the handshake ends has not seen this rank (it made
  // room for a newer connection, admission.hpp): dial again, until the deadline.
  for (auto pause = std::chrono::milliseconds(10);;
       pause = std::min(2 * pause, std::chrono::milliseconds(500))) {
    sock = co_await transport::dial(ex, root.address, until, false, traffic);
    bool closed = false;
    try {
      runtime::CloseAfter guard(*sock, limit);
      channel.emplace(co_await Channel::initiate(*sock, root.secret));
    } catch (const boost::system::system_error& e) {
      if (std::chrono::steady_clock::now() + pause >= until)
        throw std::system_error(make_error_code(errc::timed_out),
                                "bootstrap: the root at " + address_text(root.address) +
                                    " closed every connection of this rank before its handshake "
                                    "ended, until COCCL_TIMEOUT (last: " +
                                    e.code().message() + ")");
      closed = true;
    }
    if (!closed) break;
    COCCL_INFO(boot, rank,
               "the bootstrap root closed the connection before the handshake "
               "ended; dialling again");
    asio::steady_timer wait(ex, pause);
    boost::system::error_code ignored;
    co_await wait.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
  co_return std::pair<std::shared_ptr<Stream>, Channel>(std::move(sock), std::move(*channel));
}

asio::awaitable<void> Peers::join(std::vector<RootAddress> roots) {
  auto limit = runtime::default_timeout();
  auto until = std::chrono::steady_clock::now() + limit;
  // With several roots each takes the hellos of its share of the ranks; the first rank of a
  // share relays what its root sends the other roots.
  const int nroots = static_cast<int>(roots.size());
  const int at = root_of(rank_, nranks_, nroots);
  const RootAddress root = roots[at];
  const bool first_of_share = rank_ == share_begin(at, nranks_, nroots);
  const Hello h{rank_, nranks_, self_info(), static_cast<std::uint32_t>(nroots), ids_digest(roots)};
  // Ends the wait when this communicator is shut down meanwhile (its link to the table closed).
  auto check_shut = [&] {
    if (shut_)
      throw std::system_error(shut_ec_ ? shut_ec_ : make_error_code(errc::aborted),
                              "bootstrap: ended before the address table came: " + shut_why_);
  };
  // Reads the table on `link`; empty when the connection ends first (or `until` passes).
  auto table_on = [&](std::shared_ptr<Stream> link,
                      Channel& channel) -> asio::awaitable<std::vector<std::uint8_t>> {
    table_link_ = link;
    std::vector<std::uint8_t> got;
    try {
      runtime::CloseAfter guard(*link, runtime::time_left(until));
      Frame f = co_await read_frame(*link, channel, max_table_frame);
      if (f.type != FrameType::table) bad_message("expected the address table");
      got = std::move(f.payload);
    } catch (const boost::system::system_error&) {
    }
    table_link_.reset();
    check_shut();
    co_return got;
  };
  // The first rank of a share holds its connection to the root; the others meet on their host
  // first, and one of them carries all their hellos (and takes back all their entries).
  HostHello met;
  if (!first_of_share && params::host_leaders.get()) {
    met = co_await hello_on_host(ex_, root, h, options_.memory, traffic_, until);
    leader_ = std::move(met.leader);
  }
  std::vector<std::uint8_t> payload;
  if (met.link) {
    // A follower: the table comes from the leader. A leader that goes first (the connection
    // ends) leaves this rank to ask the root itself, below.
    payload = co_await table_on(met.link, *met.channel);
    met.link.reset();
  } else if (leader_) {
    std::string lost;
    try {
      payload = co_await leader_->take_table(until);
    } catch (const std::exception& e) {
      lost = e.what();
    }
    check_shut();
    if (!lost.empty() && std::chrono::steady_clock::now() < until)
      throw std::system_error(make_error_code(errc::peer_lost),
                              "bootstrap: rank " + std::to_string(rank_) +
                                  ", its host's leader, lost its connection to the root before "
                                  "the table came: " +
                                  lost);
  }
  if (payload.empty() && !leader_ && std::chrono::steady_clock::now() < until) {
    // Its own hello: the root sends the table back on this connection (also when a leader
    // carried the hello before and went: the root then takes this connection instead).
    auto [sock, c] = co_await dial_root(ex_, root, until, traffic_, rank_);
    Channel channel = std::move(c);
    {
      const std::vector<std::uint8_t> hello = encode_hello(h);
      runtime::CloseAfter guard(*sock, limit);
      co_await write_frame(*sock, channel, FrameType::hello, hello);
    }
    if (first_of_share) {
      table_link_ = sock;
      payload = co_await relay_until_table(sock, channel, roots, at, until);
      table_link_.reset();
      check_shut();
      if (!payload.empty()) {
        // Tells the root the table arrived (it then serves status queries while this link
        // lasts).
        const std::vector<std::uint8_t> ack;
        co_await write_frame(*sock, channel, FrameType::status, ack);
        root_link_ = sock;
        root_channel_ = std::move(channel);
      }
    } else {
      payload = co_await table_on(sock, channel);
    }
  }
  if (payload.empty()) {
    const std::string why = co_await why_no_table(rank_);
    throw std::system_error(make_error_code(errc::timed_out),
                            "bootstrap: rank " + std::to_string(rank_) +
                                " got no address table within COCCL_TIMEOUT: " + why);
  }
  DirectoryFrame frame = decode_directory(payload, nranks_);
  payload = {};
  directory_.assign(frame, rank_);
  table_formed();
  if (leader_) {
    auto leader = std::exchange(leader_, nullptr);
    co_await leader->pass_tables(frame, nranks_);
    leader->stop();
  }
  COCCL_INFO(boot, rank_, "bootstrap done: %d ranks", nranks_);
}

asio::awaitable<std::vector<std::uint8_t>> Peers::relay_until_table(
    std::shared_ptr<Stream> sock, Channel& channel, const std::vector<RootAddress>& roots, int at,
    std::chrono::steady_clock::time_point until) {
  auto pending = std::make_shared<int>(0);
  auto relayed = std::make_shared<asio::steady_timer>(ex_, asio::steady_timer::time_point::max());
  auto failure = std::make_shared<std::exception_ptr>();
  std::vector<std::uint8_t> table;
  const int nroots = static_cast<int>(roots.size());
  std::size_t asked = 0;
  try {
    runtime::CloseAfter guard(*sock, runtime::time_left(until));
    for (;;) {
      Frame f = co_await read_frame(*sock, channel, max_table_frame);
      if (f.type == FrameType::table) {
        table = std::move(f.payload);
        break;
      }
      if (f.type != FrameType::share) bad_message("expected the address table from the root");
      const Share s = decode_share(f.payload);
      if (static_cast<int>(s.from) != at || s.roots != roots.size())
        bad_message("root " + std::to_string(at) + " asked to relay a share not its own");
      // A root sends each other root its entries at most once, and one token a round.
      if (++asked > roots.size() + static_cast<std::size_t>(barrier_rounds(nroots)))
        bad_message("root " + std::to_string(at) + " asked to relay more shares than there are");
      ++*pending;
      const int to = static_cast<int>(s.to);
      asio::co_spawn(ex_,
                     relay_share(ex_, roots[to], to, at, std::move(f.payload), until, traffic_),
                     [pending, relayed, failure](std::exception_ptr ep) {
                       if (ep && !*failure) *failure = ep;
                       if (--*pending == 0) relayed->cancel();
                     });
    }
  } catch (const boost::system::system_error&) {
    // The deadline closed the connection, or the root went away: the caller asks why.
  }
  // The last relays may still be under way when the table comes (another root formed first).
  co_await wait_for_all(pending, relayed, until);
  if (*failure) std::rethrow_exception(*failure);
  co_return table;
}

void Peers::leave_root() {
  if (!root_link_ || !root_channel_) return;
  ++*telling_;
  asio::co_spawn(
      ex_,
      [](std::shared_ptr<Stream> link, Channel channel) -> asio::awaitable<void> {
        runtime::CloseAfter guard(*link, std::chrono::seconds(1));
        const std::vector<std::uint8_t> nothing;
        co_await write_frame(*link, channel, FrameType::close, nothing);
      }(std::exchange(root_link_, nullptr), std::move(*root_channel_)),
      [telling = telling_](std::exception_ptr) { --*telling; });
  root_channel_.reset();
}

asio::awaitable<void> Peers::tell_root(std::string why) {
  if (!root_) co_return;
  try {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    auto sock = co_await transport::dial(ex_, root_->address, until, true, traffic_);
    runtime::CloseAfter guard(*sock, std::chrono::seconds(1));
    Channel channel = co_await Channel::initiate(*sock, root_->secret);
    auto payload = encode_notice(rank_, why);
    co_await write_frame(*sock, channel, FrameType::notice, payload);
  } catch (const std::exception&) {
  }
}

asio::awaitable<std::string> Peers::gone_because(int peer) {
  if (!root_) co_return std::string();
  // A peer whose set-up failed may close its listener a moment before it tells the root why.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  asio::steady_timer pause(ex_);
  while (std::chrono::steady_clock::now() < until) {
    try {
      RootView view = co_await query_root(
          ex_, *root_, std::chrono::steady_clock::now() + std::chrono::milliseconds(500));
      if (auto f = view.failed.find(peer); f != view.failed.end() && !f->second.empty())
        co_return "; " + f->second;
    } catch (const std::exception&) {
      co_return std::string();
    }
    pause.expires_after(std::chrono::milliseconds(100));
    boost::system::error_code ignored;
    co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
  co_return std::string();
}

asio::awaitable<std::string> Peers::why_no_table(int target) {
  const int nroots = static_cast<int>(roots_.size());
  const int at = root_of(target, nranks_, nroots);
  auto view_of = [&](int k) -> asio::awaitable<std::optional<RootView>> {
    std::optional<RootView> v;
    try {
      v = co_await query_root(ex_, roots_[k],
                              std::chrono::steady_clock::now() + std::chrono::seconds(1));
    } catch (const std::exception&) {
    }
    co_return v;
  };
  const std::optional<RootView> view = co_await view_of(at);
  const std::string which = nroots > 1 ? "bootstrap root " + std::to_string(at) : "bootstrap root";
  if (!view) co_return "the " + which + " does not answer either (its process may be gone)";
  // A refused hello or share says why (other ids, a wrong share).
  std::string refused;
  for (const auto& [rank, f] : view->failed)
    if (!f.empty()) {
      refused = "; " + f;
      break;
    }
  auto missing_of = [](const RootView& v) {
    std::string missing;
    int count = 0;
    for (int r = v.first; r < v.last; ++r) {
      if (v.seen(r)) continue;
      if (count < 16) missing += (count ? ", " : "") + std::to_string(r);
      ++count;
    }
    if (count > 16) missing += " and " + std::to_string(count - 16) + " more";
    return std::string(count == 1 ? "rank " : "ranks ") + missing +
           (count == 1 ? " has" : " have") + " not reached the bootstrap root (" +
           std::to_string(v.arrived) + " of " + std::to_string(v.last - v.first) + " arrived)";
  };
  if (view->arrived < view->last - view->first) co_return missing_of(*view) + refused;
  if (!view->formed) {
    if (view->awaiting.empty())
      co_return "every rank reached the " + which + ", which has not formed" + refused;
    std::string roots_text;
    for (std::size_t i = 0; i < view->awaiting.size() && i < 8; ++i)
      roots_text += (i ? ", " : "") + std::to_string(view->awaiting[i]);
    std::string more;
    // What the first root waited for says: usually ranks of its share that never came.
    const int other = view->awaiting.front();
    if (other >= 0 && other < nroots) {
      const std::optional<RootView> far = co_await view_of(other);
      if (!far)
        more = "; root " + std::to_string(other) + " does not answer (its process may be gone)";
      else if (far->arrived < far->last - far->first)
        more = "; at root " + std::to_string(other) + ", " + missing_of(*far);
    }
    co_return "every rank of " + which + "'s share reached it; it still waits for root" +
        (view->awaiting.size() == 1 ? " " : "s ") + roots_text + more + refused;
  }
  if (view->rank0_lost && target == view->first)
    co_return "rank " + std::to_string(target) + " reached the " + which +
        " but could not take its address table (it has gone)";
  const int via = view->via(target);
  if (via >= 0 && via != target) {
    const std::string leader_says = co_await ask_about(via, view->listener(via));
    co_return "the " + which + " sent the table to rank " + std::to_string(via) +
        ", the leader of its host, which did not pass it on (" + leader_says + ")";
  }
  co_return "every rank reached the " + which + ", which sent the table" + refused;
}

namespace {

// One question and its answer on a fresh authenticated connection, all before `until`.
asio::awaitable<Frame> ask(asio::any_io_executor ex, PeerInfo ep, Secret secret,
                           std::size_t max_answer, std::chrono::steady_clock::time_point until) {
  auto sock = co_await transport::dial(ex, ep, until);
  auto left = runtime::time_left(until);
  runtime::CloseAfter guard(*sock, left);
  try {
    Channel channel = co_await Channel::initiate(*sock, secret);
    const std::vector<std::uint8_t> nothing;
    co_await write_frame(*sock, channel, FrameType::status_query, nothing);
    Frame f = co_await read_frame(*sock, channel, max_answer);
    if (f.type != FrameType::status)
      bad_message("expected a status answer from " + address_text(ep));
    co_return f;
  } catch (const boost::system::system_error& e) {
    if (std::chrono::steady_clock::now() >= until)
      throw std::system_error(make_error_code(errc::timed_out),
                              "no status answer from " + address_text(ep) + " in time");
    throw std::system_error(make_error_code(errc::peer_lost),
                            address_text(ep) + " ended the status query: " + e.code().message());
  }
}

}  // namespace

asio::awaitable<RootView> query_root(asio::any_io_executor ex, const RootAddress& root,
                                     std::chrono::steady_clock::time_point until) {
  Frame f = co_await ask(ex, root.address, root.secret, max_table_frame, until);
  co_return decode_root_view(f.payload);
}

asio::awaitable<std::vector<std::uint8_t>> query_rank(asio::any_io_executor ex,
                                                      const PeerInfo& peer, Secret secret,
                                                      std::chrono::steady_clock::time_point until) {
  Frame f = co_await ask(ex, peer, secret, max_status_frame, until);
  co_return std::move(f.payload);
}

}  // namespace coccl::transport
