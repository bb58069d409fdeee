// coccl-store-load: the load that forming a communicator without a root under torchrun puts on
// the launcher's TCPStore, measured against a real server (torch.distributed's TCPStore, or any
// server of its protocol).
//
//   coccl-store-load --store HOST:PORT [--ranks N[,N...]] [--per-host H] [--repeat R]
//
// For each N it starts N threads, each a rank with its own connection to the store, as torchrun's
// workers have, and runs what Communicator::from_env() runs there. Path "table"
// (COCCL_BOOTSTRAP=launcher): rank 0 sets a secret and the others read it, then every rank
// publishes a listener's entry and reads the frame it keeps (transport::store_book and
// frame_from_book, the library's own code); ranks r / H share a host. Path "id" (the default,
// through a root): rank 0 sets a UniqueId's text and the others read it.
// Time is taken from the moment every rank is connected to the moment the last has its frame;
// no listener is opened and no communicator forms, so what is timed is the store's part alone.
// Prints, per N, the queries sent in all and by the busiest rank, the median time of R runs, and
// the time per query (the server's throughput under this load). Every rank's frame is checked:
// each entry it read is the one that rank published. Exit status: 0 all checked, 1 a failure, 2
// bad arguments.
//
// Like coccl-sim this tool reaches coccl's internals (the launcher's client and book), which no
// public API offers: they are what it measures.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <coccl/error.hpp>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "open_files.hpp"
#include "transport/address_book.hpp"
#include "transport/launcher.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int files_a_rank = 4;
namespace tr = coccl::transport;

struct Options {
  std::string host;
  std::uint16_t port = 0;
  std::vector<int> ranks{64, 256, 1024};
  int per_host = 8;
  int repeat = 3;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "coccl-store-load: %s\n"
               "usage: coccl-store-load --store HOST:PORT [--ranks N[,N...]] [--per-host H] "
               "[--repeat R]\n",
               why.c_str());
  std::exit(2);
}

int positive(const std::string& text, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end || v < 1 || v > 1 << 20)
    usage(std::string(what) + " takes a positive integer, not '" + text + "'");
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--store") {
      const auto colon = v.rfind(':');
      if (colon == std::string::npos || colon == 0) usage("--store is HOST:PORT");
      o.host = v.substr(0, colon);
      const int port = positive(v.substr(colon + 1), "--store's port");
      if (port > 65535) usage("--store's port is at most 65535");
      o.port = static_cast<std::uint16_t>(port);
    } else if (a == "--ranks") {
      o.ranks.clear();
      std::size_t at = 0;
      while (at <= v.size()) {
        const auto comma = std::min(v.find(',', at), v.size());
        o.ranks.push_back(positive(v.substr(at, comma - at), "--ranks"));
        at = comma + 1;
      }
    } else if (a == "--per-host") {
      o.per_host = positive(v, "--per-host");
    } else if (a == "--repeat") {
      o.repeat = positive(v, "--repeat");
    } else {
      usage("unknown option " + a);
    }
  }
  if (o.host.empty()) usage("--store is required");
  return o;
}

// What rank r publishes: an address of its own (the port and pid name it) on host r / per_host.
tr::PeerInfo entry_of(int rank, int per_host) {
  tr::PeerInfo p{};
  p.family = 4;
  p.addr[0] = 127;
  p.addr[3] = 1;
  p.port = static_cast<std::uint16_t>(1024 + rank % 60000);
  p.host_hash = 0x5704e0000000ull + static_cast<std::uint64_t>(rank / per_host);
  p.pid = static_cast<std::uint32_t>(rank);
  return p;
}

struct Run {
  double seconds = 0;
  std::uint64_t queries = 0;
  std::uint64_t max_queries = 0;
  std::uint64_t wrong = 0;
  std::string failure;
};

