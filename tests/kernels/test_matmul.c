/* servd_matmul on every ISA this CPU has, every weight dtype, awkward shapes, against independent
 * references; plus the error paths.
 *
 * Tolerances:
 * - f32/f16/bf16 weights vs a double-precision reference over the dequantized weights: f32 sums in
 *   any order err by at most k*u*sum|x*w| (u = 2^-24); we allow 2*k*u*sum|x*w|.
 * - quantized, SIMD vs the scalar quantized path: both use the same q8 activations and exact integer
 *   block dots, so they differ only in float summation order and in f32 vs f64 accumulation of the
 *   block terms: allowed 4*nb*u*sum_b|terms| with sum_b|terms| bounded by sum|x|*|w| + 1e-30.
 * - quantized scalar vs the f32 reference over the dequantized weight: activation rounding errs by at
 *   most d_x/2 = amax_b/254 per element, so |err| <= sum_b amax_b/254 * sum_{i in b}|w_i|, plus the
 *   f32 rounding of d_x and s (relative 2^-23 of sum|x*w|); we allow 1.01x that plus 1e-6.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"
#include "servd/threadpool.h"

static uint32_t rng = 1;
static float frand(void) {
  rng = rng * 1664525u + 1013904223u;
  return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

static servd_tensor *rand_f32(int64_t r, int64_t c) {
  servd_tensor *t = servd_tensor_new(SERVD_F32, 2, (int64_t[]){r, c});
  float *d = servd_tensor_data(t);
  for (int64_t i = 0; i < r * c; i++) d[i] = frand();
  return t;
}

/* A weight of dtype dt from random f32 values; *deq receives the dequantized f32 (n,k). */
static servd_tensor *make_w(servd_dtype dt, int64_t n, int64_t k, float **deq) {
  servd_tensor *w = servd_tensor_new(dt, 2, (int64_t[]){n, k});
  float *row = malloc((size_t)(k ? k : 1) * 4);
  *deq = malloc((size_t)(n * k + 1) * 4);
  for (int64_t j = 0; j < n; j++) {
    for (int64_t l = 0; l < k; l++) row[l] = frand() * (1.0f + (float)(j % 3));
    char *dst = (char *)servd_tensor_data(w) + j * w->strides[0];
    assert_int_equal(servd_row_from_f32(dt, row, dst, k), 0);
    assert_int_equal(servd_row_to_f32(dt, dst, *deq + j * k, k), 0);
  }
  free(row);
  return w;
}

static const servd_dtype all_dtypes[] = {SERVD_F32, SERVD_F16, SERVD_BF16, SERVD_Q8_0, SERVD_Q4_0, SERVD_Q4_1};

typedef struct shape {
  int64_t m, n, k;
} shape;

