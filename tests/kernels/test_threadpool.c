/* The compute pool: coverage of every item, concurrent callers, the bound on computing threads,
 * nested calls, and sizing rules. */
#include <pthread.h>
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

static atomic_int running, max_running;

static void enter(void) {
  int r = atomic_fetch_add(&running, 1) + 1, m = atomic_load(&max_running);
  while (r > m && !atomic_compare_exchange_weak(&max_running, &m, r)) {
  }
}

typedef struct job {
  int64_t n;
  atomic_int *hits;
  atomic_llong sum;
  int bad_thread;
} job;

static void body(void *ctx, int64_t b, int64_t e, int thread) {
  job *j = ctx;
  enter();
  if (thread < 0 || thread >= POOL) j->bad_thread = 1;
  long long s = 0;
  for (int64_t i = b; i < e; i++) {
    if (j->hits) atomic_fetch_add(&j->hits[i], 1);
    s += i;
  }
  /* Hold the slot a little so that overlapping chunks from different callers would be seen. */
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
  atomic_fetch_add(&j->sum, s);
  atomic_fetch_sub(&running, 1);
}

static int setup(void **state) {
  (void)state;
  return servd_threadpool_init(POOL);
}

static void test_size(void **state) {
  (void)state;
  assert_int_equal(servd_threadpool_size(), POOL);
  assert_int_equal(servd_threadpool_init(POOL), 0);
  assert_int_equal(servd_threadpool_init(POOL + 1), SERVD_EBUSY);
  assert_int_equal(servd_threadpool_init(-1), SERVD_EINVAL);
}

static void test_every_item_once(void **state) {
  (void)state;
  for (int64_t n = 0; n < 300; n += 7) {
    for (int64_t grain = 1; grain < 64; grain *= 4) {
      job j = {.n = n, .hits = calloc((size_t)n + 1, sizeof(atomic_int))};
      servd_parallel_for(n, grain, body, &j);
      for (int64_t i = 0; i < n; i++) assert_int_equal(atomic_load(&j.hits[i]), 1);
      assert_int_equal(atomic_load(&j.sum), n * (n - 1) / 2);
      assert_false(j.bad_thread);
      free(j.hits);
    }
  }
}

static void *caller(void *arg) {
  int *fails = arg;
  for (int it = 0; it < 50; it++) {
    int64_t n = 1 + (it * 37) % 200;
    job j = {.n = n};
    servd_parallel_for(n, 1 + it % 5, body, &j);
    if (atomic_load(&j.sum) != n * (n - 1) / 2 || j.bad_thread) (*fails)++;
  }
  return NULL;
}

static void test_concurrent_callers_bounded(void **state) {
  (void)state;
  enum { CALLERS = 6 };
  pthread_t th[CALLERS];
  int fails[CALLERS] = {0};
  atomic_store(&max_running, 0);
  for (int i = 0; i < CALLERS; i++) pthread_create(&th[i], NULL, caller, &fails[i]);
  for (int i = 0; i < CALLERS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < CALLERS; i++) assert_int_equal(fails[i], 0);
  /* Six callers, each wanting the whole pool: never more than POOL tasks at once. */
  assert_true(atomic_load(&max_running) <= POOL);
  assert_true(atomic_load(&max_running) >= 1);
}

static void inner(void *ctx, int64_t b, int64_t e, int thread) {
  (void)thread;
  atomic_llong *s = ctx;
  for (int64_t i = b; i < e; i++) atomic_fetch_add(s, i);
}

static void outer(void *ctx, int64_t b, int64_t e, int thread) {
  (void)thread;
  for (int64_t i = b; i < e; i++) servd_parallel_for(10, 1, inner, ctx); /* runs inline, no deadlock */
}

static void test_nested(void **state) {
  (void)state;
  atomic_llong s = 0;
  servd_parallel_for(20, 1, outer, &s);
  assert_int_equal(atomic_load(&s), 20 * 45);
}

static int teardown(void **state) {
  (void)state;
  servd_threadpool_shutdown();
  servd_threadpool_shutdown(); /* idempotent */
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_size), cmocka_unit_test(test_every_item_once),
      cmocka_unit_test(test_concurrent_callers_bounded), cmocka_unit_test(test_nested),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
