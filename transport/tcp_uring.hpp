// tcp links on io_uring: the same frames and the same Connection semantics as TcpConnection (a put
// is a LinkHeader plus payload, a released slot returns a credit frame), over two or more sockets
// per peer: socket 0 is a TcpConnection's, the others (lanes) are driven by an io_uring.
//
// - Socket 0 carries the puts the fast path of small operations may take (up to 16 KiB, and below
//   COCCL_TCP_ZC_MIN; an operation's frames to a peer then leave in one write), the credits for
//   its chunks, and abort and goodbye notices. It is read and written as on the Asio engine, so
//   the fast path (collectives/fast_path.hpp) reads and writes it on the calling thread: the ring
//   takes submissions from the proxy thread alone.
// - Larger puts go round socket 0 and the lanes. A put frame carries its index in put order, and
//   the receiver lands it in that slot, so chunks come out in put order whatever order the
//   sockets deliver them in. The credit for chunk k returns on the socket that carried it (with
//   that socket's ACK, which a zero-copy send waits for).
// - Lanes receive with one multishot receive each into their own provided buffer ring; the reaper
//   parses frames from those buffers and copies put payloads into the receive ring's slots, then
//   hands the buffers straight back to the kernel. A put of at least COCCL_TCP_ZC_MIN bytes on a
//   lane is its header (SEND) linked to an IORING_OP_SEND_ZC of the caller's buffer, and
//   completes once the kernel's notification says it no longer reads that buffer; other frames
//   are copying SENDMSGs, those queued on a lane gathered into one. One send is in flight per
//   lane, which keeps each lane's frames in order. Lanes are registered files.
// - A zero-copy put from a buffer the user registered (Communicator::register_buffer) is sent
//   from the ring's registered buffers (IORING_RECVSEND_FIXED_BUF): the link registers the whole
//   user buffer in its ring's table on first use, so its pages are pinned once rather than on
//   every send, and drops it at its first send or wait after the user's registration ends (or
//   when the link closes). Where the kernel refuses one
//   (the locked-memory limit, more than 1 GiB, a file mapping it cannot pin) that buffer's puts
//   are sent as unregistered ones are.
// - The ring's completions reach the proxy thread's io_context through an eventfd registered with
//   the ring and read by an Asio stream_descriptor; while a coroutine waits on the link, the
//   proxy's driver loop also polls the completion queue directly (runtime::Poller), which costs
//   no system call.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/config.hpp"
#include "runtime/engine.hpp"
#include "transport/connection.hpp"
#include "transport/stream.hpp"
#include "transport/user_buffers.hpp"

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

/// Makes a tcp link over `control` (socket 0: small puts and their credits, abort and goodbye
/// notices, read and written directly by the fast path) and `lanes` (sockets 1 and up, at least
/// one, driven by `ring`); large puts go round all of them. A zero-copy put from a buffer
/// registered in `user_buffers` (may be null) is sent from the ring's registered copy of that
/// buffer. Call it on `thread`, where the link then runs (and is destroyed); `control` must be a
/// tcp socket of that thread's io_context.
std::unique_ptr<Connection> make_uring_connection(
    int self, int peer, Stream control, std::vector<asio::ip::tcp::socket> lanes, UringRingPtr ring,
    std::size_t slots, std::size_t slot_bytes, runtime::ProxyThread& thread,
    std::shared_ptr<UserBuffers> user_buffers, FailureHandler on_failure);

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<std::string> tcp_engine;   // COCCL_TCP_ENGINE
extern config::Param<std::int64_t> tcp_zc_min;  // COCCL_TCP_ZC_MIN

}  // namespace coccl::params
