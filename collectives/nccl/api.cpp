// The NCCL C API (include/nccl.h), part one: communicator setup and teardown, queries and
// errors. Memory, registration and custom operators are in resources.cpp; collectives and
// groups in group.cpp.
//
// Every entry point is defined under its "pnccl" name and exported also as a weak "nccl" alias,
// the arrangement NVIDIA's library uses so that profilers can interpose on the nccl names.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/comm.hpp"
#include "collectives/nccl/cuda.hpp"
#include "collectives/nccl/exports.hpp"
#include "collectives/nccl/state.hpp"

namespace coccl::nccl {
namespace {

thread_local std::string last_error_text;

// Aborted communicators that may have a device workspace: a dead peer's kernels can still be
// spinning on it, so it is never freed (freeing would wait for them); the process keeps it.
std::mutex graveyard_mutex;
std::vector<Communicator>* graveyard = new std::vector<Communicator>();

// Frees a communicator handle and what its user left registered.
void release(ncclComm* c) {
  for (const void* r : c->registrations) delete static_cast<const Registration*>(r);
  for (const void* w : c->windows) delete static_cast<const ncclWindow_vidmem*>(w);
  c->magic = 0;
  delete c;
}

// A config is usable when it came from NCCL_CONFIG_INITIALIZER (of any 2.x header: the fields
// coccl reads exist in all of them).
ncclResult_t read_config(const ncclConfig_t* config, bool inherited, bool& blocking) {
  blocking = inherited;
  if (!config) return ncclSuccess;
  if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
    return fail(ncclInvalidArgument,
                "ncclConfig_t was not initialised with NCCL_CONFIG_INITIALIZER");
  if (config->blocking != NCCL_CONFIG_UNDEF_INT) blocking = config->blocking != 0;
  return ncclSuccess;
}

UniqueId to_id(const ncclUniqueId& id) {
  UniqueId u;
  std::memcpy(u.bytes.data(), id.internal, u.bytes.size());
  return u;
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, std::vector<UniqueId> ids, int rank,
                       const ncclConfig_t* config, int device) {
  if (!out) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *out = nullptr;
  if (nranks < 1)
    return fail(ncclInvalidArgument,
                "ncclCommInitRank: nranks must be positive, got " + std::to_string(nranks));
  if (rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) +
                                         " out of range [0, " + std::to_string(nranks) + ")");
  bool blocking = true;
  if (auto r = read_config(config, true, blocking)) return r;
  auto* c = new ncclComm;
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->blocking = blocking;
  *out = c;
  return start_setup(c, [c, ids = std::move(ids)] {
    c->comm = detail::create_blocking(ids, c->rank.load(), c->nranks.load());
    prepare_device(c);
  });
}

}  // namespace

ncclResult_t fail(ncclResult_t code, std::string text) {
  last_error_text = std::move(text);
  return code;
}

ncclResult_t fail_current_exception(const char* call) noexcept {
  ncclResult_t code = ncclInternalError;
  try {
    try {
      throw;
    } catch (const std::bad_alloc&) {
      code = ncclSystemError;
      return fail(code, std::string(call) + ": out of memory");
    } catch (const std::exception& e) {
      return fail(code, std::string(call) + ": " + e.what());
    } catch (...) {
      return fail(code, std::string(call) + ": unknown exception");
    }
  } catch (...) {
    // No memory even for the message: the code alone.
    last_error_text.clear();
    return code;
  }
}

ncclResult_t fail_comm(ncclComm* c, ncclResult_t code, std::string text) {
  {
    std::lock_guard lock(c->mutex);
    if (c->failure == ncclSuccess) c->failure = code;
  }
  return fail(code, std::move(text));
}

ncclResult_t to_result(std::error_code ec) noexcept {
  if (!ec) return ncclSuccess;
  if (ec.category() != error_category()) return ncclSystemError;
  switch (static_cast<errc>(ec.value())) {
    case errc::invalid_argument:
      return ncclInvalidArgument;
    case errc::aborted:
    case errc::mismatch:
    case errc::unsupported:
      return ncclInvalidUsage;
    case errc::peer_lost:
    case errc::timed_out:
    case errc::remote_error:
      return ncclRemoteError;
    case errc::bad_message:
      return ncclSystemError;
    case errc::cuda_error:
      return ncclUnhandledCudaError;
    case errc::internal:
      return ncclInternalError;
  }
  return ncclInternalError;
}

