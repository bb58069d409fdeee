// What coccl-init-bench and its baseline peers (coccl-perf-mpi --init, coccl-perf-gloo --init)
// share: the start gate and the result file of one timed init.
//
// Every process of a run writes DIR/ready.RANK and then blocks opening the FIFO DIR/go, which the
// driver opens for writing once all of them are ready: they all wake at once, having spent no CPU
// while the launcher started the rest (polling processes would slow a launcher on few cores), and
// no library is charged for how fast its launcher starts processes. A
// process then takes t0 (CLOCK_REALTIME, comparable between the processes of one machine), makes
// its communicator, runs a first all_reduce of one element, checks it, takes t1 and writes
// DIR/result.RANK as "t0_us t1_us ok". The run's time is max(t1) - min(t0).
//
// Header-only and free of any collective library, like baseline_common.hpp.
#pragma once

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace coccl_init_gate {

/// Microseconds of CLOCK_REALTIME.
inline double now_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

/// Writes `text` to `path` whole: a temporary name, then rename, so readers never see a part.
inline void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("cannot write " + tmp);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp);
}

/// Says this rank is ready, then waits for the driver's go: opening the FIFO DIR/go for reading
/// returns once the driver opens it for writing.
inline void wait_for_go(const std::string& dir, int rank) {
  write_file(dir + "/ready." + std::to_string(rank), "ready\n");
  const int fd = ::open((dir + "/go").c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open the go FIFO in " + dir);
  ::close(fd);
}

inline void write_result(const std::string& dir, int rank, double t0, double t1, bool ok) {
  char line[128];
  std::snprintf(line, sizeof line, "%.3f %.3f %d\n", t0, t1, ok ? 1 : 0);
  write_file(dir + "/result." + std::to_string(rank), line);
}

}  // namespace coccl_init_gate
