// coccl-sim: N ranks of the real code in one process. Each rank has its own communicator on the
// in-memory network (transport/memory.hpp), which sits under the same connection interface as
// tcp: the real bootstrap, split, lazy links and algorithms run, on T proxy threads (the ranks of
// simulated host h on thread h mod T, as a process's communicators are spread over
// COCCL_PROXY_THREADS), and every rank's messages, bytes, links and rounds are counted
// (transport/traffic.hpp). It prints one
// line per phase and one for the whole run, and a modelled wall time on a stated network. The
// counts and rounds do not depend on T (virtual time advances only when every thread is idle, a
// round serves its streams in an order set by the named parties, and a phase ends once the
// network is quiet); the wall time does.
//
//   coccl-sim [--ranks N] [--roots K] [--ranks-per-host R] [--groups G1,G2,...] [--count C]
//             [--split members|color] [--latency-us L] [--bandwidth-gbps B]
//             [--costs M_US,B_NS,K_US] [--threads T] [--json PATH]
//
// Phases: init (N ranks bootstrap one communicator, their hellos spread over K roots as
// ncclCommInitRankScalable spreads them over its ids; ranks r / R share a host identity, so
// that each host's ranks meet through its leader as on a cluster of R GPUs a host; or, with
// --bootstrap launcher, each rank puts its listener in a launcher's table and, after the fence,
// reads the entries it keeps, as under PMIx, with no root), a first
// all_reduce of C int32 on it, then for each group size G a split into groups of G ranks
// (contiguous blocks when G*G <= N, else strided like rails: rank r in group r mod ceil(N/G)) and a
// first all_reduce on every group, and finally the destruction of everything. Every all_reduce is
// checked against a reference computed here. Exit status: 0 all verified, 1 a failure or wrong
// result, 2 bad arguments.
//
// Unlike the other tools this one reaches coccl's internals (the in-memory network, the
// counters): they are what it measures, and no public API offers them.
#include <sys/resource.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <chrono>
#include <coccl/coccl.hpp>
#include <coccl/error.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collectives/comm.hpp"
#include "collectives/comm_params.hpp"
#include "runtime/engine.hpp"
#include "sim_costs.hpp"
#include "sim_report.hpp"
#include "transport/address_book.hpp"
#include "transport/hmac.hpp"
#include "transport/memory.hpp"
#include "transport/peers.hpp"
#include "transport/traffic.hpp"

namespace {

namespace asio = boost::asio;
using coccl::Communicator;
using coccl::sim::PhaseStats;
using coccl::sim::Snapshot;
using coccl::transport::Traffic;

struct Options {
  int ranks = 4096;
  int roots = 1;            // bootstrap roots of the world communicator
  bool launcher = false;    // --bootstrap launcher: the world forms from a launcher's table
  int ranks_per_host = 8;   // ranks sharing a host identity
  std::vector<int> groups;  // empty: 8 and N/8
  std::size_t count = 1024;
  std::string split = "members";
  coccl::sim::Network net;
  bool stated_costs = false;
  coccl::sim::Costs costs;
  std::string json;
  int threads = 0;  // proxy threads; 0: one a core
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "coccl-sim: %s\n"
      "usage: coccl-sim [--ranks N] [--roots K | --bootstrap root|launcher]\n"
      "                 [--ranks-per-host R] [--groups G1,G2,...]\n"
      "                 [--count C] [--split members|color] [--latency-us L]\n"
      "                 [--bandwidth-gbps B] [--costs M_US,B_NS,K_US] [--threads T]\n"
      "                 [--json PATH]\n"
      "  --ranks N           ranks in this process (default 4096)\n"
      "  --roots K           bootstrap roots of the first communicator, each taking the\n"
      "                      hellos of N/K ranks (default 1)\n"
      "  --bootstrap HOW     root: the first communicator forms through its roots (default);\n"
      "                      launcher: from a launcher's table of addresses (PMIx's modex),\n"
      "                      without a root, the launcher's fences and reads modelled\n"
      "  --ranks-per-host R  ranks r / R share a host identity (default 8)\n"
      "  --groups G,...      split group sizes (default 8 and N/8)\n"
      "  --count C           int32 elements of each first all_reduce (default 1024)\n"
      "  --split HOW         members: split_members (default); color: split(color, key)\n"
      "  --latency-us L      network latency the model assumes (default 5)\n"
      "  --bandwidth-gbps B  network bandwidth the model assumes (default 100)\n"
      "  --costs M,B,K       state the per-message (us), per-byte (ns) and per-connection\n"
      "                      (us) costs instead of measuring them over tcp loopback\n"
      "  --threads T         proxy threads the ranks are spread over (default: one a\n"
      "                      core, at most 64)\n"
      "  --json PATH         also write the results as JSON\n",
      why.c_str());
  std::exit(2);
}

