#include "transport/host_leader.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstring>
#include <span>

#include "runtime/deadline.hpp"
#include "runtime/log.hpp"
#include "transport/admission.hpp"
#include "transport/hmac.hpp"

namespace coccl::params {

config::Param<bool> host_leaders{
    "COCCL_HOST_LEADERS", true,
    "ranks of one host meet first and one of them carries their hellos to the bootstrap root, "
    "so that the root sees hosts, not ranks (0: every rank says hello itself)"};

}  // namespace coccl::params

namespace coccl::transport {

std::string host_meeting_name(const RootAddress& root, std::uint64_t host) {
  Writer w;
  w.put(root.secret).put(root.address.addr).put(root.address.port).put(host);
  const char tag[] = "coccl host leader";
  w.put_bytes({reinterpret_cast<const std::uint8_t*>(tag), sizeof tag - 1});
  const auto d = detail::sha256(w.bytes().data(), w.bytes().size());
  return "coccl-" + to_hex(std::span<const std::uint8_t>(d.data(), 16));
}

namespace {

// Follower connections a leader answers at once; beyond that a newcomer is closed and says hello
// to the root itself (the name is reachable by any process of the host, which must not be able
// to hold the leader's descriptors).
constexpr int max_handshakes = 256;

// A follower's side: hand `hello` to the leader on `s` and wait until it is written to the root;
// the channel then carries the table. Nothing on any refusal or failure (the caller then says
// hello itself).
asio::awaitable<std::optional<Channel>> hello_to_leader(
    std::shared_ptr<Stream> s, const Secret& secret, const Hello& hello,
    std::chrono::steady_clock::time_point until) {
  // A leader that stopped or died must not hold this rank's hello until COCCL_TIMEOUT: the root
  // would then name this rank as missing, not the leader. After a quarter of it (or the
  // handshake limit, if shorter) the rank says hello itself; should the leader carry the hello
  // after all, the root drops the second one.
  const auto patience =
      std::min<std::chrono::steady_clock::duration>(auth_timeout(), runtime::default_timeout() / 4);
  try {
    std::optional<Channel> channel;
    {
      runtime::CloseAfter guard(*s, patience);
      channel.emplace(co_await Channel::initiate(*s, secret));
      const std::vector<std::uint8_t> payload = encode_hello(hello);
      co_await write_frame(*s, *channel, FrameType::hello, payload);
    }
    // The leader answers once the hello is written to the root.
    runtime::CloseAfter guard(*s, std::min<std::chrono::steady_clock::duration>(
                                      patience, until - std::chrono::steady_clock::now()));
    Frame f = co_await read_frame(*s, *channel, max_small_frame);
    if (f.type == FrameType::status && f.payload.empty()) co_return std::move(channel);
    if (f.type == FrameType::notice) {
      COCCL_INFO(boot, hello.rank, "the host's leader did not carry this rank's hello (%s)",
                 printable(f.payload).c_str());
    }
  } catch (const std::exception& e) {
    COCCL_INFO(boot, hello.rank, "meeting the host's leader failed (%s)", drop_reason(e).c_str());
  }
  co_return std::nullopt;
}

}  // namespace

// The followers whose hellos went into one write to the root: they learn together how it went.
struct HostLeader::Batch {
  explicit Batch(asio::any_io_executor ex) : done(ex, asio::steady_timer::time_point::max()) {}
  asio::steady_timer done;  // cancelled when the write ended
  bool ok = false;
};

HostLeader::HostLeader(asio::any_io_executor ex, const Secret& secret, const Hello& own)
    : ex_(ex), secret_(secret), own_(own), acceptor_(ex) {}

HostLeader::~HostLeader() { stop(); }

void HostLeader::stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  if (root_) root_->close(ignored);
  if (batch_) batch_->done.cancel();
  pending_.clear();
  // Followers still waiting for a table that will not come say hello to the root themselves.
  for (Follower& f : followers_) f.link->close(ignored);
  followers_.clear();
}

