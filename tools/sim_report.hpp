// coccl-sim's accounting: what each party (a rank, or a bootstrap root) did in a phase, the
// busiest of them, the modelled wall time, and the summary lines and JSON it prints.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim_costs.hpp"
#include "transport/traffic.hpp"

namespace coccl::sim {

/// Every party's counters at one moment: one entry per rank (all of its communicators together),
/// then the roots.
struct Snapshot {
  std::vector<transport::Traffic::Counts> ranks;
  std::vector<std::uint64_t> links;  // per rank: distinct peers linked, all its communicators
  std::vector<transport::Traffic::Counts> roots;
};

/// The network the model assumes (stated on the command line).
struct Network {
  double latency_s = 5e-6;
  double bandwidth_bytes_s = 100e9 / 8;
};

/// The largest value of a per-rank quantity, and the rank that has it.
struct Max {
  std::uint64_t value = 0;
  int rank = -1;
};

/// What forming from a launcher's table (coccl-sim --bootstrap launcher) asked of the launcher,
/// whose daemons are not coccl parties and so are modelled, not run.
struct LauncherStats {
  int fences = 0;                 // job-wide fences (each an allgather over the hosts' daemons)
  std::uint64_t puts = 0;         // values put, by every rank
  std::uint64_t entry_bytes = 0;  // the size of one value
  int hosts = 0;                  // daemons (one a host)
  Max max_reads;                  // values one rank read from its host's daemon
};

/// One phase (or the whole run): counts from two snapshots, and what the process spent.
struct PhaseStats {
  std::string name;
  int ranks = 0;
  std::uint64_t rounds = 0;          // message hops on the critical path (the largest round)
  std::uint64_t virtual_rounds = 0;  // rounds of virtual time the phase took
  Max messages;                      // sent + received, of one rank
  Max bytes;                         // sent + received, of one rank
  Max links;                         // distinct peers linked, of one rank
  Max streams;                       // connections opened (bootstrap included), of one rank
  std::uint64_t root_messages = 0, root_bytes = 0;    // the busiest bootstrap root
  std::uint64_t total_messages = 0, total_bytes = 0;  // sent, by every party
  std::string busiest;  // the party whose load the model charges ("rank R" or "root")
  double peak_rss_bytes_per_rank = 0;
  double cpu_s = 0, wall_s = 0;
  double model_s = 0;
  std::string check;                      // what was verified in this phase ("" for nothing)
  std::optional<LauncherStats> launcher;  // init formed from a launcher's table
};

/// The launcher's part of a phase's modelled time: each fence climbs and descends a binary tree
/// of the hosts' daemons (2 ceil(log2 hosts) x (latency + m)), the values put cross the tree's
/// root twice (in and out, at the bandwidth) and are copied once (b a byte), and the busiest
/// rank's reads are a round trip each to its host's daemon (2m).
double launcher_s(const LauncherStats& l, const Costs& costs, const Network& net);
/// What launcher_s assumes, for the model's line.
std::string launcher_model_text();

/// The counts of a phase from the snapshots at its start and end (rounds are the end's: each
/// phase starts them from 0), with the modelled time.
PhaseStats phase_stats(const std::string& name, const Snapshot& before, const Snapshot& after,
                       const Costs& costs, const Network& net);

/// The whole run: counts from the first to the last snapshot, the rounds, model, CPU and wall
/// time summed over `phases` and the largest peak memory of any.
PhaseStats overall(const std::vector<PhaseStats>& phases, const Snapshot& first,
                   const Snapshot& last);

/// One summary line.
std::string line(const PhaseStats& s);
/// How the modelled time is computed, with the costs and the network it assumed.
std::string model_text(const Costs& costs, const std::string& costs_origin, const Network& net);

/// The run as JSON.
std::string json(int ranks, std::size_t count, const std::string& split, bool verified,
                 const std::vector<PhaseStats>& phases, const PhaseStats& all, const Costs& costs,
                 const std::string& costs_origin, const Network& net);

}  // namespace coccl::sim
