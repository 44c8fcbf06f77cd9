/* Scaled softmax, argmax and topk against references computed here. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

#define TEST_RNG_SEED 4242u
#include "test-util.h"

static int32_t *iv(const servd_tensor *t) { return servd_tensor_data(t); }

static const int64_t shapes[][2] = {{1, 1}, {1, 7}, {3, 15}, {2, 16}, {5, 17}, {4, 33}, {2, 1000}, {0, 8}, {3, 0}};

static void test_softmax(void **state) {
  (void)state;
  const float scales[] = {1.0f, 0.125f, 3.0f, -0.5f};
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      for (int k = 0; k < 4; k++) {
        int64_t m = shapes[s][0], n = shapes[s][1];
        servd_tensor *x = tnew(SERVD_F32, 2, m, n);
        float *in = test_malloc((size_t)(m * n + 1) * sizeof(float));
        for (int64_t i = 0; i < m * n; i++) in[i] = f(x)[i] = frand(-30, 30);
        bool masked = m * n > 3 && scales[k] > 0;
        if (masked) f(x)[1] = in[1] = -INFINITY; /* a masked entry gives exactly 0 */
        assert_int_equal(servd_softmax(x, scales[k]), 0);
        if (masked) assert_true(f(x)[1] == 0.0f);
        for (int64_t i = 0; i < m * n; i++) assert_false(isnan(f(x)[i]));
        for (int64_t r = 0; r < m; r++) {
          double mx = -INFINITY, sum = 0;
          for (int64_t i = 0; i < n; i++) mx = fmax(mx, (double)in[r * n + i] * scales[k]);
          for (int64_t i = 0; i < n; i++) sum += exp((double)in[r * n + i] * scales[k] - mx);
          for (int64_t i = 0; i < n; i++) {
            double ref = exp((double)in[r * n + i] * scales[k] - mx) / sum;
            /* each value is an f32 exp (~2 ulp) of an argument rounded once (x*scale - max, which
             * for |x*scale| <= 90 is off by <= 1e-5 absolute, i.e. 1e-5 relative after exp), times
             * 1/sum: 2e-5 relative; the absolute term covers values flushed below 1e-37. */
            if (fabs(f(x)[r * n + i] - ref) > 2e-5 * ref + 1e-37)
              fail_msg("softmax isa %d (%lld,%lld) scale %g [%lld,%lld]: %.9g vs %.9g", isa, (long long)m, (long long)n,
                       (double)scales[k], (long long)r, (long long)i, (double)f(x)[r * n + i], ref);
          }
        }
        test_free(in);
        servd_tensor_release(x);
      }
    }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

static void test_argmax(void **state) {
  (void)state;
  servd_tensor *x = tnew(SERVD_F32, 2, 4, 6), *o = tnew(SERVD_I32, 1, 4, 0);
  const float v[4][6] = {{1, 5, 5, 2, 0, -1},           /* tie: lowest index */
                         {NAN, -3, -2, NAN, -2.5f, -7}, /* NaN never wins */
                         {-INFINITY, -INFINITY, -INFINITY, 0, 0, 9},
                         {NAN, NAN, NAN, NAN, NAN, NAN}}; /* all NaN: index 0 */
  memcpy(f(x), v, sizeof v);
  assert_int_equal(servd_argmax(o, x), 0);
  assert_int_equal(iv(o)[0], 1);
  assert_int_equal(iv(o)[1], 2);
  assert_int_equal(iv(o)[2], 5);
  assert_int_equal(iv(o)[3], 0);
  /* a big row: against a plain scan */
  servd_tensor *big = tnew(SERVD_F32, 2, 3, 49152), *bo = tnew(SERVD_I32, 1, 3, 0);
  for (int64_t i = 0; i < 3 * 49152; i++) f(big)[i] = frand(-10, 10);
  assert_int_equal(servd_argmax(bo, big), 0);
  for (int r = 0; r < 3; r++) {
    int best = 0;
    for (int i = 1; i < 49152; i++)
      if (f(big)[r * 49152 + i] > f(big)[r * 49152 + best]) best = i;
    assert_int_equal(iv(bo)[r], best);
  }
  servd_tensor_release(x);
  servd_tensor_release(o);
  servd_tensor_release(big);
  servd_tensor_release(bo);
}

static int cmp_desc(const void *a, const void *b) { /* (value, index) pairs: value desc, index asc */
  const float *x = a, *y = b;
  if (x[0] != y[0]) return x[0] > y[0] ? -1 : 1;
  return x[1] < y[1] ? -1 : x[1] > y[1];
}

static void test_topk(void **state) {
  (void)state;
  const int64_t n = 1000;
  const int ks[] = {1, 3, 50, 1000};
  for (int kk = 0; kk < 4; kk++) {
    int k = ks[kk];
    servd_tensor *x = tnew(SERVD_F32, 2, 3, n), *v = tnew(SERVD_F32, 2, 3, k), *ix = tnew(SERVD_I32, 2, 3, k);
    for (int64_t i = 0; i < 3 * n; i++) f(x)[i] = (float)(int)frand(-40, 40); /* many ties */
    assert_int_equal(servd_topk(v, ix, x, k), 0);
    float *pairs = test_malloc((size_t)n * 2 * sizeof(float));
    for (int r = 0; r < 3; r++) {
      for (int64_t i = 0; i < n; i++) {
        pairs[2 * i] = f(x)[r * n + i];
        pairs[2 * i + 1] = (float)i;
      }
      qsort(pairs, (size_t)n, 2 * sizeof(float), cmp_desc);
      for (int i = 0; i < k; i++) {
        assert_true(f(v)[r * k + i] == pairs[2 * i]);
        assert_int_equal(iv(ix)[r * k + i], (int)pairs[2 * i + 1]);
      }
    }
    test_free(pairs);
    servd_tensor_release(x);
    servd_tensor_release(v);
    servd_tensor_release(ix);
  }
}

static void test_bad_input(void **state) {
  (void)state;
  servd_tensor *x = tnew(SERVD_F32, 2, 2, 8), *o = tnew(SERVD_I32, 1, 3, 0), *v = tnew(SERVD_F32, 2, 2, 9),
               *ix = tnew(SERVD_I32, 2, 2, 9), *h = tnew(SERVD_F16, 2, 2, 8);
  assert_int_equal(servd_argmax(o, x), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "argmax"));
  assert_non_null(strstr(servd_last_error(), "i32[3]"));
  assert_int_equal(servd_topk(v, ix, x, 9), SERVD_EINVAL); /* k > n */
  assert_non_null(strstr(servd_last_error(), "topk"));
  assert_non_null(strstr(servd_last_error(), "k 9"));
  assert_int_equal(servd_topk(v, ix, x, 0), SERVD_EINVAL);
  assert_int_equal(servd_softmax(h, 1.0f), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "softmax"));
  assert_non_null(strstr(servd_last_error(), "f16[2,8]"));
  assert_int_equal(servd_softmax(x, NAN), SERVD_EINVAL);
  servd_tensor_release(x);
  servd_tensor_release(o);
  servd_tensor_release(v);
  servd_tensor_release(ix);
  servd_tensor_release(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_argmax),
      cmocka_unit_test(test_topk),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
