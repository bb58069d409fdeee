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
#include <map>
#include <optional>
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

constexpr std::uint32_t id_magic = 0x31444343u;        // "CCD1"
constexpr std::uint32_t root_view_magic = 0x52565743;  // "CWVR"

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
  bool rank0_left = false;  // rank 0 took the table, then its connection ended without a goodbye
  std::map<int, std::string> failures;  // ranks whose set-up failed, and why (their notices)
  bool done = false;                    // serving nothing more
  std::vector<PeerInfo> table;
  std::vector<bool> seen;
  std::vector<std::int32_t> via;  // per rank: whose connection carried its hello
  // The first rank of this root's share (rank 0 at root 0): it takes the table, or the share.
  std::shared_ptr<Stream> rank0;
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
    via.assign(n, -1);
  }

  void finish() {
    done = true;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    deadline.cancel();
    retry.cancel();
  }
};

// Every rank's entry, with the count of ranks on its host, for rank 0 to pass down the tree.
std::vector<std::uint8_t> encode_whole_table(const std::vector<PeerInfo>& table) {
  std::unordered_map<std::uint64_t, std::uint32_t> on_host;
  for (const PeerInfo& p : table) ++on_host[p.host_hash];
  DirectoryHeader h;
  h.nranks = static_cast<std::uint32_t>(table.size());
  h.hosts = static_cast<std::uint32_t>(on_host.size());
  h.full = static_cast<std::int64_t>(table.size()) <= params::directory_full.get() ? 1 : 0;
  std::vector<DirectoryEntry> entries;
  entries.reserve(table.size());
  for (std::size_t r = 0; r < table.size(); ++r)
    entries.push_back({static_cast<std::int32_t>(r), table[r], on_host[table[r].host_hash]});
  return encode_directory(h, entries);
}

