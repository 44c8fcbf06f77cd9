/* Speculative decoding: proposers and the draft length (see speculate.h). */
#include "engine/speculate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

int servd_spec_mode_parse(const char *s) {
  static const char *const names[] = {[SERVD_SPEC_AUTO] = "auto",
                                      [SERVD_SPEC_OFF] = "off",
                                      [SERVD_SPEC_NGRAM] = "ngram",
                                      [SERVD_SPEC_SUFFIX] = "suffix"};
  for (int i = 0; s && i < (int)(sizeof names / sizeof names[0]); i++)
    if (!strcmp(s, names[i])) return i;
  return -1;
}

const char *servd_spec_mode_name(servd_spec_mode m) {
  switch (m) {
  case SERVD_SPEC_AUTO: return "auto";
  case SERVD_SPEC_OFF: return "off";
  case SERVD_SPEC_NGRAM: return "ngram";
  case SERVD_SPEC_SUFFIX: return "suffix";
  }
  return "?";
}

/* ---- prompt lookup ------------------------------------------------------------------------------- */

/* How far back prompt lookup looks: a scan of 16k tokens costs about 10 us a step. */
#define SPEC_SCAN_WINDOW 16384

int spec_ngram_propose(const int32_t *t, int n, int k, int32_t *out, int *match) {
  *match = 0;
  if (n < SPEC_NGRAM_MIN + 1 || k <= 0) return 0;
  int best_len = 0, best_at = -1;
  int lo = n > SPEC_SCAN_WINDOW ? n - SPEC_SCAN_WINDOW : 0;
  const int32_t last = t[n - 1];
  /* i: where an earlier occurrence ends (t[i] == the last token), most recent first. */
  for (int i = n - 2; i >= lo; i--) {
    if (t[i] != last) continue;
    int len = 1;
    while (len < SPEC_NGRAM_MAX && i - len >= 0 && t[i - len] == t[n - 1 - len]) len++;
    if (len > best_len) {
      best_len = len;
      best_at = i;
      if (len == SPEC_NGRAM_MAX) break;
    }
  }
  if (best_len < SPEC_NGRAM_MIN) return 0;
  int m = 0;
  for (int j = best_at + 1; j < n && m < k; j++) out[m++] = t[j];
  *match = best_len;
  return m;
}

/* ---- suffix index over recent requests ----------------------------------------------------------- */

struct spec_suffix_index {
  int32_t *ring; /* tokens; -1 separates sequences */
  int64_t cap;
  int64_t head;   /* tokens ever written: the next one goes to ring[head % cap] */
  int64_t *table; /* trigram hash -> absolute position of the token after it (0: none) */
  uint32_t mask;
};

static uint32_t trigram_hash(int32_t a, int32_t b, int32_t c) {
  uint64_t h = (uint64_t)(uint32_t)a * 0x9E3779B97F4A7C15ull;
  h ^= (uint64_t)(uint32_t)b + 0x7F4A7C159E3779B9ull + (h << 6) + (h >> 2);
  h ^= (uint64_t)(uint32_t)c * 0xC2B2AE3D27D4EB4Full;
  return (uint32_t)(h ^ (h >> 29) ^ (h >> 47));
}

int spec_suffix_index_create(int cap_tokens, spec_suffix_index **out) {
  *out = NULL;
  if (cap_tokens < 16) return servd_fail(SERVD_EINVAL, "speculation: a suffix index of %d tokens", cap_tokens);
  spec_suffix_index *x = calloc(1, sizeof *x);
  uint32_t slots = 1;
  while (slots < (uint32_t)cap_tokens && slots < (1u << 30)) slots <<= 1;
  if (x) {
    x->cap = cap_tokens;
    x->ring = malloc(sizeof(int32_t) * (size_t)cap_tokens);
    x->table = calloc(slots, sizeof(int64_t));
    x->mask = slots - 1;
  }
  if (!x || !x->ring || !x->table) {
    spec_suffix_index_free(x);
    return servd_fail(SERVD_ENOMEM, "speculation: a suffix index of %d tokens", cap_tokens);
  }
  *out = x;
  return 0;
}

