// Which listener addresses a rank keeps, and how it finds the others (issue 14).
//
// Up to COCCL_DIRECTORY_FULL ranks every rank keeps every address, as a plain table. Above that a
// rank keeps only the addresses its algorithms use without asking: its hypercube partners
// r XOR 2^k (recursive doubling and halving, Bruck), its ring neighbours and its parent and
// children in the binary tree r -> 2r+1, 2r+2 (log2 N + 6 entries at most). The relation is
// symmetric (a rank that a keeps keeps a), which lets two roots work out alone what each must
// send the other. Each root sends every connection that carried hellos the entries its ranks
// keep, so the whole distribution moves O(N log N) entries. Any other address is found by asking:
// a hop from rank a toward rank b first clears one of a's bits that b lacks, then sets one of b's
// bits that a lacks, so every rank on the way is below both a or b (it exists) and a hypercube
// partner of the previous one (which keeps its entry); at most log N hops, each answered by the
// rank on the way from what it holds.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/config.hpp"
#include "transport/bootstrap_messages.hpp"

namespace coccl::transport {

/// What every rank learns with its entries: the same for all ranks of the communicator.
struct DirectoryHeader {
  std::uint32_t nranks = 0;
  std::uint32_t hosts = 0;  // distinct host identities among the ranks
  std::uint32_t full = 0;   // 1: every rank keeps every entry
};

/// Appends to `out` the ranks whose entries `rank` keeps in a directory of `nranks` ranks that is
/// not full (itself included; unsorted, may repeat).
void directory_needs(int rank, int nranks, std::vector<int>& out);
/// The ranks whose entries any of `ranks` keeps (directory_needs of each): sorted, without
/// repeats.
std::vector<int> needs_of(std::span<const int> ranks, int nranks);
/// The same for the ranks [first, last).
std::vector<int> range_needs(int first, int last, int nranks);
/// The next hops from `from` toward `to` (from != to), each a hypercube partner of `from` below
/// max(from, to) + 1: first the ranks with one bit that `to` lacks cleared, else those with one
/// bit of `to` set, lowest bit first. Every hop lowers the Hamming distance to `to` by one.
std::vector<int> next_hops(int from, int to);

/// The bootstrap's table frame: the header and entries sorted by rank. Decoding checks the
/// header against `nranks`, every rank against it, the order, and the length.
std::vector<std::uint8_t> encode_directory(const DirectoryHeader& h,
                                           std::span<const DirectoryEntry> entries);
struct DirectoryFrame {
  DirectoryHeader header;
  std::vector<DirectoryEntry> entries;
};
DirectoryFrame decode_directory(std::span<const std::uint8_t> payload, int nranks);
/// The frame for the ranks whose needs are `needs` (sorted, as needs_of gives them), from the
/// entries held (sorted by rank): all of them when the directory is full. Throws bad_message
/// naming the first that `held` lacks.
std::vector<std::uint8_t> directory_for(const DirectoryFrame& held, std::span<const int> needs);

/// The entries a rank holds: those its root gave it and those it learned since (a link
/// request carries the dialler's, a lookup the hops' and the target's).
class Directory {
 public:
  /// Keeps what `frame` holds for `rank`: every entry when it is full, else the rank's needs.
  void assign(const DirectoryFrame& frame, int rank);
  bool formed() const noexcept { return header_.nranks != 0; }
  const DirectoryHeader& header() const noexcept { return header_; }
  /// Ranks on this rank's host (itself included).
  std::uint32_t host_ranks() const noexcept { return host_ranks_; }
  const PeerInfo* find(int rank) const noexcept {
    auto it = entries_.find(rank);
    return it == entries_.end() ? nullptr : &it->second;
  }
  /// Adds an entry this rank did not hold; one it holds stays (entries do not change while the
  /// communicator lives).
  void learn(int rank, const PeerInfo& info) { entries_.try_emplace(rank, info); }
  std::size_t known() const noexcept { return entries_.size(); }

 private:
  DirectoryHeader header_;
  std::uint32_t host_ranks_ = 0;
  std::unordered_map<int, PeerInfo> entries_;
};

/// A lookup's question (FrameType::whois): the rank whose address is wanted.
std::vector<std::uint8_t> encode_whois(std::int32_t target);
std::int32_t decode_whois(std::span<const std::uint8_t> payload, int nranks);
/// Its answer: the target's entry alone when the asked rank holds it, else the next hops it
/// holds toward the target (at most 64).
using Located = std::pair<std::int32_t, PeerInfo>;
std::vector<std::uint8_t> encode_whois_answer(std::span<const Located> entries);
std::vector<Located> decode_whois_answer(std::span<const std::uint8_t> payload, int nranks);

}  // namespace coccl::transport

namespace coccl::params {

extern config::Param<std::int64_t> directory_full;  // COCCL_DIRECTORY_FULL

}  // namespace coccl::params