double number_arg(const char* text, const char* what) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(v >= 0)) usage(std::string("bad ") + what + ": " + text);
  return v;
}

std::vector<double> list_arg(const std::string& text, const char* what) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(number_arg(item.c_str(), what));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") usage("help");
    if (i + 1 >= argc) usage(a + " needs a value");
    const char* v = argv[++i];
    if (a == "--ranks") {
      o.ranks = static_cast<int>(number_arg(v, "--ranks"));
    } else if (a == "--roots") {
      o.roots = static_cast<int>(number_arg(v, "--roots"));
    } else if (a == "--bootstrap") {
      const std::string how = v;
      if (how != "root" && how != "launcher") usage("--bootstrap is root or launcher");
      o.launcher = how == "launcher";
    } else if (a == "--ranks-per-host") {
      o.ranks_per_host = static_cast<int>(number_arg(v, "--ranks-per-host"));
    } else if (a == "--groups") {
      for (double g : list_arg(v, "--groups")) o.groups.push_back(static_cast<int>(g));
    } else if (a == "--count") {
      o.count = static_cast<std::size_t>(number_arg(v, "--count"));
    } else if (a == "--split") {
      o.split = v;
      if (o.split != "members" && o.split != "color") usage("--split is members or color");
    } else if (a == "--latency-us") {
      o.net.latency_s = number_arg(v, "--latency-us") * 1e-6;
    } else if (a == "--bandwidth-gbps") {
      o.net.bandwidth_bytes_s = number_arg(v, "--bandwidth-gbps") * 1e9 / 8;
    } else if (a == "--costs") {
      const auto c = list_arg(v, "--costs");
      if (c.size() != 3) usage("--costs takes three numbers");
      o.costs = {c[0] * 1e-6, c[1] * 1e-9, c[2] * 1e-6};
      o.stated_costs = true;
    } else if (a == "--threads") {
      o.threads = static_cast<int>(number_arg(v, "--threads"));
      if (o.threads < 1 || o.threads > 64) usage("--threads must be between 1 and 64");
    } else if (a == "--json") {
      o.json = v;
    } else {
      usage("unknown option " + a);
    }
  }
  if (o.ranks < 1) usage("--ranks must be at least 1");
  if (o.roots < 1 || o.roots > o.ranks) usage("--roots must be between 1 and --ranks");
  if (o.launcher && o.roots != 1) usage("--roots is for --bootstrap root");
  if (o.ranks_per_host < 1) usage("--ranks-per-host must be at least 1");
  if (o.net.bandwidth_bytes_s <= 0) usage("--bandwidth-gbps must be positive");
  if (o.groups.empty()) o.groups = {8, std::max(1, o.ranks / 8)};
  if (o.threads == 0)
    o.threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 64);
  for (int g : o.groups)
    if (g < 1) usage("group sizes must be at least 1");
  return o;
}

// ---- the process: memory and CPU ----

// A line of /proc/self/status in bytes (VmRSS, VmHWM); 0 if absent.
double status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::size_t n = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':')
      return std::strtod(line.c_str() + n + 1, nullptr) * 1024;
  return 0;
}

