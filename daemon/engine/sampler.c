/* Token sampling (see sampler.h for the order of operations and the logprob convention). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "engine/sampler.h"

typedef struct cand {
  float v; /* processed logit */
  float e; /* exp(v - max) */
  int32_t id;
} cand;

struct servd_sampler {
  int n_vocab;
  servd_gen_params p; /* stop strings not kept */
  int32_t *stop_ids;
  int n_stop_ids;
  servd_logit_bias *bias; /* logit_bias, copied */
  int n_bias;
  int32_t eos[8];
  int n_eos;
  servd_logprob_mode lp_mode;
  uint64_t rng[4];
  /* penalties */
  int32_t *count;    /* (n_vocab) occurrences in the output */
  uint8_t *seen;     /* (n_vocab) 1: prompt, 2: output */
  int32_t *seen_ids; /* distinct ids with seen != 0 */
  int n_seen;
  int n_generated;
  /* per-step scratch: the sampler's own, or borrowed from a servd_sampler_scratch */
  float *work; /* (n_vocab) processed logits */
  float *prob; /* (n_vocab) exp(work - max), or of the raw logits for their logprobs */
  cand *cand;  /* (n_vocab) */
  servd_sampler_scratch *own;
  servd_top_logprob top[SERVD_SAMPLER_MAX_TOP];
  uint32_t *mask;  /* (ceil(n_vocab / 32)) allowed tokens, when masked */
  bool mask_ready; /* mask holds this step's constraint */
};

struct servd_sampler_scratch {
  int n_vocab;
  float *work, *prob;
  cand *cand;
};

int servd_sampler_scratch_create(int n_vocab, servd_sampler_scratch **out) {
  *out = NULL;
  if (n_vocab <= 0) return servd_fail(SERVD_EINVAL, "sampler: scratch for n_vocab %d <= 0", n_vocab);
  servd_sampler_scratch *x = calloc(1, sizeof *x);
  if (!x) return servd_fail(SERVD_ENOMEM, "sampler: out of memory");
  x->n_vocab = n_vocab;
  x->work = malloc((size_t)n_vocab * sizeof *x->work);
  x->prob = malloc((size_t)n_vocab * sizeof *x->prob);
  x->cand = malloc((size_t)n_vocab * sizeof *x->cand);
  if (!x->work || !x->prob || !x->cand) {
    servd_sampler_scratch_free(x);
    return servd_fail(SERVD_ENOMEM, "sampler: out of memory for a vocabulary of %d", n_vocab);
  }
  *out = x;
  return 0;
}

void servd_sampler_scratch_free(servd_sampler_scratch *x) {
  if (!x) return;
  free(x->work);
  free(x->prob);
  free(x->cand);
  free(x);
}

/* ---- xoshiro256** ------------------------------------------------------------------------------ */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t *s) {
  uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return r;
}

static double uniform01(uint64_t *s) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

