// The "registered" scenario: collectives and send/recv between buffers registered with
// Communicator::register_buffer, in one of four modes (flag reg=both, reg=send, reg=recv,
// reg=none; default both). Checks every result against the reference and checks
// zero_copy_bytes() against the bytes this rank must have sent zero-copy: with the ib transport,
// every transfer of at least COCCL_IB_ZCOPY_MIN bytes whose source and destination are both
// registered; with other transports, none, except tcp links on io_uring whose puts reach
// COCCL_TCP_ZC_MIN: which of those go zero-copy depends on how they stripe over the sockets, so
// there the count must be above 0 (some sources registered, tcp) and must not grow once the
// registrations end (the exact count is the registered_uring scenario's). Ends by deregistering
// everything and checking that nothing more goes zero-copy, then checks that bad registrations are
// refused.
#include <sys/mman.h>

#include <coccl/error.hpp>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/multirank/worker.hpp"
#include "transport/tcp_uring.hpp"

namespace coccl::test {
namespace {

Bytes data_of(int rank, std::uint64_t salt, std::size_t first, std::size_t bytes) {
  Bytes b(std::max<std::size_t>(bytes, 1), std::byte{0xcd});
  fill_copy(rank, salt, b.data(), first, bytes);
  return b;
}

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? static_cast<std::size_t>(std::strtoull(v, nullptr, 0)) : fallback;
}

// This rank's zero_copy_bytes(), printed (ZERO_COPY_BYTES) with `when`.
std::uint64_t zero_copy_now(Worker& w, const std::string& when) {
  const std::uint64_t got = w.comm.zero_copy_bytes();
  std::printf("rank %d: ZERO_COPY_BYTES %llu %s\n", w.rank, static_cast<unsigned long long>(got),
              when.c_str());
  return got;
}

// Fails `w` unless zero_copy_bytes() read `got` where `want` was due (`why`: what makes it due).
void expect_zero_copy_count(Worker& w, std::uint64_t got, std::uint64_t want,
                            const std::string& when, const std::string& why = {}) {
  if (got != want)
    w.fail("zero_copy_bytes " + when,
           "got " + std::to_string(got) + ", want " + std::to_string(want) + why);
}

struct Registered {
  explicit Registered(Worker& worker) : w(worker) {}
  Worker& w;
  bool reg_send = true, reg_recv = true;
  bool ib = false;
  // tcp links on io_uring may send puts zero-copy from registered sources (see the top).
  bool uring_zero_copy = false, tcp = false;
  std::uint64_t counted_while_registered = 0;
  std::size_t block_min = 0;
  std::uint64_t expected = 0;  // bytes this rank must have sent zero-copy
  std::vector<BufferRegistration> regs;
  std::uint64_t salt = 1000;

  void keep(Bytes& b, bool sending) {
    if (sending ? reg_send : reg_recv) regs.push_back(w.comm.register_buffer(b.data(), b.size()));
  }
  // Ends the registrations of a step before its buffers are freed, as register_buffer requires.
  void done() { regs.clear(); }
  // A transfer of `bytes` from a buffer registered when `src_registered` into one registered
  // when `dst_registered` goes zero-copy on ib from the threshold up.
  void expect_zero_copy(std::size_t bytes, bool src_registered, bool dst_registered) {
    if (ib && src_registered && dst_registered && bytes >= block_min) expected += bytes;
  }

