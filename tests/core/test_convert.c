/* f16/bf16 conversions and GGUF block (de)quantization against hand-computed values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "servd/tensor.h"

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void test_f16(void **state) {
  (void)state;
  assert_int_equal(servd_f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(servd_f32_to_f16(-2.0f), 0xc000);
  assert_int_equal(servd_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(servd_f32_to_f16(65519.0f), 0x7bff); /* below the midpoint to 65536 */
  assert_int_equal(servd_f32_to_f16(65520.0f), 0x7c00); /* ties to even: inf */
  assert_int_equal(servd_f32_to_f16(INFINITY), 0x7c00);
  assert_int_equal(servd_f32_to_f16(ldexpf(1, -24)), 0x0001);        /* smallest subnormal */
  assert_int_equal(servd_f32_to_f16(ldexpf(1, -25)), 0x0000);        /* tie to even: 0 */
  assert_int_equal(servd_f32_to_f16(ldexpf(3, -25)), 0x0002);        /* 1.5 units: tie to even 2 */
  assert_int_equal(servd_f32_to_f16(ldexpf(1, -14)), 0x0400);        /* smallest normal */
  assert_int_equal(servd_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00); /* tie: even */
  assert_int_equal(servd_f32_to_f16(1.0f + ldexpf(3, -11)), 0x3c02); /* tie: up to even */
  assert_true(isnan(servd_f16_to_f32(servd_f32_to_f16(NAN))));
  assert_true(servd_f16_to_f32(0x0001) == ldexpf(1, -24));
  assert_true(servd_f16_to_f32(0xfbff) == -65504.0f);
  /* Every finite f16 survives the round trip exactly. */
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00) continue;
    assert_int_equal(servd_f32_to_f16(servd_f16_to_f32((uint16_t)h)), h);
  }
}

static void test_bf16(void **state) {
  (void)state;
  assert_int_equal(servd_f32_to_bf16(1.0f), 0x3f80);
  assert_int_equal(servd_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80); /* tie: even */
  assert_int_equal(servd_f32_to_bf16(1.0f + ldexpf(3, -8)), 0x3f82); /* tie: up to even */
  assert_int_equal(servd_f32_to_bf16(1.0f + ldexpf(5, -9)), 0x3f81); /* above the tie */
  uint16_t n = servd_f32_to_bf16(NAN);
  assert_true(isnan(servd_bf16_to_f32(n)));
  assert_int_equal(bits(servd_bf16_to_f32(0xc040)), 0xc0400000u);
}

static void test_dequant_handmade(void **state) {
  (void)state;
  uint8_t blk[34];
  float out[32];
  /* q8_0: d = 0.5 (f16 0x3800), q = j-16 -> 0.5*(j-16). */
  blk[0] = 0x00, blk[1] = 0x38;
  for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)(j - 16);
  assert_int_equal(servd_row_to_f32(SERVD_Q8_0, blk, out, 32), 0);
  for (int j = 0; j < 32; j++) assert_true(out[j] == 0.5f * (float)(j - 16));
  /* q4_0: d = 2 (0x4000); byte j = lo j | hi (15-j): x[j] = 2(j-8), x[16+j] = 2(7-j). */
  blk[0] = 0x00, blk[1] = 0x40;
  for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(j | ((15 - j) << 4));
  assert_int_equal(servd_row_to_f32(SERVD_Q4_0, blk, out, 32), 0);
  for (int j = 0; j < 16; j++) {
    assert_true(out[j] == 2.0f * (float)(j - 8));
    assert_true(out[16 + j] == 2.0f * (float)(7 - j));
  }
  /* q4_1: d = 0.25 (0x3400), m = -1 (0xbc00); x = 0.25 q - 1. */
  blk[0] = 0x00, blk[1] = 0x34, blk[2] = 0x00, blk[3] = 0xbc;
  for (int j = 0; j < 16; j++) blk[4 + j] = (uint8_t)(j | ((15 - j) << 4));
  assert_int_equal(servd_row_to_f32(SERVD_Q4_1, blk, out, 32), 0);
  for (int j = 0; j < 16; j++) {
    assert_true(out[j] == 0.25f * (float)j - 1.0f);
    assert_true(out[16 + j] == 0.25f * (float)(15 - j) - 1.0f);
  }
}

