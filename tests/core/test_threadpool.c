/* The compute pool: coverage of every item, the bound on computing threads with many concurrent
 * callers mixing small (inline) and parallel jobs, small jobs not waiting for other callers, FIFO
 * order of parallel jobs, nested calls, shutdown under load, and sizing rules.
 *
 * No timing: waits that prove overlap are unbounded, so a pool that serialized what it must not
 * hangs and the test fails by ctest's timeout. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "servd/threadpool.h"

#define POOL 3

int servd__threadpool_queued(void); /* threadpool.c, for tests: callers waiting for the turn */

static int pool_size = POOL; /* the size the running test set up */
static atomic_int running, max_running;
static atomic_int slot_busy[POOL]; /* a body inside slot i */
static atomic_int overlap_errors;  /* two bodies in one slot at once */

static void relax(void) {
  struct timespec ts = {0, 10000};
  nanosleep(&ts, NULL);
}

/* Instrumentation around every counted body: how many run at once, and whether a slot is shared. */
static int enter(int thread) {
  int r = atomic_fetch_add(&running, 1) + 1, m = atomic_load(&max_running);
  while (r > m && !atomic_compare_exchange_weak(&max_running, &m, r)) {}
  if (thread < 0 || thread >= pool_size) return 0;
  if (atomic_exchange(&slot_busy[thread], 1)) atomic_fetch_add(&overlap_errors, 1);
  return 1;
}

static void leave(int thread) {
  atomic_store(&slot_busy[thread], 0);
  atomic_fetch_sub(&running, 1);
}

static void reset_counters(void) {
  atomic_store(&running, 0);
  atomic_store(&max_running, 0);
  atomic_store(&overlap_errors, 0);
  for (int i = 0; i < POOL; i++) atomic_store(&slot_busy[i], 0);
}

typedef struct job {
  atomic_int *hits;
  atomic_llong sum;
  atomic_int bad_thread;
} job;

static void body(void *ctx, int64_t b, int64_t e, int thread) {
  job *j = ctx;
  if (!enter(thread)) {
    atomic_store(&j->bad_thread, 1);
    atomic_fetch_sub(&running, 1);
    return;
  }
  long long s = 0;
  for (int64_t i = b; i < e; i++) {
    if (j->hits) atomic_fetch_add(&j->hits[i], 1);
    s += i;
  }
  /* Hold the slot a little so that bodies of different callers overlap if the pool lets them. */
  relax();
  atomic_fetch_add(&j->sum, s);
  leave(thread);
}

static int setup_pool(void **state) {
  (void)state;
  pool_size = POOL;
  reset_counters();
  return servd_threadpool_init(POOL);
}

static int setup_one(void **state) {
  (void)state;
  pool_size = 1;
  reset_counters();
  return servd_threadpool_init(1);
}

static int teardown_pool(void **state) {
  (void)state;
  servd_threadpool_shutdown();
  servd_threadpool_shutdown(); /* idempotent */
  return 0;
}

static void test_size(void **state) {
  (void)state;
  assert_int_equal(servd_threadpool_size(), POOL);
  assert_int_equal(servd_threadpool_init(POOL), 0);
  assert_int_equal(servd_threadpool_init(POOL + 1), SERVD_EBUSY);
  assert_int_equal(servd_threadpool_init(-1), SERVD_EINVAL);
  assert_int_equal(servd_threadpool_init(1025), SERVD_EINVAL);
}

static void test_every_item_once(void **state) {
  (void)state;
  for (int64_t n = 0; n < 300; n += 7) {
    for (int64_t grain = 1; grain < 400; grain *= 4) { /* 256 > n: inline jobs too */
      job j = {.hits = calloc((size_t)n + 1, sizeof(atomic_int))};
      assert_non_null(j.hits);
      servd_parallel_for(n, grain, body, &j);
      for (int64_t i = 0; i < n; i++) assert_int_equal(atomic_load(&j.hits[i]), 1);
      assert_int_equal(atomic_load(&j.sum), n * (n - 1) / 2);
      assert_false(atomic_load(&j.bad_thread));
      free(j.hits);
    }
  }
}

/* A caller mixing small jobs (n <= grain: inline) and parallel ones, checking every sum. */
typedef struct caller_arg {
  int iters, fails;
  atomic_int *progress; /* optional: bumped per job */
} caller_arg;

