/* servd_geglu against a float64 scalar reference of gelu_tanh(g) * u (transformers'
 * gelu_pytorch_tanh), over values spanning the tails and the bend, in place, on a strided view; every
 * ISA path against float64 within its stated bound and against the scalar path; plus the refused
 * arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "servd/ops.h"

static double ref(double g, double u) {
  return 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
}

static servd_tensor *f32(int64_t r, int64_t c) {
  const int64_t s[2] = {r, c};
  servd_tensor *t = servd_tensor_new(SERVD_F32, 2, s);
  assert_non_null(t);
  return t;
}

static void check_close(const float *got, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double want = ref(g[i], u[i]);
    if (fabs(got[i] - want) > 2e-6 * (1.0 + fabs(want)))
      fail_msg("geglu(%.9g, %.9g) = %.9g, expected %.9g", g[i], u[i], got[i], want);
  }
}

static void test_against_reference(void **state) {
  (void)state;
  enum { R = 37, C = 301 };
  servd_tensor *out = f32(R, C), *g = f32(R, C), *u = f32(R, C);
  float *pg = servd_tensor_data(g), *pu = servd_tensor_data(u), *po = servd_tensor_data(out);
  srand(7);
  for (int i = 0; i < R * C; i++) {
    pg[i] = (float)(i % 401 - 200) / 20.0f; /* -10 .. 10: both tails and the bend */
    pu[i] = (float)(rand() % 2001 - 1000) / 250.0f;
  }
  assert_int_equal(servd_geglu(out, g, u), 0);
  check_close(po, pg, pu, (int64_t)R * C);
  /* by hand: gelu_tanh(0) = 0, gelu_tanh(1) = 0.841191990..., large negatives vanish */
  float hg[3] = {0.0f, 1.0f, -30.0f}, hu[3] = {5.0f, 2.0f, 1.0f};
  for (int i = 0; i < 3; i++) pg[i] = hg[i], pu[i] = hu[i];
  assert_int_equal(servd_geglu(out, g, u), 0);
  assert_true(po[0] == 0.0f && fabsf(po[1] - 1.68238398f) < 1e-6f && fabsf(po[2]) < 1e-12f);

  /* in place over gate; then a strided view (every other row) */
  float keep[C];
  for (int i = 0; i < C; i++) keep[i] = pg[C + i];
  assert_int_equal(servd_geglu(g, g, u), 0);
  check_close(pg + C, keep, pu + C, C);
  servd_tensor *big = f32(2 * R, C), *vo = f32(R, C);
  float *pb = servd_tensor_data(big);
  for (int i = 0; i < 2 * R * C; i++) pb[i] = (float)(i % 97 - 48) / 9.0f;
  servd_tensor *rows = servd_tensor_view(big, 0, 2, (const int64_t[]){R, C}, (const int64_t[]){2 * C * 4, 4});
  assert_non_null(rows);
  assert_int_equal(servd_geglu(vo, rows, rows), 0);
  for (int r = 0; r < R; r++) check_close((float *)servd_tensor_data(vo) + r * C, pb + 2 * r * C, pb + 2 * r * C, C);
  servd_tensor_release(rows);
  servd_tensor_release(big);
  servd_tensor_release(vo);
  servd_tensor_release(out);
  servd_tensor_release(g);
  servd_tensor_release(u);
}

/* The SIMD kernels' bound (kernels/src/geglu_avx2.c): relative (4 + 2|z|) * 2^-23 with
 * z = sqrt(2/pi) (g + 0.044715 g^3), plus |g u| * 1e-37 where exp's clamp flushes a vanishing result. */
static double simd_bound(double g, double u, double want) {
  double z = sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
  return (4.0 + 2.0 * fabs(z)) * ldexp(1.0, -23) * fabs(want) + 1e-37 * fabs(g * u);
}

/* 0.5 g (1 + tanh z) = g / (1 + exp(-2z)): the same value without 1 + tanh z's cancellation, which
 * leaves even float64 at 0 for g below -9. */