static void check_case(servd_dtype dt, shape s) {
  servd_tensor *x = rand_f32(s.m, s.k);
  float *wd;
  servd_tensor *w = make_w(dt, s.n, s.k, &wd);
  servd_tensor *ref = servd_tensor_new(SERVD_F32, 2, (int64_t[]){s.m, s.n});
  servd_tensor *out = servd_tensor_new(SERVD_F32, 2, (int64_t[]){s.m, s.n});
  const float *xd = servd_tensor_data(x);
  const bool quant = servd_dtype_is_quantized(dt);
  const double u = 0x1p-24;

  if (quant) {
    assert_int_equal(servd_cpu_force_isa(SERVD_ISA_SCALAR), 0);
    assert_int_equal(servd_matmul(ref, x, w), 0);
    /* Scalar quantized path vs f32 over dequantized weights: the activation-rounding bound. */
    for (int64_t i = 0; i < s.m; i++) {
      for (int64_t j = 0; j < s.n; j++) {
        double exact = 0, bound = 0, mag = 0;
        for (int64_t b = 0; b < s.k / 32; b++) {
          double amax = 0, wsum = 0;
          for (int l = 0; l < 32; l++) {
            int64_t q = b * 32 + l;
            amax = fmax(amax, fabs(xd[i * s.k + q]));
            wsum += fabs(wd[j * s.k + q]);
            exact += (double)xd[i * s.k + q] * wd[j * s.k + q];
            mag += fabs((double)xd[i * s.k + q] * wd[j * s.k + q]);
          }
          bound += amax / 254.0 * wsum;
        }
        double got = ((float *)servd_tensor_data(ref))[i * s.n + j];
        assert_true(fabs(got - exact) <= 1.01 * bound + 4 * 0x1p-23 * mag * (double)(s.k / 32 + 1) + 1e-6);
      }
    }
  }
  for (int isa = quant ? SERVD_ISA_AVX2 : SERVD_ISA_SCALAR; isa <= (int)servd_cpu_best_isa(); isa++) {
    assert_int_equal(servd_cpu_force_isa((servd_isa)isa), 0);
    memset(servd_tensor_data(out), 0xff, servd_tensor_nbytes(out)); /* NaN: every element must be written */
    assert_int_equal(servd_matmul(out, x, w), 0);
    const float *o = servd_tensor_data(out), *r = servd_tensor_data(ref);
    for (int64_t i = 0; i < s.m; i++) {
      for (int64_t j = 0; j < s.n; j++) {
        double exact = 0, mag = 0;
        for (int64_t l = 0; l < s.k; l++) {
          exact += (double)xd[i * s.k + l] * wd[j * s.k + l];
          mag += fabs((double)xd[i * s.k + l] * wd[j * s.k + l]);
        }
        double got = o[i * s.n + j], want = quant ? r[i * s.n + j] : exact;
        /* quantized terms d_w*d_x*dot are bounded by about 1.02*mag + the activation error bound */
        double tol = quant ? 4.0 * (double)(s.k / 32 + 8) * u * (2.0 * mag + 1e-30) + 1e-6
                           : 2.0 * (double)(s.k + 1) * u * mag + 1e-30;
        if (!(fabs(got - want) <= tol))
          print_message("%s isa %s m %lld n %lld k %lld at (%lld,%lld): got %.9g want %.9g tol %.3g\n",
                        servd_dtype_name(dt), servd_isa_name((servd_isa)isa), (long long)s.m, (long long)s.n,
                        (long long)s.k, (long long)i, (long long)j, got, want, tol);
        assert_true(fabs(got - want) <= tol);
      }
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  free(wd);
  servd_tensor_release(x);
  servd_tensor_release(w);
  servd_tensor_release(ref);
  servd_tensor_release(out);
}

static void test_float_shapes(void **state) {
  (void)state;
  const shape shapes[] = {{1, 1, 1},     {1, 7, 3},
                          {1, 33, 17},   {2, 31, 100},
                          {3, 65, 33},   {7, 17, 129},
                          {8, 32, 64},   {9, 97, 300},
                          {13, 40, 257}, {16, 64, 16},
                          {1, 300, 576}, {70, 45, 513},
                          {24, 130, 96}, {250, 9, 40} /* x row blocks */,
                          {8, 6, 2100} /* k blocks */};
  for (int d = 0; d < 3; d++) {
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_case(all_dtypes[d], shapes[i]);
  }
}

static void test_quant_shapes(void **state) {
  (void)state;
  /* k a multiple of 32 but not of 64 or 256; n not a multiple of any tile. */
  const shape shapes[] = {{1, 1, 32},
                          {1, 3, 96},
                          {1, 33, 160},
                          {2, 17, 224},
                          {3, 70, 32},
                          {4, 9, 288},
                          {5, 37, 576},
                          {8, 16, 64},
                          {9, 41, 352},
                          {17, 23, 96},
                          {1, 130, 2080},
                          {130, 5, 64},
                          {2, 7, 128} /* last group of 4 blocks */,
                          {1, 9, 640}};
  for (int d = 3; d < 6; d++) {
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_case(all_dtypes[d], shapes[i]);
  }
}

static void test_strided_views(void **state) {
  (void)state;
  /* x and out as column windows of wider tensors; rows of w as a row slice. */
  servd_tensor *xb = rand_f32(5, 80), *ob = servd_tensor_new(SERVD_F32, 2, (int64_t[]){5, 50});
  float *wd;
  servd_tensor *wb = make_w(SERVD_Q8_0, 40, 64, &wd);
  servd_tensor *x = servd_tensor_narrow(xb, 1, 8, 64), *out = servd_tensor_narrow(ob, 1, 3, 30);
  servd_tensor *w = servd_tensor_narrow(wb, 0, 10, 30);
  assert_int_equal(servd_matmul(out, x, w), 0);
  const float *xd = servd_tensor_data(xb), *o = servd_tensor_data(ob);
  for (int i = 0; i < 5; i++) {
    assert_true(o[i * 50 + 0] == 0.0f && o[i * 50 + 2] == 0.0f && o[i * 50 + 33] == 0.0f); /* untouched */
    for (int j = 0; j < 30; j++) {
      double exact = 0, mag = 0;
      for (int l = 0; l < 64; l++) {
        exact += (double)xd[i * 80 + 8 + l] * wd[(10 + j) * 64 + l];
        mag += fabs((double)xd[i * 80 + 8 + l] * wd[(10 + j) * 64 + l]);
      }
      assert_true(fabs(o[i * 50 + 3 + j] - exact) <= 0.02 * mag + 1e-5); /* q8 activations: < 1% */
    }
  }
  free(wd);
  servd_tensor *ts[] = {xb, ob, wb, x, out, w};
  for (int i = 0; i < 6; i++) servd_tensor_release(ts[i]);
}

static void test_empty(void **state) {
  (void)state;
  servd_tensor *x0 = servd_tensor_new(SERVD_F32, 2, (int64_t[]){0, 64});
  servd_tensor *w = servd_tensor_new(SERVD_Q4_1, 2, (int64_t[]){8, 64});
  servd_tensor *o0 = servd_tensor_new(SERVD_F32, 2, (int64_t[]){0, 8});
  assert_int_equal(servd_matmul(o0, x0, w), 0);
  servd_tensor *x = rand_f32(3, 64), *w0 = servd_tensor_new(SERVD_F32, 2, (int64_t[]){0, 64});
  servd_tensor *on = servd_tensor_new(SERVD_F32, 2, (int64_t[]){3, 0});
  assert_int_equal(servd_matmul(on, x, w0), 0);
  /* k == 0: an empty sum is zero. */
  servd_tensor *xk = servd_tensor_new(SERVD_F32, 2, (int64_t[]){2, 0}),
               *wk = servd_tensor_new(SERVD_BF16, 2, (int64_t[]){3, 0});
  servd_tensor *ok = servd_tensor_new(SERVD_F32, 2, (int64_t[]){2, 3});
  memset(servd_tensor_data(ok), 0xff, 24);
  assert_int_equal(servd_matmul(ok, xk, wk), 0);
  for (int i = 0; i < 6; i++) assert_true(((float *)servd_tensor_data(ok))[i] == 0.0f);
  servd_tensor *ts[] = {x0, w, o0, x, w0, on, xk, wk, ok};
  for (int i = 0; i < 9; i++) servd_tensor_release(ts[i]);
}

/* NaN or inf in x makes the affected outputs NaN on every path (no undefined float-to-int casts in
 * activation quantization), and leaves other rows alone. */
static void test_nonfinite_x(void **state) {
  (void)state;
  for (int d = 0; d < 6; d++) {
    float *wd;
    servd_tensor *x = rand_f32(2, 64), *w = make_w(all_dtypes[d], 5, 64, &wd);
    servd_tensor *out = servd_tensor_new(SERVD_F32, 2, (int64_t[]){2, 5});
    ((float *)servd_tensor_data(x))[3] = d % 2 ? INFINITY : NAN;
    for (int isa = 0; isa <= (int)servd_cpu_best_isa(); isa++) {
      assert_int_equal(servd_cpu_force_isa((servd_isa)isa), 0);
      assert_int_equal(servd_matmul(out, x, w), 0);
      const float *o = servd_tensor_data(out);
      for (int j = 0; j < 5; j++) {
        assert_true(isnan(o[j]) || isinf(o[j]));
        assert_true(isfinite(o[5 + j]));
      }
    }
    servd_cpu_force_isa(SERVD_ISA_COUNT);
    free(wd);
    servd_tensor_release(x);
    servd_tensor_release(w);
    servd_tensor_release(out);
  }
}

static void test_errors(void **state) {
  (void)state;
  servd_tensor *x = rand_f32(2, 64), *out = servd_tensor_new(SERVD_F32, 2, (int64_t[]){2, 4});
  servd_tensor *w = servd_tensor_new(SERVD_Q4_0, 2, (int64_t[]){4, 96});
  assert_int_equal(servd_matmul(out, x, w), SERVD_EINVAL);
  const char *e = servd_last_error();
  assert_non_null(strstr(e, "matmul"));
  assert_non_null(strstr(e, "f32[2,64]"));
  assert_non_null(strstr(e, "q4_0[4,96]"));
  servd_tensor_release(w);

  w = servd_tensor_new(SERVD_F32, 2, (int64_t[]){5, 64}); /* out has 4 columns, w 5 rows */
  assert_int_equal(servd_matmul(out, x, w), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "f32[5,64]"));
  servd_tensor_release(w);

  w = servd_tensor_new(SERVD_I32, 2, (int64_t[]){4, 64});
  assert_int_equal(servd_matmul(out, x, w), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "i32[4,64]"));
  servd_tensor_release(w);

  w = servd_tensor_new(SERVD_F32, 2, (int64_t[]){4, 64});
  servd_tensor *xh = servd_tensor_new(SERVD_F16, 2, (int64_t[]){2, 64});
  assert_int_equal(servd_matmul(out, xh, w), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "f16[2,64]"));
  /* A misaligned view (f32 data at an odd address) is refused, not read. */
  servd_tensor bad = *x;
  bad.offset += 2;
  bad.shape[1] = 60;
  servd_tensor *w60 = servd_tensor_new(SERVD_F32, 2, (int64_t[]){4, 60});
  assert_int_equal(servd_matmul(out, &bad, w60), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "misaligned"));
  servd_tensor_release(w60);
  assert_int_equal(servd_matmul(NULL, x, w), SERVD_EINVAL);
  servd_tensor_release(xh);
  servd_tensor_release(w);
  servd_tensor_release(x);
  servd_tensor_release(out);
}

