#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <coccl/error.hpp>
#include <coccl/status.hpp>
#include <cstdio>
#include <map>
#include <system_error>

#include "collectives/status_codec.hpp"
#include "transport/bootstrap.hpp"
#include "transport/wire.hpp"

namespace coccl {

namespace asio = boost::asio;

namespace {
// Why a rank of a job made from several ids is not asked: the id's root sees only its share, and
// holds the addresses of only the ranks its share keeps (transport/directory.hpp).
constexpr const char* other_share = "in another id's share: ask that id's root";
}  // namespace

const char* to_string(TraceEntry::State state) noexcept {
  switch (state) {
    case TraceEntry::State::enqueued:
      return "enqueued";
    case TraceEntry::State::started:
      return "started";
    case TraceEntry::State::done:
      return "done";
    case TraceEntry::State::failed:
      return "failed";
    case TraceEntry::State::captured:
      return "captured";
  }
  return "unknown";
}

namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

std::string ranks_word(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + list(ranks);
}

std::string seconds(std::uint64_t us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(us) / 1e6);
  return buf;
}

}  // namespace

std::string CommStatus::json() const {
  std::string out =
      "{\"rank\":" + std::to_string(rank) + ",\"nranks\":" + std::to_string(nranks) +
      ",\"pid\":" + std::to_string(pid) + ",\"name\":" + quoted(name) +
      ",\"error\":" + quoted(error) + ",\"started\":" + std::to_string(started) +
      ",\"finished\":" + std::to_string(finished) + ",\"running_op\":" + quoted(running_op) +
      ",\"running_us\":" + std::to_string(running_us) +
      ",\"waiting_for\":" + std::to_string(waiting_for) +
      ",\"waiting_us\":" + std::to_string(waiting_us) + ",\"queued\":" + std::to_string(queued) +
      ",\"fast_ops\":" + std::to_string(fast_ops) +
      ",\"fast_handed_over\":" + std::to_string(fast_handed_over) +
      ",\"links_open\":" + std::to_string(links_open) +
      ",\"links_opened\":" + std::to_string(links_opened) +
      ",\"links_closed_budget\":" + std::to_string(links_closed_budget) +
      ",\"links_closed_idle\":" + std::to_string(links_closed_idle) +
      ",\"ring_bytes\":" + std::to_string(ring_bytes) +
      ",\"mem_budget\":" + std::to_string(mem_budget) + ",\"trace\":[";
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const TraceEntry& e = trace[i];
    out += (i ? ",{" : "{");
    out += "\"seq\":" + std::to_string(e.seq) + ",\"device\":" + (e.device ? "true" : "false") +
           ",\"op\":" + quoted(e.op) + ",\"count\":" + std::to_string(e.count) +
           ",\"type\":" + std::to_string(e.type) + ",\"root\":" + std::to_string(e.root) +
           ",\"state\":\"" + to_string(e.state) + "\",\"us\":" + std::to_string(e.us) + "}";
  }
  return out + "]}";
}

