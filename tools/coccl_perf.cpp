// coccl-perf: nccl-tests-style benchmark of coccl collectives, with Gloo and Open MPI measured in
// the same invocation for comparison.
//
// With no launcher environment it starts --ranks local processes itself (re-executing this
// binary); under torchrun/mpirun/srun each process is one rank. Sizes follow nccl-tests: for
// all_gather the size is the whole output, for reduce_scatter the whole input, for all_to_all the
// whole buffer per rank, for gather/scatter the root's whole buffer.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <coccl/coccl.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "perf_data.hpp"
#include "perf_device.hpp"
#include "perf_json.hpp"
#include "perf_plot.hpp"
#include "perf_progress.hpp"

namespace asio = boost::asio;
using coccl::DataType;
using coccl::ReduceOp;

extern char** environ;

namespace {

using perf::Options;

const std::vector<std::string> all_colls{"allreduce",     "allgather", "broadcast", "reduce",
                                         "reducescatter", "alltoall",  "gather",    "scatter"};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "coccl-perf: %s\n"
      "usage: coccl-perf [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
      "  [-R REPEATS] [-c 0|1] [-d TYPE] [-o sum|prod|min|max|avg] [-r ROOT]\n"
      "  [--coll allreduce|allgather|broadcast|reduce|reducescatter|alltoall|gather|"
      "scatter|all]\n"
      "  [--ranks N] [--baseline gloo|mpi|nccl]... [--json FILE] [--device host|cuda]"
      " [-G 0|1] [--register 0|1]\n"
      "  [--blocking 0|1]  (host: time the blocking calls from each rank's thread, as the\n"
      "               baselines do, instead of a coroutine awaiting the async forms)\n"
      "  [--loop comm|own]  (host: the awaiting coroutine runs on the communicator's\n"
      "               executor, or on an io_context of each rank's own thread)\n"
      "  [--plot FILE.svg|FILE.png]  (busbw and time against size, every library of the\n"
      "               run one series; needs gnuplot)\n"
      "  [--plot-from RUN.json --plot FILE.svg|FILE.png]  (draws a run that --json\n"
      "               saved, on any machine; nothing is measured)\n"
      "  [--hosts H]  (the ranks act as H hosts: rank r on host r*H/N, so ranks of\n"
      "               different hosts take the network path, NCCL's too)\n",
      why.c_str());
  std::exit(2);
}

std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suf(end);
  double mul = suf.empty()                ? 1
               : suf == "K" || suf == "k" ? 1 << 10
               : suf == "M" || suf == "m" ? 1 << 20
               : suf == "G" || suf == "g" ? 1 << 30
                                          : -1;
  if (mul < 0 || v < 0) usage("bad size '" + s + "'");
  return static_cast<std::size_t>(v * mul);
}

Options parse(int argc, char** argv) {
  Options o;
  o.device = "auto";
  bool ranks_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "-b")
      o.min_bytes = parse_size(val());
    else if (a == "-e")
      o.max_bytes = parse_size(val());
    else if (a == "-f")
      o.factor = std::atof(val().c_str());
    else if (a == "-n")
      o.iters = std::atoi(val().c_str());
    else if (a == "-w")
      o.warmup = std::atoi(val().c_str());
    else if (a == "-R" || a == "--repeat")
      o.repeat = std::atoi(val().c_str());
    else if (a == "-c")
      o.check = std::atoi(val().c_str());
    else if (a == "-r")
      o.root = std::atoi(val().c_str());
    else if (a == "--ranks") {
      o.ranks = std::atoi(val().c_str());
      ranks_given = true;
    } else if (a == "--json")
      o.json = val();
    else if (a == "--device")
      o.device = val();
    else if (a == "-G")
      o.graph = std::atoi(val().c_str()) != 0;
    else if (a == "--register")
      o.register_buffers = std::atoi(val().c_str()) != 0;
    else if (a == "--blocking")
      o.blocking = std::atoi(val().c_str()) != 0;
    else if (a == "--loop") {
      const std::string v = val();
      if (v != "comm" && v != "own") usage("--loop takes comm or own");
      o.own_loop = v == "own";
    } else if (a == "--hosts")
      o.hosts = std::atoi(val().c_str());
    else if (a == "--plot-from")
      o.plot_from = val();
    else if (a == "--plot") {
      o.plot = val();
      const std::size_t dot = o.plot.rfind('.');
      const std::string ext = dot == std::string::npos ? "" : o.plot.substr(dot);
      if (ext != ".svg" && ext != ".png") usage("--plot writes a .svg or .png file");
    } else if (a == "-d") {
      auto t = coccl::parse_data_type(val());
      if (!t) usage("unknown type");
      o.type = *t;
    } else if (a == "-o") {
      auto p = coccl::parse_reduce_op(val());
      if (!p) usage("unknown op");
      o.op = *p;
    } else if (a == "--coll") {
      std::string c = val();
      if (c == "all")
        o.colls = all_colls;
      else if (std::find(all_colls.begin(), all_colls.end(), c) != all_colls.end())
        o.colls = {c};
      else
        usage("unknown collective '" + c + "'");
    } else if (a == "--baseline") {
      std::string b = val();
      if (b != "gloo" && b != "mpi" && b != "nccl") usage("--baseline takes gloo, mpi or nccl");
      o.baselines.push_back(b);
    } else if (a == "-h" || a == "--help")
      usage("help");
    else
      usage("unknown argument '" + a + "'");
  }
  if (o.iters < 1 || o.repeat < 1 || o.warmup < 0 || o.factor <= 1 || o.ranks < 1 ||
      o.min_bytes > o.max_bytes || o.hosts < 0 || o.hosts > o.ranks)
    usage("bad arguments");
  if (o.device == "auto") o.device = perf::gpu_count() > 0 ? "cuda" : "host";
  if (o.device != "host" && o.device != "cuda") usage("--device takes host or cuda");
  if (o.device == "cuda") {
    int gpus = perf::gpu_count();
    if (gpus == 0) usage("--device cuda: no GPU (or a build without CUDA)");
    if (!ranks_given) o.ranks = gpus;
    for (const auto& b : o.baselines)
      if (b != "nccl") usage("on --device cuda the baseline is nccl");
    if (o.register_buffers) usage("--register applies to host memory");
    if (o.own_loop) usage("--loop applies to host memory");
  } else {
    for (const auto& b : o.baselines)
      if (b == "nccl") usage("--baseline nccl needs --device cuda");
  }
  return o;
}

