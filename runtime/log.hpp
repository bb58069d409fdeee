// Logging: levels, subsystems, and a host:pid:rank prefix on every line.
//
// COCCL_DEBUG=WARN|INFO|TRACE (alias NCCL_DEBUG) sets the level (default: warnings only);
// COCCL_DEBUG_SUBSYS=INIT,NET,... or ^INIT (alias NCCL_DEBUG_SUBSYS) filters subsystems;
// COCCL_DEBUG_FILE=path (alias NCCL_DEBUG_FILE), where %h expands to the host name and %p to the
// process id, sends the log to a file instead of stderr. Lines are written whole, so lines of
// different threads never interleave.
#pragma once

namespace coccl::log {

enum class Level : int { none = 0, warn = 1, info = 2, trace = 3 };

enum class Subsys : unsigned {
  init = 1u << 0,
  boot = 1u << 1,
  net = 1u << 2,
  shm = 1u << 3,
  p2p = 1u << 4,
  coll = 1u << 5,
  proxy = 1u << 6,
  ib = 1u << 7,
  env = 1u << 8,
  alloc = 1u << 9,
};

/// True if a message of this level and subsystem would be written.
bool enabled(Level level, Subsys subsys) noexcept;

/// Writes one printf-formatted line; `rank` < 0 prints no rank.
void write(Level level, Subsys subsys, int rank, const char* fmt, ...) noexcept
    __attribute__((format(printf, 4, 5)));

/// Re-reads the environment (tests change it between cases).
void reload() noexcept;

}  // namespace coccl::log

#define COCCL_LOG(level, subsys, rank, ...)                                               \
  do {                                                                                    \
    if (::coccl::log::enabled(::coccl::log::Level::level, ::coccl::log::Subsys::subsys))  \
      ::coccl::log::write(::coccl::log::Level::level, ::coccl::log::Subsys::subsys, rank, \
                          __VA_ARGS__);                                                   \
  } while (0)
#define COCCL_WARN(subsys, rank, ...) COCCL_LOG(warn, subsys, rank, __VA_ARGS__)
#define COCCL_INFO(subsys, rank, ...) COCCL_LOG(info, subsys, rank, __VA_ARGS__)
#define COCCL_TRACE(subsys, rank, ...) COCCL_LOG(trace, subsys, rank, __VA_ARGS__)
