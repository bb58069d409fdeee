// The parameters a communicator reads when it is made (from the environment: COCCL_COMM_ID,
// COCCL_SECRET) and for its host operations: transport, ring slots, algorithm choice and CollTrace.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/config.hpp"

namespace coccl::params {

extern config::Param<std::string> algo;               // COCCL_ALGO
extern config::Param<std::string> transport;          // COCCL_TRANSPORT
extern config::Param<std::int64_t> slot_bytes;        // COCCL_SLOT_BYTES
extern config::Param<std::int64_t> slots;             // COCCL_SLOTS
extern config::Param<std::int64_t> oneshot_max;       // COCCL_ALLREDUCE_ONESHOT_MAX
extern config::Param<std::int64_t> direct_max_ranks;  // COCCL_DIRECT_MAX_RANKS
extern config::Param<std::int64_t> colltrace_size;    // COCCL_COLLTRACE_SIZE
extern config::Param<std::string> comm_id;            // COCCL_COMM_ID
extern config::Param<std::string> secret;             // COCCL_SECRET
extern config::Param<std::string> bootstrap;          // COCCL_BOOTSTRAP

}  // namespace coccl::params
