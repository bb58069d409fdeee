// include/coccl_ext.h over coccl::Communicator and coccl::moe: handles own the C++ objects, and
// no exception crosses the C boundary (each becomes a result code and the thread's last error).
#include <coccl_ext.h>

#include <coccl/coccl.hpp>
#include <coccl/moe.hpp>
#include <cstring>
#include <exception>
#include <string>

struct cocclComm {
  coccl::Communicator comm;
};
struct cocclAllToAllv {
  coccl::moe::AllToAllv a2a;
};
struct cocclMoe {
  coccl::moe::Dispatcher moe;
};

namespace {

thread_local std::string last_error;

cocclExtResult_t code_of(const std::error_code& ec) {
  if (ec == coccl::make_error_code(coccl::errc::invalid_argument)) return cocclExtInvalidArgument;
  if (ec == coccl::make_error_code(coccl::errc::unsupported)) return cocclExtUnsupported;
  if (ec == coccl::make_error_code(coccl::errc::cuda_error)) return cocclExtCudaError;
  return cocclExtError;
}

// Runs f, turning exceptions into result codes.
template <class F>
cocclExtResult_t guarded(F&& f) {
  try {
    last_error.clear();
    f();
    return cocclExtSuccess;
  } catch (const std::system_error& e) {
    last_error = e.what();
    return code_of(e.code());
  } catch (const std::exception& e) {
    last_error = e.what();
    return cocclExtError;
  }
}

cocclExtResult_t null_argument(const char* what) {
  last_error = std::string(what) + ": null argument";
  return cocclExtInvalidArgument;
}

cocclExtResult_t status(const std::error_code& ec, const std::string& what) {
  if (!ec) return cocclExtSuccess;
  last_error = what;
  return code_of(ec);
}

void fill(cocclMoeReceived_t* out, const coccl::moe::Received& r) {
  out->x = r.x;
  out->rows = reinterpret_cast<const int32_t*>(r.rows);
  out->expert_counts = r.expert_counts;
  out->expert_offsets = r.expert_offsets;
  out->capacity = r.capacity;
  out->local_experts = r.local_experts;
  out->first_expert = r.first_expert;
}

coccl::cuda_stream stream_of(cocclStream_t s) { return reinterpret_cast<coccl::cuda_stream>(s); }

}  // namespace

