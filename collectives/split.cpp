// Splitting a communicator (Communicator::split, split_members and their async forms). One
// coroutine on the parent's proxy thread runs the parent's operations that form the new
// communicator without a root (form_group); the blocking forms wait for it.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/coccl.hpp>
#include <cstring>
#include <span>
#include <tuple>

#include "collectives/comm.hpp"
#include "collectives/comm_params.hpp"
#include "runtime/handoff.hpp"
#include "runtime/log.hpp"
#include "transport/address_book.hpp"
#include "transport/bootstrap_messages.hpp"
#include "transport/directory.hpp"
#include "transport/hmac.hpp"
#include "transport/net.hpp"

namespace coccl {

namespace detail {

namespace {

namespace asio = boost::asio;

using Awaitable = decltype(asio::as_tuple(asio::use_awaitable));

// Starts an operation of the parent with the coroutine's handler (a struct, not a lambda: no
// capturing lambda inside a co_await expression).
struct StartOp {
  std::shared_ptr<CommImpl> impl;
  template <typename Handler>
  void operator()(Handler handler, OpArgs args) const {
    initiate(impl, std::move(args), OpHandler(std::move(handler)));
  }
};

// Runs `args` on the parent; throws std::system_error with the parent's reason on failure.
asio::awaitable<void> run(std::shared_ptr<CommImpl> impl, OpArgs args, const char* what) {
  // Named before the co_await: GCC 12 mishandles brace-init lists inside its arguments.
  Awaitable token = asio::as_tuple(asio::use_awaitable);
  const StartOp start{impl};
  auto [ec] = co_await asio::async_initiate<Awaitable, void(boost::system::error_code)>(
      start, token, std::move(args));
  if (ec) throw std::system_error(ec, std::string(what) + ": " + describe_error(impl, ec));
}

OpArgs gather(const void* send, void* recv, std::size_t count, DataType type) {
  OpArgs a;
  a.kind = OpKind::all_gather;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.type = type;
  return a;
}

OpArgs transfers(std::vector<Transfer> list) {
  OpArgs a;
  a.kind = OpKind::p2p;
  a.p2p = std::move(list);
  return a;
}

// The member list's fingerprint, carried by every message of a split, so that members with
// another list notice.
std::uint64_t fingerprint_of(const std::vector<int>& members) {
  std::uint64_t h = 1469598103934665603ull;
  for (int r : members) h = (h ^ static_cast<std::uint32_t>(r)) * 1099511628211ull;
  return h;
}

// What goes up the member tree: the fingerprint and, over the member's subtree, the highest host
// identity and the highest complement of one (so the lowest identity). Every member then learns
// alike whether the group is on one host, without anyone counting the hosts.
struct TreeUp {
  std::uint64_t fingerprint = 0;
  std::uint64_t high = 0;
  std::uint64_t low_complement = 0;
};

// What comes down: the same over the whole group, and the new communicator's secret.
struct TreeDown {
  TreeUp group;
  transport::Secret secret{};
};

// A member's listener in the new communicator on its way to a member that keeps it. Positions
// are in the hypercube of 2^ceil(log2 m) places: place v >= m is a stand-in hosted by member
// v - 2^(ceil(log2 m) - 1) (host_of).
struct Routed {
  std::int32_t source = 0;
  std::int32_t target = 0;
  std::int32_t towards = 0;  // the place it heads for: first a stop picked by hash, then the target
  std::int32_t at = 0;       // the place it is at
  transport::PeerInfo info{};
};

// The place an entry from `source` to `target` stops at on its way, spread as by chance over the
// `places`: routed straight, the binary tree's pairs (i, 2i + 1) would cross a few members by the
// hundreds; through a stop picked at random no member carries more than O(log m) of the entries
// crossing a bit, with high probability (Valiant's two-leg routing).
std::int32_t stop_of(std::uint64_t fingerprint, std::int32_t source, std::int32_t target,
                     int places) {
  std::uint64_t x =
      fingerprint ^ (static_cast<std::uint64_t>(source) << 32) ^ static_cast<std::uint32_t>(target);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<std::int32_t>(x % static_cast<std::uint64_t>(places));
}

// The entries a member took from the members it keeps, as the table frame_from_book reads (they
// were exchanged already: publishing is done). Sorted by source.
class TakenEntries final : public transport::AddressBook {
 public:
  TakenEntries(const std::vector<Routed>& taken, transport::HostCount hosts)
      : taken_(taken), hosts_(hosts) {}
  void publish(const transport::PeerInfo&) override {}
  transport::PeerInfo lookup(int rank) override {
    const auto at = std::lower_bound(taken_.begin(), taken_.end(), rank,
                                     [](const Routed& e, int r) { return e.source < r; });
    if (at == taken_.end() || at->source != rank)
      transport::bad_message("split: no entry reached this member from member " +
                             std::to_string(rank));
    return at->info;
  }
  std::optional<transport::HostCount> hosts() override { return hosts_; }

