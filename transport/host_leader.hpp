// Host leaders: the ranks of one host meet before the rendezvous, and one of them, the host's
// leader, carries all their hellos to the root on one connection. The root then sees hosts, not
// ranks: with 8 ranks a host it accepts an eighth of the connections and reads an eighth of the
// frames (each hellos frame holds what arrived while the previous one was written).
//
// The meeting place is a name derived from the root's secret, its address and the host identity
// (COCCL_HOSTID, or the host name and boot id): an abstract unix socket, which only processes of
// the same host (and network namespace) reach and which vanishes with its process; on the
// in-memory network, a name there. The first rank to listen under the name leads; the others
// dial it, authenticate with the secret as everywhere else, hand over their hello and wait until
// the leader has written it to the root. Once the communicator forms the root sends the leader,
// on the same connection, the entries that all the ranks it carried keep; the leader then stops
// and passes each follower its own part on the follower's connection. A follower whose leader
// goes (the connection ends before its table came) says hello to the root itself, which then
// sends its table on that connection instead.
//
// Nothing depends on the meeting: a rank that cannot dial the leader or take the name, whose
// leader refuses or fails, or who is turned away because the leader has too many unfinished
// handshakes, says hello to the root itself. COCCL_HOST_LEADERS=0 turns the meeting off.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "transport/bootstrap.hpp"
#include "transport/directory.hpp"
#include "transport/traffic.hpp"

namespace coccl::transport {

class HostLeader;

/// What became of a hello offered to the host's meeting: nothing set when it did not reach the
/// root that way (the rank then says hello itself).
struct HostHello {
  // This rank leads, and its hello went: it takes its host's table (take_table), passes the
  // followers theirs (pass_tables), then stops.
  std::shared_ptr<HostLeader> leader;
  // This rank follows and its hello was carried: its table comes on this connection.
  std::shared_ptr<Stream> link;
  std::optional<Channel> channel;
};

/// Offers `hello` (this rank's, for `root`) to the host's leader, or becomes the leader: then it
/// dials the root, sends its own hello and carries the hellos of the host's other ranks until
/// stopped. `memory`: meet on the in-memory network (each party's host is Traffic::host()).
/// Throws as a direct hello would only when this rank leads and cannot reach the root; every
/// other failure returns nothing set, and the caller says hello itself.
asio::awaitable<HostHello> hello_on_host(asio::any_io_executor ex, const RootAddress& root,
                                         const Hello& hello, bool memory,
                                         std::shared_ptr<Traffic> traffic,
                                         std::chrono::steady_clock::time_point until);

/// The meeting place of the ranks of host `host` that rendezvous at `root`: only holders of the
/// secret can derive it, and it differs per root and per host identity (several roots, or
/// COCCL_HOSTID making one machine several hosts). Exposed for tests.
std::string host_meeting_name(const RootAddress& root, std::uint64_t host);

/// A rank leading its host's meeting. Lives on the rank's proxy thread.
class HostLeader {
 public:
  HostLeader(asio::any_io_executor ex, const Secret& secret, const Hello& own);
  ~HostLeader();
  HostLeader(const HostLeader&) = delete;
  HostLeader& operator=(const HostLeader&) = delete;

  /// Stops listening and closes the link to the root; ranks still waiting for their hello to be
  /// written are told, and say hello themselves.
  void stop();
  /// The table the root sends on the leader's connection once the communicator forms: the
  /// entries every rank it carried keeps. Throws when `until` passes or the link fails.
  asio::awaitable<std::vector<std::uint8_t>> take_table(
      std::chrono::steady_clock::time_point until);
  /// Passes each follower whose hello it carried the entries that follower keeps (of `frame`, the
  /// leader's table, for `nranks` ranks), then closes their connections. A follower that cannot
  /// take it is left to say hello to the root itself.
  asio::awaitable<void> pass_tables(const DirectoryFrame& frame, int nranks);

 private:
  friend asio::awaitable<HostHello> hello_on_host(asio::any_io_executor, const RootAddress&,
                                                  const Hello&, bool, std::shared_ptr<Traffic>,
                                                  std::chrono::steady_clock::time_point);
  struct Batch;

  // Each holds `self` (this object) from the moment its frame exists, so that a coroutine spawned
  // but not yet started never outlives the leader.
  asio::awaitable<void> accept_loop(std::shared_ptr<HostLeader> self);
  asio::awaitable<void> serve(std::shared_ptr<HostLeader> self, std::shared_ptr<Stream> follower);
  asio::awaitable<void> write_loop(std::shared_ptr<HostLeader> self);

  asio::any_io_executor ex_;
  Secret secret_;
  Hello own_;
  Acceptor acceptor_;
  std::shared_ptr<Stream> root_;
  std::optional<Channel> channel_;
  std::vector<Hello> pending_;    // taken from followers, not yet written
  std::shared_ptr<Batch> batch_;  // what the followers of pending_ wait on
  bool writing_ = false;
  bool stopped_ = false;
  int handshakes_ = 0;       // follower connections not yet answered
  std::size_t carried_ = 0;  // hellos written to the root, its own included
  // Followers whose hellos were written, each waiting on its connection for its table.
  struct Follower {
    int rank;
    std::shared_ptr<Stream> link;
    Channel channel;
  };
  std::vector<Follower> followers_;
};

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<bool> host_leaders;  // COCCL_HOST_LEADERS

}  // namespace coccl::params