/* Many callers at once (one per interpreter): each thread's activation scratch is its own, so every
 * result must equal the one computed alone, bit for bit (same kernel, same summation order). */
typedef struct caller_case {
  servd_tensor *x, *w, *out, *want;
  int fails;
} caller_case;

static void *caller_main(void *arg) {
  caller_case *c = arg;
  for (int it = 0; it < 20; it++) {
    if (servd_matmul(c->out, c->x, c->w) != 0 ||
        memcmp(servd_tensor_data(c->out), servd_tensor_data(c->want), servd_tensor_nbytes(c->want)) != 0)
      c->fails++;
  }
  return NULL;
}

static void test_concurrent_callers(void **state) {
  (void)state;
  enum { CALLERS = 4 };
  caller_case cs[CALLERS];
  pthread_t th[CALLERS];
  for (int i = 0; i < CALLERS; i++) {
    float *wd;
    int64_t m = 1 + i * 3, n = 40 + i, k = 32 * (3 + i);
    cs[i].x = rand_f32(m, k);
    cs[i].w = make_w(all_dtypes[(i + 3) % 6], n, k, &wd);
    free(wd);
    cs[i].out = servd_tensor_new(SERVD_F32, 2, (int64_t[]){m, n});
    cs[i].want = servd_tensor_new(SERVD_F32, 2, (int64_t[]){m, n});
    cs[i].fails = 0;
    assert_int_equal(servd_matmul(cs[i].want, cs[i].x, cs[i].w), 0);
  }
  for (int i = 0; i < CALLERS; i++) pthread_create(&th[i], NULL, caller_main, &cs[i]);
  for (int i = 0; i < CALLERS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < CALLERS; i++) {
    assert_int_equal(cs[i].fails, 0);
    servd_tensor_release(cs[i].x);
    servd_tensor_release(cs[i].w);
    servd_tensor_release(cs[i].out);
    servd_tensor_release(cs[i].want);
  }
}