extern "C" {

const char* cocclExtLastError(void) { return last_error.c_str(); }

cocclExtResult_t cocclExtGetUniqueId(char* text) {
  if (!text) return null_argument("cocclExtGetUniqueId");
  return guarded([&] {
    const std::string hex = coccl::UniqueId::create().to_string();
    std::memcpy(text, hex.c_str(), hex.size() + 1);
  });
}

cocclExtResult_t cocclExtCommInit(cocclComm_t* comm, const char* id, int rank, int nranks) {
  if (!comm || !id) return null_argument("cocclExtCommInit");
  return guarded([&] {
    auto c = coccl::Communicator::create(coccl::UniqueId::from_string(id), rank, nranks);
    *comm = new cocclComm{std::move(c)};
  });
}

cocclExtResult_t cocclExtCommDestroy(cocclComm_t comm) {
  if (!comm) return null_argument("cocclExtCommDestroy");
  return guarded([&] {
    comm->comm.destroy();
    delete comm;
  });
}

cocclExtResult_t cocclAllToAllvCreate(cocclAllToAllv_t* a2a, cocclComm_t comm, size_t max_count,
                                      int datatype) {
  if (!a2a || !comm) return null_argument("cocclAllToAllvCreate");
  return guarded([&] {
    *a2a = new cocclAllToAllv{
        coccl::moe::AllToAllv(comm->comm, max_count, static_cast<coccl::DataType>(datatype))};
  });
}

cocclExtResult_t cocclAllToAllvDestroy(cocclAllToAllv_t a2a) {
  if (!a2a) return null_argument("cocclAllToAllvDestroy");
  return guarded([&] { delete a2a; });
}

cocclExtResult_t cocclAllToAllvDeviceBytes(cocclAllToAllv_t a2a, size_t* bytes) {
  if (!a2a || !bytes) return null_argument("cocclAllToAllvDeviceBytes");
  *bytes = a2a->a2a.device_bytes();
  return cocclExtSuccess;
}

cocclExtResult_t cocclAllToAllvDevice(cocclAllToAllv_t a2a, const void* send, const int64_t* sc,
                                      const int64_t* sd, void* recv, int64_t* rc, const int64_t* rd,
                                      cocclStream_t stream) {
  if (!a2a) return null_argument("cocclAllToAllvDevice");
  return guarded([&] { a2a->a2a.run(send, sc, sd, recv, rc, rd, stream_of(stream)); });
}

cocclExtResult_t cocclAllToAllvHost(cocclAllToAllv_t a2a, const void* send, const int64_t* sc,
                                    const int64_t* sd, void* recv, int64_t* rc, const int64_t* rd) {
  if (!a2a) return null_argument("cocclAllToAllvHost");
  return guarded([&] { a2a->a2a.run(send, sc, sd, recv, rc, rd); });
}

cocclExtResult_t cocclAllToAllvStatus(cocclAllToAllv_t a2a) {
  if (!a2a) return null_argument("cocclAllToAllvStatus");
  std::string what;
  const std::error_code ec = a2a->a2a.device_status(&what);
  return status(ec, what);
}

cocclExtResult_t cocclMoeCreate(cocclMoe_t* moe, cocclComm_t comm, const cocclMoeConfig_t* c) {
  if (!moe || !comm || !c) return null_argument("cocclMoeCreate");
  return guarded([&] {
    coccl::moe::DispatchConfig config;
    config.max_tokens = c->max_tokens;
    config.hidden = c->hidden;
    config.type = static_cast<coccl::DataType>(c->datatype);
    config.top_k = c->top_k;
    config.num_experts = c->num_experts;
    config.max_recv_rows = c->max_recv_rows;
    *moe = new cocclMoe{coccl::moe::Dispatcher(comm->comm, config)};
  });
}

cocclExtResult_t cocclMoeDestroy(cocclMoe_t moe) {
  if (!moe) return null_argument("cocclMoeDestroy");
  return guarded([&] { delete moe; });
}

cocclExtResult_t cocclMoeDeviceBytes(cocclMoe_t moe, size_t* bytes) {
  if (!moe || !bytes) return null_argument("cocclMoeDeviceBytes");
  *bytes = moe->moe.device_bytes();
  return cocclExtSuccess;
}

cocclExtResult_t cocclMoeDispatch(cocclMoe_t moe, const void* x, int tokens,
                                  const int32_t* topk_idx, cocclMoeReceived_t* received,
                                  cocclStream_t stream) {
  if (!moe || !received) return null_argument("cocclMoeDispatch");
  return guarded(
      [&] { fill(received, moe->moe.dispatch(x, tokens, topk_idx, stream_of(stream))); });
}

cocclExtResult_t cocclMoeCombine(cocclMoe_t moe, const void* y, const float* w, void* out,
                                 cocclStream_t stream) {
  if (!moe) return null_argument("cocclMoeCombine");
  return guarded([&] { moe->moe.combine(y, w, out, stream_of(stream)); });
}

cocclExtResult_t cocclMoeDispatchHost(cocclMoe_t moe, const void* x, int tokens,
                                      const int32_t* topk_idx, cocclMoeReceived_t* received) {
  if (!moe || !received) return null_argument("cocclMoeDispatchHost");
  return guarded([&] { fill(received, moe->moe.dispatch(x, tokens, topk_idx)); });
}

cocclExtResult_t cocclMoeCombineHost(cocclMoe_t moe, const void* y, const float* w, void* out) {
  if (!moe) return null_argument("cocclMoeCombineHost");
  return guarded([&] { moe->moe.combine(y, w, out); });
}

cocclExtResult_t cocclMoeStatus(cocclMoe_t moe) {
  if (!moe) return null_argument("cocclMoeStatus");
  std::string what;
  const std::error_code ec = moe->moe.device_status(&what);
  return status(ec, what);
}

}  // extern "C"