asio::awaitable<void> HostLeader::pass_tables(const DirectoryFrame& frame, int nranks) {
  for (Follower& f : std::exchange(followers_, {})) {
    boost::system::error_code ignored;
    try {
      const int one[] = {f.rank};
      const std::vector<std::uint8_t> payload = directory_for(frame, needs_of(one, nranks));
      runtime::CloseAfter guard(*f.link, auth_timeout());
      co_await write_frame(*f.link, f.channel, FrameType::table, payload);
    } catch (const std::exception& e) {
      // The root took this follower's own hello as well (it gave up on this leader), or the
      // follower went: either way it asks the root itself.
      COCCL_INFO(boot, own_.rank, "host leader: rank %d's table was not passed on (%s)", f.rank,
                 e.what());
    }
    f.link->close(ignored);
  }
}

asio::awaitable<std::vector<std::uint8_t>> HostLeader::take_table(
    std::chrono::steady_clock::time_point until) {
  if (!root_ || stopped_) bad_message("the host's leader has no connection to the root");
  runtime::CloseAfter guard(*root_, runtime::time_left(until));
  Frame f = co_await read_frame(*root_, *channel_, max_table_frame);
  if (f.type != FrameType::table) bad_message("expected the address table from the root");
  co_return std::move(f.payload);
}

asio::awaitable<void> HostLeader::accept_loop(std::shared_ptr<HostLeader> self) {
  while (!stopped_) {
    boost::system::error_code ec;
    Stream accepted =
        co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (stopped_) co_return;
    if (ec) {
      // Out of descriptors, or the like: the host's other ranks go to the root themselves.
      COCCL_INFO(boot, own_.rank, "host leader stops taking hellos: %s", ec.message().c_str());
      acceptor_.close(ec);
      co_return;
    }
    auto follower = std::make_shared<Stream>(std::move(accepted));
    if (handshakes_ >= max_handshakes) {
      follower->close(ec);
      continue;
    }
    asio::co_spawn(ex_, serve(self, follower), asio::detached);
  }
}

asio::awaitable<void> HostLeader::serve(std::shared_ptr<HostLeader> self,
                                        std::shared_ptr<Stream> follower) {
  ++handshakes_;
  std::optional<Channel> channel;
  std::string refusal;
  int rank = -1;
  std::shared_ptr<Batch> batch;
  try {
    runtime::CloseAfter guard(*follower, auth_timeout());
    channel.emplace(co_await Channel::respond(*follower, secret_));
    Frame f = co_await read_frame(*follower, *channel, max_small_frame);
    if (f.type != FrameType::hello) bad_message("expected a hello");
    const Hello h = decode_hello(f.payload);
    rank = h.rank;
    if (h.nranks != own_.nranks || h.roots != own_.roots || h.ids != own_.ids)
      refusal = "it was given other ids, or another size, than the leader (rank " +
                std::to_string(own_.rank) + ")";
    else if (h.rank == own_.rank || h.rank < 0 || h.rank >= h.nranks)
      refusal = "its rank " + std::to_string(h.rank) + " is out of range or the leader's own";
    else if (stopped_)
      refusal = "the leader has stopped";
    if (refusal.empty()) {
      if (!batch_) batch_ = std::make_shared<Batch>(ex_);
      batch = batch_;
      pending_.push_back(h);
      if (!writing_) {
        writing_ = true;
        asio::co_spawn(ex_, write_loop(self), asio::detached);
      }
    }
  } catch (const std::exception& e) {
    --handshakes_;
    COCCL_INFO(boot, own_.rank, "host leader dropped a connection: %s", drop_reason(e).c_str());
    co_return;
  }
  --handshakes_;
  if (batch) {
    // The follower waits as long as the leader may take to reach the root (COCCL_TIMEOUT).
    boost::system::error_code ignored;
    co_await batch->done.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    if (!batch->ok) refusal = "the leader could not write it to the root";
  }
  try {
    runtime::CloseAfter guard(*follower, auth_timeout());
    if (refusal.empty()) {
      const std::vector<std::uint8_t> none;
      co_await write_frame(*follower, *channel, FrameType::status, none);
    } else {
      const std::vector<std::uint8_t> why(refusal.begin(), refusal.end());
      co_await write_frame(*follower, *channel, FrameType::notice, why);
    }
  } catch (const std::exception&) {
    // The follower went away; had its hello been written, the root has it.
    co_return;
  }
  // Carried: the follower now waits on this connection for its table (pass_tables). A leader
  // that stopped meanwhile closes it, and the follower asks the root.
  if (refusal.empty() && !stopped_) followers_.push_back({rank, follower, std::move(*channel)});
}