/* matmul_many against one servd_matmul per weight, to the bit (same kernels, same column tiles): every
 * dtype, every ISA, 1 to 3 weights of odd sizes (a tile shared by no two weights), decode rows and
 * two row blocks; weights of two dtypes (run one by one); and its argument errors. */
static void many_case(servd_dtype dt, servd_dtype dt_last, int64_t m, int count) {
  const int64_t k = 96, ns[3] = {70, 33, 1};
  servd_tensor *x = rand_f32(m, k), *w[3], *got[3], *want[3];
  for (int i = 0; i < count; i++) {
    float *deq;
    w[i] = make_w(i == count - 1 ? dt_last : dt, ns[i], k, &deq);
    free(deq);
    got[i] = servd_tensor_new(SERVD_F32, 2, (int64_t[]){m, ns[i]});
    want[i] = servd_tensor_new(SERVD_F32, 2, (int64_t[]){m, ns[i]});
    assert_int_equal(servd_matmul(want[i], x, w[i]), 0);
  }
  assert_int_equal(servd_matmul_many(count, got, x, (const servd_tensor *const *)w), 0);
  for (int i = 0; i < count; i++) {
    if (memcmp(servd_tensor_data(got[i]), servd_tensor_data(want[i]), (size_t)(m * ns[i]) * 4) != 0)
      fail_msg("matmul_many %s/%s m=%lld weight %d of %d differs from servd_matmul", servd_dtype_name(dt),
               servd_dtype_name(dt_last), (long long)m, i, count);
    servd_tensor_release(w[i]), servd_tensor_release(got[i]), servd_tensor_release(want[i]);
  }
  servd_tensor_release(x);
}

