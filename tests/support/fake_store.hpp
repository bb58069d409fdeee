// tests/support/fake_store.hpp: a TCPStore server speaking torch.distributed's wire protocol
// (VALIDATE, PING, SET, GET, ADD, WAIT), for tests of coccl's launcher client on machines without
// PyTorch. It records every key set, so tests can check what the ranks published.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace coccl::test {

class FakeStore {
 public:
  /// Listens on 127.0.0.1 on a free port and serves on its own thread until destroyed.
  FakeStore();
  ~FakeStore();
  FakeStore(const FakeStore&) = delete;
  FakeStore& operator=(const FakeStore&) = delete;

  std::uint16_t port() const;
  /// A copy of the current contents.
  std::map<std::string, std::string> contents() const;
  /// Number of connections that sent a valid VALIDATE query.
  int validated_clients() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace coccl::test
