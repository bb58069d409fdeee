#include "attacker.hpp"

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <fstream>
#include <functional>
#include <string>

#include "collectives/comm.hpp"
#include "transport/hmac.hpp"
#include "transport/wire.hpp"

namespace coccl::test {

TwoRanks::TwoRanks(const UniqueId& id, std::size_t count) : id_(id), count_(count) {
  for (int r = 0; r < 2; ++r) threads_.emplace_back([this, r] { run(r); });
  formed_.wait();
}

TwoRanks::~TwoRanks() {
  if (!released_) go_.count_down();
  for (auto& t : threads_) t.join();
}

tcp::endpoint TwoRanks::listener(int r) const {
  return detail::impl_of(comms_[r])->peers().self_info().endpoint();
}

std::vector<TwoRanks::Result> TwoRanks::all_reduce() {
  released_ = true;
  go_.count_down();
  for (auto& t : threads_) t.join();
  threads_.clear();
  return results_;
}

void TwoRanks::run(int r) {
  try {
    comms_[r] = Communicator::create(id_, r, 2);
  } catch (const std::system_error& e) {
    results_[r].ec = e.code();
  }
  formed_.count_down();
  go_.wait();
  if (!results_[r].ec && released_) {
    std::vector<float> in(count_, static_cast<float>(r + 1));
    results_[r].out.assign(count_, -1.0f);
    try {
      comms_[r].all_reduce(in.data(), results_[r].out.data(), count_, DataType::float32,
                           ReduceOp::sum);
    } catch (const std::system_error& e) {
      results_[r].ec = e.code();
    }
  }
  // Every rank finishes before any destroys (see tests/unit/destroy_test.cpp).
  finished_.arrive_and_wait();
  comms_[r].destroy();
}

bool summed(const TwoRanks::Result& r) {
  if (r.ec || r.out.empty()) return false;
  for (float v : r.out)
    if (v != 3.0f) return false;
  return true;
}

std::vector<std::unique_ptr<tcp::socket>> connect_many(asio::io_context& io, tcp::endpoint ep,
                                                       int n) {
  std::vector<std::unique_ptr<tcp::socket>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<tcp::socket>(io));
    out.back()->connect(ep);
  }
  return out;
}

void open_handshake(tcp::socket& s) {
  std::uint8_t hello[transport::Channel::dialler_hello_size];
  const std::uint32_t magic = 0x44434343u, version = 2;  // wire.cpp: dialler_magic, wire_version
  std::memcpy(hello, &magic, 4);
  std::memcpy(hello + 4, &version, 4);
  detail::random_bytes(std::span(hello + 8, transport::Channel::nonce_size));
  asio::write(s, asio::buffer(hello));
  std::uint8_t answer[transport::Channel::listener_hello_size];
  asio::read(s, asio::buffer(answer));
}

int count_closed(asio::io_context& io, std::vector<std::unique_ptr<tcp::socket>>& sockets,
                 std::chrono::steady_clock::duration limit, std::size_t* received) {
  int closed = 0;
  std::size_t bytes = 0;
  bool counting = true;
  std::vector<std::array<char, 256>> bufs(sockets.size());
  std::function<void(std::size_t)> arm = [&](std::size_t i) {
    sockets[i]->async_read_some(asio::buffer(bufs[i]),
                                [&, i](boost::system::error_code ec, std::size_t n) {
                                  if (!counting) return;
                                  bytes += n;
                                  if (ec) {
                                    if (++closed == static_cast<int>(sockets.size())) io.stop();
                                    return;
                                  }
                                  arm(i);
                                });
  };
  for (std::size_t i = 0; i < sockets.size(); ++i) arm(i);
  io.restart();
  io.run_for(limit);
  // Reads still pending end here, on this thread, before `bufs` goes away.
  counting = false;
  for (auto& s : sockets) {
    boost::system::error_code ignored;
    s->cancel(ignored);
  }
  io.restart();
  io.run();
  if (received) *received = bytes;
  return closed;
}

std::size_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

}  // namespace coccl::test