static void test_matmul_many(void **state) {
  (void)state;
  servd_isa best = servd_cpu_best_isa();
  for (int isa = SERVD_ISA_SCALAR; isa <= (int)best; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++)
      for (int count = 1; count <= 3; count++) {
        many_case(all_dtypes[d], all_dtypes[d], 1, count);
        many_case(all_dtypes[d], all_dtypes[d], 5, count);
        many_case(all_dtypes[d], all_dtypes[d], 130, count); /* two row blocks, the second of 2 rows */
      }
    many_case(SERVD_Q4_1, SERVD_Q8_0, 2, 3); /* different activation layouts: one by one */
    many_case(SERVD_BF16, SERVD_F32, 2, 2);
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  servd_tensor *x = rand_f32(2, 64), *o = servd_tensor_new(SERVD_F32, 2, (int64_t[]){2, 4});
  servd_tensor *w = servd_tensor_new(SERVD_F32, 2, (int64_t[]){4, 64}),
               *wbad = servd_tensor_new(SERVD_F32, 2, (int64_t[]){5, 64});
  servd_tensor *outs[5] = {o, o, o, o, o};
  const servd_tensor *ws[5] = {w, w, w, w, w};
  assert_int_equal(servd_matmul_many(0, outs, x, ws), SERVD_EINVAL);
  assert_int_equal(servd_matmul_many(5, outs, x, ws), SERVD_EINVAL);
  ws[1] = wbad;
  assert_int_equal(servd_matmul_many(2, outs, x, ws), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "weight 1"));
  servd_tensor_release(x), servd_tensor_release(o), servd_tensor_release(w), servd_tensor_release(wbad);
}

static void test_force_isa(void **state) {
  (void)state;
  servd_isa best = servd_cpu_best_isa();
  assert_int_equal(servd_cpu_force_isa(SERVD_ISA_SCALAR), 0);
  assert_int_equal(servd_cpu_active_isa(), SERVD_ISA_SCALAR);
  if (best < SERVD_ISA_AVX512) assert_int_equal(servd_cpu_force_isa(SERVD_ISA_AVX512), SERVD_EUNSUPPORTED);
  assert_int_equal(servd_cpu_force_isa(SERVD_ISA_COUNT), 0);
  assert_int_equal(servd_cpu_active_isa(), best);
  print_message("best ISA: %s\n", servd_isa_name(best));
}

int main(void) {
  servd_threadpool_init(2);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_force_isa),
      cmocka_unit_test(test_float_shapes),
      cmocka_unit_test(test_quant_shapes),
      cmocka_unit_test(test_strided_views),
      cmocka_unit_test(test_empty),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_concurrent_callers),
      cmocka_unit_test(test_nonfinite_x),
      cmocka_unit_test(test_matmul_many),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  servd_threadpool_shutdown();
  return rc;
}
