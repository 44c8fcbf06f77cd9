/* Step plans of the CPU runner: see plan_cache.h. */
#include "engine/plan_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/plan.h"

/* Captures of a bucket that may differ before it is turned off (a model whose first steps warm
 * caches of its own settles in one). */
#define MAX_MISMATCHES 3
#define WHY 256

typedef enum bucket_state { B_EMPTY, B_FIRST, B_READY, B_OFF } bucket_state;

typedef struct bucket {
  bucket_state state;
  int mismatches;
  servd_plan **plans;   /* [world]: the ready plans, or the first capture */
  servd_plan **pending; /* [world]: this round's captures */
  char *why;            /* [world][WHY]: why each rank's capture was refused in this round */
} bucket;

struct servd_plan_cache {
  int world, max_batch;
  servd_kv_cache *const *kv; /* [world] */
  bool trace;
  bucket *buckets; /* [max_batch]: decode steps of i+1 sequences */
  int current;     /* the bucket of the round being run, -1: none */
  servd_plan_stats st;
};

static void drop(servd_plan_cache *c, bucket *k, servd_plan **set) {
  for (int r = 0; r < c->world; r++) {
    servd_plan_destroy(set[r]);
    set[r] = NULL;
  }
  (void)k;
}

int servd_plan_cache_create(int world, servd_kv_cache *const *kv, int max_batch, servd_plan_cache **out) {
  *out = NULL;
  const char *env = getenv("SERVD_PLANS");
  if (env && (!strcmp(env, "off") || !strcmp(env, "0"))) return 0;
  servd_plan_cache *c = calloc(1, sizeof *c);
  if (!c) return servd_fail(SERVD_ENOMEM, "step plans: allocation");
  c->world = world;
  c->kv = kv;
  c->max_batch = max_batch;
  c->current = -1;
  const char *tr = getenv("SERVD_TRACE_PLAN");
  c->trace = tr && *tr && strcmp(tr, "0") != 0;
  c->buckets = calloc((size_t)max_batch, sizeof *c->buckets);
  if (!c->buckets) goto fail;
  for (int i = 0; i < max_batch; i++) {
    bucket *k = &c->buckets[i];
    k->plans = calloc((size_t)world, sizeof *k->plans);
    k->pending = calloc((size_t)world, sizeof *k->pending);
    k->why = calloc((size_t)world, WHY);
    if (!k->plans || !k->pending || !k->why) goto fail;
  }
  *out = c;
  return 0;
fail:
  servd_plan_cache_destroy(c);
  return servd_fail(SERVD_ENOMEM, "step plans: %d buckets of %d ranks", max_batch, world);
}

void servd_plan_cache_destroy(servd_plan_cache *c) {
  if (!c) return;
  for (int i = 0; c->buckets && i < c->max_batch; i++) {
    bucket *k = &c->buckets[i];
    if (k->plans) drop(c, k, k->plans);
    if (k->pending) drop(c, k, k->pending);
    free(k->plans);
    free(k->pending);
    free(k->why);
  }
  free(c->buckets);
  free(c);
}

/* A decode step: every sequence brings one token after some context, and wants its logits (a step
 * that wants hidden states takes the forward's other path). */
static int decode_bucket(const servd_plan_cache *c, const servd_forward_batch *b) {
  int n = b->attn.n_seqs;
  if (n < 1 || n > c->max_batch || b->n_tokens != n || b->n_logit_rows != n || b->dbatch || b->dkv || b->want_hidden)
    return -1;
  for (int s = 0; s < n; s++)
    if (b->attn.q_len[s] != 1 || b->attn.kv_len[s] < 2) return -1;
  return n - 1;
}

/* Drops every ready plan (but bucket `skip`'s) whose buffers moved: plans of a batch size that does
 * not come again would otherwise keep the model's old buffers alive. */
static void drop_stale(servd_plan_cache *c, const servd_forward_batch *b, int skip) {
  char why[256];
  for (int i = 0; i < c->max_batch; i++) {
    bucket *k = &c->buckets[i];
    if (i == skip || k->state != B_READY) continue;
    for (int r = 0; r < c->world; r++) {
      servd_forward_batch probe = *b;
      probe.n_tokens = probe.n_logit_rows = probe.attn.n_seqs = i + 1; /* the shape is not the question */
      probe.kv = c->kv[r];
      if (servd_plan_check(k->plans[r], &probe, why, sizeof why) != 0) {
        drop(c, k, k->plans);
        k->state = B_EMPTY;
        c->st.dropped++;
        break;
      }
    }
  }
}

