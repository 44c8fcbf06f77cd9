/* Collectives: ranks on their own threads; all-reduce must equal the serial sum in rank order (bit
 * for bit: it is the same f32 additions in the same order), all-gather must equal the columns laid
 * side by side; many back-to-back calls; mismatched shapes fail on every rank without hanging; an
 * aborted group releases its waiting ranks with SERVD_ECANCELED (all ranks agree on which call was
 * the last to complete) and works again after reset. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <time.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

#define ITERS 200

static float value(int iter, int rank, int64_t i) { /* distinct, not exactly representable sums */
  return (float)((iter * 31 + rank * 7 + (int)i) % 97) * 0.1f + (float)rank / 3.0f;
}

typedef struct rank_arg {
  servd_comm *c;
  int rank, world;
  int64_t m, n;
  atomic_int *errors;
  int mode; /* 0 all-reduce, 1 all-gather, 2 mismatch */
} rank_arg;

static void *rank_main(void *p) {
  rank_arg *a = p;
  int64_t shape[2] = {a->m, a->n};
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape);
  int64_t gshape[2] = {a->m, a->n * a->world};
  servd_tensor *g = servd_tensor_new(SERVD_F32, 2, gshape);
  for (int it = 0; it < ITERS; it++) {
    float *xd = servd_tensor_data(x);
    for (int64_t i = 0; i < a->m * a->n; i++) xd[i] = value(it, a->rank, i);
    if (a->mode == 0) {
      if (servd_allreduce_sum(a->c, a->rank, x) != 0) atomic_fetch_add(a->errors, 1);
      for (int64_t i = 0; i < a->m * a->n; i++) {
        float want = value(it, 0, i);
        for (int r = 1; r < a->world; r++) want += value(it, r, i);
        if (xd[i] != want) {
          atomic_fetch_add(a->errors, 1);
          break;
        }
      }
    } else if (a->mode == 1) {
      if (servd_allgather_cols(a->c, a->rank, g, x) != 0) atomic_fetch_add(a->errors, 1);
      const float *gd = servd_tensor_data(g);
      for (int64_t row = 0; row < a->m; row++)
        for (int r = 0; r < a->world; r++)
          for (int64_t j = 0; j < a->n; j++)
            if (gd[row * a->n * a->world + r * a->n + j] != value(it, r, row * a->n + j))
              atomic_fetch_add(a->errors, 1);
    } else {
      /* rank 1 brings a different shape: every rank must get EINVAL, and the group must stay usable */
      servd_tensor *y = x;
      int64_t other[2] = {a->m, a->n + 1};
      if (a->rank == 1) y = servd_tensor_new(SERVD_F32, 2, other);
      int rc = servd_allreduce_sum(a->c, a->rank, y);
      if (rc != SERVD_EINVAL || !strstr(servd_last_error(), "allreduce_sum")) atomic_fetch_add(a->errors, 1);
      if (y != x) servd_tensor_release(y);
      if (servd_allreduce_sum(a->c, a->rank, x) != 0) atomic_fetch_add(a->errors, 1);
      if (it == 3) break;
    }
  }
  servd_tensor_release(x);
  servd_tensor_release(g);
  return NULL;
}

