// Tests for the UniqueId text form and for the bootstrap root's resistance to strangers: garbage,
// frames authenticated with the wrong secret and silent connections are dropped, and the honest
// ranks (threads of this process) still form their communicator and run an all_reduce.
#include "transport/bootstrap.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <coccl/coccl.hpp>
#include <functional>
#include <latch>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "collectives/comm.hpp"
#include "runtime/deadline.hpp"
#include "tests/support/code_of.hpp"
#include "tests/support/param_override.hpp"
#include "transport/admission.hpp"
#include "transport/host_leader.hpp"
#include "transport/wire.hpp"

namespace coccl {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

std::error_code code_of_from_string(std::string_view text) {
  return test::code_of([&] { UniqueId::from_string(text); });
}

UniqueId patterned_id() {
  UniqueId id;
  for (std::size_t i = 0; i < id.bytes.size(); ++i)
    id.bytes[i] = static_cast<std::uint8_t>(i * 7 + 3);
  return id;
}

TEST(UniqueIdText, RoundTripsThroughToStringAndFromString) {
  UniqueId id = patterned_id();
  std::string text = id.to_string();
  EXPECT_EQ(text.size(), 256u);
  EXPECT_EQ(text.substr(0, 6), "030a11");
  EXPECT_EQ(UniqueId::from_string(text), id);
}

TEST(UniqueIdText, AcceptsUpperCaseHex) {
  UniqueId id = patterned_id();
  std::string text = id.to_string();
  for (auto& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(UniqueId::from_string(text), id);
}

TEST(UniqueIdText, RejectsTextOfTheWrongLength) {
  std::string text = patterned_id().to_string();
  EXPECT_EQ(code_of_from_string(text.substr(0, 255)), errc::invalid_argument);
  EXPECT_EQ(code_of_from_string(text + "0"), errc::invalid_argument);
  EXPECT_EQ(code_of_from_string(text + "00"), errc::invalid_argument);
  EXPECT_EQ(code_of_from_string(""), errc::invalid_argument);
}

TEST(UniqueIdText, RejectsNonHexDigits) {
  std::string text = patterned_id().to_string();
  for (char bad : {'g', 'G', ' ', '-', 'x'}) {
    std::string t = text;
    t[100] = bad;
    EXPECT_EQ(code_of_from_string(t), errc::invalid_argument) << "digit '" << bad << "'";
  }
}

std::error_code code_of_split(const std::string& text) {
  return test::code_of([&] { transport::split_endpoint(text); });
}

TEST(EndpointText, SplitsHostAndPort) {
  auto hp = transport::split_endpoint("[::1]:0080");
  EXPECT_EQ(hp.host, "::1");
  EXPECT_EQ(hp.port, 80);
  EXPECT_EQ(transport::parse_endpoint("10.1.2.3:65535"),
            tcp::endpoint(asio::ip::make_address("10.1.2.3"), 65535));
}

TEST(EndpointText, RejectsAPortThatIsNotANumberAsInvalidArgument) {
  // std::stoul's own exception used to escape (not a std::system_error).
  EXPECT_EQ(code_of_split("node:http"), errc::invalid_argument);
  EXPECT_EQ(code_of_split("node: 80"), errc::invalid_argument);
  EXPECT_EQ(code_of_split("node:80x"), errc::invalid_argument);
}

TEST(EndpointText, RejectsAPortOutOfRangeInsteadOfWrappingIt) {
  // 70000 used to become port 4464, and -1 port 65535.
  EXPECT_EQ(code_of_split("10.0.0.1:70000"), errc::invalid_argument);
  EXPECT_EQ(code_of_split("10.0.0.1:-1"), errc::invalid_argument);
  EXPECT_EQ(code_of_split("10.0.0.1:99999999999999999999999"), errc::invalid_argument);
}

TEST(UniqueIdEncoding, DecodeOfACreatedIdNamesAListeningRoot) {
  UniqueId id = UniqueId::create();
  auto root = transport::decode(id);
  EXPECT_NE(root.endpoint().port(), 0);
  EXPECT_EQ(transport::encode(root), id);
  asio::io_context io;
  tcp::socket s(io);
  boost::system::error_code ec;
  s.connect(root.endpoint(), ec);
  EXPECT_FALSE(ec) << ec.message();
}

TEST(UniqueIdEncoding, TwoCreatedIdsHaveDifferentSecrets) {
  auto a = transport::decode(UniqueId::create());
  auto b = transport::decode(UniqueId::create());
  EXPECT_NE(a.secret, b.secret);
  EXPECT_NE(a.endpoint(), b.endpoint());
}

TEST(UniqueIdEncoding, DecodeRejectsBytesNotMadeByCreate) {
  try {
    transport::decode(UniqueId{});
    FAIL() << "decode accepted an all-zero id";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), errc::invalid_argument);
  }
}

// ---- Rendezvous with strangers at the root ----

struct RankResult {
  std::error_code ec;
  std::string what;
  float sum = -1;
};

// What each rank does with its communicator once it is made.
enum class Then { sum, nothing };

