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
#include <fstream>
#include <optional>
#include <sstream>
#include <tuple>

#include "runtime/log.hpp"
#include "runtime/params.hpp"
#include "transport/admission.hpp"
#include "transport/hmac.hpp"
#include "transport/tcp.hpp"

namespace coccl::transport {

namespace {

constexpr std::uint32_t id_magic = 0x31444343u;  // "CCD1"
// Hellos and connection requests are small; a table is 32 bytes a rank.
constexpr std::size_t max_small_frame = 4096;
constexpr std::size_t max_table_frame = 64u << 20;
constexpr std::uint32_t root_view_magic = 0x52565743;  // "CWVR"

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

constexpr std::uint32_t notice_magic = 0x4543544eu;  // "NTCE"

std::vector<std::uint8_t> encode_notice(int from, const std::string& why) {
  Writer w;
  w.put(notice_magic).put<std::int32_t>(from);
  const std::string text = why.substr(0, 2048);
  w.put_bytes({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
  return std::move(w.bytes());
}

// The text a peer's notice carries, prefixed by nothing: it already names the peer.
std::string decode_notice(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  if (r.get<std::uint32_t>() != notice_magic) bad("not a notice");
  const int from = r.get<std::int32_t>();
  auto text = r.get_bytes();
  if (!r.done()) bad("trailing bytes after a notice");
  std::string why(text.begin(), text.end());
  for (char& c : why)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return "rank " + std::to_string(from) + " has failed: " + why;
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
  // Several roots (ncclCommInitRankScalable): this is root `index` of `roots`, serving the hellos
  // of ranks [first, last); root 0 also takes the other roots' shares, and `expect` counts the
  // ranks it must see (all of them at root 0, its own share elsewhere). `ids` is the digest of
  // the id list that every hello and share must carry.
  int roots = 1;
  int index = 0;
  int first = 0, last = 0;
  int expect = 0;
  std::uint64_t ids = 0;
  int arrived = 0;
  bool formed = false;      // every hello arrived; the table went to rank 0 (or the share on)
  bool expired = false;     // COCCL_TIMEOUT passed first: no more hellos, status queries only
  bool rank0_lost = false;  // everyone arrived, but the table could not be sent to rank 0
  std::map<int, std::string> failures;  // ranks whose set-up failed, and why (their notices)
  bool done = false;                    // serving nothing more
  std::vector<PeerInfo> table;
  std::vector<bool> seen;
  // The first rank of this root's share (rank 0 at root 0): it takes the table, or the share.
  std::shared_ptr<tcp::socket> rank0;
  std::optional<Channel> rank0_channel;

  // Sets the communicator's shape from its first hello or share.
  void shape(int n, int nroots, int at, std::uint64_t digest) {
    nranks = n;
    roots = nroots;
    index = at;
    ids = digest;
    first = share_begin(at, n, nroots);
    last = share_begin(at + 1, n, nroots);
    expect = at == 0 ? n : last - first;
    table.resize(n);
    seen.assign(n, false);
  }

  void finish() {
    done = true;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    deadline.cancel();
    retry.cancel();
  }
};

asio::awaitable<bool> root_distribute(std::shared_ptr<Root> root) {
  // Root 0 sends the whole table to rank 0; another root sends its share to its first rank,
  // which passes it on to root 0.
  std::vector<std::uint8_t> payload;
  if (root->index == 0) {
    payload = encode_table(root->table);
  } else {
    Share share{
        root->nranks,
        static_cast<std::uint32_t>(root->roots),
        static_cast<std::uint32_t>(root->index),
        root->ids,
        root->first,
        std::vector<PeerInfo>(root->table.begin() + root->first, root->table.begin() + root->last)};
    payload = encode_share(share);
  }
  auto sock = root->rank0;
  try {
    runtime::CloseAfter guard(*sock, runtime::default_timeout());
    co_await write_frame(*sock, *root->rank0_channel,
                         root->index == 0 ? FrameType::table : FrameType::share, payload);
    co_return true;
  } catch (const std::exception& e) {
    COCCL_WARN(boot, -1, "bootstrap root: sending the table to rank %d failed: %s", root->first,
               e.what());
  }
  co_return false;
}

// The root's answer to a status query: how far the rendezvous got and who has arrived.
std::vector<std::uint8_t> encode_root_view(const Root& root) {
  Writer w;
  const int n = std::max(root.nranks, 0);
  w.put(root_view_magic).put<std::int32_t>(n).put<std::int32_t>(root.arrived);
  w.put<std::uint8_t>(root.rank0_lost ? 1 : 0);
  for (int r = 0; r < n; ++r) {
    w.put<std::uint8_t>(root.seen[r] ? 1 : 0);
    w.put(root.table[r]);
  }
  w.put<std::uint32_t>(static_cast<std::uint32_t>(root.failures.size()));
  for (const auto& [rank, why] : root.failures) {
    w.put<std::int32_t>(rank);
    w.put_bytes({reinterpret_cast<const std::uint8_t*>(why.data()), why.size()});
  }
  return std::move(w.bytes());
}

RootView decode_root_view(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  if (r.get<std::uint32_t>() != root_view_magic) bad("not a root's status answer");
  RootView v;
  v.nranks = r.get<std::int32_t>();
  v.arrived = r.get<std::int32_t>();
  v.rank0_lost = r.get<std::uint8_t>() != 0;
  // Each rank takes 1 + sizeof(PeerInfo) bytes: a count the payload cannot hold is refused before
  // anything is allocated for it.
  const std::size_t per_rank = 1 + sizeof(PeerInfo);
  if (v.nranks < 0 || v.arrived < 0 || v.arrived > v.nranks ||
      static_cast<std::size_t>(v.nranks) > payload.size() / per_rank)
    bad("root's status answer has an impossible size");
  v.seen.resize(v.nranks);
  v.table.resize(v.nranks);
  for (int i = 0; i < v.nranks; ++i) {
    v.seen[i] = r.get<std::uint8_t>() != 0;
    v.table[i] = r.get<PeerInfo>();
  }
  v.failed.resize(v.nranks);
  const auto failures = r.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < failures; ++i) {
    const int rank = r.get<std::int32_t>();
    auto text = r.get_bytes();
    if (rank < 0 || rank >= v.nranks) bad("root's status answer names a rank out of range");
    v.failed[rank].assign(text.begin(), text.end());
  }
  if (!r.done()) bad("trailing bytes after the root's status answer");
  return v;
}

// Rank 0 acknowledges the table; a rank 0 that died after its hello does not (the write of the
// table may still have succeeded into the socket's buffer).
asio::awaitable<bool> root_table_taken(std::shared_ptr<Root> root) {
  try {
    runtime::CloseAfter guard(*root->rank0, runtime::default_timeout());
    Frame f = co_await read_frame(*root->rank0, *root->rank0_channel, max_small_frame);
    co_return f.type == FrameType::status&& f.payload.empty();
  } catch (const std::exception& e) {
    COCCL_WARN(boot, -1, "bootstrap root: rank 0 did not take the table: %s", e.what());
  }
  co_return false;
}

// Once formed, the root serves status queries until rank 0 closes its connection (rank 0 holds
// it for the life of its communicator, and never writes on it again).
asio::awaitable<void> root_watch_rank0(std::shared_ptr<Root> root) {
  std::uint8_t byte = 0;
  boost::system::error_code ec;
  co_await root->rank0->async_read_some(asio::buffer(&byte, 1),
                                        asio::redirect_error(asio::use_awaitable, ec));
  root->finish();
}

// Every rank (and share) the root must see has arrived: pass the table (or share) on.
asio::awaitable<void> root_complete(std::shared_ptr<Root> root) {
  root->formed = true;
  root->deadline.cancel();
  if (co_await root_distribute(root) && co_await root_table_taken(root)) {
    // Root 0 serves status queries while rank 0 lives; another root's work ends with its share.
    if (root->index == 0)
      co_await root_watch_rank0(root);
    else
      root->finish();
  } else {
    // The others wait for a table that will not come; they ask who is missing when they give
    // up: answer for one more COCCL_TIMEOUT.
    root->rank0_lost = true;
    root->deadline.expires_after(runtime::default_timeout());
    root->deadline.async_wait([root](boost::system::error_code e) {
      if (!e) root->finish();
    });
  }
}

// Root 0 of several: another root's share, passed on by its first rank. Answered with an empty
// status frame when taken, else a notice with the reason (the rank fails with it).
asio::awaitable<void> root_take_share(std::shared_ptr<Root> root, std::shared_ptr<tcp::socket> sock,
                                      Channel channel, std::vector<std::uint8_t> payload) {
  std::string refusal;
  Share share{};
  try {
    share = decode_share(payload);
  } catch (const std::exception& e) {
    refusal = e.what();
  }
  if (refusal.empty()) {
    const std::string whose = "ranks " + std::to_string(share.first) + "-" +
                              std::to_string(share.first + share.entries.size() - 1) + " (root " +
                              std::to_string(share.index) + " of " + std::to_string(share.roots) +
                              ")";
    if (root->done || root->formed || root->expired) {
      refusal =
          "the first root no longer takes shares (the communicator formed, or its "
          "COCCL_TIMEOUT passed)";
    } else if (root->nranks < 0) {
      root->shape(share.nranks, static_cast<int>(share.roots), 0, share.ids);
    } else if (root->index != 0) {
      refusal = whose + " sent their share to a root that is not the first of their ids";
    } else if (share.nranks != root->nranks || static_cast<int>(share.roots) != root->roots ||
               share.ids != root->ids) {
      refusal = whose +
                " were given other ids, or another number of ranks, than the ranks that "
                "reached the first root (" +
                std::to_string(root->roots) + " ids, " + std::to_string(root->nranks) +
                " ranks): every rank must pass the same ids in "
                "the same order";
    } else {
      for (std::size_t i = 0; i < share.entries.size(); ++i)
        if (root->seen[share.first + i]) refusal = "a second share from " + whose;
    }
  }
  if (!refusal.empty()) {
    COCCL_WARN(boot, -1, "bootstrap root: refused a share: %s", refusal.c_str());
    if (root->nranks > 0 && share.first >= 0 && share.first < root->nranks &&
        root->failures.size() < 1024)
      root->failures[share.first] = refusal;
  } else {
    for (std::size_t i = 0; i < share.entries.size(); ++i) {
      root->seen[share.first + i] = true;
      root->table[share.first + i] = share.entries[i];
    }
    root->arrived += static_cast<int>(share.entries.size());
  }
  try {
    runtime::CloseAfter guard(*sock, auth_timeout());
    const std::vector<std::uint8_t> answer(refusal.begin(), refusal.end());
    co_await write_frame(*sock, channel, refusal.empty() ? FrameType::status : FrameType::notice,
                         answer);
  } catch (const std::exception& e) {
    COCCL_WARN(boot, -1, "bootstrap root: answering a share failed: %s", e.what());
  }
  if (refusal.empty() && root->arrived == root->expect) co_await root_complete(root);
}

asio::awaitable<void> root_handle(std::shared_ptr<Root> root, std::shared_ptr<tcp::socket> sock) {
  Hello hello{};
  std::optional<Channel> channel;
  std::vector<std::uint8_t> share;
  try {
    auto ticket = root->admission.admit(sock);
    runtime::CloseAfter guard(*sock, auth_timeout());
    channel.emplace(co_await Channel::respond(*sock, root->secret));
    Frame f = co_await read_frame(*sock, *channel, max_table_frame);
    if (f.type == FrameType::status_query) {
      if (!f.payload.empty()) bad("a status query carries nothing");
      auto view = encode_root_view(*root);
      co_await write_frame(*sock, *channel, FrameType::status, view);
      co_return;
    }
    if (f.type == FrameType::notice) {
      // A rank whose set-up failed says why, for peers that find it gone (Peers::get).
      Reader r(f.payload);
      if (r.get<std::uint32_t>() != notice_magic) bad("not a notice");
      const int from = r.get<std::int32_t>();
      if (root->nranks > 0 && from >= 0 && from < root->nranks && root->failures.size() < 1024)
        root->failures[from] = decode_notice(f.payload);
      co_return;
    }
    if (f.type == FrameType::share) {
      share = std::move(f.payload);
    } else {
      if (f.type != FrameType::hello || f.payload.size() > max_small_frame) bad("expected a hello");
      hello = decode_hello(f.payload);
    }
  } catch (const std::exception& e) {
    // Wrong secret, garbage, a replayed frame, or a connection that never spoke (or was evicted
    // by newer ones): drop it, keep serving the rest.
    if (!root->done) root->drops.dropped(reason(e));
    co_return;
  }
  if (!share.empty()) {
    co_await root_take_share(root, sock, std::move(*channel), std::move(share));
    co_return;
  }
  if (root->done || root->formed || root->expired) co_return;
  const int rank = hello.rank, nranks = hello.nranks;
  if (nranks <= 0 || rank < 0 || rank >= nranks || hello.roots < 1 ||
      hello.roots > static_cast<std::uint32_t>(nranks) ||
      (root->nranks > 0 && nranks != root->nranks)) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped hello with rank %d of %d (expected size %d)",
               rank, nranks, root->nranks);
    co_return;
  }
  const int roots = static_cast<int>(hello.roots);
  const int at = root_of(rank, nranks, roots);
  if (root->nranks < 0) root->shape(nranks, roots, at, hello.ids);
  std::string refusal;
  if (roots != root->roots || hello.ids != root->ids)
    refusal = "rank " + std::to_string(rank) + " was given other ids (" + std::to_string(roots) +
              ") than the ranks that reached this root before it (" + std::to_string(root->roots) +
              "): every rank must pass the same ids in the same "
              "order";
  else if (at != root->index)
    refusal = "rank " + std::to_string(rank) + " says hello to root " +
              std::to_string(root->index) + ", but its share belongs to root " + std::to_string(at);
  if (!refusal.empty()) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped a hello: %s", refusal.c_str());
    if (root->failures.size() < 1024) root->failures[rank] = refusal;
    co_return;
  }
  if (root->seen[rank]) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped a second hello from rank %d", rank);
    co_return;
  }
  root->seen[rank] = true;
  root->table[rank] = hello.info;
  if (rank == root->first) {
    root->rank0 = sock;
    root->rank0_channel = std::move(channel);
  }
  if (++root->arrived == root->expect) co_await root_complete(root);
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
                                                   std::chrono::steady_clock::time_point until,
                                                   bool listening) {
  // The root may not listen yet (launchers start ranks in any order): retry refusals. A rank in
  // the address table listened before it said hello, so its refusal means it has gone.
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
    if (listening && ec == asio::error::connection_refused)
      throw std::system_error(make_error_code(errc::peer_lost),
                              text_of(ep) + " refused the connection: the process has gone");
    if (std::chrono::steady_clock::now() >= until || ec == asio::error::timed_out)
      throw std::system_error(
          make_error_code(errc::timed_out),
          "cannot connect to " + text_of(ep) + " within COCCL_TIMEOUT (" + ec.message() + ")");
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
      stripes_(nranks),
      recovery_box_(ex_),
      budget_(static_cast<std::size_t>(std::max<std::int64_t>(0, params::mem_budget.get()))),
      ring_of_(nranks, 0),
      last_used_(nranks),
      held_(nranks, 0),
      closing_(nranks, false),
      close_done_(nranks),
      link_gen_(nranks, 0),
      idle_timer_(ex_) {
  stats_.budget = budget_;
  const double idle_s = params::link_idle_s.get();
  if (idle_s > 0)
    idle_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::min(idle_s, 1e6)));
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
  if (idle_.count() > 0) arm_idle_timer();
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
  // The loop outlives shutdown(): status queries are answered, and survivors of a failure
  // probe and shrink through here (handle_incoming).
  acceptor_.async_accept(*sock, [this, sock, alive = alive_](boost::system::error_code ec) {
    if (!*alive) return;
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
    if (!e && *alive) accept_loop();
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
  if (!*alive) co_return;
  if (f.type == FrameType::recover) {
    co_await serve_recovery(s, channel, std::move(f));
    co_return;
  }
  if (f.type == FrameType::status_query) {
    try {
      if (!f.payload.empty()) bad("a status query carries nothing");
      auto answer = status_source_ ? status_source_() : std::vector<std::uint8_t>{};
      runtime::CloseAfter guard(*s, auth_timeout());
      co_await write_frame(*s, *channel, FrameType::status, answer);
    } catch (const std::exception& e) {
      if (*alive && !shut_) drops_.dropped(reason(e));
    }
    co_return;
  }
  if (f.type == FrameType::notice) {
    // A peer that failed before it could reach this rank through a link tells why.
    try {
      const std::string why = decode_notice(f.payload);
      if (!shut_) on_failure_(-1, make_error_code(errc::remote_error), why);
    } catch (const std::exception& e) {
      if (*alive && !shut_) drops_.dropped(reason(e));
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
    int to;
    std::tie(from, to) = link_request_ranks(f.payload);
    if (to != rank_ || from < 0 || from >= rank_) bad("connection request for the wrong rank");
  } catch (const std::exception& e) {
    drops_.dropped(e.what());
    co_return;
  }
  // The peer agreed to close the link this rank asked about and may dial again before the answer
  // is read here: the close settles first.
  co_await await_close(from);
  if (!*alive || shut_) co_return;
  try {
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

asio::awaitable<void> Peers::serve_recovery(std::shared_ptr<tcp::socket> s,
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

asio::awaitable<void> Peers::forward_table(int child, std::vector<std::uint8_t> payload) {
  auto until = std::chrono::steady_clock::now() + runtime::default_timeout();
  auto sock = co_await transport::dial(ex_, table_[child].endpoint(), until, true);
  runtime::CloseAfter guard(*sock, runtime::default_timeout());
  Channel channel = co_await Channel::initiate(*sock, secret_);
  co_await write_frame(*sock, channel, FrameType::table, payload);
}

asio::awaitable<void> Peers::rendezvous(std::vector<RootAddress> roots) {
  if (roots.empty() || static_cast<int>(roots.size()) > nranks_)
    throw std::system_error(make_error_code(errc::invalid_argument),
                            "bootstrap: " + std::to_string(roots.size()) + " ids for " +
                                std::to_string(nranks_) + " ranks (1 to nranks are usable)");
  root_ = roots.front();
  roots_ = static_cast<int>(roots.size());
  std::exception_ptr failed;
  std::string why;
  try {
    co_await join(std::move(roots));
  } catch (const std::exception& e) {
    failed = std::current_exception();
    why = e.what();
  }
  if (failed) {
    co_await tell_root(why);
    std::rethrow_exception(failed);
  }
}

namespace {

// The same for every rank given the same ids in the same order (and for no other list, short of
// a hash collision).
std::uint64_t digest_of(const std::vector<RootAddress>& roots) {
  if (roots.size() == 1) return 0;
  Writer w;
  for (const RootAddress& r : roots)
    w.put(r.secret).put(PeerInfo::from(r.endpoint).addr).put(r.endpoint.port());
  auto d = detail::sha256(w.bytes().data(), w.bytes().size());
  std::uint64_t v;
  std::memcpy(&v, d.data(), sizeof v);
  return v;
}

}  // namespace

asio::awaitable<void> Peers::join(std::vector<RootAddress> roots) {
  auto limit = runtime::default_timeout();
  auto until = std::chrono::steady_clock::now() + limit;
  // With several roots each takes the hellos of its share of the ranks; the first rank of a
  // share other than root 0's passes that share on to root 0, which then has every entry.
  const int nroots = static_cast<int>(roots.size());
  const int at = root_of(rank_, nranks_, nroots);
  const RootAddress root = roots[at];
  auto sock = co_await transport::dial(ex_, root.endpoint, until);
  std::optional<Channel> channel;
  {
    Hello h{rank_, nranks_, self_info(), static_cast<std::uint32_t>(nroots), digest_of(roots)};
    const std::vector<std::uint8_t> hello = encode_hello(h);
    runtime::CloseAfter guard(*sock, limit);
    channel.emplace(co_await Channel::initiate(*sock, root.secret));
    co_await write_frame(*sock, *channel, FrameType::hello, hello);
  }
  if (at > 0 && rank_ == share_begin(at, nranks_, nroots))
    co_await pass_share(sock, *channel, root, roots.front(), at);
  std::vector<std::uint8_t> payload;
  if (rank_ == 0) {
    runtime::CloseAfter guard(*sock, limit);
    Frame f;
    bool late = false;
    try {
      f = co_await read_frame(*sock, *channel, max_table_frame);
    } catch (const boost::system::system_error&) {
      late = true;
    }
    if (late) {
      const std::string why = co_await who_is_missing(root);
      throw std::system_error(
          make_error_code(errc::timed_out),
          "bootstrap: no address table from the root within COCCL_TIMEOUT: " + why);
    }
    if (f.type != FrameType::table) bad("expected the address table");
    payload = std::move(f.payload);
    // Tells the root the table arrived (it then serves status queries while this link lasts).
    const std::vector<std::uint8_t> ack;
    co_await write_frame(*sock, *channel, FrameType::status, ack);
    root_link_ = sock;
  } else {
    sock.reset();
    bool late = false;
    try {
      payload = co_await table_box_.pop(limit);
    } catch (const boost::system::system_error&) {
      late = true;
    }
    if (late) {
      const std::string why = co_await who_is_missing(roots.front());
      throw std::system_error(make_error_code(errc::timed_out),
                              "bootstrap: rank " + std::to_string(rank_) +
                                  " got no address table within COCCL_TIMEOUT: " + why);
    }
  }
  table_ = decode_table(payload, nranks_);
  table_ready_.cancel();
  // Both children get the table even when one cannot: a dead child's subtree then names it, and
  // the rest of the job forms and finds the dead rank in its first operation.
  // At once: a stopped child must not hold up its sibling's subtree.
  auto unreachable_ptr = std::make_shared<std::string>();
  auto pending = std::make_shared<int>(0);
  auto forwarded = std::make_shared<asio::steady_timer>(ex_, asio::steady_timer::time_point::max());
  for (int child : {2 * rank_ + 1, 2 * rank_ + 2}) {
    if (child >= nranks_) continue;
    ++*pending;
    forwarding_.push_back(child);
    asio::co_spawn(
        ex_, forward_table(child, payload),
        [this, alive = alive_, child, unreachable_ptr, pending, forwarded](std::exception_ptr ep) {
          if (*alive) std::erase(forwarding_, child);
          if (ep && unreachable_ptr->empty()) {
            try {
              std::rethrow_exception(ep);
            } catch (const std::exception& e) {
              *unreachable_ptr = "bootstrap: could not pass the address table to rank " +
                                 std::to_string(child) + " (" + e.what() + ")";
            }
          }
          if (--*pending == 0) forwarded->cancel();
        });
  }
  if (*pending > 0) {
    boost::system::error_code ignored;
    co_await forwarded->async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
  const std::string unreachable = *unreachable_ptr;
  if (!unreachable.empty()) {
    // Ranks below the unreachable child wait for a table that will not come, and others wait for
    // links this rank will not make: tell them why, so that they name the cause, not this rank.
    co_await tell_everyone(unreachable);
    throw std::system_error(make_error_code(errc::peer_lost), unreachable);
  }
  COCCL_INFO(boot, rank_, "bootstrap done: %d ranks", nranks_);
}

asio::awaitable<void> Peers::pass_share(std::shared_ptr<tcp::socket> sock, Channel& channel,
                                        RootAddress mine, RootAddress first, int at) {
  auto limit = runtime::default_timeout();
  Frame f;
  bool late = false;
  {
    runtime::CloseAfter guard(*sock, limit);
    try {
      f = co_await read_frame(*sock, channel, max_table_frame);
    } catch (const boost::system::system_error&) {
      late = true;
    }
    if (late) {
      const std::string why = co_await who_is_missing(mine);
      throw std::system_error(make_error_code(errc::timed_out),
                              "bootstrap: no share of the address table from root " +
                                  std::to_string(at) + " within COCCL_TIMEOUT: " + why);
    }
    if (f.type != FrameType::share) bad("expected a share of the address table");
    decode_share(f.payload);
    const std::vector<std::uint8_t> ack;
    co_await write_frame(*sock, channel, FrameType::status, ack);
  }
  auto to_first =
      co_await transport::dial(ex_, first.endpoint, std::chrono::steady_clock::now() + limit);
  runtime::CloseAfter guard(*to_first, limit);
  Channel first_channel = co_await Channel::initiate(*to_first, first.secret);
  co_await write_frame(*to_first, first_channel, FrameType::share, f.payload);
  Frame answer = co_await read_frame(*to_first, first_channel, max_small_frame);
  if (answer.type == FrameType::notice) {
    std::string why(answer.payload.begin(), answer.payload.end());
    for (char& c : why)
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    throw std::system_error(
        make_error_code(errc::invalid_argument),
        "bootstrap: the first root refused the share of root " + std::to_string(at) + ": " + why);
  }
  if (answer.type != FrameType::status || !answer.payload.empty())
    bad("expected the first root to take the share");
}

asio::awaitable<void> Peers::tell_root(std::string why) {
  if (!root_) co_return;
  try {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    auto sock = co_await transport::dial(ex_, root_->endpoint, until, true);
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
      if (peer < static_cast<int>(view.failed.size()) && !view.failed[peer].empty())
        co_return "; " + view.failed[peer];
    } catch (const std::exception&) {
      co_return std::string();
    }
    pause.expires_after(std::chrono::milliseconds(100));
    boost::system::error_code ignored;
    co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
  co_return std::string();
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
  if (nranks_ <= 64) {
    for (int r = 0; r < nranks_; ++r)
      if (r != rank_ && !by_peer_[r]) whom.push_back(r);
  } else {
    for (int r : {(rank_ - 1) / 2, 2 * rank_ + 1, 2 * rank_ + 2})
      if (r >= 0 && r < nranks_ && r != rank_ && !by_peer_[r]) whom.push_back(r);
  }
  auto payload = std::make_shared<std::vector<std::uint8_t>>(encode_notice(rank_, why));
  auto left = std::make_shared<int>(static_cast<int>(whom.size()));
  // Shared: a notice still under way when the second is up completes after this returns.
  auto all_told = std::make_shared<asio::steady_timer>(ex_, std::chrono::seconds(1));
  for (int r : whom) {
    asio::co_spawn(
        ex_,
        [](asio::any_io_executor ex, tcp::endpoint ep, Secret secret,
           std::shared_ptr<std::vector<std::uint8_t>> bytes) -> asio::awaitable<void> {
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
          auto sock = co_await transport::dial(ex, ep, until, true);
          runtime::CloseAfter guard(*sock, std::chrono::seconds(1));
          Channel channel = co_await Channel::initiate(*sock, secret);
          co_await write_frame(*sock, channel, FrameType::notice, *bytes);
        }(ex_, table_[r].endpoint(), secret_, payload),
        [left, all_told](std::exception_ptr) {
          if (--*left == 0) all_told->cancel();
        });
  }
  if (!whom.empty()) {
    boost::system::error_code ignored;
    co_await all_told->async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
}

asio::awaitable<std::string> Peers::who_is_missing(const RootAddress& root) {
  std::optional<RootView> view;
  try {
    view =
        co_await query_root(ex_, root, std::chrono::steady_clock::now() + std::chrono::seconds(1));
  } catch (const std::exception&) {
  }
  if (!view) co_return "the bootstrap root does not answer either (its process may be gone)";
  if (view->arrived < view->nranks) {
    std::string missing;
    int count = 0;
    for (int r = 0; r < view->nranks; ++r) {
      if (view->seen[r]) continue;
      if (count < 16) missing += (count ? ", " : "") + std::to_string(r);
      ++count;
    }
    if (count > 16) missing += " and " + std::to_string(count - 16) + " more";
    std::string more;
    if (roots_ > 1)
      more = " (through " + std::to_string(roots_) +
             " roots; a share reaches the first root "
             "once all of its ranks reached theirs)";
    // A refused hello or share says why (other ids, a wrong share).
    for (const std::string& f : view->failed)
      if (!f.empty()) {
        more += "; " + f;
        break;
      }
    co_return std::string(count == 1 ? "rank " : "ranks ") + missing +
        (count == 1 ? " has" : " have") + " not reached the bootstrap root (" +
        std::to_string(view->arrived) + " of " + std::to_string(view->nranks) + " arrived)" + more;
  }
  if (view->rank0_lost)
    co_return "rank 0 reached the bootstrap root but could not take the address table from it "
              "(it has gone)";
  if (rank_ == 0) co_return "every rank reached the bootstrap root, which sent no table";
  // The table comes down the tree from rank 0: the first ancestor that does not answer holds it.
  std::vector<int> ancestors;
  for (int a = (rank_ - 1) / 2;; a = (a - 1) / 2) {
    ancestors.insert(ancestors.begin(), a);
    if (a == 0) break;
  }
  std::string parent_says;
  for (int a : ancestors) {
    if (a >= view->nranks) break;
    parent_says = co_await ask_about(a, view->table[a]);
    if (parent_says.find("does not answer") != std::string::npos) break;
  }
  co_return "every rank reached the bootstrap root; the table did not come down the tree (" +
      parent_says + ")";
}

asio::awaitable<std::string> Peers::ask_about(int peer, PeerInfo where) {
  std::vector<std::uint8_t> bytes;
  try {
    bytes = co_await query_rank(ex_, where, secret_,
                                std::chrono::steady_clock::now() + std::chrono::milliseconds(500));
  } catch (const std::exception&) {
    co_return "rank " + std::to_string(peer) + " does not answer (stopped, hung or gone)";
  }
  if (bytes.empty()) co_return "rank " + std::to_string(peer) + " has not formed the communicator";
  co_return "rank " + std::to_string(peer) +
      " reports: " + (status_reader_ ? status_reader_(bytes) : std::string("a status"));
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

asio::awaitable<Connection*> Peers::get(int peer, std::size_t bytes) {
  if (peer < 0 || peer >= nranks_ || peer == rank_)
    throw std::system_error(make_error_code(errc::internal), "no connection to self");
  // The running operation holds what it gets (Use), and the use counts for idleness.
  auto touch = [this, peer] {
    last_used_[peer] = std::chrono::steady_clock::now();
    if (users_ > 0) held_[peer] = period_;
    return by_peer_[peer];
  };
  co_await await_close(peer);
  if (by_peer_[peer]) co_return touch();
  if (shut_) throw LinkError(make_error_code(errc::aborted), "communicator is shut down");
  if (peer > rank_ && !dialing_[peer]) {
    dialing_[peer] = true;
    std::string gone;
    try {
      co_await dial(peer, slots_for(bytes));
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
      gone = e.what();
    }
    if (!gone.empty()) {
      // The peer went away during set-up: if its own set-up failed, the root knows why. Until
      // then this rank still counts as linking to it, so that a status query names the peer.
      const std::string because = co_await gone_because(peer);
      dialing_[peer] = false;
      announce(peer);
      throw LinkError(make_error_code(errc::peer_lost),
                      "cannot connect to rank " + std::to_string(peer) + ": " + gone + because);
    }
    dialing_[peer] = false;
    announce(peer);
    co_return touch();
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
  if (by_peer_[peer]) co_return touch();
  if (shut_) throw LinkError(make_error_code(errc::aborted), "communicator is shut down");
  if (!ec) {
    pending_[peer].reset();
    // Whatever holds the peer up is what to name: ask it.
    const std::string about = co_await ask_about(peer, table_[peer]);
    throw LinkError(
        make_error_code(errc::timed_out),
        "rank " + std::to_string(peer) + " did not connect within COCCL_TIMEOUT; " + about);
  }
  throw LinkError(make_error_code(errc::peer_lost),
                  "connection to rank " + std::to_string(peer) + " failed: " + failed_[peer]);
}

asio::awaitable<void> Peers::dial(int peer, std::size_t slots) {
  auto limit = runtime::default_timeout();
  const Kind kind = kind_for(peer);
  const bool shm = kind == Kind::shm;
  // A ring never larger than the whole budget (the budget's own check names one too small for
  // the smallest ring).
  if (budget_ > 0) slots = std::max<std::size_t>(2, std::min(slots, budget_ / options_.slot_bytes));
  Reservation room = co_await make_room(peer, slots * options_.slot_bytes);
  std::size_t seg_bytes = ShmConnection::segment_bytes(slots, options_.slot_bytes);
  auto sock = co_await transport::dial(ex_, table_[peer].endpoint(),
                                       std::chrono::steady_clock::now() + limit, true);
  Made made;
  made.slots = slots;
  const std::uint32_t want = kind == Kind::tcp ? prepare_tcp(peer, made) : 1;
  {
    runtime::CloseAfter guard(*sock, limit);
    if (shm) made.own = ShmSegment::create(seg_bytes);
    std::vector<std::uint8_t> address;
#if COCCL_HAVE_IB
    if (kind == Kind::ib) {
      made.link = std::make_unique<ib::Link>(ib_device_, slots, options_.slot_bytes, ib_qps(),
                                             ib_block_min());
      address = made.link->address().encode();
    }
#endif
    const std::string name = made.own ? made.own->name() : "";
    const std::vector<std::uint8_t> request = encode_link_request(
        {rank_, peer, static_cast<std::uint8_t>(kind), slots, options_.slot_bytes,
         std::vector<std::uint8_t>(name.begin(), name.end()), std::move(address), want});
    Channel channel = co_await Channel::initiate(*sock, secret_);
    co_await write_frame(*sock, channel, FrameType::connect, request);
    Frame f = co_await read_frame(*sock, channel, max_small_frame);
    if (f.type == FrameType::notice)
      throw std::system_error(make_error_code(errc::remote_error), decode_notice(f.payload));
    if (f.type != FrameType::accept) bad("expected accept");
    LinkReply reply = decode_link_reply(f.payload);
    const std::uint32_t sockets = reply.sockets;
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
      made.theirs =
          ShmSegment::open(std::string(reply.shm_name.begin(), reply.shm_name.end()), seg_bytes);
      made.own->unlink();  // the peer mapped it before accepting
    }
#if COCCL_HAVE_IB
    if (made.link) {
      made.link->connect(ib::LinkAddress::decode(reply.address));
      // The peer may write only once our queue pairs are ready to receive.
      const std::vector<std::uint8_t> ready;
      co_await write_frame(*sock, channel, FrameType::accept, ready);
    }
#endif
  }
  if (shut_) {
    abort_new_link(peer, std::move(*sock), std::move(made));
    throw LinkError(make_error_code(errc::aborted), "communicator is shut down");
  }
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
    if (shut_) {
      // This rank failed while the request waited for its table: the dialler must learn why, or
      // it would blame this rank for a closed stream.
      runtime::CloseAfter guard(*sock, auth_timeout());
      const auto notice = encode_notice(rank_, shut_why_);
      co_await write_frame(*sock, *channel, FrameType::notice, notice);
      co_return;
    }
    if (table_.empty())
      bad("rank " + std::to_string(peer) + " connected before this rank had the address table");
  }
  const Kind kind = kind_for(peer);
  const bool shm = kind == Kind::shm;
  Made made;
  {
    runtime::CloseAfter guard(*sock, limit);
    LinkRequest request = decode_link_request(payload);
    const std::uint32_t their_sockets = request.sockets;
    // The dialler sizes the ring (fewer slots for a small operation), up to this rank's
    // COCCL_SLOTS.
    if (request.kind != static_cast<std::uint8_t>(kind) || request.slots < 2 ||
        request.slots > options_.slots || request.slot_bytes != options_.slot_bytes ||
        their_sockets < 1 || their_sockets > 16 || (kind != Kind::tcp && their_sockets != 1))
      bad("rank " + std::to_string(peer) + " uses different link settings");
    made.slots = static_cast<std::size_t>(request.slots);
    Reservation room;
    std::string refused;
    try {
      room = co_await make_room(peer, made.slots * options_.slot_bytes);
    } catch (const LinkError& e) {
      refused = e.what();
    }
    if (!*alive) co_return;
    if (!refused.empty()) {
      // The dialler fails with the reason rather than a bare end of the connection.
      const auto notice = encode_notice(rank_, refused);
      co_await write_frame(*sock, *channel, FrameType::notice, notice);
      throw LinkError(make_error_code(errc::invalid_argument), refused);
    }
    std::size_t seg_bytes = ShmConnection::segment_bytes(made.slots, options_.slot_bytes);
    // A link has as many sockets as the end that wants fewer.
    const std::uint32_t sockets =
        kind == Kind::tcp ? std::min(their_sockets, prepare_tcp(peer, made)) : 1;
    if (sockets > 1) stripes_[peer] = std::make_unique<runtime::Mailbox<Stripe>>(ex_);
    if (shm) {
      made.theirs = ShmSegment::open(std::string(request.shm_name.begin(), request.shm_name.end()),
                                     seg_bytes);
      made.own = ShmSegment::create(seg_bytes);
    }
    std::vector<std::uint8_t> address;
#if COCCL_HAVE_IB
    if (kind == Kind::ib) {
      made.link = std::make_unique<ib::Link>(ib_device_, made.slots, options_.slot_bytes, ib_qps(),
                                             ib_block_min());
      made.link->connect(ib::LinkAddress::decode(request.address));
      address = made.link->address().encode();
    }
#endif
    const std::string name = made.own ? made.own->name() : "";
    const std::vector<std::uint8_t> reply = encode_link_reply(
        {std::vector<std::uint8_t>(name.begin(), name.end()), std::move(address), sockets});
    co_await write_frame(*sock, *channel, FrameType::accept, reply);
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
  if (!*alive) co_return;
  if (shut_) {
    abort_new_link(peer, std::move(*sock), std::move(made));
    co_return;
  }
  add_made(peer, std::move(*sock), std::move(made));
}

void Peers::abort_new_link(int peer, tcp::socket s, Made made) {
  // The peer already counts the link as made: closing it bare would read as this rank's death.
  // Make it, then abort it with the reason, as shutdown() does with the others.
  add_made(peer, std::move(s), std::move(made));
  if (Connection* c = by_peer_[peer]) {
    c->send_abort(shut_ec_, shut_why_);
    c->close(shut_ec_, shut_why_);
  }
}

void Peers::add_made(int peer, tcp::socket s, Made made) {
  const std::size_t ring = made.slots * options_.slot_bytes;
#if COCCL_HAVE_IB
  if (made.link) {
    auto c =
        std::make_unique<IbConnection>(rank_, peer, std::move(s), std::move(made.link),
                                       ib_split_bytes(), ib_poller_, user_buffers_, on_failure_);
    c->start();
    add(peer, std::move(c), ring);
    return;
  }
#endif
  if (made.own) {
    auto c = std::make_unique<ShmConnection>(rank_, peer, std::move(s), made.slots,
                                             options_.slot_bytes, std::move(made.own),
                                             std::move(made.theirs), poller_, on_failure_);
    c->start();
    add(peer, std::move(c), ring);
  } else if (made.ring) {
    std::vector<tcp::socket> sockets;
    sockets.push_back(std::move(s));
    for (auto& e : made.extra) sockets.push_back(std::move(e));
    const std::size_t n = sockets.size();
    add(peer,
        make_uring_connection(rank_, peer, std::move(sockets), std::move(made.ring), made.slots,
                              options_.slot_bytes, thread_, on_failure_),
        ring);
    COCCL_INFO(net, rank_, "tcp link to rank %d on io_uring over %zu socket(s)", peer, n);
  } else {
    auto c = std::make_unique<TcpConnection>(rank_, peer, std::move(s), made.slots,
                                             options_.slot_bytes, on_failure_);
    c->start();
    add(peer, std::move(c), ring);
  }
}

void Peers::add(int peer, std::unique_ptr<Connection> c, std::size_t ring_bytes) {
  COCCL_INFO(net, rank_, "connected to rank %d over %s (receive ring %zu bytes)", peer, c->kind(),
             ring_bytes);
  by_peer_[peer] = c.get();
  conns_.push_back(std::move(c));
  ring_of_[peer] = ring_bytes;
  ring_bytes_ += ring_bytes;
  ++link_gen_[peer];
  ++stats_.opened;
  last_used_[peer] = std::chrono::steady_clock::now();
}

Peers::LinkStats Peers::link_stats() const noexcept {
  LinkStats s = stats_;
  s.open = static_cast<int>(std::count_if(by_peer_.begin(), by_peer_.end(),
                                          [](const Connection* c) { return c != nullptr; }));
  s.ring_bytes = ring_bytes_;
  return s;
}

std::size_t Peers::slots_for(std::size_t bytes) const noexcept {
  if (bytes == 0) return options_.slots;
  const std::size_t want = (bytes + options_.slot_bytes - 1) / options_.slot_bytes;
  return std::clamp<std::size_t>(want, 2, options_.slots);
}

asio::awaitable<Peers::Reservation> Peers::make_room(int peer, std::size_t bytes) {
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
    for (int p = 0; p < nranks_; ++p)
      if (p != peer && by_peer_[p] && !held(p) && !closing_[p]) idle.push_back(p);
    const auto open = std::count_if(by_peer_.begin(), by_peer_.end(),
                                    [](const Connection* c) { return c != nullptr; });
    const std::string holding =
        std::to_string(open) + " open links hold " + text(ring_bytes_) + " of receive rings";
    if (idle.empty() && reserved_ == 0)
      throw LinkError(make_error_code(errc::invalid_argument),
                      "COCCL_MEM_BUDGET (" + text(budget_) +
                          ") is too small for this "
                          "operation: its " +
                          holding + " and none is idle, but the link to rank " +
                          std::to_string(peer) + " needs " + text(bytes) +
                          " more; raise "
                          "COCCL_MEM_BUDGET");
    std::sort(idle.begin(), idle.end(),
              [this](int a, int b) { return last_used_[a] < last_used_[b]; });
    bool closed = false;
    for (int p : idle) {
      if (!by_peer_[p] || held(p) || closing_[p] || !by_peer_[p]->settled()) continue;
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
  room.alive = alive_;
  co_return room;
}

asio::awaitable<void> Peers::await_close(int peer) {
  while (closing_[peer] && close_done_[peer]) {
    auto done = close_done_[peer];
    boost::system::error_code ignored;
    co_await done->async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
}

asio::awaitable<bool> Peers::try_close(int peer, CloseReason why) {
  Connection* c = by_peer_[peer];
  if (!c || closing_[peer] || held(peer) || !c->settled() || shut_) co_return false;
  auto alive = alive_;
  const std::uint64_t gen = link_gen_[peer];
  closing_[peer] = true;
  close_done_[peer] =
      std::make_shared<asio::steady_timer>(ex_, asio::steady_timer::time_point::max());
  // The peer closes its end first when it agrees: that end of file is not a failure.
  c->hold_failures();
  bool agreed = false;
  try {
    const auto limit = auth_timeout();
    auto sock = co_await transport::dial(ex_, table_[peer].endpoint(),
                                         std::chrono::steady_clock::now() + limit, true);
    runtime::CloseAfter guard(*sock, limit);
    Channel channel = co_await Channel::initiate(*sock, secret_);
    Writer w;
    w.put<std::int32_t>(rank_).put<std::int32_t>(peer).put(static_cast<std::uint8_t>(why));
    co_await write_frame(*sock, channel, FrameType::close, w.bytes());
    Frame f = co_await read_frame(*sock, channel, max_small_frame);
    agreed = f.type == FrameType::status && f.payload.size() == 1 && f.payload[0] == 1;
  } catch (const std::exception& e) {
    // Unreachable, or gone: the link itself reports that once failures are not held.
    if (*alive)
      COCCL_INFO(net, rank_, "asking rank %d to close the link failed: %s", peer, e.what());
  }
  if (!*alive) co_return false;
  closing_[peer] = false;
  if (auto done = std::exchange(close_done_[peer], nullptr)) done->cancel();
  // The peer may have closed the link meanwhile on its own request (link_gen_ moved on).
  if (link_gen_[peer] != gen || !by_peer_[peer]) co_return agreed;
  if (agreed) {
    retire(peer, why);
    co_return true;
  }
  by_peer_[peer]->release_failures();
  co_return false;
}

asio::awaitable<void> Peers::serve_close(std::shared_ptr<tcp::socket> s,
                                         std::shared_ptr<Channel> channel, Frame f) {
  auto alive = alive_;
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
      bad("a malformed request to close a link");
    why = static_cast<CloseReason>(reason);
  } catch (const std::exception& e) {
    drops_.dropped(e.what());
    co_return;
  }
  // Agreed when this end is settled and not in use; when both ends ask at once, the lower rank's
  // request wins.
  Connection* c = by_peer_[from];
  const bool agree =
      c && !dialing_[from] && !held(from) && c->settled() && !(closing_[from] && rank_ < from);
  if (agree) retire(from, why);
  try {
    runtime::CloseAfter guard(*s, auth_timeout());
    const std::vector<std::uint8_t> answer{static_cast<std::uint8_t>(agree ? 1 : 0)};
    co_await write_frame(*s, *channel, FrameType::status, answer);
  } catch (const std::exception& e) {
    // The asker keeps its end until it hears: a lost answer leaves it to fail on its own.
    if (*alive && !shut_) drops_.dropped(reason(e));
  }
}

void Peers::retire(int peer, CloseReason why) {
  Connection* c = by_peer_[peer];
  if (!c) return;
  by_peer_[peer] = nullptr;
  ++link_gen_[peer];
  ring_bytes_ -= ring_of_[peer];
  ring_of_[peer] = 0;
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
  asio::post(ex_, [this, alive = alive_] {
    if (*alive) retired_.clear();
  });
}

void Peers::arm_idle_timer() {
  idle_timer_.expires_after(
      std::max<std::chrono::steady_clock::duration>(idle_ / 4, std::chrono::milliseconds(10)));
  idle_timer_.async_wait([this, alive = alive_](boost::system::error_code ec) {
    if (ec || !*alive || shut_) return;
    const auto now = std::chrono::steady_clock::now();
    for (int p = 0; p < nranks_; ++p) {
      Connection* c = by_peer_[p];
      if (!c || closing_[p] || held(p) || now - last_used_[p] < idle_ || !c->settled()) continue;
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
  if (notify && !table_.empty()) {
    ++*telling_;
    asio::co_spawn(ex_, tell_everyone(why),
                   [telling = telling_](std::exception_ptr) { --*telling; });
  }
  // The listener stays open until the communicator is destroyed: it answers status queries and
  // liveness probes, takes shrink requests (recovery), and answers link requests with the reason.
  table_box_.fail(asio::error::operation_aborted);
  for (auto& box : stripes_)
    if (box) box->fail(asio::error::operation_aborted);
  table_ready_.cancel();
  idle_timer_.cancel();
  for (int p = 0; p < nranks_; ++p) announce(p);
  for (auto& c : conns_) {
    if (notify)
      c->send_abort(ec, why);
    else
      c->send_goodbye();
    c->close(ec, why);
  }
}

namespace {

// One question and its answer on a fresh authenticated connection, all before `until`.
asio::awaitable<Frame> ask(asio::any_io_executor ex, const tcp::endpoint& ep, Secret secret,
                           std::size_t max_answer, std::chrono::steady_clock::time_point until) {
  auto sock = co_await transport::dial(ex, ep, until);
  auto left = std::max<std::chrono::steady_clock::duration>(
      until - std::chrono::steady_clock::now(), std::chrono::milliseconds(1));
  runtime::CloseAfter guard(*sock, left);
  try {
    Channel channel = co_await Channel::initiate(*sock, secret);
    const std::vector<std::uint8_t> nothing;
    co_await write_frame(*sock, channel, FrameType::status_query, nothing);
    Frame f = co_await read_frame(*sock, channel, max_answer);
    if (f.type != FrameType::status) bad("expected a status answer from " + text_of(ep));
    co_return f;
  } catch (const boost::system::system_error& e) {
    if (std::chrono::steady_clock::now() >= until)
      throw std::system_error(make_error_code(errc::timed_out),
                              "no status answer from " + text_of(ep) + " in time");
    throw std::system_error(make_error_code(errc::peer_lost),
                            text_of(ep) + " ended the status query: " + e.code().message());
  }
}

}  // namespace

asio::awaitable<RootView> query_root(asio::any_io_executor ex, const RootAddress& root,
                                     std::chrono::steady_clock::time_point until) {
  Frame f = co_await ask(ex, root.endpoint, root.secret, max_table_frame, until);
  co_return decode_root_view(f.payload);
}

asio::awaitable<std::vector<std::uint8_t>> query_rank(asio::any_io_executor ex,
                                                      const PeerInfo& peer, Secret secret,
                                                      std::chrono::steady_clock::time_point until) {
  Frame f = co_await ask(ex, peer.endpoint(), secret, max_status_frame, until);
  co_return std::move(f.payload);
}

}  // namespace coccl::transport
