/* swiglu and add: every ISA path against a double-precision reference, on awkward shapes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

#define TEST_RNG_SEED 12345u
#include "test-util.h"

static servd_tensor *mat(int64_t m, int64_t n) {
  int64_t shape[2] = {m, n};
  servd_tensor *t = servd_tensor_new(SERVD_F32, 2, shape);
  assert_non_null(t);
  return t;
}

static const int64_t shapes[][2] = {{1, 1},  {1, 7},   {3, 15}, {2, 16}, {5, 17},
                                    {4, 33}, {2, 100}, {0, 8},  {3, 0},  {1, 4099}};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static void test_add(void **state) {
  (void)state;
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (size_t s = 0; s < N_SHAPES; s++) {
      int64_t m = shapes[s][0], n = shapes[s][1];
      servd_tensor *a = mat(m, n), *b = mat(m, n), *o = mat(m, n);
      for (int64_t i = 0; i < m * n; i++) {
        f(a)[i] = frand(-10, 10);
        f(b)[i] = frand(-10, 10);
      }
      assert_int_equal(servd_add(o, a, b), 0);
      /* one rounding of a+b in every path: exact */
      for (int64_t i = 0; i < m * n; i++) assert_true(f(o)[i] == f(a)[i] + f(b)[i]);
      /* in place: out aliases a */
      float *copy = test_malloc((size_t)(m * n + 1) * sizeof(float));
      memcpy(copy, f(a), (size_t)(m * n) * sizeof(float));
      assert_int_equal(servd_add(a, a, b), 0);
      for (int64_t i = 0; i < m * n; i++) assert_true(f(a)[i] == copy[i] + f(b)[i]);
      test_free(copy);
      servd_tensor_release(a);
      servd_tensor_release(b);
      servd_tensor_release(o);
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

static void test_swiglu(void **state) {
  (void)state;
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (size_t s = 0; s < N_SHAPES; s++) {
      int64_t m = shapes[s][0], n = shapes[s][1];
      servd_tensor *g = mat(m, n), *u = mat(m, n), *o = mat(m, n);
      for (int64_t i = 0; i < m * n; i++) {
        f(g)[i] = frand(-20, 20);
        f(u)[i] = frand(-3, 3);
      }
      if (m * n >= 6) { /* saturating gates: exp overflows / flushes */
        f(g)[0] = -100.0f;
        f(g)[1] = 100.0f;
        f(g)[2] = 0.0f;
        f(g)[3] = -87.5f;
        f(g)[4] = 88.5f;
      }
      assert_int_equal(servd_swiglu(o, g, u), 0);
      for (int64_t i = 0; i < m * n; i++) {
        double x = f(g)[i], ref = x / (1.0 + exp(-x)) * f(u)[i];
        /* f32 silu through a ~2 ulp vector exp, one division and one product: 1e-6 relative
         * (about 8 ulp) covers it; the absolute 1e-30 covers gates below -87 whose silu is ~0. */
        double tol = 1e-6 * fabs(ref) + 1e-30;
        if (fabs(f(o)[i] - ref) > tol)
          fail_msg("swiglu isa %d shape (%lld,%lld) i %lld: g %g u %g got %.9g want %.9g", isa, (long long)m,
                   (long long)n, (long long)i, x, (double)f(u)[i], (double)f(o)[i], ref);
      }
      assert_int_equal(servd_swiglu(g, g, u), 0); /* out aliases gate */
      for (int64_t i = 0; i < m * n; i++) assert_true(f(g)[i] == f(o)[i]);
      servd_tensor_release(g);
      servd_tensor_release(u);
      servd_tensor_release(o);
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

static void test_row_views(void **state) {
  (void)state;
  /* out rows with a stride: a column slice of a wider tensor */
  servd_tensor *wide = mat(3, 40), *a = mat(3, 20), *b = mat(3, 20);
  for (int i = 0; i < 60; i++) {
    f(a)[i] = (float)i;
    f(b)[i] = 1000.0f;
  }
  servd_tensor *o = servd_tensor_narrow(wide, 1, 10, 20);
  assert_non_null(o);
  assert_int_equal(servd_add(o, a, b), 0);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 40; c++)
      assert_true(f(wide)[r * 40 + c] == (c >= 10 && c < 30 ? 1000.0f + (float)(r * 20 + c - 10) : 0.0f));
  servd_tensor_release(o);
  servd_tensor_release(wide);
  servd_tensor_release(a);
  servd_tensor_release(b);
}

static void test_bad_input(void **state) {
  (void)state;
  servd_tensor *a = mat(2, 3), *b = mat(3, 2);
  int64_t sh[2] = {2, 3};
  servd_tensor *h = servd_tensor_new(SERVD_F16, 2, sh);
  assert_int_equal(servd_add(a, a, b), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "add"));
  assert_non_null(strstr(servd_last_error(), "f32[3,2]"));
  assert_int_equal(servd_swiglu(a, a, h), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "swiglu"));
  assert_non_null(strstr(servd_last_error(), "f16[2,3]"));
  assert_int_equal(servd_add(NULL, a, a), SERVD_EINVAL);
  servd_tensor_release(a);
  servd_tensor_release(b);
  servd_tensor_release(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_add),
      cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_row_views),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
