// coccl-status: asks a running job what each rank is doing, and names the stuck rank and
// operation. It reads the address table from the job's bootstrap root, then asks every rank's
// listener (authenticated with the job's secret) for its status, all within --wait.
//
//   coccl-status [--wait SECONDS] [--json] [--trace] ID
//     ID: the communicator's UniqueId text (UniqueId::to_string), "-" to read it from stdin, or
//         "env" for a job launched with COCCL_COMM_ID=host:port and COCCL_SECRET.
// Exit status: 0 every rank answered and none has failed; 1 some rank did not answer or has
// failed; 2 bad arguments or no answer from the root.
#include <coccl/coccl.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "coccl-status: %s\n"
               "usage: coccl-status [--wait SECONDS] [--json] [--trace] ID\n"
               "  ID: the UniqueId text, '-' to read it from stdin, or 'env' (COCCL_COMM_ID and\n"
               "      COCCL_SECRET, as the job's from_env() got them)\n",
               why);
  std::exit(2);
}

// A from_env() job started with COCCL_COMM_ID=host:port: the root listens there, with the secret
// the job was given.
coccl::UniqueId id_from_env() {
  const char* where = std::getenv("COCCL_COMM_ID");
  const char* secret = std::getenv("COCCL_SECRET");
  if (!where || !secret) usage("'env' needs COCCL_COMM_ID and COCCL_SECRET");
  return coccl::UniqueId::from_address(where, secret);
}

std::string seconds(std::uint64_t us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(us) / 1e6);
  return buf;
}

void print_rank(int r, const coccl::JobStatus& job, bool trace) {
  const auto& s = job.ranks[r];
  if (!s) {
    std::printf("rank %-4d %s\n", r, job.why[r].c_str());
    return;
  }
  std::string what;
  if (!s->error.empty())
    what = "FAILED: " + s->error;
  else if (s->started > s->finished)
    what = s->running_op + " #" + std::to_string(s->started) + " running " +
           seconds(s->running_us) +
           (s->waiting_for >= 0 ? ", waiting for rank " + std::to_string(s->waiting_for) + " for " +
                                      seconds(s->waiting_us)
                                : std::string(", not waiting"));
  else
    what = "idle";
  std::printf("rank %-4d pid %-8d last finished #%-6llu %s%s\n", r, s->pid,
              static_cast<unsigned long long>(s->finished), what.c_str(),
              s->queued ? (" (" + std::to_string(s->queued) + " queued)").c_str() : "");
  if (!trace) return;
  for (const auto& e : s->trace)
    std::printf("    %s %-14s #%-6llu count %-10llu %-8s %s\n", e.device ? "device" : "host  ",
                e.op.c_str(), static_cast<unsigned long long>(e.seq),
                static_cast<unsigned long long>(e.count), coccl::to_string(e.state),
                seconds(e.us).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  double wait_s = 1.0;
  bool json = false, trace = false;
  std::string id_text;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--wait" && i + 1 < argc) {
      char* end = nullptr;
      wait_s = std::strtod(argv[++i], &end);
      if (!end || *end || !(wait_s > 0) || wait_s > 3600)
        usage("--wait takes seconds in (0, 3600]");
    } else if (a == "--json") {
      json = true;
    } else if (a == "--trace") {
      trace = true;
    } else if (a == "-h" || a == "--help") {
      usage("help");
    } else if (id_text.empty() && (a.empty() || a[0] != '-' || a == "-")) {
      id_text = a;
    } else {
      usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (id_text.empty()) usage("no ID given");
  try {
    coccl::UniqueId id;
    if (id_text == "env") {
      id = id_from_env();
    } else {
      if (id_text == "-" && !(std::cin >> id_text)) usage("no ID on stdin");
      id = coccl::UniqueId::from_string(id_text);
    }
    const auto wait = std::chrono::milliseconds(static_cast<long long>(wait_s * 1000));
    const coccl::JobStatus job = coccl::query_job(id, wait);
    bool healthy = job.arrived == job.nranks && job.nranks > 0;
    for (const auto& s : job.ranks) healthy = healthy && s && s->error.empty();
    if (json) {
      std::printf("{\"nranks\":%d,\"arrived\":%d,\"ranks\":[", job.nranks, job.arrived);
      for (int r = 0; r < job.nranks; ++r)
        std::printf("%s%s", r ? "," : "", job.ranks[r] ? job.ranks[r]->json().c_str() : "null");
      std::printf("]}\n");
    } else {
      std::printf("coccl-status: %d ranks, %d reached the root\n", job.nranks, job.arrived);
      for (int r = 0; r < job.nranks; ++r) print_rank(r, job, trace);
    }
    std::printf("verdict: %s\n", job.verdict().c_str());
    return healthy ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coccl-status: %s\n", e.what());
    return 2;
  }
}