ncclResult_t check_comm(const ncclComm* c, const char* call) {
  if (!c) return fail(ncclInvalidArgument, std::string(call) + ": comm is NULL");
  if (c->magic != ncclComm::live)
    return fail(ncclInvalidArgument,
                std::string(call) + ": comm is not a live communicator (destroyed?)");
  return ncclSuccess;
}

ncclResult_t wait_ready(ncclComm* c) {
  {
    std::lock_guard lock(c->join_mutex);
    if (c->setup.joinable()) c->setup.join();
  }
  auto r = static_cast<ncclResult_t>(c->state.load(std::memory_order_acquire));
  if (r != ncclSuccess) return fail(r, c->setup_error);
  return ncclSuccess;
}

ncclResult_t start_setup(ncclComm* c, std::function<void()> job) {
  c->state.store(ncclInProgress, std::memory_order_release);
  c->setup = std::thread([c, job = std::move(job)] {
    ncclResult_t r = ncclSuccess;
    std::string why;
    if (c->device >= 0 && gpu_count() > 0) why = set_device(c->device);
    if (!why.empty()) {
      r = ncclUnhandledCudaError;
    } else {
      try {
        job();
      } catch (const std::system_error& e) {
        r = to_result(e.code());
        why = e.what();
        if (c->comm && !c->comm.last_error().empty()) why += ": " + c->comm.last_error();
      } catch (const std::exception& e) {
        r = ncclInternalError;
        why = e.what();
      }
    }
    std::unique_lock lock(c->mutex);
    if (c->abandoned) {
      // ncclCommAbort returned while this ran: finish its work here.
      lock.unlock();
      if (c->comm) c->comm.abort();
      release(c);
      return;
    }
    c->setup_error = why;
    c->state.store(r, std::memory_order_release);
  });
  if (!c->blocking) return ncclInProgress;
  if (in_group()) {
    join_at_group_end(c);
    return ncclSuccess;
  }
  return wait_ready(c);
}

void prepare_device(ncclComm* c) {
  if (c->device < 0 || gpu_count() == 0 || !c->comm) return;
  if (auto why = load_layer_kernels(); !why.empty())
    throw std::system_error(make_error_code(errc::cuda_error), why);
  // A collective device call of no elements makes the workspace and launches nothing. Where
  // device collectives cannot work (ranks on several hosts, more than 8 ranks) the communicator
  // still serves host memory; its device calls report the same error when made.
  try {
    c->comm.all_reduce(nullptr, nullptr, 0, DataType::float32, ReduceOp::sum, cuda_stream{});
  } catch (const std::system_error& e) {
    if (e.code() != errc::unsupported) throw;
  }
}

}  // namespace coccl::nccl

using namespace coccl;
using namespace coccl::nccl;

