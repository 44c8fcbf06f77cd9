/* The device executors (kernels/device/device_executor.c) over the CUDA stand-in (fake_cuda.c), with
 * the stand-in's thread check on: any CUDA call made off an executor thread aborts the test.
 *
 * Checks, against values computed here (small integers, exact in bf16):
 *  - the check is not vacuous: a CUDA call from this thread is caught and named;
 *  - ops run in the order they were queued, across more ops than the ring holds (a reset and an
 *    increment that do not commute, downloads in between);
 *  - an op that fails on the executor fails the next waiting call, naming the op; the ops queued
 *    after it are skipped; the call after that works again;
 *  - stopping with ops queued behind a busy executor: drain runs them, cancel skips them and the
 *    waiting caller gets SERVD_ECANCELED; a new executor starts on the next call;
 *  - a rank failing mid-step (its collective never comes): the other rank's step fails naming the
 *    collective, the process lives, and after a reset both ranks' next all-reduce is right;
 *  - a graph is captured on the executor while its owner holds the device's queue: another thread's
 *    op queued during the capture waits for its end, runs once and is not in the graph.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "device_internal.h"
#include "fake_cuda.h"
#include "servd/device.h"

#define N 64

static servd_tensor *dev_filled(int device, float v) {
  int64_t shape[2] = {1, N};
  servd_tensor *h = servd_tensor_new(SERVD_F32, 2, shape), *d = NULL;
  float *p = servd_tensor_data(h);
  for (int i = 0; i < N; i++) p[i] = v;
  assert_int_equal(servd_device_upload(device, h, SERVD_BF16, &d), 0);
  servd_tensor_release(h);
  return d;
}

/* Every element of d, which must all be equal; -1000 when the download failed. */
static float read_value(const servd_tensor *d, int *rc) {
  servd_tensor *h = servd_tensor_new(SERVD_BF16, d->ndim, d->shape);
  *rc = servd_device_copy(h, d);
  const uint16_t *p = servd_tensor_data(h);
  float v = servd_bf16_to_f32(p[0]);
  for (int i = 1; i < N && !*rc; i++) assert_true(servd_bf16_to_f32(p[i]) == v);
  servd_tensor_release(h);
  return *rc ? -1000.0f : v;
}

static float value(const servd_tensor *d) {
  int rc;
  float v = read_value(d, &rc);
  assert_int_equal(rc, 0);
  return v;
}

/* ---- the property's check catches a call off the executors -------------------------------------- */
static void test_check_catches_a_stray_call(void **state) {
  (void)state;
  assert_true(servd_device_executor_enabled());
  fake_cuda_thread_check(2); /* count instead of abort */
  uint64_t before = fake_cuda_thread_violations(NULL, 0);
  int n = 0;
  cudaGetDeviceCount(&n); /* this thread is no executor */
  char first[200];
  assert_int_equal(fake_cuda_thread_violations(first, sizeof first), before + 1);
  assert_non_null(strstr(first, "cudaGetDeviceCount"));
  fake_cuda_thread_check(1);
}

/* ---- order ------------------------------------------------------------------------------------- */
static void test_ops_run_in_queue_order(void **state) {
  (void)state;
  servd_tensor *x = dev_filled(0, 0.0f), *one = dev_filled(0, 1.0f), *base[4];
  for (int i = 0; i < 4; i++) base[i] = dev_filled(0, 10.0f * (float)i);
  float want = 0.0f;
  servd_device_executor_figures f0, f1;
  servd_device_executor_stats(0, &f0);
  for (int k = 0; k < 3000; k++) {
    if (k % 7 == 0) {
      const int b = (k / 7) % 4;
      assert_int_equal(servd_device_copy(x, base[b]), 0); /* device to device: queued */
      want = 10.0f * (float)b;
    } else {
      assert_int_equal(servd_device_add(x, x, one), 0);
      want += 1.0f;
    }
    if (k % 500 == 499) assert_true(value(x) == want);
  }
  assert_true(value(x) == want);
  servd_device_executor_stats(0, &f1);
  assert_true(f1.enqueued - f0.enqueued >= 3000); /* queued, not run here */
  assert_int_equal(f1.skipped, f0.skipped);
  for (int i = 0; i < 4; i++) servd_tensor_release(base[i]);
  servd_tensor_release(x);
  servd_tensor_release(one);
}