// Ranks `ranks` of `nranks` join the communicator of `ids` on threads and, with Then::sum,
// all_reduce (rank + 1) (Then::nothing: a rank played by hand could not take part in an
// operation); then they destroy it. Every rank finishes before any destroys (see destroy_test.cpp
// for why); `while_formed`, if given, runs in between, while every rank's communicator lives.
std::vector<RankResult> run_ranks(const std::vector<UniqueId>& ids, int nranks,
                                  std::vector<int> ranks, Then then,
                                  const std::function<void()>& while_formed = {}) {
  std::vector<RankResult> results(nranks);
  std::latch finished(static_cast<std::ptrdiff_t>(ranks.size()) + 1);
  std::latch released(1);
  std::vector<std::thread> threads;
  for (int r : ranks)
    threads.emplace_back([&, r] {
      Communicator c;
      try {
        c = detail::create_blocking(ids, r, nranks, {});
        if (then == Then::sum) {
          float in = static_cast<float>(r + 1), out = 0;
          c.all_reduce(&in, &out, 1, DataType::float32, ReduceOp::sum);
          results[r].sum = out;
        }
      } catch (const std::system_error& e) {
        results[r].ec = e.code();
        results[r].what = e.what();
      }
      finished.arrive_and_wait();
      released.wait();
      c.destroy();
    });
  finished.arrive_and_wait();
  if (while_formed) while_formed();
  released.count_down();
  for (auto& t : threads) t.join();
  return results;
}

std::vector<RankResult> join_and_sum(const UniqueId& id, int nranks, std::vector<int> ranks,
                                     const std::function<void()>& while_formed = {}) {
  return run_ranks({id}, nranks, std::move(ranks), Then::sum, while_formed);
}

std::vector<int> all_ranks(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

void expect_all_summed(const std::vector<RankResult>& results) {
  const int n = static_cast<int>(results.size());
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(results[r].ec) << "rank " << r << ": " << results[r].ec.message();
    EXPECT_EQ(results[r].sum, n * (n + 1) / 2.0f) << "rank " << r;
  }
}

// Waits up to `limit` for the peer to close `s`; returns the read's error (eof when it closed
// cleanly), or nullopt if the socket is still open.
std::optional<boost::system::error_code> wait_closed(asio::io_context& io, tcp::socket& s,
                                                     std::chrono::steady_clock::duration limit) {
  std::optional<boost::system::error_code> result;
  char byte;
  s.async_read_some(asio::buffer(&byte, 1),
                    [&](boost::system::error_code ec, std::size_t) { result = ec; });
  io.restart();
  io.run_for(limit);
  if (!result) {
    s.close();
    io.restart();
    io.run();
    return std::nullopt;
  }
  return result;
}

transport::Secret wrong_secret_for(const transport::Secret& right) {
  transport::Secret s = right;
  for (auto& b : s) b ^= 0x5a;
  return s;
}

// A hello exactly as an honest rank `rank` of `nranks` would send it.
std::vector<std::uint8_t> hello_payload(int rank, int nranks, const tcp::endpoint& listener) {
  transport::Writer w;
  w.put<std::uint32_t>(0x4f4c4548u)
      .put<std::int32_t>(rank)
      .put<std::int32_t>(nranks)
      .put(transport::PeerInfo::from(listener));
  return std::move(w.bytes());
}

// Sends a hello sealed with `secret` as a stranger can: it opens the handshake (a nonce needs no
// secret), cannot check the root's proof, and seals its frame on a channel of its own making.
void send_frame(asio::io_context& io, tcp::socket& s, const transport::Secret& secret,
                std::vector<std::uint8_t> payload) {
  std::vector<std::uint8_t> hello(transport::Channel::dialler_hello_size, 0x11);
  const std::uint32_t magic = 0x44434343u, version = 2;  // wire.cpp: dialler_magic, wire_version
  std::memcpy(hello.data(), &magic, 4);
  std::memcpy(hello.data() + 4, &version, 4);
  asio::write(s, asio::buffer(hello));
  std::vector<std::uint8_t> answer(transport::Channel::listener_hello_size);
  asio::read(s, asio::buffer(answer));
  tcp::acceptor a(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  tcp::socket dialled(io), accepted(io);
  dialled.connect(a.local_endpoint());
  a.accept(accepted);
  transport::Stream mine(std::move(dialled)), theirs(std::move(accepted));
  std::optional<transport::Channel> channel;
  int done = 0;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        channel.emplace(co_await transport::Channel::initiate(mine, secret));
      },
      [&](std::exception_ptr) { ++done; });
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { co_await transport::Channel::respond(theirs, secret); },
      [&](std::exception_ptr) { ++done; });
  io.restart();
  io.run_for(5s);
  ASSERT_EQ(done, 2);
  ASSERT_TRUE(channel);
  auto frame = channel->seal(transport::FrameType::hello, payload);
  asio::write(s, asio::buffer(frame));
}

TEST(BootstrapRoot, DropsAConnectionSendingGarbage) {
  UniqueId id = UniqueId::create();
  auto root = transport::decode(id);
  asio::io_context io;
  tcp::socket s(io);
  s.connect(root.endpoint());
  std::vector<std::uint8_t> garbage(16, 0xab);
  asio::write(s, asio::buffer(garbage));
  // Closed on the bad handshake magic; the unread rest makes it a reset.
  auto closed = wait_closed(io, s, 5s);
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(*closed == asio::error::eof || *closed == asio::error::connection_reset)
      << closed->message();
}

