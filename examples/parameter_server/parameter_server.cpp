// examples/parameter_server/parameter_server.cpp: coccl inside an existing Asio application.
//
//   coccl-example-parameter-server [--ranks N] [--servers S] [--params P] [--rounds K]
//                                  [--status-port PORT] [--check] [--kill-worker R --after J]
//
// Ranks 0 .. S-1 are servers, each holding one shard of P parameters in host memory; the other
// ranks are workers. Each process runs one io_context on one thread. On a server it serves two
// things side by side: a TCP status endpoint of its own (connect, read one line: the shard, the
// round and a checksum; 127.0.0.1, port PORT + rank, or a free port when PORT is 0) and the
// parameter-server loop, a coroutine that co_awaits coccl operations. Every round, workers pull
// all shards (one grouped send/recv: each server sends its shard to every worker), compute a
// gradient from the parameters they pulled, and push it (another group: each worker sends every
// server its part); servers sum the workers' gradients and apply them. The status endpoint keeps
// answering while the loop is suspended in a collective. At the end the first worker reads every
// server's status line over TCP and prints it.
//
// The gradients are small integers, so the sums are exact in float: with --check every server
// compares its shard, after K pushes, with a serial computation of the same rounds.
//
// A worker that dies stops the job with a clear error (no reassignment): its process is gone, so
// the servers' next exchange with it fails with errc::peer_lost, coccl's last_error() naming the
// rank; every surviving rank prints that message, aborts the communicator and exits with status
// 3 (within COCCL_TIMEOUT even if the dead rank's sockets were not closed). --kill-worker R
// --after J makes worker R kill itself (SIGKILL) after its J-th push, to show it.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <coccl/coccl.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <istream>
#include <string>
#include <vector>

#include "../common/local_ranks.hpp"

namespace asio = boost::asio;
using asio::ip::tcp;
using coccl::Communicator;
using coccl::DataType;

namespace {

struct Options {
  int ranks = 4, servers = 2, params = 4096, rounds = 10, status_port = 0;
  int kill_worker = -1, kill_after = 0;
  bool check = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "coccl-example-parameter-server: %s\n"
               "usage: coccl-example-parameter-server [--ranks N] [--servers S] [--params P]\n"
               "  [--rounds K] [--status-port PORT] [--check] [--kill-worker R --after J]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto num = [&](int lo) {
      if (i + 1 >= argc) usage(a + " needs a value");
      const std::string v = argv[++i];
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (*end || x < lo || x > 1 << 24) usage("bad value '" + v + "' for " + a);
      return static_cast<int>(x);
    };
    if (a == "--ranks")
      o.ranks = num(2);
    else if (a == "--servers")
      o.servers = num(1);
    else if (a == "--params")
      o.params = num(1);
    else if (a == "--rounds")
      o.rounds = num(1);
    else if (a == "--status-port")
      o.status_port = num(0);
    else if (a == "--kill-worker")
      o.kill_worker = num(0);
    else if (a == "--after")
      o.kill_after = num(0);
    else if (a == "--check")
      o.check = true;
    else
      usage("unknown argument '" + a + "'");
  }
  return o;
}

// Server s's shard: parameters [first(s), first(s+1)).
int shard_first(const Options& o, int s) {
  return static_cast<int>(static_cast<long long>(s) * o.params / o.servers);
}

float initial_value(int i) { return static_cast<float>(i % 11 - 5); }

// Worker w's gradient for parameter i in round k, given the value it pulled: small integers, so
// every sum of them is exact in float.
float gradient(int i, int w, int k, float p) {
  return static_cast<float>((i * 7 + w * 13 + k * 5) % 9 - 4) + (p > 0 ? 1.0f : -1.0f);
}

// What the status endpoint reports; the loop updates it, the endpoint reads it (one thread).
struct ServerState {
  int rank, first, last, round = 0, rounds;
  std::vector<float> shard;
};

std::string status_line(const ServerState& s) {
  double sum = 0;
  for (float v : s.shard) sum += v;
  char line[160];
  std::snprintf(line, sizeof line,
                "server rank %d: parameters [%d, %d), round %d of %d, sum of shard %.0f\n", s.rank,
                s.first, s.last, s.round, s.rounds, sum);
  return line;
}

