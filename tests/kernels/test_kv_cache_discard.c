/* servd_kv_cache_discard (sleep level 1): refused while a block is held; otherwise the pages go
 * back to the system, which reads back as zeros where values were written, and the cache stays
 * usable: a value written after it reads back through attention. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

#define HD 8

static servd_tensor *tnew(servd_dtype t, int ndim, int64_t a, int64_t b) {
  int64_t shape[2] = {a, b};
  servd_tensor *x = servd_tensor_new(t, ndim, shape);
  assert_non_null(x);
  return x;
}

/* Writes value v into every element of slot 0's K and V. */
static void write_slot0(servd_kv_cache *c, float v) {
  servd_tensor *k = tnew(SERVD_F32, 2, 1, HD), *val = tnew(SERVD_F32, 2, 1, HD), *s = tnew(SERVD_I32, 1, 1, 0);
  for (int i = 0; i < HD; i++) ((float *)servd_tensor_data(k))[i] = ((float *)servd_tensor_data(val))[i] = v;
  ((int32_t *)servd_tensor_data(s))[0] = 0;
  assert_int_equal(servd_kv_write(c, 0, k, val, s), 0);
  servd_tensor_release(k);
  servd_tensor_release(val);
  servd_tensor_release(s);
}

/* Attention of one query over the one key in slot 0: exactly slot 0's value row. */
static float read_slot0(servd_kv_cache *c) {
  servd_tensor *q = tnew(SERVD_F32, 2, 1, HD), *o = tnew(SERVD_F32, 2, 1, HD);
  for (int i = 0; i < HD; i++) ((float *)servd_tensor_data(q))[i] = 0.5f;
  int32_t table[1] = {0};
  const int32_t *tables[1] = {table};
  int32_t qs = 0, ql = 1, kl = 1;
  servd_attn_batch b = {1, &qs, &ql, &kl, tables};
  assert_int_equal(servd_attention(o, q, c, 0, &b, 1, 0.125f), 0);
  float v = ((float *)servd_tensor_data(o))[HD - 1];
  servd_tensor_release(q);
  servd_tensor_release(o);
  return v;
}

static void test_discard(void **state) {
  (void)state;
  servd_kv_cache *c = NULL;
  assert_int_equal(servd_kv_cache_create(&c, 1, 1, HD, 4, 4, SERVD_F32), 0);
  int32_t id;
  assert_int_equal(servd_kv_cache_alloc(c, 1, &id), 0);
  assert_int_equal(id, 0);
  write_slot0(c, 2.5f);
  assert_float_equal(read_slot0(c), 2.5f, 0);
  assert_int_equal(servd_kv_cache_discard(c), SERVD_EBUSY); /* a block is held */
  assert_non_null(strstr(servd_last_error(), "1 of 4 blocks are still held"));
  assert_float_equal(read_slot0(c), 2.5f, 0); /* refused: nothing lost */
  servd_kv_cache_free(c, 1, &id);
  assert_int_equal(servd_kv_cache_discard(c), 0);
  assert_int_equal(servd_kv_cache_free_blocks(c), 4);
  assert_float_equal(read_slot0(c), 0.0f, 0); /* the page went back: it reads as zero again */
  assert_int_equal(servd_kv_cache_alloc(c, 1, &id), 0);
  write_slot0(c, -1.25f);
  assert_float_equal(read_slot0(c), -1.25f, 0);
  servd_kv_cache_destroy(c);

  assert_int_equal(servd_kv_cache_create_blocks_only(&c, 1, 1, HD, 4, 4), 0);
  assert_int_equal(servd_kv_cache_discard(c), 0); /* nothing to give back */
  servd_kv_cache_destroy(c);
  assert_int_equal(servd_kv_cache_discard(NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_discard)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