TEST(BootstrapRoot, DropsAHelloAuthenticatedWithTheWrongSecret) {
  UniqueId id = UniqueId::create();
  auto root = transport::decode(id);
  asio::io_context io;
  tcp::socket s(io);
  s.connect(root.endpoint());
  send_frame(io, s, wrong_secret_for(root.secret), hello_payload(0, 2, root.endpoint()));
  // Closed on the forged header: the rest of the frame, unread, makes it a reset.
  auto closed = wait_closed(io, s, 5s);
  ASSERT_TRUE(closed.has_value());
  EXPECT_TRUE(*closed == asio::error::eof || *closed == asio::error::connection_reset)
      << closed->message();
}

TEST(BootstrapRoot, RanksCompleteAfterAGarbageConnection) {
  UniqueId id = UniqueId::create();
  auto root = transport::decode(id);
  asio::io_context io;
  tcp::socket s(io);
  s.connect(root.endpoint());
  std::vector<std::uint8_t> garbage(64, 0xab);
  asio::write(s, asio::buffer(garbage));
  ASSERT_TRUE(wait_closed(io, s, 5s).has_value());
  expect_all_summed(join_and_sum(id, 3, all_ranks(3)));
}

// The stranger claims rank 0 first; had the root believed it, the table would go to the stranger
// and the honest ranks would time out.
TEST(BootstrapRoot, RanksCompleteAfterAWrongSecretHelloClaimingRankZero) {
  UniqueId id = UniqueId::create();
  auto root = transport::decode(id);
  asio::io_context io;
  tcp::acceptor fake_listener(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
  tcp::socket s(io);
  s.connect(root.endpoint());
  send_frame(io, s, wrong_secret_for(root.secret),
             hello_payload(0, 3, fake_listener.local_endpoint()));
  ASSERT_TRUE(wait_closed(io, s, 5s).has_value());
  expect_all_summed(join_and_sum(id, 3, all_ranks(3)));
}

TEST(BootstrapRoot, HalfOpenConnectionDoesNotBlockTheRanks) {
  UniqueId id = UniqueId::create();
  auto root = transport::decode(id);
  asio::io_context io;
  tcp::socket silent(io);
  silent.connect(root.endpoint());
  // Half a frame header: the root waits for the rest on this connection only.
  tcp::socket partial(io);
  partial.connect(root.endpoint());
  asio::write(partial, asio::buffer(std::vector<std::uint8_t>(8, 0)));
  auto start = std::chrono::steady_clock::now();
  expect_all_summed(join_and_sum(id, 3, all_ranks(3)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_TRUE(silent.is_open());
}

TEST(BootstrapRoot, RanksCompleteDespiteAllStrangersAtOnce) {
  UniqueId id = UniqueId::create();
  auto root = transport::decode(id);
  asio::io_context io;
  tcp::socket silent(io), garbage(io), forged(io);
  silent.connect(root.endpoint());
  garbage.connect(root.endpoint());
  forged.connect(root.endpoint());
  asio::write(garbage, asio::buffer(std::vector<std::uint8_t>(32, 0xff)));
  send_frame(io, forged, wrong_secret_for(root.secret), hello_payload(1, 4, root.endpoint()));
  expect_all_summed(join_and_sum(id, 4, all_ranks(4)));
}

// The first hello fixes the communicator's size: a rank that names another size is dropped (and
// times out) while the ranks of the first size complete.
TEST(BootstrapRoot, DropsAHelloForAnotherCommunicatorSize) {
  const test::ParamOverride timeout(params::timeout_s, "2");
  UniqueId id = UniqueId::create();
  std::vector<RankResult> first, stray;
  std::thread a([&] { first = join_and_sum(id, 3, {1}); });
  std::this_thread::sleep_for(100ms);
  std::thread b([&] { stray = join_and_sum(id, 2, {1}); });
  std::this_thread::sleep_for(100ms);
  auto rest = join_and_sum(id, 3, {0, 2});
  a.join();
  b.join();
  for (auto* r : {&first[1], &rest[0], &rest[2]}) {
    EXPECT_FALSE(r->ec) << r->ec.message();
    EXPECT_EQ(r->sum, 6.0f);
  }
  EXPECT_EQ(stray[1].ec, errc::timed_out) << stray[1].ec.message();
}

TEST(BootstrapRoot, MissingRankMakesTheOthersTimeOutWithinCocclTimeout) {
  const test::ParamOverride timeout(params::timeout_s, "2");
  UniqueId id = UniqueId::create();
  auto start = std::chrono::steady_clock::now();
  auto results = join_and_sum(id, 3, {0, 1});
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(results[0].ec, errc::timed_out) << results[0].ec.message();
  EXPECT_EQ(results[1].ec, errc::timed_out) << results[1].ec.message();
  EXPECT_GE(took, 1900ms);
  EXPECT_LT(took, 5s);
}

// ---- The root after rank 0 has the table ----

// Rank 0 of `nranks`, played by hand: hello (naming `listener`), the table, the acknowledgement;
// then the connection is closed bare (rank 0 died) or after a goodbye (its communicator was
// destroyed).
void take_table_and_leave(const transport::RootAddress& root, bool goodbye, int nranks = 1,
                          std::optional<tcp::endpoint> listener = std::nullopt) {
  asio::io_context io;
  bool done = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        const auto until = std::chrono::steady_clock::now() + 5s;
        auto sock = co_await transport::dial(io.get_executor(), root.address, until);
        transport::Channel channel = co_await transport::Channel::initiate(*sock, root.secret);
        transport::Hello hello{0, nranks,
                               transport::PeerInfo::from(listener.value_or(root.endpoint()))};
        co_await transport::write_frame(*sock, channel, transport::FrameType::hello,
                                        transport::encode_hello(hello));
        transport::Frame table = co_await transport::read_frame(*sock, channel, 1 << 20);
        EXPECT_EQ(table.type, transport::FrameType::table);
        const std::vector<std::uint8_t> nothing;
        co_await transport::write_frame(*sock, channel, transport::FrameType::status, nothing);
        if (goodbye)
          co_await transport::write_frame(*sock, channel, transport::FrameType::close, nothing);
        boost::system::error_code ignored;
        sock->close(ignored);
        done = true;
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.run_for(20s);
  ASSERT_TRUE(done);
}

// The root's view, or nullopt when it does not answer within `wait`.
std::optional<transport::RootView> ask_root(const transport::RootAddress& root,
                                            std::chrono::milliseconds wait) {
  asio::io_context io;
  std::optional<transport::RootView> view;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        view = co_await transport::query_root(io.get_executor(), root,
                                              std::chrono::steady_clock::now() + wait);
      },
      [](std::exception_ptr) {});
  io.run();
  return view;
}

// Asks until `want` holds for the answer (nullopt: no answer), for at most `limit`.
template <class Want>
bool root_comes_to(const transport::RootAddress& root, Want want,
                   std::chrono::steady_clock::duration limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (want(ask_root(root, 300ms))) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// After an orderly end the root stops answering within 5 s, and never says that rank 0 left.
void expect_root_stops_without_saying_rank_zero_left(const transport::RootAddress& root) {
  bool said_left = false;
  EXPECT_TRUE(root_comes_to(
      root,
      [&](const std::optional<transport::RootView>& v) {
        said_left = said_left || (v && v->rank0_left);
        return !v;
      },
      5s));
  EXPECT_FALSE(said_left);
}

// Ranks that wait for their table ask the root who holds it up: when rank 0 (the first rank of the
// root's share) leaves without a goodbye, the root must still answer, saying so, for one more
// COCCL_TIMEOUT (and 5 s), and then close.
TEST(BootstrapRoot, AnswersThatRankZeroLeftWithoutAGoodbyeThenCloses) {
  const test::ParamOverride timeout(params::timeout_s, "2");
  const auto root = transport::decode(UniqueId::create());
  take_table_and_leave(root, false);
  EXPECT_TRUE(root_comes_to(
      root,
      [](const std::optional<transport::RootView>& v) {
        return v && v->rank0_left && !v->rank0_lost && v->nranks == 1 && v->arrived == 1;
      },
      5s));
  EXPECT_TRUE(root_comes_to(
      root, [](const std::optional<transport::RootView>& v) { return !v; }, 15s));
}

TEST(BootstrapRoot, StopsAnsweringWhenRankZeroSaysGoodbye) {
  const auto root = transport::decode(UniqueId::create());
  take_table_and_leave(root, true);
  expect_root_stops_without_saying_rank_zero_left(root);
}

// A communicator's rank 0 keeps the root answering while it lives and says goodbye when it is
// destroyed.
TEST(BootstrapRoot, ServesWhileRankZeroLivesAndStopsWhenItIsDestroyed) {
  const UniqueId id = UniqueId::create();
  const auto root = transport::decode(id);
  Communicator c = Communicator::create(id, 0, 1);
  const auto view = ask_root(root, 2000ms);
  ASSERT_TRUE(view);
  EXPECT_FALSE(view->rank0_left);
  EXPECT_EQ(view->arrived, 1);
  c.destroy();
  expect_root_stops_without_saying_rank_zero_left(root);
}

// A host's leader played by hand: rank `rank` of `nranks` (listening at `listener`) leads the
// meeting of this host's ranks at `root`, carries the hellos of `followers` of them with its own,
// takes the host's table from the root and passes nothing on: it holds every connection open for
// `hold` (a leader hung, as if stopped), then goes (a leader dead). `listening` is set once it
// holds the meeting place.
void lead_and_fail(const transport::RootAddress& root, int rank, int nranks, tcp::endpoint listener,
                   int followers, std::chrono::milliseconds hold, std::atomic<bool>& listening) {
  asio::io_context io;
  transport::Acceptor meeting(io.get_executor());
  const bool leads =
      meeting.listen_local(transport::host_meeting_name(root, transport::host_hash()), false, {});
  listening = true;
  ASSERT_TRUE(leads);
  bool took = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        std::vector<transport::Hello> hellos{
            {rank, nranks, transport::PeerInfo::from(listener), 1, 0}};
        std::vector<std::pair<std::shared_ptr<transport::Stream>, transport::Channel>> met;
        for (int i = 0; i < followers; ++i) {
          auto s = std::make_shared<transport::Stream>(
              co_await meeting.async_accept(asio::use_awaitable));
          transport::Channel c = co_await transport::Channel::respond(*s, root.secret);
          transport::Frame f = co_await transport::read_frame(*s, c, 4096);
          hellos.push_back(transport::decode_hello(f.payload));
          met.emplace_back(s, std::move(c));
        }
        auto sock = co_await transport::dial(io.get_executor(), root.address,
                                             std::chrono::steady_clock::now() + 5s);
        transport::Channel channel = co_await transport::Channel::initiate(*sock, root.secret);
        co_await transport::write_frame(*sock, channel, transport::FrameType::hellos,
                                        transport::encode_hellos(hellos));
        const std::vector<std::uint8_t> none;
        for (auto& [s, c] : met)
          co_await transport::write_frame(*s, c, transport::FrameType::status, none);
        transport::Frame table = co_await transport::read_frame(*sock, channel, 1 << 20);
        took = table.type == transport::FrameType::table;
        asio::steady_timer wait(io, hold);
        co_await wait.async_wait(asio::use_awaitable);
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.run_for(20s);
  EXPECT_TRUE(took);
}

// A listener address where nobody listens.
tcp::endpoint nobody_at(const transport::RootAddress& root) {
  asio::io_context io;
  tcp::acceptor gone(io, tcp::endpoint(root.endpoint().address(), 0));
  return gone.local_endpoint();
}

// Ranks 0 and 2 of 3 create their communicators while rank 1, played by hand, leads their host,
// takes the host's table and fails (lead_and_fail, holding on for `hold`), under COCCL_TIMEOUT
// `timeout`.
std::vector<RankResult> create_beside_a_failing_leader(std::chrono::milliseconds hold,
                                                       const char* timeout) {
  const test::ParamOverride limit(params::timeout_s, timeout);
  const UniqueId id = UniqueId::create();
  const auto root = transport::decode(id);
  std::atomic<bool> listening{false};
  std::thread leader([&] { lead_and_fail(root, 1, 3, nobody_at(root), 1, hold, listening); });
  while (!listening) std::this_thread::sleep_for(1ms);
  auto results = run_ranks({id}, 3, {0, 2}, Then::nothing);
  leader.join();
  return results;
}

// The root sends a host's table to the host's leader, which passes each follower its part. A
// leader that dies first leaves no one stranded: its follower's connection ends, the follower
// says hello to the root itself, and the root sends it its table on that connection.
TEST(HostLeaders, AFollowerWhoseLeaderDiesWithTheTableAsksTheRootAndForms) {
  const auto results = create_beside_a_failing_leader(0ms, "10");
  EXPECT_FALSE(results[0].ec) << results[0].what;
  EXPECT_FALSE(results[2].ec) << results[2].what;
}

// A leader that takes its host's table and hangs (stopped) holds its followers up: they time out
// naming it, as the root and the leader's silence tell them. The other ranks form.
TEST(HostLeaders, FollowersOfALeaderThatHangsWithTheirTableNameIt) {
  const auto results = create_beside_a_failing_leader(5000ms, "2");
  EXPECT_FALSE(results[0].ec) << results[0].what;
  EXPECT_EQ(results[2].ec, errc::timed_out) << results[2].what;
  EXPECT_NE(results[2].what.find("sent the table to rank 1, the leader of its host, which did not "
                                 "pass it on (rank 1 does not answer"),
            std::string::npos)
      << results[2].what;
}

// ---- The roots of several ids ----

// One authenticated frame to the root at `to` and the frame it answers with (type 0 and no
// payload when none came within the limit).
transport::Frame ask_root_once(const transport::RootAddress& to, transport::FrameType type,
                               const std::vector<std::uint8_t>& payload) {
  asio::io_context io;
  transport::Frame answer{};
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto sock = co_await transport::dial(io.get_executor(), to.address,
                                             std::chrono::steady_clock::now() + 5s);
        transport::Channel channel = co_await transport::Channel::initiate(*sock, to.secret);
        co_await transport::write_frame(*sock, channel, type, payload);
        answer = co_await transport::read_frame(*sock, channel, 1 << 20);
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.run_for(10s);
  return answer;
}

// Sends one share to the root at `to`, as the first rank of another root's share relays it;
// returns the root's answer: empty when taken, else its refusal.
std::string relay_to_root(const transport::RootAddress& to, const transport::Share& share) {
  const transport::Frame f =
      ask_root_once(to, transport::FrameType::share, transport::encode_share(share));
  if (f.type == transport::FrameType::status)
    return std::string(f.payload.begin(), f.payload.end());
  if (f.type == transport::FrameType::notice)
    return "refused: " + std::string(f.payload.begin(), f.payload.end());
  return "no answer";
}

// A share that is not what a root waits for (entries its ranks do not keep, for another root,
// from ranks given other ids, with another COCCL_DIRECTORY_FULL, a barrier token out of turn) is
// refused with the reason, and costs the honest ranks nothing: they form and sum.
TEST(BootstrapRoots, RefuseSharesTheyDoNotWaitForAndTheRanksStillForm) {
  const std::vector<UniqueId> ids{UniqueId::create(), UniqueId::create(), UniqueId::create()};
  std::vector<transport::RootAddress> roots;
  for (const UniqueId& id : ids) roots.push_back(transport::decode(id));
  const int nranks = 6;  // shares [0, 2), [2, 4), [4, 6); every rank keeps every entry
  transport::Share good;
  good.nranks = nranks;
  good.roots = 3;
  good.from = 1;
  good.to = 0;
  good.ids = transport::ids_digest(roots);
  good.full = 1;
  transport::PeerInfo somewhere = transport::PeerInfo::from(nobody_at(roots[1]));
  good.entries = {{2, somewhere, 2}};  // root 0 waits for ranks 2 and 3 both
  auto refused = [&](const transport::Share& s, const std::string& why) {
    const std::string answer = relay_to_root(roots[0], s);
    EXPECT_EQ(answer.rfind("refused: ", 0), 0u) << answer;
    EXPECT_NE(answer.find(why), std::string::npos) << answer;
  };
  refused(good, "are not the ones root 0's ranks keep");
  transport::Share wrong = good;
  wrong.to = 2;
  refused(wrong, "to another root");
  wrong = good;
  wrong.ids ^= 1;
  refused(wrong, "were given other ids");
  wrong = good;
  wrong.full = 0;
  refused(wrong, "disagree on COCCL_DIRECTORY_FULL");
  wrong = good;
  wrong.entries.clear();
  wrong.round = 0;  // root 0 hears round 0 from root 2, not 1
  wrong.low_host = wrong.high_host = 7;
  wrong.hosts = 1;
  refused(wrong, "out of turn");
  expect_all_summed(run_ranks(ids, nranks, all_ranks(nranks), Then::sum));
}

// A root's status answer as it comes on the wire.
std::vector<std::uint8_t> root_answer(const transport::RootAddress& root) {
  transport::Frame f = ask_root_once(root, transport::FrameType::status_query, {});
  EXPECT_EQ(f.type, transport::FrameType::status);
  return std::move(f.payload);
}

std::vector<UniqueId> several_ids(int n) {
  std::vector<UniqueId> ids;
  for (int i = 0; i < n; ++i) ids.push_back(UniqueId::create());
  return ids;
}

// The answer of root `k` of `nroots` ids for `nranks` ranks, asked while every rank's
// communicator lives.
std::vector<std::uint8_t> formed_root_answer(int nranks, int nroots, int k) {
  const std::vector<UniqueId> ids = several_ids(nroots);
  std::vector<std::uint8_t> answer;
  expect_all_summed(run_ranks(ids, nranks, all_ranks(nranks), Then::sum,
                              [&] { answer = root_answer(transport::decode(ids[k])); }));
  return answer;
}

// With several ids a root answers for its share alone: its ranks' records, none of the others'.
TEST(BootstrapRoots, AStatusAnswerDescribesTheRootsShareOnly) {
  const auto bytes = formed_root_answer(8, 4, 1);  // shares [0, 2), [2, 4), [4, 6), [6, 8)
  const transport::RootView v = transport::decode_root_view(bytes);
  EXPECT_EQ(v.nranks, 8);
  EXPECT_EQ(v.roots, 4);
  EXPECT_EQ(v.index, 1);
  EXPECT_EQ(v.first, 2);
  EXPECT_EQ(v.last, 4);
  EXPECT_EQ(v.arrived, 2);
  EXPECT_TRUE(v.formed);
  EXPECT_TRUE(v.awaiting.empty());
  EXPECT_TRUE(v.failed.empty());
  ASSERT_EQ(v.records.size(), 2u);
  // Rank 2 relays for its root and says hello itself; rank 3, alone on the host in its share,
  // leads itself.
  for (int r : {2, 3}) {
    EXPECT_TRUE(v.seen(r)) << "rank " << r;
    EXPECT_EQ(v.via(r), r) << "rank " << r;
    EXPECT_NE(v.listener(r).port, 0) << "rank " << r;
  }
  for (int r : {-1, 0, 1, 4, 7, 8}) {
    EXPECT_FALSE(v.seen(r)) << "rank " << r;
    EXPECT_EQ(v.via(r), -1) << "rank " << r;
    EXPECT_EQ(v.listener(r).port, 0) << "rank " << r;
  }
}

// A root's answer costs a record per rank of its share: the same share [2, 4) of 4, 8 and 16
// ranks answers in as many bytes, and a share of 4 ranks in two records more.
TEST(BootstrapRoots, AStatusAnswerGrowsWithTheShareNotWithTheRanks) {
  const std::size_t of_4 = formed_root_answer(4, 2, 1).size();
  const std::size_t of_8 = formed_root_answer(8, 4, 1).size();
  const std::size_t of_16 = formed_root_answer(16, 8, 1).size();
  EXPECT_EQ(of_8, of_4);
  EXPECT_EQ(of_16, of_4);
  const std::size_t share_of_4 = formed_root_answer(8, 2, 1).size();  // ranks [4, 8)
  EXPECT_EQ(share_of_4 - of_8, 2 * (1 + sizeof(transport::PeerInfo) + sizeof(std::int32_t)));
}

// Says hello to root `k` of `ids` as rank `rank` of `nranks` listening at `listener`, on a
// connection of its own; returns the connection (open until the Said goes), and the frame the
// root sends back within `wait` (none: the root closed the connection, or sent nothing).
struct Said {
  std::shared_ptr<transport::Stream> sock;
  std::optional<transport::FrameType> answer;
};
Said say_hello(asio::io_context& io, const std::vector<transport::RootAddress>& ids, int k,
               int rank, int nranks, const transport::PeerInfo& listener,
               std::chrono::milliseconds wait) {
  Said said;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        said.sock = co_await transport::dial(io.get_executor(), ids[k].address,
                                             std::chrono::steady_clock::now() + 5s);
        transport::Channel channel =
            co_await transport::Channel::initiate(*said.sock, ids[k].secret);
        const transport::Hello hello{rank, nranks, listener, static_cast<std::uint32_t>(ids.size()),
                                     transport::ids_digest(ids)};
        co_await transport::write_frame(*said.sock, channel, transport::FrameType::hello,
                                        transport::encode_hello(hello));
        if (wait.count() == 0) co_return;
        runtime::CloseAfter guard(*said.sock, wait);
        transport::Frame f = co_await transport::read_frame(*said.sock, channel, 1 << 20);
        said.answer = f.type;
      },
      [](std::exception_ptr) {});
  io.restart();
  io.run_for(10s);
  return said;
}

