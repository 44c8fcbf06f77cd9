/* The host side of a device KV cache: block bookkeeping without storage. Allocation and freeing work
 * as on a full cache; kv_write and attention refuse it with SERVD_EINVAL; a cache far larger than
 * this machine's memory costs only its free list. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "servd/ops.h"

static void test_alloc_free(void **state) {
  (void)state;
  servd_kv_cache *c = NULL;
  assert_int_equal(servd_kv_cache_create_blocks_only(&c, 32, 8, 128, 16, 10), 0);
  assert_int_equal(servd_kv_cache_block_size(c), 16);
  assert_int_equal(servd_kv_cache_n_blocks(c), 10);
  assert_int_equal(servd_kv_cache_free_blocks(c), 10);
  int32_t a[4], b[6], x[1];
  assert_int_equal(servd_kv_cache_alloc(c, 4, a), 0);
  /* low ids first, as on a cache with storage */
  for (int i = 0; i < 4; i++) assert_int_equal(a[i], i);
  assert_int_equal(servd_kv_cache_alloc(c, 6, b), 0);
  assert_int_equal(servd_kv_cache_free_blocks(c), 0);
  assert_int_equal(servd_kv_cache_alloc(c, 1, x), SERVD_EBUSY);
  servd_kv_cache_free(c, 4, a);
  servd_kv_cache_free(c, 4, a); /* a double free is ignored */
  assert_int_equal(servd_kv_cache_free_blocks(c), 4);
  assert_int_equal(servd_kv_cache_alloc(c, 4, a), 0);
  for (int i = 0; i < 4; i++) assert_int_equal(a[i], i); /* handed back in the order freed */
  servd_kv_cache_free(c, 4, a);
  servd_kv_cache_free(c, 6, b);
  assert_int_equal(servd_kv_cache_free_blocks(c), 10);
  servd_kv_cache_destroy(c);
  servd_kv_cache_destroy(NULL);
}

static void test_no_storage(void **state) {
  (void)state;
  /* 80 layers x 8 kv heads x 128 dims x 16 tokens x 2 (K, V) x 2 bytes = 5.2 MB a block: 200000
   * blocks would be 1 TB. Bookkeeping is 5 bytes a block. */
  servd_kv_cache *c = NULL;
  assert_int_equal(servd_kv_cache_create_blocks_only(&c, 80, 8, 128, 16, 200000), 0);
  assert_int_equal(servd_kv_cache_n_blocks(c), 200000);
  servd_kv_cache_destroy(c);
}

static void test_ops_refuse(void **state) {
  (void)state;
  servd_kv_cache *c = NULL;
  assert_int_equal(servd_kv_cache_create_blocks_only(&c, 2, 2, 4, 4, 8), 0);
  int64_t kshape[2] = {1, 8}, sshape[1] = {1}, qshape[2] = {1, 8};
  servd_tensor *k = servd_tensor_new(SERVD_F32, 2, kshape), *v = servd_tensor_new(SERVD_F32, 2, kshape);
  servd_tensor *slots = servd_tensor_new(SERVD_I32, 1, sshape);
  servd_tensor *q = servd_tensor_new(SERVD_F32, 2, qshape), *out = servd_tensor_new(SERVD_F32, 2, qshape);
  assert_non_null(k);
  assert_non_null(slots);
  assert_non_null(out);
  ((int32_t *)servd_tensor_data(slots))[0] = 0;
  assert_int_equal(servd_kv_write(c, 0, k, v, slots), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "block bookkeeping only"));
  const int32_t qs[] = {0}, ql[] = {1}, kl[] = {1}, t0[] = {0};
  const int32_t *const tables[] = {t0};
  servd_attn_batch b = {.n_seqs = 1, .q_start = qs, .q_len = ql, .kv_len = kl, .block_tables = tables};
  assert_int_equal(servd_attention(out, q, c, 0, &b, 2, 0.5f), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "attention"));
  /* the bookkeeping still works after the refusals */
  int32_t id;
  assert_int_equal(servd_kv_cache_alloc(c, 1, &id), 0);
  servd_tensor_release(k);
  servd_tensor_release(v);
  servd_tensor_release(slots);
  servd_tensor_release(q);
  servd_tensor_release(out);
  servd_kv_cache_destroy(c);
}

static void test_bad_args(void **state) {
  (void)state;
  servd_kv_cache *c = (servd_kv_cache *)1;
  assert_int_equal(servd_kv_cache_create_blocks_only(&c, 0, 8, 128, 16, 10), SERVD_EINVAL);
  assert_null(c);
  assert_non_null(strstr(servd_last_error(), "kv_cache_create_blocks_only"));
  assert_int_equal(servd_kv_cache_create_blocks_only(&c, 2, 8, 128, 16, 0), SERVD_EINVAL);
  assert_int_equal(servd_kv_cache_create_blocks_only(&c, 2, 8, 128, -1, 4), SERVD_EINVAL);
  assert_int_equal(servd_kv_cache_create_blocks_only(NULL, 2, 8, 128, 16, 4), SERVD_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc_free),
      cmocka_unit_test(test_no_storage),
      cmocka_unit_test(test_ops_refuse),
      cmocka_unit_test(test_bad_args),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
