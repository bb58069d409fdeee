// The NCCL API layer's state: the object behind ncclComm_t, errors, and the helpers that the
// entry points of api.cpp (setup, queries, memory) and group.cpp (collectives, groups) share.
#pragma once

#include <nccl.h>

#include <atomic>
#include <coccl/coccl.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>

namespace coccl::nccl {

/// An enum argument's value, read from its bytes: a C caller may pass a value the enumeration
/// does not hold (an error to report), and reading that as the C++ enum type is undefined.
template <typename E>
int raw_value(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

/// An operator made by ncclRedOpCreatePreMulSum: multiply the input by a scalar, then sum.
struct PreMulSum {
  DataType type;
  /// ncclScalarDevice: where the scalar is read at each use; null for ncclScalarHostImmediate.
  const void* scalar_address;
  /// ncclScalarHostImmediate: the scalar's bytes, read at creation.
  std::uint64_t scalar_bits;
};

/// What ncclCommRegister hands out. Host memory is registered with the communicator
/// (Communicator::register_buffer: zero-copy over the ib transport); device memory needs no
/// registration for coccl's kernels, so the handle only records it.
struct Registration {
  void* buffer;
  std::size_t bytes;
  BufferRegistration host;
};

}  // namespace coccl::nccl

/// What ncclCommWindowRegister hands out (a record, like Registration).
struct ncclWindow_vidmem {
  void* buffer;
  std::size_t bytes;
  int flags;
};

/// The object behind ncclComm_t.
///
/// A setup job (init, split, shrink) runs on its own thread and fills `comm`, `rank` and `nranks`
/// before it moves `state` away from ncclInProgress (release; readers acquire). Everything a
/// call may touch from several threads at once is either atomic or under `mutex`.
struct ncclComm {
  static constexpr std::uint64_t live = 0x636f63636c2d6e63;  // "coccl-nc"

  std::uint64_t magic = live;
  std::atomic<int> rank{-1};
  std::atomic<int> nranks{0};
  int device = -1;  // the GPU current at creation; -1 without GPUs
  bool blocking = true;
  std::atomic<int> state{ncclSuccess};  // ncclInProgress while the setup job runs
  coccl::Communicator comm;
  std::string setup_error;  // written by the setup job before `state`

  std::mutex join_mutex;  // one joiner of `setup` at a time
  std::thread setup;

  std::mutex mutex;
  bool abandoned = false;  // aborted while the setup job ran: the job frees this object
  bool finalized = false;
  ncclResult_t failure = ncclSuccess;  // first error an operation on it returned
  std::map<int, coccl::nccl::PreMulSum> ops;
  int next_op = ncclNumOps;
  std::set<const void*> registrations;  // handles of ncclCommRegister
  std::set<const void*> windows;        // handles of ncclCommWindowRegister
};

namespace coccl::nccl {

/// Records `text` as the calling thread's last error and returns `code`.
ncclResult_t fail(ncclResult_t code, std::string text);

/// fail(), also remembering `code` as the communicator's failure (ncclCommGetAsyncError).
ncclResult_t fail_comm(ncclComm* c, ncclResult_t code, std::string text);

/// For a catch block: the result of the exception being handled (ncclSystemError for
/// std::bad_alloc, ncclInternalError for anything else), with "<call>: <what>" as the last error.
ncclResult_t fail_current_exception(const char* call) noexcept;

/// Runs the body of the entry point `call`: no exception ever leaves the C API.
template <class Body>
auto guarded(const char* call, Body&& body) noexcept -> decltype(body()) {
  try {
    return body();
  } catch (...) {
    return fail_current_exception(call);
  }
}

/// The NCCL result for an error of the C++ API.
ncclResult_t to_result(std::error_code ec) noexcept;

/// ncclInvalidArgument (with the message) unless `c` is a live communicator handle.
ncclResult_t check_comm(const ncclComm* c, const char* call);

/// Waits for `c`'s setup job, if one runs; returns its result (recording a failure's message).
ncclResult_t wait_ready(ncclComm* c);

/// True between the calling thread's outermost ncclGroupStart and ncclGroupEnd.
bool in_group() noexcept;

/// Inside a group: the setup job of `c` is joined by the group's ncclGroupEnd (blocking `c`).
void join_at_group_end(ncclComm* c);

/// Inside a group: a job with no communicator of its own (a split with no colour) that the
/// group's ncclGroupEnd waits for.
void run_at_group_end(std::thread job);

/// Starts `job` as `c`'s setup (on its own thread, with `c`'s GPU current) and returns what the
/// calling entry point returns: its result (blocking, outside a group), ncclSuccess (blocking,
/// inside a group: ncclGroupEnd waits) or ncclInProgress (nonblocking).
ncclResult_t start_setup(ncclComm* c, std::function<void()> job);

/// Makes the device side of a new communicator while every rank is in the collective setup, so
/// that no later collective blocks the host (see Communicator's first device call).
void prepare_device(ncclComm* c);

}  // namespace coccl::nccl