  void send_recv() {
    // Per peer: a small transfer, transfers at and above the threshold, and more blocks than
    // the ib offer window; one registered buffer per peer and direction.
    const std::vector<std::size_t> sizes{300,   200003, 65536, 70000, 70001,          70002,
                                         70003, 70004,  70005, 70006, (1u << 20) + 12};
    std::size_t total = 0;
    for (auto s : sizes) total += s;
    const int n = w.n, me = w.rank;
    const std::uint64_t s = ++salt;
    std::vector<Bytes> out(n), in(n);
    std::vector<Transfer> ops;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      out[p] = data_of(me, s + p, 0, total);
      in[p] = Bytes(total, std::byte{0xcd});
      keep(out[p], true);
      keep(in[p], false);
      std::size_t off = 0;
      for (auto sz : sizes) {
        ops.push_back(Communicator::send_op(out[p].data() + off, sz, DataType::uint8, p));
        ops.push_back(Communicator::recv_op(in[p].data() + off, sz, DataType::uint8, p));
        expect_zero_copy(sz, reg_send, reg_recv);
        off += sz;
      }
    }
    w.comm.send_recv(ops);
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      const Bytes want = data_of(p, s + me, 0, total);
      w.expect_equal(describe("send_recv", DataType::uint8, ReduceOp::sum, total,
                              "registered from_rank=" + std::to_string(p)),
                     DataType::uint8, in[p].data(), want.data(), total);
    }
    done();
  }

  void all_gather() {
    const std::size_t count_each = 100003, bytes = count_each * 4;
    const std::uint64_t s = ++salt;
    Bytes mine = data_of(w.rank, s, 0, bytes), all(bytes * w.n, std::byte{0xcd});
    keep(mine, true);
    keep(all, false);
    w.comm.all_gather(mine.data(), all.data(), count_each, DataType::float32);
    // Each rank's block leaves from its own place in the (receive) buffer.
    for (int p = 0; p < w.n; ++p)
      if (p != w.rank) expect_zero_copy(bytes, reg_recv, reg_recv);
    for (int r = 0; r < w.n; ++r) {
      const Bytes want = data_of(r, s, 0, bytes);
      w.expect_equal(describe("all_gather", DataType::float32, ReduceOp::sum, count_each,
                              "registered from_rank=" + std::to_string(r)),
                     DataType::float32, all.data() + r * bytes, want.data(), count_each);
    }
    done();
  }

  // all_to_allv with counts per (source, destination), some under the threshold.
  void all_to_allv(bool uniform) {
    const int n = w.n, me = w.rank;
    auto count_of = [&](int src, int dst) -> std::size_t {
      if (uniform) return 60001;
      return (src + dst) % 2 ? 100 + src : 50000 + 7 * src + dst;
    };
    std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
    std::size_t st = 0, rt = 0;
    for (int p = 0; p < n; ++p) {
      sc[p] = count_of(me, p);
      sd[p] = st;
      st += sc[p];
      rc[p] = count_of(p, me);
      rd[p] = rt;
      rt += rc[p];
    }
    const std::uint64_t s = ++salt;
    Bytes send(st * 4), recv(rt * 4, std::byte{0xcd});
    for (int p = 0; p < n; ++p) fill_copy(me, s + p, send.data() + sd[p] * 4, 0, sc[p] * 4);
    keep(send, true);
    keep(recv, false);
    if (uniform)
      w.comm.all_to_all(send.data(), recv.data(), sc[0], DataType::int32);
    else
      w.comm.all_to_allv(send.data(), sc, sd, recv.data(), rc, rd, DataType::int32);
    for (int p = 0; p < n; ++p) {
      if (p != me) expect_zero_copy(sc[p] * 4, reg_send, reg_recv);
      const Bytes want = data_of(p, s + me, 0, rc[p] * 4);
      w.expect_equal(describe(uniform ? "all_to_all" : "all_to_allv", DataType::int32,
                              ReduceOp::sum, rc[p], "registered from_rank=" + std::to_string(p)),
                     DataType::int32, recv.data() + rd[p] * 4, want.data(), rc[p]);
    }
    done();
  }

  void gather_scatter() {
    const int n = w.n, me = w.rank;
    {
      const std::size_t bytes = 70001;
      const int root = 0;
      const std::uint64_t s = ++salt;
      Bytes mine = data_of(me, s, 0, bytes), all(bytes * n, std::byte{0xcd});
      keep(mine, true);
      if (me == root) keep(all, false);
      w.comm.gather(mine.data(), all.data(), bytes, DataType::uint8, root);
      if (me != root) expect_zero_copy(bytes, reg_send, reg_recv);
      if (me == root)
        for (int r = 0; r < n; ++r) {
          const Bytes want = data_of(r, s, 0, bytes);
          w.expect_equal(describe("gather", DataType::uint8, ReduceOp::sum, bytes,
                                  "registered from_rank=" + std::to_string(r)),
                         DataType::uint8, all.data() + r * bytes, want.data(), bytes);
        }
      done();
    }
    {
      const std::size_t count_each = 131072, bytes = count_each * 4;
      const int root = n - 1;
      const std::uint64_t s = ++salt;
      Bytes all = data_of(root, s, 0, bytes * n), mine(bytes, std::byte{0xcd});
      if (me == root) keep(all, true);
      keep(mine, false);
      w.comm.scatter(all.data(), mine.data(), count_each, DataType::float32, root);
      if (me == root)
        for (int p = 0; p < n; ++p)
          if (p != root) expect_zero_copy(bytes, reg_send, reg_recv);
      const Bytes want = data_of(root, s, me * bytes, bytes);
      w.expect_equal(
          describe("scatter", DataType::float32, ReduceOp::sum, count_each, "registered"),
          DataType::float32, mine.data(), want.data(), count_each);
      done();
    }
  }

  // all_reduce of 4 MB: its all-gather phase moves reduced segments between the (registered)
  // receive buffers; the reduce-scatter phase is staged. Direct (every peer at once, the choice
  // on one host) or ring (COCCL_ALGO=ring).
  void all_reduce() {
    const int n = w.n, me = w.rank;
    const std::size_t count = 1000003, bytes = count * 4;
    const std::uint64_t s = ++salt;
    Bytes send(bytes), recv(bytes, std::byte{0xcd});
    fill_reduce(DataType::float32, ReduceOp::sum, me, s, send.data(), 0, count);
    keep(send, true);
    keep(recv, false);
    w.comm.all_reduce(send.data(), recv.data(), count, DataType::float32, ReduceOp::sum);
    auto seg_bytes = [&](int i) {
      const std::size_t base = count / n, extra = count % n;
      return (base + (static_cast<std::size_t>(i) < extra ? 1 : 0)) * 4;
    };
    const char* algo = std::getenv("COCCL_ALGO");
    if (algo && std::string(algo) == "ring") {
      for (int step = 0; step < n - 1; ++step)
        expect_zero_copy(seg_bytes((me + 1 - step + n) % n), reg_recv, reg_recv);
    } else {
      for (int p = 0; p < n; ++p)
        if (p != me) expect_zero_copy(seg_bytes(me), reg_recv, reg_recv);
    }
    const Bytes want = reduce_reference(DataType::float32, ReduceOp::sum, n, s, 0, count);
    w.expect_equal(describe("all_reduce", DataType::float32, ReduceOp::sum, count, "registered"),
                   DataType::float32, recv.data(), want.data(), count);
    done();
  }

  // The same buffers before and after their registrations end: zero-copy, then staged.
  void same_buffers_after_deregistering() {
    const int n = w.n, me = w.rank;
    const std::size_t count_each = 60001, bytes = count_each * 4;
    Bytes send(bytes * n), recv(bytes * n);
    for (int round = 0; round < 2; ++round) {
      const std::uint64_t s = ++salt;
      for (int p = 0; p < n; ++p) fill_copy(me, s + p, send.data() + p * bytes, 0, bytes);
      std::memset(recv.data(), 0xcd, recv.size());
      if (round == 0) {
        keep(send, true);
        keep(recv, false);
      }
      w.comm.all_to_all(send.data(), recv.data(), count_each, DataType::int32);
      for (int p = 0; p < n; ++p) {
        if (round == 0 && p != me) expect_zero_copy(bytes, reg_send, reg_recv);
        const Bytes want = data_of(p, s + me, 0, bytes);
        w.expect_equal(describe("all_to_all", DataType::int32, ReduceOp::sum, count_each,
                                "registered round=" + std::to_string(round) +
                                    " from_rank=" + std::to_string(p)),
                       DataType::int32, recv.data() + p * bytes, want.data(), count_each);
      }
      done();
    }
  }

  void check_counter(const char* when, bool registrations_ended) {
    const std::uint64_t got = zero_copy_now(w, when);
    if (!uring_zero_copy) {
      expect_zero_copy_count(w, got, expected, when);
    } else if (registrations_ended) {
      expect_zero_copy_count(w, got, counted_while_registered, when,
                             " as before the registrations ended");
    } else {
      counted_while_registered = got;
      if (tcp && reg_send && got == 0)
        w.fail(std::string("zero_copy_bytes ") + when, "got 0 from registered sources on io_uring");
    }
  }

  void bad_registrations() {
    auto refused = [&](const char* what, auto&& call) {
      try {
        call();
        w.fail("register_buffer", std::string(what) + " was accepted");
      } catch (const std::system_error& e) {
        if (e.code() != make_error_code(errc::invalid_argument))
          w.fail("register_buffer", std::string(what) + ": " + e.what());
      }
    };
    Bytes b(64);
    refused("a null buffer", [&] { w.comm.register_buffer(nullptr, 64); });
    refused("0 bytes", [&] { w.comm.register_buffer(b.data(), 0); });
    refused("an empty communicator", [&] { Communicator().register_buffer(b.data(), 64); });
  }
};

