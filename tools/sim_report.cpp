#include "sim_report.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>

namespace coccl::sim {

namespace {

using Counts = transport::Traffic::Counts;

// What a party did between two snapshots.
struct Delta {
  std::uint64_t sent = 0, received = 0, bytes_out = 0, bytes_in = 0, streams = 0;
  std::uint64_t messages() const { return sent + received; }
  std::uint64_t bytes() const { return bytes_out + bytes_in; }
};

Delta delta(const Counts& a, const Counts& b) {
  return {b.messages_sent - a.messages_sent, b.messages_received - a.messages_received,
          b.bytes_sent - a.bytes_sent, b.bytes_received - a.bytes_received, b.streams - a.streams};
}

// The time a party spends on its own messages, bytes and connections. Each cost was measured
// with both ends on this machine: a party pays half of it for each message, byte and connection
// at its end, and its bytes cross its link at the stated bandwidth.
double load_s(const Delta& d, const Costs& c, const Network& net) {
  return static_cast<double>(d.messages()) * c.message_s / 2 +
         static_cast<double>(d.bytes()) * c.byte_s / 2 +
         static_cast<double>(std::max(d.bytes_out, d.bytes_in)) / net.bandwidth_bytes_s +
         static_cast<double>(d.streams) * c.connect_s / 2;
}

void raise(Max& m, std::uint64_t v, int rank) {
  if (m.rank < 0 || v > m.value) m = {v, rank};
}

// Everything but the rounds, the model and the process's figures.
PhaseStats counts(const std::string& name, const Snapshot& before, const Snapshot& after,
                  const Costs& costs, const Network& net, double& busiest_s) {
  PhaseStats s;
  s.name = name;
  s.ranks = static_cast<int>(after.ranks.size());
  busiest_s = -1;
  for (int r = 0; r < s.ranks; ++r) {
    const Delta d = delta(before.ranks[r], after.ranks[r]);
    raise(s.messages, d.messages(), r);
    raise(s.bytes, d.bytes(), r);
    raise(s.links, after.links[r] - before.links[r], r);
    raise(s.streams, d.streams, r);
    s.total_messages += d.sent;
    s.total_bytes += d.bytes_out;
    const double t = load_s(d, costs, net);
    if (t > busiest_s) {
      busiest_s = t;
      s.busiest = "rank " + std::to_string(r);
    }
  }
  for (std::size_t i = 0; i < after.roots.size(); ++i) {
    const Delta d = delta(before.roots[i], after.roots[i]);
    if (d.messages() > s.root_messages) {
      s.root_messages = d.messages();
      s.root_bytes = d.bytes();
    }
    s.total_messages += d.sent;
    s.total_bytes += d.bytes_out;
    const double t = load_s(d, costs, net);
    if (t > busiest_s) {
      busiest_s = t;
      s.busiest = "root";
    }
  }
  return s;
}

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string time_text(double s) {
  char buf[32];
  if (s < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (s < 1)
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string max_json(const Max& m) {
  return "{\"value\": " + std::to_string(m.value) + ", \"rank\": " + std::to_string(m.rank) + "}";
}

std::string stats_json(const PhaseStats& s) {
  std::string j = "{\"name\": " + quoted(s.name);
  j += ", \"ranks\": " + std::to_string(s.ranks);
  j += ", \"rounds\": " + std::to_string(s.rounds);
  j += ", \"virtual_rounds\": " + std::to_string(s.virtual_rounds);
  j += ", \"max_messages\": " + max_json(s.messages);
  j += ", \"max_bytes\": " + max_json(s.bytes);
  j += ", \"max_links\": " + max_json(s.links);
  j += ", \"max_streams\": " + max_json(s.streams);
  j += ", \"root_messages\": " + std::to_string(s.root_messages);
  j += ", \"root_bytes\": " + std::to_string(s.root_bytes);
  j += ", \"total_messages\": " + std::to_string(s.total_messages);
  j += ", \"total_bytes\": " + std::to_string(s.total_bytes);
  j += ", \"busiest\": " + quoted(s.busiest);
  j += ", \"peak_rss_bytes_per_rank\": " + number(s.peak_rss_bytes_per_rank);
  j += ", \"cpu_s\": " + number(s.cpu_s);
  j += ", \"wall_s\": " + number(s.wall_s);
  j += ", \"model_s\": " + number(s.model_s);
  j += ", \"verified\": " + quoted(s.check);
  if (s.launcher) {
    j += ", \"launcher\": {\"fences\": " + std::to_string(s.launcher->fences);
    j += ", \"hosts\": " + std::to_string(s.launcher->hosts);
    j += ", \"puts\": " + std::to_string(s.launcher->puts);
    j += ", \"entry_bytes\": " + std::to_string(s.launcher->entry_bytes);
    j += ", \"max_reads\": " + max_json(s.launcher->max_reads) + "}";
  }
  return j + "}";
}

}  // namespace

PhaseStats phase_stats(const std::string& name, const Snapshot& before, const Snapshot& after,
                       const Costs& costs, const Network& net) {
  double busiest_s = 0;
  PhaseStats s = counts(name, before, after, costs, net, busiest_s);
  for (const Counts& c : after.ranks) s.rounds = std::max(s.rounds, c.round);
  for (const Counts& c : after.roots) s.rounds = std::max(s.rounds, c.round);
  s.model_s =
      static_cast<double>(s.rounds) * (net.latency_s + costs.message_s) + std::max(0.0, busiest_s);
  return s;
}

PhaseStats overall(const std::vector<PhaseStats>& phases, const Snapshot& first,
                   const Snapshot& last) {
  double ignored = 0;
  PhaseStats s = counts("total", first, last, Costs{}, Network{}, ignored);
  s.busiest.clear();
  for (const PhaseStats& p : phases) {
    s.rounds += p.rounds;
    s.virtual_rounds += p.virtual_rounds;
    s.model_s += p.model_s;
    s.cpu_s += p.cpu_s;
    s.wall_s += p.wall_s;
    s.peak_rss_bytes_per_rank = std::max(s.peak_rss_bytes_per_rank, p.peak_rss_bytes_per_rank);
  }
  return s;
}

double launcher_s(const LauncherStats& l, const Costs& costs, const Network& net) {
  const int levels = l.hosts <= 1 ? 0 : std::bit_width(static_cast<unsigned>(l.hosts - 1));
  const double table = static_cast<double>(l.puts * l.entry_bytes);
  return l.fences * 2.0 * levels * (net.latency_s + costs.message_s) +
         table * (2 / net.bandwidth_bytes_s + costs.byte_s) +
         static_cast<double>(l.max_reads.value) * 2 * costs.message_s;
}

std::string launcher_model_text() {
  return "Launcher (--bootstrap launcher), added to init: each fence 2 ceil(log2 hosts) x "
         "(latency + m) (a binary tree of the hosts' daemons, up and down), the values put x "
         "(2 / bandwidth + b) (into and out of the tree's root, one copy), the busiest rank's "
         "reads x 2m (a round trip to its host's daemon). Left out: the launcher's own start-up.";
}

std::string line(const PhaseStats& s) {
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "%-16s ranks %d | rounds %llu | max msgs %llu (rank %d) | max bytes %s (rank %d) | max "
      "links %llu (rank %d) | max conns %llu | root %llu msgs %s | peak mem %s/rank | cpu %.2f s "
      "| wall %.2f s | modelled %s%s%s",
      s.name.c_str(), s.ranks, static_cast<unsigned long long>(s.rounds),
      static_cast<unsigned long long>(s.messages.value), s.messages.rank,
      bytes_text(static_cast<double>(s.bytes.value)).c_str(), s.bytes.rank,
      static_cast<unsigned long long>(s.links.value), s.links.rank,
      static_cast<unsigned long long>(s.streams.value),
      static_cast<unsigned long long>(s.root_messages),
      bytes_text(static_cast<double>(s.root_bytes)).c_str(),
      bytes_text(s.peak_rss_bytes_per_rank).c_str(), s.cpu_s, s.wall_s,
      time_text(s.model_s).c_str(), s.check.empty() ? "" : " | verified ", s.check.c_str());
  std::string text = buf;
  if (s.launcher) {
    std::snprintf(
        buf, sizeof buf,
        " | launcher: %d fences over %d hosts, %llu values put, max reads %llu (rank %d)",
        s.launcher->fences, s.launcher->hosts, static_cast<unsigned long long>(s.launcher->puts),
        static_cast<unsigned long long>(s.launcher->max_reads.value), s.launcher->max_reads.rank);
    text += buf;
  }
  return text;
}

std::string model_text(const Costs& costs, const std::string& costs_origin, const Network& net) {
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "model: per phase, rounds x (latency + m) + the busiest party's (messages x m/2 + bytes x "
      "b/2 + max(bytes out, bytes in) / bandwidth + connections x k/2), summed over phases (an "
      "upper bound: the critical path and the busiest party's work are added, not overlapped). "
      "Costs %s: m = %.2f us (half a 64-byte round trip), b = %.3f ns/byte (bulk transfer, both "
      "copies), k = %.1f us (connect, accept, close). Network stated: latency %.2f us, bandwidth "
      "%.1f Gb/s. Left out: process launch, CUDA context and GPU memory registration, tcp's own "
      "handshake round trip per connection, ranks sharing a host's NIC and cores.",
      costs_origin.c_str(), costs.message_s * 1e6, costs.byte_s * 1e9, costs.connect_s * 1e6,
      net.latency_s * 1e6, net.bandwidth_bytes_s * 8 / 1e9);
  return buf;
}

std::string json(int ranks, std::size_t count, const std::string& split, bool verified,
                 const std::vector<PhaseStats>& phases, const PhaseStats& all, const Costs& costs,
                 const std::string& costs_origin, const Network& net) {
  std::string j = "{\"ranks\": " + std::to_string(ranks);
  j += ", \"count\": " + std::to_string(count);
  j += ", \"split\": " + quoted(split);
  j += ", \"verified\": " + std::string(verified ? "true" : "false");
  j += ", \"phases\": [";
  for (std::size_t i = 0; i < phases.size(); ++i) j += (i ? ", " : "") + stats_json(phases[i]);
  j += "], \"total\": " + stats_json(all);
  j += ", \"model\": {\"costs_origin\": " + quoted(costs_origin);
  j += ", \"message_s\": " + number(costs.message_s);
  j += ", \"byte_s\": " + number(costs.byte_s);
  j += ", \"connect_s\": " + number(costs.connect_s);
  j += ", \"latency_s\": " + number(net.latency_s);
  j += ", \"bandwidth_bytes_s\": " + number(net.bandwidth_bytes_s) + "}";
  return j + "}\n";
}

}  // namespace coccl::sim
