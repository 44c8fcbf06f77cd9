/* One forward step on every tensor-parallel rank: see model_runner.h. */
#include "engine/model_runner.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct rank_worker {
  servd_runner *r;
  int rank;
  pthread_t thread;
  bool started;
  int rc;
  servd_py_error err;
} rank_worker;

struct servd_runner {
  servd_pool *pool;
  servd_kv_cache *const *kv;
  servd_comm *comm;
  int world;
  rank_worker *workers; /* ranks 1..world-1 at [rank-1] */
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  uint64_t generation; /* bumped per step; workers run when it changes */
  int pending;         /* workers still running the current step */
  bool stop;
  const servd_forward_batch *batch;
  int first_failed; /* rank that failed first in the current step, -1: none (under mu) */
};

/* A rank failed: remember the first (the cause) and release the ranks waiting for it. */
static void rank_failed(servd_runner *r, int rank) {
  pthread_mutex_lock(&r->mu);
  if (r->first_failed < 0) r->first_failed = rank;
  pthread_mutex_unlock(&r->mu);
  servd_comm_abort(r->comm);
}

static int run_rank(servd_runner *r, int rank, const servd_forward_batch *b, servd_tensor **logits,
                    servd_py_error *err) {
  servd_forward_batch mine = *b;
  mine.kv = r->kv[rank];
  return servd_interp_forward(servd_pool_get(r->pool, rank), &mine, logits, err);
}

static void *worker_main(void *arg) {
  rank_worker *w = arg;
  servd_runner *r = w->r;
  uint64_t seen = 0;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->stop && r->generation == seen) pthread_cond_wait(&r->go, &r->mu);
    if (r->stop) break;
    seen = r->generation;
    const servd_forward_batch *b = r->batch;
    pthread_mutex_unlock(&r->mu);
    servd_tensor *ignored = NULL;
    w->rc = run_rank(r, w->rank, b, &ignored, &w->err);
    servd_tensor_release(ignored);
    if (w->rc) rank_failed(r, w->rank);
    pthread_mutex_lock(&r->mu);
    if (--r->pending == 0) pthread_cond_signal(&r->done);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

int servd_runner_create(servd_pool *pool, servd_kv_cache *const *kv, int world, servd_comm *comm,
                        servd_runner **out) {
  *out = NULL;
  if (!pool || !kv || world < 1 || servd_pool_size(pool) < world || (world > 1 && !comm))
    return servd_fail(SERVD_EINVAL, "model runner: world=%d with a pool of %d interpreters and %s communicator",
                      world, pool ? servd_pool_size(pool) : 0, comm ? "a" : "no");
  servd_runner *r = calloc(1, sizeof *r);
  if (!r) return servd_fail(SERVD_ENOMEM, "model runner: allocation");
  r->pool = pool;
  r->kv = kv;
  r->comm = comm;
  r->world = world;
  r->first_failed = -1;
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->go, NULL);
  pthread_cond_init(&r->done, NULL);
  int rc = 0;
  if (world > 1) {
    r->workers = calloc((size_t)world - 1, sizeof *r->workers);
    if (!r->workers) {
      rc = servd_fail(SERVD_ENOMEM, "model runner: %d rank workers", world - 1);
      goto fail;
    }
    for (int i = 0; i < world - 1; i++) {
      rank_worker *w = &r->workers[i];
      w->r = r;
      w->rank = i + 1;
      if (pthread_create(&w->thread, NULL, worker_main, w)) {
        rc = servd_fail(SERVD_ENOMEM, "model runner: starting the thread of rank %d", i + 1);
        goto fail;
      }
      w->started = true;
    }
  }
  *out = r;
  return 0;
fail:
  servd_runner_destroy(r);
  return rc;
}

void servd_runner_destroy(servd_runner *r) {
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  r->stop = true;
  pthread_cond_broadcast(&r->go);
  pthread_mutex_unlock(&r->mu);
  for (int i = 0; r->workers && i < r->world - 1; i++)
    if (r->workers[i].started) pthread_join(r->workers[i].thread, NULL);
  free(r->workers);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->go);
  pthread_cond_destroy(&r->done);
  free(r);
}

int servd_runner_step(servd_runner *r, const servd_forward_batch *b, servd_tensor **logits,
                      servd_py_error *err, int *failed_rank) {
  *logits = NULL;
  if (failed_rank) *failed_rank = -1;
  if (r->world > 1) {
    pthread_mutex_lock(&r->mu);
    r->batch = b;
    r->pending = r->world - 1;
    r->first_failed = -1;
    r->generation++;
    pthread_cond_broadcast(&r->go);
    pthread_mutex_unlock(&r->mu);
  }
  servd_py_error err0;
  memset(&err0, 0, sizeof err0);
  int rc = run_rank(r, 0, b, logits, &err0);
  if (rc && r->world > 1) rank_failed(r, 0);
  int first = rc ? 0 : -1;
  if (r->world > 1) {
    pthread_mutex_lock(&r->mu);
    while (r->pending > 0) pthread_cond_wait(&r->done, &r->mu);
    first = r->first_failed;
    pthread_mutex_unlock(&r->mu);
    /* Every rank has returned: nobody is inside a collective. */
    if (first >= 0) servd_comm_reset(r->comm);
    if (first > 0) rc = r->workers[first - 1].rc;
  }
  if (first >= 0) {
    if (err) *err = first == 0 ? err0 : r->workers[first - 1].err;
    if (failed_rank) *failed_rank = first;
    /* The cause's message, not that of a rank that only saw the abort. */
    if (first > 0) servd_fail(rc, "rank %d: %s: %s", first, r->workers[first - 1].err.type, r->workers[first - 1].err.message);
  }
  if (rc) {
    servd_tensor_release(*logits);
    *logits = NULL;
  }
  return rc;
}
