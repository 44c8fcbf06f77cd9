/* Every way a quantized weight can be multiplied is as accurate as the best of them.
 *
 * A model reaches the same weight through different paths: the ISA (scalar, AVX2, AVX-512 VNNI), a
 * row alone (decode: the m == 1 tile) or inside a batch (prefill: row tiles, row blocks past 128),
 * servd_matmul or servd_matmul_many (one activation quantization shared by several weights), and
 * under tensor parallelism a slice of the output columns (column-parallel) or of k (row-parallel:
 * per-rank partial sums, then the all-reduce). For every quantized dtype the test computes one output
 * through each path and compares it with the float64 product of the f32 activations and the
 * dequantized weight:
 * - each path's RMS error is at most 1.001x the smallest (the paths share one activation
 *   quantization; a path that rounded x differently, or used another form of the offset term, errs
 *   by a different amount at the 1e-2 level, while summation order moves it by ~1e-6);
 * - each path equals the scalar path within the summation-order bound of test_matmul.c:
 *   4*(nb+8)*u*(2*sum|x*w|) + 1e-6 per element (u = 2^-24);
 * - batch invariance: on one ISA, every path but the k split gives bit-identical floats (a row alone,
 *   in a batch, in a batch of 130, beside a second weight, in a column slice): a request's numbers do
 *   not depend on what else the step computes (tests/llama/test_engine_batch_invariance.c checks the
 *   same of whole requests).
 * Each holds at both activation precisions (servd_cpu_set_activation_levels), and the residual level
 * must bring the error against float64 down at least 50x on every path.
 * Weights have a per-row mean (the q4_1/q5_1/k-quant offset terms carry weight) and x has outlier
 * columns, as the activations of a trained model do.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

static uint32_t rng = 7;
static float frand(void) {
  rng = rng * 1664525u + 1013904223u;
  return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

enum { M = 9, N = 70, BATCH_BIG = 130, SPLIT = 3, MAX_PATHS = 16 };

typedef struct problem {
  servd_dtype dt;
  int64_t k;
  servd_tensor *x, *xbig, *w;
  float *wd;     /* dequantized w (N,k) */
  double *exact; /* (M,N): x @ wd^T in float64 */
  double *mag;   /* (M,N): sum |x*w| */
} problem;

static void problem_init(problem *p, servd_dtype dt, int64_t k) {
  p->dt = dt;
  p->k = k;
  /* the M rows of interest are the first rows of a batch of BATCH_BIG (two row blocks) */
  p->xbig = servd_tensor_new(SERVD_F32, 2, (int64_t[]){BATCH_BIG, k});
  float *xb = servd_tensor_data(p->xbig);
  for (int64_t i = 0; i < BATCH_BIG * k; i++) xb[i] = frand() * ((i % k) % 37 == 5 ? 12.0f : 1.0f);
  p->x = servd_tensor_narrow(p->xbig, 0, 0, M);
  p->w = servd_tensor_new(dt, 2, (int64_t[]){N, k});
  p->wd = malloc((size_t)(N * k) * 4);
  float *row = malloc((size_t)k * 4);
  for (int64_t j = 0; j < N; j++) {
    const float scale = 0.02f * (1.0f + (float)(j % 5)), mean = 0.4f * scale * (float)(j % 3 - 1);
    for (int64_t l = 0; l < k; l++) row[l] = mean + scale * frand();
    char *dst = (char *)servd_tensor_data(p->w) + j * p->w->strides[0];
    assert_int_equal(servd_row_from_f32(dt, row, dst, k), 0);
    assert_int_equal(servd_row_to_f32(dt, dst, p->wd + j * k, k), 0);
  }
  free(row);
  p->exact = calloc(M * N, sizeof(double));
  p->mag = calloc(M * N, sizeof(double));
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++)
      for (int64_t l = 0; l < k; l++) {
        const double t = (double)xb[i * k + l] * p->wd[j * k + l];
        p->exact[i * N + j] += t;
        p->mag[i * N + j] += fabs(t);
      }
}

static void problem_free(problem *p) {
  servd_tensor_release(p->x);
  servd_tensor_release(p->xbig);
  servd_tensor_release(p->w);
  free(p->wd);
  free(p->exact);
  free(p->mag);
}

static servd_tensor *f32(int64_t r, int64_t c) { return servd_tensor_new(SERVD_F32, 2, (int64_t[]){r, c}); }

