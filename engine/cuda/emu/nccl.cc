// nccl.cc: the CUDA emulator's NCCL (nccl.h): a communicator of one rank. Every collective on one
// rank leaves each element as it is (sum, product, min, max and average of one value), so it is a
// copy from the send buffer to the receive buffer, or nothing in place.
#include "nccl.h"
#include <stdio.h>
#include <string.h>

struct rx_emu_nccl_comm {
  int nranks = 1;
};

static char last_error[256];

static ncclResult_t fail(ncclResult_t r, const char *what) {
  snprintf(last_error, sizeof last_error, "%s", what);
  return r;
}

extern "C" const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return last_error[0] ? last_error : "invalid argument";
    case ncclInvalidUsage: return last_error[0] ? last_error : "invalid usage";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    default: return "internal error";
  }
}
extern "C" const char *ncclGetLastError(ncclComm_t comm) { return last_error; }
extern "C" ncclResult_t ncclGetVersion(int *version) {
  *version = 22800;
  return ncclSuccess;
}
extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  memcpy(id->internal, "remax-emu", 9);
  return ncclSuccess;
}
extern "C" ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  *comm = nullptr;
  if (nranks != 1 || rank != 0) {
    char msg[200];
    snprintf(msg, sizeof msg, "ncclCommInitRank(nranks %d, rank %d): the CUDA emulator's NCCL has one rank only "
             "(run one process, or a real GPU)", nranks, rank);
    return fail(ncclInvalidUsage, msg);
  }
  *comm = new rx_emu_nccl_comm;
  return ncclSuccess;
}
extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}
extern "C" ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
  *async_error = ncclSuccess;
  return ncclSuccess;
}
extern "C" ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  *count = 1;
  return ncclSuccess;
}
extern "C" ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  *rank = 0;
  return ncclSuccess;
}
extern "C" ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
extern "C" ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

// The one-rank collective: recv = send, both `count` elements of device memory.
static ncclResult_t one_rank(const char *call, const void *send, void *recv, size_t count, ncclDataType_t t,
                             ncclComm_t comm, cudaStream_t stream) {
  char msg[200];
  if (!comm) return fail(ncclInvalidArgument, "no communicator");
  if ((unsigned)t > ncclBfloat16) {
    snprintf(msg, sizeof msg, "%s: unknown datatype %d", call, (int)t);
    return fail(ncclInvalidArgument, msg);
  }
  const size_t bytes = count * type_size(t);
  if (!bytes) return ncclSuccess;
  if (!rx_emu_is_device_range(send, bytes) || !rx_emu_is_device_range(recv, bytes)) {
    snprintf(msg, sizeof msg, "%s: %zu bytes at %p -> %p are not inside device allocations", call, bytes, send, recv);
    return fail(ncclInvalidArgument, msg);
  }
  if (send != recv && cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
    return ncclUnhandledCudaError;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return one_rank("ncclAllReduce", sendbuff, recvbuff, count, datatype, comm, stream);
}
extern "C" ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream) {
  if (root != 0) return fail(ncclInvalidArgument, "ncclBroadcast: root is not rank 0 of a one-rank communicator");
  return one_rank("ncclBroadcast", sendbuff, recvbuff, count, datatype, comm, stream);
}
extern "C" ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                   ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  if (root != 0) return fail(ncclInvalidArgument, "ncclReduce: root is not rank 0 of a one-rank communicator");
  return one_rank("ncclReduce", sendbuff, recvbuff, count, datatype, comm, stream);
}
extern "C" ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream) {
  return one_rank("ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, comm, stream);
}
extern "C" ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                      ncclComm_t comm, cudaStream_t stream) {
  return one_rank("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, comm, stream);
}
