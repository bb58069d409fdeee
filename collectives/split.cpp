// Splitting a communicator (Communicator::split, split_members and their async forms). One
// coroutine on the parent's proxy thread runs the parent's operations that spread the new
// communicator's id, then joins it as async_create does; the blocking forms wait for it.
#include <algorithm>
#include <array>
#include <atomic>
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
#include "transport/bootstrap_messages.hpp"
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

struct StartCreate {
  template <typename Handler>
  void operator()(Handler handler, std::vector<UniqueId> ids, int rank, int nranks,
                  CommunicatorOptions options, std::shared_ptr<std::string> failure,
                  std::shared_ptr<transport::Traffic> traffic) const {
    start_create(std::move(ids), rank, nranks, options, CreateHandler(std::move(handler)),
                 std::move(failure), std::move(traffic));
  }
};

// Joins the new communicator (its hellos spread over the roots of `ids`); its streams count with
// the parent's (one rank's traffic).
asio::awaitable<Communicator> join(std::shared_ptr<CommImpl> parent, std::vector<UniqueId> ids,
                                   int rank, int nranks, CommunicatorOptions options) {
  auto failure = std::make_shared<std::string>();
  Awaitable token = asio::as_tuple(asio::use_awaitable);
  const StartCreate start;
  auto [ec, comm] =
      co_await asio::async_initiate<Awaitable, void(boost::system::error_code, Communicator)>(
          start, token, std::move(ids), rank, nranks, std::move(options), failure,
          parent->peers().traffic());
  if (ec)
    throw std::system_error(ec, "split: could not join the new communicator" +
                                    (failure->empty() ? std::string() : " (" + *failure + ")"));
  co_return std::move(comm);
}

// The id of a new communicator whose root this rank starts: on the parent's network.
UniqueId new_id(CommImpl& parent) {
  return parent.on_memory() ? memory_unique_id(parent.roots_traffic()) : UniqueId::create();
}

