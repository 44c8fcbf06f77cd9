/* CUDA graph buckets and the padding of decode steps, against hand-computed lists and arrays. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/graph_plan.h"

static void expect_buckets(int max_batch, const int *want, int n_want) {
  int got[600];
  int n = servd_graph_buckets(max_batch, got, 600);
  assert_int_equal(n, n_want);
  assert_int_equal(servd_graph_n_buckets(max_batch), n_want);
  for (int i = 0; i < n; i++)
    if (got[i] != want[i]) fail_msg("max %d: bucket %d is %d, expected %d", max_batch, i, got[i], want[i]);
}

static void test_buckets(void **state) {
  (void)state;
  expect_buckets(64, (int[]){1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64}, 11);
  expect_buckets(1, (int[]){1}, 1);
  expect_buckets(2, (int[]){1, 2}, 2);
  expect_buckets(3, (int[]){1, 2, 3}, 3);
  expect_buckets(8, (int[]){1, 2, 4, 8}, 4);
  expect_buckets(20, (int[]){1, 2, 4, 8, 16, 20}, 6);
  expect_buckets(33, (int[]){1, 2, 4, 8, 16, 24, 32, 33}, 8);
  int small[3];
  assert_int_equal(servd_graph_buckets(64, small, 3), -1); /* too little room */
  assert_int_equal(servd_graph_n_buckets(0), 0);
}

