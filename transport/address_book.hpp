// Forming a communicator from a launcher's table of addresses, without a bootstrap root (issue 14).
//
// A job started by a PMIx launcher (mpirun, srun --mpi=pmix) already has a key-value space that
// every process reaches through its host's launcher daemon, and a fence that the daemons run as a
// tree: PMIx's modex. Each rank publishes its listener there, the fence makes every entry
// readable everywhere, and each rank reads only the entries it keeps (directory.hpp): every
// entry up to COCCL_DIRECTORY_FULL ranks, else its O(log N) partners. No coccl party then takes
// more than O(log N) messages to form, where with one id the root takes a connection per host and
// writes each its table. The launcher's own load (one put a rank, the fence, the reads at each
// host's daemon) is the launcher's, as its key-value space is.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/bootstrap_messages.hpp"
#include "transport/directory.hpp"

namespace coccl::transport {

/// Distinct hosts among a communicator's ranks, and the ranks on one rank's host.
struct HostCount {
  std::uint32_t hosts = 0;
  std::uint32_t host_ranks = 0;
};

/// A launcher's table of the ranks' listeners, seen from one rank. The calls block; they run once
/// per communicator, before it has any work.
class AddressBook {
 public:
  virtual ~AddressBook() = default;
  /// Publishes `self` as this rank's entry, then waits until every rank of the communicator has
  /// published its own.
  virtual void publish(const PeerInfo& self) = 0;
  /// The entry `rank` published (after publish()).
  virtual PeerInfo lookup(int rank) = 0;
  /// The entries of `ranks`, in order (after publish()); a book whose reads can overlap
  /// overrides this one-at-a-time default.
  virtual std::vector<PeerInfo> lookup_many(std::span<const int> ranks);
  /// The hosts and this rank's host's ranks where the launcher knows them as coccl counts hosts
  /// (COCCL_HOSTID included); nullopt where it does not, and only a full directory can count them.
  /// Asked after publish(): a book may count them from what the ranks published.
  virtual std::optional<HostCount> hosts() = 0;
  /// Whether hosts() will give a count, asked before publish() so that a book that cannot count
  /// fails before any rank waits on it. The default asks hosts() itself.
  virtual bool counts_hosts() { return hosts().has_value(); }
};

/// Whether a communicator of `nranks` can form from `book`: with a full directory the entries
/// give the hosts, else the launcher must know them.
bool can_form_from(AddressBook& book, int nranks);

/// Publishes `self` for `rank` of `nranks`, then makes the frame this rank keeps: every entry up
/// to COCCL_DIRECTORY_FULL ranks (hosts counted from them), else its needs (directory.hpp) with
/// the launcher's count of hosts. Throws std::system_error: errc::bad_message when an entry is not
/// an address, or `rank`'s own entry is not `self`; errc::unsupported when the directory is not
/// full and the book cannot count hosts; the book's own errors.
DirectoryFrame frame_from_book(AddressBook& book, const PeerInfo& self, int rank, int nranks);

/// An entry as a launcher value: the wire form of the PeerInfo in lower-case hex.
std::string encode_book_entry(const PeerInfo& info);
/// Reads a value of encode_book_entry; throws std::system_error (errc::bad_message, naming `rank`)
/// when it is not one or holds no usable address (family 4, 6 or the in-memory network).
PeerInfo decode_book_entry(std::string_view text, int rank);

}  // namespace coccl::transport