// Starts the peak (VmHWM) again from the current RSS, so that each phase reports its own peak.
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// ---- driving N ranks from this thread ----

// Completions still to come; the main thread waits for the last.
class Countdown {
 public:
  explicit Countdown(long n) : left_(n) {}
  void done() {
    if (left_.fetch_sub(1, std::memory_order_acq_rel) == 1) left_.notify_all();
  }
  void wait() {
    for (long v = left_.load(std::memory_order_acquire); v != 0;
         v = left_.load(std::memory_order_acquire))
      left_.wait(v, std::memory_order_acquire);
  }

 private:
  std::atomic<long> left_;
};

// Runs `fn(t)` on each proxy thread t < `threads`, side by side, and waits for all of them.
template <typename Fn>
void on_threads(int threads, Fn fn) {
  std::vector<std::promise<void>> done(threads);
  for (int t = 0; t < threads; ++t)
    asio::post(coccl::detail::process_engine().thread(t).executor(), [&fn, &done, t] {
      fn(t);
      done[t].set_value();
    });
  for (std::promise<void>& d : done) d.get_future().get();
}

// One rank: its communicators (the world's first), and the Traffic they share.
struct Rank {
  std::vector<Communicator> comms;
  std::shared_ptr<Traffic> traffic;
  std::shared_ptr<Traffic> roots;  // the roots it started for splits
  std::uint64_t links_gone = 0;    // peers linked by its communicators already destroyed
};

struct Sim {
  Options opt;
  std::vector<Rank> ranks;
  std::vector<std::shared_ptr<Traffic>> world_roots;  // the first communicator's roots
  coccl::sim::Costs costs;
  std::string costs_origin;
  double baseline_rss = 0;
  std::vector<PhaseStats> phases;
  Snapshot first;
  bool verified = true;
  // Set by the init phase's check when it formed from a launcher's table; taken by its line.
  std::optional<coccl::sim::LauncherStats> launcher;
  coccl::transport::memory::VirtualTime* time = nullptr;

  // The simulated host of rank r, and its proxy thread: the ranks of a host share one, so that
  // they meet (host leaders) in the order they would on one thread.
  int host_of(int r) const { return r / opt.ranks_per_host; }
  int thread_of(int r) const { return host_of(r) % opt.threads; }

  // Runs `fn(r)` for every rank on its proxy thread, in rank order on each.
  template <typename Fn>
  void each_rank(Fn fn) {
    const int n = static_cast<int>(ranks.size());
    on_threads(opt.threads, [&](int t) {
      for (int r = 0; r < n; ++r)
        if (thread_of(r) == t) fn(r);
    });
  }

  Snapshot snapshot() {
    Snapshot s;
    const int n = static_cast<int>(ranks.size());
    s.ranks.resize(n);
    s.links.resize(n);
    for (int r = 0; r < n; ++r) s.links[r] = ranks[r].links_gone;
    // The world's roots, then each rank's split roots, at the same places in every snapshot.
    s.roots.resize(world_roots.size() + n);
    for (std::size_t k = 0; k < world_roots.size(); ++k) s.roots[k] = world_roots[k]->counts();
    for (int r = 0; r < n; ++r) {
      if (ranks[r].traffic) s.ranks[r] = ranks[r].traffic->counts();
      if (ranks[r].roots) s.roots[world_roots.size() + r] = ranks[r].roots->counts();
    }
    // Link counts belong to each communicator's proxy thread.
    each_rank([&](int r) {
      for (const Communicator& c : ranks[r].comms)
        if (c) s.links[r] += coccl::detail::impl_of(c)->peers().link_stats().peers;
    });
    return s;
  }