 private:
  const std::vector<Routed>& taken_;
  transport::HostCount hosts_;
};

// Entries crossing one bit go in batches of a fixed size, so that each side knows every
// message's size: one message each way a step unless more cross.
constexpr std::uint32_t batch_entries = 16;
struct RouteBatch {
  std::uint32_t count = 0;  // entries used
  std::uint32_t more = 0;   // 1: another batch follows in this step
  Routed entries[batch_entries];
};

// The members' hypercube, padded to 2^bits places, seen from one member.
struct Hypercube {
  int m = 0, bits = 0, top = 0, mine = 0;
  // The member hosting place v: itself, or v with its top bit cleared for a stand-in.
  int host_of(int v) const { return v < m ? v : v ^ top; }
  // Whether this member hosts place v.
  bool hosts(int v) const { return v >= 0 && v < (1 << bits) && host_of(v) == mine; }
};

// One step of routing across `bit`: every entry of `carry` whose place differs from where it
// heads in that bit moves to the place across it; those whose new place another member hosts go
// to that member (the partners: mine XOR bit, or, for a stand-in across the top bit, mine XOR
// bit XOR top), which sends its own in the same operation. `ranks` maps those members to their
// parent ranks (sorted). At most `most` entries are accepted in all.
asio::awaitable<void> route_round(std::shared_ptr<CommImpl> impl, std::vector<Routed>& carry,
                                  const Hypercube& cube, int bit,
                                  const std::vector<std::pair<int, int>>& ranks, std::size_t most) {
  auto rank_of = [&ranks](int z) {
    const auto at = std::lower_bound(ranks.begin(), ranks.end(), std::pair(z, -1));
    if (at == ranks.end() || at->first != z)
      throw std::system_error(make_error_code(errc::internal),
                              "split: member " + std::to_string(z) + " is not a partner");
    return at->second;
  };
  // The members this one trades with in this step, whatever crosses: both sides find the same.
  std::vector<int> partners;
  for (int v : {cube.mine, cube.mine | cube.top}) {
    if (!cube.hosts(v)) continue;
    const int z = cube.host_of(v ^ bit);
    if (z != cube.mine && std::find(partners.begin(), partners.end(), z) == partners.end())
      partners.push_back(z);
  }
  std::vector<std::vector<Routed>> out(partners.size());
  std::vector<Routed> stay;
  for (Routed& e : carry) {
    if (((e.at ^ e.towards) & bit) != 0) e.at ^= bit;
    const int z = cube.host_of(e.at);
    if (z == cube.mine) {
      stay.push_back(e);
      continue;
    }
    const auto i = std::find(partners.begin(), partners.end(), z) - partners.begin();
    if (i == static_cast<std::ptrdiff_t>(partners.size()))
      transport::bad_message(
          "split: an entry would cross to a member this one does not trade with");
    out[i].push_back(e);
  }
  carry = std::move(stay);
  if (partners.empty()) co_return;
  const std::size_t n = partners.size();
  std::vector<RouteBatch> sending(n), taking(n);
  std::vector<std::size_t> sent(n, 0);
  std::vector<bool> going(n, true);
  std::size_t taken = carry.size();
  while (std::find(going.begin(), going.end(), true) != going.end()) {
    std::vector<Transfer> trade;
    for (std::size_t i = 0; i < n; ++i) {
      if (!going[i]) continue;
      RouteBatch& b = sending[i];
      b.count =
          static_cast<std::uint32_t>(std::min<std::size_t>(batch_entries, out[i].size() - sent[i]));
      std::copy_n(out[i].begin() + sent[i], b.count, b.entries);
      sent[i] += b.count;
      b.more = sent[i] < out[i].size() ? 1 : 0;
      const int rank = rank_of(partners[i]);
      trade.push_back(Transfer::send(&b, sizeof b, DataType::uint8, rank));
      trade.push_back(Transfer::recv(&taking[i], sizeof(RouteBatch), DataType::uint8, rank));
    }
    co_await run(impl, transfers(std::move(trade)), "split");
    for (std::size_t i = 0; i < n; ++i) {
      if (!going[i]) continue;
      const RouteBatch& b = taking[i];
      taken += b.count;
      if (b.count > batch_entries || b.more > 1 || taken > most)
        transport::bad_message("split: rank " + std::to_string(rank_of(partners[i])) +
                               " routed a malformed batch of entries, or more than can exist");
      for (std::uint32_t j = 0; j < b.count; ++j) {
        const Routed& e = b.entries[j];
        if (e.source < 0 || e.source >= cube.m || e.target < 0 || e.target >= cube.m ||
            e.towards < 0 || e.towards >= (1 << cube.bits) || !cube.hosts(e.at))
          transport::bad_message("split: rank " + std::to_string(rank_of(partners[i])) +
                                 " routed an entry out of range or to a place not here");
        carry.push_back(e);
      }
      // Both sides know both flags: the pair goes on while either has more.
      going[i] = sending[i].more || b.more;
    }
  }
}

// Forms the new communicator of `members` (parent ranks, in new-rank order; this rank is
// members[mine]) without a root, on the parent's point-to-point links to the members' hypercube
// partners (members[mine XOR 2^k]; when m is not a power of two, also members two bits away for
// the stand-ins):
// - Up and down a binomial tree of the members: member i's tree parent is i with its lowest set
//   bit cleared, its children i + 2^j for each 2^j below that bit. Up go the list's fingerprint
//   and the host identities' extremes; down come the group's and a fresh secret, made by member 0.
// - Each member opens its listener, and its entry goes to each member that keeps it
//   (directory.hpp: every other one up to COCCL_DIRECTORY_FULL members, else O(log m)), routed
//   over the members' hypercube padded to a power of two (stand-ins hosted by members, Hypercube)
//   in two legs, to a stop picked by hash (stop_of) and then to the target, each flipping the
//   differing bits lowest first. In each of the 2 ceil(log2 m) steps a member trades with one or
//   two partners every entry crossing that bit (route_round).
// A member handles O(log m) messages and links to O(log m) partners. For members that are an
// aligned block or every 2^s-th rank of the parent those are the parent's hypercube partners,
// whose addresses every rank holds (a member two bits away is found in two hops). Only they are
// kept while the split goes on: the list itself is let go (12,288 members are 48 KiB a rank).
asio::awaitable<Communicator> form_group(std::shared_ptr<CommImpl> impl, std::vector<int> members,
                                         int mine, CommunicatorOptions options) {
  const int m = static_cast<int>(members.size());
  const std::uint64_t h = fingerprint_of(members);
  const int bits = m <= 1 ? 0 : std::bit_width(static_cast<unsigned>(m - 1));
  const int top = bits > 0 ? 1 << (bits - 1) : 0;
  // The parent rank of each hypercube partner (-1 where mine XOR 2^k is not a member), and of the
  // members across a bit and the top bit, which route_round may trade with for a stand-in.
  std::vector<int> partner(bits, -1);
  std::vector<std::pair<int, int>> ranks_of;
  for (int k = 0; k < bits; ++k)
    for (int z : {mine ^ (1 << k), mine ^ (1 << k) ^ top})
      if (z < m && z != mine) {
        if (z == (mine ^ (1 << k))) partner[k] = members[z];
        ranks_of.emplace_back(z, members[z]);
      }
  std::sort(ranks_of.begin(), ranks_of.end());
  ranks_of.erase(std::unique(ranks_of.begin(), ranks_of.end()), ranks_of.end());
  members = {};
  // The parent's links that this split makes (none yet, or one a partner already made for its
  // own split and this rank has not used): both ends let each go once their group has formed
  // (the one that finishes later, when the other is settled, gets the close agreed; at once,
  // the lower rank's request wins), so that their receive rings do not stay with the parent.
  // They reopen on demand.
  std::vector<int> fresh;
  for (const auto& [z, rank] : ranks_of)
    if (!impl->peers().used(rank)) fresh.push_back(rank);
  const int lowest = mine > 0 ? std::countr_zero(static_cast<unsigned>(mine)) : bits;
  const int parent = mine > 0 ? partner[lowest] : -1;
  std::vector<int> children;
  for (int k = lowest; k-- > 0;)
    if (partner[k] >= 0 && (mine ^ (1 << k)) > mine) children.push_back(partner[k]);

  const std::uint64_t host = impl->peers().self_info().host_hash;
  TreeUp up{h, host, ~host};
  if (!children.empty()) {
    std::vector<TreeUp> theirs(children.size());
    std::vector<Transfer> take;
    for (std::size_t i = 0; i < children.size(); ++i)
      take.push_back(Transfer::recv(&theirs[i], sizeof(TreeUp), DataType::uint8, children[i]));
    co_await run(impl, transfers(std::move(take)), "split");
    for (std::size_t i = 0; i < children.size(); ++i) {
      // Another list below: the tree goes on with the fingerprint spoiled, so that every member
      // learns of it (rather than waiting for messages the others' trees never send).
      if (theirs[i].fingerprint != h) up.fingerprint = 0;
      up.high = std::max(up.high, theirs[i].high);
      up.low_complement = std::max(up.low_complement, theirs[i].low_complement);
    }
  }
  TreeDown down;
  if (mine > 0) {
    std::vector<Transfer> send{Transfer::send(&up, sizeof up, DataType::uint8, parent)};
    co_await run(impl, transfers(std::move(send)), "split");
    std::vector<Transfer> take{Transfer::recv(&down, sizeof down, DataType::uint8, parent)};
    co_await run(impl, transfers(std::move(take)), "split");
  } else {
    down.group = up;
    random_bytes(down.secret);
  }
  if (!children.empty()) {
    std::vector<Transfer> forward;
    for (int c : children)
      forward.push_back(Transfer::send(&down, sizeof down, DataType::uint8, c));
    co_await run(impl, transfers(std::move(forward)), "split");
  }
  if (down.group.fingerprint != h)
    throw std::system_error(
        make_error_code(errc::mismatch),
        mine > 0 ? "split: the members' lists differ (rank " + std::to_string(parent) +
                       ", this rank's parent in the member tree, passed on another list or "
                       "word of one)"
                 : std::string("split: the members' lists differ (a member below this rank in "
                               "the member tree has another)"));

  // The new communicator lives on this thread, its streams counted with the parent's.
  auto made = std::make_shared<CommImpl>(impl->engine(), down.secret, mine, m, options,
                                         impl->on_memory(), impl->peers().traffic());
  std::exception_ptr failed;
  try {
    const transport::PeerInfo self = made->peers().self_info();
    const bool full = m <= params::directory_full.get();
    std::vector<int> keeps;
    if (full) {
      for (int j = 0; j < m; ++j)
        if (j != mine) keeps.push_back(j);
    } else {
      keeps = transport::needs_of(std::span<const int>(&mine, 1), m);
      keeps.erase(std::find(keeps.begin(), keeps.end(), mine));
    }
    const Hypercube cube{m, bits, top, mine};
    const int places = 1 << bits;
    std::vector<Routed> carry;
    for (int t : keeps) carry.push_back({mine, t, stop_of(h, mine, t, places), mine, self});
    // Every entry in flight at once could pass one member: m - 1 of each member in a full
    // directory, at most log2 m + 5 of each otherwise.
    const std::size_t most =
        static_cast<std::size_t>(m) * (full ? static_cast<std::size_t>(m) : bits + 6u);
    // Two legs, each flipping the differing bits lowest first: to the stop, then to the target.
    for (int leg = 0; leg < 2; ++leg) {
      if (leg == 1)
        for (Routed& e : carry) e.towards = e.target;
      for (int k = 0; k < bits; ++k)
        co_await route_round(impl, carry, cube, 1 << k, ranks_of, most);
    }
    std::vector<int> got;
    for (const Routed& e : carry) {
      if (e.target != mine || e.at != mine)
        transport::bad_message("split: an entry stopped short of its member");
      got.push_back(e.source);
    }
    std::sort(carry.begin(), carry.end(),
              [](const Routed& a, const Routed& b) { return a.source < b.source; });
    std::sort(got.begin(), got.end());
    if (got != keeps)
      transport::bad_message("split: the entries that reached this member are not those of the " +
                             std::to_string(keeps.size()) + " members it keeps");
    // Hosts: 1, or 2 standing for several (only whether there is one is used). This host's
    // members: all of them on one host, else at most the parent's count of its host's ranks.
    const bool one_host = down.group.high == ~down.group.low_complement;
    const auto count = static_cast<std::uint32_t>(m);
    const transport::HostCount hosts{
        one_host ? 1u : 2u,
        one_host
            ? count
            : std::min(count, static_cast<std::uint32_t>(std::max(1, impl->peers().host_ranks())))};
    TakenEntries book(carry, hosts);
    made->form(transport::frame_from_book(book, self, mine, m));
    for (int rank : fresh) impl->peers().let_go(rank);
  } catch (...) {
    failed = std::current_exception();
  }
  if (failed) {
    try {
      std::rethrow_exception(failed);
    } catch (const std::system_error& e) {
      made->fail(e.code(), e.what(), false);
    } catch (const std::exception& e) {
      made->fail(make_error_code(errc::internal), e.what(), false);
    }
    std::rethrow_exception(failed);
  }
  co_return CommImpl::handle(made);
}

asio::awaitable<Communicator> split_by_color(std::shared_ptr<CommImpl> impl, int color, int key,
                                             CommunicatorOptions options) {
  const int n = impl->size(), me = impl->rank();
  // Everyone shares (color, key), one all_gather of the parent (O(n)); then each group forms
  // alone, as split_members does.
  std::vector<std::int64_t> mine{color, key}, all(2 * static_cast<std::size_t>(n));
  OpArgs colors = gather(mine.data(), all.data(), 2, DataType::int64);
  co_await run(impl, std::move(colors), "split");
  if (color < 0) co_return Communicator();
  std::vector<int> members;
  for (int r = 0; r < n; ++r)
    if (all[2 * r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  all = {};
  const int new_rank =
      static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  co_return co_await form_group(impl, std::move(members), new_rank, std::move(options));
}

// The caller's cancellation, taken to the parent's proxy thread, where the coroutine's signal is
// emitted (a cancellation signal is not thread-safe).
struct Cancel {
  asio::any_io_executor ex;
  asio::cancellation_signal signal;
  bool done = false;
};

// Runs `flow` on the parent's proxy thread and completes `handler` with its result.
void spawn(const std::shared_ptr<CommImpl>& impl, asio::awaitable<Communicator> flow,
           CreateHandler handler, std::shared_ptr<std::string> failure) {
  auto ex = impl->executor();
  auto cancel = std::make_shared<Cancel>();
  cancel->ex = ex;
  auto slot = handler.get_cancellation_slot();
  if (slot.is_connected()) {
    slot.assign([weak = std::weak_ptr<Cancel>(cancel)](asio::cancellation_type type) {
      auto c = weak.lock();
      if (!c || (type & asio::cancellation_type::terminal) == asio::cancellation_type::none) return;
      asio::post(c->ex, [c, type] {
        if (!c->done) c->signal.emit(type);
      });
    });
  }
  auto boxed = std::make_unique<CreateHandler>(std::move(handler));
  asio::co_spawn(
      ex, std::move(flow),
      asio::bind_cancellation_slot(
          cancel->signal.slot(), [rank = impl->rank(), ex, cancel, failure, h = std::move(boxed)](
                                     std::exception_ptr ep, Communicator comm) mutable {
            cancel->done = true;
            std::error_code ec;
            std::string why;
            if (ep) {
              try {
                std::rethrow_exception(ep);
              } catch (const std::system_error& e) {
                ec = e.code();
                why = e.what();
              } catch (const boost::system::system_error& e) {
                ec = e.code();
                why = e.what();
              } catch (const std::exception& e) {
                ec = make_error_code(errc::internal);
                why = e.what();
              }
              COCCL_WARN(init, rank, "split failed: %s", why.c_str());
              if (failure) *failure = why;
              comm = Communicator();
            }
            runtime::complete_later(ex, std::move(*h), ec, std::move(comm));
          }));
  // Started from the caller's thread: a loop napping while callers borrow its role would begin
  // the split only at the nap's end.
  impl->thread().owe();
}

// Completes `handler` with `ec` (nothing started).
void refuse(const std::shared_ptr<CommImpl>& impl, CreateHandler handler, std::error_code ec,
            const std::string& why, const std::shared_ptr<std::string>& failure) {
  if (failure) *failure = why;
  auto ex = impl ? impl->executor() : process_engine().thread(0).executor();
  runtime::complete_later(ex, std::move(handler), ec, Communicator());
}

// Waits on the calling thread for a split that `start` initiates; throws as the blocking forms
// do.
template <typename Start>
Communicator wait_for_split(const std::shared_ptr<CommImpl>& impl, Start start) {
  if (!impl) throw std::system_error(make_error_code(errc::invalid_argument), "empty communicator");
  if (runtime::on_proxy_thread())
    throw std::system_error(std::make_error_code(std::errc::resource_deadlock_would_occur),
                            "a blocking split on a proxy thread would wait for the loop it "
                            "blocks; co_await async_split there");
  if (!impl->blocking())
    throw std::system_error(std::make_error_code(std::errc::operation_would_block),
                            "a blocking split on a non-blocking communicator (Options::blocking "
                            "is false); use async_split");
  struct Result {
    std::atomic<int> done{0};
    std::error_code ec;
    Communicator comm;
  };
  auto result = std::make_shared<Result>();
  auto failure = std::make_shared<std::string>();
  start(CreateHandler([result](boost::system::error_code ec, Communicator c) {
          result->ec = ec;
          result->comm = std::move(c);
          result->done.store(1, std::memory_order_release);
          result->done.notify_one();
        }),
        failure);
  result->done.wait(0, std::memory_order_acquire);
  if (result->ec) throw std::system_error(result->ec, *failure);
  return std::move(result->comm);
}

}  // namespace

void initiate_split(const std::shared_ptr<CommImpl>& impl, int color, int key,
                    const CommunicatorOptions& options, CreateHandler handler,
                    std::shared_ptr<std::string> failure) {
  if (!impl)
    return refuse(impl, std::move(handler), make_error_code(errc::invalid_argument),
                  "split of an empty communicator", failure);
  spawn(impl, split_by_color(impl, color, key, options), std::move(handler), std::move(failure));
}

void initiate_split_members(const std::shared_ptr<CommImpl>& impl, std::vector<int> members,
                            CreateHandler handler, std::shared_ptr<std::string> failure) {
  auto invalid = [&](const std::string& why) {
    refuse(impl, std::move(handler), make_error_code(errc::invalid_argument), why, failure);
  };
  if (!impl) return invalid("split_members of an empty communicator");
  const int n = impl->size(), me = impl->rank();
  const int m = static_cast<int>(members.size());
  if (m == 0) return invalid("split_members: the member list is empty");
  std::vector<bool> seen(n, false);
  int mine = -1;
  for (int i = 0; i < m; ++i) {
    const int r = members[i];
    if (r < 0 || r >= n)
      return invalid("split_members: rank " + std::to_string(r) + " is not in [0, " +
                     std::to_string(n) + ")");
    if (seen[r]) return invalid("split_members: rank " + std::to_string(r) + " is listed twice");
    seen[r] = true;
    if (r == me) mine = i;
  }
  if (mine < 0)
    return invalid("split_members: this rank (" + std::to_string(me) + ") is not a member");
  spawn(impl, form_group(impl, std::move(members), mine, CommunicatorOptions{}), std::move(handler),
        std::move(failure));
}

}  // namespace detail

Communicator Communicator::split(int color, int key, const Options& options) {
  return detail::wait_for_split(
      impl_, [&](detail::CreateHandler h, std::shared_ptr<std::string> failure) {
        detail::initiate_split(impl_, color, key, options, std::move(h), std::move(failure));
      });
}

Communicator Communicator::split_members(const std::vector<int>& members) {
  return detail::wait_for_split(
      impl_, [&](detail::CreateHandler h, std::shared_ptr<std::string> failure) {
        detail::initiate_split_members(impl_, members, std::move(h), std::move(failure));
      });
}

}  // namespace coccl
