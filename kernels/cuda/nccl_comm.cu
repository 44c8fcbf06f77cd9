// NCCL between GPU ranks of this process: one communicator per rank from ncclCommInitAll; each rank's
// thread issues its own collective on its context's stream.
#include <nccl.h>
#include <stdlib.h>

#include "cuda_common.cuh"

struct servd_nccl {
  int n;
  ncclComm_t *comms; /* NULL entries after an abort until servd_nccl_rebuild */
  int *devices;
  int aborted;       /* atomic: collectives refuse to start */
};

#define NCCL_CHECK(call)                                                                                \
  do {                                                                                                  \
    ncclResult_t r_ = (call);                                                                           \
    if (r_ != ncclSuccess)                                                                              \
      return servd_fail(SERVD_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
  } while (0)

extern "C" int servd_nccl_create(servd_nccl **out, int n_ranks, const int *devices) {
  *out = NULL;
  if (n_ranks < 1) return servd_fail(SERVD_EINVAL, "nccl_create: %d ranks", n_ranks);
  servd_nccl *n = (servd_nccl *)calloc(1, sizeof *n);
  ncclComm_t *comms = (ncclComm_t *)calloc((size_t)n_ranks, sizeof *comms);
  int *devs = (int *)calloc((size_t)n_ranks, sizeof *devs);
  if (!n || !comms || !devs) {
    free(n);
    free(comms);
    free(devs);
    return servd_fail(SERVD_ENOMEM, "nccl_create: out of host memory");
  }
  for (int i = 0; i < n_ranks; i++) devs[i] = devices[i];
  ncclResult_t r = ncclCommInitAll(comms, n_ranks, devices);
  if (r != ncclSuccess) {
    free(n);
    free(comms);
    free(devs);
    return servd_fail(SERVD_EDEVICE, "nccl_create(%d ranks): %s", n_ranks, ncclGetErrorString(r));
  }
  n->n = n_ranks;
  n->comms = comms;
  n->devices = devs;
  *out = n;
  return SERVD_OK;
}

extern "C" void servd_nccl_destroy(servd_nccl *n) {
  if (!n) return;
  for (int i = 0; i < n->n; i++)
    if (n->comms[i]) ncclCommDestroy(n->comms[i]);
  free(n->comms);
  free(n->devices);
  free(n);
}

static int nccl_usable(servd_nccl *n, int rank, const char *op) {
  if (rank < 0 || rank >= n->n) return servd_fail(SERVD_EINVAL, "nccl %s: rank %d of %d", op, rank, n->n);
  if (__atomic_load_n(&n->aborted, __ATOMIC_ACQUIRE) || !n->comms[rank])
    return servd_fail(SERVD_ECANCELED, "nccl %s: the communicators were aborted (a rank failed); rebuild them", op);
  return SERVD_OK;
}

extern "C" int servd_nccl_allreduce_bf16(servd_nccl *n, int rank, servd_cuda_ctx *c, servd_bf16_t *x,
                                         size_t count) {
  int rc = nccl_usable(n, rank, "allreduce");
  if (rc) return rc;
  if (n->n == 1 || count == 0) return SERVD_OK;
  NCCL_CHECK(ncclAllReduce(x, x, count, ncclBfloat16, ncclSum, n->comms[rank], servd__stream(c)));
  return SERVD_OK;
}

extern "C" int servd_nccl_allgather_f32(servd_nccl *n, int rank, servd_cuda_ctx *c, const float *send, float *recv,
                                        size_t count) {
  int rc = nccl_usable(n, rank, "allgather");
  if (rc) return rc;
  if (count == 0) return SERVD_OK;
  if (n->n == 1) {
    if (send != recv) SERVD_CUDA_CHECK(cudaMemcpyAsync(recv, send, count * sizeof(float), cudaMemcpyDeviceToDevice,
                                                       servd__stream(c)));
    return SERVD_OK;
  }
  NCCL_CHECK(ncclAllGather(send, recv, count, ncclFloat32, n->comms[rank], servd__stream(c)));
  return SERVD_OK;
}

extern "C" void servd_nccl_abort(servd_nccl *n) {
  if (!n) return;
  // Only the flag may be raced by several callers; the comms themselves are aborted by whoever
  // raises it first, which makes every rank blocked inside a collective return.
  if (__atomic_exchange_n(&n->aborted, 1, __ATOMIC_ACQ_REL)) return;
  for (int i = 0; i < n->n; i++) {
    if (!n->comms[i]) continue;
    ncclCommAbort(n->comms[i]);
    n->comms[i] = NULL;
  }
}

extern "C" int servd_nccl_rebuild(servd_nccl *n) {
  for (int i = 0; i < n->n; i++)
    if (n->comms[i]) {
      ncclCommDestroy(n->comms[i]);
      n->comms[i] = NULL;
    }
  __atomic_store_n(&n->aborted, 1, __ATOMIC_RELEASE);
  ncclResult_t r = ncclCommInitAll(n->comms, n->n, n->devices);
  if (r != ncclSuccess) {
    for (int i = 0; i < n->n; i++) n->comms[i] = NULL; /* nothing half-made is used or destroyed later */
    return servd_fail(SERVD_EDEVICE, "nccl rebuild(%d ranks): %s", n->n, ncclGetErrorString(r));
  }
  __atomic_store_n(&n->aborted, 0, __ATOMIC_RELEASE);
  return SERVD_OK;
}
