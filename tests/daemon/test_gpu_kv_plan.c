/* The GPU KV cache's size from the ranks' free memory, against hand-computed block counts (fractions
 * that are exact in binary, so the products are exact). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/gpu_setup.h"

static servd_gpu_kv_in two_ranks(const size_t *free_b) {
  /* rank 0: 10 GB free, rank 1: 8 GB; blocks of 1 MB; a context is 128 blocks of 16 tokens */
  servd_gpu_kv_in in = {.free_bytes = free_b,
                        .n_ranks = 2,
                        .fraction = 0.5,
                        .per_block = 1000000,
                        .block_size = 16,
                        .ctx_blocks = 128,
                        .max_seqs = 4,
                        .kv_blocks = 0};
  return in;
}

static void test_sizes(void **state) {
  (void)state;
  const size_t free_b[2] = {10000000000u, 8000000000u};
  servd_gpu_kv_in in = two_ranks(free_b);
  int blocks = -1;
  const char *why = NULL;
  /* fits 5000 and 4000 blocks: 4 contexts (512 blocks) are less */
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), 0);
  assert_int_equal(blocks, 512);
  assert_string_equal(why, "max_seqs full contexts");
  /* 100 contexts (12800) do not fit: the tighter rank's 8 GB x 0.5 = 4000 blocks */
  in.max_seqs = 100;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), 0);
  assert_int_equal(blocks, 4000);
  assert_string_equal(why, "the memory fraction");
  in.fraction = 0.75; /* 6000 blocks on rank 1 */
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), 0);
  assert_int_equal(blocks, 6000);
  /* kv_blocks asks for an exact number */
  in.kv_blocks = 5999;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), 0);
  assert_int_equal(blocks, 5999);
  assert_string_equal(why, "kv_blocks");
  in.kv_blocks = 6001;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), SERVD_ENOMEM);
  assert_int_equal(blocks, 0);
  assert_non_null(strstr(servd_last_error(), "kv_blocks 6001"));
  assert_non_null(strstr(servd_last_error(), "cuda:1"));
}

static void test_too_small(void **state) {
  (void)state;
  /* 200 MB x 0.5 = 100 blocks of 1 MB: not one context of 128 */
  const size_t free_b[2] = {10000000000u, 200000000u};
  servd_gpu_kv_in in = two_ranks(free_b);
  int blocks = -1;
  const char *why = NULL;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), SERVD_ENOMEM);
  assert_non_null(strstr(servd_last_error(), "fits 100 blocks"));
  assert_non_null(strstr(servd_last_error(), "one context of 2048 tokens"));
  /* exactly one context */
  const size_t one[1] = {256000000u};
  in.free_bytes = one;
  in.n_ranks = 1;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), 0);
  assert_int_equal(blocks, 128);
}

/* The reserve each rank keeps free bites only where the fraction would take it. */
static void test_reserve(void **state) {
  (void)state;
  const size_t free_b[1] = {10000000000u};
  servd_gpu_kv_in in = {.free_bytes = free_b,
                        .n_ranks = 1,
                        .fraction = 1,
                        .per_block = 1000000,
                        .block_size = 16,
                        .ctx_blocks = 128,
                        .max_seqs = 1000,
                        .reserve = 1000000000u};
  int blocks = 0;
  const char *why = NULL;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), 0);
  assert_int_equal(blocks, 9000); /* 10 GB - 1 GB */
  in.fraction = 0.5;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), 0);
  assert_int_equal(blocks, 5000);      /* 5 GB leave more than the reserve */
  const size_t tiny[1] = {900000000u}; /* less than the reserve: nothing fits */
  in.free_bytes = tiny;
  in.fraction = 1;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), SERVD_ENOMEM);
}

static void test_limits(void **state) {
  (void)state;
  /* a cache so large its slots would overflow i32: capped at INT32_MAX / block_size blocks */
  const size_t free_b[1] = {(size_t)1 << 40};
  servd_gpu_kv_in in = {.free_bytes = free_b,
                        .n_ranks = 1,
                        .fraction = 1,
                        .per_block = 1,
                        .block_size = 16,
                        .ctx_blocks = 1 << 20,
                        .max_seqs = 4096};
  int blocks = 0;
  const char *why = NULL;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), 0);
  assert_int_equal(blocks, INT32_MAX / 16);
  in.fraction = 0;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), SERVD_EINVAL);
  in.fraction = 1.5;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), SERVD_EINVAL);
  in.fraction = 0.5;
  in.per_block = 0;
  assert_int_equal(servd_gpu_kv_plan(&in, &blocks, &why), SERVD_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_too_small),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_reserve),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