// The "registered_uring" scenario, 2 ranks over tcp with COCCL_TCP_SOCKETS=2 and puts of
// COCCL_SLOT_BYTES of at least COCCL_TCP_ZC_MIN: each exchange sends the peer 4 puts from one
// buffer, and puts larger than the fast path's go round socket 0 and the lane, so 2 of every 4
// are sent zero-copy on the lane; on the uring engine they count as zero-copy bytes exactly when
// the buffer is in the link's ring table (registered, and the table had room and the kernel took
// it). On the asio engine nothing counts.
struct RegisteredUring {
  explicit RegisteredUring(Worker& worker) : w(worker) {}
  Worker& w;
  bool uring = false;
  std::size_t chunk = 0;
  std::uint64_t expected = 0;
  std::uint64_t salt = 5000;
  int step = 0;

  std::size_t bytes() const { return 4 * chunk; }

  // Sends the peer `bytes()` from `src` and checks what comes back; `counts`: whether the
  // lane's puts from `src` are zero-copy sends from the ring's registered buffers.
  void exchange(std::byte* src, bool counts, const char* what) {
    const int peer = 1 - w.rank;
    const std::uint64_t s = ++salt;
    fill_copy(w.rank, s, src, 0, bytes());
    Bytes in(bytes(), std::byte{0xcd});
    w.comm.send_recv({Communicator::send_op(src, bytes(), DataType::uint8, peer),
                      Communicator::recv_op(in.data(), bytes(), DataType::uint8, peer)});
    const Bytes want = data_of(peer, s, 0, bytes());
    w.expect_equal(describe("send_recv", DataType::uint8, ReduceOp::sum, bytes(),
                            std::string("registered_uring ") + what),
                   DataType::uint8, in.data(), want.data(), bytes());
    if (counts && uring) expected += 2 * chunk;
    check(what);
  }

