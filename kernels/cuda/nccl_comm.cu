// NCCL between GPU ranks of this process: one communicator per rank from ncclCommInitAll; each rank's
// thread issues its own collective on its context's stream.
//
// Abort protocol. A rank's communicator is used by that rank's thread (its collectives) and by
// abort, rebuild and destroy from any thread. A per-rank atomic state says who may touch it:
//   IDLE      valid; no thread is inside an NCCL call with it;
//   BUSY      the rank's thread is inside a collective (from the check to the end of the enqueue);
//   REVOKING  BUSY, and abort is revoking it (NCCL >= 2.28) so that the blocked call returns;
//   PENDING   BUSY, and abort came meanwhile: the rank's thread aborts it when its call returns;
//   DEAD      aborted (ncclCommAbort freed it); the handle is not read until rebuild replaces it.
// A collective claims its communicator with a compare-and-swap IDLE -> BUSY before it reads the
// handle, and gives it back with BUSY -> IDLE after the call. When that fails an abort came while it
// was inside: it waits out REVOKING (a short non-blocking call), then, the only user of the
// communicator, aborts it itself and sets DEAD.
// servd_nccl_abort raises `aborted` (new collectives refuse) and, per rank, claims an IDLE
// communicator by IDLE -> DEAD and aborts it, or marks a BUSY one PENDING (after revoking it where
// NCCL has ncclCommRevoke, which stops its operations and frees nothing). It never waits for a rank:
// a rank may be blocked inside NCCL (a first collective connecting to a peer that never comes), and
// what releases it is its peers' communicators being aborted (their connections close) or the
// revoke. Ranks blocked on the GPU instead (a collective kernel waiting for a peer, the host in a
// stream sync outside NCCL) hold IDLE communicators, and ncclCommAbort makes those kernels exit.
// So ncclCommAbort runs once per communicator, by a thread that owns it exclusively, and no handle is
// used after it is freed. rebuild and destroy run under `admin`; abort takes it too, which orders an
// abort before or after a whole rebuild (a collective never takes it, so abort never waits for a
// rank). rebuild aborts, fails with SERVD_EBUSY while a rank is still inside, else makes new
// communicators, stores each handle while its state is DEAD and publishes it with a release store
// of IDLE (the collectives' acquiring compare-and-swap then sees the handle), and clears `aborted`
// last. Aborting frees the buffers that captured collectives name, so it bumps the device's graph
// generation.
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "cuda_common.cuh"

#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
// Weak: a binary built here still loads where the NCCL library predates ncclCommRevoke.
extern "C" ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) __attribute__((weak));
#define SERVD_NCCL_HAS_REVOKE 1
#endif

enum { ST_IDLE, ST_BUSY, ST_REVOKING, ST_PENDING, ST_DEAD };

struct servd_nccl {
  int n;
  ncclComm_t *comms; /* comms[r] is read only by whoever owns it under the protocol above */
  int *state;        /* atomic, per rank */
  int *devices;
  int aborted; /* atomic: collectives refuse to start */
  pthread_mutex_t admin;
};

