/* Speculative decoding's proposers and draft length (engine/speculate.h), against hand-worked
 * token sequences and hand-computed expectations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/speculate.h"

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void expect_tokens(const int32_t *got, int n_got, const int32_t *want, int n_want) {
  assert_int_equal(n_got, n_want);
  for (int i = 0; i < n_want; i++) assert_int_equal(got[i], want[i]);
}

static void test_ngram_most_recent_longest(void **st) {
  (void)st;
  int32_t out[8];
  int match;
  /* ... 1 2 3 | 40 41 ... 9 2 3 | 50 51 ... then 1 2 3: the 3-token match (after "1 2 3") wins over
   * the more recent 2-token one (after "9 2 3"). */
  const int32_t t[] = {1, 2, 3, 40, 41, 42, 9, 2, 3, 50, 51, 7, 1, 2, 3};
  int n = spec_ngram_propose(t, LEN(t), 4, out, &match);
  assert_int_equal(match, 3);
  expect_tokens(out, n, (const int32_t[]){40, 41, 42, 9}, 4);
  /* Only a 2-token suffix occurs before: the most recent occurrence of "2 3". */
  const int32_t u[] = {1, 2, 3, 40, 41, 9, 2, 3, 50, 51, 8, 2, 3};
  n = spec_ngram_propose(u, LEN(u), 3, out, &match);
  assert_int_equal(match, 2);
  expect_tokens(out, n, (const int32_t[]){50, 51, 8}, 3);
  /* The continuation stops at the end of what exists. */
  const int32_t v[] = {5, 6, 7, 5, 6};
  n = spec_ngram_propose(v, LEN(v), 8, out, &match);
  expect_tokens(out, n, (const int32_t[]){7, 5, 6}, 3);
  /* A repeating cycle continues itself. */
  const int32_t w[] = {1, 2, 1, 2, 1, 2};
  n = spec_ngram_propose(w, LEN(w), 4, out, &match);
  expect_tokens(out, n, (const int32_t[]){1, 2}, 2);
}

static void test_ngram_none(void **st) {
  (void)st;
  int32_t out[8];
  int match;
  const int32_t t[] = {1, 2, 3, 4, 5, 6, 3}; /* "3" recurs, but a single token is too weak */
  assert_int_equal(spec_ngram_propose(t, LEN(t), 4, out, &match), 0);
  assert_int_equal(match, 0);
  assert_int_equal(spec_ngram_propose(t, 2, 4, out, &match), 0);
  assert_int_equal(spec_ngram_propose(t, LEN(t), 0, out, &match), 0);
}

static void test_suffix_index(void **st) {
  (void)st;
  spec_suffix_index *x;
  assert_int_equal(spec_suffix_index_create(64, &x), 0);
  int32_t out[8];
  const int32_t a[] = {10, 11, 12, 13, 14, 15, 16};
  spec_suffix_index_add(x, a, LEN(a));
  /* Another request ending in "11 12 13" continues as the first did, up to that sequence's end. */
  const int32_t q[] = {99, 11, 12, 13};
  int n = spec_suffix_index_propose(x, q, LEN(q), 8, out);
  expect_tokens(out, n, (const int32_t[]){14, 15, 16}, 3);
  n = spec_suffix_index_propose(x, q, LEN(q), 2, out);
  expect_tokens(out, n, (const int32_t[]){14, 15}, 2);
  /* A later sequence with the same trigram replaces it. */
  const int32_t b[] = {11, 12, 13, 20, 21};
  spec_suffix_index_add(x, b, LEN(b));
  n = spec_suffix_index_propose(x, q, LEN(q), 8, out);
  expect_tokens(out, n, (const int32_t[]){20, 21}, 2);
  const int32_t none[] = {1, 2, 3};
  assert_int_equal(spec_suffix_index_propose(x, none, 3, 8, out), 0);
  /* Overwritten by the ring's wrap: nothing stale comes back. */
  int32_t filler[60];
  for (int i = 0; i < 60; i++) filler[i] = 1000 + i;
  spec_suffix_index_add(x, filler, 60);
  assert_int_equal(spec_suffix_index_propose(x, q, LEN(q), 8, out), 0);
  const int32_t tail[] = {1057, 1058, 1059};
  assert_int_equal(spec_suffix_index_propose(x, tail, 3, 8, out), 0); /* the end of a sequence */
  const int32_t mid[] = {1050, 1051, 1052};
  n = spec_suffix_index_propose(x, mid, 3, 3, out);
  expect_tokens(out, n, (const int32_t[]){1053, 1054, 1055}, 3);
  spec_suffix_index_free(x);
  spec_suffix_index_free(NULL);
}

