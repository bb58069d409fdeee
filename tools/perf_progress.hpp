// coccl-perf's progress line: how far a long sweep has got (collective and size), on stderr and
// only when stderr is a terminal, so piped or redirected output stays nccl-tests' table.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace perf {

inline bool progress_shown() {
  static const bool tty = ::isatty(STDERR_FILENO) == 1;
  return tty;
}

/// Rewrites the progress line, e.g. "coccl-perf: allreduce 1048576 B".
inline void progress(const std::string& what) {
  if (!progress_shown()) return;
  std::fprintf(stderr, "\r\033[Kcoccl-perf: %s", what.c_str());
  std::fflush(stderr);
}

/// Clears the progress line.
inline void progress_done() {
  if (progress_shown()) std::fputs("\r\033[K", stderr);
}

}  // namespace perf
