/* Collectives between the GPU ranks of this process over NCCL: one communicator per rank, each rank's
 * thread calling with its own rank on its own stream (capturable). */
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"

/* Grow-only, so fixed addresses for graphs once warmed up; a growth bumps the device generation (the
 * old buffer's release), so the engine's warm-up at load runs an all-gather of the most logit rows a
 * step can have, after which they never grow. */
typedef struct rank_bufs {
  servd_tensor *send, *recv; /* f32 */
} rank_bufs;

struct servd_device_comm {
  int world;
  int *devices;
  servd_nccl *nccl;
  rank_bufs *bufs; /* per rank, touched only by that rank's thread */
};

/* Creating, rebuilding and destroying the communicators concern every rank: they run on a native
 * thread of their own once the ranks' executors ran dry. Aborting does not wait: it releases an
 * executor waiting in a collective for a rank that failed. */
typedef struct comm_create_args {
  int world_size;
  const int *devices;
  servd_device_comm **out;
} comm_create_args;
SERVD__DEV_JOB(comm_create, servd_device_comm_create(a->world_size, a->devices, a->out))
typedef struct comm_destroy_args {
  servd_device_comm *c;
} comm_destroy_args;
SERVD__DEV_JOB(comm_destroy, (servd_device_comm_destroy(a->c), 0))
typedef struct comm_abort_args {
  servd_device_comm *c;
} comm_abort_args;
SERVD__DEV_JOB(comm_abort, (servd_device_comm_abort(a->c), 0))
typedef struct comm_reset_args {
  servd_device_comm *c;
} comm_reset_args;
SERVD__DEV_JOB(comm_reset, servd_device_comm_reset(a->c))
typedef struct allreduce_args {
  servd_device_comm *c;
  int rank;
  servd_tensor *x;
} allreduce_args;
SERVD__DEV_JOB(allreduce, servd_device_allreduce_sum(a->c, a->rank, a->x))
typedef struct allgather_args {
  servd_device_comm *c;
  int rank;
  servd_tensor *out;
  const servd_tensor *x;
} allgather_args;
SERVD__DEV_JOB(allgather, servd_device_allgather_cols(a->c, a->rank, a->out, a->x))

/* Waits until every rank's executor ran what was queued; clear: forgets their failures (the step
 * they belong to has failed). */
static void drain_ranks(const servd_device_comm *c, bool clear) {
  for (int r = 0; r < c->world; r++) servd__dev_drain(c->devices[r], clear);
}

int servd_device_comm_create(int world_size, const int *devices, servd_device_comm **out) {
  const char *op = "device_comm_create";
  *out = NULL;
  int rc = servd__dev_check_comm(op, world_size, devices);
  if (rc) return rc;
  for (int r = 0; r < world_size; r++)
    if ((rc = servd__dev_valid(op, devices[r]))) return rc;
  if (servd__dev_forwarding()) {
    comm_create_args a = {world_size, devices, out};
    return servd__dev_side(op, comm_create_job, &a);
  }
  servd_device_comm *c = calloc(1, sizeof *c);
  if (!c || !(c->devices = calloc((size_t)world_size, sizeof(int))) ||
      !(c->bufs = calloc((size_t)world_size, sizeof(rank_bufs)))) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of host memory", op);
    goto fail;
  }
  c->world = world_size;
  memcpy(c->devices, devices, sizeof(int) * (size_t)world_size);
  /* With graph registration NCCL exchanges the buffers of collectives captured in a CUDA graph with
   * the peer ranks while capturing. A capture that fails on one rank (the runner then drops that
   * bucket on every rank) would leave the other ranks' NCCL waiting for its handshake: keep it off.
   * NCCL reads the variable when a communicator is created, so it is set before; an operator's own
   * setting wins (servd's main sets it too, before any thread starts). */
  setenv("NCCL_GRAPH_REGISTER", "0", 0);
  rc = servd__dev_wrap(servd_nccl_create(&c->nccl, world_size, devices), op);
  if (rc) goto fail;
  *out = c;
  return SERVD_OK;
fail:
  servd_device_comm_destroy(c);
  return rc;
}

void servd_device_comm_destroy(servd_device_comm *c) {
  if (!c) return;
  if (servd__dev_forwarding()) {
    drain_ranks(c, false);
    comm_destroy_args a = {c};
    servd__dev_side("device_comm_destroy", comm_destroy_job, &a);
    return;
  }
  servd_nccl_destroy(c->nccl);
  for (int r = 0; c->bufs && r < c->world; r++) {
    servd_tensor_release(c->bufs[r].send);
    servd_tensor_release(c->bufs[r].recv);
  }
  free(c->bufs);
  free(c->devices);
  free(c);
}

static int check_rank(const char *op, const servd_device_comm *c, int rank) {
  if (!c) return servd_fail(SERVD_EINVAL, "%s: NULL communicator", op);
  if (rank < 0 || rank >= c->world) return servd_fail(SERVD_EINVAL, "%s: rank %d of %d", op, rank, c->world);
  return SERVD_OK;
}

