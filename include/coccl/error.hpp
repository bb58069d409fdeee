// coccl/error.hpp: coccl's error codes and error category.
//
// Every asynchronous operation completes with a boost::system::error_code, as Asio's own do;
// coccl's codes are defined here for <system_error> (category "coccl", listed in coccl::errc) and
// travel inside boost::system::error_code through Boost.System's interoperation: comparing with
// coccl::errc, message() and converting back to std::error_code work on either type. Errors from
// the operating system keep the system category. Blocking operations throw std::system_error. A
// communicator also keeps a human-readable description of its last error (naming the peer rank
// and the operation) available from Communicator::last_error().
#pragma once

#include <string>
#include <system_error>

namespace coccl {

/// coccl's own error conditions.
enum class errc : int {
  /// An argument is invalid: a null buffer, a count that overflows, an unknown type or operator,
  /// a root or peer out of range. Nothing was sent.
  invalid_argument = 1,
  /// The communicator was destroyed or aborted; the operation did not run (or was cut short).
  aborted,
  /// A peer rank went away (its connection closed or reset) before the operation finished.
  peer_lost,
  /// A peer did not make progress within the deadline (COCCL_TIMEOUT).
  timed_out,
  /// Ranks called different collectives (or the same one with different arguments) at the same
  /// point in their sequence.
  mismatch,
  /// A bootstrap message failed authentication or was malformed.
  bad_message,
  /// The requested feature or transport is not available in this build or on this machine.
  unsupported,
  /// A broken internal invariant; please report it.
  internal,
  /// A remote rank reported an error and aborted the communicator.
  remote_error,
  /// A CUDA call failed.
  cuda_error,
};

/// The category of coccl::errc codes; its name() is "coccl".
const std::error_category& error_category() noexcept;

/// Makes an error_code of coccl's category.
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

}  // namespace coccl

template <>
struct std::is_error_code_enum<coccl::errc> : std::true_type {};
