/* servd_gate_up_swiglu (servd/fused.h) against its parts, matmul_many then swiglu: bit for bit on
 * every ISA, weight dtype and decode-sized row count, with the pool's 2 threads; and a float64
 * SiLU(x wg^T) * (x wu^T) on f32 weights, which keeps the parts themselves honest. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "servd/fused.h"
#include "servd/threadpool.h"

#define TEST_RNG_SEED 777u
#include "test-util.h"

static servd_tensor *weight(servd_dtype dt, int64_t n, int64_t k) {
  servd_tensor *w = tnew(dt, 2, n, k);
  float *row = malloc(sizeof(float) * (size_t)k);
  assert_non_null(row);
  for (int64_t r = 0; r < n; r++) {
    for (int64_t i = 0; i < k; i++) row[i] = frand(-0.5f, 0.5f);
    assert_int_equal(servd_row_from_f32(dt, row, (char *)servd_tensor_data(w) + r * w->strides[0], k), 0);
  }
  free(row);
  return w;
}

static void check_same(servd_dtype dt, int64_t m, int64_t n, int64_t k) {
  servd_tensor *x = tnew(SERVD_F32, 2, m, k), *wg = weight(dt, n, k), *wu = weight(dt, n, k);
  for (int64_t i = 0; i < m * k; i++) f(x)[i] = frand(-2.0f, 2.0f);
  servd_tensor *g = tnew(SERVD_F32, 2, m, n), *u = tnew(SERVD_F32, 2, m, n);
  servd_tensor *g0 = tnew(SERVD_F32, 2, m, n), *u0 = tnew(SERVD_F32, 2, m, n);
  servd_tensor *outs[2] = {g0, u0};
  const servd_tensor *ws[2] = {wg, wu};
  assert_int_equal(servd_matmul_many(2, outs, x, ws), 0);
  assert_int_equal(servd_swiglu(g0, g0, u0), 0);
  assert_int_equal(servd_gate_up_swiglu(g, u, x, wg, wu), 0);
  if (memcmp(f(g), f(g0), servd_tensor_nbytes(g)) || memcmp(f(u), f(u0), servd_tensor_nbytes(u)))
    fail_msg("%s m=%lld n=%lld k=%lld: fused differs from matmul_many + swiglu", servd_dtype_name(dt), (long long)m,
             (long long)n, (long long)k);
  if (dt == SERVD_F32 && m <= 32) /* against float64 */
    for (int64_t r = 0; r < m; r++)
      for (int64_t c = 0; c < n; c++) {
        double a = 0, b = 0;
        for (int64_t i = 0; i < k; i++) {
          a += (double)f(x)[r * k + i] * f(wg)[c * k + i];
          b += (double)f(x)[r * k + i] * f(wu)[c * k + i];
        }
        double want = a / (1 + exp(-a)) * b;
        assert_true(fabs(f(g)[r * n + c] - want) <= 1e-4 * (1 + fabs(want)));
      }
  servd_tensor *all[] = {x, wg, wu, g, u, g0, u0};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) servd_tensor_release(all[i]);
}

static void test_same_as_parts(void **state) {
  (void)state;
  static const servd_dtype dts[] = {SERVD_Q4_1, SERVD_Q4_0, SERVD_Q8_0, SERVD_F32, SERVD_F16, SERVD_Q4_K};
  static const int64_t rows[] = {1, 3, 32, 200}; /* 200: beyond a decode, the unfused path */
  for (int isa = 0; isa < SERVD_ISA_COUNT; isa++) {
    if (servd_cpu_force_isa((servd_isa)isa) != 0) continue;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
      for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        int64_t k = dts[d] == SERVD_Q4_K ? 256 : 96;
        check_same(dts[d], rows[r], 320, k);
        check_same(dts[d], rows[r], 100, k); /* a last partial tile */
      }
  }
  servd_cpu_force_isa(SERVD_ISA_COUNT);
}

static void test_refusals(void **state) {
  (void)state;
  servd_tensor *x = tnew(SERVD_F32, 2, 2, 64), *wg = weight(SERVD_Q4_1, 96, 64), *wu = weight(SERVD_Q4_1, 64, 64);
  servd_tensor *g = tnew(SERVD_F32, 2, 2, 96), *u = tnew(SERVD_F32, 2, 2, 96), *w32 = weight(SERVD_Q4_1, 96, 32);
  /* up's weight has other columns: matmul_many's message names it */
  assert_int_equal(servd_gate_up_swiglu(g, u, x, wg, wu), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "out must be (m,n)"));
  /* inner dimensions */
  assert_int_equal(servd_gate_up_swiglu(g, u, x, w32, w32), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "gate_up_swiglu: matmul: inner dimensions differ"));
  /* gate written over up */
  assert_int_equal(servd_gate_up_swiglu(g, g, x, wg, wg), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "distinct"));
  servd_tensor *all[] = {x, wg, wu, g, u, w32};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) servd_tensor_release(all[i]);
}

int main(void) {
  servd_threadpool_init(2);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_same_as_parts), cmocka_unit_test(test_refusals)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