/* ---- create / free ------------------------------------------------------------------------------ */
int servd_sampler_create(const servd_sampler_config *c, servd_sampler **out) {
  *out = NULL;
  const servd_gen_params *p = c->params;
  if (!p || c->n_vocab <= 0) return servd_fail(SERVD_EINVAL, "sampler: params missing or n_vocab %d <= 0", c->n_vocab);
  if (!(p->temperature >= 0) || !isfinite(p->temperature))
    return servd_fail(SERVD_EINVAL, "sampler: temperature %g: expected a finite value >= 0", (double)p->temperature);
  if (!(p->top_p > 0 && p->top_p <= 1))
    return servd_fail(SERVD_EINVAL, "sampler: top_p %g: expected a value in (0, 1]", (double)p->top_p);
  if (!(p->min_p >= 0 && p->min_p <= 1))
    return servd_fail(SERVD_EINVAL, "sampler: min_p %g: expected a value in [0, 1]", (double)p->min_p);
  if (!(p->repetition_penalty > 0) || !isfinite(p->repetition_penalty))
    return servd_fail(SERVD_EINVAL, "sampler: repetition_penalty %g: expected a finite value > 0",
                      (double)p->repetition_penalty);
  if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
    return servd_fail(SERVD_EINVAL, "sampler: presence/frequency penalty must be finite");
  if (p->logprobs > SERVD_SAMPLER_MAX_TOP)
    return servd_fail(SERVD_EINVAL, "sampler: logprobs %d: at most %d top tokens", p->logprobs, SERVD_SAMPLER_MAX_TOP);
  if (c->n_eos < 0 || c->n_eos > 8) return servd_fail(SERVD_EINVAL, "sampler: %d eos ids: at most 8", c->n_eos);
  if (p->n_logit_bias < 0 || p->n_logit_bias > SERVD_MAX_LOGIT_BIAS || (p->n_logit_bias && !p->logit_bias))
    return servd_fail(SERVD_EINVAL, "sampler: %d logit_bias entries: at most %d", p->n_logit_bias,
                      SERVD_MAX_LOGIT_BIAS);
  for (int i = 0; i < p->n_logit_bias; i++)
    if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= c->n_vocab || !isfinite(p->logit_bias[i].bias))
      return servd_fail(SERVD_EINVAL, "sampler: logit_bias for token %d: outside the vocabulary (%d) or not finite",
                        p->logit_bias[i].token, c->n_vocab);
  for (int i = 0; i < p->n_stop_token_ids; i++)
    if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= c->n_vocab)
      return servd_fail(SERVD_EINVAL, "sampler: stop_token_ids[%d] = %d is outside the vocabulary (%d)", i,
                        p->stop_token_ids[i], c->n_vocab);

  int rc = 0;
  servd_sampler *s = calloc(1, sizeof *s);
  if (!s) return servd_fail(SERVD_ENOMEM, "sampler: out of memory");
  size_t n = (size_t)c->n_vocab;
  s->n_vocab = c->n_vocab;
  s->p = *p;
  s->p.stop = NULL;
  s->p.n_stop = 0;
  s->lp_mode = c->logprob_mode;
  s->count = calloc(n, sizeof *s->count);
  s->seen = calloc(n, 1);
  s->seen_ids = malloc(n * sizeof *s->seen_ids);
  servd_sampler_scratch *x = c->scratch;
  if (x && x->n_vocab < c->n_vocab) {
    rc = servd_fail(SERVD_EINVAL, "sampler: scratch for %d tokens, vocabulary of %d", x->n_vocab, c->n_vocab);
    goto fail;
  }
  if (!x && (rc = servd_sampler_scratch_create(c->n_vocab, &s->own))) goto fail;
  if (!x) x = s->own;
  s->work = x->work;
  s->prob = x->prob;
  s->cand = x->cand;
  s->stop_ids = malloc(((size_t)p->n_stop_token_ids + 1) * sizeof *s->stop_ids);
  if (c->masked) s->mask = calloc((n + 31) / 32, sizeof *s->mask);
  s->bias = malloc(((size_t)p->n_logit_bias + 1) * sizeof *s->bias);
  if (!s->count || !s->seen || !s->seen_ids || !s->stop_ids || !s->bias || (c->masked && !s->mask)) {
    rc = servd_fail(SERVD_ENOMEM, "sampler: out of memory for a vocabulary of %d", c->n_vocab);
    goto fail;
  }
  if (p->n_stop_token_ids) memcpy(s->stop_ids, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof(int32_t));
  s->n_stop_ids = p->n_stop_token_ids;
  s->p.stop_token_ids = NULL;
  if (p->n_logit_bias) memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
  s->n_bias = p->n_logit_bias;
  s->p.logit_bias = NULL;
  s->n_eos = c->n_eos;
  if (c->n_eos) memcpy(s->eos, c->eos_ids, (size_t)c->n_eos * sizeof(int32_t));

  uint64_t seed = p->seed;
  if (!p->has_seed) {
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)s;
    }
  }
  for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&seed);
  *out = s;
  return 0;