static void test_expected_tokens(void **st) {
  (void)st;
  assert_float_equal(spec_expected_tokens(0.5, 0), 1.0, 1e-12);
  assert_float_equal(spec_expected_tokens(0.5, 1), 1.5, 1e-12);
  assert_float_equal(spec_expected_tokens(0.5, 3), 1.875, 1e-12);
  assert_float_equal(spec_expected_tokens(1.0, 4), 5.0, 1e-12);
  assert_float_equal(spec_expected_tokens(0.0, 4), 1.0, 1e-12);
  assert_float_equal(spec_expected_tokens(0.9, 2), 1 + 0.9 + 0.81, 1e-12);
}

static void test_choose_length(void **st) {
  (void)st;
  /* Batch 1, a 10 ms step, 0.5 ms per extra token. a = 0.9: rate(k) = E(k) / (10 + 0.5 k) tokens/ms
   * peaks at k = 13 (E = 7.71, 0.4674; k = 12: 0.4661, k = 14: 0.4671). */
  assert_int_equal(spec_choose_length(0.9, 16, 1, 10e6, 0, 0.5e6), 13);
  /* The bound. */
  assert_int_equal(spec_choose_length(0.9, 4, 1, 10e6, 0, 0.5e6), 4);
  /* a = 0.04: one draft gives 1.04 / 10.5 = 0.099 < 0.1 * 1.03. */
  assert_int_equal(spec_choose_length(0.04, 8, 1, 10e6, 0, 0.5e6), 0);
  /* 32 rows costing what 32 tokens do: an extra token costs a row's share, never paid by a < 1. */
  assert_int_equal(spec_choose_length(0.9, 8, 32, 32e6, 0, 1e6), 0);
  /* A verify step's fixed cost of 4 ms: a = 0.9 still pays (k = 16 bound: 0.40 against 0.1), a = 0.3
   * does not (k = 1: 1.3 / 14.5 = 0.090 against 0.1). */
  assert_int_equal(spec_choose_length(0.3, 8, 1, 10e6, 0, 0.5e6) > 0, 1);
  assert_int_equal(spec_choose_length(0.3, 8, 1, 10e6, 4e6, 0.5e6), 0);
  assert_int_equal(spec_choose_length(0.9, 16, 1, 10e6, 4e6, 0.5e6) > 0, 1);
  /* Nothing learned yet: no drafts. */
  assert_int_equal(spec_choose_length(0.9, 8, 1, 0, 0, 0.5e6), 0);
  assert_int_equal(spec_choose_length(0.9, 8, 1, 10e6, 0, 0), 0);
}

/* propose appends drafts after the sequence's tokens, takes back drafts of an unscheduled plan, and
 * observe counts what was accepted. */