std::vector<transport::RootAddress> decoded(const std::vector<UniqueId>& ids) {
  std::vector<transport::RootAddress> roots;
  for (const UniqueId& id : ids) roots.push_back(transport::decode(id));
  return roots;
}

// A root's arrays cover its share only: a hello naming a rank of another share (below it or
// above it) is refused with the reason, and touches none of the share's records.
TEST(BootstrapRoots, AHelloNamingARankOfAnotherShareIsRefusedWithTheReason) {
  const auto roots = decoded(several_ids(3));  // 6 ranks: shares [0, 2), [2, 4), [4, 6)
  const transport::PeerInfo somewhere = transport::PeerInfo::from(nobody_at(roots[1]));
  asio::io_context io;
  // Rank 2, the first of root 1's share, arrives first and shapes the root. Every connection
  // here stays open to the end.
  const Said rank2 = say_hello(io, roots, 1, 2, 6, somewhere, 0ms);
  ASSERT_TRUE(root_comes_to(
      roots[1], [](const std::optional<transport::RootView>& v) { return v && v->arrived == 1; },
      5s));
  const Said below = say_hello(io, roots, 1, 0, 6, somewhere, 0ms);
  const Said above = say_hello(io, roots, 1, 5, 6, somewhere, 0ms);
  std::optional<transport::RootView> view;
  ASSERT_TRUE(root_comes_to(
      roots[1],
      [&](const std::optional<transport::RootView>& v) {
        view = v;
        return v && v->failed.size() == 2;
      },
      5s));
  EXPECT_EQ(view->first, 2);
  EXPECT_EQ(view->last, 4);
  EXPECT_EQ(view->arrived, 1);
  ASSERT_EQ(view->records.size(), 2u);
  EXPECT_TRUE(view->seen(2));
  EXPECT_FALSE(view->seen(3));
  EXPECT_FALSE(view->seen(0));
  EXPECT_FALSE(view->seen(5));
  EXPECT_NE(view->failed.at(0).find("its share belongs to root 0"), std::string::npos)
      << view->failed.at(0);
  EXPECT_NE(view->failed.at(5).find("its share belongs to root 2"), std::string::npos)
      << view->failed.at(5);
}

