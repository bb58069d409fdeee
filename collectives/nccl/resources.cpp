// The NCCL C API (include/nccl.h), part three: memory, buffer registration and custom reduction
// operators.
#include <cstdlib>
#include <cstring>

#include "collectives/nccl/cuda.hpp"
#include "collectives/nccl/exports.hpp"
#include "collectives/nccl/state.hpp"

namespace coccl::nccl {
namespace {

// Host memory handed out by ncclMemAlloc where there are no GPUs.
std::mutex host_allocations_mutex;
std::set<void*>* host_allocations = new std::set<void*>();

}  // namespace
}  // namespace coccl::nccl

using namespace coccl;
using namespace coccl::nccl;

extern "C" {

ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return guarded("ncclCommRegister", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommRegister")) return r;
    if (!handle || (!buff && size > 0))
      return fail(ncclInvalidArgument, "ncclCommRegister: NULL buffer or handle");
    auto* reg = new Registration{buff, size, {}};
    if (buff && size > 0 && !is_device_memory(buff)) {
      try {
        reg->host = comm->comm.register_buffer(buff, size);
      } catch (const std::system_error& e) {
        delete reg;
        return fail(to_result(e.code()), std::string("ncclCommRegister: ") + e.what());
      }
    }
    std::lock_guard lock(comm->mutex);
    comm->registrations.insert(reg);
    *handle = reg;
    return ncclSuccess;
  });
}

ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  return guarded("ncclCommDeregister", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommDeregister")) return r;
    std::lock_guard lock(comm->mutex);
    if (!comm->registrations.erase(handle))
      return fail(ncclInvalidArgument, "ncclCommDeregister: not a registration of this comm");
    delete static_cast<Registration*>(handle);
    return ncclSuccess;
  });
}

ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                     int winFlags) {
  return guarded("ncclCommWindowRegister", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommWindowRegister")) return r;
    if (!win || (!buff && size > 0))
      return fail(ncclInvalidArgument, "ncclCommWindowRegister: NULL buffer or window");
    if (winFlags != NCCL_WIN_DEFAULT && winFlags != NCCL_WIN_COLL_SYMMETRIC)
      return fail(ncclInvalidArgument, "ncclCommWindowRegister: unknown flags");
    auto* w = new ncclWindow_vidmem{buff, size, winFlags};
    std::lock_guard lock(comm->mutex);
    comm->windows.insert(w);
    *win = w;
    return ncclSuccess;
  });
}

ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return guarded("ncclCommWindowDeregister", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclCommWindowDeregister")) return r;
    std::lock_guard lock(comm->mutex);
    if (!comm->windows.erase(win))
      return fail(ncclInvalidArgument, "ncclCommWindowDeregister: not a window of this comm");
    delete win;
    return ncclSuccess;
  });
}

ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  return guarded("ncclMemAlloc", [&]() -> ncclResult_t {
    if (!ptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    *ptr = nullptr;
    if (gpu_count() > 0) {
      if (auto why = device_alloc(ptr, size); !why.empty())
        return fail(ncclUnhandledCudaError, "ncclMemAlloc: " + why);
      return ncclSuccess;
    }
    void* p = std::aligned_alloc(NCCL_WIN_REQUIRED_ALIGNMENT,
                                 (size + NCCL_WIN_REQUIRED_ALIGNMENT - 1) /
                                     NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT);
    if (!p && size > 0) return fail(ncclSystemError, "ncclMemAlloc: out of host memory");
    std::lock_guard lock(host_allocations_mutex);
    host_allocations->insert(p);
    *ptr = p;
    return ncclSuccess;
  });
}

ncclResult_t pncclMemFree(void* ptr) {
  return guarded("ncclMemFree", [&]() -> ncclResult_t {
    if (!ptr) return ncclSuccess;
    {
      std::lock_guard lock(host_allocations_mutex);
      if (host_allocations->erase(ptr)) {
        std::free(ptr);
        return ncclSuccess;
      }
    }
    if (gpu_count() == 0) return fail(ncclInvalidArgument, "ncclMemFree: not from ncclMemAlloc");
    if (auto why = device_free(ptr); !why.empty())
      return fail(ncclUnhandledCudaError, "ncclMemFree: " + why);
    return ncclSuccess;
  });
}

ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm) {
  return guarded("ncclRedOpCreatePreMulSum", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclRedOpCreatePreMulSum")) return r;
    if (!op || !scalar)
      return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: NULL op or scalar");
    const int raw_type = raw_value(datatype);
    const int where = raw_value(residence);
    auto type = static_cast<DataType>(raw_type);
    if (raw_type < 0 || raw_type >= ncclNumTypes || !is_valid(type))
      return fail(ncclInvalidArgument,
                  "ncclRedOpCreatePreMulSum: unknown datatype " + std::to_string(raw_type));
    PreMulSum pm{type, nullptr, 0};
    if (where == ncclScalarHostImmediate) {
      std::memcpy(&pm.scalar_bits, scalar, size_of(type));
    } else if (where == ncclScalarDevice) {
      pm.scalar_address = scalar;
    } else {
      return fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: unknown residence");
    }
    std::lock_guard lock(comm->mutex);
    if (comm->next_op == ncclMaxRedOp)
      return fail(ncclInvalidUsage, "ncclRedOpCreatePreMulSum: too many operators");
    int id = comm->next_op++;
    comm->ops.emplace(id, pm);
    *op = static_cast<ncclRedOp_t>(id);
    return ncclSuccess;
  });
}

ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return guarded("ncclRedOpDestroy", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclRedOpDestroy")) return r;
    std::lock_guard lock(comm->mutex);
    // raw_value: a negative op is out of the enum's range, and loading it would be undefined.
    const int id = raw_value(op);
    if (!comm->ops.erase(id))
      return fail(ncclInvalidArgument,
                  "ncclRedOpDestroy: " + std::to_string(id) + " is not an operator of this comm");
    return ncclSuccess;
  });
}

// NVIDIA's device-side API (nccl_device.h, not part of nccl.h) is not implemented. Its entry
// points that take a communicator are defined so that a program probing for it gets coccl's
// error rather than reaching another NCCL library with a coccl handle.
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* requirements, void* devComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm);

ncclResult_t pncclDevCommCreate(ncclComm_t comm, const void*, void*) {
  return guarded("ncclDevCommCreate", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclDevCommCreate")) return r;
    return fail(ncclInvalidUsage, "ncclDevCommCreate: NCCL's device API is not supported by coccl");
  });
}

ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const void*) {
  return guarded("ncclDevCommDestroy", [&]() -> ncclResult_t {
    if (auto r = check_comm(comm, "ncclDevCommDestroy")) return r;
    return fail(ncclInvalidUsage,
                "ncclDevCommDestroy: NCCL's device API is not supported by coccl");
  });
}
}  // extern "C"

COCCL_NCCL_ALIAS(ncclDevCommCreate)
COCCL_NCCL_ALIAS(ncclDevCommDestroy)
COCCL_NCCL_ALIAS(ncclCommRegister)
COCCL_NCCL_ALIAS(ncclCommDeregister)
COCCL_NCCL_ALIAS(ncclCommWindowRegister)
COCCL_NCCL_ALIAS(ncclCommWindowDeregister)
COCCL_NCCL_ALIAS(ncclMemAlloc)
COCCL_NCCL_ALIAS(ncclMemFree)
COCCL_NCCL_ALIAS(ncclRedOpCreatePreMulSum)
COCCL_NCCL_ALIAS(ncclRedOpDestroy)
