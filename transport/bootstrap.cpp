#include "transport/bootstrap.hpp"

#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <algorithm>
#include <coccl/error.hpp>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "runtime/log.hpp"
#include "runtime/params.hpp"
#include "transport/admission.hpp"
#include "transport/hmac.hpp"
#include "transport/tcp.hpp"

namespace coccl::transport {

namespace {

constexpr std::uint32_t id_magic = 0x31444343u;  // "CCD1"
constexpr std::uint32_t hello_magic = 0x4f4c4548u;
// Hellos and connection requests are small; a table is 32 bytes a rank.
constexpr std::size_t max_small_frame = 4096;
constexpr std::size_t max_table_frame = 64u << 20;

using tcp = asio::ip::tcp;

#if COCCL_HAVE_IB
int ib_qps() { return static_cast<int>(params::ib_qps_per_peer.get()); }
std::size_t ib_split_bytes() {
  return static_cast<std::size_t>(std::max<std::int64_t>(4096, params::ib_split_bytes.get()));
}
std::size_t ib_block_min() {
  return static_cast<std::size_t>(std::max<std::int64_t>(4096, params::ib_zcopy_min.get()));
}
#endif

// Why a connection was dropped, without Boost's source locations.
std::string reason(const std::exception& e) {
  if (auto* b = dynamic_cast<const boost::system::system_error*>(&e))
    return "connection ended before it authenticated (" + b->code().message() + ")";
  return e.what();
}

[[noreturn]] void bad(const std::string& what) {
  throw std::system_error(make_error_code(errc::bad_message), what);
}

std::vector<std::uint8_t> encode_table(const std::vector<PeerInfo>& t) {
  Writer w;
  w.put<std::uint32_t>(static_cast<std::uint32_t>(t.size()));
  for (const PeerInfo& p : t) w.put(p);
  return std::move(w.bytes());
}

std::vector<PeerInfo> decode_table(std::span<const std::uint8_t> payload, int nranks) {
  Reader r(payload);
  auto n = r.get<std::uint32_t>();
  if (static_cast<int>(n) != nranks) bad("address table has the wrong size");
  std::vector<PeerInfo> t(n);
  for (auto& p : t) p = r.get<PeerInfo>();
  if (!r.done()) bad("trailing bytes after the address table");
  return t;
}

std::string text_of(const tcp::endpoint& ep) {
  std::ostringstream out;
  out << ep;
  return out.str();
}

struct Root : std::enable_shared_from_this<Root> {
  Root(asio::any_io_executor ex, const Secret& s)
      : acceptor(ex), secret(s), deadline(ex), retry(ex), drops(-1, "bootstrap root") {}
  tcp::acceptor acceptor;
  Secret secret;
  asio::steady_timer deadline;
  asio::steady_timer retry;  // pause after an accept error
  Admission admission;
  DropLog drops;
  int nranks = -1;
  int arrived = 0;
  bool done = false;
  std::vector<PeerInfo> table;
  std::vector<bool> seen;
  std::shared_ptr<tcp::socket> rank0;
  std::optional<Channel> rank0_channel;