std::string JobStatus::verdict() const {
  if (nranks == 0) return "no rank has reached the bootstrap root yet";
  std::vector<int> silent, failed;
  for (int r = 0; r < nranks; ++r) {
    if (!ranks[r] && why[r] == other_share) continue;
    if (!ranks[r])
      silent.push_back(r);
    else if (!ranks[r]->error.empty())
      failed.push_back(r);
  }
  if (arrived < nranks) {
    std::vector<int> absent;
    for (int r = 0; r < nranks; ++r)
      if (why[r] == "never reached the bootstrap root") absent.push_back(r);
    return "the communicator has not formed: " + ranks_word(absent) +
           (absent.size() == 1 ? " has" : " have") + " not reached the bootstrap root (" +
           std::to_string(arrived) + " of " + std::to_string(nranks) + " arrived)";
  }
  // Who waits for whom, among the ranks that answered.
  std::map<int, std::vector<int>> waiters;
  for (int r = 0; r < nranks; ++r)
    if (ranks[r] && ranks[r]->waiting_for >= 0) waiters[ranks[r]->waiting_for].push_back(r);
  auto waited_in = [&](int peer) {
    const CommStatus& w = *ranks[waiters[peer].front()];
    return w.running_op + " #" + std::to_string(w.started);
  };
  if (!silent.empty()) {
    std::string out = ranks_word(silent) + (silent.size() == 1 ? " does" : " do") +
                      " not answer (" + why[silent.front()] +
                      "): stopped, hung in a system call, or dead";
    for (int s : silent)
      if (waiters.count(s))
        out += "; " + ranks_word(waiters[s]) + " wait for rank " + std::to_string(s) + " in " +
               waited_in(s);
    return out;
  }
  if (!failed.empty()) {
    if (failed.size() == static_cast<std::size_t>(nranks))
      return "every rank has failed; rank " + std::to_string(failed.front()) + ": " +
             ranks[failed.front()]->error;
    return ranks_word(failed) + (failed.size() == 1 ? " has" : " have") + " failed; rank " +
           std::to_string(failed.front()) + ": " + ranks[failed.front()]->error;
  }
  // Everyone answered and is healthy: the rank that has not started what the others run.
  std::uint64_t newest = 0;
  for (int r = 0; r < nranks; ++r) newest = std::max(newest, ranks[r]->started);
  std::vector<int> behind;
  for (int r = 0; r < nranks; ++r)
    if (ranks[r]->started < newest && ranks[r]->started == ranks[r]->finished) behind.push_back(r);
  if (!behind.empty()) {
    const CommStatus& ahead = **std::find_if(ranks.begin(), ranks.end(),
                                             [&](const auto& s) { return s->started == newest; });
    const std::string what =
        (ahead.running_op.empty() ? std::string("operation") : ahead.running_op) + " #" +
        std::to_string(newest);
    return ranks_word(behind) + (behind.size() == 1 ? " has" : " have") + " not started " + what +
           " (last finished #" + std::to_string(ranks[behind.front()]->finished) +
           "), which the other ranks have";
  }
  // All in the same operation: the longest wait, if any.
  int worst = -1;
  for (int r = 0; r < nranks; ++r)
    if (ranks[r]->waiting_for >= 0 &&
        (worst < 0 || ranks[r]->waiting_us > ranks[worst]->waiting_us))
      worst = r;
  if (worst >= 0)
    return "rank " + std::to_string(worst) + " has waited " + seconds(ranks[worst]->waiting_us) +
           " for rank " + std::to_string(ranks[worst]->waiting_for) + " in " +
           ranks[worst]->running_op + " #" + std::to_string(ranks[worst]->started);
  bool idle = true;
  for (int r = 0; r < nranks; ++r) idle = idle && ranks[r]->started == ranks[r]->finished;
  if (idle)
    return "all " + std::to_string(nranks) + " ranks are idle after operation #" +
           std::to_string(newest);
  return "all " + std::to_string(nranks) + " ranks run operation #" + std::to_string(newest) +
         ", none waiting";
}

JobStatus query_job(const UniqueId& id, std::chrono::milliseconds wait) {
  const transport::RootAddress root = transport::decode(id);
  const auto until = std::chrono::steady_clock::now() + wait;
  char waited[64];
  std::snprintf(waited, sizeof waited, "no answer within %.2f s",
                std::chrono::duration<double>(wait).count());
  JobStatus job;
  std::exception_ptr root_error;
  asio::io_context io;
  auto ask_rank = [&](int r, transport::PeerInfo peer) -> asio::awaitable<void> {
    try {
      auto bytes = co_await transport::query_rank(io.get_executor(), peer, root.secret, until);
      if (bytes.empty())
        job.why[r] = "has not joined yet";
      else if (auto s = detail::decode_status(bytes); s.rank != r || s.nranks != job.nranks)
        job.why[r] = "answered as rank " + std::to_string(s.rank) + " of " +
                     std::to_string(s.nranks) + " (another communicator at that address)";
      else
        job.ranks[r] = std::move(s);
    } catch (const std::system_error& e) {
      job.why[r] = e.code() == errc::timed_out ? std::string(waited) : std::string(e.what());
    } catch (const std::exception& e) {
      job.why[r] = e.what();
    }
  };
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        transport::RootView view = co_await transport::query_root(io.get_executor(), root, until);
        job.nranks = view.nranks;
        // A root of several (ncclCommInitRankScalable) sees its share; once formed, every other
        // share has arrived at its own root too.
        const int others = view.nranks - (view.last - view.first);
        job.arrived = view.arrived + (view.formed ? others : 0);
        job.ranks.resize(view.nranks);
        job.why.assign(view.nranks, std::string());
        for (int r = 0; r < view.nranks; ++r) {
          if (r < view.first || r >= view.last) {
            job.why[r] = other_share;
            continue;
          }
          if (!view.seen(r)) {
            job.why[r] = "never reached the bootstrap root";
            continue;
          }
          asio::co_spawn(io, ask_rank(r, view.listener(r)), asio::detached);
        }
      },
      [&](std::exception_ptr e) { root_error = e; });
  // Every dial and read is bounded by `until` (the sockets close then); the margin lets them end.
  io.run_for(wait + std::chrono::milliseconds(500));
  if (root_error) {
    try {
      std::rethrow_exception(root_error);
    } catch (const std::system_error& e) {
      throw std::system_error(e.code(), std::string("bootstrap root: ") + e.what());
    } catch (const boost::system::system_error& e) {
      throw std::system_error(make_error_code(errc::peer_lost),
                              std::string("bootstrap root: ") + e.what());
    }
  }
  for (int r = 0; r < job.nranks; ++r)
    if (!job.ranks[r] && job.why[r].empty()) job.why[r] = waited;
  return job;
}

