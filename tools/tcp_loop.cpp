// coccl-tcp-loop: the physical reference for tcp on this machine. Two processes (a fork) connected
// over loopback tcp: a one-way stream of `size`-byte sends (one socket per stream, or several
// streams at once), and an 8-byte ping-pong. No coccl code: what the kernel's copies allow, for
// comparison with coccl's tcp links. The sends are send(2) (--send copy), or io_uring SEND_ZC
// from the buffer (--send zc) or from the ring's registration of it (--send zc-fixed: pinned
// once, not per send); a zero-copy sender keeps up to 8 sends' notifications outstanding.
//
//   coccl-tcp-loop [--sizes 1M,16M,256M] [--streams N] [--seconds S] [--send copy|zc|zc-fixed]
//
// Prints one line per size: GB/s moved from sender to receiver (median of 5 timed batches), and
// the ping-pong's one-way latency in microseconds.
//
//   coccl-tcp-loop --exchange N [--sizes 1M,16M,256M] [--seconds S]
//
// The floor of an all_reduce over tcp: N processes in a ring, each sending to the next and
// receiving from the one before at once, as many bytes per operation as a bandwidth-optimal
// all_reduce of `size` bytes must send and receive per rank, 2(N-1)/N * size. One thread a
// process, non-blocking sends and receives of as much as the kernel takes, poll(2) when neither
// moves. Prints per size the time of an exchange and the busbw (nccl-tests' definition) that an
// all_reduce taking exactly that time would have. An all_reduce over the same sockets should not
// beat it by more than the noise: it moves the least data an all_reduce must move, in one round,
// and reduces nothing. The first batch's data is checked.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#if COCCL_HAVE_URING
#include <liburing.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      break;
    case 'M':
    case 'm':
      v *= 1024 * 1024;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      break;
    default:
      break;
  }
  return static_cast<std::size_t>(v);
}

void send_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) die("send");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void recv_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) die("recv");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

int listen_any(int& port) {
  int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("bind");
  if (::listen(l, 64) != 0) die("listen");
  socklen_t len = sizeof a;
  ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return l;
}

int dial(int port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect");
  int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

enum class SendMode { copy, zc, zc_fixed };

#if COCCL_HAVE_URING
// A zero-copy sender's ring, made once per stream before the timed batches; with zc-fixed the
// stream's buffer is registered with it then, as a library registers a buffer once.
class ZcRing {
 public:
  ZcRing(char* buf, std::size_t n, bool fixed) : fixed_(fixed) {
    if (int e = io_uring_queue_init(16, &ring_, 0); e < 0) fail(e, "io_uring_queue_init");
    if (fixed) {
      iovec iov{buf, n};
      if (int e = io_uring_register_buffers(&ring_, &iov, 1); e < 0)
        fail(e, "io_uring_register_buffers");
    }
  }
  ~ZcRing() { io_uring_queue_exit(&ring_); }
  ZcRing(const ZcRing&) = delete;
  ZcRing& operator=(const ZcRing&) = delete;

  // `bytes` in `size`-byte SEND_ZCs of p on fd, one send in flight, at most `depth`
  // notifications outstanding (the buffer is never written, so it need not wait for them
  // sooner); all are reaped before it returns.
  void send(int fd, const char* p, std::size_t size, std::size_t bytes) {
    constexpr unsigned depth = 8;
    for (std::size_t done = 0; done < bytes; done += size) {
      io_uring_sqe* q = io_uring_get_sqe(&ring_);
      if (fixed_)
        io_uring_prep_send_zc_fixed(q, fd, p, size, MSG_WAITALL | MSG_NOSIGNAL, 0, 0);
      else
        io_uring_prep_send_zc(q, fd, p, size, MSG_WAITALL | MSG_NOSIGNAL, 0);
      io_uring_submit(&ring_);
      reap(true, size);
      while (notes_ >= depth) reap(false, size);
    }
    while (notes_ > 0) reap(false, size);
  }

 private:
  [[noreturn]] static void fail(int e, const char* what) {
    errno = -e;
    die(what);
  }
  // Until the send's completion (for_send), or one notification.
  void reap(bool for_send, std::size_t size) {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      if (int e = io_uring_wait_cqe(&ring_, &cqe); e < 0) fail(e, "io_uring_wait_cqe");
      const unsigned flags = cqe->flags;
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (flags & IORING_CQE_F_NOTIF) {
        --notes_;
        if (!for_send) return;
        continue;
      }
      if (res != static_cast<int>(size)) fail(res < 0 ? res : -EIO, "SEND_ZC");
      if (flags & IORING_CQE_F_MORE) ++notes_;
      if (for_send) return;
    }
  }

  io_uring ring_{};
  bool fixed_;
  unsigned notes_ = 0;  // notifications still to come
};
#else
class ZcRing {
 public:
  void send(int, const char*, std::size_t, std::size_t) {}
};
#endif