fail:
  servd_sampler_free(s);
  return rc;
}

void servd_sampler_free(servd_sampler *s) {
  if (!s) return;
  free(s->count);
  free(s->seen);
  free(s->seen_ids);
  servd_sampler_scratch_free(s->own);
  free(s->stop_ids);
  free(s->mask);
  free(s->bias);
  free(s);
}

uint32_t *servd_sampler_mask(servd_sampler *s, int *n_words) {
  *n_words = s->mask ? (s->n_vocab + 31) / 32 : 0;
  return s->mask;
}

void servd_sampler_mask_ready(servd_sampler *s) { s->mask_ready = s->mask != NULL; }

static void mark_seen(servd_sampler *s, int32_t id, uint8_t bit) {
  if (!s->seen[id]) s->seen_ids[s->n_seen++] = id;
  s->seen[id] |= bit;
}

void servd_sampler_add_prompt(servd_sampler *s, const int32_t *ids, int n) {
  for (int i = 0; i < n; i++)
    if (ids[i] >= 0 && ids[i] < s->n_vocab) mark_seen(s, ids[i], 1);
}

void servd_sampler_accept(servd_sampler *s, int32_t token) {
  s->n_generated++;
  if (token < 0 || token >= s->n_vocab) return;
  mark_seen(s, token, 2);
  s->count[token]++;
}

int servd_sampler_n_generated(const servd_sampler *s) { return s->n_generated; }

/* min_tokens: end-of-sequence and stop ids neither end generation nor (prepare) get sampled yet. */
static bool before_min(const servd_sampler *s) { return s->n_generated < s->p.min_tokens; }

servd_finish servd_sampler_finish(const servd_sampler *s, int32_t token) {
  /* accept counted this token as number n_generated: a stop id ends generation only past min_tokens */
  bool may_stop = s->n_generated > s->p.min_tokens;
  for (int i = 0; i < s->n_stop_ids && may_stop; i++)
    if (s->stop_ids[i] == token) return SERVD_FINISH_STOP_TOKEN;
  if (!s->p.ignore_eos && may_stop)
    for (int i = 0; i < s->n_eos; i++)
      if (s->eos[i] == token) return SERVD_FINISH_EOS;
  if (s->p.max_tokens > 0 && s->n_generated >= s->p.max_tokens) return SERVD_FINISH_LENGTH;
  return SERVD_FINISH_NONE;
}

/* ---- helpers -------------------------------------------------------------------------------------- */
/* Total order: larger value first, then lower id. */
static inline bool cand_before(const cand *a, const cand *b) { return a->v > b->v || (a->v == b->v && a->id < b->id); }

static int cand_cmp(const void *a, const void *b) {
  const cand *x = a, *y = b;
  return cand_before(x, y) ? -1 : cand_before(y, x) ? 1 : 0;
}

/* Partitions c[0..n) so that its k first entries (in any order) are the k first in cand order. */
static void select_top(cand *c, size_t n, size_t k) {
  size_t lo = 0, hi = n; /* the boundary k lies in [lo, hi) */
  while (hi - lo > 1) {
    if (hi - lo <= 16) { /* small range: sort it (median of three cannot guarantee progress on 2) */
      qsort(c + lo, hi - lo, sizeof *c, cand_cmp);
      return;
    }
    /* median of three as pivot */
    size_t mid = lo + (hi - lo) / 2;
    cand a = c[lo], b = c[mid], d = c[hi - 1], piv;
    if (cand_before(&a, &b)) piv = cand_before(&b, &d) ? b : (cand_before(&a, &d) ? d : a);
    else piv = cand_before(&a, &d) ? a : (cand_before(&b, &d) ? d : b);
    size_t i = lo, j = hi - 1;
    for (;;) { /* Hoare partition */
      while (cand_before(&c[i], &piv)) i++;
      while (cand_before(&piv, &c[j])) j--;
      if (i >= j) break;
      cand t = c[i];
      c[i] = c[j];
      c[j] = t;
      i++;
      j--;
    }
    /* c[lo..j] before-or-equal piv, c[j+1..hi) after-or-equal */
    if (k <= j) {
      hi = j + 1;
    } else {
      lo = j + 1;
    }
    if (lo >= k || hi <= k) break;
  }
}