  // Runs one phase: `start(r, done)` starts rank r's part, which calls done(r, error) once;
  // `check` verifies the results and says what it verified.
  // `hold`: the time stands still while `start` runs (see below); destroy's start is the whole
  // phase.
  template <typename Start, typename Check>
  void phase(const std::string& name, Start start, Check check, bool hold = true) {
    const int n = opt.ranks;
    const Snapshot before = snapshot_after_;
    Traffic::next_phase();
    reset_peak();
    const double rss_start = status_bytes("VmRSS");
    const std::uint64_t time0 = coccl::transport::memory::VirtualTime::now();
    const double cpu0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::error_code> errors(n);
    Countdown left(n);
    auto done = [&](int r, std::error_code ec) {
      errors[r] = ec;
      left.done();
    };
    // The ranks start on several threads: the time stands still until all have started, as it
    // does while one thread starts them all.
    if (hold) time->hold();
    start(done);
    if (hold) time->release();
    left.wait();
    // The phase's last messages (credits nobody waits for) are read before the counts are taken,
    // and before the next phase starts its rounds: counted whenever they happened to be read,
    // they would move between phases from run to run.
    time->settle();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_seconds() - cpu0;
    const std::uint64_t elapsed = coccl::transport::memory::VirtualTime::now() - time0;
    const double peak = std::max(status_bytes("VmHWM"), rss_start);
    int failed = 0;
    for (int r = 0; r < n; ++r)
      if (errors[r] && failed++ < 5)
        std::fprintf(stderr, "coccl-sim: %s: rank %d failed: %s\n", name.c_str(), r,
                     errors[r].message().c_str());
    if (failed > 0) {
      std::fprintf(stderr, "coccl-sim: %s: %d of %d ranks failed\n", name.c_str(), failed, n);
      std::exit(1);
    }
    std::string checked = check();
    snapshot_after_ = snapshot();
    PhaseStats s = coccl::sim::phase_stats(name, before, snapshot_after_, costs, opt.net);
    s.cpu_s = cpu;
    s.wall_s = wall;
    s.virtual_rounds = elapsed;
    if (launcher) {
      s.model_s += coccl::sim::launcher_s(*launcher, costs, opt.net);
      s.launcher = std::exchange(launcher, std::nullopt);
    }
    s.peak_rss_bytes_per_rank = std::max(0.0, peak - baseline_rss) / n;
    s.check = std::move(checked);
    std::printf("%s\n", coccl::sim::line(s).c_str());
    std::fflush(stdout);
    phases.push_back(std::move(s));
  }

  Snapshot snapshot_after_;  // at the end of the latest phase (at first: before any)
};

// ---- the phases ----

std::int32_t world_input(int rank, std::size_t i) {
  return static_cast<std::int32_t>((static_cast<std::size_t>(rank) * 7 + i) % 101);
}
std::int32_t group_input(int rank, std::size_t i, int g) {
  return static_cast<std::int32_t>((static_cast<std::size_t>(rank) * 3 + i + g) % 89);
}

// The groups of size `g`: each rank's group and its place in it, and each group's members.
struct Layout {
  std::vector<int> group_of, index_of;
  std::vector<std::vector<int>> members;
  bool contiguous;
};

Layout layout(int n, int g) {
  Layout l;
  const int groups = (n + g - 1) / g;
  l.contiguous = static_cast<long long>(g) * g <= n;
  l.group_of.resize(n);
  l.index_of.resize(n);
  l.members.resize(groups);
  for (int r = 0; r < n; ++r) {
    const int c = l.contiguous ? r / g : r % groups;
    l.group_of[r] = c;
    l.index_of[r] = static_cast<int>(l.members[c].size());
    l.members[c].push_back(r);
  }
  return l;
}

// The launcher's table of the sim's ranks (transport/address_book.hpp), as PMIx's modex holds
// it: every rank's entry is put before the fence (the first step of the init phase, on every
// thread), and each rank's reads are counted.
struct SimBook {
  std::vector<coccl::transport::PeerInfo> entries;
  std::vector<std::uint32_t> reads;
  int per_host = 1;