static void test_propose_and_observe(void **st) {
  (void)st;
  servd_spec sp;
  assert_int_equal(servd_spec_init(&sp, SERVD_SPEC_NGRAM, 3), 0);
  int32_t toks[32] = {1, 2, 3, 4, 5, 6, 1, 2};
  sched_seq q = {.tokens = toks, .n_tokens = 8};
  servd_spec_seq ss = {0};
  servd_spec_propose(&sp, &ss, &q, 10, 1, 0, 0, 0, true);
  assert_int_equal(q.n_draft, 3);
  assert_int_equal(q.n_tokens, 11);
  expect_tokens(toks + 8, 3, (const int32_t[]){3, 4, 5}, 3);
  expect_tokens(ss.draft, ss.n_draft, (const int32_t[]){3, 4, 5}, 3);
  /* Proposed again (the plan did not schedule it): the old drafts leave first; room bounds them. */
  servd_spec_propose(&sp, &ss, &q, 1, 1, 0, 0, 0, true);
  assert_int_equal(q.n_draft, 1);
  assert_int_equal(q.n_tokens, 9);
  servd_spec_observe(&sp, &ss, 1);
  assert_int_equal(sp.c.drafts, 1);
  assert_int_equal(sp.c.draft_tokens, 1);
  assert_int_equal(sp.c.accepted_tokens, 1);
  assert_int_equal(sp.c.accepted_per_pos[0], 1);
  servd_spec_free(&sp);

  /* Off: nothing. */
  assert_int_equal(servd_spec_init(&sp, SERVD_SPEC_OFF, 0), 0);
  q.n_tokens = 8;
  q.n_draft = 0;
  servd_spec_propose(&sp, &ss, &q, 10, 1, 10e6, 0, 0.5e6, true);
  assert_int_equal(q.n_draft, 0);
  servd_spec_free(&sp);
  /* Auto before anything was timed: every other proposal is verified with 2 drafts, so that both
   * decode and verify steps are measured. */
  assert_int_equal(servd_spec_init(&sp, SERVD_SPEC_AUTO, 0), 0);
  assert_int_equal(sp.max_draft, SERVD_SPEC_DEFAULT_DRAFT);
  servd_spec_seq fresh = {0};
  servd_spec_propose(&sp, &fresh, &q, 10, 1, 0, 0, 0, false);
  assert_int_equal(q.n_draft, 0);
  servd_spec_step(&sp);
  servd_spec_propose(&sp, &fresh, &q, 10, 1, 0, 0, 0, false);
  assert_int_equal(q.n_draft, 2);
  servd_spec_propose(&sp, &fresh, &q, 10, 1, 0, 0, 0, false); /* the same step: one row explores */
  assert_int_equal(q.n_draft, 0);
  /* Timed: a 10 ms step, 0.5 ms a draft, the prior a = 0.5: E(k) / (10 + 0.5 k) peaks at k = 3
   * (1.875 / 11.5 = 0.163; k = 2: 0.159, k = 4: 0.161). */
  servd_spec_propose(&sp, &fresh, &q, 10, 1, 10e6, 0, 0.5e6, true);
  assert_int_equal(q.n_draft, 3);
  assert_int_equal(q.n_tokens, 11);
  /* All three rejected, many times over: the request and the model learn it, and drafting stops. */
  for (int i = 0; i < 40; i++) {
    servd_spec_step(&sp);
    servd_spec_propose(&sp, &fresh, &q, 10, 1, 10e6, 0, 0.5e6, true);
    servd_spec_observe(&sp, &fresh, 0);
  }
  servd_spec_propose(&sp, &fresh, &q, 10, 1, 10e6, 0, 0.5e6, true);
  assert_int_equal(q.n_draft, 0);
  assert_int_equal(q.n_tokens, 8);
  /* ... but a turned-down proposal is tried again once in 64 steps, by one row of the step. */
  int explored = 0;
  for (int i = 0; i < 128; i++) {
    servd_spec_step(&sp);
    for (int row = 0; row < 4; row++) {
      servd_spec_propose(&sp, &fresh, &q, 10, 1, 10e6, 0, 0.5e6, true);
      explored += q.n_draft > 0;
      servd_spec_observe(&sp, &fresh, 0);
    }
  }
  assert_int_equal(explored, 2);
  servd_spec_free(&sp);
  assert_int_not_equal(servd_spec_init(&sp, SERVD_SPEC_AUTO, SERVD_SPEC_MAX_DRAFT + 1), 0);
  servd_spec_free(&sp);
}

static void test_mode_names(void **st) {
  (void)st;
  assert_int_equal(servd_spec_mode_parse("auto"), SERVD_SPEC_AUTO);
  assert_int_equal(servd_spec_mode_parse("off"), SERVD_SPEC_OFF);
  assert_int_equal(servd_spec_mode_parse("ngram"), SERVD_SPEC_NGRAM);
  assert_int_equal(servd_spec_mode_parse("suffix"), SERVD_SPEC_SUFFIX);
  assert_int_equal(servd_spec_mode_parse("draft"), -1);
  assert_int_equal(servd_spec_mode_parse(NULL), -1);
  assert_string_equal(servd_spec_mode_name(SERVD_SPEC_SUFFIX), "suffix");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ngram_most_recent_longest),
      cmocka_unit_test(test_ngram_none),
      cmocka_unit_test(test_suffix_index),
      cmocka_unit_test(test_expected_tokens),
      cmocka_unit_test(test_choose_length),
      cmocka_unit_test(test_propose_and_observe),
      cmocka_unit_test(test_mode_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