// Each stream moves `bytes` in `size`-byte sends from or into its own buffer; the receiver answers
// one byte per stream when all arrived, so a batch's time covers delivery, not just the hand-off
// to the kernel. `zc[s]`: stream s's zero-copy ring, null for send(2).
void run_batch(const std::vector<int>& fds, bool sender, std::size_t size, std::size_t bytes,
               std::vector<std::vector<char>>& bufs,
               const std::vector<std::unique_ptr<ZcRing>>& zc) {
  std::vector<std::thread> threads;
  for (std::size_t s = 0; s < fds.size(); ++s)
    threads.emplace_back([&, s] {
      const int fd = fds[s];
      char* p = bufs[s].data();
      char ack = 0;
      if (sender && zc[s])
        zc[s]->send(fd, p, size, bytes);
      else
        for (std::size_t done = 0; done < bytes; done += size) {
          if (sender)
            send_all(fd, p, size);
          else
            recv_all(fd, p, size);
        }
      if (sender)
        recv_all(fd, &ack, 1);
      else
        send_all(fd, &ack, 1);
    });
  for (auto& t : threads) t.join();
}

// One exchange: `bytes` from `out` to the next process while as many arrive from the previous
// into `in`.
void exchange_once(int next, int prev, const char* out, char* in, std::size_t bytes) {
  std::size_t sent = 0;
  std::size_t got = 0;
  while (sent < bytes || got < bytes) {
    bool moved = false;
    if (sent < bytes) {
      ssize_t k = ::send(next, out + sent, bytes - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) {
        sent += static_cast<std::size_t>(k);
        moved = true;
      } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        die("send");
      }
    }
    if (got < bytes) {
      ssize_t k = ::recv(prev, in + got, bytes - got, MSG_DONTWAIT);
      if (k > 0) {
        got += static_cast<std::size_t>(k);
        moved = true;
      } else if (k == 0) {
        std::fprintf(stderr, "coccl-tcp-loop: the previous process closed its socket\n");
        std::exit(1);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        die("recv");
      }
    }
    if (!moved) {
      pollfd p[2] = {{next, static_cast<short>(sent < bytes ? POLLOUT : 0), 0},
                     {prev, static_cast<short>(got < bytes ? POLLIN : 0), 0}};
      if (::poll(p, 2, -1) < 0 && errno != EINTR) die("poll");
    }
  }
}

// What each of n ranks sends and receives in a bandwidth-optimal all_reduce of `size` bytes.
std::size_t exchange_bytes(std::size_t size, int n) {
  return size * 2 * static_cast<std::size_t>(n - 1) / static_cast<std::size_t>(n);
}

// The middle of a batch's figures.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The byte at offset i of what process `from` sends in operation `op`.
char pattern(int from, std::size_t op, std::size_t i) {
  return static_cast<char>((static_cast<std::size_t>(from) * 131 + op * 7 + i * 13) & 0xff);
}