  void check(const char* what) {
    const std::string when = "after step " + std::to_string(++step) + " (" + what + ")";
    expect_zero_copy_count(w, zero_copy_now(w, when), expected, when);
  }

  void run() {
    Bytes a(bytes()), b(bytes());
    {
      BufferRegistration ra = w.comm.register_buffer(a.data(), a.size());
      exchange(a.data(), true, "a registered buffer");
      exchange(a.data(), true, "the same registered buffer again");
    }
    exchange(a.data(), false, "the same buffer after its registration ended");
    exchange(b.data(), false, "a buffer never registered");
    {
      // A part of a registered buffer counts: the ring holds the whole registration.
      Bytes big(3 * bytes());
      BufferRegistration rb = w.comm.register_buffer(big.data(), big.size());
      exchange(big.data() + bytes(), true, "the middle of a registered buffer");
    }
    {
      // More registered buffers than the ring's table holds (32): the first 32 sent from count,
      // the others go zero-copy unregistered; once all end, the table's entries are free again.
      std::vector<Bytes> many(40, Bytes(bytes()));
      std::vector<BufferRegistration> regs;
      for (Bytes& m : many) regs.push_back(w.comm.register_buffer(m.data(), m.size()));
      for (std::size_t i = 0; i < many.size(); ++i)
        exchange(many[i].data(), i < 32, i < 32 ? "a buffer the table holds" : "a full table");
      regs.clear();
      for (std::size_t i = 0; i < 4; ++i) {
        regs.push_back(w.comm.register_buffer(many[i].data(), many[i].size()));
        exchange(many[i].data(), true, "a registration made after the table emptied");
      }
    }
    {
      // io_uring registers at most 1 GiB a buffer: a larger registration is refused by the ring
      // (the user's register_buffer succeeds), and its puts go zero-copy unregistered. The range
      // is reserved, not touched beyond what is sent.
      const std::size_t huge = (std::size_t{1} << 30) + (std::size_t{64} << 20);
      void* p = ::mmap(nullptr, huge, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        w.fail("mmap", "cannot reserve 1.06 GiB");
        return;
      }
      {
        BufferRegistration rh = w.comm.register_buffer(p, huge);
        exchange(static_cast<std::byte*>(p), false, "a buffer the ring refuses");
      }
      ::munmap(p, huge);
    }
  }
};

}  // namespace

