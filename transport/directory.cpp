#include "transport/directory.hpp"

#include <algorithm>
#include <bit>

#include "transport/wire.hpp"

namespace coccl::params {

config::Param<std::int64_t> directory_full{
    "COCCL_DIRECTORY_FULL", 64,
    "communicators of up to this many ranks give every rank every rank's address; larger ones "
    "give a rank only the addresses of its partners in the algorithms and find the others by "
    "asking (at most log2(N) hops)"};

}  // namespace coccl::params

namespace coccl::transport {

namespace {

// A rank is 31 bits: its hypercube partners are r XOR 2^k for k below the width of nranks - 1.
int width(int nranks) {
  return nranks <= 1 ? 0 : std::bit_width(static_cast<unsigned>(nranks - 1));
}

constexpr std::size_t entry_bytes = sizeof(std::int32_t) + sizeof(PeerInfo) + sizeof(std::uint32_t);
constexpr std::size_t max_hops_answered = 64;

void put_entry(Writer& w, const DirectoryEntry& e) { w.put(e.rank).put(e.info).put(e.host_ranks); }

DirectoryEntry get_entry(Reader& r, int nranks) {
  DirectoryEntry e;
  e.rank = r.get<std::int32_t>();
  e.info = r.get<PeerInfo>();
  e.host_ranks = r.get<std::uint32_t>();
  if (e.rank < 0 || e.rank >= nranks) bad_message("a directory entry of a rank out of range");
  if (e.host_ranks < 1 || e.host_ranks > static_cast<std::uint32_t>(nranks))
    bad_message("a directory entry with an impossible count of ranks on its host");
  return e;
}

}  // namespace

void directory_needs(int rank, int nranks, std::vector<int>& out) {
  out.push_back(rank);
  for (int k = 0; k < width(nranks); ++k) {
    const int partner = rank ^ (1 << k);
    if (partner < nranks) out.push_back(partner);
  }
  if (nranks > 1) {
    out.push_back((rank + 1) % nranks);
    out.push_back((rank + nranks - 1) % nranks);
  }
  if (rank > 0) out.push_back((rank - 1) / 2);
  for (long long child : {2LL * rank + 1, 2LL * rank + 2})
    if (child < nranks) out.push_back(static_cast<int>(child));
}

std::vector<int> needs_of(std::span<const int> ranks, int nranks) {
  std::vector<int> out;
  out.reserve(ranks.size() * static_cast<std::size_t>(width(nranks) + 6));
  for (int r : ranks) directory_needs(r, nranks, out);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> range_needs(int first, int last, int nranks) {
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(std::max(last - first, 0)) *
              static_cast<std::size_t>(width(nranks) + 6));
  for (int r = first; r < last; ++r) directory_needs(r, nranks, out);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> next_hops(int from, int to) {
  std::vector<int> hops;
  const unsigned clear = static_cast<unsigned>(from) & ~static_cast<unsigned>(to);
  const unsigned set = static_cast<unsigned>(to) & ~static_cast<unsigned>(from);
  // Lowest bits first: the ranks on the way keep the asker's high bits, then take the target's,
  // so lookups spread over the ranks. Highest first would send every lookup that clears bits
  // through the few ranks with low numbers (rank 1 answered 958 of them in a split of 16,384).
  const unsigned bits = clear != 0 ? clear : set;
  for (int k = 0; k <= 30; ++k)
    if (bits & (1u << k)) hops.push_back(from ^ (1 << k));
  return hops;
}

std::vector<std::uint8_t> encode_directory(const DirectoryHeader& h,
                                           std::span<const DirectoryEntry> entries) {
  Writer w;
  w.bytes().reserve(4 * sizeof(std::uint32_t) + entries.size() * entry_bytes);
  w.put(h.nranks).put(h.hosts).put(h.full).put(static_cast<std::uint32_t>(entries.size()));
  for (const DirectoryEntry& e : entries) put_entry(w, e);
  return std::move(w.bytes());
}

DirectoryFrame decode_directory(std::span<const std::uint8_t> payload, int nranks) {
  Reader r(payload);
  DirectoryFrame f;
  f.header.nranks = r.get<std::uint32_t>();
  f.header.hosts = r.get<std::uint32_t>();
  f.header.full = r.get<std::uint32_t>();
  const auto count = r.get<std::uint32_t>();
  if (static_cast<int>(f.header.nranks) != nranks)
    bad_message("an address table for another number of ranks");
  if (f.header.hosts < 1 || f.header.hosts > f.header.nranks || f.header.full > 1)
    bad_message("an address table with an impossible header");
  // The count is checked against the payload before anything is allocated for it.
  if (count > static_cast<std::uint32_t>(nranks) || count > payload.size() / entry_bytes)
    bad_message("an address table longer than its payload");
  if (f.header.full && static_cast<int>(count) != nranks)
    bad_message("a full address table without every rank");
  f.entries.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    f.entries.push_back(get_entry(r, nranks));
    if (i > 0 && f.entries[i].rank <= f.entries[i - 1].rank)
      bad_message("an address table out of order");
  }
  if (!r.done()) bad_message("trailing bytes after the address table");
  return f;
}

std::vector<std::uint8_t> directory_for(const DirectoryFrame& held, std::span<const int> needs) {
  if (held.header.full) return encode_directory(held.header, held.entries);
  std::vector<DirectoryEntry> out;
  out.reserve(needs.size());
  auto it = held.entries.begin();
  for (int r : needs) {
    it = std::lower_bound(it, held.entries.end(), r,
                          [](const DirectoryEntry& e, int rank) { return e.rank < rank; });
    if (it == held.entries.end() || it->rank != r)
      bad_message("the address table held here lacks rank " + std::to_string(r));
    out.push_back(*it);
  }
  return encode_directory(held.header, out);
}

void Directory::assign(const DirectoryFrame& frame, int rank) {
  header_ = frame.header;
  entries_.clear();
  std::vector<int> needs;
  if (!frame.header.full) {
    directory_needs(rank, static_cast<int>(frame.header.nranks), needs);
    std::sort(needs.begin(), needs.end());
    needs.erase(std::unique(needs.begin(), needs.end()), needs.end());
  }
  entries_.reserve(frame.header.full ? frame.entries.size() : needs.size());
  for (const DirectoryEntry& e : frame.entries) {
    if (!frame.header.full && !std::binary_search(needs.begin(), needs.end(), e.rank)) continue;
    entries_.emplace(e.rank, e.info);
    if (e.rank == rank) host_ranks_ = e.host_ranks;
  }
  if (!find(rank)) bad_message("the address table lacks this rank's own entry");
  for (int r : needs)
    if (!find(r)) bad_message("the address table lacks rank " + std::to_string(r));
}

std::vector<std::uint8_t> encode_whois(std::int32_t target) {
  Writer w;
  w.put(target);
  return std::move(w.bytes());
}

std::int32_t decode_whois(std::span<const std::uint8_t> payload, int nranks) {
  Reader r(payload);
  const auto target = r.get<std::int32_t>();
  if (!r.done()) bad_message("trailing bytes after an address question");
  if (target < 0 || target >= nranks) bad_message("an address question for a rank out of range");
  return target;
}

std::vector<std::uint8_t> encode_whois_answer(std::span<const Located> entries) {
  Writer w;
  const std::size_t n = std::min(entries.size(), max_hops_answered);
  w.put(static_cast<std::uint32_t>(n));
  for (std::size_t i = 0; i < n; ++i) w.put(entries[i].first).put(entries[i].second);
  return std::move(w.bytes());
}

std::vector<Located> decode_whois_answer(std::span<const std::uint8_t> payload, int nranks) {
  Reader r(payload);
  const auto count = r.get<std::uint32_t>();
  if (count == 0 || count > max_hops_answered) bad_message("an address answer of no use");
  std::vector<Located> out;
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto rank = r.get<std::int32_t>();
    const auto info = r.get<PeerInfo>();
    if (rank < 0 || rank >= nranks) bad_message("an address answer names a rank out of range");
    out.emplace_back(rank, info);
  }
  if (!r.done()) bad_message("trailing bytes after an address answer");
  return out;
}

}  // namespace coccl::transport
