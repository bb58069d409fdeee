// Making a link, one transport at a time.
//
// Peers runs one handshake for every kind of link, on the control socket that the lower rank
// dials to the higher rank's listener (transport/peers.cpp):
//   dialler:   offer()            -> request {kind, slots, address, sockets wanted}
//   answerer:  accept(address)    -> reply {address, sockets}
//   dialler:   complete(address)  [-> confirm frame, when confirms()]
//   both:      make(control socket, further sockets) -> the started Connection
// A LinkSetup holds what its transport makes on the way (shared segments, queue pairs, an
// io_uring) and knows nothing of ranks' tables, budgets or the wire, which stay in Peers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine.hpp"
#include "transport/connection.hpp"
#include "transport/link_poller.hpp"
#include "transport/stream.hpp"
#include "transport/user_buffers.hpp"

namespace coccl::transport {

namespace ib {
class Device;
}

/// The kinds of link; both ends decide alike from the address table and the settings.
enum class LinkKind : std::uint8_t { tcp = 0, shm = 1, ib = 2 };

/// What every link of one communicator shares. Owned by Peers; outlives its links' set-up.
struct LinkEnv {
  runtime::ProxyThread* thread = nullptr;
  int rank = -1;
  std::size_t slot_bytes = 0;
  LinkPoller* poller = nullptr;           // shm rings
  LinkPoller* ib_poller = nullptr;        // verbs completion queues
  std::shared_ptr<ib::Device> ib_device;  // null where this rank has no ib
  std::shared_ptr<UserBuffers> user_buffers;
  FailureHandler on_failure;
  bool memory = false;  // links run on the in-memory network: tcp over memory streams
};

/// One link's set-up, seen from one end. Throws std::system_error (errc::bad_message for a peer's
/// malformed address, errc::unsupported for a kind this build or host lacks, system errors for
/// resources).
class LinkSetup {
 public:
  virtual ~LinkSetup() = default;

  /// Dialler, before the request: this end's address (empty where the kind needs none).
  virtual std::vector<std::uint8_t> offer() = 0;
  /// How many sockets this end would use for the link (more than 1: tcp striped on io_uring).
  /// A link has the smaller count of its two ends.
  virtual std::uint32_t sockets() const { return 1; }
  /// Answerer: takes the dialler's address, makes its own end, returns its address for the reply.
  virtual std::vector<std::uint8_t> accept(std::span<const std::uint8_t> theirs) = 0;
  /// Dialler: takes the answerer's address.
  virtual void complete(std::span<const std::uint8_t> theirs) = 0;
  /// True when the dialler confirms after complete() that the answerer may now send (ib: the
  /// queue pairs are ready to receive).
  virtual bool confirms() const { return false; }
  /// The started connection over the control stream and the link's further sockets (as many as
  /// agreed, less one).
  virtual std::unique_ptr<Connection> make(int peer, Stream control,
                                           std::vector<Stream> further) = 0;
};

/// The set-up of a link of `kind` to `peer` with a receive ring of `slots` slots of the
/// environment's slot size. Throws std::system_error(errc::unsupported) for ib in a build without
/// the verbs headers or a rank without a device.
std::unique_ptr<LinkSetup> make_link_setup(LinkKind kind, const LinkEnv& env, int peer,
                                           std::size_t slots);

/// Each transport's own set-up (tcp.cpp, shm.cpp, ib.cpp).
std::unique_ptr<LinkSetup> make_tcp_setup(const LinkEnv& env, int peer, std::size_t slots);
std::unique_ptr<LinkSetup> make_shm_setup(const LinkEnv& env, std::size_t slots);
std::unique_ptr<LinkSetup> make_ib_setup(const LinkEnv& env, std::size_t slots);

/// The ib device for COCCL_TRANSPORT value `transport`: for "ib" the device or an error
/// (errc::unsupported, saying why), for "auto" the device where one is usable, else null.
std::shared_ptr<ib::Device> ib_device_for(const std::string& transport);

/// The registry of user buffers, registered with `device` where there is one.
std::shared_ptr<UserBuffers> make_user_buffers(const std::shared_ptr<ib::Device>& device);

}  // namespace coccl::transport
