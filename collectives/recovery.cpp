// Recovery after lost ranks (include/coccl/communicator.hpp: lost_ranks, shrink, grow).
//
// A failed communicator has closed its links, but each rank keeps its listener open until the
// communicator is destroyed, and every rank still holds the address table and the secret. So
// survivors meet there without the parent's links:
//  - lost_ranks(): one authenticated probe per rank (FrameType::recover, kind probe); the answer
//    names the rank, so a port reused by another process never counts as alive.
//  - shrink(): each survivor sends a shrink request (its parent rank, attempt number, exclude
//    list) to the lowest rank not excluded. That rank collects one request from every other
//    survivor, checks that the lists and attempts agree, and answers each with the UniqueId of
//    a fresh root (new secret) or with the error; then everyone joins the new communicator.
#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/communicator.hpp>
#include <cstring>
#include <future>
#include <map>

#include "collectives/comm.hpp"
#include "runtime/handoff.hpp"
#include "runtime/log.hpp"

namespace coccl {

namespace asio = boost::asio;
using transport::Channel;
using transport::Frame;
using transport::FrameType;
using transport::Peers;
using transport::Reader;
using transport::Writer;

namespace detail {
namespace {

constexpr std::size_t max_recovery_frame = 64 * 1024;

[[noreturn]] void invalid(const std::string& why) {
  throw std::system_error(make_error_code(errc::invalid_argument), why);
}

std::string list_text(const std::vector<int>& ranks) {
  std::string s = "{";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s + "}";
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

// Sorted and without repeats; every entry a rank of the parent other than `me`.
std::vector<int> checked_exclude(std::span<const int> exclude, int me, int n) {
  std::vector<int> out(exclude.begin(), exclude.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  for (int r : out)
    if (r < 0 || r >= n)
      invalid("shrink: rank " + std::to_string(r) + " is not in [0, " + std::to_string(n) + ")");
  if (std::binary_search(out.begin(), out.end(), me))
    invalid("shrink: this rank (" + std::to_string(me) +
            ") is in the exclude list; excluded ranks do not call shrink");
  return out;
}

// What the survivors' meeting gives this rank.
struct ShrinkPlan {
  UniqueId id{};
  int rank = -1;
  int nranks = 0;
};

// ---- lost_ranks -------------------------------------------------------------------------------

asio::awaitable<bool> answers(asio::any_io_executor ex, transport::PeerInfo where,
                              transport::Secret secret, int me, int peer) {
  try {
    // One deadline for the whole probe, the connection included.
    const auto until = std::chrono::steady_clock::now() + runtime::default_timeout();
    auto sock = co_await transport::dial(ex, where, until, true);
    transport::Stream& s = *sock;
    runtime::CloseAfter guard(s, until - std::chrono::steady_clock::now());
    Channel channel = co_await Channel::initiate(s, secret);
    Writer w;
    w.put<std::uint8_t>(Peers::recover_probe).put<std::int32_t>(me);
    co_await transport::write_frame(s, channel, FrameType::recover, w.bytes());
    Frame f = co_await transport::read_frame(s, channel, 64);
    Reader r(f.payload);
    co_return f.type == FrameType::recover&& r.get<std::int32_t>() == peer;
  } catch (const std::exception&) {
    // Refused, closed, silent past the deadline or not a member of this communicator: lost.
    co_return false;
  }
}

// A rank whose address cannot be found (every rank on the way is gone) counts as lost too.
asio::awaitable<bool> locate_and_probe(std::shared_ptr<CommImpl> impl, int peer) {
  Peers& peers = impl->peers();
  std::optional<transport::PeerInfo> where;
  try {
    where =
        co_await peers.locate(peer, std::chrono::steady_clock::now() + runtime::default_timeout());
  } catch (const std::exception&) {
  }
  if (!where) co_return false;
  co_return co_await answers(impl->executor(), *where, peers.secret(), impl->rank(), peer);
}

struct Gather {
  explicit Gather(asio::any_io_executor ex, int n) : alive(n, 0), done(ex) {}
  std::vector<char> alive;
  int left = 0;
  asio::steady_timer done;  // used as an event: cancelled when the last answer is in
};

asio::awaitable<std::vector<int>> probe_all(std::shared_ptr<CommImpl> impl) {
  const int n = impl->size(), me = impl->rank();
  auto ex = impl->executor();
  auto g = std::make_shared<Gather>(ex, n);
  g->left = n - 1;
  // Each probe ends by its own deadline; this one only bounds the wait if something is amiss.
  g->done.expires_after(2 * runtime::default_timeout());
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    asio::co_spawn(ex, locate_and_probe(impl, r), [g, r](std::exception_ptr, bool ok) {
      g->alive[r] = ok ? 1 : 0;
      if (--g->left == 0) g->done.cancel();
    });
  }
  if (g->left > 0) {
    boost::system::error_code ignored;
    co_await g->done.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
  std::vector<int> lost;
  for (int r = 0; r < n; ++r)
    if (r != me && !g->alive[r]) lost.push_back(r);
  co_return lost;
}

// ---- shrink -----------------------------------------------------------------------------------

struct Request {
  int rank = -1;
  std::uint64_t attempt = 0;
  std::vector<int> exclude;
  Peers::RecoveryRequest wire;
};

std::vector<std::uint8_t> reply(errc code, const std::string& why, const UniqueId& id, int m) {
  Writer w;
  w.put<std::uint32_t>(static_cast<std::uint32_t>(code));
  w.put_bytes({reinterpret_cast<const std::uint8_t*>(why.data()), why.size()});
  w.put(id.bytes).put<std::int32_t>(m);
  return std::move(w.bytes());
}

asio::awaitable<void> answer(Peers::RecoveryRequest wire, std::vector<std::uint8_t> payload) {
  try {
    runtime::CloseAfter guard(*wire.socket, runtime::default_timeout());
    co_await transport::write_frame(*wire.socket, *wire.channel, FrameType::recover, payload);
  } catch (const std::exception&) {
    // That survivor gave up waiting; its own shrink fails by its deadline.
  }
}

// The lowest survivor: collects the others' requests, checks them, answers all.
asio::awaitable<ShrinkPlan> gather(std::shared_ptr<CommImpl> impl, std::vector<int> exclude,
                                   std::vector<int> members, std::uint64_t attempt) {
  Peers& peers = impl->peers();
  const int n = impl->size(), me = impl->rank();
  const int m = static_cast<int>(members.size());
  const auto until = std::chrono::steady_clock::now() + runtime::default_timeout();
  std::map<int, Request> came;
  std::vector<std::string> problems;
  // A rank this one excludes may come too (its list differs): it is answered, not waited for.
  auto missing = [&] {
    std::vector<int> out;
    for (int r : members)
      if (r != me && !came.count(r)) out.push_back(r);
    return out;
  };
  while (!missing().empty()) {
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) break;
    Peers::RecoveryRequest wire;
    try {
      wire = co_await peers.recovery_requests().pop(left);
    } catch (const boost::system::system_error&) {
      break;  // the deadline
    }
    Request q;
    try {
      Reader r(wire.payload);
      r.get<std::uint8_t>();
      q.rank = r.get<std::int32_t>();
      const int their_n = r.get<std::int32_t>();
      q.attempt = r.get<std::uint64_t>();
      const auto k = r.get<std::uint32_t>();
      if (k > static_cast<std::uint32_t>(n) || their_n != n || q.rank < 0 || q.rank >= n ||
          q.rank == me)
        throw std::system_error(make_error_code(errc::bad_message), "bad shrink request");
      for (std::uint32_t i = 0; i < k; ++i) q.exclude.push_back(r.get<std::int32_t>());
      if (!r.done())
        throw std::system_error(make_error_code(errc::bad_message), "bad shrink request");
    } catch (const std::system_error& e) {
      COCCL_WARN(coll, me, "shrink: dropped a malformed request: %s", e.what());
      continue;
    }
    q.wire = std::move(wire);
    if (q.attempt < attempt) {
      // Left over from an earlier try of that survivor, which has given up on it.
      co_await answer(std::move(q.wire),
                      reply(errc::timed_out, "a stale shrink request", UniqueId{}, 0));
      continue;
    }
    if (came.count(q.rank)) {
      co_await answer(
          std::move(q.wire),
          reply(errc::mismatch, "a second shrink request from this rank", UniqueId{}, 0));
      continue;
    }
    if (q.attempt != attempt)
      problems.push_back("rank " + std::to_string(q.rank) + " is at shrink attempt " +
                         std::to_string(q.attempt) + ", rank " + std::to_string(me) + " at " +
                         std::to_string(attempt));
    else if (q.exclude != exclude)
      problems.push_back("rank " + std::to_string(q.rank) + " excludes " + list_text(q.exclude) +
                         ", rank " + std::to_string(me) + " excludes " + list_text(exclude));
    came.emplace(q.rank, std::move(q));
  }
  errc code{};
  std::string why;
  if (!problems.empty()) {
    code = errc::mismatch;
    why = "shrink: the survivors disagree: ";
    for (std::size_t i = 0; i < problems.size(); ++i) {
      if (i) why += "; ";
      why += problems[i];
    }
  } else if (auto absent = missing(); !absent.empty()) {
    code = errc::timed_out;
    why = "shrink: " + ranks_text(absent) + " did not come to rank " + std::to_string(me) +
          " within COCCL_TIMEOUT (exclude " + (absent.size() == 1 ? "it" : "them") +
          " too if lost, or check that every survivor passes the same list)";
  }
  UniqueId id{};
  if (code == errc{}) id = UniqueId::create();
  for (auto& [rank, q] : came) co_await answer(std::move(q.wire), reply(code, why, id, m));
  if (code != errc{}) throw std::system_error(make_error_code(code), why);
  co_return ShrinkPlan{id, 0, m};
}

// Any other survivor: asks the lowest one.
asio::awaitable<ShrinkPlan> ask(std::shared_ptr<CommImpl> impl, std::vector<int> exclude,
                                std::vector<int> members, std::uint64_t attempt) {
  Peers& peers = impl->peers();
  const int me = impl->rank();
  const int leader = members.front();
  const auto limit = runtime::default_timeout();
  std::shared_ptr<transport::Stream> sock;
  try {
    const auto until = std::chrono::steady_clock::now() + limit;
    const transport::PeerInfo where = co_await peers.locate(leader, until);
    sock = co_await transport::dial(impl->executor(), where, until);
  } catch (const std::system_error& e) {
    throw std::system_error(make_error_code(errc::timed_out),
                            "shrink: cannot reach rank " + std::to_string(leader) +
                                ", the lowest rank not excluded, which gathers the survivors (" +
                                e.what() + "); exclude it too if it is lost");
  }
  Writer w;
  w.put<std::uint8_t>(Peers::recover_shrink).put<std::int32_t>(me).put<std::int32_t>(impl->size());
  w.put<std::uint64_t>(attempt).put<std::uint32_t>(static_cast<std::uint32_t>(exclude.size()));
  for (int r : exclude) w.put<std::int32_t>(r);
  Frame f;
  // The gathering rank may start up to one timeout after this one and then waits one timeout.
  runtime::CloseAfter guard(*sock, 2 * limit + std::chrono::seconds(1));
  try {
    Channel channel = co_await Channel::initiate(*sock, peers.secret());
    co_await transport::write_frame(*sock, channel, FrameType::recover, w.bytes());
    f = co_await transport::read_frame(*sock, channel, max_recovery_frame);
  } catch (const std::exception& e) {
    throw std::system_error(make_error_code(guard.fired() ? errc::timed_out : errc::peer_lost),
                            "shrink: no answer from rank " + std::to_string(leader) +
                                ", which gathers the survivors (" + e.what() + ")");
  }
  Reader r(f.payload);
  const auto code = static_cast<errc>(r.get<std::uint32_t>());
  const auto why_bytes = r.get_bytes();
  ShrinkPlan plan;
  plan.id.bytes = r.get<decltype(plan.id.bytes)>();
  plan.nranks = r.get<std::int32_t>();
  if (f.type != FrameType::recover || !r.done())
    throw std::system_error(make_error_code(errc::bad_message), "shrink: a malformed answer");
  if (code != errc{})
    throw std::system_error(
        make_error_code(code),
        "rank " + std::to_string(leader) + ": " + std::string(why_bytes.begin(), why_bytes.end()));
  if (plan.nranks != static_cast<int>(members.size()))
    throw std::system_error(make_error_code(errc::mismatch),
                            "shrink: rank " + std::to_string(leader) + " formed " +
                                std::to_string(plan.nranks) + " ranks, this rank expected " +
                                std::to_string(members.size()));
  plan.rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  co_return plan;
}

asio::awaitable<ShrinkPlan> meet(std::shared_ptr<CommImpl> impl, std::vector<int> exclude) {
  std::vector<int> members;
  for (int r = 0; r < impl->size(); ++r)
    if (!std::binary_search(exclude.begin(), exclude.end(), r)) members.push_back(r);
  const std::uint64_t attempt = impl->peers().begin_shrink();
  if (attempt == 0) invalid("shrink: another shrink of this communicator is still running here");
  struct End {
    Peers& peers;
    ~End() { peers.end_shrink(); }
  } end{impl->peers()};
  if (members.front() == impl->rank()) co_return co_await gather(impl, exclude, members, attempt);
  co_return co_await ask(impl, exclude, members, attempt);
}

// Runs the meeting on the parent's proxy thread; `done` gets the plan or the error and its text.
template <typename Done>
void plan_shrink(const std::shared_ptr<CommImpl>& impl, std::vector<int> exclude, Done done) {
  asio::co_spawn(impl->executor(), meet(impl, std::move(exclude)),
                 [done = std::move(done)](std::exception_ptr ep, ShrinkPlan plan) mutable {
                   std::error_code ec;
                   std::string why;
                   if (ep) {
                     try {
                       std::rethrow_exception(ep);
                     } catch (const std::system_error& e) {
                       ec = e.code();
                       why = e.what();
                     } catch (const std::exception& e) {
                       ec = make_error_code(errc::internal);
                       why = e.what();
                     }
                   }
                   done(ec, std::move(why), plan);
                 });
}

}  // namespace

void submit_shrink(const std::shared_ptr<CommImpl>& impl, std::vector<int> exclude,
                   CreateHandler handler) {
  std::vector<int> checked;
  try {
    if (!impl) invalid("shrink on an empty communicator");
    checked = checked_exclude(exclude, impl->rank(), impl->size());
  } catch (const std::system_error& e) {
    COCCL_WARN(coll, impl ? impl->rank() : -1, "%s", e.what());
    runtime::complete_later(runtime::Engine::instance()->thread(0).executor(), std::move(handler),
                            e.code(), Communicator());
    return;
  }
  auto box = std::make_shared<CreateHandler>(std::move(handler));
  const int me = impl->rank();
  plan_shrink(
      impl, std::move(checked),
      [box, me, ex = impl->executor()](std::error_code ec, std::string why, ShrinkPlan plan) {
        if (ec) {
          COCCL_WARN(coll, me, "%s", why.c_str());
          runtime::complete_later(ex, std::move(*box), ec, Communicator());
          return;
        }
        // Joining builds the new communicator on a proxy thread and waits for that, which
        // this proxy thread must not do: join from the system pool instead.
        asio::post(asio::system_executor(), [box, plan] {
          initiate_create(std::vector<UniqueId>{plan.id}, plan.rank, plan.nranks,
                          CommunicatorOptions{}, std::move(*box));
        });
      });
}

}  // namespace detail

std::vector<int> Communicator::lost_ranks() {
  if (!impl_) detail::invalid("lost_ranks on an empty communicator");
  if (runtime::on_proxy_thread())
    throw std::system_error(std::make_error_code(std::errc::resource_deadlock_would_occur),
                            "lost_ranks() blocks; it cannot run on a proxy thread");
  std::promise<std::vector<int>> found;
  asio::co_spawn(impl_->executor(), detail::probe_all(impl_),
                 [&found](std::exception_ptr ep, std::vector<int> lost) {
                   if (ep)
                     found.set_exception(ep);
                   else
                     found.set_value(std::move(lost));
                 });
  return found.get_future().get();
}

Communicator Communicator::shrink(std::span<const int> exclude, boost::system::error_code& ec) {
  ec.clear();
  try {
    return shrink(exclude);
  } catch (const std::system_error& e) {
    COCCL_WARN(coll, impl_ ? impl_->rank() : -1, "%s", e.what());
    ec = e.code();
    return Communicator();
  }
}

Communicator Communicator::shrink(std::span<const int> exclude) {
  if (!impl_) detail::invalid("shrink on an empty communicator");
  if (runtime::on_proxy_thread())
    throw std::system_error(std::make_error_code(std::errc::resource_deadlock_would_occur),
                            "shrink() blocks; co_await async_shrink on a proxy thread");
  auto checked = detail::checked_exclude(exclude, impl_->rank(), impl_->size());
  struct Result {
    std::error_code ec;
    std::string why;
    detail::ShrinkPlan plan;
  };
  std::promise<Result> met;
  detail::plan_shrink(impl_, std::move(checked),
                      [&met](std::error_code ec, std::string why, detail::ShrinkPlan plan) {
                        met.set_value(Result{ec, std::move(why), plan});
                      });
  Result r = met.get_future().get();
  if (r.ec) throw std::system_error(r.ec, r.why);
  return create(r.plan.id, r.plan.rank, r.plan.nranks);
}

UniqueId Communicator::grow_id() {
  if (!impl_) detail::invalid("grow_id on an empty communicator");
  UniqueId id{};
  if (rank() == 0) id = UniqueId::create();
  broadcast(id.bytes.data(), id.bytes.data(), id.bytes.size(), DataType::uint8, 0);
  return id;
}

Communicator Communicator::grow(const UniqueId& id, int new_nranks) {
  if (!impl_) detail::invalid("grow on an empty communicator");
  if (new_nranks < size())
    detail::invalid("grow: " + std::to_string(new_nranks) + " ranks is fewer than this " +
                    "communicator's " + std::to_string(size()));
  return create(id, rank(), new_nranks);
}

}  // namespace coccl