  class View final : public coccl::transport::AddressBook {
   public:
    View(SimBook& book, int rank) : book_(book), rank_(rank) {}
    void publish(const coccl::transport::PeerInfo& self) override {
      // Put in the first step, read here after the fence: what a rank reads back is its own.
      if (std::memcmp(&book_.entries[rank_], &self, sizeof self) != 0)
        throw std::system_error(coccl::make_error_code(coccl::errc::internal),
                                "rank " + std::to_string(rank_) + "'s entry changed");
    }
    coccl::transport::PeerInfo lookup(int rank) override {
      ++book_.reads[rank_];
      return book_.entries.at(rank);
    }
    std::optional<coccl::transport::HostCount> hosts() override {
      const int n = static_cast<int>(book_.entries.size());
      const int first = rank_ / book_.per_host * book_.per_host;
      return coccl::transport::HostCount{
          static_cast<std::uint32_t>((n + book_.per_host - 1) / book_.per_host),
          static_cast<std::uint32_t>(std::min(book_.per_host, n - first))};
    }

   private:
    SimBook& book_;
    int rank_;
  };
};

// The rank's party, with its host's identity (never 0, which means this process's). Named (the
// roots 1 to K, the ranks after them), so that each round serves its streams in the same order
// on any number of threads (transport/traffic.hpp).
std::shared_ptr<Traffic> party_of(const Sim& sim, int r) {
  auto party = std::make_shared<Traffic>();
  party->set_id(static_cast<std::uint64_t>(sim.opt.roots) + 1 + r);
  party->set_host(0x5157000000000000ull + sim.host_of(r));
  return party;
}

void run_launcher_init(Sim& sim) {
  const int n = sim.opt.ranks;
  SimBook book;
  book.entries.resize(n);
  book.reads.assign(n, 0);
  book.per_host = sim.opt.ranks_per_host;
  coccl::transport::Secret secret{};
  coccl::detail::random_bytes(secret);
  std::vector<std::shared_ptr<coccl::detail::CommImpl>> made(n);
  sim.phase(
      "init",
      [&](auto done) {
        // Each rank opens its listener and puts its entry; the fence is the end of this step on
        // every thread. Then each reads what it keeps and forms.
        sim.each_rank([&](int r) {
          made[r] = std::make_shared<coccl::detail::CommImpl>(
              coccl::runtime::Engine::instance(), secret, r, n, coccl::CommunicatorOptions{}, true,
              party_of(sim, r));
          book.entries[r] = made[r]->peers().self_info();
        });
        sim.each_rank([&](int r) {
          std::error_code ec;
          try {
            SimBook::View view(book, r);
            made[r]->form(coccl::transport::frame_from_book(view, book.entries[r], r, n));
            sim.ranks[r].comms.push_back(coccl::detail::CommImpl::handle(made[r]));
          } catch (const std::system_error& e) {
            ec = e.code();
          }
          made[r].reset();
          done(r, ec);
        });
      },
      [&] {
        for (int r = 0; r < n; ++r) {
          auto impl = coccl::detail::impl_of(sim.ranks[r].comms.front());
          sim.ranks[r].traffic = impl->peers().traffic();
          sim.ranks[r].roots = impl->roots_traffic();
        }
        coccl::sim::LauncherStats l;
        l.fences = 2;  // rank 0's secret, then the entries
        l.puts = static_cast<std::uint64_t>(n) + 1;
        l.hosts = (n + sim.opt.ranks_per_host - 1) / sim.opt.ranks_per_host;
        l.entry_bytes = 2 * sizeof(coccl::transport::PeerInfo);
        for (int r = 0; r < n; ++r)
          if (l.max_reads.rank < 0 || book.reads[r] > l.max_reads.value)
            l.max_reads = {book.reads[r], r};
        sim.launcher = l;
        return std::string();
      });
}

