/* servd_embedding: rows of every table dtype, vocabulary shards, errors. Expected rows come from the
 * dequantizer (itself checked against hand-computed blocks in test_convert) or, for f32, the input. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

static servd_tensor *ids_of(int n, const int32_t *v) {
  servd_tensor *t = servd_tensor_new(SERVD_I32, 1, (int64_t[]){n});
  memcpy(servd_tensor_data(t), v, (size_t)n * 4);
  return t;
}

static void test_all_dtypes(void **state) {
  (void)state;
  enum { V = 10, D = 256 }; /* a whole k-quant super-block */
  float src[V * D], row[D];
  for (int i = 0; i < V * D; i++) src[i] = sinf((float)i * 0.37f) * (float)(1 + i % 7);
  const int32_t idv[] = {3, 0, 9, 3, 12, 5}; /* 12 lies outside this shard */
  for (int dt = 0; dt < SERVD_DTYPE_COUNT; dt++) {
    if (dt == SERVD_I32) continue;
    servd_tensor *tab = servd_tensor_new((servd_dtype)dt, 2, (int64_t[]){V, D});
    for (int r = 0; r < V; r++)
      assert_int_equal(
          servd_row_from_f32((servd_dtype)dt, src + r * D, (char *)servd_tensor_data(tab) + r * tab->strides[0], D), 0);
    servd_tensor *ids = ids_of(6, idv), *out = servd_tensor_new(SERVD_F32, 2, (int64_t[]){6, D});
    memset(servd_tensor_data(out), 0xff, servd_tensor_nbytes(out));
    assert_int_equal(servd_embedding(out, tab, ids, 0), 0);
    for (int i = 0; i < 6; i++) {
      const float *o = (const float *)servd_tensor_data(out) + i * D;
      if (idv[i] >= V) {
        for (int j = 0; j < D; j++) assert_true(o[j] == 0.0f);
        continue;
      }
      servd_row_to_f32((servd_dtype)dt, (char *)servd_tensor_data(tab) + idv[i] * tab->strides[0], row, D);
      for (int j = 0; j < D; j++) assert_true(o[j] == row[j]);
      if (dt == SERVD_F32)
        for (int j = 0; j < D; j++) assert_true(o[j] == src[idv[i] * D + j]);
    }
    /* The same table as the second shard of a 20-row vocabulary: ids 10..19 map to rows 0..9. */
    const int32_t shard[] = {12, 3, 19};
    servd_tensor *ids2 = ids_of(3, shard), *out2 = servd_tensor_new(SERVD_F32, 2, (int64_t[]){3, D});
    assert_int_equal(servd_embedding(out2, tab, ids2, 10), 0);
    const float *o2 = servd_tensor_data(out2);
    servd_row_to_f32((servd_dtype)dt, (char *)servd_tensor_data(tab) + 2 * tab->strides[0], row, D);
    for (int j = 0; j < D; j++) assert_true(o2[j] == row[j] && o2[D + j] == 0.0f);
    servd_tensor_release(ids2);
    servd_tensor_release(out2);
    servd_tensor_release(ids);
    servd_tensor_release(out);
    servd_tensor_release(tab);
  }
}

static void test_errors(void **state) {
  (void)state;
  servd_tensor *tab = servd_tensor_new(SERVD_Q4_1, 2, (int64_t[]){4, 64});
  servd_tensor *ids = ids_of(2, (const int32_t[]){1, -1});
  servd_tensor *out = servd_tensor_new(SERVD_F32, 2, (int64_t[]){2, 64});
  assert_int_equal(servd_embedding(out, tab, ids, 0), SERVD_ERANGE);
  assert_non_null(strstr(servd_last_error(), "embedding"));
  servd_tensor_release(ids);
  ids = ids_of(3, (const int32_t[]){1, 2, 3});
  assert_int_equal(servd_embedding(out, tab, ids, 0), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "q4_1[4,64]"));
  assert_non_null(strstr(servd_last_error(), "f32[2,64]"));
  servd_tensor *fids = servd_tensor_new(SERVD_F32, 1, (int64_t[]){2});
  assert_int_equal(servd_embedding(out, tab, fids, 0), SERVD_EINVAL);
  assert_int_equal(servd_embedding(NULL, tab, fids, 0), SERVD_EINVAL);
  servd_tensor_release(fids);
  servd_tensor_release(ids);
  servd_tensor_release(out);
  servd_tensor_release(tab);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_all_dtypes), cmocka_unit_test(test_errors)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