asio::awaitable<void> serve_status(tcp::acceptor* acceptor, const ServerState* state) {
  for (;;) {
    auto [ec, socket] = co_await acceptor->async_accept(asio::as_tuple(asio::use_awaitable));
    if (ec) co_return;  // closed when the server's work is done
    const std::string line = status_line(*state);
    co_await asio::async_write(socket, asio::buffer(line), asio::as_tuple(asio::use_awaitable));
  }
}

void check(std::error_code ec, const Communicator& comm) {
  if (ec) throw std::system_error(ec, comm.last_error());
}

asio::awaitable<void> server_loop(Communicator comm, Options o, ServerState* state) {
  const int workers = o.ranks - o.servers;
  const std::size_t len = state->shard.size();
  std::vector<float> inbox(len * static_cast<std::size_t>(workers));
  for (int k = 0; k < o.rounds; ++k) {
    std::vector<coccl::Transfer> pull;
    for (int w = o.servers; w < o.ranks; ++w)
      pull.push_back(Communicator::send_op(state->shard.data(), len, DataType::float32, w));
    check(std::get<0>(co_await comm.async_send_recv(pull, asio::as_tuple(asio::use_awaitable))),
          comm);
    std::vector<coccl::Transfer> push;
    for (int w = 0; w < workers; ++w)
      push.push_back(
          Communicator::recv_op(inbox.data() + w * len, len, DataType::float32, o.servers + w));
    check(std::get<0>(co_await comm.async_send_recv(push, asio::as_tuple(asio::use_awaitable))),
          comm);
    for (int w = 0; w < workers; ++w)
      for (std::size_t i = 0; i < len; ++i) state->shard[i] -= inbox[w * len + i];
    state->round = k + 1;
  }
}

