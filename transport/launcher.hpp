// Launcher key-value stores that carry a UniqueId from rank 0 to the other ranks of a job, so that
// Communicator::from_env() needs neither a second port nor a secret anyone could guess:
// - the TCPStore that torchrun (and torch.distributed) already serves on MASTER_ADDR:MASTER_PORT,
//   spoken to as a client in its own wire protocol;
// - PMIx, which mpirun (Open MPI, PRRTE) and srun --mpi=pmix offer to the processes they start,
//   loaded at run time so that coccl has no link-time dependency on it.
// Both are blocking and bounded by a deadline: they run once per communicator, before any proxy
// work exists.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/address_book.hpp"

namespace coccl::transport {

/// A client of a torch.distributed TCPStore server. Throws std::system_error: errc::timed_out
/// when the store cannot be reached or a key does not appear before the deadline,
/// errc::bad_message when the server's answers do not follow the protocol, errc::peer_lost when
/// it closes the connection. After an error the connection is closed and every later call fails.
class TcpStoreClient {
 public:
  /// Connects (retrying refused connections until `timeout`), then validates the connection and
  /// pings the server as torch's own client does, so that a port that is not a TCPStore fails
  /// here with a clear error.
  TcpStoreClient(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout);
  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  /// Sets `key` to `value` (overwriting).
  void set(std::string_view key, std::string_view value);
  /// Waits until `key` exists (up to the timeout given at construction), then returns its value.
  std::string get(std::string_view key);
  /// Waits until every one of `keys` exists (up to the timeout given at construction), then
  /// returns their values in order. One WAIT names them all and the GETs go out together, so the
  /// answers take one round trip rather than one each.
  std::vector<std::string> get_many(std::span<const std::string> keys);
  /// Waits until every one of `keys` exists (up to the timeout given at construction) without
  /// reading them: one WAIT, for a key whose presence is all that matters (a barrier's flag).
  void wait(std::span<const std::string> keys);
  /// Adds `delta` to the integer stored at `key` (0 when absent) and returns the new value.
  std::int64_t add(std::string_view key, std::int64_t delta);
  /// Queries sent to the server so far, VALIDATE and PING included: the load this client put on
  /// it.
  std::uint64_t requests() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

/// How TcpStoreClient reads a server's answer: fills exactly `n` bytes and returns true, or
/// returns false when the deadline passed first (a failed connection throws).
using StoreRead = std::function<bool(void* p, std::size_t n)>;

/// Decoders of a TCPStore server's answers, the bytes TcpStoreClient reads through `read`;
/// `where` names the server in errors. They throw std::system_error: errc::bad_message when the
/// answer breaks the protocol, errc::timed_out when `read` reports the deadline.
/// PING's answer: the server echoes `nonce`.
void read_ping_answer(const StoreRead& read, std::uint32_t nonce, const std::string& where);
/// WAIT's answer, sent once `key` exists (`timeout` is named in the error when it does not).
void read_wait_answer(const StoreRead& read, std::string_view key, const std::string& where,
                      std::chrono::milliseconds timeout);
/// GET's answer: the value of `key`, at most 1 MiB.
std::string read_get_answer(const StoreRead& read, std::string_view key, const std::string& where);
/// ADD's answer: the new value.
std::int64_t read_add_answer(const StoreRead& read, const std::string& where);

/// The launcher's TCPStore as an AddressBook (address_book.hpp) for `rank` of `nranks`: a rank
/// sets its entry under `key` + "/addr/<rank>", counts itself on its host and its host among the
/// hosts (ADD on `key` + "/host/<host hash>" and `key` + "/hosts", so that the count is coccl's,
/// COCCL_HOSTID included), then arrives at a barrier of ADDs on `key` + "/arrived" that the last
/// rank ends by setting `key` + "/ready". Each rank then reads only the entries it keeps. The
/// store's server is the launcher's (torchrun's agent), not a rank of the communicator; it serves
/// O(1) writes and O(log N) reads a rank. `store` outlives the book.
std::unique_ptr<AddressBook> store_book(TcpStoreClient& store, std::string key, int rank,
                                        int nranks);

/// The PMIx client of the process, when the process was started by a PMIx server (mpirun, srun
/// --mpi=pmix) and libpmix can be loaded. Its rank and size come from PMIx itself.
class PmixClient {
 public:
  /// Null when the process was not started under PMIx (no PMIX_RANK / PMIX_NAMESPACE in the
  /// environment) or no libpmix.so.2 / libpmix.so can be loaded. Throws std::system_error when
  /// PMIx is present but refuses to initialise.
  static std::unique_ptr<PmixClient> open();
  ~PmixClient();
  PmixClient(const PmixClient&) = delete;
  PmixClient& operator=(const PmixClient&) = delete;

  int rank() const noexcept;
  /// Number of processes in the job's namespace.
  int size() const noexcept;
  /// Publishes `value` under `key` for every process of the job (put + commit).
  void put(std::string_view key, std::string_view value);
  /// Waits until every process of the job has called fence() (collecting what they put), for at
  /// most `timeout` (PMIx's own timeout, in whole seconds, at least one; zero: no limit). Throws
  /// std::system_error: errc::timed_out when a process did not come in time, errc::peer_lost
  /// when PMIx fails the fence otherwise.
  void fence(std::chrono::milliseconds timeout);
  /// Reads what process `rank` put under `key` (after a fence()).
  std::string get(int rank, std::string_view key);
  /// A 32-bit fact of the job that PMIx holds (`key`, for instance "pmix.num.nodes" or
  /// "pmix.local.size"); nullopt when it holds none under that key.
  std::optional<std::uint32_t> job_info(std::string_view key);

 private:
  struct Api;
  explicit PmixClient(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

/// The job's modex as an AddressBook (address_book.hpp): entries go under `key` + "/addr", and
/// the hosts are the launcher's nodes unless COCCL_HOSTID names them (then only a full directory
/// can count them). Its fence waits at most `timeout`. `pmix` outlives the book.
std::unique_ptr<AddressBook> pmix_book(PmixClient& pmix, std::string key,
                                       std::chrono::milliseconds timeout);

}  // namespace coccl::transport
