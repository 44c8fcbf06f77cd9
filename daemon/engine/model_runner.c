/* One forward step on every tensor-parallel rank: see model_runner.h. */
#include "engine/model_runner.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device_step.h"
#include "engine/forward_call.h"
#include "engine/graph_plan.h"
#include "engine/plan_cache.h"

/* What every rank does in one round (one wake-up of the ranks). */
typedef enum round_mode {
  MODE_CPU = 0,      /* the forward on the host (the CPU backend) */
  MODE_EAGER,        /* upload, the forward through Python, download */
  MODE_CAPTURE,      /* upload, the forward captured into a graph; nothing runs */
  MODE_REPLAY,       /* upload, launch the captured graph, download */
  MODE_PLAN_CAPTURE, /* CPU: the forward through Python, recorded into a step plan */
  MODE_PLAN_REPLAY,  /* CPU: the step plan, without Python */
} round_mode;

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
  servd_device_comm *dcomm;
  int world;
  int64_t timeout_ms;   /* step deadline of each rank's forward; 0: none */
  rank_worker *workers; /* ranks 1..world-1 at [rank-1] */
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  uint64_t generation; /* bumped per round; workers run when it changes */
  int pending;         /* workers still running the current round */
  bool stop;
  /* The current round, set before the ranks wake (under mu). */
  const servd_forward_batch *batch;
  round_mode mode;
  int bucket;       /* graph slot (CAPTURE, REPLAY) */
  int n_rows;       /* logit rows the engine gets (the rest are padding) */
  int first_failed; /* rank that failed first in the current round, -1: none (under mu) */

  /* GPUs (NULL ds[0]: CPU). Graph state is the runner's, touched on the caller's thread only. */
  servd_device_step *ds[SERVD_INTERP_MAX];
  int cap_tokens, cap_seqs; /* the device batches' capacities */
  bool graphs;
  servd_graph_state gs;
  servd_padded_step pad;
  servd_plan_cache *plans; /* CPU: decode steps replayed natively (plan_cache.h); NULL: off */

  _Atomic uint64_t st_steps, st_eager, st_captures, st_replays, st_capture_failures, st_drops;
};

static void abort_comms(servd_runner *r) {
  servd_comm_abort(r->comm);
  if (r->dcomm) servd_device_comm_abort(r->dcomm);
}

/* A rank failed: remember the first (the cause) and release the ranks waiting for it. Captures run
 * nothing, so no rank waits in a collective then. */
static void rank_failed(servd_runner *r, int rank, round_mode mode) {
  pthread_mutex_lock(&r->mu);
  if (r->first_failed < 0) r->first_failed = rank;
  pthread_mutex_unlock(&r->mu);
  if (mode != MODE_CAPTURE) abort_comms(r);
}

static int run_rank(servd_runner *r, int rank, const servd_forward_batch *b, round_mode mode, int bucket, int n_rows,
                    servd_tensor **logits, servd_py_error *err) {
  servd_forward_batch mine = *b;
  mine.kv = r->kv[rank];
  servd_interp *it = servd_pool_get(r->pool, rank);
  servd_device_step *ds = r->ds[rank];
  servd_tensor **out = rank == 0 ? logits : NULL;
  int rc;
  switch (mode) {
  case MODE_CPU: return servd_engine_forward(it, &mine, r->timeout_ms, logits, err);
  case MODE_PLAN_CAPTURE: return servd_plan_cache_capture(r->plans, rank, it, &mine, r->timeout_ms, logits, err);
  case MODE_PLAN_REPLAY: return servd_plan_cache_replay(r->plans, rank, &mine, logits);
  case MODE_EAGER: rc = servd_device_step_eager(ds, it, &mine, n_rows, out, err); break;
  case MODE_CAPTURE: return servd_device_step_capture(ds, it, &mine, bucket, err);
  case MODE_REPLAY: rc = servd_device_step_replay(ds, it, &mine, bucket, n_rows, out, err); break;
  default: return servd_fail(SERVD_EINVAL, "model runner: round mode %d", (int)mode);
  }
  /* Rank 0 waited for its logits when it downloaded some; every other rank (and rank 0 in a step
   * that wanted none) waits here, so that a device fault shows in the step that caused it. */
  if (rc == 0 && (rank > 0 || !*logits)) rc = servd_device_step_sync(ds);
  return rc;
}