asio::awaitable<void> HostLeader::write_loop([[maybe_unused]] std::shared_ptr<HostLeader> self) {
  // The caller set writing_: one write loop at a time, or frames would interleave on root_.
  while (!pending_.empty() && !stopped_) {
    // Followers that arrive while this is written join batch_ and go in the next write; the
    // batch is answered once everything in it has been written.
    const std::size_t take = std::min(pending_.size(), max_hellos_per_frame);
    const std::vector<Hello> hellos(pending_.begin(), pending_.begin() + take);
    pending_.erase(pending_.begin(), pending_.begin() + take);
    try {
      const std::vector<std::uint8_t> payload = encode_hellos(hellos);
      runtime::CloseAfter guard(*root_, runtime::default_timeout());
      co_await write_frame(*root_, *channel_, FrameType::hellos, payload);
    } catch (const std::exception& e) {
      // The followers waiting, and any later ones, go to the root themselves.
      COCCL_INFO(boot, own_.rank, "host leader: writing hellos to the root failed: %s", e.what());
      stop();
      break;
    }
    carried_ += hellos.size();
    if (pending_.empty() && batch_) {
      batch_->ok = true;
      batch_->done.cancel();
      batch_.reset();
    }
  }
  writing_ = false;
}

asio::awaitable<HostHello> hello_on_host(asio::any_io_executor ex, const RootAddress& root,
                                         const Hello& hello, bool memory,
                                         std::shared_ptr<Traffic> traffic,
                                         std::chrono::steady_clock::time_point until) {
  const std::string name = host_meeting_name(root, hello.info.host_hash);
  // Twice: another rank may take the name between this rank's dial and its own listen.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (auto s = co_await dial_local(ex, name, memory, traffic)) {
      HostHello met;
      met.channel = co_await hello_to_leader(s, root.secret, hello, until);
      if (met.channel) met.link = std::move(s);
      co_return met;
    }
    auto leader = std::make_shared<HostLeader>(ex, root.secret, hello);
    if (!leader->acceptor_.listen_local(name, memory, traffic)) continue;
    // Followers queue in the listener's backlog until the root link is up.
    auto [sock, channel] = co_await dial_root(ex, root, until, traffic, hello.rank);
    // Hellos follow one another on this link with no answer between them: without TCP_NODELAY
    // each waited for the root's delayed acknowledgement of the one before (about 40 ms each).
    if (auto* socket = sock->tcp()) {
      boost::system::error_code ignored;
      socket->set_option(asio::ip::tcp::no_delay(true), ignored);
    }
    leader->root_ = std::move(sock);
    leader->channel_.emplace(std::move(channel));
    leader->pending_.push_back(hello);
    leader->writing_ = true;
    co_await leader->write_loop(leader);
    if (leader->carried_ == 0) {
      // Its own hello did not go: say hello directly, as every other rank would.
      leader->stop();
      co_return HostHello{};
    }
    asio::co_spawn(ex, leader->accept_loop(leader), asio::detached);
    HostHello led;
    led.leader = std::move(leader);
    co_return led;
  }
  co_return HostHello{};
}

}  // namespace coccl::transport
