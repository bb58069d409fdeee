/* coccl_ext.h: C interface to coccl's extensions beyond the NCCL API: all-to-all-v with counts in
 * device memory, and MoE dispatch/combine. A C view of <coccl/moe.hpp>; read that header for the
 * full semantics (collective first call, graph capture, clamping of counts on the device).
 *
 * Handles are opaque and independent of nccl.h: a cocclComm_t wraps a coccl communicator made
 * here from a UniqueId text (cocclExtGetUniqueId on one rank, the text shipped to all others).
 * Every function returns cocclExtSuccess or an error code, never throws; cocclExtLastError()
 * describes the calling thread's last error. Data types take ncclDataType_t's values
 * (ncclFloat32 = 7, ncclFloat16 = 6, ncclBfloat16 = 9, ...). Streams are cudaStream_t.
 */
#ifndef COCCL_EXT_H
#define COCCL_EXT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  cocclExtSuccess = 0,
  cocclExtInvalidArgument = 1, /* bad argument or configuration; nothing was done */
  cocclExtUnsupported = 2,     /* e.g. device memory in a build without CUDA */
  cocclExtCudaError = 3,
  cocclExtError = 4 /* any other failure (peer lost, timeout, ...) */
} cocclExtResult_t;

typedef struct cocclComm* cocclComm_t;
typedef struct cocclAllToAllv* cocclAllToAllv_t;
typedef struct cocclMoe* cocclMoe_t;
typedef struct CUstream_st* cocclStream_t;

/* Length of a UniqueId text, terminating NUL included. */
#define COCCL_EXT_UNIQUE_ID_CHARS 257

/* Creates a new UniqueId (starting its bootstrap root in this process) and writes its text
 * (COCCL_EXT_UNIQUE_ID_CHARS bytes) to `text`. */
cocclExtResult_t cocclExtGetUniqueId(char* text);

/* Joins the communicator named by `unique_id_text` as `rank` of `nranks`; blocks until all
 * ranks joined. */
cocclExtResult_t cocclExtCommInit(cocclComm_t* comm, const char* unique_id_text, int rank,
                                  int nranks);
/* Waits for operations in flight, then frees the communicator. */
cocclExtResult_t cocclExtCommDestroy(cocclComm_t comm);

/* Description of the calling thread's last error ("" if none). */
const char* cocclExtLastError(void);

/* ---- all-to-all-v with counts where the data is ---- */

/* An exchange object of `comm` for counts of at most `max_count` elements per peer. Allocates
 * nothing until the first device call. */
cocclExtResult_t cocclAllToAllvCreate(cocclAllToAllv_t* a2a, cocclComm_t comm, size_t max_count,
                                      int datatype);
/* Frees it (synchronise its stream first; collective once it made device calls). */
cocclExtResult_t cocclAllToAllvDestroy(cocclAllToAllv_t a2a);
/* Device memory it holds on this rank's GPU (0 before the first device call). */
cocclExtResult_t cocclAllToAllvDeviceBytes(cocclAllToAllv_t a2a, size_t* bytes);
/* Device form: buffers and int64 counts/displacements in device memory; null displacements mean
 * packed. Enqueues on `stream`, capturable in CUDA graphs. */
cocclExtResult_t cocclAllToAllvDevice(cocclAllToAllv_t a2a, const void* send,
                                      const int64_t* send_counts, const int64_t* send_displs,
                                      void* recv, int64_t* recv_counts, const int64_t* recv_displs,
                                      cocclStream_t stream);
/* Host form: everything in host memory; blocks. */
cocclExtResult_t cocclAllToAllvHost(cocclAllToAllv_t a2a, const void* send,
                                    const int64_t* send_counts, const int64_t* send_displs,
                                    void* recv, int64_t* recv_counts, const int64_t* recv_displs);
/* cocclExtInvalidArgument if a kernel clamped a count since the last check (synchronise first). */
cocclExtResult_t cocclAllToAllvStatus(cocclAllToAllv_t a2a);

/* ---- MoE dispatch and combine ---- */

typedef struct {
  int max_tokens;       /* tokens per rank and call, at most */
  int hidden;           /* elements per row; hidden * element size a multiple of 16 bytes */
  int datatype;         /* ncclFloat32, ncclFloat16 or ncclBfloat16 */
  int top_k;            /* 1..16 */
  int num_experts;      /* a multiple of the ranks, at most 512 */
  size_t max_recv_rows; /* rows a rank can receive; 0: nranks * max_tokens * top_k */
} cocclMoeConfig_t;

typedef struct {
  void* x;                       /* received rows, grouped by local expert */
  const int32_t* rows;           /* per row: source rank, token, slot, expert */
  const int32_t* expert_counts;  /* local_experts entries */
  const int32_t* expert_offsets; /* local_experts + 1 entries; the last is the row count */
  size_t capacity;
  int local_experts;
  int first_expert;
} cocclMoeReceived_t;

cocclExtResult_t cocclMoeCreate(cocclMoe_t* moe, cocclComm_t comm, const cocclMoeConfig_t* config);
/* Destroying an object that made device calls is collective (see coccl/moe.hpp). */
cocclExtResult_t cocclMoeDestroy(cocclMoe_t moe);
cocclExtResult_t cocclMoeDeviceBytes(cocclMoe_t moe, size_t* bytes);
/* Device forms (see coccl::moe::Dispatcher::dispatch and combine). */
cocclExtResult_t cocclMoeDispatch(cocclMoe_t moe, const void* x, int tokens,
                                  const int32_t* topk_idx, cocclMoeReceived_t* received,
                                  cocclStream_t stream);
cocclExtResult_t cocclMoeCombine(cocclMoe_t moe, const void* y, const float* topk_weights,
                                 void* out, cocclStream_t stream);
/* Host forms. */
cocclExtResult_t cocclMoeDispatchHost(cocclMoe_t moe, const void* x, int tokens,
                                      const int32_t* topk_idx, cocclMoeReceived_t* received);
cocclExtResult_t cocclMoeCombineHost(cocclMoe_t moe, const void* y, const float* topk_weights,
                                     void* out);
/* cocclExtInvalidArgument if a kernel dropped rows or ignored a bad expert id since the last
 * check (synchronise first). */
cocclExtResult_t cocclMoeStatus(cocclMoe_t moe);

#ifdef __cplusplus
}
#endif

#endif /* COCCL_EXT_H */
