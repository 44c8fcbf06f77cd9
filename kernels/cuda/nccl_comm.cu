// NCCL between GPU ranks of this process: one communicator per rank from ncclCommInitAll; each rank's
// thread issues its own collective on its context's stream.
#include <nccl.h>
#include <stdlib.h>

#include "cuda_common.cuh"

struct servd_nccl {
  int n;
  ncclComm_t *comms;
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
  if (!n || !comms) {
    free(n);
    free(comms);
    return servd_fail(SERVD_ENOMEM, "nccl_create: out of host memory");
  }
  ncclResult_t r = ncclCommInitAll(comms, n_ranks, devices);
  if (r != ncclSuccess) {
    free(n);
    free(comms);
    return servd_fail(SERVD_EDEVICE, "nccl_create(%d ranks): %s", n_ranks, ncclGetErrorString(r));
  }
  n->n = n_ranks;
  n->comms = comms;
  *out = n;
  return SERVD_OK;
}

extern "C" void servd_nccl_destroy(servd_nccl *n) {
  if (!n) return;
  for (int i = 0; i < n->n; i++) ncclCommDestroy(n->comms[i]);
  free(n->comms);
  free(n);
}

extern "C" int servd_nccl_allreduce_bf16(servd_nccl *n, int rank, servd_cuda_ctx *c, servd_bf16_t *x,
                                         size_t count) {
  if (rank < 0 || rank >= n->n) return servd_fail(SERVD_EINVAL, "nccl allreduce: rank %d of %d", rank, n->n);
  if (n->n == 1 || count == 0) return SERVD_OK;
  NCCL_CHECK(ncclAllReduce(x, x, count, ncclBfloat16, ncclSum, n->comms[rank], servd__stream(c)));
  return SERVD_OK;
}