// Once formed, a second hello of a rank that a leader carried takes the table on its own
// connection (root_reroute). One naming a rank of another share, with that rank's own listener,
// is dropped: no table, and the root's answer is what it was.
TEST(BootstrapRoots, AFormedRootDropsAHelloNamingARankOfAnotherShare) {
  const std::vector<UniqueId> ids = several_ids(2);  // 4 ranks: shares [0, 2), [2, 4)
  const auto roots = decoded(ids);
  std::vector<std::uint8_t> before, after;
  asio::io_context io;
  std::vector<Said> dropped;
  expect_all_summed(run_ranks(ids, 4, all_ranks(4), Then::sum, [&] {
    const transport::RootView of_0 = transport::decode_root_view(root_answer(roots[0]));
    before = root_answer(roots[1]);
    for (int r : {0, 1}) dropped.push_back(say_hello(io, roots, 1, r, 4, of_0.listener(r), 2s));
    after = root_answer(roots[1]);
  }));
  ASSERT_EQ(dropped.size(), 2u);
  for (const Said& s : dropped) EXPECT_FALSE(s.answer);
  EXPECT_FALSE(before.empty());
  EXPECT_EQ(after, before);
}

// Every rank says hello at once, far beyond the root's cap on connections that have not
// authenticated yet: the root takes them as room frees and every rank joins (at the default cap,
// thousands of ranks starting together meet the same).
TEST(BootstrapRoot, AHelloBurstBeyondThePendingCapAllJoin) {
  // The cap, not the graces, is under test; every rank dials the root itself (this process is
  // one host, whose ranks would otherwise come on one leader's connection).
  const auto cap = test::pending_cap_only("2");
  const test::ParamOverride direct(params::host_leaders, "0");
  const test::ParamOverride timeout(params::timeout_s, "30");
  expect_all_summed(join_and_sum(UniqueId::create(), 24, all_ranks(24)));
}

