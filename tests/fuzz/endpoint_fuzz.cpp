// Fuzz target: endpoint text (COCCL_COMM_ID=host:port) as transport::split_endpoint reads it,
// then, where the host is a numeric address, as parse_endpoint makes the endpoint (names are not
// resolved here: that would ask the network). Bad text must be errc::invalid_argument.
#include <boost/asio/ip/address.hpp>

#include "tests/fuzz/fuzz_input.hpp"
#include "transport/wire.hpp"

using namespace coccl;
using namespace coccl::transport;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  const std::string text = fuzz::text_of(in.rest());
  HostPort hp;
  if (fuzz::rejects(errc::invalid_argument, [&] { hp = split_endpoint(text); })) return 0;
  const std::size_t colon = text.rfind(':');
  const std::string digits = text.substr(colon + 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos || std::stoul(digits) != hp.port)
    fuzz::violated("the port is not the number after the last colon");
  const std::string host = text.substr(0, colon);
  if (hp.host != host && "[" + hp.host + "]" != host) fuzz::violated("the host is not the text's");
  boost::system::error_code ec;
  auto addr = boost::asio::ip::make_address(hp.host, ec);
  if (ec) return 0;
  auto ep = parse_endpoint(text);
  if (ep.address() != addr || ep.port() != hp.port) fuzz::violated("parse_endpoint disagrees");
  return 0;
}
