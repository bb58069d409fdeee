#include "transport/peers.hpp"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <coccl/error.hpp>
#include <cstring>
#include <optional>
#include <tuple>

#include "runtime/log.hpp"
#include "transport/admission.hpp"
#include "transport/tcp.hpp"
#include "transport/tcp_uring.hpp"

namespace coccl::params {

config::Param<bool> shm_disable{"COCCL_SHM_DISABLE", false, "never use the shared-memory transport",
                                "NCCL_SHM_DISABLE"};
config::Param<std::int64_t> mem_budget{
    "COCCL_MEM_BUDGET", std::int64_t{1} << 30,
    "bytes of receive rings the links of one communicator may hold (0: no limit); a link that "
    "would exceed it first closes the least recently used idle link, and an operation fails when "
    "none can be closed"};
config::Param<double> link_idle_s{
    "COCCL_LINK_IDLE_S", 0.0,
    "seconds after which a link no operation used is closed (both ends agree; the next "
    "operation that needs it opens it again); 0: never"};

}  // namespace coccl::params

namespace coccl::transport {

namespace {

using tcp = asio::ip::tcp;

// What ask_about says of a rank that answers but has not formed the communicator (it has no
// address table yet).
constexpr const char* not_formed = "has not formed the communicator";

}  // namespace

Peers::Peers(runtime::ProxyThread& thread, const Secret& secret, int rank, int nranks,
             LinkOptions options, FailureHandler on_failure)
    : thread_(thread),
      ex_(thread.executor()),
      secret_(secret),
      rank_(rank),
      nranks_(nranks),
      options_(std::move(options)),
      traffic_(!options_.memory   ? nullptr
               : options_.traffic ? options_.traffic
                                  : std::make_shared<Traffic>()),
      on_failure_(std::move(on_failure)),
      acceptor_(ex_),
      drops_(rank, "listener"),
      accept_retry_(ex_),
      table_ready_(ex_, runtime::default_timeout()),
      recovery_box_(ex_),
      budget_(static_cast<std::size_t>(std::max<std::int64_t>(0, params::mem_budget.get()))),
      idle_timer_(ex_) {
  stats_.budget = budget_;
  const double idle_s = params::link_idle_s.get();
  if (idle_s > 0)
    idle_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::min(idle_s, 1e6)));
  // A bad COCCL_TCP_ENGINE, or uring forced where the kernel refuses it, fails here; the choice
  // is logged once.
  if (options_.memory) {
    acceptor_.listen_memory(traffic_);
  } else {
    if (options_.transport == "tcp" || options_.transport == "auto") tcp_engine(rank);
    boost::system::error_code ec;
    acceptor_.listen(tcp::endpoint(local_addresses().front(), 0), false, ec);
    if (ec) throw boost::system::system_error(ec);
  }
  // Before any poller is registered: a constructor that throws runs no destructor to remove it.
  if (!options_.memory) ib_device_ = ib_device_for(options_.transport);
  user_buffers_ = make_user_buffers(ib_device_);
  env_.thread = &thread_;
  env_.rank = rank_;
  env_.slot_bytes = options_.slot_bytes;
  env_.poller = &poller_;
  env_.ib_poller = &ib_poller_;
  env_.ib_device = ib_device_;
  env_.user_buffers = user_buffers_;
  env_.on_failure = on_failure_;
  env_.memory = options_.memory;
  thread_.add_poller(&poller_);
  if (ib_device_) thread_.add_poller(&ib_poller_);
  accept_loop();
  if (idle_.count() > 0) arm_idle_timer();
}

