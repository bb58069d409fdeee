// What a message, a byte and a connection cost on this machine's tcp stack, for coccl-sim's
// model of wall time: measured at start over loopback between two threads of the sim.
#pragma once

namespace coccl::sim {

struct Costs {
  double message_s = 0;  // half a round trip of a 64-byte message (one send, one receive, a wakeup)
  double byte_s = 0;     // a byte of a bulk transfer (the sender's and the receiver's copy)
  double connect_s = 0;  // a connection: connect, accept and close
};

/// Measures Costs over tcp loopback (a few hundred milliseconds). Throws
/// boost::system::system_error when loopback is unusable.
Costs measure_tcp_costs();

}  // namespace coccl::sim