static void *worker_main(void *arg) {
  rank_worker *w = arg;
  servd_runner *r = w->r;
  char name[16];
  snprintf(name, sizeof name, "servd-rank%d", w->rank);
  pthread_setname_np(pthread_self(), name); /* names in crash reports, top -H, gdb */
  uint64_t seen = 0;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    while (!r->stop && r->generation == seen) pthread_cond_wait(&r->go, &r->mu);
    if (r->stop) break;
    seen = r->generation;
    const servd_forward_batch *b = r->batch;
    round_mode mode = r->mode;
    int bucket = r->bucket, n_rows = r->n_rows;
    pthread_mutex_unlock(&r->mu);
    servd_tensor *ignored = NULL;
    memset(&w->err, 0, sizeof w->err);
    w->rc = run_rank(r, w->rank, b, mode, bucket, n_rows, &ignored, &w->err);
    servd_tensor_release(ignored);
    if (w->rc) {
      /* Not a Python error: keep this thread's message for the step's report. */
      if (!w->err.type[0]) snprintf(w->err.message, sizeof w->err.message, "%s", servd_last_error());
      rank_failed(r, w->rank, mode);
    }
    pthread_mutex_lock(&r->mu);
    if (--r->pending == 0) pthread_cond_signal(&r->done);
  }
  pthread_mutex_unlock(&r->mu);
  servd_device_thread_release(); /* its rank's contexts go while the thread lives */
  return NULL;
}