static int run_group(int world, int64_t m, int64_t n, int mode) {
  servd_comm *c = NULL;
  assert_int_equal(servd_comm_create(&c, world), 0);
  atomic_int errors = 0;
  pthread_t th[8];
  rank_arg args[8];
  for (int r = 0; r < world; r++) {
    args[r] = (rank_arg){c, r, world, m, n, &errors, mode};
    assert_int_equal(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
  }
  for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
  servd_comm_destroy(c);
  return atomic_load(&errors);
}

static void test_allreduce(void **state) {
  (void)state;
  assert_int_equal(run_group(1, 2, 5, 0), 0);
  assert_int_equal(run_group(2, 1, 576, 0), 0);
  assert_int_equal(run_group(3, 4, 7, 0), 0); /* columns not divisible by the ranks */
  assert_int_equal(run_group(4, 3, 2, 0), 0); /* fewer columns than ranks */
  assert_int_equal(run_group(2, 0, 8, 0), 0);
}

static void test_allgather(void **state) {
  (void)state;
  assert_int_equal(run_group(1, 2, 5, 1), 0);
  assert_int_equal(run_group(2, 3, 100, 1), 0);
  assert_int_equal(run_group(3, 1, 17, 1), 0);
}

static void test_mismatch(void **state) {
  (void)state;
  assert_int_equal(run_group(2, 2, 8, 2), 0);
  assert_int_equal(run_group(3, 2, 8, 2), 0);
}

/* TP: y = x @ W^T with W split by rows (column-parallel) then summed = the serial product, within
 * f32 reassociation of the partial sums (k/world terms each). */
typedef struct tp_arg {
  servd_comm *c;
  int rank, world;
  const float *x, *w; /* x (1,k), w (n,k) */
  int k, n;
  float *y; /* (1,n) per rank */
  int rc;
} tp_arg;

static void *tp_main(void *p) {
  tp_arg *a = p;
  int64_t shape[2] = {1, a->n};
  servd_tensor *y = servd_tensor_new(SERVD_F32, 2, shape);
  float *yd = servd_tensor_data(y);
  int k0 = a->k * a->rank / a->world, k1 = a->k * (a->rank + 1) / a->world;
  for (int j = 0; j < a->n; j++) { /* row-parallel: each rank owns a slice of the k dimension */
    float s = 0;
    for (int i = k0; i < k1; i++) s += a->x[i] * a->w[j * a->k + i];
    yd[j] = s;
  }
  a->rc = servd_allreduce_sum(a->c, a->rank, y); /* checked on the main thread: cmocka asserts are not thread-safe */
  memcpy(a->y, yd, (size_t)a->n * sizeof(float));
  servd_tensor_release(y);
  return NULL;
}

static void test_tensor_parallel_sum(void **state) {
  (void)state;
  enum { K = 96, N = 10, W = 2 };
  static float x[K], w[N * K], y[W][N];
  for (int i = 0; i < K; i++) x[i] = sinf((float)i);
  for (int i = 0; i < N * K; i++) w[i] = cosf((float)i * 0.37f);
  servd_comm *c = NULL;
  assert_int_equal(servd_comm_create(&c, W), 0);
  pthread_t th[W];
  tp_arg args[W];
  for (int r = 0; r < W; r++) {
    args[r] = (tp_arg){c, r, W, x, w, K, N, y[r], -1};
    assert_int_equal(pthread_create(&th[r], NULL, tp_main, &args[r]), 0);
  }
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    assert_int_equal(args[r].rc, 0);
  }
  for (int j = 0; j < N; j++) {
    double ref = 0;
    for (int i = 0; i < K; i++) ref += (double)x[i] * w[j * K + i];
    assert_true(y[0][j] == y[1][j]);        /* every rank holds the same bits */
    assert_float_equal(y[0][j], ref, 1e-4); /* 96 f32 products of magnitude <= 1 */
  }
  servd_comm_destroy(c);
}

static void test_bad_args(void **state) {
  (void)state;
  servd_comm *c = NULL;
  assert_int_equal(servd_comm_create(&c, 0), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "comm_create"));
  assert_int_equal(servd_comm_create(&c, 1), 0);
  int64_t shape[2] = {2, 3};
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape), *h = servd_tensor_new(SERVD_F16, 2, shape);
  assert_int_equal(servd_allreduce_sum(c, 1, x), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "rank 1"));
  assert_int_equal(servd_allreduce_sum(c, 0, h), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "f16[2,3]"));
  assert_int_equal(servd_allreduce_sum(c, 0, x), 0);
  assert_int_equal(servd_allgather_cols(c, 0, h, x), SERVD_EINVAL);
  assert_int_equal(servd_allgather_cols(c, 0, NULL, x), SERVD_EINVAL);
  servd_tensor_release(x);
  servd_tensor_release(h);
  servd_comm_destroy(c);
  servd_comm_destroy(NULL);
}

/* ---- abort ---------------------------------------------------------------------------------------- */

typedef struct abort_arg {
  servd_comm *c;
  int rank, world;
  int calls;      /* collectives to attempt (until the first failure) */
  int gather;     /* use all-gather instead of all-reduce */
  int done;       /* calls that returned 0 */
  int rc;         /* code of the first failure (0: none) */
  int bad_values; /* wrong sums in completed calls */
  atomic_int finished;
} abort_arg;

static void *abort_rank_main(void *p) {
  abort_arg *a = p;
  int64_t shape[2] = {2, 6}, gshape[2] = {2, 6 * (int64_t)a->world};
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape), *g = servd_tensor_new(SERVD_F32, 2, gshape);
  for (int it = 0; it < a->calls; it++) {
    float *xd = servd_tensor_data(x);
    for (int64_t i = 0; i < 12; i++) xd[i] = value(it, a->rank, i);
    int rc = a->gather ? servd_allgather_cols(a->c, a->rank, g, x) : servd_allreduce_sum(a->c, a->rank, x);
    if (rc) {
      a->rc = rc;
      break;
    }
    a->done++;
    if (!a->gather) {
      for (int64_t i = 0; i < 12; i++) {
        float want = value(it, 0, i);
        for (int r = 1; r < a->world; r++) want += value(it, r, i);
        if (xd[i] != want) a->bad_values++;
      }
    }
  }
  servd_tensor_release(x);
  servd_tensor_release(g);
  atomic_store(&a->finished, 1);
  return NULL;
}