extern "C" {

ncclResult_t pncclGetVersion(int* version) {
  return guarded("ncclGetVersion", [&]() -> ncclResult_t {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
  });
}

ncclResult_t pncclGetUniqueId(ncclUniqueId* out) {
  return guarded("ncclGetUniqueId", [&]() -> ncclResult_t {
    if (!out) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    try {
      UniqueId id = UniqueId::create();
      std::memcpy(out->internal, id.bytes.data(), id.bytes.size());
      return ncclSuccess;
    } catch (const std::system_error& e) {
      return fail(ncclSystemError, std::string("ncclGetUniqueId: ") + e.what());
    }
  });
}

ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config) {
  return guarded("ncclCommInitRankConfig", [&]() -> ncclResult_t {
    return init_rank(comm, nranks, {to_id(commId)}, rank, config, current_device());
  });
}

ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return guarded("ncclCommInitRank", [&]() -> ncclResult_t {
    return init_rank(comm, nranks, {to_id(commId)}, rank, nullptr, current_device());
  });
}

ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config) {
  return guarded("ncclCommInitRankScalable", [&]() -> ncclResult_t {
    if (nId < 1)
      return fail(ncclInvalidArgument,
                  "ncclCommInitRankScalable: nId must be at least 1, got " + std::to_string(nId));
    if (!commIds) return fail(ncclInvalidArgument, "ncclCommInitRankScalable: commIds is NULL");
    if (nranks >= 1 && nId > nranks)
      return fail(ncclInvalidArgument, "ncclCommInitRankScalable: nId (" + std::to_string(nId) +
                                           ") is more than nranks (" + std::to_string(nranks) +
                                           "): each id's root needs at least one rank");
    // Every id is used: rank r says hello to the root of id r * nId / nranks (Peers::rendezvous).
    std::vector<UniqueId> ids;
    for (int i = 0; i < nId; ++i) {
      ids.push_back(to_id(commIds[i]));
      for (int j = 0; j < i; ++j)
        if (ids[j].bytes == ids[i].bytes)
          return fail(ncclInvalidArgument, "ncclCommInitRankScalable: commIds[" +
                                               std::to_string(i) + "] is the same as commIds[" +
                                               std::to_string(j) + "]: pass distinct ids");
    }
    return init_rank(newcomm, nranks, std::move(ids), myrank, config, current_device());
  });
}

ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return guarded("ncclCommInitAll", [&]() -> ncclResult_t {
    if (!comms) return fail(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
    if (ndev < 1)
      return fail(ncclInvalidArgument,
                  "ncclCommInitAll: ndev must be positive, got " + std::to_string(ndev));
    const int gpus = gpu_count();
    for (int i = 0; i < ndev; ++i) {
      int d = devlist ? devlist[i] : i;
      if (d < 0 || (gpus > 0 && d >= gpus))
        return fail(ncclInvalidArgument, "ncclCommInitAll: no GPU " + std::to_string(d) + " (" +
                                             std::to_string(gpus) + " present)");
    }
    ncclUniqueId id;
    if (auto r = pncclGetUniqueId(&id)) return r;
    // One group: the ranks join together (each on its own thread), then ncclGroupEnd waits.
    // Without GPUs the device numbers are only recorded (host-memory communicators).
    pncclGroupStart();
    ncclResult_t first = ncclSuccess;
    for (int i = 0; i < ndev; ++i) {
      ncclResult_t r =
          init_rank(comms + i, ndev, {to_id(id)}, i, nullptr, devlist ? devlist[i] : i);
      if (r != ncclSuccess && first == ncclSuccess) first = r;
    }
    ncclResult_t r = pncclGroupEnd();
    return first != ncclSuccess ? first : r;
  });
}

ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  return guarded("ncclCommFinalize", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommFinalize")) return r;
    if (auto r = wait_ready(comm)) return r;
    {
      std::lock_guard lock(comm->mutex);
      if (comm->finalized) return ncclSuccess;
      comm->finalized = true;
    }
    try {
      comm->comm.destroy();
    } catch (const std::system_error& e) {
      return fail_comm(comm, to_result(e.code()), std::string("ncclCommFinalize: ") + e.what());
    }
    return ncclSuccess;
  });
}

ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  return guarded("ncclCommDestroy", [&]() -> ncclResult_t {
    if (!comm) return ncclSuccess;
    if (auto r = check_comm(comm, "ncclCommDestroy")) return r;
    ncclResult_t r = ncclSuccess;
    if (wait_ready(comm) == ncclSuccess) {
      bool finalized;
      {
        std::lock_guard lock(comm->mutex);
        finalized = comm->finalized;
      }
      if (!finalized) {
        try {
          comm->comm.destroy();
        } catch (const std::system_error& e) {
          r = fail(to_result(e.code()), std::string("ncclCommDestroy: ") + e.what());
        }
      }
    }
    release(comm);
    return r;
  });
}