static void *mixed_caller(void *arg) {
  caller_arg *a = arg;
  for (int it = 0; it < a->iters; it++) {
    const int64_t n = 1 + (it * 37) % 200;
    const int64_t grain = it % 3 == 0 ? 1 + it % 5 : n; /* a third parallel, the rest inline */
    job j = {0};
    servd_parallel_for(n, grain, body, &j);
    if (atomic_load(&j.sum) != n * (n - 1) / 2 || atomic_load(&j.bad_thread)) a->fails++;
    if (a->progress) atomic_fetch_add(a->progress, 1);
  }
  return NULL;
}

static void run_callers(int n_callers, int iters, atomic_int *progress, void (*meanwhile)(atomic_int *)) {
  pthread_t th[16];
  caller_arg args[16];
  assert_true(n_callers <= 16);
  for (int i = 0; i < n_callers; i++) {
    args[i] = (caller_arg){.iters = iters, .progress = progress};
    assert_int_equal(pthread_create(&th[i], NULL, mixed_caller, &args[i]), 0);
  }
  if (meanwhile) meanwhile(progress);
  for (int i = 0; i < n_callers; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < n_callers; i++) assert_int_equal(args[i].fails, 0);
}

static void test_concurrent_mixed_bounded(void **state) {
  (void)state;
  run_callers(8, 60, NULL, NULL);
  /* Eight callers, small and parallel jobs: never more than POOL bodies at once, never two in a slot. */
  assert_true(atomic_load(&max_running) <= POOL);
  assert_true(atomic_load(&max_running) >= 1);
  assert_int_equal(atomic_load(&overlap_errors), 0);
}

static void test_one_slot_bounded(void **state) {
  (void)state;
  assert_int_equal(servd_threadpool_size(), 1);
  run_callers(4, 40, NULL, NULL);
  /* A pool without workers runs every job inline, still one at a time. */
  assert_int_equal(atomic_load(&max_running), 1);
  assert_int_equal(atomic_load(&overlap_errors), 0);
}

/* ---- small jobs do not wait for other callers ------------------------------------------------- */

static atomic_int arrived, small_done;

static void meet(void *ctx, int64_t b, int64_t e, int thread) {
  (void)ctx, (void)b, (void)e, (void)thread;
  atomic_fetch_add(&arrived, 1);
  while (atomic_load(&arrived) < 2) relax(); /* returns only once the other caller's body started */
}

static void *small_meet(void *arg) {
  (void)arg;
  servd_parallel_for(4, 4, meet, NULL);
  return NULL;
}

static void test_small_jobs_overlap(void **state) {
  (void)state;
  atomic_store(&arrived, 0);
  pthread_t a, b;
  assert_int_equal(pthread_create(&a, NULL, small_meet, NULL), 0);
  assert_int_equal(pthread_create(&b, NULL, small_meet, NULL), 0);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  assert_int_equal(atomic_load(&arrived), 2);
}

static void wait_small(void *ctx, int64_t b, int64_t e, int thread) {
  (void)ctx, (void)b, (void)e, (void)thread;
  while (!atomic_load(&small_done)) relax();
}

static void set_done(void *ctx, int64_t b, int64_t e, int thread) {
  (void)ctx, (void)b, (void)e, (void)thread;
  atomic_store(&small_done, 1);
}

static void *parallel_waiting(void *arg) {
  (void)arg;
  servd_parallel_for(2, 1, wait_small, NULL); /* two chunks, each waits for the small job */
  return NULL;
}

static void test_small_beside_parallel(void **state) {
  (void)state;
  atomic_store(&small_done, 0);
  pthread_t p;
  assert_int_equal(pthread_create(&p, NULL, parallel_waiting, NULL), 0);
  /* The parallel job holds the turn and at most 2 of 3 slots until this small job has run. */
  servd_parallel_for(1, 1, set_done, NULL);
  pthread_join(p, NULL);
  assert_true(atomic_load(&small_done));
}

/* ---- FIFO order of parallel jobs ------------------------------------------------------------- */

enum { QUEUED = 4 };
static atomic_int gate_open, gate_entered, order_next;

typedef struct ordered {
  atomic_int rank; /* order in which this job started computing, -1 before */
} ordered;

static void gate_body(void *ctx, int64_t b, int64_t e, int thread) {
  (void)ctx, (void)b, (void)e, (void)thread;
  atomic_store(&gate_entered, 1);
  while (!atomic_load(&gate_open)) relax();
}

static void *gate_caller(void *arg) {
  (void)arg;
  servd_parallel_for(2, 1, gate_body, NULL);
  return NULL;
}

