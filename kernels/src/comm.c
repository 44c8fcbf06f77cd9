/* Collectives between tensor-parallel ranks of one process: every rank is a thread, the ranks share
 * one descriptor table, and two barriers per call bracket the exchange.
 *
 * A call publishes the rank's tensors, waits for all ranks, checks that all shapes agree (every rank
 * sees the same table, so every rank reaches the same verdict and nobody is left waiting), does its
 * share, and waits again so that no rank reuses or frees its buffer, or publishes the next call's
 * tensors, while another still reads them. All-reduce: rank r sums column slice r of every rank's
 * tensor in rank order and writes the sum into all of them, so all ranks hold identical bits.
 *
 * Abort: servd_comm_abort wakes the ranks waiting in the first barrier of a call and makes every later
 * call fail with SERVD_ECANCELED until servd_comm_reset. The second barrier is not abortable: once all
 * ranks passed the first one, each only copies memory before reaching the second, so it cannot hang,
 * and leaving early would let a rank free a buffer that another rank still reads. */
#include "ops-impl.h"

#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define comm_relax() _mm_pause()
#else
#define comm_relax() ((void)0)
#endif

/* pause iterations (a few microseconds) before sleeping in a barrier: ranks usually arrive close
 * together, but the ranks and the compute pool can outnumber the cores, and then a spinning rank
 * would take a core from the rank it waits for */
#define COMM_SPIN 256

typedef struct comm_slot {
  ops__rows x, out; /* out only for all-gather */
  bool ok;
  char desc[96], out_desc[96];
} comm_slot;

struct servd_comm {
  int world;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  atomic_uint gen;
  atomic_bool aborted; /* written under mu; read without it in the spin */
  comm_slot *slots;    /* [world] */
};

int servd_comm_create(servd_comm **out, int world_size) {
  if (!out || world_size < 1 || world_size > 1024)
    return servd_fail(SERVD_EINVAL, "comm_create: expected 1 <= world_size <= 1024, got %d", world_size);
  servd_comm *c = calloc(1, sizeof *c);
  if (!c) goto fail;
  c->slots = calloc((size_t)world_size, sizeof *c->slots);
  if (!c->slots) goto fail;
  c->world = world_size;
  if (pthread_mutex_init(&c->mu, NULL) != 0) goto fail;
  if (pthread_cond_init(&c->cv, NULL) != 0) {
    pthread_mutex_destroy(&c->mu);
    goto fail;
  }
  *out = c;
  return 0;
fail:
  if (c) free(c->slots);
  free(c);
  return servd_fail(SERVD_ENOMEM, "comm_create: out of memory for %d ranks", world_size);
}

void servd_comm_destroy(servd_comm *c) {
  if (!c) return;
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c->slots);
  free(c);
}

/* Spins briefly (a decode step makes two calls per layer), then sleeps on the condition variable.
 * abortable: SERVD_ECANCELED when the group is (or gets) aborted before every rank arrived; the
 * verdict is taken under mu, so either all ranks pass or none does. */
