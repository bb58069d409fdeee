// Fuzz target: the argument checks of the nccl.h C entry points (libnccl.so.2 from coccl), called
// as a C program would, with fuzzed counts, types, operators, roots, peers, null or real host
// buffers and group nesting, on a 1-rank host-memory communicator. Every call must return an
// ncclResult_t (never crash, never throw), and ncclInvalidArgument must come with a reason.
//
// The input is a list of calls. Real buffers are 4 KiB; a count of more bytes than that is passed
// with real buffers only where its byte size overflows size_t (so the library must refuse it),
// else with null ones (which it must refuse too): the library cannot know a host buffer's size,
// and overrunning one the caller made too small is the caller's error, not something to find here.
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/fuzz/fuzz_input.hpp"
#include "tests/fuzz/nccl_api_calls.h"

namespace {

constexpr std::size_t buffer_bytes = 4096;
alignas(64) std::uint8_t send_buffer[buffer_bytes];
alignas(64) std::uint8_t recv_buffer[buffer_bytes];

ncclComm_t make_comm() {
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess)
    coccl::fuzz::violated("cannot make the 1-rank communicator");
  return comm;
}

ncclComm_t comm() {
  static ncclComm_t c = make_comm();
  return c;
}

void check(ncclResult_t r) {
  if (static_cast<int>(r) < 0 || r >= ncclNumResults) coccl::fuzz::violated("not an ncclResult_t");
  if (r == ncclInvalidArgument && std::strlen(ncclGetLastError(nullptr)) == 0)
    coccl::fuzz::violated("ncclInvalidArgument without a reason");
}

struct Args {
  const void* send;
  void* recv;
  std::size_t count;
  int type;
  int op;
  int root;
  ncclComm_t comm;
};

Args args(coccl::fuzz::Input& in, const std::vector<int>& made_ops) {
  Args a{};
  const auto flags = in.get<std::uint8_t>();
  a.count = flags & 0x80 ? in.get<std::uint64_t>() : in.get<std::uint8_t>();
  a.type = flags & 0x40 ? in.get<std::int32_t>() : in.get<std::uint8_t>() % 13;
  const auto op_pick = in.get<std::uint8_t>();
  if (op_pick & 0x80)
    a.op = in.get<std::int32_t>();
  else if (op_pick & 0x40 && !made_ops.empty())
    a.op = made_ops[op_pick % made_ops.size()];
  else
    a.op = op_pick % 6;
  a.root = in.get<std::int8_t>() % 3;
  a.comm = flags & 0x20 ? nullptr : comm();
  // Buffers: none, distinct, or in place.
  switch ((flags >> 3) & 3) {
    case 0:
      break;
    case 1:
      a.send = send_buffer;
      a.recv = recv_buffer;
      break;
    case 2:
      a.send = recv_buffer;
      a.recv = recv_buffer;
      break;
    case 3:
      a.send = send_buffer;
      break;
  }
  // Bytes per element of each ncclDataType_t; a type out of range is refused whatever the buffers.
  static constexpr std::size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  if (a.type >= 0 && a.type < ncclNumTypes) {
    const std::size_t elt = sizes[a.type];
    if (a.count > buffer_bytes / elt && a.count <= SIZE_MAX / elt) a.send = a.recv = nullptr;
  }
  return a;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool quiet = ::setenv("COCCL_DEBUG_FILE", "/dev/null", 1) == 0;
  (void)quiet;
  coccl::fuzz::Input in(data, size);
  int open_groups = 0;
  std::vector<int> made_ops;
  std::vector<void*> registrations;
  for (int calls = 0; in.left() && calls < 32; ++calls) {
    const auto what = in.get<std::uint8_t>() % 20;
    if (what < 11) {
      Args a = args(in, made_ops);
      check(fuzz_nccl_collective(what, a.send, a.recv, a.count, a.type, a.op, a.root, a.comm));
      continue;
    }
    switch (what) {
      case 11:
        if (open_groups < 4) {
          check(ncclGroupStart());
          ++open_groups;
        }
        break;
      case 12: {
        ncclResult_t r = ncclGroupEnd();
        check(r);
        if (open_groups > 0)
          --open_groups;
        else if (r == ncclSuccess)
          coccl::fuzz::violated("ncclGroupEnd without a group succeeded");
        break;
      }
      case 13: {
        // A PreMulSum operator from a host scalar (send_buffer holds whatever came before).
        int op = 0;
        const int type = in.get<std::uint8_t>() % 13;
        const int residence = in.get<std::uint8_t>() % 3;
        const bool null_scalar = in.get<std::uint8_t>() & 1;
        ncclResult_t r =
            fuzz_nccl_premulsum(&op, null_scalar ? nullptr : send_buffer, type, residence, comm());
        check(r);
        if (r == ncclSuccess) made_ops.push_back(op);
        break;
      }
      case 14: {
        const auto pick = in.get<std::uint8_t>();
        if (pick & 1 && !made_ops.empty()) {
          check(fuzz_nccl_op_destroy(made_ops.back(), comm()));
          made_ops.pop_back();
        } else {
          // Any value: built-in operators and ones never made cannot be destroyed.
          check(fuzz_nccl_op_destroy(in.get<std::int32_t>(), comm()));
        }
        break;
      }
      case 15: {
        int value = 0;
        const auto pick = in.get<std::uint8_t>();
        int* out = pick & 1 ? nullptr : &value;
        ncclComm_t c = pick & 2 ? nullptr : comm();
        check(ncclCommCount(c, out));
        check(ncclCommUserRank(c, out));
        check(ncclCommCuDevice(c, out));
        ncclResult_t async = ncclSuccess;
        check(ncclCommGetAsyncError(c, pick & 4 ? nullptr : &async));
        break;
      }
      case 16: {
        void* handle = nullptr;
        const auto pick = in.get<std::uint8_t>();
        const std::size_t bytes = pick & 0x80 ? in.get<std::uint64_t>() : pick % 64 * 64;
        ncclResult_t r =
            ncclCommRegister(pick & 1 ? nullptr : comm(), pick & 2 ? nullptr : recv_buffer,
                             bytes > buffer_bytes ? 0 : bytes, pick & 4 ? nullptr : &handle);
        check(r);
        if (r == ncclSuccess && handle) registrations.push_back(handle);
        break;
      }
      case 17:
        if (!registrations.empty()) {
          check(ncclCommDeregister(comm(), registrations.back()));
          registrations.pop_back();
        } else {
          check(ncclCommDeregister(comm(), nullptr));
        }
        break;
      case 18:
        fuzz_nccl_error_string(in.get<std::int32_t>());
        ncclGetLastError(in.get<std::uint8_t>() & 1 ? nullptr : comm());
        break;
      case 19: {
        int version = 0;
        check(ncclGetVersion(in.get<std::uint8_t>() & 1 ? nullptr : &version));
        break;
      }
    }
  }
  // Leave the library as this input found it: groups closed, operators and registrations gone.
  for (; open_groups > 0; --open_groups) check(ncclGroupEnd());
  for (int op : made_ops) check(fuzz_nccl_op_destroy(op, comm()));
  for (void* h : registrations) check(ncclCommDeregister(comm(), h));
  ncclResult_t async = ncclSuccess;
  check(ncclCommGetAsyncError(comm(), &async));
  if (async != ncclSuccess) coccl::fuzz::violated("the communicator failed");
  return 0;
}