/* ---- a failed op fails the next waiting call ----------------------------------------------------- */
static void test_error_reaches_next_wait(void **state) {
  (void)state;
  servd_tensor *x = dev_filled(0, 1.0f), *one = dev_filled(0, 1.0f);
  servd_device_graph *g = NULL;
  assert_int_equal(servd_device_graph_begin(0), 0);
  assert_int_equal(servd_device_add(x, x, one), 0);
  assert_int_equal(servd_device_graph_end(0, &g), 0);
  fake_cuda_fail_graph_launches(1);
  servd_device_executor_figures f0, f1;
  servd_device_executor_stats(0, &f0);
  assert_int_equal(servd_device_graph_launch(g), 0); /* queued: fails on the executor */
  assert_int_equal(servd_device_add(x, x, one), 0);  /* skipped: its step failed */
  int rc;
  read_value(x, &rc);
  assert_int_not_equal(rc, 0);
  assert_non_null(strstr(servd_last_error(), "device_graph_launch"));
  assert_non_null(strstr(servd_last_error(), "failed before it on cuda:0"));
  servd_device_executor_stats(0, &f1);
  assert_true(f1.skipped >= f0.skipped + 2); /* the add and the download */
  assert_true(value(x) == 1.0f);             /* reported once; nothing of the failed step ran */
  assert_int_equal(servd_device_graph_launch(g), 0);
  assert_true(value(x) == 2.0f);
  servd_device_graph_destroy(g);
  servd_tensor_release(x);
  servd_tensor_release(one);
}

/* ---- stop with ops queued ------------------------------------------------------------------------ */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool entered, open;
} gate;

static int hold_gate(void *p) { /* runs on the executor: keeps it busy until the test opens the gate */
  gate *g = *(gate **)p;
  pthread_mutex_lock(&g->mu);
  g->entered = true;
  pthread_cond_broadcast(&g->cv);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  return SERVD_OK;
}

typedef struct waiting_call {
  servd_tensor *x;
  int rc;
} waiting_call;

static void *sync_main(void *p) {
  waiting_call *w = p;
  w->rc = servd_device_sync(0);
  return NULL;
}

static void *stop_main(void *p) {
  servd_device_executors_stop(*(bool *)p);
  return NULL;
}

static void stop_with_queue(bool drain) {
  servd_tensor *x = dev_filled(0, 0.0f), *one = dev_filled(0, 1.0f);
  gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
  gate *gp = &g;
  assert_int_equal(servd__dev_forward("test gate", 0, hold_gate, &gp, sizeof gp, 0, NULL, 0), 0);
  pthread_mutex_lock(&g.mu);
  while (!g.entered) pthread_cond_wait(&g.cv, &g.mu);
  pthread_mutex_unlock(&g.mu);
  for (int i = 0; i < 20; i++) assert_int_equal(servd_device_add(x, x, one), 0);
  waiting_call w = {x, 0};
  pthread_t waiter, stopper;
  assert_int_equal(pthread_create(&waiter, NULL, sync_main, &w), 0);
  servd_device_executor_figures f;
  do servd_device_executor_stats(0, &f);
  while (f.queued < 22); /* the gate's slot, the 20 adds and the waiting sync */
  assert_int_equal(pthread_create(&stopper, NULL, stop_main, &drain), 0);
  do servd_device_executor_stats(0, &f);
  while (f.enqueued); /* the stop has marked the executor and taken it out of the table */
  pthread_mutex_lock(&g.mu);
  g.open = true;
  pthread_cond_broadcast(&g.cv);
  pthread_mutex_unlock(&g.mu);
  pthread_join(stopper, NULL);
  pthread_join(waiter, NULL);
  assert_int_equal(w.rc, drain ? 0 : SERVD_ECANCELED);
  assert_true(value(x) == (drain ? 20.0f : 0.0f)); /* a new executor */
  servd_tensor_release(x);
  servd_tensor_release(one);
}

static void test_stop_drains(void **state) {
  (void)state;
  stop_with_queue(true);
}

static void test_stop_cancels(void **state) {
  (void)state;
  stop_with_queue(false);
}

/* ---- a rank fails mid-step ----------------------------------------------------------------------- */
typedef struct rank_run {
  servd_device_comm *comm;
  int rank;
  bool fail;      /* fails before its collective, as a rank whose Python raised */
  float add, got; /* its part, and the reduced value it read */
  int rc;
  char msg[512];
} rank_run;

static void *rank_main(void *p) {
  rank_run *r = p;
  servd_tensor *x = dev_filled(r->rank, 0.0f), *part = dev_filled(r->rank, r->add);
  r->rc = servd_device_add(x, x, part);
  if (r->fail) {
    servd_device_comm_abort(r->comm); /* as the runner does for a failed rank */
  } else {
    if (!r->rc) r->rc = servd_device_allreduce_sum(r->comm, r->rank, x);
    if (!r->rc) r->got = read_value(x, &r->rc);
    if (r->rc) snprintf(r->msg, sizeof r->msg, "%s", servd_last_error());
  }
  servd_tensor_release(x);
  servd_tensor_release(part);
  return NULL;
}

