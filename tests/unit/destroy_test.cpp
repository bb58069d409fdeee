// Communicator::destroy() right after a collective: the collective has completed on the rank that
// destroys, so its peers' copies of it must complete too (destroy sends no message, and a peer
// that already has all the data it needs has no reason to fail).
#include <gtest/gtest.h>

#include <coccl/coccl.hpp>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace coccl {
namespace {

// DISABLED: fails about once in 30-100 rounds. When rank A finishes all_reduce and destroys at
// once, rank B, still inside the same all_reduce with A's data already delivered, fails with
// errc::peer_lost "lost rank A (connection End of file)": transport/socket_connection.cpp:76-80
// turns the peer's orderly EOF into an immediate link failure reported to the communicator, and
// the waits then throw even though a chunk is ready (transport/shm.cpp:205, transport/tcp.cpp:61
// check closed_ before the ring). Enable once a closed link still delivers data already received.
TEST(Destroy, RightAfterACollectiveDoesNotFailTheSlowerPeer) {
  constexpr int rounds = 1000;
  for (int round = 0; round < rounds; ++round) {
    UniqueId id = UniqueId::create();
    std::vector<std::error_code> ec(2);
    std::vector<std::string> why(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        Communicator c = Communicator::create(id, r, 2);
        int in[4] = {r, r, r, r}, out[4] = {};
        c.all_reduce(in, out, 4, DataType::int32, ReduceOp::sum, ec[r]);
        if (ec[r]) why[r] = c.last_error();
        c.destroy();
      });
    for (auto& t : threads) t.join();
    ASSERT_FALSE(ec[0]) << "round " << round << ": " << why[0];
    ASSERT_FALSE(ec[1]) << "round " << round << ": " << why[1];
  }
}

}  // namespace
}  // namespace coccl