/* out (M,N) through one path. */
typedef enum path {
  P_BATCH,  /* the M rows as one call */
  P_ALONE,  /* each row alone (m == 1) */
  P_BIG,    /* inside a batch of BATCH_BIG rows */
  P_MANY,   /* servd_matmul_many with a second weight */
  P_COLS,   /* SPLIT column slices of w (column-parallel ranks) */
  P_KSPLIT, /* SPLIT k slices, partial sums added in rank order (row-parallel ranks) */
  P_COUNT
} path;
static const char *const path_names[P_COUNT] = {"batch", "alone", "in-130", "matmul_many", "column-split", "k-split"};

static void run_path(const problem *p, path which, float *out) {
  const int64_t k = p->k;
  switch (which) {
  case P_BATCH: {
    servd_tensor *o = f32(M, N);
    assert_int_equal(servd_matmul(o, p->x, p->w), 0);
    memcpy(out, servd_tensor_data(o), M * N * 4);
    servd_tensor_release(o);
    break;
  }
  case P_ALONE:
    for (int i = 0; i < M; i++) {
      servd_tensor *xi = servd_tensor_narrow(p->x, 0, i, 1), *o = f32(1, N);
      assert_int_equal(servd_matmul(o, xi, p->w), 0);
      memcpy(out + i * N, servd_tensor_data(o), N * 4);
      servd_tensor_release(xi), servd_tensor_release(o);
    }
    break;
  case P_BIG: {
    servd_tensor *o = f32(BATCH_BIG, N);
    assert_int_equal(servd_matmul(o, p->xbig, p->w), 0);
    memcpy(out, servd_tensor_data(o), M * N * 4);
    servd_tensor_release(o);
    break;
  }
  case P_MANY: {
    servd_tensor *o0 = f32(M, N), *o1 = f32(M, N);
    servd_tensor *outs[2] = {o1, o0};
    const servd_tensor *ws[2] = {p->w, p->w};
    assert_int_equal(servd_matmul_many(2, outs, p->x, ws), 0);
    memcpy(out, servd_tensor_data(o0), M * N * 4);
    servd_tensor_release(o0), servd_tensor_release(o1);
    break;
  }
  case P_COLS: {
    const int64_t part[SPLIT] = {32, 24, N - 56};
    for (int r = 0, j0 = 0; r < SPLIT; j0 += (int)part[r], r++) {
      servd_tensor *wr = servd_tensor_narrow(p->w, 0, j0, part[r]), *o = f32(M, part[r]);
      assert_int_equal(servd_matmul(o, p->x, wr), 0);
      for (int i = 0; i < M; i++) memcpy(out + i * N + j0, (float *)servd_tensor_data(o) + i * part[r], part[r] * 4);
      servd_tensor_release(wr), servd_tensor_release(o);
    }
    break;
  }
  case P_KSPLIT: {
    /* contiguous copies of each k slice, as a rank maps its own slice of a row-parallel weight */
    const int64_t ks = k / SPLIT;
    memset(out, 0, M * N * 4);
    for (int r = 0; r < SPLIT; r++) {
      servd_tensor *xr = f32(M, ks), *wr = servd_tensor_new(p->dt, 2, (int64_t[]){N, ks}), *o = f32(M, N);
      for (int i = 0; i < M; i++)
        memcpy((float *)servd_tensor_data(xr) + i * ks, (const float *)servd_tensor_data(p->x) + i * k + r * ks,
               (size_t)ks * 4);
      const size_t rb = (size_t)wr->strides[0], off = (size_t)r * rb;
      for (int j = 0; j < N; j++)
        memcpy((char *)servd_tensor_data(wr) + j * rb,
               (const char *)servd_tensor_data(p->w) + j * p->w->strides[0] + off, rb);
      assert_int_equal(servd_matmul(o, xr, wr), 0);
      for (int i = 0; i < M * N; i++) out[i] += ((const float *)servd_tensor_data(o))[i];
      servd_tensor_release(xr), servd_tensor_release(wr), servd_tensor_release(o);
    }
    break;
  }
  default: fail();
  }
}

static double rms_error(const problem *p, const float *out) {
  double s = 0;
  for (int i = 0; i < M * N; i++) s += (out[i] - p->exact[i]) * (out[i] - p->exact[i]);
  return sqrt(s / (M * N));
}

/* Checks every path of dt at width k under the current activation levels; returns the best path's
 * RMS error against float64. */