/* Joins t, failing the test (instead of hanging ctest) if it has not ended within a wide margin. */
static void join_within(pthread_t t, const atomic_int *finished, int seconds) {
  for (int i = 0; i < seconds * 100 && !atomic_load(finished); i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (!atomic_load(finished)) fail_msg("a rank is still waiting %d s after the abort", seconds);
  pthread_join(t, NULL);
}

static void start_ranks(servd_comm *c, int world, int n, abort_arg *args, pthread_t *th, int calls, int gather) {
  for (int r = 0; r < n; r++) {
    args[r] = (abort_arg){.c = c, .rank = r, .world = world, .calls = calls, .gather = gather};
    atomic_init(&args[r].finished, 0);
    assert_int_equal(pthread_create(&th[r], NULL, abort_rank_main, &args[r]), 0);
  }
}

/* Rank 2 of 3 never arrives: the two others wait until the abort, then get SERVD_ECANCELED; later
 * calls fail at once; after reset all three ranks complete calls with correct sums. */
static void test_abort_releases_waiting_ranks(void **state) {
  (void)state;
  for (int gather = 0; gather < 2; gather++) {
    servd_comm *c = NULL;
    assert_int_equal(servd_comm_create(&c, 3), 0);
    abort_arg args[3];
    pthread_t th[3];
    start_ranks(c, 3, 2, args, th, 1, gather);
    struct timespec ts = {0, 50 * 1000 * 1000}; /* let them reach the barrier (not required for correctness) */
    nanosleep(&ts, NULL);
    assert_false(servd_comm_aborted(c));
    servd_comm_abort(c);
    assert_true(servd_comm_aborted(c));
    for (int r = 0; r < 2; r++) {
      join_within(th[r], &args[r].finished, 30);
      assert_int_equal(args[r].rc, SERVD_ECANCELED);
      assert_int_equal(args[r].done, 0);
    }
    /* Still aborted: a new call fails without waiting, with a message naming the op and the rank. */
    int64_t shape[2] = {2, 6};
    servd_tensor *x = servd_tensor_new(SERVD_F32, 2, shape);
    assert_int_equal(servd_allreduce_sum(c, 2, x), SERVD_ECANCELED);
    assert_non_null(strstr(servd_last_error(), "allreduce_sum: rank 2"));
    assert_int_equal(servd_allgather_cols(c, 0, x, x), SERVD_ECANCELED);
    servd_tensor_release(x);

    servd_comm_reset(c);
    assert_false(servd_comm_aborted(c));
    start_ranks(c, 3, 3, args, th, 20, gather);
    for (int r = 0; r < 3; r++) {
      join_within(th[r], &args[r].finished, 60);
      assert_int_equal(args[r].rc, 0);
      assert_int_equal(args[r].done, 20);
      assert_int_equal(args[r].bad_values, 0);
    }
    servd_comm_destroy(c);
  }
}

/* An abort that lands while all ranks run collectives back to back: every rank stops, and all agree
 * on how many calls completed (a call passes on every rank or on none), and those calls summed right.
 * Repeated with reset between rounds, so a stale arrival count would show. */
static void test_abort_races_running_group(void **state) {
  (void)state;
  servd_comm *c = NULL;
  assert_int_equal(servd_comm_create(&c, 3), 0);
  for (int round = 0; round < 30; round++) {
    abort_arg args[3];
    pthread_t th[3];
    start_ranks(c, 3, 3, args, th, 1000000, round % 2);
    struct timespec ts = {0, (round % 5) * 200 * 1000};
    nanosleep(&ts, NULL);
    servd_comm_abort(c);
    for (int r = 0; r < 3; r++) join_within(th[r], &args[r].finished, 60);
    for (int r = 0; r < 3; r++) {
      assert_int_equal(args[r].rc, SERVD_ECANCELED);
      assert_int_equal(args[r].done, args[0].done);
      assert_int_equal(args[r].bad_values, 0);
    }
    servd_comm_reset(c);
  }
  /* Usable after the last reset. */
  abort_arg args[3];
  pthread_t th[3];
  start_ranks(c, 3, 3, args, th, 5, 0);
  for (int r = 0; r < 3; r++) {
    join_within(th[r], &args[r].finished, 60);
    assert_int_equal(args[r].rc, 0);
    assert_int_equal(args[r].done, 5);
    assert_int_equal(args[r].bad_values, 0);
  }
  servd_comm_abort(NULL);
  servd_comm_reset(NULL);
  assert_false(servd_comm_aborted(NULL));
  servd_comm_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_allreduce),
      cmocka_unit_test(test_allgather),
      cmocka_unit_test(test_mismatch),
      cmocka_unit_test(test_tensor_parallel_sum),
      cmocka_unit_test(test_bad_args),
      cmocka_unit_test(test_abort_releases_waiting_ranks),
      cmocka_unit_test(test_abort_races_running_group),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
