// A raw-socket attacker for the adversarial tests, and two ranks of a real communicator on threads
// of the test process, stopped between forming the communicator and their first operation so an
// attack can be aimed at a rank's listener before any link exists.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <coccl/coccl.hpp>
#include <cstdint>
#include <latch>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

namespace coccl::test {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

/// Two ranks of `id` on threads: constructed, the communicator is formed (no links yet);
/// all_reduce() then makes each rank all_reduce (rank + 1) over `count` floats and destroys it.
class TwoRanks {
 public:
  struct Result {
    std::error_code ec;
    std::vector<float> out;
  };
  explicit TwoRanks(const UniqueId& id, std::size_t count = 1);
  ~TwoRanks();
  /// Where rank `r` accepts peer connections (valid while it is formed).
  tcp::endpoint listener(int r) const;
  std::error_code formed_error(int r) const { return results_[r].ec; }
  /// Runs the operation on both ranks and waits for them.
  std::vector<Result> all_reduce();

 private:
  void run(int r);
  UniqueId id_;
  std::size_t count_;
  std::vector<Communicator> comms_{2};
  std::vector<Result> results_{2};
  std::latch formed_{2};
  std::latch go_{1};
  std::latch finished_{2};
  bool released_ = false;
  std::vector<std::thread> threads_;
};

/// True when every element of `r` is the 2-rank sum 1 + 2.
bool summed(const TwoRanks::Result& r);

/// Opens `n` connections to `ep` from `io`.
std::vector<std::unique_ptr<tcp::socket>> connect_many(asio::io_context& io, tcp::endpoint ep,
                                                       int n);

/// Sends the dialler's opening of the bootstrap handshake (a random nonce; anyone can) and reads
/// the listener's answer.
void open_handshake(tcp::socket& s);

/// Waits up to `limit` until the far end has closed each of `sockets` (EOF or reset); returns how
/// many it closed. Bytes the far end sends before closing are counted in `received`.
int count_closed(asio::io_context& io, std::vector<std::unique_ptr<tcp::socket>>& sockets,
                 std::chrono::steady_clock::duration limit, std::size_t* received = nullptr);

/// This process's resident set (VmRSS) in bytes.
std::size_t resident_bytes();

}  // namespace coccl::test
