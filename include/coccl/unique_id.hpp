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

  friend bool operator==(const UniqueId&, const UniqueId&) = default;
};

}  // namespace coccl