int run_registered_uring(Worker& w) {
  if (w.n != 2) {
    w.fail("registered_uring", "needs 2 ranks");
    return exit_ok;
  }
  RegisteredUring t(w);
  const char* engine = std::getenv("COCCL_TCP_ENGINE");
  t.uring = engine && std::string(engine) == "uring";
  t.chunk = env_size("COCCL_SLOT_BYTES", 0);
  if (t.chunk == 0 || env_size("COCCL_TCP_ZC_MIN", 0) > t.chunk) {
    w.fail("registered_uring", "needs COCCL_SLOT_BYTES at least COCCL_TCP_ZC_MIN");
    return exit_ok;
  }
  t.run();
  return exit_ok;
}

void run_registered(Worker& w) {
  Registered t(w);
  if (w.has("reg=send")) t.reg_recv = false;
  if (w.has("reg=recv")) t.reg_send = false;
  if (w.has("reg=none")) t.reg_send = t.reg_recv = false;
  const char* transport = std::getenv("COCCL_TRANSPORT");
  t.ib = transport && std::string(transport) == "ib";
  t.tcp = transport && std::string(transport) == "tcp";
  const char* engine = std::getenv("COCCL_TCP_ENGINE");
  const char* sockets = std::getenv("COCCL_TCP_SOCKETS");
  t.uring_zero_copy =
      !t.ib && transport::uring_unavailable().empty() &&
      !(engine && std::string(engine) == "asio") && !(sockets && std::string(sockets) == "1") &&
      env_size("COCCL_TCP_ZC_MIN", 1 << 20) <= env_size("COCCL_SLOT_BYTES", 256 << 10);
  t.block_min = std::max<std::size_t>(4096, env_size("COCCL_IB_ZCOPY_MIN", 64 << 10));
  t.send_recv();
  t.all_gather();
  t.all_to_allv(true);
  t.all_to_allv(false);
  t.gather_scatter();
  t.all_reduce();
  t.same_buffers_after_deregistering();
  t.check_counter("after registered transfers", false);
  // Without registrations the same transfers are staged, and still right.
  const bool had_send = t.reg_send, had_recv = t.reg_recv;
  t.reg_send = t.reg_recv = false;
  t.all_to_allv(false);
  t.send_recv();
  t.check_counter("after deregistering", true);
  t.reg_send = had_send;
  t.reg_recv = had_recv;
  t.bad_registrations();
}

}  // namespace coccl::test