  void finish() {
    done = true;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    deadline.cancel();
    retry.cancel();
  }
};

asio::awaitable<void> root_distribute(std::shared_ptr<Root> root) {
  auto payload = encode_table(root->table);
  auto sock = root->rank0;
  try {
    runtime::CloseAfter guard(*sock, runtime::default_timeout());
    co_await write_frame(*sock, *root->rank0_channel, FrameType::table, payload);
  } catch (const std::exception& e) {
    COCCL_WARN(boot, -1, "bootstrap root: sending the table to rank 0 failed: %s", e.what());
  }
}

asio::awaitable<void> root_handle(std::shared_ptr<Root> root, std::shared_ptr<tcp::socket> sock) {
  int rank = -1, nranks = -1;
  PeerInfo info{};
  std::optional<Channel> channel;
  try {
    auto ticket = root->admission.admit(sock);
    runtime::CloseAfter guard(*sock, auth_timeout());
    channel.emplace(co_await Channel::respond(*sock, root->secret));
    Frame f = co_await read_frame(*sock, *channel, max_small_frame);
    if (f.type != FrameType::hello) bad("expected a hello");
    Reader r(f.payload);
    if (r.get<std::uint32_t>() != hello_magic) bad("bad hello");
    rank = r.get<std::int32_t>();
    nranks = r.get<std::int32_t>();
    info = r.get<PeerInfo>();
    if (!r.done()) bad("trailing bytes in hello");
  } catch (const std::exception& e) {
    // Wrong secret, garbage, a replayed frame, or a connection that never spoke (or was evicted
    // by newer ones): drop it, keep serving the rest.
    if (!root->done) root->drops.dropped(reason(e));
    co_return;
  }
  if (root->done) co_return;
  if (nranks <= 0 || rank < 0 || rank >= nranks || (root->nranks > 0 && nranks != root->nranks)) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped hello with rank %d of %d (expected size %d)",
               rank, nranks, root->nranks);
    co_return;
  }
  if (root->nranks < 0) {
    root->nranks = nranks;
    root->table.resize(nranks);
    root->seen.assign(nranks, false);
  }
  if (root->seen[rank]) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped a second hello from rank %d", rank);
    co_return;
  }
  root->seen[rank] = true;
  root->table[rank] = info;
  if (rank == 0) {
    root->rank0 = sock;
    root->rank0_channel = std::move(channel);
  }
  if (++root->arrived == root->nranks) {
    root->finish();
    co_await root_distribute(root);
  }
}