servd_plan_action servd_plan_cache_decide(servd_plan_cache *c, const servd_forward_batch *b) {
  if (!c) return SERVD_PLAN_EAGER;
  c->current = -1;
  if (b->n_lora > 0) return SERVD_PLAN_EAGER; /* adapter groups change every step: never captured */
  int bi = decode_bucket(c, b);
  if (bi < 0) return SERVD_PLAN_EAGER;
  bucket *k = &c->buckets[bi];
  if (k->state == B_OFF) return SERVD_PLAN_EAGER;
  c->current = bi;
  if (k->state == B_READY) {
    char why[256] = "";
    servd_forward_batch mine = *b;
    for (int r = 0; r < c->world; r++)
      if ((mine.kv = c->kv[r]), servd_plan_check(k->plans[r], &mine, why, sizeof why) != 0) {
        fprintf(stderr, "servd: step plan for decode batches of %d dropped (rank %d): %s; capturing again\n", bi + 1, r,
                why);
        drop(c, k, k->plans);
        k->state = B_EMPTY;
        c->st.dropped++;
        drop_stale(c, b, bi); /* the other buckets' plans hold the old buffers too: free them now */
        return SERVD_PLAN_CAPTURE;
      }
    return SERVD_PLAN_REPLAY;
  }
  memset(k->why, 0, (size_t)c->world * WHY);
  return SERVD_PLAN_CAPTURE;
}

int servd_plan_cache_capture(servd_plan_cache *c, int rank, servd_interp *it, const servd_forward_batch *b,
                             int64_t timeout_ms, servd_tensor **logits, servd_py_error *err) {
  bucket *k = &c->buckets[c->current];
  char why[WHY - 16] = "";
  int rc = servd_plan_capture(it, b, timeout_ms, logits, err, &k->pending[rank], why, sizeof why);
  if (rc == 0 && !k->pending[rank]) snprintf(k->why + (size_t)rank * WHY, WHY, "rank %d: %s", rank, why);
  return rc;
}

int servd_plan_cache_replay(servd_plan_cache *c, int rank, const servd_forward_batch *b, servd_tensor **logits) {
  return servd_plan_replay(c->buckets[c->current].plans[rank], b, logits);
}

static void turn_off(servd_plan_cache *c, bucket *k, int bi, const char *why) {
  fprintf(stderr, "servd: step plans off for decode batches of %d: %s\n", bi + 1, why);
  drop(c, k, k->plans);
  drop(c, k, k->pending);
  k->state = B_OFF;
  c->st.refused++;
}

void servd_plan_cache_done(servd_plan_cache *c, servd_plan_action a, int rc) {
  if (!c || c->current < 0) return;
  int bi = c->current;
  bucket *k = &c->buckets[bi];
  c->current = -1;
  if (a == SERVD_PLAN_REPLAY) {
    c->st.replays++;
    if (rc != 0) { /* a replay failed: trust none of the bucket's plans */
      fprintf(stderr,
              "servd: step plan for decode batches of %d failed (%s): dropped; the step runs through the "
              "model's code\n",
              bi + 1, servd_last_error());
      drop(c, k, k->plans);
      k->state = B_EMPTY;
      c->st.dropped++;
    }
    return;
  }
  if (a != SERVD_PLAN_CAPTURE) return;
  c->st.captures++;
  bool all = rc == 0;
  for (int r = 0; r < c->world && all; r++) all = k->pending[r] != NULL;
  if (rc != 0) { /* the step failed: capture again next time */
    drop(c, k, k->pending);
    return;
  }
  if (!all) {
    const char *why = "a rank recorded nothing";
    for (int r = c->world - 1; r >= 0; r--)
      if (k->why[(size_t)r * WHY]) why = k->why + (size_t)r * WHY; /* the lowest rank's reason */
    turn_off(c, k, bi, why);
    return;
  }
  if (k->state == B_EMPTY) { /* the first capture: keep it to compare the next one with */
    memcpy(k->plans, k->pending, sizeof *k->plans * (size_t)c->world);
    memset(k->pending, 0, sizeof *k->pending * (size_t)c->world);
    k->state = B_FIRST;
    return;
  }
  char diff[200] = "", why[240] = "";
  bool same = true;
  for (int r = 0; r < c->world && same; r++)
    if (!servd_plan_same(k->plans[r], k->pending[r], diff, sizeof diff)) {
      snprintf(why, sizeof why, "rank %d: %s", r, diff);
      same = false;
    }
  if (same) {
    drop(c, k, k->pending);
    k->state = B_READY;
    k->mismatches = 0;
    c->st.ready++;
    if (c->trace)
      for (int r = 0; r < c->world; r++) {
        fprintf(stderr, "servd: step plan for decode batches of %d, rank %d:\n", bi + 1, r);
        servd_plan_print(k->plans[r], stderr);
      }
    return;
  }
  /* The forward took another path: the latest capture becomes the one to compare with. */
  drop(c, k, k->plans);
  memcpy(k->plans, k->pending, sizeof *k->plans * (size_t)c->world);
  memset(k->pending, 0, sizeof *k->pending * (size_t)c->world);
  if (++k->mismatches >= MAX_MISMATCHES) {
    char msg[320];
    snprintf(msg, sizeof msg, "the forward recorded different ops %d times running (%s)", MAX_MISMATCHES, why);
    turn_off(c, k, bi, msg);
  }
}

void servd_plan_cache_stats(const servd_plan_cache *c, servd_plan_stats *s) {
  memset(s, 0, sizeof *s);
  if (c) *s = c->st;
}