// What one size of one collective means in counts and bandwidth.
struct Shape {
  std::size_t count;       // elements per rank argument
  std::size_t send_elems;  // elements in the send buffer
  std::size_t recv_elems;  // elements in the receive buffer
  double bus_factor;       // busbw = algbw * bus_factor
};

Shape shape_of(const std::string& coll, std::size_t bytes, std::size_t elt, int n) {
  std::size_t total = bytes / elt;
  std::size_t per = total / n;
  double nf = n;
  if (coll == "allreduce") return {total, total, total, 2 * (nf - 1) / nf};
  if (coll == "broadcast" || coll == "reduce") return {total, total, total, 1};
  if (coll == "allgather") return {per, per, per * n, (nf - 1) / nf};
  if (coll == "reducescatter") return {per, per * n, per, (nf - 1) / nf};
  if (coll == "alltoall") return {per, per * n, per * n, (nf - 1) / nf};
  if (coll == "gather") return {per, per, per * n, (nf - 1) / nf};
  return {per, per * n, per, (nf - 1) / nf};  // scatter
}

struct Row {
  std::string coll;
  std::size_t bytes, count;
  double time_us[2];  // out-of-place, in-place
  long long wrong[2];
};

// The collectives the bench times, named once per collective so that the calls switch on this
// rather than comparing names every time.
enum class Coll {
  allreduce,
  broadcast,
  reduce,
  allgather,
  reducescatter,
  alltoall,
  gather,
  scatter
};

Coll coll_of(const std::string& coll) {
  if (coll == "allreduce") return Coll::allreduce;
  if (coll == "broadcast") return Coll::broadcast;
  if (coll == "reduce") return Coll::reduce;
  if (coll == "allgather") return Coll::allgather;
  if (coll == "reducescatter") return Coll::reducescatter;
  if (coll == "alltoall") return Coll::alltoall;
  if (coll == "gather") return Coll::gather;
  return Coll::scatter;
}

// One blocking operation (the form --blocking times), called directly from the timed loop as the
// baselines' loops call theirs: no coroutine per call.
std::error_code call_blocking(Coll k, coccl::Communicator& c, const Options& o, const Shape& s,
                              const void* send, void* recv) {
  boost::system::error_code ec;
  switch (k) {
    case Coll::allreduce:
      c.all_reduce(send, recv, s.count, o.type, o.op, ec);
      break;
    case Coll::broadcast:
      c.broadcast(send, recv, s.count, o.type, o.root, ec);
      break;
    case Coll::reduce:
      c.reduce(send, recv, s.count, o.type, o.op, o.root, ec);
      break;
    case Coll::allgather:
      c.all_gather(send, recv, s.count, o.type, ec);
      break;
    case Coll::reducescatter:
      c.reduce_scatter(send, recv, s.count, o.type, o.op, ec);
      break;
    case Coll::alltoall:
      c.all_to_all(send, recv, s.count, o.type, ec);
      break;
    case Coll::gather:
      c.gather(send, recv, s.count, o.type, o.root, ec);
      break;
    case Coll::scatter:
      c.scatter(send, recv, s.count, o.type, o.root, ec);
      break;
  }
  return ec;
}