void spec_suffix_index_free(spec_suffix_index *x) {
  if (!x) return;
  free(x->ring);
  free(x->table);
  free(x);
}

static int32_t ring_at(const spec_suffix_index *x, int64_t pos) { return x->ring[pos % x->cap]; }

void spec_suffix_index_add(spec_suffix_index *x, const int32_t *t, int n) {
  if (!x || n <= 0) return;
  if (n > x->cap - 1) { /* the ring keeps only the end of a sequence longer than itself */
    t += n - (x->cap - 1);
    n = (int)x->cap - 1;
  }
  for (int i = 0; i < n; i++) {
    x->ring[x->head % x->cap] = t[i];
    x->head++;
    if (i >= 2) x->table[trigram_hash(t[i - 2], t[i - 1], t[i]) & x->mask] = x->head;
  }
  x->ring[x->head % x->cap] = -1;
  x->head++;
}

int spec_suffix_index_propose(const spec_suffix_index *x, const int32_t *t, int n, int k, int32_t *out) {
  if (!x || n < 3 || k <= 0) return 0;
  int64_t p = x->table[trigram_hash(t[n - 3], t[n - 2], t[n - 1]) & x->mask];
  /* The entry may be another trigram's (a collision) or overwritten since: check the tokens. */
  if (p < 3 || x->head - (p - 3) > x->cap) return 0;
  for (int j = 0; j < 3; j++)
    if (ring_at(x, p - 3 + j) != t[n - 3 + j]) return 0;
  int m = 0;
  for (; p < x->head && m < k; p++) {
    int32_t tok = ring_at(x, p);
    if (tok < 0) break;
    out[m++] = tok;
  }
  return m;
}

/* ---- draft length -------------------------------------------------------------------------------- */

double spec_expected_tokens(double a, int k) {
  if (a >= 1.0) return k + 1.0;
  if (a <= 0.0) return 1.0;
  return (1.0 - pow(a, k + 1)) / (1.0 - a);
}

/* A draft length must beat the step without drafts by this factor: the cost model's estimates are
 * averages, and a mispriced draft costs more than it saves. */
#define SPEC_MIN_GAIN 1.03

int spec_choose_length(double a, int k_max, int base_rows, double step_ns, double fixed_ns, double token_ns) {
  if (k_max <= 0 || base_rows <= 0 || step_ns <= 0 || token_ns <= 0) return 0;
  double base = base_rows / step_ns, best = base * SPEC_MIN_GAIN;
  int best_k = 0;
  for (int k = 1; k <= k_max; k++) {
    double rate = (base_rows + spec_expected_tokens(a, k) - 1.0) / (step_ns + fixed_ns + k * token_ns);
    if (rate > best) {
      best = rate;
      best_k = k;
    }
  }
  return best_k;
}

/* ---- per model ----------------------------------------------------------------------------------- */

/* Tokens the suffix index keeps (16 MB of ring and table). */
#define SPEC_SUFFIX_TOKENS (1 << 20)
/* Acceptance evidence: a request's own decayed counts (SPEC_DECAY per verify row), with the model's
 * acceptance for proposals of the same kind (the n-gram match length; 0: the suffix index; decayed by
 * SPEC_MODEL_DECAY per verify row) as a prior worth SPEC_PRIOR_WEIGHT drafts reached. */
#define SPEC_DECAY 0.95
#define SPEC_MODEL_DECAY 0.995
#define SPEC_PRIOR_WEIGHT 4.0
/* A proposal the cost model turns down is still verified now and then, with SPEC_EXPLORE_DRAFTS
 * drafts, when no row of the model drafted for SPEC_EXPLORE_EVERY steps (for one step while no verify
 * step was timed): what acceptance and verify rows cost is otherwise never learned. Counted in steps,
 * not proposals, so that one row explores at a time and at most one step in 64 is a verify step (it
 * runs the model's code where a decode step may replay its plan) on text where drafts fail, at any
 * batch size. */
#define SPEC_EXPLORE_EVERY 64
#define SPEC_EXPLORE_DRAFTS 2