static int barrier(servd_comm *c, bool abortable) {
  pthread_mutex_lock(&c->mu);
  if (abortable && atomic_load_explicit(&c->aborted, memory_order_relaxed)) {
    pthread_mutex_unlock(&c->mu);
    return SERVD_ECANCELED;
  }
  unsigned g = atomic_load_explicit(&c->gen, memory_order_relaxed);
  if (++c->arrived == c->world) {
    c->arrived = 0;
    atomic_store_explicit(&c->gen, g + 1, memory_order_release);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return 0;
  }
  pthread_mutex_unlock(&c->mu);
  for (int i = 0; i < COMM_SPIN; i++) {
    if (atomic_load_explicit(&c->gen, memory_order_acquire) != g) return 0;
    if (abortable && atomic_load_explicit(&c->aborted, memory_order_relaxed)) break;
    comm_relax();
  }
  int rc = 0;
  pthread_mutex_lock(&c->mu);
  while (atomic_load_explicit(&c->gen, memory_order_acquire) == g) {
    if (abortable && atomic_load_explicit(&c->aborted, memory_order_relaxed)) {
      rc = SERVD_ECANCELED;
      break;
    }
    pthread_cond_wait(&c->cv, &c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

void servd_comm_abort(servd_comm *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  atomic_store_explicit(&c->aborted, true, memory_order_relaxed);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

bool servd_comm_aborted(servd_comm *c) { return c && atomic_load_explicit(&c->aborted, memory_order_relaxed); }

void servd_comm_reset(servd_comm *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->arrived = 0; /* ranks that left an aborted barrier were counted there */
  atomic_store_explicit(&c->aborted, false, memory_order_relaxed);
  pthread_mutex_unlock(&c->mu);
}

static int canceled(const char *op, int rank) {
  return servd_fail(SERVD_ECANCELED,
                    "%s: rank %d: the communicator was aborted (another rank failed); "
                    "servd_comm_reset restores it",
                    op, rank);
}

/* Fills this rank's slot; `gather` also checks out. All-reduce takes any f32 shape whose rows merge
 * into one stride; all-gather is about columns of (m, n) tensors. */
static void publish(servd_comm *c, int rank, const servd_tensor *x, const servd_tensor *out, bool gather) {
  comm_slot *s = &c->slots[rank];
  s->ok = x && x->dtype == SERVD_F32 && (!gather || x->ndim == 2) && ops__as_rows(x, &s->x) == 0;
  if (gather) s->ok = s->ok && out && out->dtype == SERVD_F32 && out->ndim == 2 && ops__as_rows(out, &s->out) == 0;
  ops__desc(x, s->desc, sizeof s->desc);
  ops__desc(out, s->out_desc, sizeof s->out_desc);
}

int servd_allreduce_sum(servd_comm *c, int rank, servd_tensor *x) {
  if (!c || rank < 0 || rank >= c->world)
    return servd_fail(SERVD_EINVAL, "allreduce_sum: rank %d outside the group of %d", rank, c ? c->world : 0);
  if (atomic_load_explicit(&c->aborted, memory_order_relaxed)) return canceled("allreduce_sum", rank);
  publish(c, rank, x, NULL, false);
  if (c->world == 1) {
    if (!c->slots[0].ok)
      return servd_fail(SERVD_EINVAL, "allreduce_sum: expected x f32 with contiguous rows, got %s", c->slots[0].desc);
    return 0;
  }
  if (barrier(c, true)) return canceled("allreduce_sum", rank);
  const comm_slot *s0 = &c->slots[0];
  int bad = -1;
  for (int r = 0; r < c->world && bad < 0; r++) {
    const comm_slot *s = &c->slots[r];
    if (!s->ok || s->x.rows != s0->x.rows || s->x.cols != s0->x.cols) bad = r;
  }
  int rc = 0;
  if (bad >= 0) {
    rc = servd_fail(SERVD_EINVAL, "allreduce_sum: every rank needs x f32 of one shape; rank %d has %s, rank 0 has %s",
                    bad, c->slots[bad].desc, s0->desc);
  } else {
    int64_t n = s0->x.cols, c0 = n * rank / c->world, c1 = n * (rank + 1) / c->world;
    for (int64_t row = 0; row < s0->x.rows; row++) {
      float *dst = (float *)(s0->x.data + row * s0->x.stride);
      /* rank 0's buffer collects the sum, then the others get a copy */
      for (int r = 1; r < c->world; r++) {
        const float *src = (const float *)(c->slots[r].x.data + row * c->slots[r].x.stride);
        for (int64_t i = c0; i < c1; i++) dst[i] += src[i];
      }
      for (int r = 1; r < c->world; r++)
        memcpy((float *)(c->slots[r].x.data + row * c->slots[r].x.stride) + c0, dst + c0,
               (size_t)(c1 - c0) * sizeof(float));
    }
  }
  barrier(c, false);
  return rc;
}

int servd_allgather_cols(servd_comm *c, int rank, servd_tensor *out, const servd_tensor *x) {
  if (!c || rank < 0 || rank >= c->world)
    return servd_fail(SERVD_EINVAL, "allgather_cols: rank %d outside the group of %d", rank, c ? c->world : 0);
  if (atomic_load_explicit(&c->aborted, memory_order_relaxed)) return canceled("allgather_cols", rank);
  publish(c, rank, x, out, true);
  if (c->world > 1 && barrier(c, true)) return canceled("allgather_cols", rank);
  int64_t total = 0;
  int bad = -1;
  for (int r = 0; r < c->world && bad < 0; r++) {
    const comm_slot *s = &c->slots[r];
    if (!s->ok || s->x.rows != c->slots[0].x.rows) bad = r;
    else total += s->x.cols;
  }
  for (int r = 0; r < c->world && bad < 0; r++) {
    const comm_slot *s = &c->slots[r];
    if (s->out.rows != s->x.rows || s->out.cols != total) bad = r;
  }
  int rc = 0;
  if (bad >= 0) {
    rc =
        servd_fail(SERVD_EINVAL,
                   "allgather_cols: every rank needs x f32 (m, n_r) and out f32 (m, sum n_r); rank %d has x %s, out %s "
                   "(columns of all ranks: %lld)",
                   bad, c->slots[bad].desc, c->slots[bad].out_desc, (long long)total);
  } else {
    const comm_slot *me = &c->slots[rank];
    int64_t col = 0;
    for (int r = 0; r < c->world; r++) {
      const comm_slot *s = &c->slots[r];
      for (int64_t row = 0; row < s->x.rows; row++)
        memcpy((float *)(me->out.data + row * me->out.stride) + col, s->x.data + row * s->x.stride,
               (size_t)s->x.cols * sizeof(float));
      col += s->x.cols;
    }
  }
  if (c->world > 1) barrier(c, false);
  return rc;
}
