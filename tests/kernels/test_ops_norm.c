/* rmsnorm: every ISA path and weight dtype against a double-precision reference. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

#define TEST_RNG_SEED 777u
#include "test-util.h"

static const int64_t shapes[][2] = {{1, 1}, {1, 7}, {3, 15}, {2, 16}, {5, 17}, {4, 33}, {2, 576}, {1, 4097}, {0, 8}};

static void test_rmsnorm(void **state) {
  (void)state;
  const servd_dtype wts[] = {SERVD_F32, SERVD_F16, SERVD_BF16};
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      for (int w = 0; w < 3; w++) {
        int64_t m = shapes[s][0], d = shapes[s][1];
        servd_tensor *x = tnew(SERVD_F32, 2, m, d), *o = tnew(SERVD_F32, 2, m, d);
        servd_tensor *wt = tnew(wts[w], 1, d, 0);
        double *wv = test_malloc((size_t)d * sizeof(double));
        for (int64_t i = 0; i < m * d; i++) f(x)[i] = frand(-4, 4);
        for (int64_t i = 0; i < d; i++) {
          float v = frand(0.5f, 2.0f);
          if (wts[w] == SERVD_F32) {
            f(wt)[i] = v;
            wv[i] = v;
          } else if (wts[w] == SERVD_F16) {
            ((uint16_t *)servd_tensor_data(wt))[i] = servd_f32_to_f16(v);
            wv[i] = servd_f16_to_f32(servd_f32_to_f16(v));
          } else {
            ((uint16_t *)servd_tensor_data(wt))[i] = servd_f32_to_bf16(v);
            wv[i] = servd_bf16_to_f32(servd_f32_to_bf16(v));
          }
        }
        const float eps = 1e-5f;
        assert_int_equal(servd_rmsnorm(o, x, wt, eps), 0);
        for (int64_t r = 0; r < m; r++) {
          double ss = 0;
          for (int64_t i = 0; i < d; i++) ss += (double)f(x)[r * d + i] * f(x)[r * d + i];
          double inv = 1.0 / sqrt(ss / (double)d + eps);
          for (int64_t i = 0; i < d; i++) {
            double ref = f(x)[r * d + i] * inv * wv[i];
            /* f32 sum of squares in 16-32 partial sums: relative error ~ (d/16) * 6e-8 <= 2e-5 for
             * d = 4097 (bound; typically far less), halved by the sqrt, plus three f32 roundings. */
            if (fabs(f(o)[r * d + i] - ref) > 2e-5 * fabs(ref) + 1e-7)
              fail_msg("rmsnorm isa %d w %d (%lld,%lld) [%lld,%lld]: %.9g vs %.9g", isa, w, (long long)m, (long long)d,
                       (long long)r, (long long)i, (double)f(o)[r * d + i], ref);
          }
        }
        /* in place */
        float *want = test_malloc((size_t)(m * d + 1) * sizeof(float));
        memcpy(want, f(o), (size_t)(m * d) * sizeof(float));
        assert_int_equal(servd_rmsnorm(x, x, wt, eps), 0);
        assert_memory_equal(f(x), want, (size_t)(m * d) * sizeof(float));
        test_free(want);
        test_free(wv);
        servd_tensor_release(x);
        servd_tensor_release(o);
        servd_tensor_release(wt);
      }
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

static void test_hand_values(void **state) {
  (void)state;
  /* x = (3, 4): mean square 12.5, 1/sqrt(12.5) = 0.28284271; weight (1, 2) */
  servd_tensor *x = tnew(SERVD_F32, 2, 1, 2), *w = tnew(SERVD_F32, 1, 2, 0);
  f(x)[0] = 3;
  f(x)[1] = 4;
  f(w)[0] = 1;
  f(w)[1] = 2;
  assert_int_equal(servd_rmsnorm(x, x, w, 0.0f), 0);
  assert_float_equal(f(x)[0], 0.84852814f, 1e-6);
  assert_float_equal(f(x)[1], 2.26274170f, 1e-6);
  servd_tensor_release(x);
  servd_tensor_release(w);
}

static void test_bad_input(void **state) {
  (void)state;
  servd_tensor *x = tnew(SERVD_F32, 2, 2, 8), *w = tnew(SERVD_F32, 1, 7, 0), *wi = tnew(SERVD_I32, 1, 8, 0);
  assert_int_equal(servd_rmsnorm(x, x, w, 1e-5f), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "rmsnorm"));
  assert_non_null(strstr(servd_last_error(), "f32[7]"));
  assert_int_equal(servd_rmsnorm(x, x, wi, 1e-5f), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "i32[8]"));
  assert_int_equal(servd_rmsnorm(x, x, NULL, 1e-5f), SERVD_EINVAL);
  servd_tensor_release(x);
  servd_tensor_release(w);
  servd_tensor_release(wi);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_hand_values),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