// ---- Host leaders: the ranks of one host reach the root on one connection ----

struct Formed {
  std::vector<RankResult> results;
  std::optional<transport::RootView> view;  // asked while every rank's communicator lived
};

// Ranks 0..nranks-1 join `id` on threads (one host: this process) and all_reduce (rank + 1);
// the root is asked for its view before any rank destroys its communicator.
Formed join_and_ask_root(const UniqueId& id, int nranks) {
  Formed f;
  f.results = join_and_sum(id, nranks, all_ranks(nranks),
                           [&] { f.view = ask_root(transport::decode(id), 5000ms); });
  return f;
}

// Every rank's hello came on its own connection.
void expect_all_direct(const Formed& f) {
  ASSERT_TRUE(f.view);
  ASSERT_EQ(f.view->records.size(), f.results.size());
  for (int r = 0; r < static_cast<int>(f.results.size()); ++r)
    EXPECT_EQ(f.view->via(r), r) << "rank " << r;
}

TEST(HostLeaders, CarryTheHellosOfTheirHostOnOneConnection) {
  const int n = 6;
  const Formed f = join_and_ask_root(UniqueId::create(), n);
  expect_all_summed(f.results);
  ASSERT_TRUE(f.view);
  EXPECT_EQ(f.view->arrived, n);
  ASSERT_EQ(f.view->records.size(), static_cast<std::size_t>(n));
  // Rank 0 takes the table on its own connection; one of the others leads the rest.
  EXPECT_EQ(f.view->via(0), 0);
  const int leader = f.view->via(1);
  ASSERT_GE(leader, 1);
  ASSERT_LT(leader, n);
  for (int r = 1; r < n; ++r) EXPECT_EQ(f.view->via(r), leader) << "rank " << r;
}