void run_init(Sim& sim) {
  if (sim.opt.launcher) {
    run_launcher_init(sim);
    return;
  }
  const int n = sim.opt.ranks;
  std::vector<coccl::UniqueId> ids;
  for (std::shared_ptr<Traffic>& root : sim.world_roots)
    ids.push_back(coccl::detail::memory_unique_id(root));
  sim.phase(
      "init",
      [&](auto done) {
        // Started on the rank's proxy thread, where each communicator is built at once (from
        // here, each would be a round trip to it).
        sim.each_rank([&](int r) {
          coccl::detail::start_create(
              ids, r, n, coccl::CommunicatorOptions{},
              [&sim, done, r](boost::system::error_code ec, Communicator c) {
                if (!ec) sim.ranks[r].comms.push_back(std::move(c));
                done(r, ec);
              },
              nullptr, party_of(sim, r));
        });
      },
      [&] {
        for (int r = 0; r < n; ++r) {
          auto impl = coccl::detail::impl_of(sim.ranks[r].comms.front());
          sim.ranks[r].traffic = impl->peers().traffic();
          sim.ranks[r].roots = impl->roots_traffic();
        }
        return std::string();
      });
}

// A first all_reduce on communicator `which` of every rank (0: the world), in place, checked
// against the sum over each group's members.
void run_all_reduce(Sim& sim, const std::string& name, std::size_t which, const Layout* groups,
                    int salt) {
  const int n = sim.opt.ranks;
  const std::size_t count = sim.opt.count;
  auto input = [&](int r, std::size_t i) {
    return groups ? group_input(r, i, salt) : world_input(r, i);
  };
  std::vector<std::vector<std::int32_t>> data(n);
  for (int r = 0; r < n; ++r) {
    data[r].resize(count);
    for (std::size_t i = 0; i < count; ++i) data[r][i] = input(r, i);
  }
  sim.phase(
      name,
      [&](auto done) {
        sim.each_rank([&](int r) {
          sim.ranks[r].comms[which].async_all_reduce(
              data[r].data(), data[r].data(), count, coccl::DataType::int32, coccl::ReduceOp::sum,
              [done, r](boost::system::error_code ec) { done(r, ec); });
        });
      },
      [&] {
        const std::size_t ngroups = groups ? groups->members.size() : 1;
        int wrong = 0;
        for (std::size_t c = 0; c < ngroups; ++c) {
          std::vector<std::int64_t> want(count, 0);
          const std::vector<int>* members = groups ? &groups->members[c] : nullptr;
          const int m = members ? static_cast<int>(members->size()) : n;
          for (int k = 0; k < m; ++k)
            for (std::size_t i = 0; i < count; ++i)
              want[i] += input(members ? (*members)[k] : k, i);
          for (int k = 0; k < m; ++k) {
            const int r = members ? (*members)[k] : k;
            for (std::size_t i = 0; i < count; ++i)
              if (data[r][i] != want[i]) {
                if (wrong++ < 5)
                  std::fprintf(stderr, "coccl-sim: %s: rank %d element %zu is %d, want %lld\n",
                               name.c_str(), r, i, data[r][i], static_cast<long long>(want[i]));
                break;
              }
          }
        }
        if (wrong) {
          sim.verified = false;
          return "FAILED (" + std::to_string(wrong) + " ranks wrong)";
        }
        return std::to_string(n) + " ranks, " + std::to_string(ngroups) + " group(s)";
      });
}