namespace detail {

std::vector<std::uint8_t> encode_status(const CommStatus& s) {
  transport::Writer w;
  auto str = [&](const std::string& t) {
    w.put_bytes(std::span(reinterpret_cast<const std::uint8_t*>(t.data()), t.size()));
  };
  w.put<std::uint32_t>(0x53544154u);  // "TATS"
  w.put<std::int32_t>(s.rank).put<std::int32_t>(s.nranks).put<std::int32_t>(s.pid);
  str(s.name);
  str(s.error);
  w.put(s.started).put(s.finished);
  str(s.running_op);
  w.put(s.running_us).put<std::int32_t>(s.waiting_for).put(s.waiting_us).put(s.queued);
  w.put(s.fast_ops).put(s.fast_handed_over);
  w.put<std::int32_t>(s.links_open).put(s.links_opened).put(s.links_closed_budget);
  w.put(s.links_closed_idle).put(s.ring_bytes).put(s.mem_budget);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(s.trace.size()));
  for (const TraceEntry& e : s.trace) {
    w.put(e.seq).put<std::uint8_t>(e.device ? 1 : 0);
    str(e.op);
    w.put(e.count).put<std::int32_t>(e.type).put<std::int32_t>(e.root);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(e.state)).put(e.us);
  }
  return std::move(w.bytes());
}

CommStatus decode_status(std::span<const std::uint8_t> bytes) {
  auto bad = [](const char* what) {
    throw std::system_error(make_error_code(errc::bad_message), what);
  };
  transport::Reader r(bytes);
  auto str = [&] {
    auto b = r.get_bytes();
    return std::string(b.begin(), b.end());
  };
  if (r.get<std::uint32_t>() != 0x53544154u) bad("not a rank's status answer");
  CommStatus s;
  s.rank = r.get<std::int32_t>();
  s.nranks = r.get<std::int32_t>();
  s.pid = r.get<std::int32_t>();
  s.name = str();
  s.error = str();
  s.started = r.get<std::uint64_t>();
  s.finished = r.get<std::uint64_t>();
  s.running_op = str();
  s.running_us = r.get<std::uint64_t>();
  s.waiting_for = r.get<std::int32_t>();
  s.waiting_us = r.get<std::uint64_t>();
  s.queued = r.get<std::uint64_t>();
  s.fast_ops = r.get<std::uint64_t>();
  s.fast_handed_over = r.get<std::uint64_t>();
  s.links_open = r.get<std::int32_t>();
  s.links_opened = r.get<std::uint64_t>();
  s.links_closed_budget = r.get<std::uint64_t>();
  s.links_closed_idle = r.get<std::uint64_t>();
  s.ring_bytes = r.get<std::uint64_t>();
  s.mem_budget = r.get<std::uint64_t>();
  const auto n = r.get<std::uint32_t>();
  // An entry takes at least 35 bytes: a count the answer cannot hold is refused up front.
  if (n > bytes.size() / 35) bad("status answer with an impossible number of entries");
  s.trace.resize(n);
  for (TraceEntry& e : s.trace) {
    e.seq = r.get<std::uint64_t>();
    e.device = r.get<std::uint8_t>() != 0;
    e.op = str();
    e.count = r.get<std::uint64_t>();
    e.type = r.get<std::int32_t>();
    e.root = r.get<std::int32_t>();
    const auto state = r.get<std::uint8_t>();
    if (state > static_cast<std::uint8_t>(TraceEntry::State::captured)) bad("unknown state");
    e.state = static_cast<TraceEntry::State>(state);
    e.us = r.get<std::uint64_t>();
  }
  if (!r.done()) bad("trailing bytes after a rank's status answer");
  if (s.nranks <= 0 || s.rank < 0 || s.rank >= s.nranks || s.waiting_for < -1 ||
      s.waiting_for >= s.nranks)
    bad("status answer with an impossible rank");
  return s;
}

}  // namespace detail
}  // namespace coccl