asio::awaitable<void> root_accept(std::shared_ptr<Root> root) {
  while (!root->done) {
    auto sock = std::make_shared<tcp::socket>(root->acceptor.get_executor());
    boost::system::error_code ec;
    co_await root->acceptor.async_accept(*sock, asio::redirect_error(asio::use_awaitable, ec));
    if (root->done) co_return;
    if (!ec) {
      asio::co_spawn(root->acceptor.get_executor(), root_handle(root, sock), asio::detached);
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

asio::awaitable<std::shared_ptr<tcp::socket>> dial(asio::any_io_executor ex, tcp::endpoint ep,
                                                   std::chrono::steady_clock::time_point until) {
  // The root or peer may not listen yet (launchers start ranks in any order): retry refusals.
  for (;;) {
    auto sock = std::make_shared<tcp::socket>(ex);
    boost::system::error_code ec;
    {
      runtime::CloseAfter guard(*sock, until - std::chrono::steady_clock::now());
      co_await sock->async_connect(ep, asio::redirect_error(asio::use_awaitable, ec));
      if (guard.fired()) ec = asio::error::timed_out;
    }
    if (!ec) co_return sock;
    if (out_of_resources(ec))
      throw std::system_error(std::error_code(ec.value(), std::system_category()),
                              "cannot connect to " + text_of(ep) +
                                  ": this process is out of file descriptors or socket memory "
                                  "(raise ulimit -n)");
    if (std::chrono::steady_clock::now() >= until || ec == asio::error::timed_out)
      throw std::system_error(make_error_code(errc::timed_out),
                              "cannot connect to " + text_of(ep) + " within COCCL_TIMEOUT (" +
                                  ec.message() + ")");
    asio::steady_timer t(ex, std::chrono::milliseconds(20));
    co_await t.async_wait(asio::use_awaitable);
  }
}

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
  if (p.family != 4 && p.family != 6)
    throw std::system_error(make_error_code(errc::invalid_argument), "corrupt UniqueId");
  root.endpoint = p.endpoint();
  return root;
}

UniqueId encode(const RootAddress& root) {
  Writer w;
  w.put(id_magic).put(root.secret).put(PeerInfo::from(root.endpoint));
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

asio::ip::tcp::endpoint start_root(runtime::ProxyThread& thread,
                                   const asio::ip::tcp::endpoint& endpoint, const Secret& secret) {
  auto root = std::make_shared<Root>(thread.executor(), secret);
  boost::system::error_code ec;
  root->acceptor.open(endpoint.protocol(), ec);
  if (!ec) root->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) root->acceptor.bind(endpoint, ec);
  if (!ec) root->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  tcp::endpoint bound;
  if (!ec) bound = root->acceptor.local_endpoint(ec);
  if (ec)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "bootstrap root cannot listen on " + text_of(endpoint) + ": " +
                                ec.message() +
                                (ec == asio::error::address_in_use
                                     ? " (another process, or an earlier job, holds the port)"
                                     : ""));
  // Nobody completed the rendezvous in time: stop serving (ranks fail with their own deadline).
  root->deadline.expires_after(runtime::default_timeout());
  root->deadline.async_wait([root](boost::system::error_code ec) {
    if (!ec && !root->done) {
      COCCL_WARN(boot, -1, "bootstrap root: %d of %d ranks arrived before COCCL_TIMEOUT",
                 root->arrived, root->nranks);
      root->finish();
    }
  });
  asio::co_spawn(thread.executor(), root_accept(root), asio::detached);
  return bound;
}

Peers::Peers(runtime::ProxyThread& thread, const Secret& secret, int rank, int nranks,
             LinkOptions options, FailureHandler on_failure)
    : thread_(thread),
      ex_(thread.executor()),
      secret_(secret),
      rank_(rank),
      nranks_(nranks),
      options_(std::move(options)),
      on_failure_(std::move(on_failure)),
      acceptor_(ex_),
      drops_(rank, "listener"),
      accept_retry_(ex_),
      table_box_(ex_),
      table_ready_(ex_, runtime::default_timeout()),
      by_peer_(nranks, nullptr),
      pending_(nranks),
      dialing_(nranks, false),
      failed_(nranks),
      stripes_(nranks) {
  // A bad COCCL_TCP_ENGINE, or uring forced where the kernel refuses it, fails here; the choice
  // is logged once.
  if (options_.transport == "tcp" || options_.transport == "auto") tcp_engine(rank);
  auto addrs = local_addresses();
  tcp::endpoint ep(addrs.front(), 0);
  acceptor_.open(ep.protocol());
  acceptor_.bind(ep);
  acceptor_.listen(asio::socket_base::max_listen_connections);
  // Before any poller is registered: a constructor that throws runs no destructor to remove it.
#if COCCL_HAVE_IB
  // auto takes ib across hosts where both ends have a usable device (tcp otherwise).
  if (options_.transport == "auto") ib_device_ = ib::Device::get();
#endif
  if (options_.transport == "ib") {
#if COCCL_HAVE_IB
    std::string why;
    ib_device_ = ib::Device::get(&why);
    if (!ib_device_)
      throw std::system_error(make_error_code(errc::unsupported),
                              "COCCL_TRANSPORT=ib, but the ib transport is not available: " + why);
#else
    throw std::system_error(make_error_code(errc::unsupported),
                            "COCCL_TRANSPORT=ib, but coccl was built without ibverbs headers");
#endif
  }
#if COCCL_HAVE_IB
  user_buffers_ =
      std::make_shared<UserBuffers>(ib_device_ ? &ib::registrations(ib_device_) : nullptr);
#else
  user_buffers_ = std::make_shared<UserBuffers>(nullptr);
#endif
  thread_.add_poller(&poller_);
#if COCCL_HAVE_IB
  if (ib_device_) thread_.add_poller(&ib_poller_);
#endif
  accept_loop();
}

Peers::~Peers() {
  *alive_ = false;
  thread_.remove_poller(&poller_);
#if COCCL_HAVE_IB
  thread_.remove_poller(&ib_poller_);
#endif
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

PeerInfo Peers::self_info() const {
  PeerInfo info = PeerInfo::from(acceptor_.local_endpoint());
#if COCCL_HAVE_IB
  if (ib_device_) info.caps |= PeerInfo::cap_ib;
#endif
  return info;
}

void Peers::accept_loop() {
  auto sock = std::make_shared<tcp::socket>(ex_);
  acceptor_.async_accept(*sock, [this, sock, alive = alive_](boost::system::error_code ec) {
    if (!*alive || shut_) return;
    if (ec) {
      accept_failed(ec);
      return;
    }
    asio::co_spawn(ex_, handle_incoming(sock), asio::detached);
    accept_loop();
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
  accept_retry_.async_wait([this, alive = alive_](boost::system::error_code e) {
    if (!e && *alive && !shut_) accept_loop();
  });
}

asio::awaitable<void> Peers::handle_incoming(std::shared_ptr<tcp::socket> s) {
  auto alive = alive_;
  Frame f;
  std::shared_ptr<Channel> channel;
  try {
    // Until its first frame authenticates, the connection holds a place in admission_ (bounded
    // in number) and has auth_timeout() to earn it.
    auto ticket = admission_.admit(s);
    runtime::CloseAfter guard(*s, auth_timeout());
    channel = std::make_shared<Channel>(co_await Channel::respond(*s, secret_));
    f = co_await read_frame(*s, *channel, max_table_frame);
  } catch (const std::exception& e) {
    if (*alive && !shut_) drops_.dropped(reason(e));
    co_return;
  }
  if (!*alive || shut_) co_return;
  if (f.type == FrameType::table) {
    // The one table this rank needs; an extra one (a confused or hostile peer holding the
    // secret) is not queued.
    if (table_received_) {
      drops_.dropped("a second address table");
      co_return;
    }
    table_received_ = true;
    table_box_.push(std::move(f.payload));
    co_return;
  }
  if (f.type == FrameType::stripe) {
    // A further socket of a tcp link this rank is answering: hand it to that answer.
    try {
      Reader r(f.payload);
      int from = r.get<std::int32_t>();
      int to = r.get<std::int32_t>();
      auto index = r.get<std::uint32_t>();
      if (to != rank_ || from < 0 || from >= rank_ || !stripes_[from])
        bad("a stray socket for a tcp link");
      stripes_[from]->push(Stripe{index, s});
    } catch (const std::exception& e) {
      drops_.dropped(e.what());
    }
    co_return;
  }
  int from = -1;
  try {
    if (f.type != FrameType::connect) bad("unexpected frame");
    Reader r(f.payload);
    from = r.get<std::int32_t>();
    int to = r.get<std::int32_t>();
    if (to != rank_ || from < 0 || from >= rank_) bad("connection request for the wrong rank");
    if (by_peer_[from] || dialing_[from])
      bad("a second connection request from rank " + std::to_string(from));
  } catch (const std::exception& e) {
    drops_.dropped(e.what());
    co_return;
  }
  dialing_[from] = true;
  try {
    co_await answer(from, s, channel, std::move(f.payload));
  } catch (const std::exception& e) {
    if (!*alive) co_return;
    stripes_[from].reset();
    failed_[from] = e.what();
    COCCL_WARN(net, rank_, "connection from rank %d failed: %s", from, e.what());
  }
  if (!*alive) co_return;
  dialing_[from] = false;
  announce(from);
}

asio::awaitable<void> Peers::forward_table(int child, std::vector<std::uint8_t> payload) {
  auto until = std::chrono::steady_clock::now() + runtime::default_timeout();
  auto sock = co_await transport::dial(ex_, table_[child].endpoint(), until);
  runtime::CloseAfter guard(*sock, runtime::default_timeout());
  Channel channel = co_await Channel::initiate(*sock, secret_);
  co_await write_frame(*sock, channel, FrameType::table, payload);
}

asio::awaitable<void> Peers::rendezvous(RootAddress root) {
  auto limit = runtime::default_timeout();
  auto until = std::chrono::steady_clock::now() + limit;
  auto sock = co_await transport::dial(ex_, root.endpoint, until);
  std::optional<Channel> channel;
  {
    Writer w;
    w.put(hello_magic).put<std::int32_t>(rank_).put<std::int32_t>(nranks_).put(self_info());
    runtime::CloseAfter guard(*sock, limit);
    channel.emplace(co_await Channel::initiate(*sock, root.secret));
    co_await write_frame(*sock, *channel, FrameType::hello, w.bytes());
  }
  std::vector<std::uint8_t> payload;
  if (rank_ == 0) {
    runtime::CloseAfter guard(*sock, limit);
    Frame f;
    try {
      f = co_await read_frame(*sock, *channel, max_table_frame);
    } catch (const boost::system::system_error& e) {
      throw std::system_error(make_error_code(errc::timed_out),
                              "bootstrap: no address table from the root (" +
                                  std::string(e.what()) + "); did all " + std::to_string(nranks_) +
                                  " ranks start?");
    }
    if (f.type != FrameType::table) bad("expected the address table");
    payload = std::move(f.payload);
  } else {
    sock.reset();
    try {
      payload = co_await table_box_.pop(limit);
    } catch (const boost::system::system_error&) {
      throw std::system_error(make_error_code(errc::timed_out),
                              "bootstrap: rank " + std::to_string(rank_) +
                                  " got no address table within COCCL_TIMEOUT; did all " +
                                  std::to_string(nranks_) + " ranks start?");
    }
  }
  table_ = decode_table(payload, nranks_);
  table_ready_.cancel();
  for (int child : {2 * rank_ + 1, 2 * rank_ + 2})
    if (child < nranks_) co_await forward_table(child, payload);
  COCCL_INFO(boot, rank_, "bootstrap done: %d ranks", nranks_);
}

Peers::Kind Peers::kind_for(int peer) const {
  if (options_.transport == "ib") return Kind::ib;
  if (options_.transport == "tcp") return Kind::tcp;
  const bool same_host = table_[peer].host_hash == table_[rank_].host_hash;
  // auto: across hosts ib when both ends offer it; within a host shm, which beats a loop through
  // the NIC.
  if (options_.transport == "auto" && !same_host &&
      (table_[peer].caps & table_[rank_].caps & PeerInfo::cap_ib) != 0)
    return Kind::ib;
  if (params::shm_disable.get()) return Kind::tcp;
  return same_host ? Kind::shm : Kind::tcp;
}

std::uint32_t Peers::prepare_tcp(int peer, Made& made) {
  if (tcp_engine(rank_) == TcpEngine::asio) return 1;
  std::string why;
  made.ring = make_uring_ring(why);
  if (!made.ring) {
    if (params::tcp_engine.get() == "uring")
      throw std::system_error(make_error_code(errc::unsupported),
                              "COCCL_TCP_ENGINE=uring, but the link to rank " +
                                  std::to_string(peer) + " cannot have an io_uring: " + why);
    COCCL_INFO(net, rank_, "link to rank %d on asio: %s", peer, why.c_str());
    return 1;
  }
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(params::tcp_sockets.get(), 1, 16));
}

void Peers::announce(int peer) {
  if (pending_[peer]) pending_[peer]->cancel();
  pending_[peer].reset();
}

asio::awaitable<Connection*> Peers::get(int peer) {
  if (peer < 0 || peer >= nranks_ || peer == rank_)
    throw std::system_error(make_error_code(errc::internal), "no connection to self");
  if (by_peer_[peer]) co_return by_peer_[peer];
  if (shut_) throw LinkError(make_error_code(errc::aborted), "communicator is shut down");
  if (peer > rank_ && !dialing_[peer]) {
    dialing_[peer] = true;
    try {
      co_await dial(peer);
    } catch (const LinkError&) {
      dialing_[peer] = false;
      announce(peer);
      throw;
    } catch (const std::system_error& e) {
      dialing_[peer] = false;
      announce(peer);
      // Out of descriptors or memory here is this rank's problem, not the peer's.
      const bool local = e.code().category() == std::system_category() &&
                         out_of_resources(boost::system::error_code(
                             e.code().value(), boost::system::system_category()));
      throw LinkError(local ? e.code() : make_error_code(errc::peer_lost),
                      "rank " + std::to_string(rank_) + " cannot connect to rank " +
                          std::to_string(peer) + ": " + e.what());
    } catch (const std::exception& e) {
      dialing_[peer] = false;
      announce(peer);
      throw LinkError(make_error_code(errc::peer_lost),
                      "cannot connect to rank " + std::to_string(peer) + ": " + e.what());
    }
    announce(peer);
    co_return by_peer_[peer];
  }
  // The link is being dialled by another coroutine of ours, or the peer (lower rank) dials it:
  // wait for it to be announced, until the deadline.
  if (!pending_[peer])
    pending_[peer] = std::make_shared<asio::steady_timer>(ex_, runtime::default_timeout());
  auto event = pending_[peer];
  boost::system::error_code ec;
  try {
    co_await event->async_wait(asio::use_awaitable);
  } catch (const boost::system::system_error& e) {
    ec = e.code();
  }
  if (by_peer_[peer]) co_return by_peer_[peer];
  if (shut_) throw LinkError(make_error_code(errc::aborted), "communicator is shut down");
  if (!ec) {
    pending_[peer].reset();
    throw LinkError(make_error_code(errc::timed_out),
                    "rank " + std::to_string(peer) + " did not connect within COCCL_TIMEOUT");
  }
  throw LinkError(make_error_code(errc::peer_lost),
                  "connection to rank " + std::to_string(peer) + " failed: " + failed_[peer]);
}

asio::awaitable<void> Peers::dial(int peer) {
  auto limit = runtime::default_timeout();
  const Kind kind = kind_for(peer);
  const bool shm = kind == Kind::shm;
  std::size_t seg_bytes = ShmConnection::segment_bytes(options_.slots, options_.slot_bytes);
  auto sock = co_await transport::dial(ex_, table_[peer].endpoint(),
                                       std::chrono::steady_clock::now() + limit);
  Made made;
  const std::uint32_t want = kind == Kind::tcp ? prepare_tcp(peer, made) : 1;
  {
    runtime::CloseAfter guard(*sock, limit);
    if (shm) made.own = ShmSegment::create(seg_bytes);
    std::vector<std::uint8_t> address;
#if COCCL_HAVE_IB
    if (kind == Kind::ib) {
      made.link = std::make_unique<ib::Link>(ib_device_, options_.slots, options_.slot_bytes,
                                             ib_qps(), ib_block_min());
      address = made.link->address().encode();
    }
#endif
    Writer w;
    w.put<std::int32_t>(rank_).put<std::int32_t>(peer).put(kind);
    w.put<std::uint64_t>(options_.slots).put<std::uint64_t>(options_.slot_bytes);
    std::string name = made.own ? made.own->name() : "";
    w.put_bytes({reinterpret_cast<const std::uint8_t*>(name.data()), name.size()});
    w.put_bytes(address);
    w.put<std::uint32_t>(want);
    Channel channel = co_await Channel::initiate(*sock, secret_);
    co_await write_frame(*sock, channel, FrameType::connect, w.bytes());
    Frame f = co_await read_frame(*sock, channel, max_small_frame);
    if (f.type != FrameType::accept) bad("expected accept");
    Reader r(f.payload);
    auto their_name = r.get_bytes();
    auto their_address = r.get_bytes();
    const auto sockets = r.get<std::uint32_t>();
    if (sockets < 1 || sockets > want)
      bad("rank " + std::to_string(peer) + " answered with " + std::to_string(sockets) +
          " sockets");
    // The link's further sockets, each authenticated like the first.
    for (std::uint32_t index = 1; index < sockets; ++index) {
      auto extra = co_await transport::dial(ex_, table_[peer].endpoint(),
                                            std::chrono::steady_clock::now() + limit);
      runtime::CloseAfter extra_guard(*extra, limit);
      Writer sw;
      sw.put<std::int32_t>(rank_).put<std::int32_t>(peer).put<std::uint32_t>(index);
      Channel extra_channel = co_await Channel::initiate(*extra, secret_);
      co_await write_frame(*extra, extra_channel, FrameType::stripe, sw.bytes());
      made.extra.push_back(std::move(*extra));
    }
    if (shm) {
      made.theirs = ShmSegment::open(std::string(their_name.begin(), their_name.end()), seg_bytes);
      made.own->unlink();  // the peer mapped it before accepting
    }
#if COCCL_HAVE_IB
    if (made.link) {
      made.link->connect(ib::LinkAddress::decode(their_address));
      // The peer may write only once our queue pairs are ready to receive.
      const std::vector<std::uint8_t> ready;
      co_await write_frame(*sock, channel, FrameType::accept, ready);
    }
#endif
  }
  if (shut_) throw LinkError(make_error_code(errc::aborted), "communicator is shut down");
  add_made(peer, std::move(*sock), std::move(made));
}

asio::awaitable<void> Peers::answer(int peer, std::shared_ptr<asio::ip::tcp::socket> sock,
                                    std::shared_ptr<Channel> channel,
                                    std::vector<std::uint8_t> payload) {
  auto limit = runtime::default_timeout();
  auto alive = alive_;
  if (table_.empty()) {
    try {
      co_await table_ready_.async_wait(asio::use_awaitable);
    } catch (const boost::system::system_error&) {
      // Cancelled: the table is here, or this rank is shutting down (checked below).
    }
    if (!*alive) co_return;
    if (table_.empty())
      bad("rank " + std::to_string(peer) + " connected before this rank had the address table");
  }
  const Kind kind = kind_for(peer);
  const bool shm = kind == Kind::shm;
  std::size_t seg_bytes = ShmConnection::segment_bytes(options_.slots, options_.slot_bytes);
  Made made;
  {
    runtime::CloseAfter guard(*sock, limit);
    Reader r(payload);
    r.get<std::int32_t>();
    r.get<std::int32_t>();
    auto their_kind = r.get<Kind>();
    auto slots = r.get<std::uint64_t>();
    auto slot_bytes = r.get<std::uint64_t>();
    auto their_name = r.get_bytes();
    auto their_address = r.get_bytes();
    const auto their_sockets = r.get<std::uint32_t>();
    if (their_kind != kind || slots != options_.slots || slot_bytes != options_.slot_bytes ||
        their_sockets < 1 || their_sockets > 16 || (kind != Kind::tcp && their_sockets != 1))
      bad("rank " + std::to_string(peer) + " uses different link settings");
    // A link has as many sockets as the end that wants fewer.
    const std::uint32_t sockets =
        kind == Kind::tcp ? std::min(their_sockets, prepare_tcp(peer, made)) : 1;
    if (sockets > 1) stripes_[peer] = std::make_unique<runtime::Mailbox<Stripe>>(ex_);
    if (shm) {
      made.theirs = ShmSegment::open(std::string(their_name.begin(), their_name.end()), seg_bytes);
      made.own = ShmSegment::create(seg_bytes);
    }
    std::vector<std::uint8_t> address;
#if COCCL_HAVE_IB
    if (kind == Kind::ib) {
      made.link = std::make_unique<ib::Link>(ib_device_, options_.slots, options_.slot_bytes,
                                             ib_qps(), ib_block_min());
      made.link->connect(ib::LinkAddress::decode(their_address));
      address = made.link->address().encode();
    }
#endif
    Writer w;
    std::string name = made.own ? made.own->name() : "";
    w.put_bytes({reinterpret_cast<const std::uint8_t*>(name.data()), name.size()});
    w.put_bytes(address);
    w.put<std::uint32_t>(sockets);
    co_await write_frame(*sock, *channel, FrameType::accept, w.bytes());
    if (sockets > 1) {
      std::vector<std::shared_ptr<asio::ip::tcp::socket>> extra(sockets - 1);
      try {
        for (std::uint32_t k = 1; k < sockets; ++k) {
          Stripe stripe = co_await stripes_[peer]->pop(limit);
          if (!*alive) co_return;
          const std::uint32_t index = stripe.first;
          if (index < 1 || index >= sockets || extra[index - 1])
            bad("rank " + std::to_string(peer) + " sent a bad socket index");
          extra[index - 1] = std::move(stripe.second);
        }
      } catch (...) {
        if (!*alive) co_return;
        throw;
      }
      stripes_[peer].reset();
      for (auto& s : extra) made.extra.push_back(std::move(*s));
    }
#if COCCL_HAVE_IB
    if (made.link) {
      Frame ready = co_await read_frame(*sock, *channel, max_small_frame);
      if (ready.type != FrameType::accept || !ready.payload.empty())
        bad("rank " + std::to_string(peer) + " did not confirm the ib link");
    }
#endif
  }
  // The communicator may have been destroyed while this coroutine (detached) waited.
  if (!*alive || shut_) co_return;
  add_made(peer, std::move(*sock), std::move(made));
}

void Peers::add_made(int peer, tcp::socket s, Made made) {
#if COCCL_HAVE_IB
  if (made.link) {
    auto c =
        std::make_unique<IbConnection>(rank_, peer, std::move(s), std::move(made.link),
                                       ib_split_bytes(), ib_poller_, user_buffers_, on_failure_);
    c->start();
    add(peer, std::move(c));
    return;
  }
#endif
  if (made.own) {
    auto c = std::make_unique<ShmConnection>(rank_, peer, std::move(s), options_.slots,
                                             options_.slot_bytes, std::move(made.own),
                                             std::move(made.theirs), poller_, on_failure_);
    c->start();
    add(peer, std::move(c));
  } else if (made.ring) {
    std::vector<tcp::socket> sockets;
    sockets.push_back(std::move(s));
    for (auto& e : made.extra) sockets.push_back(std::move(e));
    const std::size_t n = sockets.size();
    add(peer, make_uring_connection(rank_, peer, std::move(sockets), std::move(made.ring),
                                    options_.slots, options_.slot_bytes, thread_, on_failure_));
    COCCL_INFO(net, rank_, "tcp link to rank %d on io_uring over %zu socket(s)", peer, n);
  } else {
    auto c = std::make_unique<TcpConnection>(rank_, peer, std::move(s), options_.slots,
                                             options_.slot_bytes, on_failure_);
    c->start();
    add(peer, std::move(c));
  }
}

void Peers::add(int peer, std::unique_ptr<Connection> c) {
  COCCL_INFO(net, rank_, "connected to rank %d over %s", peer, c->kind());
  by_peer_[peer] = c.get();
  conns_.push_back(std::move(c));
}

void Peers::shutdown(std::error_code ec, const std::string& why, bool notify) {
  if (shut_) return;
  shut_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  table_box_.fail(asio::error::operation_aborted);
  for (auto& box : stripes_)
    if (box) box->fail(asio::error::operation_aborted);
  table_ready_.cancel();
  for (int p = 0; p < nranks_; ++p) announce(p);
  for (auto& c : conns_) {
    if (notify)
      c->send_abort(ec, why);
    else
      c->send_goodbye();
    c->close(ec, why);
  }
}

}  // namespace coccl::transport