static void test_quantize_handmade(void **state) {
  (void)state;
  float x[32];
  uint8_t blk[34];
  /* q8_0: amax 127 -> d = 1, q = x. */
  for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
  x[0] = -127.0f;
  assert_int_equal(servd_row_from_f32(SERVD_Q8_0, x, blk, 32), 0);
  assert_int_equal(blk[0] | blk[1] << 8, 0x3c00);
  for (int j = 0; j < 32; j++) assert_int_equal((int8_t)blk[2 + j], (int)x[j]);
  /* q4_0: largest magnitude is -8 -> d = -8/-8 = 1, q = x + 8. */
  for (int j = 0; j < 32; j++) x[j] = (float)((j % 16) - 8);
  assert_int_equal(servd_row_from_f32(SERVD_Q4_0, x, blk, 32), 0);
  assert_int_equal(blk[0] | blk[1] << 8, 0x3c00);
  for (int j = 0; j < 16; j++) assert_int_equal(blk[2 + j], j | j << 4);
  /* Largest magnitude positive: d = 8/-8 = -1, so q = 8 - x, clamped to 15 at x = -8. */
  for (int j = 0; j < 32; j++) x[j] = -(float)((j % 16) - 8);
  assert_int_equal(servd_row_from_f32(SERVD_Q4_0, x, blk, 32), 0);
  assert_int_equal(blk[0] | blk[1] << 8, 0xbc00);
  for (int j = 0; j < 16; j++) {
    int q = j == 0 ? 0 : j; /* x[0] = 8: 8*-1+8.5 = 0.5 -> 0 */
    assert_int_equal(blk[2 + j], q | q << 4);
  }
  /* q4_1: min 3, max 18 -> d = 1, m = 3 (0x4200), q = x - 3. */
  for (int j = 0; j < 32; j++) x[j] = (float)((j % 16) + 3);
  assert_int_equal(servd_row_from_f32(SERVD_Q4_1, x, blk, 32), 0);
  assert_int_equal(blk[0] | blk[1] << 8, 0x3c00);
  assert_int_equal(blk[2] | blk[3] << 8, 0x4200);
  for (int j = 0; j < 16; j++) assert_int_equal(blk[4 + j], j | j << 4);
  /* All zeros: d = 0 and no division by zero. */
  memset(x, 0, sizeof x);
  assert_int_equal(servd_row_from_f32(SERVD_Q4_0, x, blk, 32), 0);
  for (int j = 0; j < 16; j++) assert_int_equal(blk[2 + j], 0x88);
}

/* Round trip error bounds: q8_0 within d/2 = amax/254; q4_0 within |d|/2 except the clamped end
 * (within |d|); q4_1 within d/2; plus the f16 rounding of the scale (2^-11 relative) times 15. */
static void test_round_trip_bounds(void **state) {
  (void)state;
  float x[256], y[256];
  uint8_t buf[256 * 4];
  uint32_t s = 12345;
  for (int i = 0; i < 256; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 6.0f;
  }
  const servd_dtype ts[] = {SERVD_Q8_0, SERVD_Q4_0, SERVD_Q4_1, SERVD_F16, SERVD_BF16};
  for (int t = 0; t < 5; t++) {
    assert_int_equal(servd_row_from_f32(ts[t], x, buf, 256), 0);
    assert_int_equal(servd_row_to_f32(ts[t], buf, y, 256), 0);
    for (int b = 0; b < 8; b++) {
      float amax = 0, mn = INFINITY, mx = -INFINITY;
      for (int j = 0; j < 32; j++) {
        amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        mn = fminf(mn, x[b * 32 + j]);
        mx = fmaxf(mx, x[b * 32 + j]);
      }
      for (int j = 0; j < 32; j++) {
        float v = x[b * 32 + j], e = fabsf(y[b * 32 + j] - v), tol;
        switch (ts[t]) {
        case SERVD_Q8_0: tol = amax / 254 + amax * 0x1p-10f; break;
        case SERVD_Q4_0: tol = amax / 8 + amax * 0x1p-8f; break;
        case SERVD_Q4_1: tol = (mx - mn) / 30 + (mx - mn) * 0x1p-8f + fabsf(mn) * 0x1p-11f; break;
        case SERVD_F16: tol = fabsf(v) * 0x1p-11f + 0x1p-25f; break; /* subnormals: absolute */
        default: tol = fabsf(v) * 0x1p-8f; break;
        }
        if (!(e <= tol))
          print_message("dtype %d block %d j %d x %g y %g tol %g\n", (int)ts[t], b, j, (double)v, (double)y[b * 32 + j],
                        (double)tol);
        assert_true(e <= tol);
      }
    }
  }
  /* Non-finite input quantizes without undefined behaviour (the values are garbage, as in ggml). */
  x[5] = NAN;
  x[40] = INFINITY;
  for (int t = 0; t < 3; t++) assert_int_equal(servd_row_from_f32(ts[t], x, buf, 64), 0);
  assert_int_equal(servd_row_to_f32(SERVD_Q4_1, buf, y, 48), SERVD_EINVAL);
  assert_int_equal(servd_row_from_f32(SERVD_Q8_0, x, buf, 31), SERVD_EINVAL);
  assert_int_equal(servd_row_from_f32((servd_dtype)99, x, buf, 32), SERVD_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f16),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_dequant_handmade),
      cmocka_unit_test(test_quantize_handmade),
      cmocka_unit_test(test_round_trip_bounds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
