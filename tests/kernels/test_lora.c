/* servd_lora against a float64 reference of out + scale * (x A^T) B^T, on every ISA this CPU runs
 * (scalar, AVX2, AVX-512 where present), f32 and f16 adapters, odd shapes (tails), both thread
 * splits; a row's bits equal in any batch (a mixed batch's rows match each row alone); refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/ops.h"
#include "servd/threadpool.h"

static servd_tensor *mk(servd_dtype t, int64_t r, int64_t c) {
  const int64_t s[2] = {r, c};
  servd_tensor *x = servd_tensor_new(t, 2, s);
  assert_non_null(x);
  return x;
}

static float frand(void) { return (float)(rand() % 20001 - 10000) / 10000.0f; }

/* ab (r, k+n) from A (r,k) and B (n,r) as float64 of the stored values */
static double ab_get(const servd_tensor *ab, int64_t i) {
  if (ab->dtype == SERVD_F16) return servd_f16_to_f32(((const uint16_t *)servd_tensor_data(ab))[i]);
  return ((const float *)servd_tensor_data(ab))[i];
}

static void fill_ab(servd_tensor *ab) {
  int64_t n = servd_tensor_numel(ab);
  for (int64_t i = 0; i < n; i++) {
    float v = frand() * 0.5f;
    if (ab->dtype == SERVD_F16) ((uint16_t *)servd_tensor_data(ab))[i] = servd_f32_to_f16(v);
    else ((float *)servd_tensor_data(ab))[i] = v;
  }
}

/* Checks out (m,n) = out0 + scale * (x A^T) B^T within f32 accumulation bounds. */
static void check_ref(const float *got, const float *out0, const float *x, const servd_tensor *ab, int64_t m, int64_t n,
                      int64_t k, float scale, const char *what) {
  int64_t r = ab->shape[0], ld = ab->shape[1];
  double *t = malloc(sizeof(double) * (size_t)r * 2);
  for (int64_t i = 0; i < m; i++) {
    for (int64_t j = 0; j < r; j++) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < k; c++) {
        s += (double)x[i * k + c] * ab_get(ab, j * ld + c);
        a += fabs((double)x[i * k + c] * ab_get(ab, j * ld + c));
      }
      t[2 * j] = s, t[2 * j + 1] = a;
    }
    for (int64_t c = 0; c < n; c++) {
      double want = out0[i * n + c], mag = fabs(want);
      for (int64_t j = 0; j < r; j++) {
        double b = ab_get(ab, j * ld + k + c);
        want += scale * t[2 * j] * b;
        mag += fabs(scale * b) * (t[2 * j + 1] + fabs(t[2 * j]));
      }
      double bound = (double)(k + r + 4) * ldexp(1.0, -23) * mag + 1e-30;
      if (!(fabs(got[i * n + c] - want) <= bound))
        fail_msg("lora %s: row %lld col %lld = %.9g, float64 %.9g (bound %.3g)", what, (long long)i, (long long)c,
                 got[i * n + c], want, bound);
    }
  }
  free(t);
}

