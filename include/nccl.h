/* nccl.h: coccl's implementation of the NCCL C API (libnccl.so.2 from coccl).
 *
 * Programs written for NCCL compile against this header and run on coccl unchanged: type names,
 * enumerator values, struct layouts and function signatures are those of NCCL 2.28, so a binary
 * built against NVIDIA's header also runs with coccl's library in its place (LD_LIBRARY_PATH or
 * LD_PRELOAD). The text and the implementation are coccl's own.
 *
 * Where coccl differs from NCCL:
 *  - Device collectives among the GPUs of one host use coccl's NVLink kernels (at most 8 GPUs);
 *    between hosts (NCCL_HOSTID / COCCL_HOSTID apply) they stage through pinned host memory and
 *    coccl's proxy moves them over the network, hierarchically where hosts hold several ranks. A
 *    device send/receive group holds at most 32 transfers per communicator on one host, and
 *    across hosts at most 128 non-empty ones each way.
 *  - Each communicator made on a GPU sets up its device workspace during the (collective)
 *    initialisation, so no later call waits for peers on the host.
 *  - After ncclCommAbort, coccl's kernels still waiting for a peer see the communicator's abort
 *    flag and return (the CUDA context stays usable), but the aborted communicator's device
 *    memory stays allocated.
 *  - Not supported (they return ncclInvalidUsage): ncclCommRevoke, ncclGroupSimulateEnd, and the
 *    device-side API of nccl_device.h.
 *  - ncclCommShrink works on a parent that has failed (a lost rank, a timeout) as on a healthy
 *    one: the survivors meet on the lowest survivor's listener of the parent, not over the
 *    parent's links (Communicator::shrink). Every survivor passes the same exclude list; the
 *    excluded ranks do not call it. NCCL_SHRINK_ABORT aborts the parent's operations first. The
 *    parent stays as it was; release it with ncclCommAbort or ncclCommDestroy afterwards.
 *  - A group's device work goes on the streams its calls name, without making those streams
 *    wait for one another; a communicator's sends and receives of one group use the stream of
 *    the first of them.
 *  - Registration (ncclCommRegister, ncclCommWindowRegister) is accepted and has no effect.
 *  - Environment: NCCL_DEBUG, NCCL_DEBUG_SUBSYS, NCCL_DEBUG_FILE, NCCL_SOCKET_IFNAME,
 *    NCCL_COMM_ID, NCCL_SHM_DISABLE, NCCL_ALGO and NCCL_PROTO are read as their COCCL_* twins
 *    (NCCL_ALGO only with coccl's names: oneshot, direct, ring); other NCCL_* are ignored.
 *
 * Every function returns an ncclResult_t (ncclGetErrorString and ncclGetLastError excepted). On
 * failure ncclGetLastError() describes the problem in words. Every function is also exported
 * under a "p" prefix (pncclAllReduce, ...), the names profilers intercept.
 *
 * coccl extension: on a machine without GPUs (or a build without CUDA) the collectives accept
 * host memory. A buffer that is not device memory is moved by coccl's host transports; the call
 * returns once the operation has finished on this rank and the stream argument is ignored.
 */
#ifndef NCCL_H_
#define NCCL_H_

/* cudaStream_t comes from the CUDA runtime when its headers are present; a host-only program
 * gets the same opaque pointer type from here. */
#if defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#define COCCL_NCCL_HAVE_CUDA_RUNTIME_H 1
#endif
#endif
#ifndef COCCL_NCCL_HAVE_CUDA_RUNTIME_H
typedef struct CUstream_st* cudaStream_t;
#endif

#include <limits.h>
#include <stddef.h>

/* The NCCL release whose API this header reproduces. */
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

/* Version numbers are X*1000+Y*100+Z up to 2.8 and X*10000+Y*100+Z from 2.9 on. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE 22809

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator: one rank's handle on a group of ranks. */
typedef struct ncclComm* ncclComm_t;
/* A registered memory window (ncclCommWindowRegister). */
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* The token every rank of a new communicator must hold (from ncclGetUniqueId on one rank). For
 * coccl it carries the bootstrap root's address and a secret that authenticates the members. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Result codes. ncclInProgress is returned by nonblocking communicators whose work continues
 * in the background; poll ncclCommGetAsyncError until it changes. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

/* "Not set" markers of ncclConfig_t fields, and the split colour that joins no communicator. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* ncclCommWindowRegister flags and the alignment NCCL asks of window buffers. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* Values of ncclConfig_t.CTAPolicy (a hint; coccl's kernels choose their own grid). */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags: plain shrink, or abort the parent's operations first. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* The only flag ncclCommRevoke accepts. */
#define NCCL_REVOKE_DEFAULT 0x00

/* Options of a new communicator. Start from NCCL_CONFIG_INITIALIZER and set what you need.
 * coccl honours `blocking` (0: initialisation and split return ncclInProgress and finish in the
 * background) and reads, but need not act on, the tuning hints. */
