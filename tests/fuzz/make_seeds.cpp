// Writes the seed corpora of the fuzz targets: real messages made by the library's own encoders
// (frames sealed on the wire target's connection, bootstrap payloads, a UniqueId, store answers)
// and a few edge cases. Usage: fuzz_seeds DIR (writes DIR/<target>/<seed>). The corpora in the
// repository were made by it and then minimised with libFuzzer's -merge=1.
#include <coccl/unique_id.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fuzz/wire_fixture.hpp"
#include "transport/bootstrap.hpp"
#include "transport/bootstrap_messages.hpp"
#include "transport/directory.hpp"
#include "transport/socket_connection.hpp"

using namespace coccl;
using namespace coccl::transport;
using Bytes = std::vector<std::uint8_t>;

namespace {

std::filesystem::path root;

void seed(const std::string& target, const std::string& name, const Bytes& b) {
  std::filesystem::create_directories(root / target);
  std::ofstream(root / target / name, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void seed(const std::string& target, const std::string& name, const std::string& s) {
  seed(target, name, Bytes(s.begin(), s.end()));
}

template <typename T>
void put(Bytes& b, const T& v) {
  auto p = reinterpret_cast<const std::uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}

void append(Bytes& b, const Bytes& more) { b.insert(b.end(), more.begin(), more.end()); }

PeerInfo info(int port) {
  PeerInfo p = PeerInfo::from(
      {boost::asio::ip::make_address("10.0.0.7"), static_cast<unsigned short>(port)});
  p.caps = PeerInfo::cap_ib;
  return p;
}

void wire_seeds() {
  using namespace coccl::fuzz::wire;
  auto hello = Channel::dialler_hello(dialler_nonce);
  seed("wire", "dialler_hello", [&] {
    Bytes b{0};
    b.insert(b.end(), hello.begin(), hello.end());
    return b;
  }());
  std::array<std::uint8_t, Channel::listener_hello_size> answer{};
  Channel::listener_side(secret, hello, listener_nonce, answer);
  seed("wire", "listener_answer", [&] {
    Bytes b{1};
    b.insert(b.end(), answer.begin(), answer.end());
    return b;
  }());
  // Frames from the dialler: a hello, a connect request, an empty control frame.
  Pair p = connected();
  Bytes stream{2};
  append(stream, p.dialler.seal(FrameType::hello, encode_hello({1, 4, info(4000)})));
  append(stream, p.dialler.seal(FrameType::connect,
                                encode_link_request({0, 1, 1, 8, 65536, Bytes{'/', 's'}})));
  append(stream, p.dialler.seal(FrameType::ctrl, {}));
  seed("wire", "dialler_frames", stream);
  // The table from the listener's side.
  Bytes back{2};
  const std::vector<DirectoryEntry> two{{0, info(4000), 2}, {1, info(4001), 2}};
  append(back, p.listener.seal(FrameType::table, encode_directory({2, 1, 1}, two)));
  seed("wire", "listener_frames", back);
  seed("wire", "round_trip", Bytes{3, 0, 1, 3, 'a', 'b', 'c', 0, 0, 5, 0, 0x10, 0x80});
}

void bootstrap_seeds() {
  auto with = [](std::uint8_t which, Bytes payload) {
    payload.insert(payload.begin(), which);
    return payload;
  };
  seed("bootstrap", "hello", with(0, encode_hello({2, 3, info(5000), 2, 0x1234})));
  const std::vector<Hello> hellos{{3, 8, info(5001), 1, 0}, {5, 8, info(5002), 1, 0}};
  seed("bootstrap", "hellos", with(0, encode_hellos(hellos)));
  Share entries;
  entries.nranks = 5;
  entries.roots = 2;
  entries.from = 1;
  entries.to = 0;
  entries.ids = 0x1234;
  entries.entries = {{3, info(5003), 2}, {4, info(5004), 2}};
  seed("bootstrap", "share", with(7, encode_share(entries)));
  Share token = entries;
  token.entries.clear();
  token.round = 0;
  token.low_host = 1;
  token.high_host = 2;
  token.hosts = 2;
  seed("bootstrap", "token", with(7, encode_share(token)));
  const std::vector<DirectoryEntry> three{
      {0, info(5000), 3}, {1, info(5001), 3}, {2, info(5002), 3}};
  Bytes table = encode_directory({3, 1, 1}, three);
  table.insert(table.begin(), 3);
  seed("bootstrap", "table", with(1, table));
  // A sparse table (rank 1 of 5 holds 0, 1, 3 and 4 of them, as its needs say).
  const std::vector<DirectoryEntry> sparse{
      {0, info(5000), 1}, {1, info(5001), 1}, {3, info(5003), 1}, {4, info(5004), 1}};
  Bytes part = encode_directory({5, 5, 0}, sparse);
  part.insert(part.begin(), 5);
  seed("bootstrap", "table_sparse", with(1, part));
  Bytes whois = encode_whois(4);
  whois.insert(whois.begin(), {5, 0});
  seed("bootstrap", "whois", with(8, whois));
  const std::vector<Located> hops{{2, info(5002)}, {1, info(5001)}};
  Bytes answer = encode_whois_answer(hops);
  answer.insert(answer.begin(), {5, 0});
  seed("bootstrap", "whois_answer", with(9, answer));
  seed("bootstrap", "link_request",
       with(2, encode_link_request({0, 2, 1, 8, 1 << 20, Bytes{'/', 'c', 'o', 'c'}})));
  seed("bootstrap", "link_reply", with(3, encode_link_reply({Bytes(40, 7), 2})));
  Bytes abort{4};
  put<std::uint32_t>(abort, 5);
  put<std::uint64_t>(abort, 12);
  seed("bootstrap", "abort", abort);
  Bytes ib{6};
  ib.resize(1 + 16, 0xfe);  // gid
  put<std::uint16_t>(ib, 1);
  put<std::uint8_t>(ib, 5);
  put<std::uint64_t>(ib, 0x7f0000001000);
  put<std::uint32_t>(ib, 0x1234);
  put<std::uint64_t>(ib, 8);
  put<std::uint64_t>(ib, 65536);
  put<std::uint64_t>(ib, 65536);
  put<std::uint32_t>(ib, 2);
  for (std::uint32_t q : {101u, 1u, 102u, 2u}) put(ib, q);
  seed("bootstrap", "ib_address", ib);
}

void store_seeds() {
  Bytes ok;
  put<std::uint32_t>(ok, 0x636f63u);
  put<std::uint8_t>(ok, 0);
  const std::string value(256, 'a');
  put<std::uint64_t>(ok, value.size());
  ok.insert(ok.end(), value.begin(), value.end());
  put<std::int64_t>(ok, 3);
  seed("store", "answers", ok);
  Bytes big;
  put<std::uint32_t>(big, 0x636f63u);
  put<std::uint8_t>(big, 0);
  put<std::uint64_t>(big, std::uint64_t(1) << 40);
  seed("store", "huge_value", big);
}

void unique_id_seeds() {
  Secret s{};
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<std::uint8_t>(i * 7);
  for (const char* host : {"192.168.1.20", "fe80::1"}) {
    const RootAddress root{
        PeerInfo::from(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address(host), 29500)),
        s};
    UniqueId id = encode(root);
    const std::string text = id.to_string();
    seed("unique_id", std::string("text_v") + (host[0] == '1' ? "4" : "6"), "\x01" + text);
    Bytes raw{0};
    raw.insert(raw.end(), id.bytes.begin(), id.bytes.end());
    seed("unique_id", std::string("bytes_v") + (host[0] == '1' ? "4" : "6"), raw);
  }
}

void text_seeds() {
  int i = 0;
  for (const char* t : {"127.0.0.1:29500", "[::1]:80", "node-12:7", "h:65535", "h:65536", "h:-1",
                        "h:0080", ":1", "h:"})
    seed("endpoint", "e" + std::to_string(i++), std::string(t));
  i = 0;
  for (const char* t : {"1", "off", "0x10K", "-3G", "1e3", "nan", "inf", "1e300", "-0.5", "300"})
    seed("config", "c" + std::to_string(i++), std::string(t));
}

void validate_seeds() {
  // n, rank, kind, type, op, root, count flags, send, recv, shape: see validate_fuzz.cpp.
  seed("validate", "all_reduce", Bytes{3, 1, 0, 7, 0, 0, 16, 1, 2, 0, 1, 0, 0});
  seed("validate", "broadcast_root2", Bytes{3, 2, 1, 8, 0, 2, 4, 1, 1, 0, 0, 1, 1});
  seed("validate", "all_gather_huge", [] {
    Bytes b{4, 0, 3, 4, 0, 0, 0x80};
    put<std::uint64_t>(b, std::uint64_t(1) << 61);
    b.insert(b.end(), {1, 2, 0});
    return b;
  }());
  seed("validate", "all_to_allv", Bytes{2, 0, 6, 2, 0, 0, 4, 1, 2, 2, 1, 1, 0, 0, 1, 1, 0, 0});
  seed("validate", "p2p", Bytes{2, 0, 9, 7, 0, 0, 0, 0, 0, 2, 3, 4, 7, 1, 2, 4, 7, 1});
}

void nccl_seeds() {
  // Opcodes and argument bytes: see nccl_api_fuzz.cpp.
  seed("nccl_api", "all_reduce", Bytes{0, 0x08, 16, 7, 0, 0});
  seed("nccl_api", "group_send_recv", Bytes{11, 9, 0x08, 8, 2, 0, 0, 10, 0x08, 8, 2, 0, 0, 12});
  seed("nccl_api", "premulsum", Bytes{13, 7, 1, 0, 0, 0x08, 4, 7, 0x40, 0, 14, 1});
  seed("nccl_api", "queries", Bytes{15, 0, 15, 7, 16, 0, 17, 18, 1, 0, 0, 0, 0, 19, 0});
  seed("nccl_api", "overflow", [] {
    Bytes b{4, 0x88};
    put<std::uint64_t>(b, ~std::uint64_t(0) / 2);
    b.insert(b.end(), {7, 0, 0, 12});
    return b;
  }());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  root = argv[1];
  wire_seeds();
  bootstrap_seeds();
  store_seeds();
  unique_id_seeds();
  text_seeds();
  validate_seeds();
  nccl_seeds();
  return 0;
}