asio::awaitable<Communicator> split_by_color(std::shared_ptr<CommImpl> impl, int color, int key,
                                             CommunicatorOptions options) {
  const int n = impl->size(), me = impl->rank();
  // Everyone shares (color, key); the first member of each new group creates its root and shares
  // its id, then each member joins its group. Two all_gathers of the parent, O(n) each.
  std::vector<std::int64_t> mine{color, key}, all(2 * static_cast<std::size_t>(n));
  OpArgs colors = gather(mine.data(), all.data(), 2, DataType::int64);
  co_await run(impl, std::move(colors), "split");
  std::vector<int> members;
  if (color >= 0) {
    for (int r = 0; r < n; ++r)
      if (all[2 * r] == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  }
  UniqueId id{};
  if (!members.empty() && members.front() == me) id = new_id(*impl);
  std::vector<std::uint8_t> ids(static_cast<std::size_t>(n) * id.bytes.size());
  OpArgs roots = gather(id.bytes.data(), ids.data(), id.bytes.size(), DataType::uint8);
  co_await run(impl, std::move(roots), "split");
  if (color < 0) co_return Communicator();
  const int new_rank =
      static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  std::memcpy(id.bytes.data(), ids.data() + members.front() * id.bytes.size(), id.bytes.size());
  co_return co_await join(impl, std::vector<UniqueId>(1, id), new_rank,
                          static_cast<int>(members.size()), std::move(options));
}

// The member list's fingerprint travels with the ids, so members with another list notice.
std::uint64_t fingerprint_of(const std::vector<int>& members) {
  std::uint64_t h = 1469598103934665603ull;
  for (int r : members) h = (h ^ static_cast<std::uint32_t>(r)) * 1099511628211ull;
  return h;
}

asio::awaitable<Communicator> split_by_members(std::shared_ptr<CommImpl> impl,
                                               std::vector<int> members, int mine) {
  const int m = static_cast<int>(members.size());
  const std::uint64_t h = fingerprint_of(members);
  // The new communicator has one root per COCCL_SPLIT_ROOT_RANKS members (as
  // ncclCommInitRankScalable spreads hellos over its ids), started by the first member of each
  // share. The ids travel over a binomial tree of the members on the parent's point-to-point
  // links: member i's parent is i with its lowest set bit cleared, its children i + 2^j for each
  // 2^j below that bit. With one root its id goes down the tree; with several they first go up
  // it, each member merging its children's into its own, and the whole list then comes down.
  // Each way takes ceil(log2 m) steps, and a member links to at most log2 m + 1 others. Members
  // listed in rank order whose ranks are a block of 2^k ranks, or every 2^s-th rank (a host's
  // GPUs, a rail), pass them only between partners in the parent's hypercube, whose addresses
  // every rank holds (transport/directory.hpp): no address is looked up. Only the tree
  // neighbours are kept while the split goes on: the list itself is let go (12,288 members are
  // 48 KiB a rank).
  const int per_root =
      static_cast<int>(std::clamp<std::int64_t>(params::split_root_ranks.get(), 1, 1 << 30));
  const int roots = (m + per_root - 1) / per_root;
  const int first = members.front();
  const int parent = mine > 0 ? members[mine & (mine - 1)] : -1;
  std::vector<int> children;
  const int below = mine > 0 ? (mine & -mine) : 1 << 30;
  for (int step = 1 << 30; step > 0; step >>= 1)
    if (step < below && mine + step < m) children.push_back(members[mine + step]);
  members = {};
  // The ids (a slot each, zero until known), then the member list's fingerprint.
  constexpr std::size_t id_bytes = sizeof(UniqueId::bytes);
  std::vector<std::uint8_t> msg(roots * id_bytes + sizeof h);
  const int at = transport::root_of(mine, m, roots);
  if (mine == transport::share_begin(at, m, roots)) {
    const UniqueId id = new_id(*impl);
    std::memcpy(msg.data() + at * id_bytes, id.bytes.data(), id_bytes);
  }
  std::memcpy(msg.data() + roots * id_bytes, &h, sizeof h);
  if (roots > 1 && !children.empty()) {
    // Up: every child's subtree's ids, merged into this member's.
    std::vector<std::vector<std::uint8_t>> theirs(children.size(),
                                                  std::vector<std::uint8_t>(msg.size()));
    std::vector<Transfer> take;
    for (std::size_t i = 0; i < children.size(); ++i)
      take.push_back(Transfer::recv(theirs[i].data(), msg.size(), DataType::uint8, children[i]));
    co_await run(impl, transfers(std::move(take)), "split_members");
    for (const auto& t : theirs) {
      if (std::memcmp(t.data() + roots * id_bytes, &h, sizeof h) != 0)
        throw std::system_error(make_error_code(errc::mismatch),
                                "split_members: this rank's member list differs from its "
                                "children's in the member tree");
      for (int k = 0; k < roots; ++k) {
        const std::uint8_t* slot = t.data() + k * id_bytes;
        if (std::any_of(slot, slot + id_bytes, [](std::uint8_t b) { return b != 0; }))
          std::memcpy(msg.data() + k * id_bytes, slot, id_bytes);
      }
    }
  }
  if (roots > 1 && mine > 0) {
    std::vector<Transfer> up{Transfer::send(msg.data(), msg.size(), DataType::uint8, parent)};
    co_await run(impl, transfers(std::move(up)), "split_members");
  }
  if (mine > 0) {
    // Down: the whole list from the parent.
    std::vector<Transfer> take{Transfer::recv(msg.data(), msg.size(), DataType::uint8, parent)};
    co_await run(impl, transfers(std::move(take)), "split_members");
  }
  std::vector<Transfer> forward;
  for (int c : children)
    forward.push_back(Transfer::send(msg.data(), msg.size(), DataType::uint8, c));
  if (!forward.empty()) co_await run(impl, transfers(std::move(forward)), "split_members");
  std::uint64_t theirs = 0;
  std::memcpy(&theirs, msg.data() + roots * id_bytes, sizeof theirs);
  if (theirs != h)
    throw std::system_error(
        make_error_code(errc::mismatch),
        "split_members: this rank's member list differs from rank " + std::to_string(first) + "'s");
  std::vector<UniqueId> ids(roots);
  for (int k = 0; k < roots; ++k)
    std::memcpy(ids[k].bytes.data(), msg.data() + k * id_bytes, id_bytes);
  const CommunicatorOptions defaults;
  co_return co_await join(impl, std::move(ids), mine, m, defaults);
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
  spawn(impl, split_by_members(impl, std::move(members), mine), std::move(handler),
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
