#include "transport/address_book.hpp"

#include <algorithm>
#include <coccl/error.hpp>
#include <span>
#include <unordered_map>
#include <vector>

#include "transport/net.hpp"
#include "transport/wire.hpp"

namespace coccl::transport {

namespace {

bool full_directory(int nranks) { return nranks <= params::directory_full.get(); }

}  // namespace

std::string encode_book_entry(const PeerInfo& info) {
  Writer w;
  w.put(info);
  return to_hex(w.bytes());
}

PeerInfo decode_book_entry(std::string_view text, int rank) {
  const std::string whose = "the launcher's entry of rank " + std::to_string(rank);
  if (text.size() != 2 * sizeof(PeerInfo))
    bad_message(whose + " is " + std::to_string(text.size()) + " characters, not an address (" +
                std::to_string(2 * sizeof(PeerInfo)) + ")");
  std::vector<std::uint8_t> bytes(sizeof(PeerInfo));
  if (!from_hex(text, bytes, false)) bad_message(whose + " is not lower-case hex");
  Reader r(bytes);
  const PeerInfo info = r.get<PeerInfo>();
  const bool ip = info.family == 4 || info.family == 6;
  if (!(ip || is_memory(info)) || (ip && info.port == 0))
    bad_message(whose + " holds no usable address (family " + std::to_string(info.family) +
                ", port " + std::to_string(info.port) + ")");
  return info;
}

std::vector<PeerInfo> AddressBook::lookup_many(std::span<const int> ranks) {
  std::vector<PeerInfo> out;
  out.reserve(ranks.size());
  for (int r : ranks) out.push_back(lookup(r));
  return out;
}

bool can_form_from(AddressBook& book, int nranks) {
  return full_directory(nranks) || book.counts_hosts();
}

DirectoryFrame frame_from_book(AddressBook& book, const PeerInfo& self, int rank, int nranks) {
  if (nranks < 1 || rank < 0 || rank >= nranks)
    throw std::system_error(
        make_error_code(errc::invalid_argument),
        "bootstrap: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " ranks");
  const bool full = full_directory(nranks);
  auto cannot_count = [&] {
    throw std::system_error(make_error_code(errc::unsupported),
                            "bootstrap: the launcher cannot count the hosts of " +
                                std::to_string(nranks) +
                                " ranks, and only a full directory (COCCL_DIRECTORY_FULL) could");
  };
  if (!full && !book.counts_hosts()) cannot_count();
  book.publish(self);
  std::optional<HostCount> known;
  if (!full && !(known = book.hosts())) cannot_count();
  DirectoryFrame frame;
  frame.header.nranks = static_cast<std::uint32_t>(nranks);
  frame.header.full = full ? 1 : 0;
  std::vector<int> needs;
  if (full) {
    needs.resize(nranks);
    for (int r = 0; r < nranks; ++r) needs[r] = r;
  } else {
    needs = needs_of(std::span<const int>(&rank, 1), nranks);
  }
  std::vector<int> others;
  others.reserve(needs.size());
  for (int r : needs)
    if (r != rank) others.push_back(r);
  const std::vector<PeerInfo> found = book.lookup_many(others);
  if (found.size() != others.size())
    bad_message("the launcher gave " + std::to_string(found.size()) + " entries for " +
                std::to_string(others.size()) + " ranks");
  frame.entries.reserve(needs.size());
  std::size_t next = 0;
  for (int r : needs) frame.entries.push_back({r, r == rank ? self : found[next++], 1});
  if (full) {
    // Every entry is here: count the hosts as a root would (same host_hash, same host).
    std::unordered_map<std::uint64_t, std::uint32_t> on_host;
    for (const DirectoryEntry& e : frame.entries) ++on_host[e.info.host_hash];
    for (DirectoryEntry& e : frame.entries) e.host_ranks = on_host[e.info.host_hash];
    frame.header.hosts = static_cast<std::uint32_t>(on_host.size());
  } else {
    if (known->hosts < 1 || known->hosts > static_cast<std::uint32_t>(nranks) ||
        known->host_ranks < 1 || known->host_ranks > static_cast<std::uint32_t>(nranks))
      bad_message("the launcher counts " + std::to_string(known->hosts) + " hosts and " +
                  std::to_string(known->host_ranks) + " ranks on this one, of " +
                  std::to_string(nranks) + " ranks");
    frame.header.hosts = known->hosts;
    // A rank keeps only its own host's count (Directory::assign); the others' stay 1.
    for (DirectoryEntry& e : frame.entries)
      if (e.rank == rank) e.host_ranks = known->host_ranks;
  }
  return frame;
}

}  // namespace coccl::transport