// Launches one operation of `k` as an awaitable on the communicator (the blocking form when
// --blocking: the bench then runs on this rank's own thread, run_rank, which may block).
asio::awaitable<std::error_code> launch(coccl::Communicator& c, Coll k, const Options& o,
                                        const Shape& s, const void* send, void* recv) {
  if (o.blocking) co_return call_blocking(k, c, o, s, send, recv);
  const auto t = o.type;
  auto tok = asio::as_tuple(asio::use_awaitable);
  switch (k) {
    case Coll::allreduce:
      co_return std::get<0>(co_await c.async_all_reduce(send, recv, s.count, t, o.op, tok));
    case Coll::broadcast:
      co_return std::get<0>(co_await c.async_broadcast(send, recv, s.count, t, o.root, tok));
    case Coll::reduce:
      co_return std::get<0>(co_await c.async_reduce(send, recv, s.count, t, o.op, o.root, tok));
    case Coll::allgather:
      co_return std::get<0>(co_await c.async_all_gather(send, recv, s.count, t, tok));
    case Coll::reducescatter:
      co_return std::get<0>(co_await c.async_reduce_scatter(send, recv, s.count, t, o.op, tok));
    case Coll::alltoall:
      co_return std::get<0>(co_await c.async_all_to_all(send, recv, s.count, t, tok));
    case Coll::gather:
      co_return std::get<0>(co_await c.async_gather(send, recv, s.count, t, o.root, tok));
    case Coll::scatter:
      break;
  }
  co_return std::get<0>(co_await c.async_scatter(send, recv, s.count, t, o.root, tok));
}

// Where the in-place form puts the send buffer inside the receive buffer.
const std::byte* in_place_send(const std::string& coll, std::byte* recv, std::size_t count,
                               std::size_t elt, int rank, std::vector<std::byte>& send_buf) {
  if (coll == "allgather" || coll == "gather") return recv + rank * count * elt;
  if (coll == "reducescatter" || coll == "scatter" || coll == "alltoall") {
    (void)send_buf;
    return nullptr;  // the send buffer is the big one: handled by the caller
  }
  return recv;
}

asio::awaitable<void> bench_rank(coccl::Communicator c, Options o, std::vector<Row>* rows) {
  const int n = c.size(), rank = c.rank();
  const std::size_t elt = coccl::size_of(o.type);
  for (const std::string& coll : o.colls) {
    const Coll kind = coll_of(coll);
    for (double b = static_cast<double>(o.min_bytes); b <= static_cast<double>(o.max_bytes);
         b = std::max(b * o.factor, b + 1)) {
      std::size_t bytes = static_cast<std::size_t>(b);
      Shape s = shape_of(coll, bytes, elt, n);
      if (s.count == 0) continue;
      if (rank == 0) perf::progress(coll + " " + std::to_string(bytes) + " B");
      Row row{coll,
              s.send_elems > s.recv_elems ? s.send_elems * elt : s.recv_elems * elt,
              s.count,
              {0, 0},
              {0, 0}};
      if (coll == "allreduce" || coll == "broadcast" || coll == "reduce") row.bytes = s.count * elt;
      std::vector<std::byte> send(std::max<std::size_t>(1, s.send_elems * elt)),
          recv(std::max<std::size_t>(1, s.recv_elems * elt));
      // Registered for this size only, and released before the buffers are freed.
      std::vector<coccl::BufferRegistration> regs;
      if (o.register_buffers) {
        regs.push_back(c.register_buffer(send.data(), send.size()));
        regs.push_back(c.register_buffer(recv.data(), recv.size()));
      }
      for (int place = 0; place < 2; ++place) {
        // In place: the send buffer lives inside the receive buffer (or, for the collectives
        // whose send side is the large one, the receive buffer inside the send buffer).
        bool big_send = coll == "reducescatter" || coll == "scatter";
        const void* sp = send.data();
        void* rp = recv.data();
        if (place == 1) {
          if (coll == "alltoall") break;  // not defined in place
          if (big_send)
            rp = send.data() + rank * s.count * elt;
          else
            sp = in_place_send(coll, recv.data(), s.count, elt, rank, send);
        }
        std::error_code ec;
        if (o.check) {
          perf::fill(coll, o, s.count, n, rank, const_cast<void*>(sp), rp, place == 1);
          ec = co_await launch(c, kind, o, s, sp, rp);
          if (ec) throw std::system_error(ec, c.last_error());
          long long wrong = perf::count_wrong(coll, o, s.count, n, rank, rp);
          std::vector<long long> total{wrong};
          std::tie(ec) =
              co_await c.async_all_reduce(total.data(), total.data(), 1, DataType::int64,
                                          ReduceOp::sum, asio::as_tuple(asio::use_awaitable));
          row.wrong[place] = total[0];
        }
        for (int i = 0; i < o.warmup; ++i) {
          ec = co_await launch(c, kind, o, s, sp, rp);
          if (ec) throw std::system_error(ec, c.last_error());
        }
        std::vector<double> batches;
        for (int r = 0; r < o.repeat; ++r) {
          std::tie(ec) = co_await c.async_barrier(asio::as_tuple(asio::use_awaitable));
          auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < o.iters; ++i) {
            // Blocking calls straight from this loop: no coroutine per call.
            if (o.blocking)
              ec = call_blocking(kind, c, o, s, sp, rp);
            else
              ec = co_await launch(c, kind, o, s, sp, rp);
            if (ec) throw std::system_error(ec, c.last_error());
          }
          double us =
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                  .count() /
              o.iters;
          // The slowest rank defines the collective's time.
          std::tie(ec) = co_await c.async_all_reduce(&us, &us, 1, DataType::float64, ReduceOp::max,
                                                     asio::as_tuple(asio::use_awaitable));
          if (ec) throw std::system_error(ec, c.last_error());
          batches.push_back(us);
        }
        std::sort(batches.begin(), batches.end());
        row.time_us[place] = batches[batches.size() / 2];
      }
      rows->push_back(row);
    }
  }
  if (rank == 0) perf::progress_done();
}