/* exp for x <= 0 with Cephes' polynomial (about 1 ulp), written so that the loops using it
 * vectorize without -ffast-math; below -87 it returns 0 (a masked or negligible token), and for NaN
 * (a NaN logit, or -inf - -inf) 0 too: the argument is clamped into [-87, 0] first, so the float to
 * int conversion below never sees NaN or infinity. */
static inline float exp_neg(float x) {
  float xc = x >= -87.0f ? (x <= 0.0f ? x : 0.0f) : -87.0f;
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float q = 1.9875691500e-4f;
  q = q * r + 1.3981999507e-3f;
  q = q * r + 8.3334519073e-3f;
  q = q * r + 4.1665795894e-2f;
  q = q * r + 1.6666665459e-1f;
  q = q * r + 5.0000001201e-1f;
  q = q * r * r + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float y = q * scale;
  return x >= -87.0f ? y : 0.0f;
}

#define WIDE __attribute__((target_clones("avx512f", "avx2", "default")))

WIDE static float max_of(const float *v, int n) {
  float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) m[k] = v[i + k] > m[k] ? v[i + k] : m[k];
  for (; i < n; i++) m[0] = v[i] > m[0] ? v[i] : m[0];
  for (int k = 1; k < 8; k++) m[0] = m[k] > m[0] ? m[k] : m[0];
  return m[0];
}

/* e[i] = exp(v[i] - mx); returns their sum (double partial sums). Cloned for wider vectors: this is
 * the one pass over the vocabulary that does real arithmetic. */
WIDE static double exp_sum(const float *v, float *e, int n, float mx) {
  for (int i = 0; i < n; i++) e[i] = exp_neg(v[i] - mx);
  double z[4] = {0, 0, 0, 0};
  int i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; k++) z[k] += e[i + k];
  for (; i < n; i++) z[0] += e[i];
  return (z[0] + z[1]) + (z[2] + z[3]);
}

/* The k largest of v (ties: lower id first) as logprobs v - lse, descending (insertion: k <= 20). */
static int top_n(const float *v, int n, int k, double lse, servd_top_logprob *top) {
  int m = 0;
  float *val = (float[SERVD_SAMPLER_MAX_TOP]){0};
  for (int i = 0; i < n && k > 0; i++) {
    float x = v[i];
    if (m == k && !(x > val[k - 1])) continue;
    int j = m < k ? m++ : k - 1;
    while (j > 0 && val[j - 1] < x) {
      val[j] = val[j - 1];
      top[j] = top[j - 1];
      j--;
    }
    val[j] = x;
    top[j].token = i;
  }
  for (int j = 0; j < m; j++) top[j].logprob = (float)((double)val[j] - lse);
  return m;
}

/* ---- sampling ------------------------------------------------------------------------------------ */
/* Candidates need not be the whole vocabulary: each filter gives a threshold that every token it keeps
 * exceeds, found with cheap passes (widening by powers of two below the maximum). */
WIDE static float topk_bound(const float *w, int n, float mx, int k) {
  for (float d = 4.0f; d <= 128.0f; d *= 2.0f) {
    float t = mx - d;
    int c = 0;
    for (int i = 0; i < n; i++) c += w[i] >= t;
    if (c >= k) return t; /* the k-th largest is >= t */
  }
  return -INFINITY;
}