typedef struct ncclConfig_v22800 {
  size_t size;          /* set by the initializer: sizeof(ncclConfig_t) */
  unsigned int magic;   /* set by the initializer */
  unsigned int version; /* set by the initializer: NCCL_VERSION_CODE of the header */
  int blocking;         /* 1 (default): calls return when done; 0: nonblocking */
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                         \
  {                                                                                     \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                    \
  }

/* Output of ncclGroupSimulateEnd. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                                        \
  {                                                                                      \
    sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
        NCCL_UNDEF_FLOAT                                                                 \
  }

/* Reduction operators. Values from ncclNumOps up are made by ncclRedOpCreatePreMulSum. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4, /* sum divided by the number of ranks (integers truncate) */
  ncclNumOps = 5,
  /* Largest value the type holds, kept as wide as ncclRedOp_dummy_t for ABI stability. */
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* Element types. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum {
  /* Device memory, read by every collective that uses the operator (it may change between
   * collectives). */
  ncclScalarDevice = 0,
  /* Host memory, read once by ncclRedOpCreatePreMulSum. */
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* ---- Memory ---- */

/* Allocates `size` bytes of device memory on the current GPU (host memory where no GPU exists,
 * a coccl extension). Free with ncclMemFree. */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);
/* Frees memory from ncclMemAlloc. */
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* ---- Library and communicator setup ---- */

/* Stores the NCCL_VERSION_CODE of the API this library implements. */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/* Makes a new id on one rank (it starts the bootstrap root in this process); copy it to every
 * rank of the communicator to be formed. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/* Joins communicator `commId` as `rank` of `nranks`, bound to the current GPU. Collective: it
 * returns once every rank has joined (blocking configs), or with ncclInProgress (nonblocking).
 * Inside ncclGroupStart/End the joins of the group run together at ncclGroupEnd, so one thread
 * may create several ranks of one communicator. `config` may be NULL. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);
/* ncclCommInitRankConfig with the default config. */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
/* Creates all `ndev` ranks of one communicator in this process, rank i on GPU devlist[i] (GPU i
 * when devlist is NULL). comm must hold ndev handles. */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
/* ncclCommInitRankConfig from several ids (the same list on every rank). coccl's bootstrap is
 * already a tree, so it uses commIds[0]. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);

/* Finishes this rank's operations on `comm` and releases its connections; ncclCommDestroy then
 * frees the handle. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);
/* Waits for this rank's operations on `comm`, releases it and frees the handle. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);
/* Stops `comm` now (operations in flight fail), tells the peers, and frees the handle. Returns
 * promptly even when a peer is dead or silent. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);
/* Not supported by coccl: returns ncclInvalidUsage. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* Collective over `comm`: ranks passing the same colour form a new communicator, ordered by
 * key and then by their rank in `comm`. NCCL_SPLIT_NOCOLOR gives *newcomm = NULL. A NULL config
 * inherits the parent's blocking mode. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config);
/* Makes a communicator of the ranks of `comm` not listed in excludeRanksList, in their order.
 * Only the remaining ranks call it. The parent must still be healthy in coccl. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);

/* ---- Errors and queries ---- */

/* A fixed description of a result code. */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);
/* The description of the last failure of a call made by this thread (comm may be NULL), or of
 * `comm`'s own failure if it has one; "" if there is none. Valid until the thread's next call. */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);
/* Kept for binary compatibility; coccl reads its logging settings once and ignores this. */
void ncclResetDebugInit(void);
void pncclResetDebugInit(void);
/* ncclInProgress while a nonblocking init or split is running, the error that ended the
 * communicator if it failed, else ncclSuccess. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
/* Number of ranks, the GPU the communicator was made on, and this rank. */
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/* ---- Registration ----
 * coccl's kernels need no registration of user buffers; these calls check their arguments and
 * return handles so that programs which register keep working. */

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                     int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* ---- Custom reduction operators ---- */

/* Makes an operator for collectives of `comm` on `datatype` that multiplies each rank's input by
 * *scalar and then sums. The scalar is read now (ncclScalarHostImmediate) or by each collective
 * (ncclScalarDevice: device memory, or host memory for host-memory collectives). */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);
/* Releases an operator of `comm` once the last call using it has returned. */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ---- Collectives ----
 * Each rank of `comm` calls the same collectives in the same order. Device buffers: the call
 * enqueues the work on `stream` and returns. Counts are in elements. sendbuff == recvbuff (or the
 * rank's slice of it, for the gathering and scattering calls) runs in place. */

/* root's recvbuff[i] = op over ranks of sendbuff[i]; recvbuff is used on root only. */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);
/* In-place broadcast: every rank's buff = root's buff. */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);
/* Every rank's recvbuff = root's sendbuff (read on root only). */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);
/* recvbuff[i] = op over ranks of sendbuff[i]. */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);
/* recvbuff[i] = op over ranks r of r's sendbuff[rank*recvcount + i]; sendbuff holds
 * nranks*recvcount elements. */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);
/* recvbuff[r*sendcount ..] = rank r's sendbuff. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
/* recvbuff[r*count ..] = rank r's sendbuff[rank*count ..]. Not in place. */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
/* root's recvbuff[r*count ..] = rank r's sendbuff; recvbuff is used on root only. */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
/* Rank r's recvbuff = root's sendbuff[r*count ..]; sendbuff is read on root only. */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* ---- Point to point ----
 * A send to `peer` pairs with a receive from this rank on `peer`, in order, with equal counts.
 * Put the sends and receives of an exchange inside ncclGroupStart/End so they progress
 * together. */

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* ---- Groups ----
 * Calls between ncclGroupStart and the matching ncclGroupEnd (groups nest; the outermost pair
 * counts) are only recorded; ncclGroupEnd runs them all as one launch per communicator, so any
 * mix of collectives and sends/receives, over any number of communicators driven by this
 * thread, completes without deadlock. Groups are per thread. */

ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);
/* Not supported by coccl (it has no cost model): drops the group's calls and returns
 * ncclInvalidUsage. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

#ifdef __cplusplus
}
#endif

#endif