static int ld(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static bool cas(int *p, int from, int to) {
  return __atomic_compare_exchange_n(p, &from, to, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

extern "C" int servd_nccl_create(servd_nccl **out, int n_ranks, const int *devices) {
  *out = NULL;
  if (n_ranks < 1 || !devices)
    return servd_fail(SERVD_EINVAL, "nccl_create: %d ranks, devices %p", n_ranks, (const void *)devices);
  servd_nccl *n = (servd_nccl *)calloc(1, sizeof *n);
  ncclComm_t *comms = (ncclComm_t *)calloc((size_t)n_ranks, sizeof *comms);
  int *state = (int *)calloc((size_t)n_ranks, sizeof *state); /* ST_IDLE */
  int *devs = (int *)calloc((size_t)n_ranks, sizeof *devs);
  if (!n || !comms || !state || !devs) {
    free(n);
    free(comms);
    free(state);
    free(devs);
    return servd_fail(SERVD_ENOMEM, "nccl_create: out of host memory");
  }
  for (int i = 0; i < n_ranks; i++) devs[i] = devices[i];
  ncclResult_t r;
  {
    servd__device_scope scope(-1); /* NCCL sets each rank's device; the caller's comes back */
    r = ncclCommInitAll(comms, n_ranks, devices);
  }
  if (r != ncclSuccess) {
    free(n);
    free(comms);
    free(state);
    free(devs);
    return servd_fail(SERVD_EDEVICE, "nccl_create(%d ranks): %s", n_ranks, ncclGetErrorString(r));
  }
  pthread_mutex_init(&n->admin, NULL);
  n->n = n_ranks;
  n->comms = comms;
  n->state = state;
  n->devices = devs;
  *out = n;
  return SERVD_OK;
}

/* Destroy: the rank threads have stopped using it (no rank is inside a collective). */
extern "C" void servd_nccl_destroy(servd_nccl *n) {
  if (!n) return;
  pthread_mutex_lock(&n->admin);
  {
    servd__device_scope scope(-1);
    for (int i = 0; i < n->n; i++) {
      // A communicator still BUSY breaks the contract; leaving it alone at least frees nothing
      // under its thread.
      if (!cas(&n->state[i], ST_IDLE, ST_DEAD)) continue;
      ncclCommDestroy(n->comms[i]);
      servd_cuda_generation_bump(n->devices[i]);
    }
  }
  pthread_mutex_unlock(&n->admin);
  pthread_mutex_destroy(&n->admin);
  free(n->comms);
  free(n->state);
  free(n->devices);
  free(n);
}

static void revoke(ncclComm_t comm) {
#ifdef SERVD_NCCL_HAS_REVOKE
  int v = 0;
  if (ncclCommRevoke && ncclGetVersion(&v) == ncclSuccess && v >= NCCL_VERSION(2, 28, 0))
    (void)ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
#else
  (void)comm;
#endif
}

/* Frees communicator `rank`, which the caller owns exclusively (claimed by a state transition). */
static void abort_owned(servd_nccl *n, int rank) {
  {
    servd__device_scope scope(-1);
    (void)ncclCommAbort(n->comms[rank]);
  }
  servd_cuda_generation_bump(n->devices[rank]);
  __atomic_store_n(&n->state[rank], ST_DEAD, __ATOMIC_RELEASE);
}

/* Claims a collective's right to use communicator `rank`. */
static int enter(servd_nccl *n, int rank, const char *op) {
  if (!n) return servd_fail(SERVD_EINVAL, "nccl %s: NULL communicator", op);
  if (rank < 0 || rank >= n->n) return servd_fail(SERVD_EINVAL, "nccl %s: rank %d of %d", op, rank, n->n);
  if (__atomic_load_n(&n->aborted, __ATOMIC_ACQUIRE) || !cas(&n->state[rank], ST_IDLE, ST_BUSY)) {
    const int s = ld(&n->state[rank]);
    if (s == ST_BUSY || s == ST_REVOKING || s == ST_PENDING)
      return servd_fail(SERVD_EINVAL, "nccl %s: rank %d is already inside a collective on another thread", op, rank);
    return servd_fail(SERVD_ECANCELED, "nccl %s: the communicators were aborted (a rank failed); rebuild them", op);
  }
  return SERVD_OK;
}

/* Gives communicator `rank` back after the collective's call; true when an abort came meanwhile
 * (the communicator is then aborted, by this thread, its only user). */
static bool leave(servd_nccl *n, int rank) {
  if (cas(&n->state[rank], ST_BUSY, ST_IDLE)) return false;
  while (ld(&n->state[rank]) == ST_REVOKING) sched_yield(); /* abort is inside ncclCommRevoke */
  abort_owned(n, rank);                                     /* ST_PENDING */
  return true;
}

/* Ends a collective: gives the communicator back, then reports the abort, the CUDA error (ce) or
 * the NCCL error (r) of its call. */
static int finish(servd_nccl *n, int rank, const char *op, ncclResult_t r, cudaError_t ce) {
  if (leave(n, rank) || __atomic_load_n(&n->aborted, __ATOMIC_ACQUIRE))
    return servd_fail(SERVD_ECANCELED, "nccl %s: aborted during the collective (a rank failed); rebuild them", op);
  if (ce != cudaSuccess) return servd_fail(SERVD_EDEVICE, "nccl %s (rank %d): %s", op, rank, cudaGetErrorString(ce));
  if (r != ncclSuccess) return servd_fail(SERVD_EDEVICE, "nccl %s (rank %d): %s", op, rank, ncclGetErrorString(r));
  return SERVD_OK;
}

extern "C" int servd_nccl_allreduce_bf16(servd_nccl *n, int rank, servd_cuda_ctx *c, servd_bf16_t *x, size_t count) {
  int rc = enter(n, rank, "allreduce");
  if (rc) return rc;
  ncclResult_t r = ncclSuccess;
  cudaError_t ce = cudaSuccess;
  if (n->n > 1 && count > 0) {
    servd__device_scope scope(servd_cuda_ctx_device(c));
    ce = scope.err;
    if (ce == cudaSuccess) r = ncclAllReduce(x, x, count, ncclBfloat16, ncclSum, n->comms[rank], servd__stream(c));
  }
  return finish(n, rank, "allreduce", r, ce);
}

extern "C" int servd_nccl_allgather_f32(servd_nccl *n, int rank, servd_cuda_ctx *c, const float *send, float *recv,
                                        size_t count) {
  int rc = enter(n, rank, "allgather");
  if (rc) return rc;
  ncclResult_t r = ncclSuccess;
  cudaError_t ce = cudaSuccess;
  if (count > 0) {
    servd__device_scope scope(servd_cuda_ctx_device(c));
    ce = scope.err;
    if (ce == cudaSuccess && n->n == 1) {
      if (send != recv)
        ce = cudaMemcpyAsync(recv, send, count * sizeof(float), cudaMemcpyDeviceToDevice, servd__stream(c));
      if (ce != cudaSuccess) cudaGetLastError();
    } else if (ce == cudaSuccess) {
      r = ncclAllGather(send, recv, count, ncclFloat32, n->comms[rank], servd__stream(c));
    }
  }
  return finish(n, rank, "allgather", r, ce);
}

static void abort_locked(servd_nccl *n) {
  __atomic_store_n(&n->aborted, 1, __ATOMIC_SEQ_CST);
  for (int i = 0; i < n->n; i++) {
    for (;;) {
      const int s = ld(&n->state[i]);
      if (s == ST_IDLE) {
        if (!cas(&n->state[i], ST_IDLE, ST_DEAD)) continue; /* its rank just entered: look again */
        abort_owned(n, i);
      } else if (s == ST_BUSY) {
        if (!cas(&n->state[i], ST_BUSY, ST_REVOKING)) continue; /* its rank just left: look again */
        revoke(n->comms[i]);
        __atomic_store_n(&n->state[i], ST_PENDING, __ATOMIC_RELEASE); /* its rank aborts it on leaving */
      }
      break; /* REVOKING and PENDING belong to another abort or the rank; DEAD is done */
    }
  }
}

extern "C" void servd_nccl_abort(servd_nccl *n) {
  if (!n) return;
  // Raised before waiting for `admin` (held only by a rebuild or destroy, never by a collective),
  // so new collectives refuse at once; abort_locked raises it again after a rebuild cleared it.
  __atomic_store_n(&n->aborted, 1, __ATOMIC_SEQ_CST);
  pthread_mutex_lock(&n->admin);
  abort_locked(n);
  pthread_mutex_unlock(&n->admin);
}

extern "C" int servd_nccl_rebuild(servd_nccl *n) {
  if (!n) return servd_fail(SERVD_EINVAL, "nccl rebuild: NULL communicator");
  pthread_mutex_lock(&n->admin);
  abort_locked(n);
  for (int i = 0; i < n->n; i++)
    if (ld(&n->state[i]) != ST_DEAD) {
      pthread_mutex_unlock(&n->admin);
      return servd_fail(SERVD_EBUSY,
                        "nccl rebuild: rank %d is still inside a collective; rebuild once every rank "
                        "returned",
                        i);
    }
  ncclComm_t *fresh = (ncclComm_t *)calloc((size_t)n->n, sizeof *fresh);
  if (!fresh) {
    pthread_mutex_unlock(&n->admin);
    return servd_fail(SERVD_ENOMEM, "nccl rebuild: out of host memory");
  }
  ncclResult_t r;
  {
    servd__device_scope scope(-1);
    r = ncclCommInitAll(fresh, n->n, n->devices);
  }
  if (r != ncclSuccess) {
    free(fresh);
    pthread_mutex_unlock(&n->admin); /* every rank stays DEAD: collectives keep refusing */
    return servd_fail(SERVD_EDEVICE, "nccl rebuild(%d ranks): %s", n->n, ncclGetErrorString(r));
  }
  for (int i = 0; i < n->n; i++) {
    n->comms[i] = fresh[i]; /* DEAD: nobody reads it until the release store below */
    __atomic_store_n(&n->state[i], ST_IDLE, __ATOMIC_RELEASE);
  }
  free(fresh);
  __atomic_store_n(&n->aborted, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&n->admin);
  return SERVD_OK;
}