static void run_step(servd_device_comm *comm, rank_run *runs) {
  pthread_t t[2];
  for (int r = 0; r < 2; r++) {
    runs[r].comm = comm;
    runs[r].rank = r;
    assert_int_equal(pthread_create(&t[r], NULL, rank_main, &runs[r]), 0);
  }
  for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
}

static void test_rank_fails_mid_step(void **state) {
  (void)state;
  servd_device_comm *comm = NULL;
  assert_int_equal(servd_device_comm_create(2, (int[]){0, 1}, &comm), 0);
  rank_run ok[2] = {{.add = 3.0f}, {.add = 4.0f}};
  run_step(comm, ok);
  assert_int_equal(ok[0].rc, 0);
  assert_true(ok[0].got == 7.0f && ok[1].got == 7.0f);

  rank_run failing[2] = {{.add = 3.0f}, {.add = 4.0f, .fail = true}};
  run_step(comm, failing);
  assert_int_not_equal(failing[0].rc, 0); /* its step fails, naming the collective */
  assert_non_null(strstr(failing[0].msg, "device allreduce"));
  assert_int_equal(servd_device_comm_reset(comm), 0);

  rank_run again[2] = {{.add = 5.0f}, {.add = 6.0f}};
  run_step(comm, again);
  assert_int_equal(again[0].rc, 0);
  assert_int_equal(again[1].rc, 0);
  assert_true(again[0].got == 11.0f && again[1].got == 11.0f);
  servd_device_comm_destroy(comm);
}

/* ---- graphs are captured on the executor, and hold only their owner's work ------------------------ */
typedef struct other_op {
  servd_tensor *y, *one;
  int rc;
  bool done;
} other_op;

static void *other_main(void *p) {
  other_op *o = p;
  o->rc = servd_device_add(o->y, o->y, o->one); /* waits while the capture owns the queue */
  __atomic_store_n(&o->done, true, __ATOMIC_RELEASE);
  return NULL;
}

static void test_capture_owns_the_queue(void **state) {
  (void)state;
  servd_tensor *x = dev_filled(0, 0.0f), *y = dev_filled(0, 0.0f), *one = dev_filled(0, 1.0f);
  fake_cuda_stats s0, s1;
  fake_cuda_get_stats(&s0);
  assert_int_equal(servd_device_graph_begin(0), 0);
  other_op o = {y, one, -1, false};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_main, &o), 0);
  assert_int_equal(servd_device_add(x, x, one), 0);
  assert_false(__atomic_load_n(&o.done, __ATOMIC_ACQUIRE)); /* still waiting for the capture's end */
  servd_device_graph *g = NULL;
  assert_int_equal(servd_device_graph_end(0, &g), 0);
  pthread_join(t, NULL);
  assert_int_equal(o.rc, 0);
  for (int i = 0; i < 3; i++) assert_int_equal(servd_device_graph_launch(g), 0);
  assert_true(value(x) == 3.0f);
  assert_true(value(y) == 1.0f);
  fake_cuda_get_stats(&s1);
  assert_int_equal(s1.captures, s0.captures + 1);
  assert_int_equal(s1.graph_launches, s0.graph_launches + 3);
  servd_device_graph_destroy(g);
  servd_tensor_release(x);
  servd_tensor_release(y);
  servd_tensor_release(one);
}

static void test_no_call_off_the_executors(void **state) {
  (void)state;
  char first[200];
  /* the one deliberate stray call of the first test */
  assert_int_equal(fake_cuda_thread_violations(first, sizeof first), 1);
}

int main(void) {
  fake_cuda_configure(2, (size_t)1 << 30);
  fake_cuda_thread_check(1);
  if (!servd_device_executor_enabled()) {
    print_message("executors are off (SERVD_DEVICE_EXECUTOR=0): nothing to test\n");
    return 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_check_catches_a_stray_call),
      cmocka_unit_test(test_ops_run_in_queue_order),
      cmocka_unit_test(test_error_reaches_next_wait),
      cmocka_unit_test(test_stop_drains),
      cmocka_unit_test(test_stop_cancels),
      cmocka_unit_test(test_rank_fails_mid_step),
      cmocka_unit_test(test_capture_owns_the_queue),
      cmocka_unit_test(test_no_call_off_the_executors),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  servd_device_executors_stop(true);
  return failed;
}