static void test_bucket_index(void **state) {
  (void)state;
  const int b[] = {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64};
  const int n = 11;
  /* n sequences -> smallest bucket >= n */
  const int cases[][2] = {{1, 0},  {2, 1},  {3, 2},  {4, 2},   {5, 3},   {8, 3},   {9, 4},  {16, 4}, {17, 5},
                          {24, 5}, {25, 6}, {33, 7}, {63, 10}, {64, 10}, {65, -1}, {0, -1}, {-3, -1}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    if (servd_graph_bucket_index(b, n, cases[i][0]) != cases[i][1])
      fail_msg("%d sequences: index %d, expected %d", cases[i][0], servd_graph_bucket_index(b, n, cases[i][0]),
               cases[i][1]);
}

/* Three decoding sequences: rows 0..2, kv lengths 5, 17, 1 over blocks of 16. */
static const int32_t tok[] = {11, 22, 33}, pos[] = {4, 16, 0}, slot[] = {36, 80, 112}, lrows[] = {0, 1, 2};
static const int32_t qs[] = {0, 1, 2}, ql[] = {1, 1, 1}, kvl[] = {5, 17, 1};
static const int32_t t0[] = {2}, t1[] = {3, 5}, t2[] = {7};
static const int32_t *const tables[] = {t0, t1, t2};

static servd_forward_batch decode3(void) {
  servd_forward_batch b = {.n_tokens = 3,
                           .tokens = tok,
                           .positions = pos,
                           .slots = slot,
                           .n_logit_rows = 3,
                           .logit_rows = lrows,
                           .attn = {.n_seqs = 3, .q_start = qs, .q_len = ql, .kv_len = kvl, .block_tables = tables},
                           .max_tokens = 64,
                           .max_seqs = 8};
  return b;
}

static void expect_i32(const int32_t *got, const int32_t *want, int n, const char *what) {
  for (int i = 0; i < n; i++)
    if (got[i] != want[i]) fail_msg("%s[%d] = %d, expected %d", what, i, got[i], want[i]);
}

static void test_is_decode(void **state) {
  (void)state;
  servd_forward_batch b = decode3();
  assert_true(servd_step_is_decode(&b));
  /* a prefill chunk of 2 tokens for sequence 1 */
  const int32_t ql2[] = {1, 2, 1}, qs2[] = {0, 1, 3};
  servd_forward_batch p = b;
  p.n_tokens = 4;
  p.attn.q_len = ql2;
  p.attn.q_start = qs2;
  assert_false(servd_step_is_decode(&p));
  /* a sequence whose logits are not wanted */
  servd_forward_batch nl = b;
  nl.n_logit_rows = 2;
  assert_false(servd_step_is_decode(&nl));
  servd_forward_batch empty = {0};
  assert_false(servd_step_is_decode(&empty));
}

static void test_pad(void **state) {
  (void)state;
  servd_padded_step p;
  assert_int_equal(servd_padded_step_init(&p, 8), 0);
  servd_forward_batch b = decode3();
  assert_int_equal(servd_pad_decode(&p, &b, 4), 0);
  const servd_forward_batch *x = &p.batch;
  assert_int_equal(x->n_tokens, 4);
  assert_int_equal(x->n_logit_rows, 4);
  assert_int_equal(x->attn.n_seqs, 4);
  /* the real rows, then one padding row: token 0, position 0, slot -1, its own logit row, kv_len 1 */
  expect_i32(x->tokens, (const int32_t[]){11, 22, 33, 0}, 4, "tokens");
  expect_i32(x->positions, (const int32_t[]){4, 16, 0, 0}, 4, "positions");
  expect_i32(x->slots, (const int32_t[]){36, 80, 112, -1}, 4, "slots");
  expect_i32(x->logit_rows, (const int32_t[]){0, 1, 2, 3}, 4, "logit_rows");
  expect_i32(x->attn.q_start, (const int32_t[]){0, 1, 2, 3}, 4, "q_start");
  expect_i32(x->attn.q_len, (const int32_t[]){1, 1, 1, 1}, 4, "q_len");
  expect_i32(x->attn.kv_len, (const int32_t[]){5, 17, 1, 1}, 4, "kv_len");
  assert_ptr_equal(x->attn.block_tables[0], t0);
  assert_ptr_equal(x->attn.block_tables[1], t1);
  assert_ptr_equal(x->attn.block_tables[2], t2);
  assert_int_equal(x->attn.block_tables[3][0], 0);
  /* what the step carries besides */
  assert_int_equal(x->max_tokens, 64);
  assert_int_equal(x->max_seqs, 8);

  /* 3 into 8: five padding rows */
  assert_int_equal(servd_pad_decode(&p, &b, 8), 0);
  expect_i32(x->tokens, (const int32_t[]){11, 22, 33, 0, 0, 0, 0, 0}, 8, "tokens");
  expect_i32(x->positions, (const int32_t[]){4, 16, 0, 0, 0, 0, 0, 0}, 8, "positions");
  expect_i32(x->slots, (const int32_t[]){36, 80, 112, -1, -1, -1, -1, -1}, 8, "slots");
  expect_i32(x->logit_rows, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7}, 8, "logit_rows");
  expect_i32(x->attn.q_start, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7}, 8, "q_start");
  expect_i32(x->attn.kv_len, (const int32_t[]){5, 17, 1, 1, 1, 1, 1, 1}, 8, "kv_len");
  for (int i = 3; i < 8; i++) assert_int_equal(x->attn.block_tables[i][0], 0);

  /* exactly a bucket: no padding, the same values */
  assert_int_equal(servd_pad_decode(&p, &b, 3), 0);
  assert_int_equal(x->n_tokens, 3);
  expect_i32(x->tokens, tok, 3, "tokens");

  /* the input is untouched */
  expect_i32(b.tokens, (const int32_t[]){11, 22, 33}, 3, "input tokens");

  /* refused: a bucket too small or beyond the capacity, a step that is not decode */
  assert_int_equal(servd_pad_decode(&p, &b, 2), SERVD_EINVAL);
  assert_int_equal(servd_pad_decode(&p, &b, 9), SERVD_EINVAL);
  servd_forward_batch nl = b;
  nl.n_logit_rows = 2;
  assert_int_equal(servd_pad_decode(&p, &nl, 4), SERVD_EINVAL);
  servd_padded_step_free(&p);
  servd_padded_step_free(&p); /* twice: a zeroed struct */
  assert_int_equal(servd_padded_step_init(&p, 0), SERVD_EINVAL);
}

