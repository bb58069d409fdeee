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

// A member's listener in the new communicator on its way to a member that keeps it.
struct Routed {
  std::int32_t source = 0;
  std::int32_t target = 0;
  transport::PeerInfo info{};
};

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

// One step of moving entries over the members' hypercube across `bit`, with the member
// `partner` (a parent rank): this member sends the entries of `carry` that cross it (`setting`:
// those whose target has the bit; clearing: those whose target lacks it), or takes what comes
// into `carry`. A count goes first, then the entries when there are any, so both sides agree on
// every message. At most `most` entries are accepted.
asio::awaitable<void> route_step(std::shared_ptr<CommImpl> impl, std::vector<Routed>& carry,
                                 bool sends, int partner, int bit, bool setting, int m,
                                 std::size_t most) {
  std::uint32_t count = 0;
  std::vector<Routed> moved;
  if (sends) {
    const auto at = std::stable_partition(carry.begin(), carry.end(), [&](const Routed& e) {
      return ((e.target & bit) != 0) != setting;
    });
    moved.assign(at, carry.end());
    carry.erase(at, carry.end());
    count = static_cast<std::uint32_t>(moved.size());
    // Two operations, as the receiver sizes the second from the first.
    std::vector<Transfer> send{Transfer::send(&count, sizeof count, DataType::uint8, partner)};
    co_await run(impl, transfers(std::move(send)), "split");
    if (count == 0) co_return;
    send = {Transfer::send(moved.data(), count * sizeof(Routed), DataType::uint8, partner)};
    co_await run(impl, transfers(std::move(send)), "split");
    co_return;
  }
  std::vector<Transfer> take{Transfer::recv(&count, sizeof count, DataType::uint8, partner)};
  co_await run(impl, transfers(std::move(take)), "split");
  if (count == 0) co_return;
  if (count > most)
    transport::bad_message("split: rank " + std::to_string(partner) + " routed " +
                           std::to_string(count) + " entries, more than can exist");
  moved.resize(count);
  take = {Transfer::recv(moved.data(), count * sizeof(Routed), DataType::uint8, partner)};
  co_await run(impl, transfers(std::move(take)), "split");
  for (const Routed& e : moved) {
    if (e.source < 0 || e.source >= m || e.target < 0 || e.target >= m)
      transport::bad_message("split: rank " + std::to_string(partner) +
                             " routed an entry of a member out of range");
    carry.push_back(e);
  }
}

// Forms the new communicator of `members` (parent ranks, in new-rank order; this rank is
// members[mine]) without a root, on the parent's point-to-point links to the members' hypercube
// partners (members[mine XOR 2^k]) only:
// - Up and down a binomial tree of the members: member i's tree parent is i with its lowest set
//   bit cleared, its children i + 2^j for each 2^j below that bit. Up go the list's fingerprint
//   and the host identities' extremes; down come the group's and a fresh secret, made by member 0.
// - Each member opens its listener, and its entry goes to each member that keeps it
//   (directory.hpp: every other one up to COCCL_DIRECTORY_FULL members, else O(log m)), routed
//   over the hypercube as a lookup is: first clearing the bits the target lacks, lowest first,
//   then setting those it has, one bit a step, so every member on the way exists. In each of the
//   2 ceil(log2 m) steps a member sends to, or takes from, one partner all the entries that cross
//   that bit.
// A member handles O(log m) messages and links to O(log m) partners. For members that are an
// aligned block or every 2^s-th rank of the parent those are the parent's hypercube partners,
// whose addresses every rank holds: nothing is looked up. Only they are kept while the split goes
// on: the list itself is let go (12,288 members are 48 KiB a rank).
asio::awaitable<Communicator> form_group(std::shared_ptr<CommImpl> impl, std::vector<int> members,
                                         int mine, CommunicatorOptions options) {
  const int m = static_cast<int>(members.size());
  const std::uint64_t h = fingerprint_of(members);
  const int bits = m <= 1 ? 0 : std::bit_width(static_cast<unsigned>(m - 1));
  // The parent rank of each hypercube partner (-1 where mine XOR 2^k is not a member).
  std::vector<int> partner(bits, -1);
  for (int k = 0; k < bits; ++k)
    if ((mine ^ (1 << k)) < m) partner[k] = members[mine ^ (1 << k)];
  members = {};
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
      transport::directory_needs(mine, m, keeps);
      std::sort(keeps.begin(), keeps.end());
      keeps.erase(std::unique(keeps.begin(), keeps.end()), keeps.end());
      keeps.erase(std::find(keeps.begin(), keeps.end(), mine));
    }
    std::vector<Routed> carry;
    for (int t : keeps) carry.push_back({mine, t, self});
    // Every entry in flight at once could pass one member: m - 1 of each member in a full
    // directory, at most log2 m + 5 of each otherwise.
    const std::size_t most =
        static_cast<std::size_t>(m) * (full ? static_cast<std::size_t>(m) : bits + 6u);
    for (int phase = 0; phase < 2; ++phase)
      for (int k = 0; k < bits; ++k) {
        const int bit = 1 << k;
        const bool has = (mine & bit) != 0;
        // Clearing: members with the bit send down; setting: members without it send up.
        const bool sends = phase == 0 ? has : !has;
        if (partner[k] < 0) {
          const bool stuck = std::any_of(carry.begin(), carry.end(), [&](const Routed& e) {
            return (e.target & bit) != 0 && e.target != mine;
          });
          if (sends && phase == 1 && stuck)
            transport::bad_message("split: an entry would cross to a member that is not there");
          continue;
        }
        co_await route_step(impl, carry, sends, partner[k], bit, phase == 1, m, most);
      }
    std::vector<int> got;
    for (const Routed& e : carry) {
      if (e.target != mine) transport::bad_message("split: an entry stopped short of its member");
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