static double check_paths(servd_dtype dt, int64_t k) {
  problem p;
  problem_init(&p, dt, k);
  float *ref = malloc(M * N * 4), *out = malloc(M * N * 4), *first = malloc(M * N * 4);
  assert_int_equal(servd_cpu_force_isa(SERVD_ISA_SCALAR), 0);
  run_path(&p, P_BATCH, ref);
  double err[MAX_PATHS], best = INFINITY;
  char names[MAX_PATHS][48];
  int n_paths = 0;
  const int64_t nb = k / 32;
  for (int isa = SERVD_ISA_SCALAR; isa <= (int)servd_cpu_best_isa(); isa++) {
    assert_int_equal(servd_cpu_force_isa((servd_isa)isa), 0);
    for (int w = 0; w < P_COUNT; w++) {
      if (isa != (int)servd_cpu_best_isa() && w != P_BATCH && w != P_ALONE) continue;
      run_path(&p, (path)w, out);
      if (w == P_BATCH) memcpy(first, out, M * N * 4);
      /* q4_k/q5_k on AVX-512 are batch invariant only when asked (servd_cpu_set_batch_invariant) */
      const bool invariant =
          servd_cpu_batch_invariant() || isa != SERVD_ISA_AVX512 || (dt != SERVD_Q4_K && dt != SERVD_Q5_K);
      for (int i = 0; i < M * N && w != P_KSPLIT && invariant; i++)
        if (memcmp(&out[i], &first[i], 4))
          fail_msg("%s %s (k %lld): %s gives element %d as %.9g, the batch path %.9g: not batch invariant",
                   servd_dtype_name(dt), servd_isa_name((servd_isa)isa), (long long)k, path_names[w], i, out[i],
                   first[i]);
      for (int i = 0; i < M * N; i++) {
        const double tol = 4.0 * (double)(nb + 8) * 0x1p-24 * 2.0 * p.mag[i] + 1e-6;
        if (!(fabs(out[i] - ref[i]) <= tol))
          fail_msg("%s %s %s (k %lld) element %d: %.9g, scalar path %.9g (allowed %.3g)", servd_dtype_name(dt),
                   servd_isa_name((servd_isa)isa), path_names[w], (long long)k, i, out[i], ref[i], tol);
      }
      snprintf(names[n_paths], sizeof names[0], "%s %s", servd_isa_name((servd_isa)isa), path_names[w]);
      err[n_paths] = rms_error(&p, out);
      best = fmin(best, err[n_paths]);
      n_paths++;
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  for (int i = 0; i < n_paths; i++) {
    if (!(err[i] <= 1.001 * best))
      fail_msg("%s (k %lld): path %s has RMS error %.6g against float64, the best path %.6g", servd_dtype_name(dt),
               (long long)k, names[i], err[i], best);
  }
  print_message("%-6s k %4lld, %d activation level%s: %d paths, RMS error against float64 %.6g .. %.6g\n",
                servd_dtype_name(dt), (long long)k, servd_cpu_activation_levels(),
                servd_cpu_activation_levels() == 1 ? "" : "s", n_paths, best, best * 1.001);
  free(ref), free(out), free(first);
  problem_free(&p);
  return best;
}

/* Both activation precisions: every path agrees within each, and the residual level (the opt-in)
 * brings every path at least 50x closer to the float64 product than x rounded to 8 bits alone
 * (measured 80-200x: x is then carried to ~15 bits, the weights exactly). */
static void check_dtype(servd_dtype dt, int64_t k) {
  assert_int_equal(servd_cpu_set_activation_levels(1), 0);
  const double one = check_paths(dt, k);
  assert_int_equal(servd_cpu_set_activation_levels(2), 0);
  const double two = check_paths(dt, k);
  assert_int_equal(servd_cpu_set_activation_levels(1), 0); /* back to the default */
  if (!(two * 50.0 <= one))
    fail_msg("%s (k %lld): RMS error against float64 %.6g with the residual level, %.6g without: expected >= 50x "
             "smaller",
             servd_dtype_name(dt), (long long)k, two, one);
}

static void test_block_types(void **state) {
  (void)state;
  const servd_dtype types[] = {SERVD_Q8_0, SERVD_Q4_0, SERVD_Q4_1, SERVD_Q5_0, SERVD_Q5_1, SERVD_IQ4_NL};
  for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
    check_dtype(types[t], 576);  /* the default model's width: 18 blocks, 6 per rank */
    check_dtype(types[t], 1536); /* its MLP width: 48 blocks, 16 per rank */
  }
}

static void test_kquant_types(void **state) {
  (void)state;
  const servd_dtype types[] = {SERVD_Q4_K, SERVD_Q5_K, SERVD_Q6_K, SERVD_Q2_K, SERVD_Q3_K, SERVD_IQ4_XS};
  for (int on = 0; on <= 1; on++) { /* the default, then batch invariance asked for */
    servd_cpu_set_batch_invariant(on);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
      check_dtype(types[t], 768);  /* one super-block per rank */
      check_dtype(types[t], 1536); /* two per rank */
    }
  }
  servd_cpu_set_batch_invariant(false);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_block_types),
      cmocka_unit_test(test_kquant_types),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