static double ref_exact(double g, double u) {
  return g / (1.0 + exp(-2.0 * sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
}

static void test_every_isa(void **state) {
  (void)state;
  enum { N = 4099 }; /* not a multiple of 8 or 16: the masked tails run */
  servd_tensor *out = f32(1, N), *g = f32(1, N), *u = f32(1, N), *scalar = f32(1, N);
  float *pg = servd_tensor_data(g), *pu = servd_tensor_data(u), *po = servd_tensor_data(out);
  float *ps = servd_tensor_data(scalar);
  srand(11);
  for (int i = 0; i < N; i++) {
    pg[i] = i < 2400 ? (float)(i - 1200) / 100.0f : (float)((rand() % 200001) - 100000) / 4000.0f; /* +-12, +-25 */
    pu[i] = (float)(rand() % 2001 - 1000) / 250.0f;
  }
  pg[0] = 0.0f, pg[1] = -0.0f, pg[2] = 1e-30f, pg[3] = -100.0f, pg[4] = 100.0f;
  assert_int_equal(servd_cpu_force_isa(SERVD_ISA_SCALAR), 0);
  assert_int_equal(servd_geglu(scalar, g, u), 0);
  for (int isa = 1; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    assert_int_equal(servd_geglu(out, g, u), 0);
    double worst_ulp = 0;
    for (int i = 0; i < N; i++) {
      double want = ref_exact(pg[i], pu[i]);
      if (!isfinite(po[i]) || fabs(po[i] - want) > simd_bound(pg[i], pu[i], want))
        fail_msg("geglu isa %d: (%.9g, %.9g) = %.9g, float64 %.9g", isa, pg[i], pu[i], po[i], want);
      /* where the scalar tanh form is accurate (no cancellation in 1 + tanh), the two paths agree */
      if (fabs(pg[i]) <= 2.0f && fabsf(po[i] - ps[i]) > 4e-6f * fabsf(ps[i]) + 1e-30f)
        fail_msg("geglu isa %d: (%.9g, %.9g) = %.9g, scalar %.9g", isa, pg[i], pu[i], po[i], ps[i]);
      if (fabs(pg[i]) <= 4.0f && want != 0.0)
        worst_ulp = fmax(worst_ulp, fabs(po[i] - want) / ldexp(1.0, ilogb(want) - 23));
    }
    print_message("geglu isa %d: worst error %.2f ulp for |g| <= 4\n", isa, worst_ulp);
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
  servd_tensor_release(out);
  servd_tensor_release(g);
  servd_tensor_release(u);
  servd_tensor_release(scalar);
}

static void test_refusals(void **state) {
  (void)state;
  servd_tensor *a = f32(2, 8), *b = f32(2, 9);
  const int64_t s[2] = {2, 8};
  servd_tensor *h = servd_tensor_new(SERVD_BF16, 2, s);
  assert_int_equal(servd_geglu(a, a, b), SERVD_EINVAL); /* shapes differ */
  assert_int_equal(servd_geglu(a, h, a), SERVD_EINVAL); /* dtypes differ */
  assert_int_equal(servd_geglu(NULL, a, a), SERVD_EINVAL);
  assert_int_equal(servd_geglu(a, a, a), 0);
  /* bf16 (the device's dtype): f32 inside, rounded once: gelu_tanh(1) * 2 = 1.68238... -> bf16 1.6796875 */
  uint16_t *ph = servd_tensor_data(h);
  for (int i = 0; i < 16; i++) ph[i] = servd_f32_to_bf16(i % 2 ? 2.0f : 1.0f);
  servd_tensor *h2 = servd_tensor_new(SERVD_BF16, 2, s);
  uint16_t *ph2 = servd_tensor_data(h2);
  for (int i = 0; i < 16; i++) ph2[i] = servd_f32_to_bf16(2.0f);
  assert_int_equal(servd_geglu(h2, h, h2), 0);
  assert_true(servd_bf16_to_f32(ph2[0]) == servd_bf16_to_f32(servd_f32_to_bf16(1.68238398f)));
  assert_true(fabsf(servd_bf16_to_f32(ph2[1]) - (float)ref(2.0, 2.0)) < 0.02f);
  servd_tensor_release(h2);
  servd_tensor_release(a);
  servd_tensor_release(b);
  servd_tensor_release(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_reference), cmocka_unit_test(test_every_isa),
                                     cmocka_unit_test(test_refusals)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