/* The runner's decisions over a run of steps, as its protocol says: warm-up, capture, replay per
 * bucket; prefill and oversized steps eager; a failed capture disables its bucket; an unstable one
 * retries after a new warm-up, at most SERVD_GRAPH_MAX_UNSTABLE times; a reset warms up again. */
static void test_decisions(void **state) {
  (void)state;
  servd_graph_state g;
  assert_int_equal(servd_graph_state_init(&g, 8), 0); /* buckets 1, 2, 4, 8 */
  servd_forward_batch b3 = decode3();
  int bi = -2;
  assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_WARMUP);
  assert_int_equal(bi, 2); /* 3 sequences: bucket 4 */
  /* a failed warm-up step (rc != 0) does not count: the caller does not report it */
  assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_WARMUP);
  servd_graph_ran(&g, SERVD_GRAPH_WARMUP, bi);
  assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_CAPTURE);
  assert_false(servd_graph_capture_done(&g, bi, true, false));
  assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_REPLAY);
  servd_graph_ran(&g, SERVD_GRAPH_REPLAY, bi);
  assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_REPLAY);

  /* another bucket has its own state */
  servd_forward_batch b1 = b3;
  b1.n_tokens = b1.n_logit_rows = b1.attn.n_seqs = 1;
  assert_int_equal(servd_graph_decide(&g, &b1, &bi), SERVD_GRAPH_WARMUP);
  assert_int_equal(bi, 0);

  /* a prefill step: eager, no bucket */
  const int32_t ql2[] = {1, 2, 1}, qs2[] = {0, 1, 3};
  servd_forward_batch p = b3;
  p.n_tokens = 4;
  p.attn.q_len = ql2;
  p.attn.q_start = qs2;
  assert_int_equal(servd_graph_decide(&g, &p, &bi), SERVD_GRAPH_EAGER);
  assert_int_equal(bi, -1);

  /* memory moved: every bucket warms up again */
  servd_graph_reset(&g);
  assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_WARMUP);
  servd_graph_ran(&g, SERVD_GRAPH_WARMUP, bi);
  assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_CAPTURE);

  /* unstable captures: warm up and retry, disabled at the third */
  for (int i = 1; i < SERVD_GRAPH_MAX_UNSTABLE; i++) {
    assert_false(servd_graph_capture_done(&g, bi, false, true));
    assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_WARMUP);
    servd_graph_ran(&g, SERVD_GRAPH_WARMUP, bi);
    assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_CAPTURE);
  }
  assert_true(servd_graph_capture_done(&g, bi, false, true));
  assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_EAGER);
  servd_graph_reset(&g); /* disabled stays disabled */
  assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_EAGER);

  /* any other capture failure disables at once */
  servd_graph_ran(&g, SERVD_GRAPH_WARMUP, 0);
  assert_int_equal(servd_graph_decide(&g, &b1, &bi), SERVD_GRAPH_CAPTURE);
  assert_true(servd_graph_capture_done(&g, bi, false, false));
  assert_int_equal(servd_graph_decide(&g, &b1, &bi), SERVD_GRAPH_EAGER);
  servd_graph_state_free(&g);

  /* beyond the largest bucket: eager */
  assert_int_equal(servd_graph_state_init(&g, 2), 0);
  assert_int_equal(servd_graph_decide(&g, &b3, &bi), SERVD_GRAPH_EAGER);
  servd_graph_state_free(&g);
  servd_graph_state_free(&g);
  /* no graphs at all (a zeroed state): eager */
  assert_int_equal(servd_graph_decide(&g, &b1, &bi), SERVD_GRAPH_EAGER);
  assert_int_equal(servd_graph_state_init(&g, 0), SERVD_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_buckets), cmocka_unit_test(test_bucket_index), cmocka_unit_test(test_is_decode),
      cmocka_unit_test(test_pad),     cmocka_unit_test(test_decisions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