static void ordered_body(void *ctx, int64_t b, int64_t e, int thread) {
  (void)b, (void)e, (void)thread;
  ordered *o = ctx;
  int none = -1;
  if (atomic_load(&o->rank) == -1) {
    int r = atomic_fetch_add(&order_next, 1);
    if (!atomic_compare_exchange_strong(&o->rank, &none, r)) atomic_fetch_sub(&order_next, 1);
  }
}

static void *ordered_caller(void *arg) {
  servd_parallel_for(POOL * 8, 1, ordered_body, arg);
  return NULL;
}

static void test_parallel_fifo(void **state) {
  (void)state;
  atomic_store(&gate_open, 0);
  atomic_store(&gate_entered, 0);
  atomic_store(&order_next, 0);
  pthread_t g, th[QUEUED];
  ordered jobs[QUEUED];
  assert_int_equal(pthread_create(&g, NULL, gate_caller, NULL), 0);
  while (!atomic_load(&gate_entered)) relax(); /* the gate job holds the turn */
  for (int i = 0; i < QUEUED; i++) {
    atomic_store(&jobs[i].rank, -1);
    assert_int_equal(pthread_create(&th[i], NULL, ordered_caller, &jobs[i]), 0);
    while (servd__threadpool_queued() < i + 1) relax(); /* queued behind the earlier ones */
  }
  atomic_store(&gate_open, 1);
  pthread_join(g, NULL);
  for (int i = 0; i < QUEUED; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < QUEUED; i++) assert_int_equal(atomic_load(&jobs[i].rank), i);
}

/* ---- nested calls ----------------------------------------------------------------------------- */

typedef struct nest {
  atomic_llong sum;
  atomic_int wrong_thread;
} nest;

typedef struct inner_ctx {
  nest *n;
  int outer_thread;
} inner_ctx;

static void inner(void *ctx, int64_t b, int64_t e, int thread) {
  inner_ctx *c = ctx;
  if (thread != c->outer_thread) atomic_store(&c->n->wrong_thread, 1);
  for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->n->sum, i);
}

static void outer(void *ctx, int64_t b, int64_t e, int thread) {
  inner_ctx c = {.n = ctx, .outer_thread = thread};
  for (int64_t i = b; i < e; i++) {
    servd_parallel_for(10, 1, inner, &c);  /* would-be parallel: inline in this slot, no deadlock */
    servd_parallel_for(10, 10, inner, &c); /* small */
  }
}

static void test_nested(void **state) {
  (void)state;
  nest n = {0};
  servd_parallel_for(20, 1, outer, &n); /* parallel outer */
  servd_parallel_for(3, 3, outer, &n);  /* small outer */
  assert_int_equal(atomic_load(&n.sum), 23 * 2 * 45);
  assert_false(atomic_load(&n.wrong_thread));
}

/* ---- shutdown --------------------------------------------------------------------------------- */

static void shut_down_midway(atomic_int *progress) {
  while (atomic_load(progress) < 20) relax();
  servd_threadpool_shutdown(); /* waits for running jobs; later calls start a new pool */
  servd_threadpool_shutdown();
}

static void test_shutdown_under_load(void **state) {
  (void)state;
  atomic_int progress = 0;
  run_callers(4, 40, &progress, shut_down_midway);
  assert_int_equal(atomic_load(&progress), 4 * 40);
  assert_int_equal(servd_threadpool_size(), POOL); /* restarted at SERVD_THREADS */
  assert_true(atomic_load(&max_running) <= POOL);
  assert_int_equal(atomic_load(&overlap_errors), 0);
}

static void test_shutdown_idle(void **state) {
  (void)state;
  job j = {0};
  servd_parallel_for(100, 1, body, &j);
  struct timespec ts = {0, 5000000}; /* long enough for the workers to stop spinning and sleep */
  nanosleep(&ts, NULL);
  servd_threadpool_shutdown();
  servd_parallel_for(100, 1, body, &j); /* a new pool */
  assert_int_equal(atomic_load(&j.sum), 2 * 4950);
  assert_false(atomic_load(&j.bad_thread));
}

int main(void) {
  /* A pool restarted after shutdown takes its size from here; bodies check `thread` against it. */
  setenv("SERVD_THREADS", "3", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_size, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_every_item_once, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_concurrent_mixed_bounded, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_one_slot_bounded, setup_one, teardown_pool),
      cmocka_unit_test_setup_teardown(test_small_jobs_overlap, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_small_beside_parallel, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_parallel_fifo, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_nested, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_shutdown_under_load, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_shutdown_idle, setup_pool, teardown_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