/* A threshold t with mass(v > t) >= p * z (so every token at or below t has at least p above it). */
WIDE static float topp_bound(const float *w, const float *e, int n, float mx, double target) {
  for (float d = 2.0f; d <= 64.0f; d *= 2.0f) {
    float t = mx - d;
    double m[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; k++) m[k] += w[i + k] > t ? e[i + k] : 0.0f;
    for (; i < n; i++) m[0] += w[i] > t ? e[i] : 0.0f;
    if ((m[0] + m[1]) + (m[2] + m[3]) >= target * (1 + 1e-6)) return t;
  }
  return -INFINITY;
}

/* Temperatures below 1e-5 are greedy (as in vLLM): dividing by them overflows float logits. */
static bool is_greedy(const servd_gen_params *p) { return p->temperature < 1e-5f || p->top_k == 1; }

/* Greedy with nothing that moves a logit or wants the distribution: no bias, penalties, min_tokens
 * bans or logprobs. Such a row needs only the arg max (of the allowed tokens, when masked). */
static bool bare_greedy(const servd_sampler *s) {
  const servd_gen_params *p = &s->p;
  return !s->n_bias && !before_min(s) && is_greedy(p) && p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
         p->frequency_penalty == 0.0f && p->logprobs < 0;
}

bool servd_sampler_plain_greedy(const servd_sampler *s) { return !s->mask && bare_greedy(s); }

/* 0-4: w = biased, penalized logits / temperature (NaN and masked tokens as -inf); returns their
 * maximum. */
static float prepare(servd_sampler *s, const float *logits) {
  const int n = s->n_vocab;
  const servd_gen_params *p = &s->p;
  float *w = s->work;
  for (int i = 0; i < n; i++) w[i] = logits[i] == logits[i] ? logits[i] : -INFINITY; /* NaN: never */
  if (s->mask_ready) { /* per 32-token word: all allowed (JSON strings), none (regexes), or bit by bit */
    s->mask_ready = false;
    for (int k = 0; k < (n + 31) / 32; k++) {
      uint32_t banned = ~s->mask[k];
      int base = k * 32, end = base + 32 < n ? base + 32 : n;
      if (!banned) continue;
      if (banned == UINT32_MAX) {
        for (int i = base; i < end; i++) w[i] = -INFINITY;
        continue;
      }
      for (; banned; banned &= banned - 1) {
        int i = base + __builtin_ctz(banned);
        if (i < end) w[i] = -INFINITY;
      }
    }
  }
  for (int i = 0; i < s->n_bias; i++) w[s->bias[i].token] += s->bias[i].bias; /* -inf stays -inf */
  if (before_min(s)) {
    for (int i = 0; i < s->n_stop_ids; i++) w[s->stop_ids[i]] = -INFINITY;
    for (int i = 0; i < s->n_eos && !s->p.ignore_eos; i++)
      if (s->eos[i] >= 0 && s->eos[i] < n) w[s->eos[i]] = -INFINITY;
  }
  for (int i = 0; i < s->n_seen; i++) {
    int32_t id = s->seen_ids[i];
    float x = w[id];
    if (p->repetition_penalty != 1.0f) x = x > 0 ? x / p->repetition_penalty : x * p->repetition_penalty;
    if (s->seen[id] & 2) x -= p->presence_penalty + (float)s->count[id] * p->frequency_penalty;
    w[id] = x;
  }
  if (!is_greedy(p) && p->temperature != 1.0f) {
    const float inv_t = 1.0f / p->temperature;
    for (int i = 0; i < n; i++) w[i] *= inv_t;
  }
  return max_of(w, n);
}

/* 5: after prepare and e = exp(w - mx) with sum z, the tokens that survive top-k, top-p and min-p
 * into s->cand[0..*nc). */