asio::awaitable<void> worker_loop(Communicator comm, Options o) {
  const int me = comm.rank();
  std::vector<float> params(static_cast<std::size_t>(o.params)), grad(params.size());
  for (int k = 0; k < o.rounds; ++k) {
    std::vector<coccl::Transfer> pull;
    for (int s = 0; s < o.servers; ++s) {
      const int first = shard_first(o, s), last = shard_first(o, s + 1);
      pull.push_back(
          Communicator::recv_op(params.data() + first, last - first, DataType::float32, s));
    }
    check(std::get<0>(co_await comm.async_send_recv(pull, asio::as_tuple(asio::use_awaitable))),
          comm);
    for (int i = 0; i < o.params; ++i) grad[i] = gradient(i, me, k, params[i]);
    std::vector<coccl::Transfer> push;
    for (int s = 0; s < o.servers; ++s) {
      const int first = shard_first(o, s), last = shard_first(o, s + 1);
      push.push_back(
          Communicator::send_op(grad.data() + first, last - first, DataType::float32, s));
    }
    check(std::get<0>(co_await comm.async_send_recv(push, asio::as_tuple(asio::use_awaitable))),
          comm);
    if (me == o.kill_worker && k + 1 == o.kill_after) {
      std::printf("worker rank %d: killing itself after %d pushes\n", me, k + 1);
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
  }
}

// Reads every server's status line over TCP.
asio::awaitable<void> read_statuses(std::vector<int> ports) {
  auto ex = co_await asio::this_coro::executor;
  for (std::size_t s = 0; s < ports.size(); ++s) {
    tcp::socket socket(ex);
    const tcp::endpoint server(asio::ip::address_v4::loopback(),
                               static_cast<unsigned short>(ports[s]));
    co_await socket.async_connect(server, asio::use_awaitable);
    asio::streambuf buf;
    co_await asio::async_read_until(socket, buf, '\n', asio::use_awaitable);
    std::istream in(&buf);
    std::string line;
    std::getline(in, line);
    std::printf("status of server %zu on port %d: %s\n", s, ports[s], line.c_str());
  }
  std::fflush(stdout);
}

// Serial reference for one shard: the same rounds, one worker after the other.
long long count_mismatches(const Options& o, const ServerState& s) {
  std::vector<float> p(s.shard.size());
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = initial_value(s.first + static_cast<int>(i));
  for (int k = 0; k < o.rounds; ++k) {
    std::vector<float> next = p;
    for (int w = o.servers; w < o.ranks; ++w)
      for (std::size_t i = 0; i < p.size(); ++i)
        next[i] -= gradient(s.first + static_cast<int>(i), w, k, p[i]);
    p = std::move(next);
  }
  long long wrong = 0;
  for (std::size_t i = 0; i < p.size(); ++i) wrong += p[i] != s.shard[i];
  return wrong;
}

asio::awaitable<void> run_role(Communicator comm, Options o, ServerState* state,
                               tcp::acceptor* acceptor) {
  const bool server = comm.rank() < o.servers;
  // Every rank learns the servers' status ports (workers contribute 0).
  int port = server ? acceptor->local_endpoint().port() : 0;
  std::vector<int> ports(static_cast<std::size_t>(comm.size()));
  check(std::get<0>(co_await comm.async_all_gather(&port, ports.data(), 1, DataType::int32,
                                                   asio::as_tuple(asio::use_awaitable))),
        comm);
  if (server) {
    std::printf("server rank %d: parameters [%d, %d), status on 127.0.0.1:%d\n", comm.rank(),
                state->first, state->last, port);
    std::fflush(stdout);
    co_await server_loop(comm, o, state);
  } else {
    co_await worker_loop(comm, o);
  }
  // Every server has applied the last push; the first worker reads their status lines while they
  // wait in the second barrier, their endpoints still serving.
  check(std::get<0>(co_await comm.async_barrier(asio::as_tuple(asio::use_awaitable))), comm);
  if (comm.rank() == o.servers) {
    ports.resize(static_cast<std::size_t>(o.servers));
    co_await read_statuses(ports);
  }
  check(std::get<0>(co_await comm.async_barrier(asio::as_tuple(asio::use_awaitable))), comm);
}

int run_rank(Communicator comm, const Options& o) {
  const int rank = comm.rank();
  if (comm.size() <= o.servers) {
    if (rank == 0)
      std::fprintf(stderr, "parameter_server: %d ranks leave no worker beside %d servers\n",
                   comm.size(), o.servers);
    comm.destroy();
    return 2;
  }
  Options opts = o;
  opts.ranks = comm.size();
  asio::io_context io;
  ServerState state{rank, 0, 0, 0, o.rounds, {}};
  tcp::acceptor acceptor(io);
  if (rank < o.servers) {
    state.first = shard_first(opts, rank);
    state.last = shard_first(opts, rank + 1);
    for (int i = state.first; i < state.last; ++i) state.shard.push_back(initial_value(i));
    const unsigned short port =
        o.status_port ? static_cast<unsigned short>(o.status_port + rank) : 0;
    acceptor = tcp::acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), port));
    asio::co_spawn(io, serve_status(&acceptor, &state), asio::detached);
  }
  int status = 0;
  asio::co_spawn(io, run_role(comm, opts, &state, &acceptor), [&](std::exception_ptr e) {
    acceptor.close();
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      std::fprintf(stderr, "parameter_server rank %d: stopping: %s\n", rank, x.what());
    }
    status = 3;
  });
  io.run();
  if (status) {
    comm.abort();
    return status;
  }
  if (o.check && rank < o.servers) {
    const long long wrong = count_mismatches(opts, state);
    std::printf("server rank %d: %s after %d pushes (%lld of %zu parameters differ)\n", rank,
                wrong ? "shard DIFFERS from the serial result" : "shard equals the serial result",
                o.rounds, wrong, state.shard.size());
    if (wrong) status = 1;
  }
  comm.destroy();
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    Communicator comm = example::join();
    if (comm) return run_rank(std::move(comm), o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parameter_server: cannot join the job: %s\n", e.what());
    return 1;
  }
  if (o.ranks <= o.servers) usage("--ranks must exceed --servers");
  return example::run_local_ranks(argv, o.ranks);
}
