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

// A rank that finishes a collective and destroys its communicator at once says goodbye; the
// slower peer still gets the data already delivered and completes the same collective.
TEST(Destroy, RightAfterACollectiveDoesNotFailTheSlowerPeer) {
  constexpr int rounds = 1000;
  for (int round = 0; round < rounds; ++round) {
    UniqueId id = UniqueId::create();
    std::vector<boost::system::error_code> ec(2);
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
