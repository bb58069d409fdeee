/* The nccl.h entry points that take a datatype, operator, residence or result, called with plain
 * ints: C passes any int as an enum argument (out of range included), which is what the library
 * must check, while C++ cannot even form such an enum value without undefined behaviour. */
#ifndef COCCL_TESTS_FUZZ_NCCL_API_CALLS_H
#define COCCL_TESTS_FUZZ_NCCL_API_CALLS_H

#include <nccl.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The collective `which` (0 AllReduce, 1 Broadcast, 2 Bcast, 3 Reduce, 4 AllGather,
 * 5 ReduceScatter, 6 AlltoAll, 7 Gather, 8 Scatter, 9 Send, 10 Recv; root is the peer of Send and
 * Recv) on the default stream. */
ncclResult_t fuzz_nccl_collective(int which, const void* send, void* recv, size_t count, int type,
                                  int op, int root, ncclComm_t comm);
ncclResult_t fuzz_nccl_premulsum(int* op, void* scalar, int type, int residence, ncclComm_t comm);
ncclResult_t fuzz_nccl_op_destroy(int op, ncclComm_t comm);
const char* fuzz_nccl_error_string(int result);

#ifdef __cplusplus
}
#endif

#endif
