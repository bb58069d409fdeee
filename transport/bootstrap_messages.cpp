#include "transport/bootstrap_messages.hpp"

#include <boost/system/system_error.hpp>
#include <coccl/error.hpp>
#include <sstream>
#include <system_error>

#include "transport/wire.hpp"

namespace coccl::transport {
namespace {

constexpr std::uint32_t hello_magic = 0x4f4c4548u;
constexpr std::uint32_t hellos_magic = 0x534c4548u;  // "HELS"
constexpr std::uint32_t share_magic = 0x52414853u;   // "SHAR"

constexpr std::uint32_t notice_magic = 0x4543544eu;  // "NTCE"

}  // namespace

[[noreturn]] void bad_message(const std::string& what) {
  throw std::system_error(make_error_code(errc::bad_message), what);
}

std::string endpoint_text(const boost::asio::ip::tcp::endpoint& ep) {
  std::ostringstream out;
  out << ep;
  return out.str();
}

std::string drop_reason(const std::exception& e) {
  if (auto* b = dynamic_cast<const boost::system::system_error*>(&e))
    return "connection ended before it authenticated (" + b->code().message() + ")";
  return e.what();
}

std::vector<std::uint8_t> encode_notice(int from, const std::string& why) {
  Writer w;
  w.put(notice_magic).put<std::int32_t>(from);
  const std::string text = why.substr(0, 2048);
  w.put_bytes({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
  return std::move(w.bytes());
}

std::string printable(std::span<const std::uint8_t> text) {
  std::string out(text.begin(), text.end());
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return out;
}

std::string decode_notice(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  if (r.get<std::uint32_t>() != notice_magic) bad_message("not a notice");
  const int from = r.get<std::int32_t>();
  auto text = r.get_bytes();
  if (!r.done()) bad_message("trailing bytes after a notice");
  return "rank " + std::to_string(from) + " has failed: " + printable(text);
}

int notice_sender(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  if (r.get<std::uint32_t>() != notice_magic) bad_message("not a notice");
  return r.get<std::int32_t>();
}

namespace {

// A hello's fields, alone or as one of a leader's frame.
void put_hello(Writer& w, const Hello& h) {
  w.put(h.rank).put(h.nranks).put(h.info).put(h.roots).put(h.ids);
}
constexpr std::size_t hello_bytes =
    2 * sizeof(std::int32_t) + sizeof(PeerInfo) + sizeof(std::uint32_t) + sizeof(std::uint64_t);

Hello get_hello(Reader& r) {
  Hello h;
  h.rank = r.get<std::int32_t>();
  h.nranks = r.get<std::int32_t>();
  h.info = r.get<PeerInfo>();
  h.roots = r.get<std::uint32_t>();
  h.ids = r.get<std::uint64_t>();
  return h;
}

}  // namespace

std::vector<std::uint8_t> encode_hello(const Hello& h) {
  Writer w;
  w.put(hello_magic);
  put_hello(w, h);
  return std::move(w.bytes());
}

Hello decode_hello(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  if (r.get<std::uint32_t>() != hello_magic) bad_message("bad hello");
  const Hello h = get_hello(r);
  if (!r.done()) bad_message("trailing bytes in hello");
  return h;
}

std::vector<std::uint8_t> encode_hellos(std::span<const Hello> hellos) {
  Writer w;
  w.put(hellos_magic).put(static_cast<std::uint32_t>(hellos.size()));
  for (const Hello& h : hellos) put_hello(w, h);
  return std::move(w.bytes());
}

std::vector<Hello> decode_hellos(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  if (r.get<std::uint32_t>() != hellos_magic) bad_message("bad hellos");
  const auto count = r.get<std::uint32_t>();
  if (count == 0 || count > max_hellos_per_frame || count > payload.size() / hello_bytes)
    bad_message("hellos frame with an impossible count (" + std::to_string(count) + ")");
  std::vector<Hello> hellos;
  hellos.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) hellos.push_back(get_hello(r));
  if (!r.done()) bad_message("trailing bytes in hellos");
  return hellos;
}

int root_of(int rank, int nranks, int roots) {
  return static_cast<int>(static_cast<std::int64_t>(rank) * roots / nranks);
}

int share_begin(int index, int nranks, int roots) {
  return static_cast<int>((static_cast<std::int64_t>(index) * nranks + roots - 1) / roots);
}

int barrier_rounds(int roots) {
  int rounds = 0;
  while ((1LL << rounds) < roots) ++rounds;
  return rounds;
}

std::vector<std::uint8_t> encode_share(const Share& s) {
  Writer w;
  w.bytes().reserve(64 + s.entries.size() * (sizeof(std::int32_t) + sizeof(PeerInfo) + 4));
  w.put(share_magic).put(s.nranks).put(s.roots).put(s.from).put(s.to).put(s.ids).put(s.full);
  w.put(s.round).put(s.low_host).put(s.high_host).put(s.hosts);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(s.entries.size()));
  for (const DirectoryEntry& e : s.entries) w.put(e.rank).put(e.info).put(e.host_ranks);
  return std::move(w.bytes());
}

Share decode_share(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  if (r.get<std::uint32_t>() != share_magic) bad_message("not a share of the address table");
  Share s;
  s.nranks = r.get<std::int32_t>();
  s.roots = r.get<std::uint32_t>();
  s.from = r.get<std::uint32_t>();
  s.to = r.get<std::uint32_t>();
  s.ids = r.get<std::uint64_t>();
  s.full = r.get<std::uint32_t>();
  s.round = r.get<std::uint32_t>();
  s.low_host = r.get<std::uint64_t>();
  s.high_host = r.get<std::uint64_t>();
  s.hosts = r.get<std::uint32_t>();
  const auto count = r.get<std::uint32_t>();
  if (s.nranks < 2 || s.roots < 2 || s.roots > static_cast<std::uint32_t>(s.nranks) ||
      s.from >= s.roots || s.to >= s.roots || s.from == s.to || s.full > 1)
    bad_message("a share with impossible settings");
  const int roots = static_cast<int>(s.roots);
  if (s.round != Share::no_round) {
    if (s.round >= static_cast<std::uint32_t>(barrier_rounds(roots)) || count != 0 || s.hosts < 1 ||
        s.hosts > static_cast<std::uint32_t>(s.nranks) || s.low_host > s.high_host)
      bad_message("a roots' barrier token with impossible settings");
  }
  const int first = share_begin(static_cast<int>(s.from), s.nranks, roots);
  const int last = share_begin(static_cast<int>(s.from) + 1, s.nranks, roots);
  // The count is checked against the share and the payload before anything is allocated for it.
  constexpr std::size_t entry_bytes = sizeof(std::int32_t) + sizeof(PeerInfo) + 4;
  if (static_cast<std::int64_t>(count) > last - first || count > payload.size() / entry_bytes)
    bad_message("a share longer than its sender's ranks or its payload");
  s.entries.resize(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    DirectoryEntry& e = s.entries[i];
    e.rank = r.get<std::int32_t>();
    e.info = r.get<PeerInfo>();
    e.host_ranks = r.get<std::uint32_t>();
    if (e.rank < first || e.rank >= last) bad_message("a share names a rank of another share");
    if (i > 0 && e.rank <= s.entries[i - 1].rank) bad_message("a share out of order");
    if (e.host_ranks < 1 || e.host_ranks > static_cast<std::uint32_t>(last - first))
      bad_message("a share entry with an impossible count of ranks on its host");
  }
  if (!r.done()) bad_message("trailing bytes after a share");
  return s;
}

std::vector<std::uint8_t> encode_link_request(const LinkRequest& q) {
  Writer w;
  w.put(q.from).put(q.to).put(q.kind).put(q.slots).put(q.slot_bytes);
  w.put_bytes(q.address).put(q.sockets).put(q.info);
  return std::move(w.bytes());
}

std::pair<std::int32_t, std::int32_t> link_request_ranks(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  auto from = r.get<std::int32_t>();
  auto to = r.get<std::int32_t>();
  return {from, to};
}

LinkRequest decode_link_request(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  LinkRequest q;
  q.from = r.get<std::int32_t>();
  q.to = r.get<std::int32_t>();
  q.kind = r.get<std::uint8_t>();
  q.slots = r.get<std::uint64_t>();
  q.slot_bytes = r.get<std::uint64_t>();
  q.address = r.get_bytes();
  q.sockets = r.get<std::uint32_t>();
  q.info = r.get<PeerInfo>();
  if (!r.done()) bad_message("trailing bytes after a link request");
  return q;
}

std::vector<std::uint8_t> encode_link_reply(const LinkReply& a) {
  Writer w;
  w.put_bytes(a.address).put(a.sockets);
  return std::move(w.bytes());
}

LinkReply decode_link_reply(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  LinkReply a;
  a.address = r.get_bytes();
  a.sockets = r.get<std::uint32_t>();
  if (!r.done()) bad_message("trailing bytes after a link reply");
  return a;
}

}  // namespace coccl::transport