TEST(HostLeaders, OffEveryRankSaysHelloItself) {
  const test::ParamOverride off(params::host_leaders, "0");
  const Formed f = join_and_ask_root(UniqueId::create(), 4);
  expect_all_summed(f.results);
  expect_all_direct(f);
}

// Holds the host's meeting place for `id` before any rank comes: answers each connection as
// `greet` says, on its own thread, until destroyed.
class Squatter {
 public:
  Squatter(const UniqueId& id, bool silent) : acceptor_(io_) {
    using local = asio::local::stream_protocol;
    const std::string name =
        transport::host_meeting_name(transport::decode(id), transport::host_hash());
    acceptor_.open(local());
    acceptor_.bind(local::endpoint(std::string(1, '\0') + name));
    acceptor_.listen();
    accept(silent);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~Squatter() {
    io_.stop();
    thread_.join();
  }
  int accepted() const { return accepted_.load(); }

 private:
  void accept(bool silent) {
    acceptor_.async_accept(
        [this, silent](boost::system::error_code ec, asio::local::stream_protocol::socket s) {
          if (ec) return;
          ++accepted_;
          if (silent)
            held_.push_back(std::move(s));  // never answers
          else
            s.close();  // the dialler's handshake fails at once
          accept(silent);
        });
  }
  asio::io_context io_;
  asio::local::stream_protocol::acceptor acceptor_;
  std::vector<asio::local::stream_protocol::socket> held_;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

// A process of the host that holds the meeting place cannot take part (it has no secret): every
// rank that meets it says hello itself, and the communicator forms.
TEST(HostLeaders, AStrangerHoldingTheMeetingPlaceIsPassedOver) {
  const UniqueId id = UniqueId::create();
  Squatter stranger(id, false);
  const Formed f = join_and_ask_root(id, 4);
  expect_all_summed(f.results);
  expect_all_direct(f);
  EXPECT_EQ(stranger.accepted(), 3);  // ranks 1-3; rank 0 never meets
}

// One that accepts and never answers holds each rank up for the handshake limit only.
TEST(HostLeaders, ASilentStrangerAtTheMeetingPlaceCostsOneHandshakeLimit) {
  const test::ParamOverride auth(params::bootstrap_auth_timeout, "0.5");
  const UniqueId id = UniqueId::create();
  Squatter stranger(id, true);
  const Formed f = join_and_ask_root(id, 3);
  expect_all_summed(f.results);
  expect_all_direct(f);
  EXPECT_EQ(stranger.accepted(), 2);
}

TEST(HostLeaders, HelloFramesRoundTripAndRefuseImpossibleCounts) {
  transport::PeerInfo info{};
  info.family = 4;
  info.port = 5000;
  const std::vector<transport::Hello> hellos{{3, 8, info, 1, 0}, {5, 8, info, 2, 7}};
  const auto bytes = transport::encode_hellos(hellos);
  const auto back = transport::decode_hellos(bytes);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].rank, 3);
  EXPECT_EQ(back[1].rank, 5);
  EXPECT_EQ(back[1].roots, 2u);
  EXPECT_EQ(back[1].ids, 7u);
  auto refused = [](std::vector<std::uint8_t> b) {
    try {
      transport::decode_hellos(b);
    } catch (const std::system_error& e) {
      return e.code() == errc::bad_message;
    }
    return false;
  };
  EXPECT_TRUE(refused(transport::encode_hellos({})));      // none
  EXPECT_TRUE(refused({bytes.begin(), bytes.end() - 1}));  // cut short
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_TRUE(refused(longer));  // trailing bytes
  auto claims_more = bytes;
  claims_more[4] = 3;  // the count, after the magic: 3 hellos in the room of 2
  EXPECT_TRUE(refused(claims_more));
  const std::vector<transport::Hello> too_many(transport::max_hellos_per_frame + 1, hellos[0]);
  EXPECT_TRUE(refused(transport::encode_hellos(too_many)));
  EXPECT_TRUE(refused(transport::encode_hello(hellos[0])));  // a single hello is not a frame
}

}  // namespace
}  // namespace coccl
