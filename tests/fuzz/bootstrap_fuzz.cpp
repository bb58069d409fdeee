// Fuzz target: the payloads of bootstrap and link-setup frames (transport/bootstrap_messages, the
// address table and lookups of transport/directory) and
// the abort notices of established links (transport/socket_connection), and, where the ib
// transport is built, the RDMA address a peer sends. The first byte picks the decoder; the rest
// is the payload. Bad input must be errc::bad_message; what decodes must encode to the same bytes.
#include "tests/fuzz/fuzz_input.hpp"
#include "transport/bootstrap_messages.hpp"
#include "transport/directory.hpp"
#include "transport/socket_connection.hpp"
#if COCCL_HAVE_IB
#include "transport/ib_link.hpp"
#endif

using namespace coccl;
using namespace coccl::transport;

namespace {

void same(const std::vector<std::uint8_t>& encoded, std::span<const std::uint8_t> payload) {
  if (!std::equal(encoded.begin(), encoded.end(), payload.begin(), payload.end()))
    fuzz::violated("a decoded message does not encode to its bytes");
}

// PeerInfo travels as its object representation, padding included, so entries are compared field
// by field.
bool same_info(const PeerInfo& a, const PeerInfo& b) {
  return a.addr == b.addr && a.family == b.family && a.caps == b.caps && a.port == b.port &&
         a.host_hash == b.host_hash && a.pid == b.pid;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const auto which = in.get<std::uint8_t>();
  switch (which % 10) {
    case 0: {
      // A hello, or a host leader's frame of them (the magic tells them apart).
      auto payload = in.rest();
      auto same_hello = [](const Hello& a, const Hello& b) {
        return a.rank == b.rank && a.nranks == b.nranks && same_info(a.info, b.info) &&
               a.roots == b.roots && a.ids == b.ids;
      };
      fuzz::rejects(errc::bad_message, [&] {
        Hello h = decode_hello(payload);
        if (!same_hello(decode_hello(encode_hello(h)), h))
          fuzz::violated("a hello changed in encoding");
      });
      fuzz::rejects(errc::bad_message, [&] {
        std::vector<Hello> hs = decode_hellos(payload);
        if (hs.empty() || hs.size() > max_hellos_per_frame)
          fuzz::violated("a frame of hellos of an impossible count");
        std::vector<Hello> again = decode_hellos(encode_hellos(hs));
        if (!std::equal(hs.begin(), hs.end(), again.begin(), again.end(), same_hello))
          fuzz::violated("hellos changed in encoding");
      });
      break;
    }
    case 1: {
      // The table's expected size comes from the receiving rank, not from the payload.
      const int nranks = in.get<std::uint8_t>();
      auto payload = in.rest();
      fuzz::rejects(errc::bad_message, [&] {
        DirectoryFrame table = decode_directory(payload, nranks);
        if (table.header.full && static_cast<int>(table.entries.size()) != nranks)
          fuzz::violated("a full table of the wrong size");
        for (const DirectoryEntry& e : table.entries)
          if (e.rank < 0 || e.rank >= nranks) fuzz::violated("a table entry out of range");
        same(encode_directory(table.header, table.entries), payload);
      });
      break;
    }
    case 2: {
      auto payload = in.rest();
      fuzz::rejects(errc::bad_message, [&] { link_request_ranks(payload); });
      // A request that decodes is the whole payload (trailing bytes are refused).
      fuzz::rejects(errc::bad_message,
                    [&] { same(encode_link_request(decode_link_request(payload)), payload); });
      break;
    }
    case 3: {
      auto payload = in.rest();
      fuzz::rejects(errc::bad_message,
                    [&] { same(encode_link_reply(decode_link_reply(payload)), payload); });
      break;
    }
    case 4:
    case 5: {
      const LinkHeader h{LinkHeader::abort, in.get<std::uint32_t>(), in.get<std::uint64_t>()};
      fuzz::rejects(errc::bad_message, [&] {
        if (abort_text_size(h) > max_abort_text) fuzz::violated("abort text over the limit");
      });
      const errc code = abort_code(h.fingerprint);
      if (make_error_code(code).message().empty()) fuzz::violated("abort code without a message");
      break;
    }
    case 6: {
      auto payload = in.rest();
#if COCCL_HAVE_IB
      fuzz::rejects(errc::bad_message, [&] {
        auto encoded = ib::LinkAddress::decode(payload).encode();
        same(encoded, payload);
      });
#endif
      (void)payload;
      break;
    }
    case 8: {
      const int nranks = in.get<std::uint16_t>();
      auto payload = in.rest();
      fuzz::rejects(errc::bad_message, [&] {
        const int target = decode_whois(payload, nranks);
        if (target < 0 || target >= nranks) fuzz::violated("a lookup of a rank out of range");
        same(encode_whois(target), payload);
      });
      break;
    }
    case 9: {
      const int nranks = in.get<std::uint16_t>();
      auto payload = in.rest();
      fuzz::rejects(errc::bad_message, [&] {
        auto answer = decode_whois_answer(payload, nranks);
        for (const auto& [rank, info] : answer)
          if (rank < 0 || rank >= nranks) fuzz::violated("an answer naming a rank out of range");
        same(encode_whois_answer(answer), payload);
      });
      break;
    }
    case 7: {
      // A share names only ranks of its sender's share, a token none, and it survives encoding
      // unchanged.
      auto payload = in.rest();
      fuzz::rejects(errc::bad_message, [&] {
        Share sh = decode_share(payload);
        const int roots = static_cast<int>(sh.roots), from = static_cast<int>(sh.from);
        for (const DirectoryEntry& e : sh.entries)
          if (e.rank < share_begin(from, sh.nranks, roots) ||
              e.rank >= share_begin(from + 1, sh.nranks, roots))
            fuzz::violated("a share naming a rank outside its sender's share");
        if (sh.round != Share::no_round && !sh.entries.empty())
          fuzz::violated("a barrier token with entries");
        same(encode_share(sh), payload);
      });
      break;
    }
  }
  return 0;
}