int run_exchange(int n, const std::vector<std::size_t>& sizes, double seconds) {
  std::vector<int> listeners(static_cast<std::size_t>(n));
  std::vector<int> ports(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    listeners[static_cast<std::size_t>(r)] = listen_any(ports[static_cast<std::size_t>(r)]);
  int rank = 0;
  std::vector<pid_t> children;
  for (int r = 1; r < n; ++r) {
    pid_t c = ::fork();
    if (c < 0) die("fork");
    if (c == 0) {
      rank = r;
      children.clear();
      break;
    }
    children.push_back(c);
  }
  const int next = dial(ports[static_cast<std::size_t>((rank + 1) % n)]);
  const int prev = ::accept(listeners[static_cast<std::size_t>(rank)], nullptr, nullptr);
  if (prev < 0) die("accept");
  for (int l : listeners) ::close(l);
  const int prev_from = (rank + n - 1) % n;
  std::size_t max_bytes = 0;
  for (std::size_t size : sizes) max_bytes = std::max(max_bytes, exchange_bytes(size, n));
  std::vector<char> out(max_bytes);
  std::vector<char> in(max_bytes);
  int status = 0;
  for (std::size_t size : sizes) {
    // Not 0: main() refuses a size that moves nothing.
    const std::size_t bytes = exchange_bytes(size, n);
    // Every process computes the same count, so the ring stays in step.
    const std::size_t ops =
        std::max<std::size_t>(1, static_cast<std::size_t>(seconds / 5 * 1e9) / bytes);
    std::vector<double> times;
    for (int batch = 0; batch < 6; ++batch) {
      const bool check = batch == 0;
      auto t0 = Clock::now();
      for (std::size_t op = 0; op < ops; ++op) {
        if (check)
          for (std::size_t i = 0; i < bytes; ++i) out[i] = pattern(rank, op, i);
        exchange_once(next, prev, out.data(), in.data(), bytes);
        if (check)
          for (std::size_t i = 0; i < bytes; ++i)
            if (in[i] != pattern(prev_from, op, i)) {
              std::fprintf(
                  stderr, "coccl-tcp-loop: rank %d received a wrong byte at %zu of operation %zu\n",
                  rank, i, op);
              status = 1;
              break;
            }
      }
      if (!check)
        times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                        static_cast<double>(ops));
    }
    const double us = median(times);
    if (rank == 0)
      std::printf(
          "exchange %d ranks, all_reduce of %zu B: %zu B each way per rank in %.2f us, busbw floor "
          "%.3f GB/s (median of %zu batches)\n",
          n, size, bytes, us, static_cast<double>(bytes) / us / 1e3, times.size());
  }
  ::close(next);
  ::close(prev);
  for (pid_t c : children) {
    int s = 0;
    if (::waitpid(c, &s, 0) < 0 || !WIFEXITED(s) || WEXITSTATUS(s) != 0) status = 1;
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes{1 << 20, 16 << 20, 256 << 20};
  int streams = 1;
  double seconds = 0.5;
  SendMode mode = SendMode::copy;
  int exchange = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::string list = argv[++i];
      for (std::size_t at = 0; at <= list.size();) {
        std::size_t comma = std::min(list.find(',', at), list.size());
        sizes.push_back(parse_size(list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else if (a == "--streams" && i + 1 < argc) {
      streams = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--exchange" && i + 1 < argc) {
      exchange = std::atoi(argv[++i]);
      if (exchange < 2) {
        std::fprintf(stderr, "coccl-tcp-loop: --exchange needs 2 or more processes, not %s\n",
                     argv[i]);
        return 2;
      }
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--send" && i + 1 < argc) {
      const std::string m = argv[++i];
      if (m == "copy") {
        mode = SendMode::copy;
      } else if (m == "zc" || m == "zc-fixed") {
#if COCCL_HAVE_URING
        mode = m == "zc" ? SendMode::zc : SendMode::zc_fixed;
#else
        std::fprintf(stderr, "coccl-tcp-loop: --send %s needs io_uring (built without liburing)\n",
                     m.c_str());
        return 2;
#endif
      } else {
        std::fprintf(stderr, "coccl-tcp-loop: --send copy, zc or zc-fixed, not %s\n", m.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: coccl-tcp-loop [--sizes 1M,16M] [--streams N] [--seconds S] "
                   "[--send copy|zc|zc-fixed]\n"
                   "       coccl-tcp-loop --exchange N [--sizes 1M,16M] [--seconds S]\n");
      return 2;
    }
  }
  if (exchange > 0) {
    if (streams != 1 || mode != SendMode::copy) {
      std::fprintf(stderr, "coccl-tcp-loop: --exchange takes --sizes and --seconds only\n");
      return 2;
    }
    for (std::size_t size : sizes)
      if (exchange_bytes(size, exchange) == 0) {
        std::fprintf(stderr, "coccl-tcp-loop: --exchange %d moves nothing of a %zu-byte size\n",
                     exchange, size);
        return 2;
      }
    return run_exchange(exchange, sizes, seconds);
  }
  int port = 0;
  int l = listen_any(port);
  pid_t child = ::fork();
  if (child < 0) die("fork");
  const bool sender = child != 0;
  std::vector<int> fds;
  for (int s = 0; s < streams + 1; ++s) {
    if (sender) {
      int c = ::accept(l, nullptr, nullptr);
      if (c < 0) die("accept");
      int one = 1;
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      fds.push_back(c);
    } else {
      fds.push_back(dial(port));
    }
  }
  ::close(l);
  // The last socket carries the ping-pong.
  const int pp = fds.back();
  fds.pop_back();
  std::size_t max_size = *std::max_element(sizes.begin(), sizes.end());
  std::vector<std::vector<char>> bufs(fds.size(), std::vector<char>(max_size, 1));
  std::vector<std::unique_ptr<ZcRing>> zc(fds.size());
#if COCCL_HAVE_URING
  if (sender && mode != SendMode::copy)
    for (std::size_t s = 0; s < fds.size(); ++s)
      zc[s] = std::make_unique<ZcRing>(bufs[s].data(), max_size, mode == SendMode::zc_fixed);
#endif
  for (std::size_t size : sizes) {
    // Enough sends per batch to last about `seconds`/5 at a few GB/s, at least one.
    const std::size_t per_stream = std::max<std::size_t>(
        size, static_cast<std::size_t>(seconds / 5 * 2e9 / streams) / size * size);
    std::vector<double> rates;
    for (int batch = 0; batch < 6; ++batch) {
      auto t0 = Clock::now();
      run_batch(fds, sender, size, per_stream, bufs, zc);
      double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (batch > 0) rates.push_back(static_cast<double>(per_stream) * streams / dt / 1e9);
    }
    if (sender)
      std::printf("size %zu streams %d send %s: %.2f GB/s (median of %zu batches)\n", size, streams,
                  mode == SendMode::copy ? "copy"
                  : mode == SendMode::zc ? "zc"
                                         : "zc-fixed",
                  median(rates), rates.size());
  }
  // Ping-pong: one-way latency of an 8-byte message.
  char msg[8] = {};
  const int rounds = 20000;
  std::vector<double> lat;
  for (int batch = 0; batch < 5; ++batch) {
    auto t0 = Clock::now();
    for (int r = 0; r < rounds / 5; ++r) {
      if (sender) {
        send_all(pp, msg, sizeof msg);
        recv_all(pp, msg, sizeof msg);
      } else {
        recv_all(pp, msg, sizeof msg);
        send_all(pp, msg, sizeof msg);
      }
    }
    lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                  (rounds / 5) / 2);
  }
  if (sender) {
    std::printf("8 B ping-pong: %.2f us one way (median of %zu batches)\n", median(lat),
                lat.size());
    int status = 0;
    ::waitpid(child, &status, 0);
  }
  for (int fd : fds) ::close(fd);
  ::close(pp);
  return 0;
}
