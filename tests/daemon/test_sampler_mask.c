/* The sampler's token mask (constrained decoding): masked tokens are never drawn, greedy or not,
 * the mask applies to one sample only, penalties and truncation act on the allowed tokens alone,
 * and a mask that allows nothing is an error, never token 0. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

enum { V = 70 }; /* three mask words, the last one partial */

static servd_gen_params params(float temperature) {
  servd_gen_params p;
  memset(&p, 0, sizeof p);
  p.temperature = temperature;
  p.top_p = 1.0f;
  p.repetition_penalty = 1.0f;
  p.logprobs = -1;
  p.has_seed = true;
  p.seed = 7;
  return p;
}

static servd_sampler *make(const servd_gen_params *p, bool masked) {
  int32_t eos = 1;
  servd_sampler_config c = {.n_vocab = V, .params = p, .eos_ids = &eos, .n_eos = 1, .masked = masked};
  servd_sampler *s;
  assert_int_equal(servd_sampler_create(&c, &s), 0);
  return s;
}

static void allow_only(servd_sampler *s, const int *ids, int n) {
  int nw;
  uint32_t *m = servd_sampler_mask(s, &nw);
  assert_non_null(m);
  assert_int_equal(nw, (V + 31) / 32);
  memset(m, 0, (size_t)nw * sizeof *m);
  for (int i = 0; i < n; i++) m[ids[i] / 32] |= 1u << (ids[i] % 32);
  servd_sampler_mask_ready(s);
}

static void ramp(float *logits) {
  for (int i = 0; i < V; i++) logits[i] = (float)i * 0.1f; /* the last token is the arg max */
}

static void test_unmasked_has_no_mask(void **st) {
  (void)st;
  servd_gen_params p = params(0);
  servd_sampler *s = make(&p, false);
  int nw = -1;
  assert_null(servd_sampler_mask(s, &nw));
  assert_int_equal(nw, 0);
  assert_true(servd_sampler_plain_greedy(s));
  servd_sampler_free(s);
  s = make(&p, true);
  assert_false(servd_sampler_plain_greedy(s)); /* a guided row needs its whole logits row */
  servd_sampler_free(s);
}

static void test_greedy_takes_best_allowed(void **st) {
  (void)st;
  servd_gen_params p = params(0);
  servd_sampler *s = make(&p, true);
  float logits[V];
  ramp(logits);
  int allowed[] = {3, 40, 64};
  allow_only(s, allowed, 3);
  servd_sampled o;
  assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
  assert_int_equal(o.token, 64);
  /* One sample only: without a new mask the next draw is free again. */
  assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
  assert_int_equal(o.token, V - 1);
  servd_sampler_free(s);
}

static void test_sampling_never_leaves_the_mask(void **st) {
  (void)st;
  servd_gen_params p = params(1.5f);
  p.top_p = 0.9f;
  p.repetition_penalty = 1.3f;
  servd_sampler *s = make(&p, true);
  float logits[V];
  ramp(logits);
  logits[5] = 50.0f; /* overwhelmingly likely, but masked out below */
  int allowed[] = {0, 31, 32, 33, 69};
  int seen[V] = {0};
  for (int k = 0; k < 2000; k++) {
    allow_only(s, allowed, 5);
    servd_sampled o;
    assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
    assert_true(o.token == 0 || o.token == 31 || o.token == 32 || o.token == 33 || o.token == 69);
    seen[o.token]++;
    servd_sampler_accept(s, o.token);
  }
  assert_true(seen[69] > 0 && seen[31] + seen[32] + seen[33] > 0); /* the draw still spans the allowed set */
  servd_sampler_free(s);
}

static void test_kept_is_the_allowed_set(void **st) {
  (void)st;
  servd_gen_params p = params(1.0f);
  servd_sampler *s = make(&p, true);
  float logits[V];
  for (int i = 0; i < V; i++) logits[i] = 0;
  int allowed[] = {2, 35, 66, 67};
  allow_only(s, allowed, 4);
  int32_t ids[V];
  int n = 0;
  assert_int_equal(servd_sampler_kept(s, logits, ids, &n), 0);
  assert_int_equal(n, 4);
  for (int i = 0; i < 4; i++) assert_int_equal(ids[i], allowed[i]);
  servd_sampler_free(s);
}

static void test_nothing_allowed_is_an_error(void **st) {
  (void)st;
  servd_gen_params p = params(0);
  servd_sampler *s = make(&p, true);
  float logits[V];
  ramp(logits);
  logits[7] = NAN;
  int allowed[] = {7}; /* only a NaN logit: nothing the model can produce */
  allow_only(s, allowed, 1);
  servd_sampled o;
  assert_int_equal(servd_sampler_sample(s, logits, &o), SERVD_EINVAL);
  servd_sampler_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unmasked_has_no_mask),           cmocka_unit_test(test_greedy_takes_best_allowed),
      cmocka_unit_test(test_sampling_never_leaves_the_mask), cmocka_unit_test(test_kept_is_the_allowed_set),
      cmocka_unit_test(test_nothing_allowed_is_an_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