ncclResult_t pncclCommAbort(ncclComm_t comm) {
  return guarded("ncclCommAbort", [&]() -> ncclResult_t {
    if (!comm) return ncclSuccess;
    if (auto r = check_comm(comm, "ncclCommAbort")) return r;
    {
      std::lock_guard lock(comm->mutex);
      if (comm->state.load(std::memory_order_acquire) == ncclInProgress && comm->setup.joinable()) {
        // The join may be waiting for a peer that never comes: leave the job to clean up.
        comm->abandoned = true;
        comm->setup.detach();
        return ncclSuccess;
      }
    }
    {
      std::lock_guard lock(comm->join_mutex);
      if (comm->setup.joinable()) comm->setup.join();
    }
    if (comm->comm) {
      if (comm->device >= 0 && gpu_count() > 0) {
        std::lock_guard lock(graveyard_mutex);
        graveyard->push_back(comm->comm);
      }
      comm->comm.abort();
    }
    release(comm);
    return ncclSuccess;
  });
}

ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return guarded("ncclCommRevoke", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommRevoke")) return r;
    (void)revokeFlags;
    return fail(ncclInvalidUsage,
                "ncclCommRevoke is not supported by coccl: use ncclCommAbort, then make a new "
                "communicator");
  });
}

ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config) {
  return guarded("ncclCommSplit", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommSplit")) return r;
    if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
    *newcomm = nullptr;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
      return fail(ncclInvalidArgument, "ncclCommSplit: color must be >= 0 or NCCL_SPLIT_NOCOLOR");
    if (auto r = wait_ready(comm)) return r;
    bool blocking = true;
    if (auto r = read_config(config, comm->blocking, blocking)) return r;
    if (color == NCCL_SPLIT_NOCOLOR) {
      // This rank only takes part in the parent's exchanges.
      Communicator parent = comm->comm;
      auto job = [parent, key]() mutable {
        try {
          parent.split(NCCL_SPLIT_NOCOLOR, key);
        } catch (const std::system_error&) {
          // The members' split fails too and reports it; nothing waits for this rank's result.
        }
      };
      if (in_group()) {
        run_at_group_end(std::thread(job));
        return ncclSuccess;
      }
      try {
        comm->comm.split(NCCL_SPLIT_NOCOLOR, key);
      } catch (const std::system_error& e) {
        return fail_comm(comm, to_result(e.code()), std::string("ncclCommSplit: ") + e.what());
      }
      return ncclSuccess;
    }
    auto* c = new ncclComm;
    c->device = comm->device;
    c->blocking = blocking;
    *newcomm = c;
    Communicator parent = comm->comm;
    return start_setup(c, [c, parent, color, key]() mutable {
      c->comm = parent.split(color, key);
      c->rank = c->comm.rank();
      c->nranks = c->comm.size();
      prepare_device(c);
    });
  });
}

ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  return guarded("ncclCommShrink", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommShrink")) return r;
    if (!newcomm) return fail(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
    *newcomm = nullptr;
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
      return fail(ncclInvalidArgument, "ncclCommShrink: bad exclude list");
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
      return fail(ncclInvalidArgument, "ncclCommShrink: unknown flags");
    if (auto r = wait_ready(comm)) return r;
    const int n = comm->nranks, me = comm->rank;
    std::vector<int> exclude;
    for (int i = 0; i < excludeRanksCount; ++i) {
      int x = excludeRanksList[i];
      if (x < 0 || x >= n)
        return fail(ncclInvalidArgument, "ncclCommShrink: rank " + std::to_string(x) +
                                             " out of range [0, " + std::to_string(n) + ")");
      if (x == me) return fail(ncclInvalidArgument, "ncclCommShrink: called by an excluded rank");
      exclude.push_back(x);
    }
    std::sort(exclude.begin(), exclude.end());
    exclude.erase(std::unique(exclude.begin(), exclude.end()), exclude.end());
    bool blocking = true;
    if (auto r = read_config(config, comm->blocking, blocking)) return r;
    auto* c = new ncclComm;
    c->device = comm->device;
    c->blocking = blocking;
    c->nranks = n - static_cast<int>(exclude.size());
    c->rank = me - static_cast<int>(std::lower_bound(exclude.begin(), exclude.end(), me) -
                                    exclude.begin());
    *newcomm = c;
    Communicator parent = comm->comm;
    // Communicator::shrink meets the other survivors without the parent's links, so a parent that
    // failed (a lost rank) shrinks as well as a healthy one.
    return start_setup(c, [c, parent, exclude, shrinkFlags]() mutable {
      if (shrinkFlags == NCCL_SHRINK_ABORT) {
        // Stops the parent's operations; abort() empties only this copy of the handle, so the
        // application's ncclComm_t keeps the parent for ncclCommDestroy or ncclCommAbort.
        Communicator stop = parent;
        stop.abort();
      }
      c->comm = parent.shrink(exclude);
      prepare_device(c);
    });
  });
}