static int runner_new(servd_pool *pool, servd_kv_cache *const *kv, int world, servd_comm *comm,
                      servd_device_comm *dcomm, servd_runner **out) {
  *out = NULL;
  servd_runner *r = calloc(1, sizeof *r);
  if (!r) return servd_fail(SERVD_ENOMEM, "model runner: allocation");
  r->pool = pool;
  r->kv = kv;
  r->comm = comm;
  r->dcomm = dcomm;
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

int servd_runner_create(servd_pool *pool, servd_kv_cache *const *kv, int world, servd_comm *comm, servd_runner **out) {
  *out = NULL;
  if (!pool || !kv || world < 1 || servd_pool_size(pool) < world || (world > 1 && !comm))
    return servd_fail(SERVD_EINVAL, "model runner: world=%d with a pool of %d interpreters and %s communicator", world,
                      pool ? servd_pool_size(pool) : 0, comm ? "a" : "no");
  int rc = runner_new(pool, kv, world, comm, NULL, out);
  if (rc == 0 && (rc = servd_plan_cache_create(world, kv, SERVD_PLAN_MAX_BATCH, &(*out)->plans)) != 0) {
    servd_runner_destroy(*out);
    *out = NULL;
  }
  return rc;
}

int servd_runner_create_gpu(servd_pool *pool, servd_kv_cache *const *kv, int world, const servd_runner_gpu *g,
                            servd_runner **out) {
  *out = NULL;
  if (!pool || !kv || !g || !g->devices || !g->dkv || world < 1 || world > SERVD_INTERP_MAX ||
      servd_pool_size(pool) < world || (world > 1 && !g->dcomm) || g->max_tokens < 1 || g->max_seqs < 1 ||
      g->max_blocks_per_seq < 1 || g->block_size < 1 || (g->graphs && g->graph_max_batch < 1))
    return servd_fail(SERVD_EINVAL,
                      "model runner: world=%d on GPUs with a pool of %d interpreters, %s NCCL "
                      "communicator, max_tokens %d, max_seqs %d, max_blocks_per_seq %d, block_size %d, graph max "
                      "batch %d: expected positive sizes, a pool of world interpreters and a communicator when "
                      "world > 1",
                      world, pool ? servd_pool_size(pool) : 0, g && g->dcomm ? "a" : "no", g ? g->max_tokens : 0,
                      g ? g->max_seqs : 0, g ? g->max_blocks_per_seq : 0, g ? g->block_size : 0,
                      g ? g->graph_max_batch : 0);
  servd_runner *r = NULL;
  int rc = runner_new(pool, kv, world, NULL, g->dcomm, &r);
  if (rc) return rc;
  /* Graph buckets never need more sequences than a step can hold. */
  int max_batch = g->graph_max_batch < g->max_seqs ? g->graph_max_batch : g->max_seqs;
  r->graphs = g->graphs;
  if (r->graphs &&
      ((rc = servd_graph_state_init(&r->gs, max_batch)) || (rc = servd_padded_step_init(&r->pad, max_batch))))
    goto fail;
  /* A padded decode step has up to max_batch tokens, which a small token budget may not cover. */
  servd_device_step_config dc = {.max_tokens = g->max_tokens > max_batch ? g->max_tokens : max_batch,
                                 .max_seqs = g->max_seqs,
                                 .max_blocks_per_seq = g->max_blocks_per_seq,
                                 .block_size = g->block_size,
                                 .n_buckets = r->gs.n_buckets};
  r->cap_tokens = dc.max_tokens;
  r->cap_seqs = dc.max_seqs;
  for (int k = 0; k < world; k++) {
    dc.device = g->devices[k];
    dc.rank = k;
    dc.dkv = g->dkv[k];
    if ((rc = servd_device_step_create(&dc, &r->ds[k]))) goto fail;
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
  for (int k = 0; k < SERVD_INTERP_MAX; k++) servd_device_step_destroy(r->ds[k]);
  servd_graph_state_free(&r->gs);
  servd_plan_cache_destroy(r->plans);
  servd_padded_step_free(&r->pad);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->go);
  pthread_cond_destroy(&r->done);
  free(r);
}

void servd_runner_get_stats(const servd_runner *r, servd_runner_stats *s) {
  memset(s, 0, sizeof *s);
  if (!r) return;
  servd_runner *m = (servd_runner *)r; /* atomics read through a const pointer */
  s->steps = atomic_load(&m->st_steps);
  s->eager_steps = atomic_load(&m->st_eager);
  s->graph_captures = atomic_load(&m->st_captures);
  s->graph_replays = atomic_load(&m->st_replays);
  s->graph_capture_failures = atomic_load(&m->st_capture_failures);
  s->graph_drops = atomic_load(&m->st_drops);
}

/* Runs b on every rank at once in the given mode; see servd_runner_step for the error contract. */
static int run_round(servd_runner *r, const servd_forward_batch *b, round_mode mode, int bucket, int n_rows,
                     servd_tensor **logits, servd_py_error *err, int *failed_rank) {
  *logits = NULL;
  if (failed_rank) *failed_rank = -1;
  if (r->world > 1) {
    pthread_mutex_lock(&r->mu);
    r->batch = b;
    r->mode = mode;
    r->bucket = bucket;
    r->n_rows = n_rows;
    r->pending = r->world - 1;
    r->first_failed = -1;
    r->generation++;
    pthread_cond_broadcast(&r->go);
    pthread_mutex_unlock(&r->mu);
  }
  servd_py_error err0;
  memset(&err0, 0, sizeof err0);
  int rc = run_rank(r, 0, b, mode, bucket, n_rows, logits, &err0);
  if (rc && r->world > 1) rank_failed(r, 0, mode);
  int first = rc ? 0 : -1;
  if (r->world > 1) {
    pthread_mutex_lock(&r->mu);
    while (r->pending > 0) pthread_cond_wait(&r->done, &r->mu);
    first = r->first_failed;
    pthread_mutex_unlock(&r->mu);
    /* Every rank has returned: nobody is inside a collective. */
    if (first >= 0 && mode != MODE_CAPTURE) {
      servd_comm_reset(r->comm);
      if (r->dcomm) servd_device_comm_reset(r->dcomm);
    }
    if (first > 0) rc = r->workers[first - 1].rc;
  }
  if (first >= 0) {
    if (err) *err = first == 0 ? err0 : r->workers[first - 1].err;
    if (failed_rank) *failed_rank = first;
    /* The cause's message, not that of a rank that only saw the abort; it names the rank. */
    if (first > 0) {
      const servd_py_error *we = &r->workers[first - 1].err;
      if (we->type[0]) servd_fail(rc, "rank %d: %s: %s", first, we->type, we->message);
      else servd_fail(rc, "rank %d: %s", first, we->message);
    } else if (r->world > 1) {
      char msg[600]; /* servd_fail writes the buffer servd_last_error returns: copy it first */
      if (err0.type[0]) snprintf(msg, sizeof msg, "%s: %s", err0.type, err0.message);
      else snprintf(msg, sizeof msg, "%s", servd_last_error());
      servd_fail(rc, "rank 0: %s", msg);
    }
  }
  if (rc) {
    servd_tensor_release(*logits);
    *logits = NULL;
  }
  return rc;
}

static void drop_all_graphs(servd_runner *r);

void servd_runner_capacity(const servd_runner *r, int *max_tokens, int *max_seqs) {
  *max_tokens = r->cap_tokens;
  *max_seqs = r->cap_seqs;
}

void servd_runner_set_step_timeout(servd_runner *r, int64_t timeout_ms) {
  r->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
  for (int k = 0; k < r->world; k++)
    if (r->ds[k]) servd_device_step_set_timeout(r->ds[k], r->timeout_ms);
}

int servd_runner_set_device_kv(servd_runner *r, servd_device_kv *const *dkv) {
  if (!r->ds[0]) return servd_fail(SERVD_EINVAL, "model runner: a device cache for a runner on the CPU");
  for (int k = 0; k < r->world; k++)
    if (!dkv[k]) return servd_fail(SERVD_EINVAL, "model runner: no device cache for rank %d", k);
  drop_all_graphs(r); /* they name the old cache */
  for (int k = 0; k < r->world; k++) servd_device_step_set_kv(r->ds[k], dkv[k]);
  return 0;
}

int servd_runner_eager(servd_runner *r, const servd_forward_batch *b, servd_tensor **logits, servd_py_error *err,
                       int *failed_rank) {
  return run_round(r, b, r->ds[0] ? MODE_EAGER : MODE_CPU, -1, b->n_logit_rows, logits, err, failed_rank);
}

/* Device memory that a graph may use moved on some rank: no graph can be trusted any more. */
static void drop_all_graphs(servd_runner *r) {
  for (int k = 0; k < r->world; k++) servd_device_step_drop_all(r->ds[k]);
  servd_graph_reset(&r->gs);
}

/* Captures bucket `bi` on every rank over the padded step. On failure no rank keeps a graph of it. */
static bool capture_all(servd_runner *r, const servd_forward_batch *padded, int bi) {
  servd_tensor *none = NULL;
  servd_py_error cerr;
  memset(&cerr, 0, sizeof cerr);
  int failed = -1;
  int rc = run_round(r, padded, MODE_CAPTURE, bi, 0, &none, &cerr, &failed);
  servd_tensor_release(none);
  if (rc == 0) {
    servd_graph_capture_done(&r->gs, bi, true, false);
    atomic_fetch_add(&r->st_captures, 1);
    return true;
  }
  for (int k = 0; k < r->world; k++) servd_device_step_drop(r->ds[k], bi);
  atomic_fetch_add(&r->st_capture_failures, 1);
  if (servd_graph_capture_done(&r->gs, bi, false, rc == SERVD_EBUSY)) {
    /* The bucket's whole range: "1 sequence", "3 to 4 sequences". */
    int hi = r->gs.buckets[bi], lo = bi > 0 ? r->gs.buckets[bi - 1] + 1 : 1;
    char range[48], why[700];
    if (lo == hi) snprintf(range, sizeof range, "%d sequence%s", hi, hi == 1 ? "" : "s");
    else snprintf(range, sizeof range, "%d to %d sequences", lo, hi);
    /* A Python error names its rank here; other messages already do (run_round). */
    if (cerr.type[0] && r->world > 1) snprintf(why, sizeof why, "rank %d: %s: %s", failed, cerr.type, cerr.message);
    else if (cerr.type[0]) snprintf(why, sizeof why, "%s: %s", cerr.type, cerr.message);
    else snprintf(why, sizeof why, "%s", servd_last_error());
    fprintf(stderr, "servd: CUDA graphs off for decode batches of %s: the capture failed: %s\n", range, why);
  }
  return false;
}

int servd_runner_step(servd_runner *r, const servd_forward_batch *b, servd_tensor **logits, servd_py_error *err,
                      int *failed_rank) {
  atomic_fetch_add(&r->st_steps, 1);
  if (!r->ds[0]) {
    servd_plan_action pa = servd_plan_cache_decide(r->plans, b);
    round_mode m = pa == SERVD_PLAN_CAPTURE ? MODE_PLAN_CAPTURE : pa == SERVD_PLAN_REPLAY ? MODE_PLAN_REPLAY : MODE_CPU;
    int rc = run_round(r, b, m, -1, b->n_logit_rows, logits, err, failed_rank);
    servd_plan_cache_done(r->plans, pa, rc);
    /* a replay that failed dropped its plan (and said why): the step runs through the model's code,
     * rewriting the same KV slots with the same values */
    if (rc != 0 && pa == SERVD_PLAN_REPLAY)
      rc = run_round(r, b, MODE_CPU, -1, b->n_logit_rows, logits, err, failed_rank);
    return rc;
  }

  int bi = -1;
  servd_graph_action a = SERVD_GRAPH_EAGER;
  if (r->graphs) {
    bool stale = false;
    for (int k = 0; k < r->world && !stale; k++) stale = servd_device_step_stale(r->ds[k]);
    if (stale) {
      drop_all_graphs(r);
      atomic_fetch_add(&r->st_drops, 1);
    }
    a = servd_graph_decide(&r->gs, b, &bi);
    if (a != SERVD_GRAPH_EAGER && servd_pad_decode(&r->pad, b, r->gs.buckets[bi]) != 0) a = SERVD_GRAPH_EAGER;
  }
  if (a == SERVD_GRAPH_CAPTURE && !capture_all(r, &r->pad.batch, bi)) a = SERVD_GRAPH_EAGER;
  const servd_forward_batch *run = a == SERVD_GRAPH_EAGER ? b : &r->pad.batch;
  round_mode mode = a == SERVD_GRAPH_EAGER || a == SERVD_GRAPH_WARMUP ? MODE_EAGER : MODE_REPLAY;
  int rc = run_round(r, run, mode, bi, b->n_logit_rows, logits, err, failed_rank);
  atomic_fetch_add(mode == MODE_EAGER ? &r->st_eager : &r->st_replays, 1);
  if (rc == 0) servd_graph_ran(&r->gs, a, bi);
  else if (mode == MODE_REPLAY) drop_all_graphs(r); /* a launch or its download failed: trust no graph */
  return rc;
}
