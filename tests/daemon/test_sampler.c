/* Sampler tests: kept supports against hand computation, seed determinism, penalties against
 * hand-computed logits, logprobs against an independent long-double log-softmax, finish conditions
 * (stop strings: test_stop_matcher.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

static servd_gen_params params(void) {
  servd_gen_params p;
  memset(&p, 0, sizeof p);
  p.temperature = 1.0f;
  p.top_p = 1.0f;
  p.repetition_penalty = 1.0f;
  p.logprobs = -1;
  p.has_seed = true;
  p.seed = 42;
  return p;
}

static servd_sampler *make(const servd_gen_params *p, int n_vocab, servd_logprob_mode mode) {
  int32_t eos = 1;
  servd_sampler_config c = {.n_vocab = n_vocab, .params = p, .eos_ids = &eos, .n_eos = 1, .logprob_mode = mode};
  servd_sampler *s;
  assert_int_equal(servd_sampler_create(&c, &s), 0);
  return s;
}

/* Ten tokens with these probabilities (at temperature 1). */
static const double P10[10] = {0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.03, 0.01, 0.01};

/* Draws n tokens; counts[i] how often each id came. */
static void draw(const servd_gen_params *p, int n, int counts[10]) {
  float logits[10];
  for (int i = 0; i < 10; i++) logits[i] = (float)log(P10[i]);
  servd_sampler *s = make(p, 10, SERVD_LOGPROBS_RAW);
  memset(counts, 0, 10 * sizeof *counts);
  for (int k = 0; k < n; k++) {
    servd_sampled o;
    assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
    assert_true(o.token >= 0 && o.token < 10);
    counts[o.token]++;
  }
  servd_sampler_free(s);
}

/* Support is exactly `keep` (a bit mask) and frequencies match P10 renormalized over it: each within
 * 5 standard deviations of n * p (binomial), a bound a correct sampler fails with odds ~1e-6. */
static void expect_support(const servd_gen_params *p, unsigned keep) {
  enum { N = 20000 };
  int counts[10];
  draw(p, N, counts);
  double z = 0;
  for (int i = 0; i < 10; i++)
    if (keep & (1u << i)) z += P10[i];
  for (int i = 0; i < 10; i++) {
    if (!(keep & (1u << i))) {
      if (counts[i]) fail_msg("token %d outside the support was drawn %d times", i, counts[i]);
      continue;
    }
    double q = P10[i] / z, mean = N * q, sd = sqrt(N * q * (1 - q));
    if (fabs(counts[i] - mean) > 5 * sd)
      fail_msg("token %d drawn %d times, expected %.0f +- %.0f", i, counts[i], mean, 5 * sd);
  }
}

static void test_greedy(void **st) {
  (void)st;
  {
    /* a tiny temperature is greedy, not an overflow; an infinite logit is certain */
    servd_gen_params q = params();
    q.temperature = 1e-30f;
    float l[4] = {1e30f, 3e38f, -1.0f, 2.0f};
    servd_sampler *s = make(&q, 4, SERVD_LOGPROBS_RAW);
    servd_sampled o;
    assert_int_equal(servd_sampler_sample(s, l, &o), 0);
    assert_int_equal(o.token, 1);
    servd_sampler_free(s);
    q.temperature = 1.0f;
    float l2[4] = {0.0f, INFINITY, 5.0f, NAN};
    s = make(&q, 4, SERVD_LOGPROBS_RAW);
    for (int i = 0; i < 10; i++) {
      assert_int_equal(servd_sampler_sample(s, l2, &o), 0);
      assert_int_equal(o.token, 1);
    }
    servd_sampler_free(s);
  }
  servd_gen_params p = params();
  p.temperature = 0;
  float logits[6] = {0.1f, 2.0f, -3.0f, 2.0f, 1.9f, -INFINITY};
  servd_sampler *s = make(&p, 6, SERVD_LOGPROBS_RAW);
  servd_sampled o;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
    assert_int_equal(o.token, 1); /* tie 1 vs 3: lower id */
  }
  servd_sampler_free(s);
}

/* Which requests the engine may serve from a device's top-1 (servd_sampler_plain_greedy), and the
 * rule it then applies, checked against the sampler itself: the first index of the largest logit,
 * NaN as -inf, and token 0 when nothing is above -inf (the device's top-1 puts NaN below -inf, so
 * the engine maps "top value not above -inf" to 0). */