static int truncate(servd_sampler *s, float mx, double z, size_t *nc_out) {
  const int n = s->n_vocab;
  const servd_gen_params *p = &s->p;
  const float *w = s->work, *e = s->prob;
  bool has_k = p->top_k > 0 && p->top_k < n, has_p = p->top_p<1.0f, has_min = p->min_p> 0;
  const float min_thr = has_min ? mx + logf(p->min_p) : -INFINITY;
  float lo = -INFINITY;
  bool strict = false;
  if (has_k) {
    lo = topk_bound(w, n, mx, p->top_k); /* top-p then renormalizes over the exact top-k set */
  } else {
    if (has_p) {
      lo = topp_bound(w, e, n, mx, (double)p->top_p * z);
      strict = lo > -INFINITY;
    }
    if (min_thr > lo) { /* min-p removes everything below it in the end anyway */
      lo = min_thr;
      strict = false;
    }
  }
  cand *c = s->cand;
  size_t nc = 0;
  for (int i = 0; i < n; i++)
    if ((w[i] > lo || (!strict && w[i] == lo)) && e[i] > 0) c[nc++] = (cand){w[i], e[i], i};
  if (!nc) return servd_fail(SERVD_EINVAL, "sampler: no candidate token (all logits -inf or NaN)");
  double zc = z;
  if (has_k && (size_t)p->top_k < nc) {
    select_top(c, nc, (size_t)p->top_k);
    nc = (size_t)p->top_k;
  }
  if (has_k) {
    zc = 0;
    for (size_t i = 0; i < nc; i++) zc += c[i].e;
  }
  if (has_p) {
    qsort(c, nc, sizeof *c, cand_cmp);
    double target = (double)p->top_p * zc, cum = 0;
    size_t keep = 0;
    for (; keep < nc && cum < target; keep++) cum += c[keep].e;
    nc = keep ? keep : 1;
  }
  if (has_min) {
    size_t k = 0;
    for (size_t i = 0; i < nc; i++)
      if (c[i].v >= min_thr) c[k++] = c[i];
    nc = k ? k : 1; /* the maximum always passes */
  }
  *nc_out = nc;
  return 0;
}

static bool truncates(const servd_sampler *s) {
  const servd_gen_params *p = &s->p;
  return (p->top_k > 0 && p->top_k < s->n_vocab) || p->top_p < 1.0f || p->min_p > 0;
}

static int32_t first_max(const float *w, int n, float mx) {
  for (int i = 0; i < n; i++)
    if (w[i] == mx) return i; /* lowest id on ties */
  return 0;                   /* all NaN / -inf */
}

/* The plain-greedy token in one pass over the row: the first index of the largest logit, NaN never
 * (what prepare then first_max give: token 0 when nothing is above -inf). */
static int32_t plain_argmax(const float *logits, int n) {
  float best = -INFINITY;
  int32_t tok = 0;
  for (int i = 0; i < n; i++)
    if (logits[i] > best) {
      best = logits[i];
      tok = i;
    }
  return tok;
}

/* Plain greedy but for this step's mask (a constrained greedy request): the arg max among the
 * allowed tokens, reading only their logits; -1 when none is above -inf (what prepare then
 * first_max give, lowest id on ties, NaN never). A regex's mask is mostly empty words. */
static int32_t masked_argmax(const float *logits, const uint32_t *mask, int n) {
  float best = -INFINITY;
  int32_t tok = -1;
  for (int k = 0; k < (n + 31) / 32; k++) {
    uint32_t bits = mask[k];
    int base = k * 32;
    if (bits == UINT32_MAX && base + 32 <= n) {
      for (int i = base; i < base + 32; i++)
        if (logits[i] > best) {
          best = logits[i];
          tok = i;
        }
      continue;
    }
    for (; bits; bits &= bits - 1) {
      int i = base + __builtin_ctz(bits);
      if (i < n && logits[i] > best) {
        best = logits[i];
        tok = i;
      }
    }
  }
  return tok;
}