asio::awaitable<bool> root_distribute(std::shared_ptr<Root> root) {
  // Root 0 sends the whole table to rank 0; another root sends its share to its first rank,
  // which passes it on to root 0.
  std::vector<std::uint8_t> payload;
  if (root->index == 0) {
    payload = encode_whole_table(root->table);
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
  w.put<std::uint8_t>(root.rank0_lost ? 1 : root.rank0_left ? 2 : 0);
  for (int r = 0; r < n; ++r) {
    w.put<std::uint8_t>(root.seen[r] ? 1 : 0);
    w.put(root.table[r]);
    w.put<std::int32_t>(root.via[r]);
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
  if (r.get<std::uint32_t>() != root_view_magic) bad_message("not a root's status answer");
  RootView v;
  v.nranks = r.get<std::int32_t>();
  v.arrived = r.get<std::int32_t>();
  const auto rank0 = r.get<std::uint8_t>();
  if (rank0 > 2) bad_message("root's status answer has an unknown state of rank 0");
  v.rank0_lost = rank0 == 1;
  v.rank0_left = rank0 == 2;
  // Each rank takes 1 + sizeof(PeerInfo) + 4 bytes: a count the payload cannot hold is refused
  // before anything is allocated for it.
  const std::size_t per_rank = 1 + sizeof(PeerInfo) + sizeof(std::int32_t);
  if (v.nranks < 0 || v.arrived < 0 || v.arrived > v.nranks ||
      static_cast<std::size_t>(v.nranks) > payload.size() / per_rank)
    bad_message("root's status answer has an impossible size");
  v.seen.resize(v.nranks);
  v.table.resize(v.nranks);
  v.via.resize(v.nranks);
  for (int i = 0; i < v.nranks; ++i) {
    v.seen[i] = r.get<std::uint8_t>() != 0;
    v.table[i] = r.get<PeerInfo>();
    v.via[i] = r.get<std::int32_t>();
  }
  v.failed.resize(v.nranks);
  const auto failures = r.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < failures; ++i) {
    const int rank = r.get<std::int32_t>();
    auto text = r.get_bytes();
    if (rank < 0 || rank >= v.nranks) bad_message("root's status answer names a rank out of range");
    v.failed[rank].assign(text.begin(), text.end());
  }
  if (!r.done()) bad_message("trailing bytes after the root's status answer");
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

// The others wait for a table that will not come and ask who is missing when they give up: the
// root answers for one more COCCL_TIMEOUT, then closes. Each of them gives up COCCL_TIMEOUT after
// its hello, which came before the table formed, and then takes up to a second to ask: the margin
// keeps the root up for the last of them even when rank 0 went at once.
void root_linger(const std::shared_ptr<Root>& root) {
  root->deadline.expires_after(runtime::default_timeout() + std::chrono::seconds(5));
  root->deadline.async_wait([root](boost::system::error_code e) {
    if (!e) root->finish();
  });
}

// Once formed, root 0 serves status queries until rank 0 says goodbye (Peers::leave_root); rank 0
// holds its connection for the life of its communicator and writes nothing else on it. A
// connection that ends without the goodbye means rank 0 is gone, perhaps before it passed the
// table down the tree: the ranks still waiting for it must be able to learn that here.
asio::awaitable<bool> root_hears_goodbye(std::shared_ptr<Root> root) {
  try {
    Frame f = co_await read_frame(*root->rank0, *root->rank0_channel, max_small_frame);
    co_return f.type == FrameType::close&& f.payload.empty();
  } catch (const std::exception&) {
  }
  co_return false;
}

asio::awaitable<void> root_watch_rank0(std::shared_ptr<Root> root) {
  const bool goodbye = co_await root_hears_goodbye(root);
  if (goodbye || root->done) {
    root->finish();
    co_return;
  }
  root->rank0_left = true;
  root_linger(root);
}

// Every rank (and share) the root must see has arrived: pass the table (or share) on.
asio::awaitable<void> root_complete(std::shared_ptr<Root> root) {
  root->formed = true;
  root->deadline.cancel();
  // Apart, not `co_await a && co_await b`: GCC 12 miscompiles co_await inside && and ||
  // operands (the frame was resumed in a state it never reached).
  bool taken = co_await root_distribute(root);
  if (taken) taken = co_await root_table_taken(root);
  if (taken) {
    // Root 0 serves status queries while rank 0 lives; another root's work ends with its share.
    if (root->index == 0)
      co_await root_watch_rank0(root);
    else
      root->finish();
  } else {
    root->rank0_lost = true;
    root_linger(root);
  }
}

// Root 0 of several: another root's share, passed on by its first rank. Answered with an empty
// status frame when taken, else a notice with the reason (the rank fails with it).
asio::awaitable<void> root_take_share(std::shared_ptr<Root> root, std::shared_ptr<Stream> sock,
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
      root->via[share.first + i] = share.first;
    }
    root->arrived += static_cast<int>(share.entries.size());
  }
  // Decided now, not after the answer below: a hello or share that arrives while it is written
  // may complete the count, and the table must go to rank 0 once (two writers on its connection
  // interleave their frames).
  const bool completes = refusal.empty() && root->arrived == root->expect;
  try {
    runtime::CloseAfter guard(*sock, auth_timeout());
    const std::vector<std::uint8_t> answer(refusal.begin(), refusal.end());
    co_await write_frame(*sock, channel, refusal.empty() ? FrameType::status : FrameType::notice,
                         answer);
  } catch (const std::exception& e) {
    COCCL_WARN(boot, -1, "bootstrap root: answering a share failed: %s", e.what());
  }
  if (completes) co_await root_complete(root);
}

