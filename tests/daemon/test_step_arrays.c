/* Host arrays of one forward step: capacities, every element usable (ASan reports any array shorter
 * than its capacity), zeroed at init, and the batch views pointing at them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/step_arrays.h"
#include "servd/status.h"

/* Fills every element of every array with a value naming array and index, then reads all back:
 * an array shorter than its capacity is a heap overflow under ASan, and two arrays sharing storage
 * show up as overwritten values. */
static void check_full_capacity(int max_tokens, int max_seqs) {
  servd_step_arrays a;
  assert_int_equal(servd_step_arrays_init(&a, max_tokens, max_seqs, "test"), 0);
  assert_int_equal(a.max_tokens, max_tokens);
  assert_int_equal(a.max_seqs, max_seqs);
  int32_t *per_token[] = {a.tokens, a.positions, a.slots, a.logit_rows};
  int32_t *per_seq[] = {a.q_start, a.q_len, a.kv_len};
  const int n_tok = 4, n_seq = 3;
  /* Zeroed at init: the warm-up steps rely on token ids 0 they never write. */
  for (int k = 0; k < n_tok; k++)
    for (int i = 0; i < max_tokens; i++) assert_int_equal(per_token[k][i], 0);
  for (int k = 0; k < n_seq; k++)
    for (int i = 0; i < max_seqs; i++) assert_int_equal(per_seq[k][i], 0);
  for (int i = 0; i < max_seqs; i++) assert_null(a.block_tables[i]);

  for (int k = 0; k < n_tok; k++)
    for (int i = 0; i < max_tokens; i++) per_token[k][i] = k * 1000000 + i;
  for (int k = 0; k < n_seq; k++)
    for (int i = 0; i < max_seqs; i++) per_seq[k][i] = -(k * 1000000 + i) - 1;
  int32_t *tables = malloc(sizeof *tables * (size_t)max_seqs); /* a block table per sequence */
  assert_non_null(tables);
  for (int i = 0; i < max_seqs; i++) a.block_tables[i] = &tables[i];

  for (int k = 0; k < n_tok; k++)
    for (int i = 0; i < max_tokens; i++)
      if (per_token[k][i] != k * 1000000 + i) fail_msg("token array %d [%d]: %d", k, i, per_token[k][i]);
  for (int k = 0; k < n_seq; k++)
    for (int i = 0; i < max_seqs; i++)
      if (per_seq[k][i] != -(k * 1000000 + i) - 1) fail_msg("sequence array %d [%d]: %d", k, i, per_seq[k][i]);
  for (int i = 0; i < max_seqs; i++) assert_ptr_equal(a.block_tables[i], &tables[i]);
  free(tables);
  servd_step_arrays_free(&a);
  assert_null(a.tokens);
  assert_int_equal(a.max_tokens, 0);
}

static void test_capacities(void **state) {
  (void)state;
  check_full_capacity(1, 1);
  check_full_capacity(7, 3);
  check_full_capacity(1, 5); /* more sequences than tokens: the arrays are sized apart */
  check_full_capacity(8192, 256);
}

static void test_invalid(void **state) {
  (void)state;
  servd_step_arrays a;
  memset(&a, 0x5a, sizeof a);
  assert_int_equal(servd_step_arrays_init(&a, 0, 4, "test"), SERVD_EINVAL);
  assert_null(a.tokens); /* zeroed on failure: freeing it is safe */
  assert_null(a.block_tables);
  servd_step_arrays_free(&a);
  assert_int_equal(servd_step_arrays_init(&a, 4, 0, "test"), SERVD_EINVAL);
  assert_int_equal(servd_step_arrays_init(&a, -1, -1, "test"), SERVD_EINVAL);
  servd_step_arrays_free(&a);
}

static void test_free_zeroed(void **state) {
  (void)state;
  servd_step_arrays a;
  memset(&a, 0, sizeof a);
  servd_step_arrays_free(&a);
  servd_step_arrays_free(NULL);
  assert_int_equal(servd_step_arrays_init(&a, 3, 2, "test"), 0);
  servd_step_arrays_free(&a);
  servd_step_arrays_free(&a); /* twice: the first left it zeroed */
}

static void test_batch_views(void **state) {
  (void)state;
  servd_step_arrays a;
  assert_int_equal(servd_step_arrays_init(&a, 6, 3, "test"), 0);
  servd_attn_batch at = servd_step_arrays_attn(&a, 2);
  assert_int_equal(at.n_seqs, 2);
  assert_ptr_equal(at.q_start, a.q_start);
  assert_ptr_equal(at.q_len, a.q_len);
  assert_ptr_equal(at.kv_len, a.kv_len);
  assert_ptr_equal(at.block_tables, a.block_tables);

  /* The step fields point at a; what the caller set apart from them stays. */
  servd_kv_cache *kv = (servd_kv_cache *)&a; /* any non-NULL address: only compared */
  servd_forward_batch b = {.kv = kv, .max_tokens = 6, .max_seqs = 3};
  servd_step_arrays_point(&a, &b, 5, 2, 3);
  assert_int_equal(b.n_tokens, 5);
  assert_ptr_equal(b.tokens, a.tokens);
  assert_ptr_equal(b.positions, a.positions);
  assert_ptr_equal(b.slots, a.slots);
  assert_int_equal(b.n_logit_rows, 2);
  assert_ptr_equal(b.logit_rows, a.logit_rows);
  assert_int_equal(b.attn.n_seqs, 3);
  assert_ptr_equal(b.attn.q_start, a.q_start);
  assert_ptr_equal(b.attn.q_len, a.q_len);
  assert_ptr_equal(b.attn.kv_len, a.kv_len);
  assert_ptr_equal(b.attn.block_tables, a.block_tables);
  assert_ptr_equal(b.kv, kv);
  assert_null(b.dbatch);
  assert_null(b.dkv);
  assert_int_equal(b.max_tokens, 6);
  assert_int_equal(b.max_seqs, 3);
  servd_step_arrays_free(&a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capacities),
      cmocka_unit_test(test_invalid),
      cmocka_unit_test(test_free_zeroed),
      cmocka_unit_test(test_batch_views),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
