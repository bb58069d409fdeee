#include "runtime/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace coccl::log {
namespace {

struct State {
  std::atomic<int> level{static_cast<int>(Level::warn)};
  std::atomic<unsigned> mask{~0u};
  std::mutex mutex;
  FILE* out = stderr;
  std::string host;
};

State& state() {
  static State s;
  return s;
}

const char* env2(const char* a, const char* b) {
  const char* v = std::getenv(a);
  return v ? v : std::getenv(b);
}

unsigned subsys_bit(std::string name) {
  for (auto& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (name == "INIT") return static_cast<unsigned>(Subsys::init);
  if (name == "BOOT" || name == "BOOTSTRAP") return static_cast<unsigned>(Subsys::boot);
  if (name == "NET") return static_cast<unsigned>(Subsys::net);
  if (name == "SHM") return static_cast<unsigned>(Subsys::shm);
  if (name == "P2P") return static_cast<unsigned>(Subsys::p2p);
  if (name == "COLL") return static_cast<unsigned>(Subsys::coll);
  if (name == "PROXY") return static_cast<unsigned>(Subsys::proxy);
  if (name == "IB") return static_cast<unsigned>(Subsys::ib);
  if (name == "ENV") return static_cast<unsigned>(Subsys::env);
  if (name == "ALLOC") return static_cast<unsigned>(Subsys::alloc);
  if (name == "ALL") return ~0u;
  return 0;
}

std::string expand_path(const char* pattern, const std::string& host) {
  std::string out;
  for (const char* p = pattern; *p; ++p) {
    if (p[0] == '%' && p[1] == 'h') {
      out += host;
      ++p;
    } else if (p[0] == '%' && p[1] == 'p') {
      out += std::to_string(::getpid());
      ++p;
    } else {
      out += *p;
    }
  }
  return out;
}

void configure(State& s) {
  char hostbuf[256] = {};
  ::gethostname(hostbuf, sizeof hostbuf - 1);
  s.host = hostbuf;
  Level level = Level::warn;
  if (const char* d = env2("COCCL_DEBUG", "NCCL_DEBUG")) {
    std::string v(d);
    for (auto& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (v == "NONE")
      level = Level::none;
    else if (v == "WARN" || v == "VERSION")
      level = Level::warn;
    else if (v == "INFO")
      level = Level::info;
    else if (v == "TRACE")
      level = Level::trace;
  }
  unsigned mask = ~0u;
  if (const char* sub = env2("COCCL_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS")) {
    std::string v(sub);
    bool invert = !v.empty() && v[0] == '^';
    if (invert) v.erase(0, 1);
    unsigned bits = 0;
    std::size_t start = 0;
    while (start <= v.size()) {
      std::size_t comma = v.find(',', start);
      if (comma == std::string::npos) comma = v.size();
      bits |= subsys_bit(v.substr(start, comma - start));
      start = comma + 1;
    }
    mask = invert ? ~bits : bits;
  }
  if (s.out != stderr && s.out != nullptr) std::fclose(s.out);
  s.out = stderr;
  if (const char* f = env2("COCCL_DEBUG_FILE", "NCCL_DEBUG_FILE")) {
    std::string path = expand_path(f, s.host);
    if (FILE* fp = std::fopen(path.c_str(), "a")) {
      s.out = fp;
    } else {
      std::fprintf(stderr, "%s:%d coccl WARN cannot open COCCL_DEBUG_FILE %s: %s\n", s.host.c_str(),
                   ::getpid(), path.c_str(), std::strerror(errno));
    }
  }
  s.level.store(static_cast<int>(level), std::memory_order_relaxed);
  s.mask.store(mask, std::memory_order_relaxed);
}

std::once_flag configured;

State& configured_state() {
  State& s = state();
  std::call_once(configured, [&] {
    std::lock_guard lock(s.mutex);
    configure(s);
  });
  return s;
}

}  // namespace

bool enabled(Level level, Subsys subsys) noexcept {
  State& s = configured_state();
  return static_cast<int>(level) <= s.level.load(std::memory_order_relaxed) &&
         (s.mask.load(std::memory_order_relaxed) & static_cast<unsigned>(subsys)) != 0;
}

void write(Level level, Subsys, int rank, const char* fmt, ...) noexcept {
  State& s = configured_state();
  char body[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  const char* tag = level == Level::warn ? "WARN" : level == Level::info ? "INFO" : "TRACE";
  std::lock_guard lock(s.mutex);
  if (rank >= 0)
    std::fprintf(s.out, "%s:%d:%d [coccl] %s %s\n", s.host.c_str(), ::getpid(), rank, tag, body);
  else
    std::fprintf(s.out, "%s:%d [coccl] %s %s\n", s.host.c_str(), ::getpid(), tag, body);
  std::fflush(s.out);
}

void reload() noexcept {
  State& s = configured_state();
  std::lock_guard lock(s.mutex);
  configure(s);
}

}  // namespace coccl::log
