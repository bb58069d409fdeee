// Fuzz target: a UniqueId as ranks receive it, as text (UniqueId::from_string) or as 128 bytes
// (transport::decode, which every rank runs before dialling the root). The first byte picks which.
// Bad text must be errc::invalid_argument; whatever parses must print back to the same id, and a
// decoded id must encode to an id that decodes to the same root address and secret.
#include <coccl/unique_id.hpp>

#include "tests/fuzz/fuzz_input.hpp"
#include "transport/bootstrap.hpp"

using namespace coccl;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const bool as_text = in.get<std::uint8_t>() & 1;
  UniqueId id;
  if (as_text) {
    const std::string text = fuzz::text_of(in.rest());
    if (fuzz::rejects(errc::invalid_argument, [&] { id = UniqueId::from_string(text); })) return 0;
    if (UniqueId::from_string(id.to_string()) != id) fuzz::violated("text round trip");
  } else {
    auto b = in.take(id.bytes.size());
    std::copy(b.begin(), b.end(), id.bytes.begin());
  }
  transport::RootAddress root;
  if (fuzz::rejects(errc::invalid_argument, [&] { root = transport::decode(id); })) return 0;
  transport::RootAddress again = transport::decode(transport::encode(root));
  if (again.endpoint() != root.endpoint() || again.secret != root.secret)
    fuzz::violated("a decoded UniqueId does not survive encoding");
  return 0;
}