const char* pncclGetErrorString(ncclResult_t result) {
  switch (raw_value(result)) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the coccl developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclNumResults:
      break;
  }
  return "unknown result code";
}

const char* pncclGetLastError(ncclComm_t comm) {
  try {
    if (last_error_text.empty() && comm && comm->magic == ncclComm::live &&
        comm->state.load(std::memory_order_acquire) == ncclSuccess && comm->comm)
      last_error_text = comm->comm.last_error();
  } catch (...) {
    return "ncclGetLastError: out of memory";
  }
  return last_error_text.c_str();
}

void pncclResetDebugInit(void) {}

ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guarded("ncclCommGetAsyncError", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommGetAsyncError")) return r;
    if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    auto state = static_cast<ncclResult_t>(comm->state.load(std::memory_order_acquire));
    if (state != ncclSuccess) {
      *asyncError = state;
      return ncclSuccess;
    }
    std::lock_guard lock(comm->mutex);
    if (comm->failure != ncclSuccess) {
      *asyncError = comm->failure;
    } else if (!comm->finalized && comm->comm && !comm->comm.last_error().empty()) {
      // Failed with no call of this layer seeing it: a peer went away or aborted.
      *asyncError = ncclRemoteError;
    } else {
      *asyncError = ncclSuccess;
    }
    return ncclSuccess;
  });
}

ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  return guarded("ncclCommCount", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommCount")) return r;
    if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
    int n = comm->nranks.load();
    if (n == 0) return fail(ncclInProgress, "ncclCommCount: the communicator is being made");
    *count = n;
    return ncclSuccess;
  });
}

ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guarded("ncclCommCuDevice", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommCuDevice")) return r;
    if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
    *device = comm->device;
    return ncclSuccess;
  });
}

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guarded("ncclCommUserRank", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommUserRank")) return r;
    if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    int me = comm->rank.load();
    if (me < 0) return fail(ncclInProgress, "ncclCommUserRank: the communicator is being made");
    *rank = me;
    return ncclSuccess;
  });
}

}  // extern "C"

COCCL_NCCL_ALIAS(ncclGetVersion)
COCCL_NCCL_ALIAS(ncclGetUniqueId)
COCCL_NCCL_ALIAS(ncclCommInitRankConfig)
COCCL_NCCL_ALIAS(ncclCommInitRank)
COCCL_NCCL_ALIAS(ncclCommInitRankScalable)
COCCL_NCCL_ALIAS(ncclCommInitAll)
COCCL_NCCL_ALIAS(ncclCommFinalize)
COCCL_NCCL_ALIAS(ncclCommDestroy)
COCCL_NCCL_ALIAS(ncclCommAbort)
COCCL_NCCL_ALIAS(ncclCommRevoke)
COCCL_NCCL_ALIAS(ncclCommSplit)
COCCL_NCCL_ALIAS(ncclCommShrink)
COCCL_NCCL_ALIAS(ncclGetErrorString)
COCCL_NCCL_ALIAS(ncclGetLastError)
COCCL_NCCL_ALIAS(ncclResetDebugInit)
COCCL_NCCL_ALIAS(ncclCommGetAsyncError)
COCCL_NCCL_ALIAS(ncclCommCount)
COCCL_NCCL_ALIAS(ncclCommCuDevice)
COCCL_NCCL_ALIAS(ncclCommUserRank)
