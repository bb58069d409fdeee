// tcp links on io_uring: the same frames and the same Connection semantics as TcpConnection (a put
// is a LinkHeader plus payload, a released slot returns a credit frame), driven by an io_uring
// instead of Asio's reactor, over one or more sockets per peer.
//
// - Receives: one multishot receive per socket into that socket's provided buffer ring; the
//   reaper parses frames from those buffers and copies put payloads into the receive ring's slots,
//   then hands the buffers straight back to the kernel.
// - Sends: a put of at least COCCL_TCP_ZC_MIN bytes is its header (SEND) linked to an
//   IORING_OP_SEND_ZC of the caller's buffer; the put completes only once the kernel's
//   notification says it no longer reads that buffer. Smaller puts and control frames are
//   copying SENDMSGs, the frames queued on a socket gathered into one; a put of at most 4 KiB is
//   copied and completes at once. One send is in flight per socket, which keeps each socket's
//   frames in order.
// - Sockets are registered files. Puts of at most 4 KiB go on socket 0 (an operation's frames to
//   a peer then leave in one send), larger ones round the sockets; over several sockets a put's
//   frame carries its index in put order, and the receiver lands it in that slot, so chunks come
//   out in put order whatever order the sockets deliver them in. The credit for chunk k returns
//   on the socket that carried it (with that socket's ACK, which a zero-copy send waits for);
//   abort and goodbye notices go on socket 0.
// - Completions reach the proxy thread's io_context through an eventfd registered with the ring
//   and read by an Asio stream_descriptor; while a coroutine waits on the link, the proxy's driver
//   loop also polls the completion queue directly (runtime::Poller), which costs no system call.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/config.hpp"
#include "runtime/engine.hpp"
#include "transport/connection.hpp"

namespace coccl::transport {

/// Which engine drives this process's tcp links.
enum class TcpEngine { asio, uring };

/// The engine for new tcp links: COCCL_TCP_ENGINE, and for auto whether io_uring works in this
/// process (probed once; the choice is logged at INFO). Throws std::system_error with
/// errc::invalid_argument for an unknown setting, and errc::unsupported naming the reason when
/// uring is forced but unavailable (not built in, or refused by the kernel).
TcpEngine tcp_engine(int rank);

/// Why io_uring cannot drive tcp links here (empty if it can): io_uring_queue_init refused
/// (ENOSYS, EPERM under seccomp, kernel.io_uring_disabled), or a feature missing (multishot
/// receive, SEND_ZC, provided buffer rings). Probed once per process.
const std::string& uring_unavailable();

class UringRing;
struct UringRingDeleter {
  void operator()(UringRing* r) const noexcept;
};
using UringRingPtr = std::unique_ptr<UringRing, UringRingDeleter>;

/// An io_uring made for one link before its sockets exist (so that a refusal is known while the
/// link's socket count is still being agreed), on any thread. Null with `why` set if the kernel
/// refused it. Where the kernel has them (6.1 on), its completions wait until the link asks for
/// them (DEFER_TASKRUN), and it takes submissions from one thread, the one that makes the
/// connection (SINGLE_ISSUER, enabled there).
UringRingPtr make_uring_ring(std::string& why);

/// Makes a tcp link over `sockets` (socket 0 carries abort and goodbye notices) driven by `ring`.
/// Call it on `thread`, where the link then runs (and is destroyed).
std::unique_ptr<Connection> make_uring_connection(int self, int peer,
                                                  std::vector<asio::ip::tcp::socket> sockets,
                                                  UringRingPtr ring, std::size_t slots,
                                                  std::size_t slot_bytes,
                                                  runtime::ProxyThread& thread,
                                                  FailureHandler on_failure);

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<std::string> tcp_engine;   // COCCL_TCP_ENGINE
extern config::Param<std::int64_t> tcp_zc_min;  // COCCL_TCP_ZC_MIN

}  // namespace coccl::params
