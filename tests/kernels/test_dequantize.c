/* servd_dequantize against values computed by hand from the block layouts (servd/blocks.h), and
 * against the package importer's row conversion (servd_row_to_f32, core/src/convert.c) on random
 * blocks, rows of strided views and 3-D shapes; plus the refused arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "servd/blocks.h"
#include "servd/ops.h"

static servd_tensor *tensor(servd_dtype d, int ndim, const int64_t *shape) {
  servd_tensor *t = servd_tensor_new(d, ndim, shape);
  assert_non_null(t);
  return t;
}

/* One row of each dtype whose values follow from the layout by hand. */
static void test_hand_computed_blocks(void **state) {
  (void)state;
  const int64_t shape[2] = {1, 32};
  float want[32];

  /* q8_0: d = 0.5 (f16 0x3800), qs[i] = i - 16 -> 0.5 * (i - 16) */
  servd_tensor *x = tensor(SERVD_Q8_0, 2, shape), *out = tensor(SERVD_F32, 2, shape);
  servd_block_q8_0 *b8 = servd_tensor_data(x);
  b8->d = 0x3800;
  for (int i = 0; i < 32; i++) b8->qs[i] = (int8_t)(i - 16), want[i] = 0.5f * (float)(i - 16);
  assert_int_equal(servd_dequantize(out, x), 0);
  assert_memory_equal(servd_tensor_data(out), want, sizeof want);
  servd_tensor_release(x);

  /* q4_0: d = 0.25 (0x3400), qs[j] = j | (15-j) << 4 -> y[j] = 0.25 (j - 8), y[j+16] = 0.25 (7 - j) */
  x = tensor(SERVD_Q4_0, 2, shape);
  servd_block_q4_0 *b40 = servd_tensor_data(x);
  b40->d = 0x3400;
  for (int j = 0; j < 16; j++) {
    b40->qs[j] = (uint8_t)(j | (15 - j) << 4);
    want[j] = 0.25f * (float)(j - 8);
    want[j + 16] = 0.25f * (float)(7 - j);
  }
  assert_int_equal(servd_dequantize(out, x), 0);
  assert_memory_equal(servd_tensor_data(out), want, sizeof want);
  servd_tensor_release(x);

  /* q4_1: d = 0.5 (0x3800), m = -1 (0xBC00), same nibbles -> y[j] = 0.5 j - 1, y[j+16] = 0.5 (15-j) - 1 */
  x = tensor(SERVD_Q4_1, 2, shape);
  servd_block_q4_1 *b41 = servd_tensor_data(x);
  b41->d = 0x3800;
  b41->m = 0xBC00;
  for (int j = 0; j < 16; j++) {
    b41->qs[j] = (uint8_t)(j | (15 - j) << 4);
    want[j] = 0.5f * (float)j - 1.0f;
    want[j + 16] = 0.5f * (float)(15 - j) - 1.0f;
  }
  assert_int_equal(servd_dequantize(out, x), 0);
  assert_memory_equal(servd_tensor_data(out), want, sizeof want);
  servd_tensor_release(x);
  servd_tensor_release(out);
}

/* Random blocks with finite scales (random bytes could make NaN scales, which compare unequal). */
static void fill_random(servd_tensor *x, unsigned seed) {
  srand(seed);
  unsigned char *p = servd_tensor_data(x);
  size_t n = servd_tensor_nbytes(x), bb = servd_dtype_block_bytes(x->dtype);
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)rand();
  for (size_t off = 0; off < n; off += bb) {
    uint16_t d = servd_f32_to_f16((float)(rand() % 2001 - 1000) / 4096.0f);
    memcpy(p + off, &d, 2);
    if (x->dtype == SERVD_Q4_1) {
      uint16_t m = servd_f32_to_f16((float)(rand() % 2001 - 1000) / 512.0f);
      memcpy(p + off + 2, &m, 2);
    }
  }
}

/* Rows of a view (every other row of a 3-D tensor's middle dimension, narrowed) against the row
 * conversion of the same bytes. */
static void test_matches_row_conversion(void **state) {
  (void)state;
  const servd_dtype dts[] = {SERVD_Q8_0, SERVD_Q4_0, SERVD_Q4_1};
  for (int k = 0; k < 3; k++) {
    const int64_t shape[3] = {3, 5, 96};
    servd_tensor *x = tensor(dts[k], 3, shape);
    fill_random(x, 7u + (unsigned)k);
    servd_tensor *out = tensor(SERVD_F32, 3, shape);
    assert_int_equal(servd_dequantize(out, x), 0);
    float want[96];
    const char *xb = servd_tensor_data(x);
    const float *ob = servd_tensor_data(out);
    for (int64_t r = 0; r < 15; r++) {
      assert_int_equal(servd_row_to_f32(dts[k], xb + r * x->strides[1], want, 96), 0);
      assert_memory_equal(ob + r * 96, want, sizeof want);
    }
    /* a view of rows 1..3 of the middle dimension: its rows are not contiguous over the outer one */
    servd_tensor *v = servd_tensor_narrow(x, 1, 1, 3);
    assert_non_null(v);
    servd_tensor *vo3 = tensor(SERVD_F32, 3, (int64_t[]){3, 3, 96});
    assert_int_equal(servd_dequantize(vo3, v), 0);
    for (int64_t i = 0; i < 3; i++)
      for (int64_t j = 0; j < 3; j++) {
        assert_int_equal(servd_row_to_f32(dts[k], xb + i * x->strides[0] + (j + 1) * x->strides[1], want, 96), 0);
        assert_memory_equal((const float *)servd_tensor_data(vo3) + (i * 3 + j) * 96, want, sizeof want);
      }
    servd_tensor_release(vo3);
    servd_tensor_release(v);
    servd_tensor_release(out);
    servd_tensor_release(x);
  }
}

static void test_refused(void **state) {
  (void)state;
  const int64_t shape[2] = {2, 64}, other[2] = {2, 32};
  servd_tensor *q = tensor(SERVD_Q4_1, 2, shape), *f = tensor(SERVD_F32, 2, shape), *h = tensor(SERVD_F16, 2, shape);
  servd_tensor *small = tensor(SERVD_F32, 2, other);
  assert_int_equal(servd_dequantize(h, q), SERVD_EINVAL); /* out must be f32 */
  assert_non_null(strstr(servd_last_error(), "dequantize: expected"));
  assert_int_equal(servd_dequantize(f, f), SERVD_EINVAL);     /* x must be a block dtype */
  assert_int_equal(servd_dequantize(small, q), SERVD_EINVAL); /* shapes differ */
  assert_non_null(strstr(servd_last_error(), "f32[2,32]"));
  assert_int_equal(servd_dequantize(NULL, q), SERVD_EINVAL);
  assert_int_equal(servd_dequantize(f, NULL), SERVD_EINVAL);
  servd_tensor_release(small);
  servd_tensor_release(h);
  servd_tensor_release(f);
  servd_tensor_release(q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed_blocks),
      cmocka_unit_test(test_matches_row_conversion),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
