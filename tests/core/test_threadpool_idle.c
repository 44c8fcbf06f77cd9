/* The compute pool's idle workers: servd_threadpool_quiesce() and workers that stop spinning because
 * their jobs were too small must never cost a later job its helpers for good, nor hang shutdown.
 *
 * No timing: each check waits, unbounded, for a job's chunks to run on two threads at once, so a
 * worker that never came back hangs the test and ctest's timeout fails it. */
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

#define POOL 2 /* the caller and one worker: every two-thread meeting needs that worker */

long servd__threadpool_deep_sleeps(void); /* threadpool.c, for tests: sleeps callers do not end */

static void relax(void) {
  struct timespec ts = {0, 10000};
  nanosleep(&ts, NULL);
}

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Two chunks, each returns only once both have started: the worker must take one. */
typedef struct meeting {
  atomic_int arrived;
  atomic_int threads[POOL];
} meeting;

static void meet(void *ctx, int64_t b, int64_t e, int thread) {
  (void)b, (void)e;
  meeting *m = ctx;
  if (thread >= 0 && thread < POOL) atomic_store(&m->threads[thread], 1);
  atomic_fetch_add(&m->arrived, 1);
  while (atomic_load(&m->arrived) < 2) relax();
}

static void assert_meets(void) {
  meeting m = {0};
  servd_parallel_for(2, 1, meet, &m);
  assert_int_equal(atomic_load(&m.arrived), 2);
  assert_true(atomic_load(&m.threads[0]) && atomic_load(&m.threads[1])); /* two slots, one each */
}

static void nothing(void *ctx, int64_t b, int64_t e, int thread) { (void)ctx, (void)b, (void)e, (void)thread; }

static void busy_ns(long ns) {
  const long end = now_ns() + ns;
  while (now_ns() < end) {}
}

static int setup_pool(void **state) {
  (void)state;
  return servd_threadpool_init(POOL);
}

static int teardown_pool(void **state) {
  (void)state;
  servd_threadpool_shutdown();
  return 0;
}

static void test_quiesce_without_pool(void **state) {
  (void)state;
  servd_threadpool_shutdown();
  servd_threadpool_quiesce(); /* must not start a pool: the init below would then see another size */
  assert_int_equal(servd_threadpool_init(POOL), 0);
  assert_int_equal(servd_threadpool_size(), POOL);
}

static void test_job_after_quiesce(void **state) {
  (void)state;
  for (int i = 0; i < 200; i++) {
    assert_meets();
    servd_threadpool_quiesce(); /* the worker stops spinning: the next job must wake it */
    if (i % 4 == 0) relax();    /* sometimes long enough for it to fall asleep */
  }
}

static void test_job_after_small_jobs(void **state) {
  (void)state;
  /* Jobs with no work, far apart: the worker spins much longer than it computes and stops being
   * woken by callers. Until it does (it needs its turn on a CPU to notice), keep issuing them. */
  const long before = servd__threadpool_deep_sleeps();
  while (servd__threadpool_deep_sleeps() == before) {
    servd_parallel_for(2, 1, nothing, NULL);
    busy_ns(50000);
  }
  assert_meets(); /* it looks for jobs again on its own */
  assert_meets();
}

static void test_shutdown_deep_asleep(void **state) {
  (void)state;
  const long before = servd__threadpool_deep_sleeps();
  while (servd__threadpool_deep_sleeps() == before) {
    servd_parallel_for(2, 1, nothing, NULL);
    busy_ns(50000);
  }
  servd_threadpool_shutdown(); /* joins the sleeping worker */
  assert_int_equal(servd_threadpool_init(POOL), 0);
  assert_meets();
}

/* Callers checking every sum while another thread keeps quiescing the pool. */
static atomic_int stop_quiescing;

static void add_range(void *ctx, int64_t b, int64_t e, int thread) {
  (void)thread;
  long long s = 0;
  for (int64_t i = b; i < e; i++) s += i;
  atomic_fetch_add((atomic_llong *)ctx, s);
}

static void *quiescer(void *arg) {
  (void)arg;
  while (!atomic_load(&stop_quiescing)) {
    servd_threadpool_quiesce();
    relax();
  }
  return NULL;
}

static void *summer(void *arg) {
  int *fails = arg;
  for (int it = 0; it < 300; it++) {
    const int64_t n = 1 + (it * 53) % 500;
    atomic_llong sum = 0;
    servd_parallel_for(n, 1 + it % 7, add_range, &sum);
    if (atomic_load(&sum) != n * (n - 1) / 2) (*fails)++;
    if (it % 50 == 0) busy_ns(300000); /* gaps longer than any spin */
  }
  return NULL;
}

static void test_quiesce_under_load(void **state) {
  (void)state;
  atomic_store(&stop_quiescing, 0);
  pthread_t q, c[3];
  int fails[3] = {0};
  assert_int_equal(pthread_create(&q, NULL, quiescer, NULL), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&c[i], NULL, summer, &fails[i]), 0);
  for (int i = 0; i < 3; i++) pthread_join(c[i], NULL);
  atomic_store(&stop_quiescing, 1);
  pthread_join(q, NULL);
  for (int i = 0; i < 3; i++) assert_int_equal(fails[i], 0);
  assert_meets();
}

int main(void) {
  setenv("SERVD_THREADS", "2", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_quiesce_without_pool, NULL, teardown_pool),
      cmocka_unit_test_setup_teardown(test_job_after_quiesce, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_job_after_small_jobs, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_shutdown_deep_asleep, setup_pool, teardown_pool),
      cmocka_unit_test_setup_teardown(test_quiesce_under_load, setup_pool, teardown_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