Run run_once(const Options& o, int n, bool id_only, const std::string& key) {
  std::vector<std::uint64_t> queries(n);
  std::atomic<std::uint64_t> wrong{0};
  std::atomic<bool> failed{false};
  std::string failure;
  std::mutex failure_mu;
  Clock::time_point start;
  std::barrier connected(n, [&]() noexcept { start = Clock::now(); });
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto note = [&](const std::exception& e) {
        failed = true;
        std::lock_guard lock(failure_mu);
        failure = e.what();
      };
      std::optional<tr::TcpStoreClient> store;
      try {
        store.emplace(o.host, o.port, std::chrono::milliseconds(300000));
      } catch (const std::exception& e) {
        note(e);
      }
      connected.arrive_and_wait();
      if (!store || failed) return;
      try {
        const std::uint64_t at_connect = store->requests();
        if (id_only) {
          // The root path: rank 0 sets a UniqueId's text, the others read it.
          if (r == 0)
            store->set(key, std::string(256, 'a'));
          else if (store->get(key).size() != 256)
            ++wrong;
          queries[r] = store->requests() - at_connect;
          return;
        }
        if (r == 0)
          store->set(key + "/secret", std::string(32, 'a'));
        else if (store->get(key + "/secret").size() != 32)
          ++wrong;
        const auto book = tr::store_book(*store, key, r, n);
        const tr::DirectoryFrame frame = tr::frame_from_book(*book, entry_of(r, o.per_host), r, n);
        for (const tr::DirectoryEntry& e : frame.entries) {
          const tr::PeerInfo want = entry_of(e.rank, o.per_host);
          if (e.info.port != want.port || e.info.pid != want.pid ||
              e.info.host_hash != want.host_hash)
            ++wrong;
        }
        if (frame.header.hosts != static_cast<std::uint32_t>((n + o.per_host - 1) / o.per_host))
          ++wrong;
        queries[r] = store->requests() - at_connect;
      } catch (const std::exception& e) {
        note(e);
      }
    });
  for (auto& t : threads) t.join();
  Run run;
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (std::uint64_t q : queries) {
    run.queries += q;
    run.max_queries = std::max(run.max_queries, q);
  }
  run.wrong = wrong;
  run.failure = failure;
  if (failed && run.failure.empty()) run.failure = "a rank failed";
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // A rank holds a socket and its client's event loop (epoll, eventfd, timerfd): raise the
  // open-file limit as far as the hard limit allows, and refuse what it cannot hold.
  if (const rlim_t limit = raise_open_file_limit(); limit != 0)
    for (int n : o.ranks)
      if (limit != RLIM_INFINITY && static_cast<rlim_t>(n) * files_a_rank + 64 > limit)
        usage(std::to_string(n) + " ranks need about " + std::to_string(n * files_a_rank) +
              " open files; the limit is " + std::to_string(limit));
  std::printf("coccl-store-load: TCPStore at %s:%u, %d ranks a host, median of %d runs\n",
              o.host.c_str(), o.port, o.per_host, o.repeat);
  std::printf("%8s %6s %12s %12s %12s %14s %8s\n", "ranks", "path", "queries", "max a rank",
              "median ms", "us per query", "#wrong");
  bool ok = true;
  for (int n : o.ranks)
    for (const bool id_only : {false, true}) {
      std::vector<Run> runs;
      for (int k = 0; k < o.repeat; ++k) {
        const std::string key = "coccl-store-load/" + std::to_string(::getpid()) + "/" +
                                std::to_string(n) + (id_only ? "/id/" : "/table/") +
                                std::to_string(k);
        runs.push_back(run_once(o, n, id_only, key));
        if (!runs.back().failure.empty()) {
          std::fprintf(stderr, "coccl-store-load: %d ranks: %s\n", n, runs.back().failure.c_str());
          return 1;
        }
      }
      std::sort(runs.begin(), runs.end(),
                [](const Run& a, const Run& b) { return a.seconds < b.seconds; });
      const Run& mid = runs[runs.size() / 2];
      std::uint64_t wrong = 0;
      for (const Run& r : runs) wrong += r.wrong;
      ok = ok && wrong == 0;
      std::printf("%8d %6s %12llu %12llu %12.2f %14.3f %8llu\n", n, id_only ? "id" : "table",
                  static_cast<unsigned long long>(mid.queries),
                  static_cast<unsigned long long>(mid.max_queries), mid.seconds * 1e3,
                  mid.seconds * 1e6 / static_cast<double>(mid.queries),
                  static_cast<unsigned long long>(wrong));
      std::fflush(stdout);
    }
  return ok ? 0 : 1;
}
