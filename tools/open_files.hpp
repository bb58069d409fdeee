// The open-file limit of the tools that run many ranks, each holding sockets.
#pragma once

#include <sys/resource.h>

/// Raises the soft open-file limit as far as the hard limit allows. Returns the limit then in
/// force (RLIM_INFINITY when there is none), or 0 when it cannot be read.
inline rlim_t raise_open_file_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  return lim.rlim_cur;
}