static void test_plain_greedy(void **st) {
  (void)st;
  servd_gen_params p = params();
  p.temperature = 0;
  servd_sampler *s = make(&p, 3, SERVD_LOGPROBS_RAW);
  assert_true(servd_sampler_plain_greedy(s));
  const float rows[][3] = {{-INFINITY, -INFINITY, -INFINITY},
                           {NAN, -INFINITY, NAN},
                           {NAN, 1.0f, 1.0f},
                           {2.0f, NAN, 3.0f}};
  const int32_t want[] = {0, 0, 1, 2};
  for (int r = 0; r < 4; r++) {
    servd_sampled o;
    assert_int_equal(servd_sampler_sample(s, rows[r], &o), 0);
    assert_int_equal(o.token, want[r]);
  }
  servd_sampler_free(s);
  /* The one-pass arg max against the full greedy path (logprobs on takes it), on rows with ties,
   * NaN, -inf and +inf: the same token every time. */
  {
    enum { N = 257 };
    servd_gen_params full = p;
    full.logprobs = 0;
    servd_sampler *a = make(&p, N, SERVD_LOGPROBS_RAW), *b = make(&full, N, SERVD_LOGPROBS_RAW);
    assert_false(servd_sampler_plain_greedy(b));
    uint32_t x = 12345;
    float row[N];
    for (int r = 0; r < 2000; r++) {
      for (int i = 0; i < N; i++) {
        x = x * 1664525u + 1013904223u;
        const uint32_t k = x >> 24;
        row[i] = k < 8 ? NAN : k < 16 ? -INFINITY : k == 16 && r % 7 == 0 ? INFINITY : (float)((x >> 8) % 64) - 32.0f;
      }
      if (r % 5 == 0)
        for (int i = 0; i < N; i++) row[i] = i % 2 ? NAN : -INFINITY; /* nothing above -inf */
      servd_sampled oa, ob;
      assert_int_equal(servd_sampler_sample(a, row, &oa), 0);
      assert_int_equal(servd_sampler_sample(b, row, &ob), 0);
      if (oa.token != ob.token) fail_msg("row %d: one-pass arg max %d, full path %d", r, oa.token, ob.token);
    }
    servd_sampler_free(a);
    servd_sampler_free(b);
  }
  struct {
    float temperature, rep, presence, frequency;
    int top_k, logprobs;
    bool plain;
  } cases[] = {
      {0, 1, 0, 0, 0, -1, true},     {1e-6f, 1, 0, 0, 0, -1, true}, {0.7f, 1, 0, 0, 1, -1, true},
      {0.7f, 1, 0, 0, 0, -1, false}, {0, 1.1f, 0, 0, 0, -1, false}, {0, 1, 0.5f, 0, 0, -1, false},
      {0, 1, 0, 0.5f, 0, -1, false}, {0, 1, 0, 0, 0, 0, false},     {0, 1, 0, 0, 0, 2, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    servd_gen_params q = params();
    q.temperature = cases[i].temperature;
    q.repetition_penalty = cases[i].rep;
    q.presence_penalty = cases[i].presence;
    q.frequency_penalty = cases[i].frequency;
    q.top_k = cases[i].top_k;
    q.logprobs = cases[i].logprobs;
    s = make(&q, 3, SERVD_LOGPROBS_RAW);
    if (servd_sampler_plain_greedy(s) != cases[i].plain)
      fail_msg("case %zu: plain greedy should be %d", i, cases[i].plain);
    servd_sampler_free(s);
  }
}

static void test_supports(void **st) {
  (void)st;
  servd_gen_params p = params();
  expect_support(&p, 0x3FF); /* plain temperature 1: everything */
  p.top_k = 3;
  expect_support(&p, 0x7); /* {0,1,2} */
  p = params();
  p.top_p = 0.55f; /* mass above token 2 is 0.5 < 0.55: kept; above token 3 is 0.65: dropped */
  expect_support(&p, 0x7);
  p.top_p = 0.45f; /* mass above token 2 is 0.5 >= 0.45: dropped */
  expect_support(&p, 0x3);
  p = params();
  p.min_p = 0.4f; /* p >= 0.12 */
  expect_support(&p, 0x7);
  p.min_p = 0.6f; /* p >= 0.18 */
  expect_support(&p, 0x3);
  /* top-k 5 then top-p 0.8 on the renormalized five (0.3 .2 .15 .1 .1)/0.85: masses above tokens
   * 3 and 4 are 0.765 and 0.882; tokens 3 and 4 tie, the lower id ranks first */
  p = params();
  p.top_k = 5;
  p.top_p = 0.8f;
  expect_support(&p, 0xF);
  /* then min-p 0.55: p >= 0.55 * 0.3 = 0.165 (the ratio to the largest survives renormalization) */
  p.min_p = 0.55f;
  expect_support(&p, 0x3);
  /* temperature 2 flattens: p ~ P10^(1/2); top-p 0.5 over sqrt weights */
  p = params();
  p.temperature = 2.0f;
  p.top_k = 2;
  int counts[10];
  draw(&p, 20000, counts);
  double q0 = sqrt(0.3) / (sqrt(0.3) + sqrt(0.2));
  assert_true(counts[0] + counts[1] == 20000);
  assert_true(fabs(counts[0] - 20000 * q0) < 5 * sqrt(20000 * q0 * (1 - q0)));
}

static void test_large_vocab_truncation(void **st) {
  (void)st;
  enum { V = 50000 };
  float *logits = malloc(V * sizeof *logits);
  /* top-k over a shuffled ramp: the kept ids are those with the k largest logits */
  for (int i = 0; i < V; i++) logits[i] = (float)((i * 7919) % V) * 1e-3f;
  servd_gen_params p = params();
  p.top_k = 50;
  p.temperature = 1e4f; /* nearly uniform over the kept set */
  servd_sampler *s = make(&p, V, SERVD_LOGPROBS_RAW);
  int distinct = 0;
  static char seen[V];
  memset(seen, 0, sizeof seen);
  for (int k = 0; k < 2000; k++) {
    servd_sampled o;
    assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
    int rank = V - 1 - (int)lroundf(logits[o.token] * 1e3f); /* 0 = largest */
    if (rank >= 50) fail_msg("top-k 50 drew rank %d", rank);
    if (!seen[o.token]++) distinct++;
  }
  assert_true(distinct == 50);
  servd_sampler_free(s);
  /* top-p over equal logits: ties rank by id, so top-p 0.5 keeps ids below 25000 (the path that sorts
   * beyond the first 1024 candidates) */
  for (int i = 0; i < V; i++) logits[i] = 0;
  p = params();
  p.top_p = 0.5f;
  s = make(&p, V, SERVD_LOGPROBS_RAW);
  int hi = 0;
  for (int k = 0; k < 400; k++) {
    servd_sampled o;
    assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
    if (o.token > 25000) fail_msg("top-p 0.5 over %d equal tokens drew id %d", V, o.token);
    if (o.token > hi) hi = o.token;
  }
  assert_true(hi > 20000);
  servd_sampler_free(s);
  free(logits);
}

static void run_seq(uint64_t seed, int32_t *out, int n) {
  enum { V = 1000 };
  static float logits[V];
  uint64_t x = 12345; /* fixed pseudo-random logits */
  servd_gen_params p = params();
  p.seed = seed;
  p.top_p = 0.9f;
  p.top_k = 100;
  servd_sampler *s = make(&p, V, SERVD_LOGPROBS_RAW);
  for (int k = 0; k < n; k++) {
    for (int i = 0; i < V; i++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      logits[i] = (float)((x >> 40) & 0xFFFF) / 8192.0f;
    }
    servd_sampled o;
    assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
    servd_sampler_accept(s, o.token);
    out[k] = o.token;
  }
  servd_sampler_free(s);
}

/* Two samplers sharing one scratch, used alternately, give the tokens each gives alone. */
static void test_shared_scratch(void **st) {
  (void)st;
  int32_t alone_a[50], alone_b[50];
  run_seq(11, alone_a, 50);
  run_seq(12, alone_b, 50);
  enum { V = 1000 };
  servd_sampler_scratch *x;
  assert_int_equal(servd_sampler_scratch_create(V, &x), 0);
  servd_gen_params pa = params(), pb = params();
  pa.seed = 11, pb.seed = 12;
  pa.top_p = pb.top_p = 0.9f;
  pa.top_k = pb.top_k = 100;
  servd_sampler_config ca = {.n_vocab = V, .params = &pa, .scratch = x}, cb = ca;
  cb.params = &pb;
  servd_sampler *a, *b;
  assert_int_equal(servd_sampler_create(&ca, &a), 0);
  assert_int_equal(servd_sampler_create(&cb, &b), 0);
  static float logits[V];
  uint64_t r = 12345; /* the same logits stream as run_seq */
  for (int k = 0; k < 50; k++) {
    for (int i = 0; i < V; i++) {
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      logits[i] = (float)((r >> 40) & 0xFFFF) / 8192.0f;
    }
    servd_sampled oa, ob;
    assert_int_equal(servd_sampler_sample(a, logits, &oa), 0);
    servd_sampler_accept(a, oa.token);
    assert_int_equal(servd_sampler_sample(b, logits, &ob), 0);
    servd_sampler_accept(b, ob.token);
    assert_int_equal(oa.token, alone_a[k]);
    assert_int_equal(ob.token, alone_b[k]);
  }
  servd_sampler_free(a);
  servd_sampler_free(b);
  servd_sampler_scratch_free(x);
}

static void test_seed(void **st) {
  (void)st;
  int32_t a[200], b[200], c[200];
  run_seq(7, a, 200);
  run_seq(7, b, 200);
  run_seq(8, c, 200);
  assert_memory_equal(a, b, sizeof a);
  int diff = 0;
  for (int i = 0; i < 200; i++) diff += a[i] != c[i];
  assert_true(diff > 100);
}

/* log-softmax in long double, by a different route than the sampler: log(p_i) with p_i computed as
 * 1 / sum_j exp(x_j - x_i). */
static long double ref_logprob(const double *x, int n, int i) {
  long double s = 0;
  for (int j = 0; j < n; j++) s += expl((long double)x[j] - (long double)x[i]);
  return -logl(s);
}

static void test_penalties(void **st) {
  (void)st;
  servd_gen_params p = params();
  p.temperature = 0; /* greedy; processed logprobs then use temperature 1 */
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.1f;
  p.logprobs = 5;
  float logits[5] = {2.0f, -1.0f, 0.5f, 3.0f, 0.25f};
  servd_sampler *s = make(&p, 5, SERVD_LOGPROBS_PROCESSED);
  int32_t prompt[2] = {0, 1};
  servd_sampler_add_prompt(s, prompt, 2);
  servd_sampler_accept(s, 2);
  servd_sampler_accept(s, 2);
  servd_sampler_accept(s, 3);
  /* by hand: 0: 2/2 = 1 (prompt only: no presence/frequency); 1: -1*2 = -2;
   * 2: 0.5/2 - 0.5 - 2*0.1 = -0.45; 3: 3/2 - 0.5 - 0.1 = 0.9; 4: unseen 0.25 */
  const double want[5] = {1.0, -2.0, -0.45, 0.9, 0.25};
  servd_sampled o;
  assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
  assert_int_equal(o.token, 0); /* 1.0 is now the largest */
  assert_int_equal(o.n_top, 5);
  /* tolerance: float32 logits and logprobs, |values| < 4: a few ulps of 4 is ~1e-6 */
  const int order[5] = {0, 3, 4, 2, 1};
  for (int k = 0; k < 5; k++) {
    assert_int_equal(o.top[k].token, order[k]);
    assert_true(fabsl(o.top[k].logprob - ref_logprob(want, 5, order[k])) < 2e-6L);
  }
  assert_true(fabsl(o.logprob - ref_logprob(want, 5, 0)) < 2e-6L);
  servd_sampler_free(s);
}

static void test_logprobs_raw(void **st) {
  (void)st;
  enum { V = 3000 };
  float *logits = malloc(V * sizeof *logits);
  double *x = malloc(V * sizeof *x);
  uint64_t r = 99;
  for (int i = 0; i < V; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    logits[i] = (float)((double)(r >> 11) * 0x1.0p-53 * 30.0 - 15.0);
    x[i] = logits[i];
  }
  servd_gen_params p = params();
  p.temperature = 0.7f;
  p.repetition_penalty = 1.3f;
  p.logprobs = 20;
  servd_sampler *s = make(&p, V, SERVD_LOGPROBS_RAW);
  servd_sampler_accept(s, 5); /* penalties must not touch RAW logprobs */
  servd_sampled o;
  assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
  assert_int_equal(o.n_top, 20);
  /* reference top 20 by selection in the test */
  int used[20];
  for (int k = 0; k < 20; k++) {
    int best = -1;
    for (int i = 0; i < V; i++) {
      bool taken = false;
      for (int q = 0; q < k; q++) taken |= used[q] == i;
      if (!taken && (best < 0 || x[i] > x[best])) best = i;
    }
    used[k] = best;
    assert_int_equal(o.top[k].token, best);
    /* tolerance: |logprob| < 40 in float32 (ulp 4e-6) */
    assert_true(fabsl(o.top[k].logprob - ref_logprob(x, V, best)) < 1e-5L);
  }
  assert_true(fabsl(o.logprob - ref_logprob(x, V, o.token)) < 1e-5L);
  servd_sampler_free(s);
  free(logits);
  free(x);
}

static void test_finish(void **st) {
  (void)st;
  servd_gen_params p = params();
  int32_t stop_ids[2] = {7, 8};
  p.stop_token_ids = stop_ids;
  p.n_stop_token_ids = 2;
  p.max_tokens = 3;
  servd_sampler *s = make(&p, 10, SERVD_LOGPROBS_RAW);
  servd_sampler_accept(s, 4);
  assert_int_equal(servd_sampler_finish(s, 4), SERVD_FINISH_NONE);
  assert_int_equal(servd_sampler_finish(s, 1), SERVD_FINISH_EOS);
  assert_int_equal(servd_sampler_finish(s, 8), SERVD_FINISH_STOP_TOKEN);
  servd_sampler_accept(s, 4);
  servd_sampler_accept(s, 4);
  assert_int_equal(servd_sampler_finish(s, 4), SERVD_FINISH_LENGTH);
  servd_sampler_free(s);
  p.ignore_eos = true;
  s = make(&p, 10, SERVD_LOGPROBS_RAW);
  assert_int_equal(servd_sampler_finish(s, 1), SERVD_FINISH_NONE);
  servd_sampler_free(s);
}

static void test_bad_params(void **st) {
  (void)st;
  servd_sampler *s;
  servd_gen_params p = params();
  servd_sampler_config c = {.n_vocab = 10, .params = &p};
  p.top_p = 0;
  assert_int_equal(servd_sampler_create(&c, &s), SERVD_EINVAL);
  p = params();
  p.temperature = -1;
  assert_int_equal(servd_sampler_create(&c, &s), SERVD_EINVAL);
  p = params();
  p.logprobs = 21;
  assert_int_equal(servd_sampler_create(&c, &s), SERVD_EINVAL);
  p = params();
  int32_t bad = 10;
  p.stop_token_ids = &bad;
  p.n_stop_token_ids = 1;
  assert_int_equal(servd_sampler_create(&c, &s), SERVD_EINVAL);
  p = params();
  p.repetition_penalty = 0;
  assert_int_equal(servd_sampler_create(&c, &s), SERVD_EINVAL);
  servd_sampler_free(NULL);
}

/* ---- kept sets against a brute-force reference ----------------------------------------------------
 * The reference follows the definitions literally: long-double softmax, a full sort (value desc, id
 * asc), top-k, then top-p over the renormalized top-k set (a token stays while the mass ranked above it
 * is < p), then min-p (p_i >= min_p * p_max). Cases whose top-p or min-p boundary lies within 1e-5 of
 * a decision are skipped: float and long double may then legitimately disagree. */
typedef struct rc {
  long double v;
  int id;
} rcand;

static int rc_cmp(const void *a, const void *b) {
  const rcand *x = a, *y = b;
  if (x->v != y->v) return x->v > y->v ? -1 : 1;
  return x->id - y->id;
}

static int int_cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Returns the kept count into out (ascending), or -1 for an ambiguous case. */
static int reference_kept(const float *logits, int n, float temp, int top_k, float top_p, float min_p, int *out) {
  rcand *c = malloc((size_t)n * sizeof *c);
  int nc = 0;
  long double mx = -INFINITY;
  for (int i = 0; i < n; i++) {
    if (isinf(logits[i])) continue;                           /* -inf: probability 0 */
    long double v = (long double)(logits[i] * (1.0f / temp)); /* the same float scaling as the sampler */
    c[nc++] = (rcand){v, i};
    if (v > mx) mx = v;
  }
  /* tokens more than 87 below the maximum underflow float and are never candidates (sampler.h) */
  int k2 = 0;
  for (int i = 0; i < nc; i++)
    if (c[i].v - mx >= -87.0L) c[k2++] = c[i];
  nc = k2;
  qsort(c, (size_t)nc, sizeof *c, rc_cmp);
  if (top_k > 0 && top_k < nc) nc = top_k;
  long double z = 0;
  for (int i = 0; i < nc; i++) z += expl(c[i].v - mx);
  int keep = nc;
  if (top_p < 1.0f) {
    long double cum = 0, target = (long double)top_p * z;
    keep = 0;
    while (keep < nc && cum < target) {
      cum += expl(c[keep].v - mx);
      keep++;
    }
    if (fabsl(cum - target) < 1e-5L * z) keep = -1; /* the last kept token lands on the boundary */
    else if (keep > 0 && fabsl(cum - expl(c[keep - 1].v - mx) - target) < 1e-5L * z) keep = -1;
  }
  int m = 0;
  if (keep >= 0) {
    for (int i = 0; i < keep; i++) {
      long double ratio = expl(c[i].v - mx); /* p_i / p_max */
      if (min_p > 0 && fabsl(ratio - min_p) < 1e-5L) {
        m = -1;
        break;
      }
      if (min_p <= 0 || ratio >= min_p) out[m++] = c[i].id;
    }
    if (m == 0) out[m++] = c[0].id;
  } else {
    m = -1;
  }
  free(c);
  if (m > 0) qsort(out, (size_t)m, sizeof *out, int_cmp);
  return m;
}

static void test_kept_sets(void **st) {
  (void)st;
  enum { V = 4096 };
  float *logits = malloc(V * sizeof *logits);
  int *want = malloc(V * sizeof *want);
  int32_t *got = malloc(V * sizeof *got);
  uint64_t r = 2024;
  int checked = 0, skipped = 0;
  const int ks[] = {0, 1, 2, 5, 40, 100, 1000, 5000};
  const float ps[] = {1.0f, 0.93f, 0.61f, 0.37f, 0.11f};
  const float mps[] = {0.0f, 0.013f, 0.07f, 0.33f};
  const float temps[] = {1.0f, 0.7f, 1.9f};
  for (int trial = 0; trial < 300; trial++) {
    int shape = trial % 4;
    for (int i = 0; i < V; i++) {
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      double u = (double)(r >> 11) * 0x1.0p-53;
      double g = -log(-log(u + 1e-300) + 1e-300); /* Gumbel: a heavy upper tail like real logits */
      float x = (float)(shape == 0 ? g : shape == 1 ? 4 * g : shape == 2 ? floor(g * 2) / 2 : g * 0.1);
      if (shape == 2 && i % 97 == 0) x = -INFINITY; /* masked tokens */
      logits[i] = x;
    }
    servd_gen_params p = params();
    p.top_k = ks[(trial / 4) % 8];
    p.top_p = ps[(trial / 32) % 5];
    p.min_p = mps[(trial / 7) % 4];
    p.temperature = temps[trial % 3];
    if (p.top_k == 1) p.top_k = 2; /* top_k 1 is greedy */
    int m = reference_kept(logits, V, p.temperature, p.top_k, p.top_p, p.min_p, want);
    if (m < 0) {
      skipped++;
      continue;
    }
    servd_sampler *s = make(&p, V, SERVD_LOGPROBS_RAW);
    int n;
    assert_int_equal(servd_sampler_kept(s, logits, got, &n), 0);
    if (n != m)
      fail_msg("trial %d (shape %d k %d p %g min_p %g T %g): kept %d, reference %d", trial, shape, p.top_k,
               (double)p.top_p, (double)p.min_p, (double)p.temperature, n, m);
    for (int i = 0; i < n; i++)
      if (got[i] != want[i]) fail_msg("trial %d: kept set differs at %d: %d vs %d", trial, i, got[i], want[i]);
    /* and draws only ever come from that set */
    for (int d = 0; d < 20; d++) {
      servd_sampled o;
      assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
      assert_non_null(bsearch(&o.token, got, (size_t)n, sizeof *got, int_cmp));
    }
    servd_sampler_free(s);
    checked++;
  }
  fprintf(stderr, "kept sets: %d cases checked, %d on a boundary skipped\n", checked, skipped);
  assert_true(checked > 250);
  free(logits);
  free(want);
  free(got);
}

/* logit_bias is added to the raw logits before the repetition penalty and temperature (OpenAI): the
 * processed distribution against one computed by hand. */
static void test_logit_bias(void **st) {
  (void)st;
  servd_gen_params p = params();
  p.temperature = 0.5f;
  p.repetition_penalty = 2.0f;
  p.logprobs = 5;
  servd_logit_bias bias[3] = {{0, 1.0f}, {3, -100.0f}, {4, 0.75f}};
  p.logit_bias = bias;
  p.n_logit_bias = 3;
  float logits[5] = {2.0f, -1.0f, 0.5f, 3.0f, 0.25f};
  servd_sampler *s = make(&p, 5, SERVD_LOGPROBS_PROCESSED);
  assert_false(servd_sampler_plain_greedy(s));
  int32_t prompt[2] = {0, 4};
  servd_sampler_add_prompt(s, prompt, 2);
  /* by hand: 0: (2 + 1) / 2 = 1.5; 1: -1; 2: 0.5; 3: 3 - 100 = -97; 4: (0.25 + 0.75) / 2 = 0.5;
   * then / 0.5 */
  const double want[5] = {3.0, -2.0, 1.0, -194.0, 1.0};
  servd_sampled o;
  assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
  assert_int_equal(o.n_top, 5);
  const int order[5] = {0, 2, 4, 1, 3};
  for (int k = 0; k < 5; k++) {
    assert_int_equal(o.top[k].token, order[k]);
    /* tolerance: float32 values up to 200 (ulp 1.5e-5) */
    assert_true(fabsl(o.top[k].logprob - ref_logprob(want, 5, order[k])) < 1e-4L);
  }
  servd_sampler_free(s);

  /* -100 bans in practice: never drawn, the others keep their relative frequencies */
  p = params();
  servd_logit_bias ban = {0, -100.0f};
  p.logit_bias = &ban;
  p.n_logit_bias = 1;
  expect_support(&p, 0x3FEu);
  /* +log 3 triples a token's odds: token 9 (0.01) becomes three times as likely as 8 */
  servd_logit_bias dbl = {9, (float)log(3.0)};
  p.logit_bias = &dbl;
  int counts[10];
  enum { N = 40000 };
  draw(&p, N, counts);
  double z = 1.0 + 0.02, q9 = 0.03 / z, q8 = 0.01 / z;
  assert_true(fabs(counts[9] - N * q9) < 5 * sqrt(N * q9 * (1 - q9)));
  assert_true(fabs(counts[8] - N * q8) < 5 * sqrt(N * q8 * (1 - q8)));

  /* ids outside the vocabulary and too many entries are refused */
  servd_logit_bias out = {10, 1.0f};
  p.logit_bias = &out;
  int32_t eos = 1;
  servd_sampler_config c = {.n_vocab = 10, .params = &p, .eos_ids = &eos, .n_eos = 1};
  assert_int_equal(servd_sampler_create(&c, &s), SERVD_EINVAL);
  p.n_logit_bias = SERVD_MAX_LOGIT_BIAS + 1;
  assert_int_equal(servd_sampler_create(&c, &s), SERVD_EINVAL);
}

/* min_tokens: end-of-sequence and stop ids are masked and end nothing until that many tokens. */
static void test_min_tokens(void **st) {
  (void)st;
  servd_gen_params p = params();
  p.temperature = 0;
  int32_t stop_ids[1] = {7};
  p.stop_token_ids = stop_ids;
  p.n_stop_token_ids = 1;
  p.min_tokens = 3;
  float logits[10] = {0, 10.0f, 0, 0, 0, 0, 0, 9.0f, 8.0f, 0}; /* eos (1) first, then stop id 7 */
  servd_sampler *s = make(&p, 10, SERVD_LOGPROBS_RAW);
  for (int k = 0; k < 3; k++) {
    assert_false(servd_sampler_plain_greedy(s)); /* the eos row would win a plain arg max */
    servd_sampled o;
    assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
    assert_int_equal(o.token, 8);
    servd_sampler_accept(s, o.token);
    assert_int_equal(servd_sampler_finish(s, 1), SERVD_FINISH_NONE); /* even if it were drawn */
    assert_int_equal(servd_sampler_finish(s, 7), SERVD_FINISH_NONE);
  }
  assert_true(servd_sampler_plain_greedy(s));
  servd_sampled o;
  assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
  assert_int_equal(o.token, 1);
  servd_sampler_accept(s, o.token);
  assert_int_equal(servd_sampler_finish(s, 1), SERVD_FINISH_EOS);
  assert_int_equal(servd_sampler_finish(s, 7), SERVD_FINISH_STOP_TOKEN);
  servd_sampler_free(s);

  /* ignore_eos leaves the eos id to the model, the stop id stays masked */
  p.ignore_eos = true;
  s = make(&p, 10, SERVD_LOGPROBS_RAW);
  assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
  assert_int_equal(o.token, 1);
  servd_sampler_free(s);
}

/* Constrained rows: a step's token mask against a reference that reads it bit by bit. Greedy (the
 * fast masked arg max, and the full path that logprobs take) gives the lowest-id largest logit among
 * the allowed tokens, NaN never, and an error when no allowed logit is above -inf; a draw at
 * temperature 1 only ever gives an allowed token; the mask applies to one step only. Masks of every
 * shape a grammar makes: empty words, full words, sparse bits, one token, a last partial word. */
static bool allowed(const uint32_t *mask, int i) { return mask[i / 32] >> (i % 32) & 1; }

static int32_t reference_masked_argmax(const float *logits, const uint32_t *mask, int n) {
  int32_t tok = -1;
  for (int i = 0; i < n; i++)
    if (allowed(mask, i) && logits[i] == logits[i] && logits[i] > -INFINITY && (tok < 0 || logits[i] > logits[tok]))
      tok = i;
  return tok;
}

static void fill_mask(uint32_t *mask, int words, int shape, uint64_t *r) {
  for (int k = 0; k < words; k++) {
    *r = *r * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t x = (uint32_t)(*r >> 32);
    switch (shape) {
    case 0: mask[k] = k % 3 ? UINT32_MAX : x; break;                    /* mostly full words */
    case 1: mask[k] = k % 5 == 2 ? x & (x >> 7) & (x >> 13) : 0; break; /* sparse: a regex's */
    case 2: mask[k] = x; break;                                         /* half the bits */
    default: mask[k] = k == words / 2 ? 1u << (x % 32) : 0; break;      /* one token */
    }
  }
}

static void test_masks(void **st) {
  (void)st;
  uint64_t r = 77;
  const int vocabs[] = {1000, 4096}; /* 1000: a last word of 8 tokens */
  for (int vi = 0; vi < 2; vi++) {
    const int V = vocabs[vi], words = (V + 31) / 32;
    float *logits = malloc((size_t)V * sizeof *logits);
    uint32_t *mask = malloc((size_t)words * sizeof *mask);
    assert_non_null(logits);
    assert_non_null(mask);
    for (int trial = 0; trial < 200; trial++) {
      for (int i = 0; i < V; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        float x = (float)((r >> 40) % 64) / 8; /* ties */
        logits[i] = i % 89 == 0 ? NAN : i % 53 == 0 ? -INFINITY : x;
      }
      servd_gen_params p = params();
      p.temperature = 0;
      p.logprobs = trial % 2 ? 2 : -1; /* the fast path, and the full one */
      int32_t eos = 1;
      servd_sampler_config c =
          {.n_vocab = V, .params = &p, .eos_ids = &eos, .n_eos = 1, .logprob_mode = SERVD_LOGPROBS_RAW, .masked = true};
      servd_sampler *s;
      assert_int_equal(servd_sampler_create(&c, &s), 0);
      fill_mask(mask, words, trial % 4, &r);
      if (trial % 50 == 7) memset(mask, 0, (size_t)words * sizeof *mask); /* nothing allowed */
      int32_t want = reference_masked_argmax(logits, mask, V);
      int nw;
      memcpy(servd_sampler_mask(s, &nw), mask, (size_t)words * sizeof *mask);
      assert_int_equal(nw, words);
      servd_sampler_mask_ready(s);
      servd_sampled o;
      int rc = servd_sampler_sample(s, logits, &o);
      if (want < 0) {
        assert_int_equal(rc, SERVD_EINVAL);
      } else {
        assert_int_equal(rc, 0);
        assert_int_equal(o.token, want);
      }
      /* the next step without a new mask is unconstrained */
      assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
      int32_t free_max = -1;
      for (int i = 0; i < V; i++)
        if (logits[i] == logits[i] && (free_max < 0 || logits[i] > logits[free_max])) free_max = i;
      assert_int_equal(o.token, free_max);
      servd_sampler_free(s);

      if (want < 0) continue;
      p.temperature = 1.0f;
      p.top_p = trial % 3 ? 1.0f : 0.9f;
      assert_int_equal(servd_sampler_create(&c, &s), 0);
      uint32_t *m2 = servd_sampler_mask(s, &nw);
      for (int k = 0; k < 20; k++) {
        memcpy(m2, mask, (size_t)words * sizeof *mask);
        servd_sampler_mask_ready(s);
        assert_int_equal(servd_sampler_sample(s, logits, &o), 0);
        assert_true(allowed(mask, o.token));
      }
      servd_sampler_free(s);
    }
    free(logits);
    free(mask);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy),         cmocka_unit_test(test_plain_greedy),
      cmocka_unit_test(test_supports),       cmocka_unit_test(test_large_vocab_truncation),
      cmocka_unit_test(test_seed),           cmocka_unit_test(test_penalties),
      cmocka_unit_test(test_logprobs_raw),   cmocka_unit_test(test_finish),
      cmocka_unit_test(test_bad_params),     cmocka_unit_test(test_kept_sets),
      cmocka_unit_test(test_shared_scratch), cmocka_unit_test(test_logit_bias),
      cmocka_unit_test(test_min_tokens),     cmocka_unit_test(test_masks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