int servd_spec_init(servd_spec *sp, servd_spec_mode mode, int max_draft) {
  memset(sp, 0, sizeof *sp);
  sp->mode = mode;
  sp->max_draft = max_draft <= 0 ? SERVD_SPEC_DEFAULT_DRAFT : max_draft;
  if (sp->max_draft > SERVD_SPEC_MAX_DRAFT)
    return servd_fail(SERVD_EINVAL, "speculation: at most %d draft tokens, got %d", SERVD_SPEC_MAX_DRAFT, max_draft);
  if (mode == SERVD_SPEC_AUTO || mode == SERVD_SPEC_SUFFIX)
    return spec_suffix_index_create(SPEC_SUFFIX_TOKENS, &sp->suffix);
  return 0;
}

void servd_spec_free(servd_spec *sp) {
  spec_suffix_index_free(sp->suffix);
  sp->suffix = NULL;
}

void servd_spec_propose(servd_spec *sp, servd_spec_seq *ss, sched_seq *q, int room, int step_rows, double step_ns,
                        double fixed_ns, double token_ns, bool cost_known) {
  q->n_tokens -= q->n_draft; /* drafts of a plan that did not schedule q */
  q->n_draft = ss->n_draft = 0;
  if (sp->mode == SERVD_SPEC_OFF || room <= 0) return;
  int k = room < sp->max_draft ? room : sp->max_draft;
  bool explore = sp->quiet_steps >= (cost_known ? SPEC_EXPLORE_EVERY : 1);
  /* Where no draft could pay even if all were accepted (large compute-bound batches), the proposal's
   * scan of the request's tokens is skipped: it runs per decoding row and step. */
  if (sp->mode == SERVD_SPEC_AUTO && !explore &&
      spec_choose_length(1.0, k, step_rows, step_ns, fixed_ns, token_ns) == 0)
    return;
  int match = 0;
  int n = spec_ngram_propose(q->tokens, q->n_tokens, k, ss->draft, &match);
  if (n == 0 && sp->suffix) n = spec_suffix_index_propose(sp->suffix, q->tokens, q->n_tokens, k, ss->draft);
  if (n == 0) return;
  if (sp->mode == SERVD_SPEC_AUTO) {
    double prior = (sp->kind_hits[match] + 1.0) / (sp->kind_trials[match] + 2.0);
    double a = (ss->hits + SPEC_PRIOR_WEIGHT * prior) / (ss->trials + SPEC_PRIOR_WEIGHT);
    int best = spec_choose_length(a, n, step_rows, step_ns, fixed_ns, token_ns);
    if (best == 0) {
      if (!explore) return;
      best = n < SPEC_EXPLORE_DRAFTS ? n : SPEC_EXPLORE_DRAFTS;
    }
    sp->quiet_steps = 0;
    n = best;
  }
  ss->kind = match;
  memcpy(q->tokens + q->n_tokens, ss->draft, sizeof(int32_t) * (size_t)n);
  q->n_tokens += n;
  q->n_draft = ss->n_draft = n;
}

void servd_spec_step(servd_spec *sp) { sp->quiet_steps++; }

void servd_spec_observe(servd_spec *sp, servd_spec_seq *ss, int n_accepted) {
  if (ss->n_draft <= 0) return;
  int reached = n_accepted + (n_accepted < ss->n_draft);
  ss->hits = ss->hits * SPEC_DECAY + n_accepted;
  ss->trials = ss->trials * SPEC_DECAY + reached;
  sp->kind_hits[ss->kind] = sp->kind_hits[ss->kind] * SPEC_MODEL_DECAY + n_accepted;
  sp->kind_trials[ss->kind] = sp->kind_trials[ss->kind] * SPEC_MODEL_DECAY + reached;
  sp->c.drafts++;
  sp->c.draft_tokens += (uint64_t)ss->n_draft;
  sp->c.accepted_tokens += (uint64_t)n_accepted;
  for (int i = 0; i < n_accepted; i++) sp->c.accepted_per_pos[i]++;
  ss->n_draft = 0;
}

void servd_spec_remember(servd_spec *sp, const int32_t *tokens, int n) { spec_suffix_index_add(sp->suffix, tokens, n); }