int servd_device_allreduce_sum(servd_device_comm *c, int rank, servd_tensor *x) {
  const char *op = "device allreduce";
  SERVD__DEV_ASYNC(op, allreduce, (x), c, rank, x);
  char a[128];
  int rc = check_rank(op, c, rank);
  if (!rc) rc = servd__dev_check_tensor(op, "x", x, SERVD_BF16);
  if (rc) return rc;
  if (x->device != c->devices[rank])
    return servd_fail(SERVD_EINVAL, "%s: x %s is not on rank %d's device cuda:%d", op,
                      servd__dev_describe(x, a, sizeof a), rank, c->devices[rank]);
  servd_cuda_ctx *ctx;
  rc = servd__dev_ctx(op, x->device, &ctx);
  if (rc) return rc;
  return servd__dev_wrap(
      servd_nccl_allreduce_bf16(c->nccl, rank, ctx, servd_tensor_data(x), (size_t)servd_tensor_numel(x)), op);
}

/* Grows *t to at least n f32 elements (a new buffer moves the address; the old one's release bumps
 * the generation when a graph may name it). */
static int ensure(const char *op, int device, servd_tensor **t, int64_t n) {
  if (*t && (*t)->shape[0] >= n) return SERVD_OK;
  servd_tensor *nt;
  int rc = servd__dev_tensor(op, device, SERVD_F32, 1, &n, false, &nt);
  if (rc) return rc;
  servd_tensor_release(*t);
  *t = nt;
  return SERVD_OK;
}

int servd_device_allgather_cols(servd_device_comm *c, int rank, servd_tensor *out, const servd_tensor *x) {
  const char *op = "device allgather_cols";
  SERVD__DEV_ASYNC(op, allgather, (out, (servd_tensor *)x), c, rank, out, x);
  char a[128], b[128];
  int rc = check_rank(op, c, rank);
  if (!rc) rc = servd__dev_check_tensor(op, "out", out, SERVD_F32);
  if (!rc) rc = servd__dev_check_tensor(op, "x", x, SERVD_F32);
  if (rc) return rc;
  const int dev = c->devices[rank];
  if (x->device != dev || out->device != dev)
    return servd_fail(SERVD_EINVAL, "%s: out %s and x %s must be on rank %d's device cuda:%d", op,
                      servd__dev_describe(out, a, sizeof a), servd__dev_describe(x, b, sizeof b), rank, dev);
  if (out->ndim != 2 || x->ndim != 2 || x->shape[0] != out->shape[0])
    return servd_fail(SERVD_EINVAL, "%s: out %s, x %s: expected out (m, N) and x (m, n_r)", op,
                      servd__dev_describe(out, a, sizeof a), servd__dev_describe(x, b, sizeof b));
  const int64_t m = out->shape[0], N = out->shape[1], W = c->world, P = (N + W - 1) / W;
#define NCOLS(r) (N - (r)*P < 0 ? 0 : (N - (r)*P < P ? N - (r)*P : P))
  if (x->shape[1] != NCOLS(rank))
    return servd_fail(SERVD_EINVAL,
                      "%s: rank %d of %lld: x %s must have %lld columns of out %s (ceil(N/world) = %lld each)", op,
                      rank, (long long)W, servd__dev_describe(x, a, sizeof a), (long long)NCOLS(rank),
                      servd__dev_describe(out, b, sizeof b), (long long)P);
  if (m == 0 || N == 0) return SERVD_OK;
  servd_cuda_ctx *ctx;
  rc = servd__dev_ctx(op, dev, &ctx);
  if (rc) return rc;
  rank_bufs *rb = &c->bufs[rank];
  if ((rc = ensure(op, dev, &rb->send, m * P)) || (rc = ensure(op, dev, &rb->recv, W * m * P))) return rc;
  const size_t f = sizeof(float);
  float *send = servd_tensor_data(rb->send), *recv = servd_tensor_data(rb->recv);
  const int64_t nr = NCOLS(rank);
  /* Pad this rank's (m, n_r) to (m, P) so every rank sends the same count. */
  if (nr > 0)
    rc = servd_cuda_copy_2d(ctx, send, (size_t)P * f, servd_tensor_data(x), (size_t)nr * f, (size_t)nr * f, (size_t)m);
  if (!rc) rc = servd_nccl_allgather_f32(c->nccl, rank, ctx, send, recv, (size_t)(m * P));
  float *o = servd_tensor_data(out);
  for (int64_t q = 0; !rc && q < W; q++) {
    const int64_t nq = NCOLS(q);
    if (nq > 0)
      rc =
          servd_cuda_copy_2d(ctx, o + q * P, (size_t)N * f, recv + q * m * P, (size_t)P * f, (size_t)nq * f, (size_t)m);
  }
#undef NCOLS
  return servd__dev_wrap(rc, op);
}

void servd_device_comm_abort(servd_device_comm *c) {
  if (!c) return;
  if (servd__dev_forwarding()) {
    comm_abort_args a = {c};
    servd__dev_side("device_comm_abort", comm_abort_job, &a);
    return;
  }
  servd_nccl_abort(c->nccl);
}

int servd_device_comm_reset(servd_device_comm *c) {
  if (!c) return servd_fail(SERVD_EINVAL, "device_comm_reset: NULL communicator");
  if (servd__dev_forwarding()) {
    drain_ranks(c, true);
    comm_reset_args a = {c};
    return servd__dev_side("device_comm_reset", comm_reset_job, &a);
  }
  return servd__dev_wrap(servd_nccl_rebuild(c->nccl), "device_comm_reset");
}