// Takes one hello: true when it counted. `via`: the rank whose connection carried it; `direct`:
// that connection is the hello's rank's own, not a host leader's. Only a direct hello's connection
// can carry the table (or share) to the first rank of this root's share, so that rank's hello must
// not come through a leader.
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
  else if (at != root.index)
    refusal = "rank " + std::to_string(rank) + " says hello to root " + std::to_string(root.index) +
              ", but its share belongs to root " + std::to_string(at);
  else if (!direct && rank == root.first)
    refusal = "rank " + std::to_string(rank) +
              " takes the table from the root, so it must say hello itself, not through its "
              "host's leader";
  if (!refusal.empty()) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped a hello: %s", refusal.c_str());
    if (root.failures.size() < 1024) root.failures[rank] = refusal;
    return false;
  }
  if (root.seen[rank]) {
    COCCL_WARN(boot, -1, "bootstrap root: dropped a second hello from rank %d", rank);
    return false;
  }
  root.seen[rank] = true;
  root.table[rank] = hello.info;
  root.via[rank] = via;
  ++root.arrived;
  return true;
}

// A host's leader: its frames of hellos until the communicator forms or the leader closes (its
// own table arrived, or it failed; its host's other ranks then say hello themselves).
asio::awaitable<void> root_serve_leader(std::shared_ptr<Root> root, std::shared_ptr<Stream> sock,
                                        Channel channel, std::vector<std::uint8_t> payload) {
  int leader = -1;
  for (;;) {
    std::vector<Hello> hellos;
    try {
      hellos = decode_hellos(payload);
    } catch (const std::exception& e) {
      if (!root->done) root->drops.dropped(drop_reason(e));
      co_return;
    }
    if (root->done || root->formed || root->expired) co_return;
    // The leader's own hello comes first on its connection.
    if (leader < 0) leader = hellos.front().rank;
    for (const Hello& h : hellos) root_admit(*root, h, leader, false);
    if (root->arrived == root->expect) {
      // Nothing more will come on this connection: release it before the long wait below.
      boost::system::error_code ignored;
      sock->close(ignored);
      co_await root_complete(root);
      co_return;
    }
    try {
      runtime::CloseAfter guard(*sock, runtime::default_timeout());
      Frame f = co_await read_frame(*sock, channel, max_table_frame);
      if (f.type != FrameType::hellos) bad_message("expected more hellos from a host's leader");
      payload = std::move(f.payload);
    } catch (const std::exception&) {
      // Closed by the leader (its table came: every hello is in), or the link failed.
      co_return;
    }
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
  if (root->done || root->formed || root->expired) co_return;
  if (!root_admit(*root, hello, hello.rank, true)) co_return;
  if (hello.rank == root->first) {
    root->rank0 = sock;
    root->rank0_channel = std::move(channel);
  }
  if (root->arrived == root->expect) co_await root_complete(root);
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

asio::awaitable<void> Peers::forward_table(int child, std::vector<std::uint8_t> payload) {
  auto until = std::chrono::steady_clock::now() + runtime::default_timeout();
  const PeerInfo* where = directory_.find(child);
  if (!where) bad_message("no entry for tree child " + std::to_string(child));
  auto sock = co_await transport::dial(ex_, *where, until, true, traffic_);
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
    if (leader_) std::exchange(leader_, nullptr)->stop();
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
  for (const RootAddress& r : roots) w.put(r.secret).put(r.address.addr).put(r.address.port);
  auto d = detail::sha256(w.bytes().data(), w.bytes().size());
  std::uint64_t v;
  std::memcpy(&v, d.data(), sizeof v);
  return v;
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
  // share other than root 0's passes that share on to root 0, which then has every entry.
  const int nroots = static_cast<int>(roots.size());
  const int at = root_of(rank_, nranks_, nroots);
  const RootAddress root = roots[at];
  const bool first_of_share = rank_ == share_begin(at, nranks_, nroots);
  const Hello h{rank_, nranks_, self_info(), static_cast<std::uint32_t>(nroots), digest_of(roots)};
  // The first rank of a share takes the table (or share) on its own connection to the root;
  // the others meet on their host first, and one of them carries all their hellos.
  bool sent = false;
  if (!first_of_share && params::host_leaders.get()) {
    HostHello met = co_await hello_on_host(ex_, root, h, options_.memory, traffic_, until);
    sent = met.sent;
    leader_ = std::move(met.leader);
  }
  std::shared_ptr<Stream> sock;
  std::optional<Channel> channel;
  if (!sent) {
    auto [s, c] = co_await dial_root(ex_, root, until, traffic_, rank_);
    sock = std::move(s);
    channel.emplace(std::move(c));
    const std::vector<std::uint8_t> hello = encode_hello(h);
    runtime::CloseAfter guard(*sock, limit);
    co_await write_frame(*sock, *channel, FrameType::hello, hello);
  }
  if (at > 0 && first_of_share) co_await pass_share(sock, *channel, root, roots.front(), at);
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
    if (f.type != FrameType::table) bad_message("expected the address table");
    payload = std::move(f.payload);
    // Tells the root the table arrived (it then serves status queries while this link lasts).
    const std::vector<std::uint8_t> ack;
    co_await write_frame(*sock, *channel, FrameType::status, ack);
    root_link_ = sock;
    root_channel_ = std::move(channel);
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
  // Every hello has reached the root: a leader of this host has nothing more to carry.
  if (leader_) std::exchange(leader_, nullptr)->stop();
  DirectoryFrame frame = decode_directory(payload, nranks_);
  payload = {};
  directory_.assign(frame, rank_);
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
    asio::co_spawn(ex_, forward_table(child, directory_for_child(frame, child)),
                   [this, pass = gate_.enter(), child, unreachable_ptr, pending,
                    forwarded](std::exception_ptr ep) {
                     // A child that could not take the table stays named in this rank's status
                     // while the others are told (tell_everyone below): a peer that asks meanwhile
                     // learns which rank holds this one up, not "idle".
                     if (pass.open() && !ep) std::erase(forwarding_, child);
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

asio::awaitable<void> Peers::pass_share(std::shared_ptr<Stream> sock, Channel& channel,
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
    if (f.type != FrameType::share) bad_message("expected a share of the address table");
    decode_share(f.payload);
    const std::vector<std::uint8_t> ack;
    co_await write_frame(*sock, channel, FrameType::status, ack);
  }
  auto to_first = co_await transport::dial(
      ex_, first.address, std::chrono::steady_clock::now() + limit, false, traffic_);
  runtime::CloseAfter guard(*to_first, limit);
  Channel first_channel = co_await Channel::initiate(*to_first, first.secret);
  co_await write_frame(*to_first, first_channel, FrameType::share, f.payload);
  Frame answer = co_await read_frame(*to_first, first_channel, max_small_frame);
  if (answer.type == FrameType::notice) {
    const std::string why = printable(answer.payload);
    throw std::system_error(
        make_error_code(errc::invalid_argument),
        "bootstrap: the first root refused the share of root " + std::to_string(at) + ": " + why);
  }
  if (answer.type != FrameType::status || !answer.payload.empty())
    bad_message("expected the first root to take the share");
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
  const std::string parent_says = co_await ancestors_say(rank_, &view->table);
  const std::string left = view->rank0_left ? "; rank 0 took it from the root, then its connection "
                                              "to the root ended without a goodbye (its process "
                                              "may be gone)"
                                            : "";
  co_return "every rank reached the bootstrap root; the table did not come down the tree (" +
      parent_says + ")" + left;
}

asio::awaitable<std::string> Peers::ancestors_say(int target, const std::vector<PeerInfo>* table) {
  if (target <= 0) co_return std::string();
  // The table comes down the tree from rank 0: the first ancestor that does not answer holds it.
  std::vector<int> ancestors;
  for (int a = (target - 1) / 2;; a = (a - 1) / 2) {
    ancestors.insert(ancestors.begin(), a);
    if (a == 0) break;
  }
  std::string said;
  for (int a : ancestors) {
    if (table && a >= static_cast<int>(table->size())) break;
    said = co_await ask_about(a, table ? std::optional<PeerInfo>((*table)[a]) : std::nullopt);
    if (said.find("does not answer") != std::string::npos) break;
  }
  co_return said;
}

namespace {

// One question and its answer on a fresh authenticated connection, all before `until`.
asio::awaitable<Frame> ask(asio::any_io_executor ex, PeerInfo ep, Secret secret,
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
