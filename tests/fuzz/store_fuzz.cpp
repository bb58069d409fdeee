// Fuzz target: a TCPStore server's answers as TcpStoreClient decodes them (transport/launcher.hpp):
// the PING echo, then a WAIT and GET exchange, then an ADD, read from the input as from the
// socket. An answer that breaks the protocol must be errc::bad_message, and input that ends early
// errc::timed_out (the client's deadline passing on a silent server).
#include "tests/fuzz/fuzz_input.hpp"
#include "transport/launcher.hpp"

using namespace coccl;
using namespace coccl::transport;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  StoreRead read = [&](void* p, std::size_t n) {
    if (in.left() < n) return false;
    auto b = in.take(n);
    std::memcpy(p, b.data(), n);
    return true;
  };
  const std::string where = "store:29500";
  auto answer = [&](auto&& step) {
    try {
      step();
      return true;
    } catch (const std::system_error& e) {
      if (e.code() != errc::bad_message && e.code() != errc::timed_out) throw;
      return false;
    }
  };
  const std::uint32_t nonce = 0x636f63u;
  if (!answer([&] { read_ping_answer(read, nonce, where); })) return 0;
  if (!answer([&] { read_wait_answer(read, "coccl/id/0", where, std::chrono::milliseconds(1)); }))
    return 0;
  if (!answer([&] {
        if (read_get_answer(read, "coccl/id/0", where).size() > (1u << 20))
          fuzz::violated("a value over the limit was accepted");
      }))
    return 0;
  answer([&] { read_add_answer(read, where); });
  return 0;
}