static void run_case(int64_t m, int64_t k, int64_t n, int64_t r, servd_dtype abt, float scale) {
  servd_tensor *x = mk(SERVD_F32, m, k), *out = mk(SERVD_F32, m, n), *ab = mk(abt, r, k + n);
  float *px = servd_tensor_data(x), *po = servd_tensor_data(out);
  float *out0 = malloc(sizeof(float) * (size_t)(m * n)), *scalar = malloc(sizeof(float) * (size_t)(m * n));
  for (int64_t i = 0; i < m * k; i++) px[i] = frand();
  for (int64_t i = 0; i < m * n; i++) out0[i] = frand() * 3.0f;
  fill_ab(ab);
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    memcpy(po, out0, sizeof(float) * (size_t)(m * n));
    assert_int_equal(servd_lora(out, x, ab, scale), 0);
    char what[64];
    snprintf(what, sizeof what, "%s %s m%lld r%lld", servd_isa_name((servd_isa)isa), servd_dtype_name(abt),
             (long long)m, (long long)r);
    check_ref(po, out0, px, ab, m, n, k, scale, what);
    if (isa == 0) memcpy(scalar, po, sizeof(float) * (size_t)(m * n));
    /* every row alone gives the bits it had in the batch (so a mixed batch's row equals the row alone) */
    for (int64_t i = 0; i < m; i += (m > 8 ? 7 : 1)) {
      servd_tensor *xi = servd_tensor_narrow(x, 0, i, 1), *oi = servd_tensor_narrow(out, 0, i, 1);
      memcpy(po + i * n, out0 + i * n, sizeof(float) * (size_t)n);
      float keep[4096];
      assert_true(n <= 4096);
      assert_int_equal(servd_lora(oi, xi, ab, scale), 0);
      memcpy(keep, po + i * n, sizeof(float) * (size_t)n);
      servd_tensor_release(xi);
      servd_tensor_release(oi);
      memcpy(po, out0, sizeof(float) * (size_t)(m * n));
      assert_int_equal(servd_lora(out, x, ab, scale), 0);
      if (memcmp(keep, po + i * n, sizeof(float) * (size_t)n) != 0)
        fail_msg("lora %s: row %lld alone differs from the same row in the batch", what, (long long)i);
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  free(out0);
  free(scalar);
  servd_tensor_release(x);
  servd_tensor_release(out);
  servd_tensor_release(ab);
}

static void test_against_float64(void **state) {
  (void)state;
  srand(31);
  /* decode rows (column split), a prefill-sized batch (row split), tails everywhere, ranks 1..64 */
  run_case(1, 576, 1536, 16, SERVD_F32, 2.0f);
  run_case(3, 1536, 576, 16, SERVD_F16, 0.5f);
  run_case(37, 203, 301, 7, SERVD_F32, 1.25f);
  run_case(40, 576, 192, 64, SERVD_F16, 0.125f);
  run_case(2, 9, 5, 1, SERVD_F32, -1.0f);
  run_case(1, 64, 64, 64, SERVD_F32, 0.0f);
  run_case(4, 1536, 1536, 64, SERVD_F16, 0.75f); /* few rows, much work: B's columns split */
}

/* Segments of three adapters (ranks 8, 16, 4) and rows without one, in one call, decode-sized and
 * prefill-sized: every row has the bits servd_lora gives that row alone with its adapter; rows
 * without one are untouched. */
static void sgmv_case(int64_t per_seg) {
  enum { K = 576, N = 640 };
  const int64_t ranks[3] = {8, 16, 4};
  servd_tensor *ab[3];
  for (int i = 0; i < 3; i++) fill_ab(ab[i] = mk(i == 1 ? SERVD_F16 : SERVD_F32, ranks[i], K + N));
  int64_t m = 5 * per_seg;
  servd_tensor *x = mk(SERVD_F32, m, K), *out = mk(SERVD_F32, m, N), *one = mk(SERVD_F32, 1, N);
  float *px = servd_tensor_data(x), *po = servd_tensor_data(out), *p1 = servd_tensor_data(one);
  float *out0 = malloc(sizeof(float) * (size_t)(m * N));
  for (int64_t i = 0; i < m * K; i++) px[i] = frand();
  for (int64_t i = 0; i < m * N; i++) out0[i] = po[i] = frand();
  /* segments: adapter 0, none, adapter 1, adapter 0 again, adapter 2 */
  const int which[5] = {0, -1, 1, 0, 2};
  const float scales[3] = {2.0f, 0.5f, 4.0f};
  servd_lora_seg segs[5];
  for (int s = 0; s < 5; s++)
    segs[s] = (servd_lora_seg){s * per_seg, per_seg, which[s] < 0 ? NULL : ab[which[s]],
                               which[s] < 0 ? 0.0f : scales[which[s]]};
  assert_int_equal(servd_lora_sgmv(out, x, 5, segs), 0);
  for (int64_t i = 0; i < m; i++) {
    int s = (int)(i / per_seg);
    memcpy(p1, out0 + i * N, sizeof(float) * N);
    if (which[s] >= 0) {
      servd_tensor *xi = servd_tensor_narrow(x, 0, i, 1);
      assert_int_equal(servd_lora(one, xi, ab[which[s]], scales[which[s]]), 0);
      servd_tensor_release(xi);
    }
    if (memcmp(p1, po + i * N, sizeof(float) * N) != 0)
      fail_msg("lora_sgmv: row %lld (segment %d) differs from the row alone", (long long)i, s);
  }
  /* out of order, overlapping or past the end: refused */
  servd_lora_seg bad[2] = {{2, 2, ab[0], 1.0f}, {1, 1, ab[0], 1.0f}};
  assert_int_equal(servd_lora_sgmv(out, x, 2, bad), SERVD_EINVAL);
  bad[0] = (servd_lora_seg){m - 1, 2, ab[0], 1.0f};
  assert_int_equal(servd_lora_sgmv(out, x, 1, bad), SERVD_EINVAL);
  free(out0);
  for (int i = 0; i < 3; i++) servd_tensor_release(ab[i]);
  servd_tensor_release(x);
  servd_tensor_release(out);
  servd_tensor_release(one);
}

static void test_sgmv(void **state) {
  (void)state;
  srand(5);
  sgmv_case(1);  /* decode rows: B's columns split */
  sgmv_case(13); /* prefill chunks: rows split */
}

static void test_refusals(void **state) {
  (void)state;
  servd_tensor *x = mk(SERVD_F32, 2, 8), *out = mk(SERVD_F32, 2, 4), *ab = mk(SERVD_F32, 3, 12);
  servd_tensor *bad_ab = mk(SERVD_F32, 3, 11), *big = mk(SERVD_F32, 65, 12), *bf = mk(SERVD_BF16, 3, 12);
  servd_tensor *x2 = mk(SERVD_F32, 3, 8), *sq = mk(SERVD_F32, 2, 8), *sqab = mk(SERVD_F32, 2, 16);
  memset(servd_tensor_data(ab), 0, 3 * 12 * 4);
  assert_int_equal(servd_lora(out, x, ab, 1.0f), 0);
  assert_int_equal(servd_lora(out, x, bad_ab, 1.0f), SERVD_EINVAL); /* k + n != ab columns */
  assert_int_equal(servd_lora(out, x, big, 1.0f), SERVD_EINVAL);    /* rank above 64 */
  assert_int_equal(servd_lora(out, x, bf, 1.0f), SERVD_EINVAL);     /* adapter dtype */
  assert_int_equal(servd_lora(out, x2, ab, 1.0f), SERVD_EINVAL);    /* rows differ */
  assert_int_equal(servd_lora(out, x, ab, NAN), SERVD_EINVAL);
  assert_int_equal(servd_lora(sq, sq, sqab, 1.0f), SERVD_EINVAL); /* out aliases x */
  assert_int_equal(servd_lora(NULL, x, ab, 1.0f), SERVD_EINVAL);
  servd_tensor *ts[] = {x, out, ab, bad_ab, big, bf, x2, sq, sqab};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) servd_tensor_release(ts[i]);
}

int main(void) {
  servd_threadpool_init(2);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_float64), cmocka_unit_test(test_sgmv),
                                     cmocka_unit_test(test_refusals)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  servd_threadpool_shutdown();
  return rc;
}