int servd_sampler_sample(servd_sampler *s, const float *logits, servd_sampled *out) {
  const int n = s->n_vocab;
  const servd_gen_params *p = &s->p;
  if (servd_sampler_plain_greedy(s)) { /* no penalties, no logprobs: nothing but the arg max */
    *out = (servd_sampled){.token = plain_argmax(logits, n), .top = s->top};
    return 0;
  }
  if (s->mask_ready && bare_greedy(s)) {
    s->mask_ready = false; /* a stale mask never applies twice */
    int32_t tok = masked_argmax(logits, s->mask, n);
    if (tok < 0) return servd_fail(SERVD_EINVAL, "sampler: the constraint allows no token these logits can produce");
    *out = (servd_sampled){.token = tok, .top = s->top};
    return 0;
  }
  float *w = s->work, *e = s->prob;
  const float mx = prepare(s, logits);
  int32_t tok;
  double z = 0; /* sum of e over the vocabulary, when computed */
  bool have_e = false;
  if (s->mask && mx == -INFINITY) /* greedy would otherwise take token 0 */
    return servd_fail(SERVD_EINVAL, "sampler: the constraint allows no token these logits can produce");
  if (is_greedy(p) || mx == INFINITY) { /* an infinite logit is certain */
    tok = first_max(w, n, mx);
  } else {
    if (mx == -INFINITY) return servd_fail(SERVD_EINVAL, "sampler: every logit is -inf or NaN");
    z = exp_sum(w, e, n, mx);
    have_e = true;
    if (!truncates(s)) {
      /* plain temperature: one draw over the whole vocabulary */
      double u = uniform01(s->rng) * z, acc = 0;
      tok = -1;
      for (int i = 0; i < n; i++) {
        acc += e[i];
        if (acc > u && e[i] > 0) {
          tok = i;
          break;
        }
      }
      if (tok < 0) /* rounding at the very end: the last possible token */
        for (int i = n - 1; i >= 0 && tok < 0; i--)
          if (e[i] > 0) tok = i;
    } else {
      size_t nc;
      int rc = truncate(s, mx, z, &nc);
      if (rc) return rc;
      /* 6: one draw */
      const cand *c = s->cand;
      double zk = 0;
      for (size_t i = 0; i < nc; i++) zk += c[i].e;
      double u = uniform01(s->rng) * zk, acc = 0;
      tok = c[nc - 1].id;
      for (size_t i = 0; i < nc; i++) {
        acc += c[i].e;
        if (acc > u) {
          tok = c[i].id;
          break;
        }
      }
    }
  }

  out->token = tok;
  out->logprob = 0;
  out->top = s->top;
  out->n_top = 0;
  if (p->logprobs >= 0) {
    const float *dist = w;
    double lse;
    if (s->lp_mode == SERVD_LOGPROBS_RAW) {
      dist = logits;
      float m = max_of(logits, n);
      lse = m == -INFINITY ? 0 : (double)m + log(exp_sum(logits, e, n, m));
    } else {
      lse = (double)mx + log(have_e ? z : exp_sum(w, e, n, mx));
    }
    out->logprob = (float)((double)dist[tok] - lse);
    out->n_top = top_n(dist, n, p->logprobs, lse, s->top);
  }
  return 0;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

int servd_sampler_kept(servd_sampler *s, const float *logits, int32_t *ids, int *n_ids) {
  const int n = s->n_vocab;
  const float mx = prepare(s, logits);
  *n_ids = 0;
  if (is_greedy(&s->p) || mx == INFINITY) {
    ids[(*n_ids)++] = first_max(s->work, n, mx);
    return 0;
  }
  if (mx == -INFINITY) return servd_fail(SERVD_EINVAL, "sampler: every logit is -inf or NaN");
  double z = exp_sum(s->work, s->prob, n, mx);
  if (!truncates(s)) {
    for (int i = 0; i < n; i++)
      if (s->prob[i] > 0) ids[(*n_ids)++] = i;
    return 0;
  }
  size_t nc;
  int rc = truncate(s, mx, z, &nc);
  if (rc) return rc;
  for (size_t i = 0; i < nc; i++) ids[i] = s->cand[i].id;
  qsort(ids, nc, sizeof *ids, cmp_i32);
  *n_ids = (int)nc;
  return 0;
}