void run_split(Sim& sim, int g, const Layout& l) {
  const int n = sim.opt.ranks;
  std::vector<Communicator> made(n);
  sim.phase(
      "split " + std::to_string(g),
      [&](auto done) {
        sim.each_rank([&](int r) {
          auto finish = [&made, done, r](boost::system::error_code ec, Communicator c) {
            made[r] = std::move(c);
            done(r, ec);
          };
          Communicator& world = sim.ranks[r].comms.front();
          if (sim.opt.split == "color")
            world.async_split(l.group_of[r], r, finish);
          else
            world.async_split_members(l.members[l.group_of[r]], finish);
        });
      },
      [&] {
        int wrong = 0;
        for (int r = 0; r < n; ++r) {
          const int size = static_cast<int>(l.members[l.group_of[r]].size());
          if (!made[r] || made[r].size() != size || made[r].rank() != l.index_of[r]) {
            if (wrong++ < 5)
              std::fprintf(
                  stderr, "coccl-sim: split %d: rank %d got rank %d of %d, want %d of %d\n", g, r,
                  made[r] ? made[r].rank() : -1, made[r] ? made[r].size() : 0, l.index_of[r], size);
          }
          sim.ranks[r].comms.push_back(std::move(made[r]));
        }
        if (wrong) {
          sim.verified = false;
          return "FAILED (" + std::to_string(wrong) + " ranks wrong)";
        }
        return std::to_string(l.members.size()) + " groups, " +
               (l.contiguous ? "contiguous" : "strided");
      });
}

// Blocking destroy() calls in flight per proxy thread in the destroy phase.
constexpr int destroy_callers_per_thread = 4;

void run_destroy(Sim& sim) {
  const int n = sim.opt.ranks;
  sim.phase(
      "destroy",
      [&](auto done) {
        // What the communicators linked stays counted once they are gone.
        const Snapshot last = sim.snapshot_after_;
        for (int r = 0; r < n; ++r) sim.ranks[r].links_gone = last.links[r];
        // The splits first, then the world; destroy() blocks until each has closed (so, unlike
        // the other phases, the ranks do not start together: its rounds count that too). Several
        // callers per proxy thread, so that its next destroy is queued while a caller wakes from
        // the last: caller c takes the hosts h = c mod `callers`, all on thread c mod T.
        const int count = sim.opt.threads * destroy_callers_per_thread;
        std::vector<std::thread> callers;
        for (int c = 0; c < count; ++c)
          callers.emplace_back([&sim, done, n, c, count] {
            auto mine = [&](int r) { return sim.host_of(r) % count == c; };
            for (int r = 0; r < n; ++r)
              if (mine(r))
                for (std::size_t k = sim.ranks[r].comms.size(); k-- > 1;)
                  sim.ranks[r].comms[k].destroy();
            for (int r = 0; r < n; ++r)
              if (mine(r)) {
                sim.ranks[r].comms.front().destroy();
                done(r, std::error_code());
              }
          });
        for (std::thread& c : callers) c.join();
      },
      [&] {
        for (Rank& r : sim.ranks) r.comms.clear();
        return std::string();
      },
      false);
}

}  // namespace