double bus_factor(const std::string& coll, int n) {
  return shape_of(coll, 1 << 20, 4, n).bus_factor;
}

void print_table(const Options& o, int n, const std::vector<Row>& rows) {
  std::printf(
      "# coccl-perf: %d ranks, host memory%s%s, %s, %s, iters %d, warmup %d, median of %d\n", n,
      o.register_buffers ? " (registered)" : "",
      o.blocking ? ", blocking calls" : (o.own_loop ? ", awaited on the rank's own loop" : ""),
      std::string(coccl::to_string(o.type)).c_str(), std::string(coccl::to_string(o.op)).c_str(),
      o.iters, o.warmup, o.repeat);
  std::string last;
  double bus_sum = 0;
  int bus_n = 0;
  for (const Row& r : rows) {
    if (r.coll != last) {
      last = r.coll;
      std::printf("#\n# %s\n", r.coll.c_str());
      std::printf("# %10s %12s %8s %6s %6s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "", "", "", "",
                  "", "out-of-place", "", "", "", "in-place", "", "", "");
      std::printf("# %10s %12s %8s %6s %6s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "size", "count",
                  "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                  "busbw", "#wrong");
      std::printf("# %10s %12s %8s %6s %6s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "(B)",
                  "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                  "(GB/s)", "");
    }
    bool rooted =
        r.coll == "broadcast" || r.coll == "reduce" || r.coll == "gather" || r.coll == "scatter";
    bool reduces = r.coll == "allreduce" || r.coll == "reduce" || r.coll == "reducescatter";
    std::printf("  %10zu %12zu %8s %6s %6d", r.bytes, r.count,
                std::string(coccl::to_string(o.type)).c_str(),
                reduces ? std::string(coccl::to_string(o.op)).c_str() : "none",
                rooted ? o.root : -1);
    for (int p = 0; p < 2; ++p) {
      if (r.time_us[p] <= 0) {
        std::printf("   %9s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A");
        continue;
      }
      double algbw = r.bytes / r.time_us[p] / 1e3;
      double busbw = algbw * bus_factor(r.coll, n);
      if (p == 0) {
        bus_sum += busbw;
        ++bus_n;
      }
      std::printf("   %9.2f %7.3f %7.3f %6lld", r.time_us[p], algbw, busbw, r.wrong[p]);
    }
    std::printf("\n");
  }
  std::printf("# Out of bounds values : 0 OK\n");
  std::printf("# Avg bus bandwidth    : %g \n#\n", bus_n ? bus_sum / bus_n : 0.0);
  std::fflush(stdout);
}

void write_results(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  for (const Row& r : rows)
    f << r.coll << ' ' << r.bytes << ' ' << r.count << ' ' << r.time_us[0] << ' ' << r.time_us[1]
      << ' ' << r.wrong[0] << ' ' << r.wrong[1] << '\n';
}

std::vector<Row> read_results(const std::string& path) {
  std::vector<Row> rows;
  std::ifstream f(path);
  Row r;
  while (f >> r.coll >> r.bytes >> r.count >> r.time_us[0] >> r.time_us[1] >> r.wrong[0] >>
         r.wrong[1])
    rows.push_back(r);
  return rows;
}

int run_rank(coccl::Communicator comm, const Options& o) {
  if (o.device == "cuda") return perf::run_device(std::move(comm), o);
  std::vector<Row> rows;
  try {
    if (o.blocking || o.own_loop) {
      // On this thread, which may block: the same bench, its timed calls the blocking forms, or
      // the awaited forms on this thread's own event loop.
      asio::io_context io;
      auto fut = asio::co_spawn(io, bench_rank(comm, o, &rows), asio::use_future);
      io.run();
      fut.get();
    } else {
      auto fut = asio::co_spawn(comm.executor(), bench_rank(comm, o, &rows), asio::use_future);
      fut.get();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coccl-perf rank %d: %s\n", comm.rank(), e.what());
    return 1;
  }
  long long wrong = 0;
  for (auto& r : rows) wrong += r.wrong[0] + r.wrong[1];
  if (comm.rank() == 0) {
    print_table(o, comm.size(), rows);
    if (o.register_buffers)
      std::printf("# zero-copy bytes sent by rank 0: %llu\n",
                  static_cast<unsigned long long>(comm.zero_copy_bytes()));
    // How many operations finished on the fast path of small operations (COCCL_FAST_MAX_BYTES),
    // and how many it handed to the proxy thread because a peer was late.
    const coccl::CommStatus st = comm.status();
    std::printf("# fast path (rank 0): %llu of %llu operations, %llu more handed over\n",
                static_cast<unsigned long long>(st.fast_ops),
                static_cast<unsigned long long>(st.finished),
                static_cast<unsigned long long>(st.fast_handed_over));
    if (const char* out = std::getenv("COCCL_PERF_RESULTS")) write_results(out, rows);
  }
  comm.destroy();
  return wrong ? 1 : 0;
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "coccl-perf";
  buf[n] = 0;
  return buf;
}

int spawn_and_wait(const std::vector<std::string>& args, const std::vector<std::string>& env_add,
                   std::string* output) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.push_back(*e);
  for (auto& e : env_add) env_store.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int fds[2] = {-1, -1};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (output) {
    if (::pipe(fds) != 0) return -1;
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
  }
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (output) ::close(fds[1]);
  if (rc != 0) {
    if (output) ::close(fds[0]);
    return -1;
  }
  if (output) {
    char buf[4096];
    ssize_t k;
    while ((k = ::read(fds[0], buf, sizeof buf)) > 0) output->append(buf, k);
    ::close(fds[0]);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::string> common_args(const Options& o, const std::string& coll) {
  char f[32];
  std::snprintf(f, sizeof f, "%g", o.factor);
  return {"--coll",   coll,
          "-b",       std::to_string(o.min_bytes),
          "-e",       std::to_string(o.max_bytes),
          "-f",       f,
          "-n",       std::to_string(o.iters),
          "-w",       std::to_string(o.warmup),
          "--repeat", std::to_string(o.repeat),
          "-d",       std::string(coccl::to_string(o.type)),
          "-o",       std::string(coccl::to_string(o.op)),
          "-c",       std::to_string(o.check)};
}

struct PeerRow {
  double time_us;
  long long wrong;
  std::string algo;
};

// Runs one peer library over the same sweep; returns (coll, bytes) -> result. Clears `ok`, and
// says why on stderr, when the peer could not run: its program is missing beside coccl-perf, or a
// rank of it exited non-zero (its own message comes first), so that a comparison never goes
// quietly empty.
std::map<std::pair<std::string, std::size_t>, PeerRow> run_baseline(const Options& o,
                                                                    const std::string& peer,
                                                                    bool& ok) {
  std::map<std::pair<std::string, std::size_t>, PeerRow> out;
  std::string dir = self_exe();
  dir = dir.substr(0, dir.rfind('/') + 1);
  const std::string program = dir + "coccl-perf-" + peer;
  if (::access(program.c_str(), X_OK) != 0) {
    std::fprintf(stderr,
                 "coccl-perf: the %s baseline needs %s, which is not there or not executable "
                 "(%s): keep coccl-perf beside the baselines it was built with\n",
                 peer.c_str(), program.c_str(), std::strerror(errno));
    ok = false;
    return out;
  }
  for (const std::string& coll : o.colls) {
    std::string text;
    perf::progress(coll + ", the " + peer + " baseline's sweep");
    if (peer == "mpi") {
      std::vector<std::string> args{COCCL_MPIEXEC,
                                    "--allow-run-as-root",
                                    "--oversubscribe",
                                    "--bind-to",
                                    "none",
                                    "-np",
                                    std::to_string(o.ranks),
                                    program};
      for (auto& a : common_args(o, coll)) args.push_back(a);
      const int rc = spawn_and_wait(
          args, {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"}, &text);
      if (rc != 0) {
        std::fprintf(stderr, "coccl-perf: the mpi baseline's %s exited with %d\n", coll.c_str(),
                     rc);
        ok = false;
      }
    } else {
      char store[] = "/tmp/coccl-perf-gloo-XXXXXX";
      if (!::mkdtemp(store)) {
        std::fprintf(stderr, "coccl-perf: cannot make the gloo baseline's store under /tmp: %s\n",
                     std::strerror(errno));
        ok = false;
        break;
      }
      std::vector<int> rcs(o.ranks);
      std::vector<std::thread> threads;
      std::vector<std::string> outputs(o.ranks);
      for (int r = 0; r < o.ranks; ++r) {
        std::vector<std::string> args{
            program,   "--rank", std::to_string(r), "--nranks", std::to_string(o.ranks),
            "--store", store};
        for (auto& a : common_args(o, coll)) args.push_back(a);
        threads.emplace_back(
            [args, r, &outputs, &rcs] { rcs[r] = spawn_and_wait(args, {}, &outputs[r]); });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < o.ranks; ++r)
        if (rcs[r] != 0) {
          std::fprintf(stderr, "coccl-perf: the gloo baseline's %s, rank %d, exited with %d\n",
                       coll.c_str(), r, rcs[r]);
          ok = false;
        }
      text = outputs[0];
      std::string cleanup = std::string("rm -rf ") + store;
      if (std::system(cleanup.c_str()) != 0) std::fprintf(stderr, "cannot remove %s\n", store);
    }
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string tag, p, c, type, op, algo;
      std::size_t bytes, count;
      double us;
      long long wrong;
      if (ls >> tag >> p >> c >> bytes >> count >> type >> op >> us >> wrong >> algo &&
          tag == "coccl-baseline")
        out[{coll, bytes}] = {us, wrong, algo};
    }
  }
  perf::progress_done();
  return out;
}

void print_comparison(const Options& o, const std::vector<Row>& rows, const std::string& peer,
                      const std::map<std::pair<std::string, std::size_t>, PeerRow>& res) {
  std::printf("#\n# coccl vs %s, %d ranks, same sweep, out-of-place, median of %d\n", peer.c_str(),
              o.ranks, o.repeat);
  std::printf("# %-13s %10s %11s %11s %9s %9s %7s %6s %s\n", "coll", "size(B)", "coccl(us)",
              (peer + "(us)").c_str(), "coccl", peer.c_str(), "speedup", "#wrong", "peer algo");
  std::printf("# %-13s %10s %11s %11s %9s %9s %7s %6s\n", "", "", "", "", "busbw", "busbw", "(x)",
              "");
  for (const Row& r : rows) {
    auto it = res.find({r.coll, r.bytes});
    if (it == res.end()) continue;
    double f = bus_factor(r.coll, o.ranks);
    double cb = r.bytes / r.time_us[0] / 1e3 * f, pb = r.bytes / it->second.time_us / 1e3 * f;
    std::printf("  %-13s %10zu %11.2f %11.2f %9.3f %9.3f %7.2f %6lld %s\n", r.coll.c_str(), r.bytes,
                r.time_us[0], it->second.time_us, cb, pb, it->second.time_us / r.time_us[0],
                it->second.wrong, it->second.algo.c_str());
  }
  std::fflush(stdout);
}

void write_json(
    const std::string& path, const Options& o, const std::vector<Row>& rows,
    const std::map<std::string, std::map<std::pair<std::string, std::size_t>, PeerRow>>& peers) {
  std::ofstream f(path);
  // JSON has no infinity or NaN (a size that took no measurable time): those are null.
  auto num = [](double v) { return std::isfinite(v) ? std::to_string(v) : std::string("null"); };
  f << "{\"ranks\":" << o.ranks << ",\"device\":\"" << o.device << "\",\"type\":\""
    << coccl::to_string(o.type) << "\",\"op\":\"" << coccl::to_string(o.op) << "\",\"results\":[";
  bool first = true;
  for (const Row& r : rows) {
    double fct = bus_factor(r.coll, o.ranks);
    f << (first ? "" : ",") << "{\"coll\":\"" << r.coll << "\",\"bytes\":" << r.bytes
      << ",\"count\":" << r.count << ",\"time_us\":" << num(r.time_us[0])
      << ",\"time_us_inplace\":" << num(r.time_us[1])
      << ",\"busbw\":" << num(r.bytes / r.time_us[0] / 1e3 * fct)
      << ",\"wrong\":" << r.wrong[0] + r.wrong[1];
    for (auto& [peer, res] : peers) {
      auto it = res.find({r.coll, r.bytes});
      if (it != res.end()) f << ",\"" << peer << "_time_us\":" << num(it->second.time_us);
    }
    f << "}";
    first = false;
  }
  f << "]}\n";
}

// --plot: coccl and every baseline of the run, one series per library (and collective, when the
// run has several). A missing gnuplot leaves a one-line note; the run's status is unchanged.
void plot_results(
    const Options& o, const std::vector<Row>& rows,
    const std::map<std::string, std::map<std::pair<std::string, std::size_t>, PeerRow>>& peers) {
  const bool several = o.colls.size() > 1;
  const bool one_rank = bus_factor("allreduce", o.ranks) == 0;
  std::vector<perf::PlotSeries> series;
  for (const std::string& coll : o.colls) {
    // With one rank the bus bandwidth is 0 everywhere: the algorithm bandwidth is drawn instead.
    const double f = one_rank ? 1 : bus_factor(coll, o.ranks);
    const std::string tail = several ? " " + coll : "";
    perf::PlotSeries mine{"coccl" + tail, {}};
    for (const Row& r : rows)
      if (r.coll == coll && r.time_us[0] > 0)
        mine.points.push_back(
            {static_cast<double>(r.bytes), r.time_us[0], r.bytes / r.time_us[0] / 1e3 * f});
    if (!mine.points.empty()) series.push_back(std::move(mine));
    for (const auto& [peer, results] : peers) {
      perf::PlotSeries theirs{peer + tail, {}};
      for (const auto& [key, p] : results)
        if (key.first == coll && p.time_us > 0)
          theirs.points.push_back(
              {static_cast<double>(key.second), p.time_us, key.second / p.time_us / 1e3 * f});
      if (!theirs.points.empty()) series.push_back(std::move(theirs));
    }
  }
  if (series.empty()) {
    std::fprintf(stderr, "coccl-perf: no results to plot; %s not written\n", o.plot.c_str());
    return;
  }
  std::string colls;
  for (const std::string& c : o.colls) colls += (colls.empty() ? "" : ", ") + c;
  const std::string title = "coccl-perf: " + colls + ", " + std::to_string(o.ranks) + " ranks, " +
                            (o.device == "cuda" ? "device" : "host") + " memory, " +
                            std::string(coccl::to_string(o.type));
  perf::PlotAxes axes;
  axes.bandwidth_label = one_rank ? "algorithm bandwidth (GB/s)" : "bus bandwidth (GB/s)";
  const std::string why = perf::plot(o.plot, title, axes, series);
  if (!why.empty()) std::fprintf(stderr, "coccl-perf: %s\n", why.c_str());
}

// --plot-from: the rows and baselines of a run that --json saved, drawn as --plot draws a live
// run. Returns the exit status: 2 for a file that is missing or not such a run.
int plot_from_json(Options o) {
  std::ifstream in(o.plot_from);
  if (!in) {
    std::fprintf(stderr, "coccl-perf: cannot read %s\n", o.plot_from.c_str());
    return 2;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Row> rows;
  std::map<std::string, std::map<std::pair<std::string, std::size_t>, PeerRow>> peers;
  try {
    const perf::json::Value doc = perf::json::parse(text);
    const perf::json::Object* top = doc.object();
    auto field = [](const perf::json::Object* obj, const char* name) -> const perf::json::Value& {
      auto it = obj->find(name);
      if (it == obj->end()) throw std::runtime_error(std::string("no \"") + name + "\" field");
      return it->second;
    };
    if (!top) throw std::runtime_error("not a JSON object");
    const double* ranks = field(top, "ranks").number();
    if (!ranks || *ranks < 1 || *ranks != std::floor(*ranks))
      throw std::runtime_error("\"ranks\" is not a rank count");
    o.ranks = static_cast<int>(*ranks);
    // Files of older versions carry no device: host memory.
    auto dev = top->find("device");
    o.device = dev != top->end() && dev->second.string() ? *dev->second.string() : "host";
    if (const std::string* t = field(top, "type").string())
      if (auto parsed = coccl::parse_data_type(*t)) o.type = *parsed;
    const perf::json::Array* results = field(top, "results").array();
    if (!results) throw std::runtime_error("\"results\" is not an array");
    o.colls.clear();
    for (const perf::json::Value& v : *results) {
      const perf::json::Object* r = v.object();
      if (!r) throw std::runtime_error("a result is not an object");
      const std::string* coll = field(r, "coll").string();
      const double* bytes = field(r, "bytes").number();
      if (!coll || std::find(all_colls.begin(), all_colls.end(), *coll) == all_colls.end())
        throw std::runtime_error("a result names no known collective");
      if (!bytes || *bytes < 0) throw std::runtime_error("a result has no byte count");
      if (std::find(o.colls.begin(), o.colls.end(), *coll) == o.colls.end())
        o.colls.push_back(*coll);
      const auto size = static_cast<std::size_t>(*bytes);
      const double* t = field(r, "time_us").number();
      rows.push_back({*coll, size, 0, {t ? *t : 0, 0}, {0, 0}});
      const std::string suffix = "_time_us";
      for (const auto& [key, value] : *r) {
        if (key == "time_us" || key.size() <= suffix.size() ||
            key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0 || !value.number())
          continue;
        peers[key.substr(0, key.size() - suffix.size())][{*coll, size}] = {*value.number(), 0, ""};
      }
    }
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "coccl-perf: %s is not a coccl-perf --json run: %s\n", o.plot_from.c_str(),
                 e.what());
    return 2;
  }
  plot_results(o, rows, peers);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (!o.plot_from.empty()) {
    if (o.plot.empty()) usage("--plot-from needs --plot FILE.svg|FILE.png");
    return plot_from_json(o);
  }
  // A rank started by this tool, or by a launcher.
  if (const char* r = std::getenv("COCCL_PERF_RANK")) {
    auto id = coccl::UniqueId::from_string(std::getenv("COCCL_PERF_ID"));
    int n = std::atoi(std::getenv("COCCL_PERF_NRANKS"));
    return run_rank(coccl::Communicator::create(id, std::atoi(r), n), o);
  }
  if (std::getenv("RANK") || std::getenv("OMPI_COMM_WORLD_RANK") || std::getenv("SLURM_PROCID"))
    return run_rank(coccl::Communicator::from_env(), o);

  auto id = coccl::UniqueId::create();
  char results[] = "/tmp/coccl-perf-XXXXXX";
  int fd = ::mkstemp(results);
  if (fd >= 0) ::close(fd);
  std::vector<std::thread> procs;
  std::vector<int> rcs(o.ranks);
  for (int r = 0; r < o.ranks; ++r) {
    std::vector<std::string> args(argv, argv + argc);
    args[0] = self_exe();
    std::vector<std::string> env{
        "COCCL_PERF_RANK=" + std::to_string(r), "COCCL_PERF_NRANKS=" + std::to_string(o.ranks),
        "COCCL_PERF_ID=" + id.to_string(), std::string("COCCL_PERF_RESULTS=") + results};
    if (o.hosts > 0) {
      // Both libraries group ranks into hosts by these; NCCL then uses its network transport.
      const std::string host = "coccl-perf-host-" + std::to_string(r * o.hosts / o.ranks);
      env.push_back("COCCL_HOSTID=" + host);
      env.push_back("NCCL_HOSTID=" + host);
    }
    procs.emplace_back([args, env, r, &rcs] { rcs[r] = spawn_and_wait(args, env, nullptr); });
  }
  for (auto& t : procs) t.join();
  int status = 0;
  for (int r = 0; r < o.ranks; ++r)
    if (rcs[r] != 0) {
      std::fprintf(stderr, "coccl-perf: rank %d exited with %d\n", r, rcs[r]);
      status = 1;
    }
  std::vector<Row> rows;
  std::map<std::string, std::map<std::pair<std::string, std::size_t>, PeerRow>> peers;
  // A device run's rank 0 also reports NCCL's results, as rows of collective "nccl/COLL".
  for (Row& r : read_results(results)) {
    if (r.coll.rfind("nccl/", 0) == 0)
      peers["nccl"][{r.coll.substr(5), r.bytes}] = {r.time_us[0], r.wrong[0], "nccl"};
    else
      rows.push_back(std::move(r));
  }
  ::unlink(results);
  for (const std::string& b : o.baselines) {
    if (b == "nccl") continue;  // measured inside the ranks
    if ((b == "gloo" && !COCCL_HAVE_GLOO) || (b == "mpi" && !COCCL_HAVE_MPI)) {
      std::fprintf(stderr, "coccl-perf: the %s baseline was not built\n", b.c_str());
      status = 1;
      continue;
    }
    bool ok = true;
    peers[b] = run_baseline(o, b, ok);
    if (!ok) status = 1;
    if (peers[b].empty() && !ok) continue;  // nothing to compare: the reason is on stderr
    print_comparison(o, rows, b, peers[b]);
    for (auto& [k, v] : peers[b])
      if (v.wrong) status = 1;
  }
  if (!o.plot.empty()) plot_results(o, rows, peers);
  if (!o.json.empty()) write_json(o.json, o, rows, peers);
  return status;
}
