// coccl/unique_id.hpp: the token ranks share to form a communicator.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace coccl {

/// Identifies one communicator being formed: the address of its bootstrap root and a 128-bit
/// random secret. Every bootstrap and connection-setup message is authenticated with the secret,
/// so only holders of the UniqueId can join. 128 bytes, like ncclUniqueId; copy it to every rank
/// (as bytes, or as the hex text of to_string()).
struct UniqueId {
  std::array<std::uint8_t, 128> bytes{};

  /// Creates a new id and starts its bootstrap root in this process, listening on the first
  /// interface chosen by COCCL_SOCKET_IFNAME. The root serves exactly one communicator and exits
  /// once it has handed out the address table (or after COCCL_TIMEOUT). Throws std::system_error
  /// if no socket can be opened.
  static UniqueId create();

  /// Lower-case hex of the 128 bytes.
  std::string to_string() const;

  /// Parses to_string()'s text; throws std::system_error(errc::invalid_argument) on bad text.
  static UniqueId from_string(std::string_view hex);

  /// The id of a communicator whose root listens at `host_port` ("host:port", "[v6]:port") with
  /// the secret `secret_hex` (32 hex digits): what from_env() forms from COCCL_COMM_ID and
  /// COCCL_SECRET, so that tools (coccl-status) can address such a job. Starts no root. Throws
  /// std::system_error(errc::invalid_argument) on a bad address or secret.
  static UniqueId from_address(std::string_view host_port, std::string_view secret_hex);

  friend bool operator==(const UniqueId&, const UniqueId&) = default;
};

}  // namespace coccl
