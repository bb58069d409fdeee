#include "nccl_api_calls.h"

ncclResult_t fuzz_nccl_collective(int which, const void* send, void* recv, size_t count, int type,
                                  int op, int root, ncclComm_t comm) {
  const ncclDataType_t t = (ncclDataType_t)type;
  const ncclRedOp_t o = (ncclRedOp_t)op;
  switch (which) {
    case 0:
      return ncclAllReduce(send, recv, count, t, o, comm, NULL);
    case 1:
      return ncclBroadcast(send, recv, count, t, root, comm, NULL);
    case 2:
      return ncclBcast(recv, count, t, root, comm, NULL);
    case 3:
      return ncclReduce(send, recv, count, t, o, root, comm, NULL);
    case 4:
      return ncclAllGather(send, recv, count, t, comm, NULL);
    case 5:
      return ncclReduceScatter(send, recv, count, t, o, comm, NULL);
    case 6:
      return ncclAlltoAll(send, recv, count, t, comm, NULL);
    case 7:
      return ncclGather(send, recv, count, t, root, comm, NULL);
    case 8:
      return ncclScatter(send, recv, count, t, root, comm, NULL);
    case 9:
      return ncclSend(send, count, t, root, comm, NULL);
    default:
      return ncclRecv(recv, count, t, root, comm, NULL);
  }
}

ncclResult_t fuzz_nccl_premulsum(int* op, void* scalar, int type, int residence, ncclComm_t comm) {
  ncclRedOp_t made = ncclSum;
  ncclResult_t r = ncclRedOpCreatePreMulSum(&made, scalar, (ncclDataType_t)type,
                                            (ncclScalarResidence_t)residence, comm);
  *op = (int)made;
  return r;
}

ncclResult_t fuzz_nccl_op_destroy(int op, ncclComm_t comm) {
  return ncclRedOpDestroy((ncclRedOp_t)op, comm);
}

const char* fuzz_nccl_error_string(int result) { return ncclGetErrorString((ncclResult_t)result); }