Peers::~Peers() {
  leave_root();
  if (leader_) leader_->stop();
  gate_.close();
  thread_.remove_poller(&poller_);
  thread_.remove_poller(&ib_poller_);
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

PeerInfo Peers::self_info() const {
  PeerInfo info = acceptor_.local_info();
  if (traffic_ && traffic_->host() != 0) info.host_hash = traffic_->host();
  if (ib_device_) info.caps |= PeerInfo::cap_ib;
  return info;
}

void Peers::accept_loop() {
  // The loop outlives shutdown(): status queries are answered, and survivors of a failure
  // probe and shrink through here (handle_incoming).
  // Beyond COCCL_BOOTSTRAP_PENDING_MAX unauthenticated connections, the next waits in the
  // kernel's backlog (admission.hpp).
  admission_.when_room(ex_, [this, pass = gate_.enter()] {
    if (!pass.open()) return;
    acceptor_.async_accept(
        [this, pass = gate_.enter()](boost::system::error_code ec, Stream accepted) {
          if (!pass.open()) return;
          if (ec) {
            accept_failed(ec);
            return;
          }
          auto s = std::make_shared<Stream>(std::move(accepted));
          auto ticket = admission_.admit(s);
          asio::co_spawn(ex_, handle_incoming(s, std::move(ticket)), asio::detached);
          accept_loop();
        });
  });
}

void Peers::accept_failed(boost::system::error_code ec) {
  // An accept error ends nothing: peers still have to reach this rank.
  auto delay = accept_retry_delay(ec);
  if (delay.count() == 0) return;
  drops_.dropped("accept failed: " + ec.message());
  // Out of descriptors: a stranger still waiting to authenticate is the one to give up.
  if (out_of_resources(ec)) admission_.evict_oldest();
  accept_retry_.expires_after(delay);
  accept_retry_.async_wait([this, pass = gate_.enter()](boost::system::error_code e) {
    if (!e && pass.open()) accept_loop();
  });
}

asio::awaitable<void> Peers::handle_incoming(std::shared_ptr<Stream> s, Admission::Ticket ticket) {
  auto pass = gate_.enter();
  Frame f;
  std::shared_ptr<Channel> channel;
  try {
    // Until its first frame authenticates, the connection holds its place in admission_ (bounded
    // in number) and has auth_timeout() to earn it.
    runtime::CloseAfter guard(*s, auth_timeout());
    channel = std::make_shared<Channel>(co_await Channel::respond(*s, secret_));
    ticket.answered();
    f = co_await read_frame(*s, *channel, max_table_frame);
    ticket.release();
  } catch (const std::exception& e) {
    if (pass.open() && !shut_) drops_.dropped(drop_reason(e));
    co_return;
  }
  if (!pass.open()) co_return;
  if (f.type == FrameType::recover) {
    co_await serve_recovery(s, channel, std::move(f));
    co_return;
  }
  if (f.type == FrameType::status_query) {
    try {
      if (!f.payload.empty()) bad_message("a status query carries nothing");
      auto answer = status_source_ ? status_source_() : std::vector<std::uint8_t>{};
      runtime::CloseAfter guard(*s, auth_timeout());
      co_await write_frame(*s, *channel, FrameType::status, answer);
    } catch (const std::exception& e) {
      if (pass.open() && !shut_) drops_.dropped(drop_reason(e));
    }
    co_return;
  }
  if (f.type == FrameType::notice) {
    // A peer that failed before it could reach this rank through a link tells why.
    try {
      const std::string why = decode_notice(f.payload);
      if (!shut_) on_failure_(-1, make_error_code(errc::remote_error), why);
    } catch (const std::exception& e) {
      if (pass.open() && !shut_) drops_.dropped(drop_reason(e));
    }
    co_return;
  }
  // After shutdown the listener answers status queries, and a peer's connection request with why
  // this rank has failed (the peer then fails naming the cause, at once rather than at its
  // deadline).
  if (shut_) {
    if (f.type != FrameType::connect) co_return;
    try {
      runtime::CloseAfter guard(*s, auth_timeout());
      auto payload = encode_notice(rank_, shut_why_);
      co_await write_frame(*s, *channel, FrameType::notice, payload);
    } catch (const std::exception&) {
    }
    co_return;
  }
  if (f.type == FrameType::close) {
    co_await serve_close(s, channel, std::move(f));
    co_return;
  }
  if (f.type == FrameType::whois) {
    co_await serve_whois(s, channel, std::move(f));
    co_return;
  }
  if (f.type == FrameType::stripe) {
    // A further socket of a tcp link this rank is answering: hand it to that answer.
    try {
      Reader r(f.payload);
      int from = r.get<std::int32_t>();
      int to = r.get<std::int32_t>();
      auto index = r.get<std::uint32_t>();
      auto it = peer_state_.find(from);
      if (to != rank_ || from < 0 || from >= rank_ || it == peer_state_.end() ||
          !it->second.stripes)
        bad_message("a stray socket for a tcp link");
      it->second.stripes->push(Stripe{index, s});
    } catch (const std::exception& e) {
      drops_.dropped(e.what());
    }
    co_return;
  }
  int from = -1;
  try {
    if (f.type != FrameType::connect) bad_message("unexpected frame");
    int to;
    std::tie(from, to) = link_request_ranks(f.payload);
    if (to != rank_ || from < 0 || from >= rank_)
      bad_message("connection request for the wrong rank");
  } catch (const std::exception& e) {
    drops_.dropped(e.what());
    co_return;
  }
  // The peer agreed to close the link this rank asked about and may dial again before the answer
  // is read here: the close settles first.
  co_await await_close(from);
  if (!pass.open() || shut_) co_return;
  try {
    if (by_peer_[from] || at(from).dialing)
      bad_message("a second connection request from rank " + std::to_string(from));
  } catch (const std::exception& e) {
    drops_.dropped(e.what());
    co_return;
  }
  at(from).dialing = true;
  try {
    co_await answer(from, s, channel, std::move(f.payload));
  } catch (const std::exception& e) {
    if (!pass.open()) co_return;
    at(from).stripes.reset();
    at(from).failed = e.what();
    COCCL_WARN(net, rank_, "connection from rank %d failed: %s", from, e.what());
  }
  if (!pass.open()) co_return;
  at(from).dialing = false;
  announce(from);
}

asio::awaitable<void> Peers::serve_recovery(std::shared_ptr<Stream> s,
                                            std::shared_ptr<Channel> channel, Frame f) {
  if (f.payload.empty()) {
    drops_.dropped("an empty recovery frame");
    co_return;
  }
  if (f.payload[0] == recover_shrink) {
    // Each survivor sends one per attempt; a bound keeps a confused member from holding sockets
    // here without end (at most two attempts' worth wait for this rank's shrink).
    if (recovery_box_.size() >= 2 * static_cast<std::size_t>(nranks_)) {
      drops_.dropped("too many shrink requests queued");
      co_return;
    }
    recovery_box_.push(RecoveryRequest{std::move(s), std::move(channel), std::move(f.payload)});
    co_return;
  }
  if (f.payload[0] != recover_probe) {
    drops_.dropped("an unknown recovery frame");
    co_return;
  }
  // The answer names this rank, so that a prober knows it reached the member it meant.
  Writer w;
  w.put<std::int32_t>(rank_);
  try {
    runtime::CloseAfter guard(*s, auth_timeout());
    co_await write_frame(*s, *channel, FrameType::recover, w.bytes());
  } catch (const std::exception&) {
    // The prober gave up; it counts this rank as lost on its own deadline.
  }
}

asio::awaitable<void> Peers::flush_notices(std::chrono::milliseconds most) {
  const auto until = std::chrono::steady_clock::now() + most;
  asio::steady_timer tick(ex_);
  while (std::chrono::steady_clock::now() < until &&
         (*telling_ > 0 || std::any_of(conns_.begin(), conns_.end(),
                                       [](const auto& c) { return c->notice_pending(); }))) {
    tick.expires_after(std::chrono::milliseconds(1));
    boost::system::error_code ignored;
    co_await tick.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
}

asio::awaitable<void> Peers::tell_everyone(std::string why) {
  // Bounded: small jobs hear it from this rank; in large ones the ranks in this rank's tree
  // neighbourhood do, and the rest time out on their own.
  std::vector<int> whom;
  // Only ranks whose address this rank holds: asking the way to others could take longer than
  // the second this has.
  auto add = [&](int r) {
    if (r >= 0 && r < nranks_ && r != rank_ && !by_peer_[r] && directory_.find(r))
      whom.push_back(r);
  };
  if (nranks_ <= 64) {
    for (int r = 0; r < nranks_; ++r) add(r);
  } else {
    for (int r : {(rank_ - 1) / 2, 2 * rank_ + 1, 2 * rank_ + 2}) add(r);
  }
  auto payload = std::make_shared<std::vector<std::uint8_t>>(encode_notice(rank_, why));
  auto left = std::make_shared<int>(static_cast<int>(whom.size()));
  // Shared: a notice still under way when the second is up completes after this returns.
  auto all_told = std::make_shared<asio::steady_timer>(ex_, std::chrono::seconds(1));
  for (int r : whom) {
    asio::co_spawn(
        ex_,
        [](asio::any_io_executor ex, PeerInfo peer, Secret secret,
           std::shared_ptr<std::vector<std::uint8_t>> bytes,
           std::shared_ptr<Traffic> traffic) -> asio::awaitable<void> {
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
          auto sock = co_await transport::dial(ex, peer, until, true, std::move(traffic));
          runtime::CloseAfter guard(*sock, std::chrono::seconds(1));
          Channel channel = co_await Channel::initiate(*sock, secret);
          co_await write_frame(*sock, channel, FrameType::notice, *bytes);
        }(ex_, *directory_.find(r), secret_, payload, traffic_),
        [left, all_told](std::exception_ptr) {
          if (--*left == 0) all_told->cancel();
        });
  }
  if (!whom.empty()) {
    boost::system::error_code ignored;
    co_await all_told->async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
}

asio::awaitable<std::string> Peers::ask_about(int peer, std::optional<PeerInfo> where) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  std::string lost;
  if (!where) {
    try {
      where = co_await locate(peer, until);
    } catch (const std::exception& e) {
      lost = e.what();
    }
  }
  if (!where) co_return "rank " + std::to_string(peer) + " cannot be found (" + lost + ")";
  co_return co_await describe_rank(ex_, peer, *where, secret_, status_reader_, until);
}

asio::awaitable<std::string> Peers::describe_rank(asio::any_io_executor ex, int peer,
                                                  PeerInfo where, Secret secret,
                                                  StatusReader reader,
                                                  std::chrono::steady_clock::time_point until) {
  std::vector<std::uint8_t> bytes;
  try {
    bytes = co_await query_rank(ex, where, secret, until);
  } catch (const std::exception&) {
    co_return "rank " + std::to_string(peer) + " does not answer (stopped, hung or gone)";
  }
  if (bytes.empty()) co_return "rank " + std::to_string(peer) + " " + not_formed;
  co_return "rank " + std::to_string(peer) +
      " reports: " + (reader ? reader(bytes) : std::string("a status"));
}

asio::awaitable<PeerInfo> Peers::locate(int peer, std::chrono::steady_clock::time_point until) {
  if (const PeerInfo* known = directory_.find(peer)) co_return *known;
  if (peer < 0 || peer >= nranks_ || !directory_.formed())
    throw std::system_error(make_error_code(errc::internal),
                            "no address of rank " + std::to_string(peer) + " to look up");
  // Each round asks one rank on the way; its answer is the target's entry, or the next ranks on
  // the way, one bit closer (directory.hpp). A rank that does not answer is passed over for the
  // next candidate of the same round.
  std::vector<int> candidates = next_hops(rank_, peer);
  std::string silent;
  for (int round = 0; round <= 32; ++round) {
    std::optional<std::vector<Located>> answer;
    for (int hop : candidates) {
      const PeerInfo* at_hop = directory_.find(hop);
      if (!at_hop) continue;
      try {
        const auto question = encode_whois(peer);
        auto sock = co_await transport::dial(ex_, *at_hop, until, true, traffic_);
        runtime::CloseAfter guard(*sock, std::max<std::chrono::steady_clock::duration>(
                                             until - std::chrono::steady_clock::now(), {}));
        Channel channel = co_await Channel::initiate(*sock, secret_);
        co_await write_frame(*sock, channel, FrameType::whois, question);
        Frame f = co_await read_frame(*sock, channel, max_small_frame);
        if (f.type != FrameType::whois) bad_message("expected an address answer");
        answer = decode_whois_answer(f.payload, nranks_);
      } catch (const std::exception& e) {
        if (!silent.empty()) silent += "; ";
        silent += "rank ";
        silent += std::to_string(hop);
        silent += ": ";
        silent += e.what();
        if (std::chrono::steady_clock::now() >= until) break;
        continue;
      }
      break;
    }
    if (!answer) break;
    candidates.clear();
    for (const auto& [rank, info] : *answer) {
      directory_.learn(rank, info);
      candidates.push_back(rank);
    }
    if (const PeerInfo* found = directory_.find(peer)) co_return *found;
  }
  throw std::system_error(make_error_code(errc::peer_lost),
                          "cannot find where rank " + std::to_string(peer) +
                              " listens: no rank on the way answered (" + silent + ")");
}

asio::awaitable<void> Peers::serve_whois(std::shared_ptr<Stream> s,
                                         std::shared_ptr<Channel> channel, Frame f) {
  auto pass = gate_.enter();
  try {
    const int target = decode_whois(f.payload, nranks_);
    if (!directory_.formed()) {
      // Asked by a rank that got its entries earlier: answer once this rank has its own.
      boost::system::error_code ignored;
      co_await table_ready_.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
      if (!pass.open()) co_return;
      if (!directory_.formed()) bad_message("asked for an address before this rank formed");
    }
    std::vector<Located> answer;
    if (const PeerInfo* known = directory_.find(target)) {
      answer.emplace_back(target, *known);
    } else {
      for (int hop : next_hops(rank_, target))
        if (const PeerInfo* at_hop = directory_.find(hop)) answer.emplace_back(hop, *at_hop);
    }
    if (answer.empty()) bad_message("no way toward rank " + std::to_string(target));
    runtime::CloseAfter guard(*s, auth_timeout());
    const auto bytes = encode_whois_answer(answer);
    co_await write_frame(*s, *channel, FrameType::whois, bytes);
  } catch (const std::exception& e) {
    if (pass.open() && !shut_) drops_.dropped(drop_reason(e));
  }
}

LinkKind Peers::kind_for(int peer) const {
  // On the in-memory network the stream is the wire: every rank is in this process, so shm and
  // ib would only measure this host.
  if (options_.memory) return LinkKind::tcp;
  if (options_.transport == "ib") return LinkKind::ib;
  if (options_.transport == "tcp") return LinkKind::tcp;
  // Both ends hold each other's entry here: the dialler located the peer, and the link request
  // carries the dialler's.
  const PeerInfo* theirs = directory_.find(peer);
  const PeerInfo* mine = directory_.find(rank_);
  if (!theirs || !mine) bad_message("no address entry for rank " + std::to_string(peer));
  const bool same_host = theirs->host_hash == mine->host_hash;
  // auto: across hosts ib when both ends offer it; within a host shm, which beats a loop through
  // the NIC.
  if (options_.transport == "auto" && !same_host &&
      (theirs->caps & mine->caps & PeerInfo::cap_ib) != 0)
    return LinkKind::ib;
  if (params::shm_disable.get()) return LinkKind::tcp;
  return same_host ? LinkKind::shm : LinkKind::tcp;
}

void Peers::announce(int peer) {
  if (auto pending = std::exchange(at(peer).pending, nullptr)) pending->cancel();
}

Connection* Peers::ready(int peer, std::chrono::steady_clock::time_point now) noexcept {
  // Only open links are indexed, never one to this rank itself or out of range.
  const LinkIndex::Entry* e = by_peer_.find(peer);
  if (!e) return nullptr;
  PeerState& state = *e->state;
  if (state.closing && state.close_done) return nullptr;
  state.last_used = now;
  if (users_ > 0) state.held = period_;
  return e->link;
}

asio::awaitable<Connection*> Peers::get(int peer, std::size_t bytes) {
  if (peer < 0 || peer >= nranks_ || peer == rank_)
    throw std::system_error(make_error_code(errc::internal), "no connection to self");
  // The running operation holds what it gets (Use), and the use counts for idleness.
  auto touch = [this, peer] {
    PeerState& state = at(peer);
    state.last_used = std::chrono::steady_clock::now();
    if (users_ > 0) state.held = period_;
    return by_peer_[peer];
  };
  co_await await_close(peer);
  if (by_peer_[peer]) co_return touch();
  if (shut_) throw LinkError(make_error_code(errc::aborted), "communicator is shut down");
  if (peer > rank_ && !at(peer).dialing) {
    at(peer).dialing = true;
    std::string gone;
    try {
      co_await dial(peer, slots_for(bytes));
    } catch (const LinkError&) {
      at(peer).dialing = false;
      announce(peer);
      throw;
    } catch (const std::system_error& e) {
      at(peer).dialing = false;
      announce(peer);
      // Out of descriptors or memory here is this rank's problem, not the peer's.
      const bool local = e.code().category() == std::system_category() &&
                         out_of_resources(boost::system::error_code(
                             e.code().value(), boost::system::system_category()));
      throw LinkError(local ? e.code() : make_error_code(errc::peer_lost),
                      "rank " + std::to_string(rank_) + " cannot connect to rank " +
                          std::to_string(peer) + ": " + e.what());
    } catch (const std::exception& e) {
      gone = e.what();
    }
    if (!gone.empty()) {
      // The peer went away during set-up: if its own set-up failed, the root knows why. Until
      // then this rank still counts as linking to it, so that a status query names the peer.
      std::string because = co_await gone_because(peer);
      if (because.empty()) {
        // A peer that has no address table yet closes a link request when its wait for the table
        // ends: name what holds the table up (the rank that died on the way), not the peer.
        const std::string peer_says = co_await ask_about(peer);
        if (peer_says.find(not_formed) != std::string::npos) {
          const std::string above = co_await why_no_table(peer);
          because = "; " + peer_says + ": the address table did not reach it (" + above + ")";
        }
      }
      at(peer).dialing = false;
      announce(peer);
      throw LinkError(make_error_code(errc::peer_lost),
                      "cannot connect to rank " + std::to_string(peer) + ": " + gone + because);
    }
    at(peer).dialing = false;
    announce(peer);
    co_return touch();
  }
  // The link is being dialled by another coroutine of ours, or the peer (lower rank) dials it:
  // wait for it to be announced, until the deadline.
  if (!at(peer).pending)
    at(peer).pending = std::make_shared<asio::steady_timer>(ex_, runtime::default_timeout());
  auto event = at(peer).pending;
  boost::system::error_code ec;
  try {
    co_await event->async_wait(asio::use_awaitable);
  } catch (const boost::system::system_error& e) {
    ec = e.code();
  }
  if (by_peer_[peer]) co_return touch();
  if (shut_) throw LinkError(make_error_code(errc::aborted), "communicator is shut down");
  if (!ec) {
    // Whatever holds the peer up is what to name: ask it. Until the answer comes this rank still
    // counts as linking to it, so that a status query names the peer (a neighbour that waits for
    // this rank would otherwise name only this rank).
    const std::string about = co_await ask_about(peer);
    at(peer).pending.reset();
    throw LinkError(
        make_error_code(errc::timed_out),
        "rank " + std::to_string(peer) + " did not connect within COCCL_TIMEOUT; " + about);
  }
  throw LinkError(make_error_code(errc::peer_lost),
                  "connection to rank " + std::to_string(peer) + " failed: " + at(peer).failed);
}

asio::awaitable<void> Peers::stay_on_proxy_thread(
    LinkKind kind, std::optional<runtime::ProxyThread::Pin>& pinned) {
  if (kind != LinkKind::tcp || env_.memory) co_return;
  pinned.emplace(thread_);
  if (!thread_.on_own_thread()) co_await asio::post(ex_, asio::use_awaitable);
}

asio::awaitable<void> Peers::dial(int peer, std::size_t slots) {
  auto limit = runtime::default_timeout();
  const PeerInfo where = co_await locate(peer, std::chrono::steady_clock::now() + limit);
  const LinkKind kind = kind_for(peer);
  // A ring never larger than the whole budget (the budget's own check names one too small for
  // the smallest ring).
  if (budget_ > 0) slots = std::max<std::size_t>(2, std::min(slots, budget_ / options_.slot_bytes));
  Reservation room = co_await make_room(peer, slots * options_.slot_bytes, false);
  auto sock = co_await transport::dial(ex_, where, std::chrono::steady_clock::now() + limit, true,
                                       traffic_);
  std::optional<runtime::ProxyThread::Pin> pinned;
  co_await stay_on_proxy_thread(kind, pinned);
  std::unique_ptr<LinkSetup> setup = make_link_setup(kind, env_, peer, slots);
  const std::uint32_t want = setup->sockets();
  std::vector<Stream> further;
  {
    runtime::CloseAfter guard(*sock, limit);
    const std::vector<std::uint8_t> request =
        encode_link_request({rank_, peer, static_cast<std::uint8_t>(kind), slots,
                             options_.slot_bytes, setup->offer(), want, self_info()});
    Channel channel = co_await Channel::initiate(*sock, secret_);
    co_await write_frame(*sock, channel, FrameType::connect, request);
    Frame f = co_await read_frame(*sock, channel, max_small_frame);
    if (f.type == FrameType::notice)
      throw std::system_error(make_error_code(errc::remote_error), decode_notice(f.payload));
    if (f.type != FrameType::accept) bad_message("expected accept");
    LinkReply reply = decode_link_reply(f.payload);
    if (reply.sockets < 1 || reply.sockets > want)
      bad_message("rank " + std::to_string(peer) + " answered with " +
                  std::to_string(reply.sockets) + " sockets");
    // The link's further sockets, each authenticated like the first.
    for (std::uint32_t index = 1; index < reply.sockets; ++index) {
      auto extra = co_await transport::dial(ex_, where, std::chrono::steady_clock::now() + limit,
                                            false, traffic_);
      runtime::CloseAfter extra_guard(*extra, limit);
      Writer sw;
      sw.put<std::int32_t>(rank_).put<std::int32_t>(peer).put<std::uint32_t>(index);
      Channel extra_channel = co_await Channel::initiate(*extra, secret_);
      co_await write_frame(*extra, extra_channel, FrameType::stripe, sw.bytes());
      further.push_back(std::move(*extra));
    }
    setup->complete(reply.address);
    if (setup->confirms()) {
      const std::vector<std::uint8_t> ready;
      co_await write_frame(*sock, channel, FrameType::accept, ready);
    }
  }
  add_made(peer, setup->make(peer, std::move(*sock), std::move(further)), slots);
  if (shut_) throw LinkError(make_error_code(errc::aborted), "communicator is shut down");
}

asio::awaitable<void> Peers::answer(int peer, std::shared_ptr<Stream> sock,
                                    std::shared_ptr<Channel> channel,
                                    std::vector<std::uint8_t> payload) {
  auto limit = runtime::default_timeout();
  auto pass = gate_.enter();
  if (!directory_.formed()) {
    try {
      co_await table_ready_.async_wait(asio::use_awaitable);
    } catch (const boost::system::system_error&) {
      // Cancelled: the table is here, or this rank is shutting down (checked below).
    }
    if (!pass.open()) co_return;
    if (shut_) {
      // This rank failed while the request waited for its table: the dialler must learn why, or
      // it would blame this rank for a closed stream.
      runtime::CloseAfter guard(*sock, auth_timeout());
      const auto notice = encode_notice(rank_, shut_why_);
      co_await write_frame(*sock, *channel, FrameType::notice, notice);
      co_return;
    }
    if (!directory_.formed())
      bad_message("rank " + std::to_string(peer) +
                  " connected before this rank had the address table");
  }
  std::optional<runtime::ProxyThread::Pin> pinned;
  std::unique_ptr<LinkSetup> setup;
  std::vector<Stream> further;
  std::size_t slots = 0;
  {
    runtime::CloseAfter guard(*sock, limit);
    LinkRequest request = decode_link_request(payload);
    // The dialler's entry, which this rank may not hold (directory.hpp); an entry it holds stays.
    directory_.learn(peer, request.info);
    const LinkKind kind = kind_for(peer);
    // The dialler sizes the ring (fewer slots for a small operation), up to this rank's
    // COCCL_SLOTS.
    if (request.slot_bytes != options_.slot_bytes)
      bad_message("rank " + std::to_string(peer) + " uses different link settings: slots of " +
                  std::to_string(request.slot_bytes) + " bytes there, " +
                  std::to_string(options_.slot_bytes) +
                  " here (set COCCL_SLOT_BYTES alike on every rank)");
    if (request.kind != static_cast<std::uint8_t>(kind) || request.slots < 2 ||
        request.slots > options_.slots || request.sockets < 1 || request.sockets > 16)
      bad_message("rank " + std::to_string(peer) + " uses different link settings");
    slots = static_cast<std::size_t>(request.slots);
    Reservation room;
    std::string refused;
    try {
      room = co_await make_room(peer, slots * options_.slot_bytes, true);
    } catch (const LinkError& e) {
      refused = e.what();
    }
    if (!pass.open()) co_return;
    if (!refused.empty()) {
      // The dialler fails with the reason rather than a bare end of the connection.
      const auto notice = encode_notice(rank_, refused);
      co_await write_frame(*sock, *channel, FrameType::notice, notice);
      throw LinkError(make_error_code(errc::invalid_argument), refused);
    }
    co_await stay_on_proxy_thread(kind, pinned);
    if (!pass.open()) co_return;
    setup = make_link_setup(kind, env_, peer, slots);
    // A link has as many sockets as the end that wants fewer.
    const std::uint32_t sockets = std::min(request.sockets, setup->sockets());
    if (sockets > 1) at(peer).stripes = std::make_unique<runtime::Mailbox<Stripe>>(ex_);
    const std::vector<std::uint8_t> reply =
        encode_link_reply({setup->accept(request.address), sockets});
    co_await write_frame(*sock, *channel, FrameType::accept, reply);
    if (sockets > 1) {
      std::vector<std::shared_ptr<Stream>> extra(sockets - 1);
      try {
        for (std::uint32_t k = 1; k < sockets; ++k) {
          Stripe stripe = co_await at(peer).stripes->pop(limit);
          if (!pass.open()) co_return;
          const std::uint32_t index = stripe.first;
          if (index < 1 || index >= sockets || extra[index - 1])
            bad_message("rank " + std::to_string(peer) + " sent a bad socket index");
          extra[index - 1] = std::move(stripe.second);
        }
      } catch (...) {
        if (!pass.open()) co_return;
        throw;
      }
      at(peer).stripes.reset();
      for (auto& s : extra) further.push_back(std::move(*s));
    }
    if (setup->confirms()) {
      Frame ready = co_await read_frame(*sock, *channel, max_small_frame);
      if (ready.type != FrameType::accept || !ready.payload.empty())
        bad_message("rank " + std::to_string(peer) + " did not confirm the link");
    }
  }
  // The communicator may have been destroyed while this coroutine (detached) waited.
  if (!pass.open()) co_return;
  add_made(peer, setup->make(peer, std::move(*sock), std::move(further)), slots);
}

void Peers::add_made(int peer, std::unique_ptr<Connection> c, std::size_t slots) {
  add(peer, std::move(c), slots * options_.slot_bytes);
  // Finished after shutdown(): the peer already counts the link as made, so closing it bare would
  // read as this rank's death. It is made, then aborted with the reason, as shutdown() does with
  // the others.
  if (shut_) {
    Connection* made = by_peer_[peer];
    made->send_abort(shut_ec_, shut_why_);
    made->close(shut_ec_, shut_why_);
  }
}

void Peers::add(int peer, std::unique_ptr<Connection> c, std::size_t ring_bytes) {
  COCCL_INFO(net, rank_, "connected to rank %d over %s (receive ring %zu bytes)", peer, c->kind(),
             ring_bytes);
  by_peer_.set(peer, c.get(), &at(peer));
  conns_.push_back(std::move(c));
  at(peer).ring_of = ring_bytes;
  ring_bytes_ += ring_bytes;
  if (at(peer).link_gen++ == 0) ++stats_.peers;
  ++stats_.opened;
  at(peer).last_used = std::chrono::steady_clock::now();
}

Peers::LinkStats Peers::link_stats() const noexcept {
  LinkStats s = stats_;
  s.open = static_cast<int>(by_peer_.size());
  s.ring_bytes = ring_bytes_;
  return s;
}

void Peers::table_formed() {
  // Every rank learns the same table, so all agree on the size before any link is requested; the
  // requests waiting for the table are answered only after this.
  if (options_.network_slot_bytes && !options_.memory && nranks_ > 1 && hosts() == nranks_) {
    options_.slot_bytes = options_.network_slot_bytes;
    env_.slot_bytes = options_.slot_bytes;
    COCCL_INFO(net, rank_, "every rank a host of its own: links of %zu-byte slots",
               options_.slot_bytes);
  }
  table_ready_.cancel();
}

std::size_t Peers::slots_for(std::size_t bytes) const noexcept {
  if (bytes == 0) return options_.slots;
  const std::size_t want = (bytes + options_.slot_bytes - 1) / options_.slot_bytes;
  return std::clamp<std::size_t>(want, 2, options_.slots);
}

asio::awaitable<Peers::Reservation> Peers::make_room(int peer, std::size_t bytes, bool answering) {
  Reservation room;
  if (budget_ == 0) co_return room;
  const auto text = [](std::size_t n) { return std::to_string(n) + " bytes"; };
  if (bytes > budget_)
    throw LinkError(
        make_error_code(errc::invalid_argument),
        "COCCL_MEM_BUDGET (" + text(budget_) +
            ") cannot hold even one link: the "
            "link to rank " +
            std::to_string(peer) + " needs a receive ring of " + text(bytes) +
            " (at least 2 slots of COCCL_SLOT_BYTES=" + std::to_string(options_.slot_bytes) +
            "); raise COCCL_MEM_BUDGET or lower "
            "COCCL_SLOT_BYTES");
  const auto until = std::chrono::steady_clock::now() + runtime::default_timeout();
  auto pause = std::chrono::milliseconds(1);
  asio::steady_timer timer(ex_);
  while (ring_bytes_ + reserved_ + bytes > budget_) {
    if (shut_) throw LinkError(make_error_code(errc::aborted), "communicator is shut down");
    // Links the running operation does not hold, least recently used first.
    std::vector<int> idle;
    for (int p : by_peer_.peers())
      if (p != peer && !held(p) && !at(p).closing) idle.push_back(p);
    const auto open = by_peer_.size();
    const std::string holding =
        std::to_string(open) + " open links hold " + text(ring_bytes_) + " of receive rings";
    // Every link held by this rank's own operation, none being made: that operation needs more
    // than the budget holds. A peer's request is another matter: the peer may be an operation
    // ahead (4 ranks with room for 2 links failed 1 run in about 80 under load here), and this
    // rank's links are let go when its operation ends, so the request waits for that below.
    if (idle.empty() && reserved_ == 0 && !answering)
      throw LinkError(make_error_code(errc::invalid_argument),
                      "COCCL_MEM_BUDGET (" + text(budget_) +
                          ") is too small for this "
                          "operation: its " +
                          holding + " and none is idle, but the link to rank " +
                          std::to_string(peer) + " needs " + text(bytes) +
                          " more; raise "
                          "COCCL_MEM_BUDGET");
    std::sort(idle.begin(), idle.end(),
              [this](int a, int b) { return at(a).last_used < at(b).last_used; });
    bool closed = false;
    for (int p : idle) {
      if (!by_peer_[p] || held(p) || at(p).closing || !by_peer_[p]->settled()) continue;
      if (co_await try_close(p, CloseReason::budget)) {
        closed = true;
        break;
      }
    }
    if (closed) continue;
    // The peers still use those links (or data for a later operation waits in them): try again
    // shortly, until the deadline.
    if (std::chrono::steady_clock::now() >= until)
      throw LinkError(make_error_code(errc::timed_out),
                      "COCCL_MEM_BUDGET (" + text(budget_) +
                          "): no idle link could be closed "
                          "within COCCL_TIMEOUT to make room for the link to rank " +
                          std::to_string(peer) + " (" + holding + "; their peers kept using them)");
    timer.expires_after(pause);
    boost::system::error_code ignored;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  reserved_ += bytes;
  room.peers = this;
  room.bytes = bytes;
  room.pass = gate_.enter();
  co_return room;
}

asio::awaitable<void> Peers::await_close(int peer) {
  while (at(peer).closing && at(peer).close_done) {
    auto done = at(peer).close_done;
    boost::system::error_code ignored;
    co_await done->async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
}

asio::awaitable<bool> Peers::try_close(int peer, CloseReason why, bool settle_first) {
  Connection* c = by_peer_[peer];
  if (!c || at(peer).closing || held(peer) || (settle_first && !c->settled()) || shut_)
    co_return false;
  auto pass = gate_.enter();
  const std::uint64_t gen = at(peer).link_gen;
  at(peer).closing = true;
  at(peer).close_done =
      std::make_shared<asio::steady_timer>(ex_, asio::steady_timer::time_point::max());
  // The peer closes its end first when it agrees: that end of file is not a failure.
  c->hold_failures();
  bool agreed = false;
  try {
    const auto limit = auth_timeout();
    const PeerInfo* where = directory_.find(peer);
    if (!where) bad_message("no address entry for linked rank " + std::to_string(peer));
    auto sock = co_await transport::dial(ex_, *where, std::chrono::steady_clock::now() + limit,
                                         true, traffic_);
    runtime::CloseAfter guard(*sock, limit);
    Channel channel = co_await Channel::initiate(*sock, secret_);
    Writer w;
    w.put<std::int32_t>(rank_).put<std::int32_t>(peer).put(static_cast<std::uint8_t>(why));
    co_await write_frame(*sock, channel, FrameType::close, w.bytes());
    Frame f = co_await read_frame(*sock, channel, max_small_frame);
    agreed = f.type == FrameType::status && f.payload.size() == 1 && f.payload[0] == 1;
  } catch (const std::exception& e) {
    // Unreachable, or gone: the link itself reports that once failures are not held.
    if (pass.open())
      COCCL_INFO(net, rank_, "asking rank %d to close the link failed: %s", peer, e.what());
  }
  if (!pass.open()) co_return false;
  at(peer).closing = false;
  if (auto done = std::exchange(at(peer).close_done, nullptr)) done->cancel();
  // The peer may have closed the link meanwhile on its own request (link_gen_ moved on).
  if (at(peer).link_gen != gen || !by_peer_[peer]) co_return agreed;
  if (agreed) {
    retire(peer, why);
    co_return true;
  }
  by_peer_[peer]->release_failures();
  co_return false;
}

asio::awaitable<void> Peers::serve_close(std::shared_ptr<Stream> s,
                                         std::shared_ptr<Channel> channel, Frame f) {
  auto pass = gate_.enter();
  int from = -1;
  CloseReason why = CloseReason::idle;
  try {
    Reader r(f.payload);
    from = r.get<std::int32_t>();
    const int to = r.get<std::int32_t>();
    const auto reason = r.get<std::uint8_t>();
    if (!r.done() || to != rank_ || from < 0 || from >= nranks_ || from == rank_ ||
        (reason != static_cast<std::uint8_t>(CloseReason::budget) &&
         reason != static_cast<std::uint8_t>(CloseReason::idle)))
      bad_message("a malformed request to close a link");
    why = static_cast<CloseReason>(reason);
  } catch (const std::exception& e) {
    drops_.dropped(e.what());
    co_return;
  }
  // Agreed when this end is settled and not in use; when both ends ask at once, the lower rank's
  // request wins.
  Connection* c = by_peer_[from];
  const bool agree =
      c && !at(from).dialing && !held(from) && c->settled() && !(at(from).closing && rank_ < from);
  if (agree) retire(from, why);
  try {
    runtime::CloseAfter guard(*s, auth_timeout());
    const std::vector<std::uint8_t> answer{static_cast<std::uint8_t>(agree ? 1 : 0)};
    co_await write_frame(*s, *channel, FrameType::status, answer);
  } catch (const std::exception& e) {
    // The asker keeps its end until it hears: a lost answer leaves it to fail on its own.
    if (pass.open() && !shut_) drops_.dropped(drop_reason(e));
  }
}

void Peers::retire(int peer, CloseReason why) {
  Connection* c = by_peer_[peer];
  if (!c) return;
  by_peer_.erase(peer);
  ++at(peer).link_gen;
  ring_bytes_ -= at(peer).ring_of;
  at(peer).ring_of = 0;
  ++(why == CloseReason::budget ? stats_.closed_budget : stats_.closed_idle);
  const char* what = why == CloseReason::budget ? "to stay under COCCL_MEM_BUDGET" : "idle";
  COCCL_INFO(net, rank_, "closed the link to rank %d (%s)", peer, what);
  c->hold_failures();
  c->close(make_error_code(errc::aborted),
           "link to rank " + std::to_string(peer) + " closed (" + what + ")");
  auto it = std::find_if(conns_.begin(), conns_.end(),
                         [c](const std::unique_ptr<Connection>& p) { return p.get() == c; });
  if (it == conns_.end()) return;
  // Freed from the executor, not here: the caller may still use `c` on its way out. Kept by
  // this object meanwhile, so that it never outlives the pollers it unregisters from.
  retired_.push_back(std::move(*it));
  conns_.erase(it);
  asio::post(ex_, [this, pass = gate_.enter()] {
    if (pass.open()) retired_.clear();
  });
}

void Peers::let_go(int peer) {
  if (peer < 0 || peer >= nranks_ || peer == rank_ || !by_peer_[peer] || shut_) return;
  asio::co_spawn(ex_, try_close(peer, CloseReason::idle, false), asio::detached);
}

void Peers::arm_idle_timer() {
  idle_timer_.expires_after(
      std::max<std::chrono::steady_clock::duration>(idle_ / 4, std::chrono::milliseconds(10)));
  idle_timer_.async_wait([this, pass = gate_.enter()](boost::system::error_code ec) {
    if (ec || !pass.open() || shut_) return;
    const auto now = std::chrono::steady_clock::now();
    for (int p : by_peer_.peers()) {
      Connection* c = by_peer_[p];
      if (!c || at(p).closing || held(p) || now - at(p).last_used < idle_ || !c->settled())
        continue;
      asio::co_spawn(ex_, try_close(p, CloseReason::idle), asio::detached);
    }
    arm_idle_timer();
  });
}

void Peers::shutdown(std::error_code ec, const std::string& why, bool notify) {
  if (shut_) return;
  shut_ = true;
  shut_why_ = why;
  shut_ec_ = ec;
  // Peers without a link may be waiting for this rank to make one: tell them too (the linked
  // ones get the abort notice below).
  if (notify && directory_.formed()) {
    ++*telling_;
    asio::co_spawn(ex_, tell_everyone(why),
                   [telling = telling_](std::exception_ptr) { --*telling; });
  }
  // The listener stays open until the communicator is destroyed: it answers status queries and
  // liveness probes, takes shrink requests (recovery), and answers link requests with the reason.
  // An orderly end: the root may stop answering for this communicator. After a failure it keeps
  // answering (coccl-status, survivors) until this object goes.
  if (!notify) leave_root();
  // A rendezvous still waiting for its table ends (Peers::join names the shutdown).
  boost::system::error_code ignored;
  if (table_link_) table_link_->close(ignored);
  if (leader_) leader_->stop();
  table_ready_.cancel();
  idle_timer_.cancel();
  // Only peers with an entry can have a stripe mailbox or a waiter (keys first: what the calls
  // below wake must not meet a map being walked).
  std::vector<int> touched;
  for (const auto& entry : peer_state_) touched.push_back(entry.first);
  for (int p : touched) {
    if (auto& stripes = at(p).stripes) stripes->fail(asio::error::operation_aborted);
    announce(p);
  }
  for (auto& c : conns_) {
    if (notify)
      c->send_abort(ec, why);
    else
      c->send_goodbye();
    c->close(ec, why);
  }
}

}  // namespace coccl::transport