int main(int argc, char** argv) {
  Sim sim;
  sim.opt = parse(argc, argv);
  const int n = sim.opt.ranks;
  // One process runs every rank, so a round of virtual time takes far longer in real time than
  // on a network: the listeners' real-time limits on a handshake in progress
  // (COCCL_BOOTSTRAP_SILENT_GRACE, COCCL_BOOTSTRAP_PENDING_GRACE, COCCL_BOOTSTRAP_AUTH_TIMEOUT;
  // admission.hpp) would close honest connections that the modelled network would have carried
  // (at 8192 ranks a round of the table's last tree level took longer than the 10 s to
  // authenticate). COCCL_TIMEOUT too: at 98,304 ranks the world's first all_reduce took about
  // 300 s of real time on one proxy thread, and a rank served late found its partner silent for
  // the 300 s default and failed the run. Raised unless the environment sets them.
  for (const char* limit : {"COCCL_BOOTSTRAP_SILENT_GRACE", "COCCL_BOOTSTRAP_PENDING_GRACE",
                            "COCCL_BOOTSTRAP_AUTH_TIMEOUT", "COCCL_TIMEOUT"})
    if (!std::getenv(limit)) ::setenv(limit, "3600", 1);
  // The process engine's threads, which the ranks are spread over (before anything makes it).
  if (!std::getenv("COCCL_PROXY_THREADS"))
    ::setenv("COCCL_PROXY_THREADS", std::to_string(sim.opt.threads).c_str(), 1);
  if (sim.opt.stated_costs) {
    sim.costs = sim.opt.costs;
    sim.costs_origin = "stated on the command line";
  } else {
    sim.costs = coccl::sim::measure_tcp_costs();
    sim.costs_origin = "measured at start over tcp loopback on this machine";
  }
  // The engine (and its proxy threads) exists before the baseline.
  sim.opt.threads =
      std::min<int>(sim.opt.threads, static_cast<int>(coccl::detail::process_engine().size()));
  std::printf(
      "coccl-sim: %d ranks in one process on the in-memory network, %d proxy thread(s); first "
      "all_reduce of %zu int32; %s; %d ranks a host; split by %s into groups of",
      n, sim.opt.threads, sim.opt.count,
      sim.opt.launcher ? "formed from a launcher's table (no root)"
                       : (std::to_string(sim.opt.roots) + " bootstrap root(s)").c_str(),
      sim.opt.ranks_per_host, sim.opt.split == "color" ? "split(color, key)" : "split_members");
  for (int g : sim.opt.groups) std::printf(" %d", g);
  // The settings that size what a rank holds (the library's parameters, as the environment
  // sets them).
  std::printf("; COCCL_SLOT_BYTES=%lld, COCCL_DIRECTORY_FULL=%lld\n",
              static_cast<long long>(coccl::params::slot_bytes.get()),
              static_cast<long long>(coccl::params::directory_full.get()));
  std::vector<coccl::runtime::ProxyThread*> threads;
  for (int t = 0; t < sim.opt.threads; ++t)
    threads.push_back(&coccl::detail::process_engine().thread(t));
  sim.ranks.resize(n);
  for (int k = 0; k < (sim.opt.launcher ? 0 : sim.opt.roots); ++k) {
    sim.world_roots.push_back(std::make_shared<Traffic>());
    sim.world_roots.back()->set_id(1 + static_cast<std::uint64_t>(k));
  }
  // Every message takes one round of virtual time: ranks run side by side as on a network with
  // latency, and the rounds count hops (transport/memory.hpp).
  auto virtual_time = std::make_unique<coccl::transport::memory::VirtualTime>(threads);
  sim.time = virtual_time.get();
  sim.baseline_rss = status_bytes("VmRSS");
  sim.first = sim.snapshot();
  sim.snapshot_after_ = sim.first;
  run_init(sim);
  run_all_reduce(sim, "all_reduce", 0, nullptr, 0);
  for (std::size_t k = 0; k < sim.opt.groups.size(); ++k) {
    const int g = sim.opt.groups[k];
    const Layout l = layout(n, g);
    run_split(sim, g, l);
    run_all_reduce(sim, "all_reduce " + std::to_string(g), k + 1, &l, g);
  }
  run_destroy(sim);
  virtual_time.reset();
  const PhaseStats all = coccl::sim::overall(sim.phases, sim.first, sim.snapshot_after_);
  const double init_ar = sim.phases[0].model_s + sim.phases[1].model_s;
  std::printf("%s\n", coccl::sim::line(all).c_str());
  std::printf("modelled init + first all_reduce at %d ranks: %.2f ms\n", n, init_ar * 1e3);
  std::printf("%s\n", coccl::sim::model_text(sim.costs, sim.costs_origin, sim.opt.net).c_str());
  if (sim.opt.launcher) std::printf("%s\n", coccl::sim::launcher_model_text().c_str());
  std::printf("verified: %s\n", sim.verified ? "every all_reduce and split" : "NO");
  if (!sim.opt.json.empty()) {
    std::ofstream out(sim.opt.json);
    out << coccl::sim::json(n, sim.opt.count, sim.opt.split, sim.verified, sim.phases, all,
                            sim.costs, sim.costs_origin, sim.opt.net);
    if (!out) {
      std::fprintf(stderr, "coccl-sim: cannot write %s\n", sim.opt.json.c_str());
      return 1;
    }
  }
  return sim.verified ? 0 : 1;
}
