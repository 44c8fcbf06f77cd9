/* CUDA graph buckets and decode-step padding: see graph_plan.h. */
#include "engine/graph_plan.h"

#include <stdlib.h>
#include <string.h>

int servd_graph_buckets(int max_batch, int *out, int cap) {
  int n = 0;
  if (max_batch < 1) return 0;
  for (int b = 1; b < max_batch; b = b < 8 ? b * 2 : b + 8) {
    if (out && n < cap) out[n] = b;
    n++;
  }
  if (out && n < cap) out[n] = max_batch;
  n++;
  return out && n > cap ? -1 : n;
}

int servd_graph_n_buckets(int max_batch) { return servd_graph_buckets(max_batch, NULL, 0); }

int servd_graph_bucket_index(const int *buckets, int n_buckets, int n) {
  if (n < 1) return -1;
  for (int i = 0; i < n_buckets; i++)
    if (buckets[i] >= n) return i;
  return -1;
}

bool servd_step_is_decode(const servd_forward_batch *b) {
  int n = b->attn.n_seqs;
  if (n < 1 || b->n_tokens != n || b->n_logit_rows != n || b->want_hidden) return false;
  for (int s = 0; s < n; s++)
    if (b->attn.q_len[s] != 1) return false;
  return true;
}

int servd_padded_step_init(servd_padded_step *p, int cap) {
  memset(p, 0, sizeof *p);
  if (cap < 1) return servd_fail(SERVD_EINVAL, "padded step: capacity %d: expected >= 1", cap);
  return servd_step_arrays_init(&p->step, cap, cap, "padded step");
}

void servd_padded_step_free(servd_padded_step *p) {
  servd_step_arrays_free(&p->step);
  memset(p, 0, sizeof *p);
}

int servd_pad_decode(servd_padded_step *p, const servd_forward_batch *b, int bucket) {
  if (!servd_step_is_decode(b))
    return servd_fail(SERVD_EINVAL, "pad decode: the step is not decode only (%d tokens, %d sequences, %d logit rows)",
                      b->n_tokens, b->attn.n_seqs, b->n_logit_rows);
  int n = b->attn.n_seqs;
  servd_step_arrays *a = &p->step;
  if (bucket < n || bucket > a->max_seqs)
    return servd_fail(SERVD_EINVAL, "pad decode: %d sequences into a bucket of %d (capacity %d)", n, bucket,
                      a->max_seqs);
  size_t real = sizeof(int32_t) * (size_t)n;
  memcpy(a->tokens, b->tokens, real);
  memcpy(a->positions, b->positions, real);
  memcpy(a->slots, b->slots, real);
  memcpy(a->logit_rows, b->logit_rows, real);
  memcpy(a->q_start, b->attn.q_start, real);
  memcpy(a->q_len, b->attn.q_len, real);
  memcpy(a->kv_len, b->attn.kv_len, real);
  memcpy(a->block_tables, b->attn.block_tables, sizeof *a->block_tables * (size_t)n);
  p->zero_table[0] = 0;
  for (int i = n; i < bucket; i++) {
    a->tokens[i] = 0;
    a->positions[i] = 0;
    a->slots[i] = -1;
    a->logit_rows[i] = i;
    a->q_start[i] = i;
    a->q_len[i] = 1;
    a->kv_len[i] = 1;
    a->block_tables[i] = p->zero_table;
  }
  p->batch = *b;
  servd_step_arrays_point(a, &p->batch, bucket, bucket, bucket);
  return 0;
}

int servd_graph_state_init(servd_graph_state *g, int max_batch) {
  memset(g, 0, sizeof *g);
  if (max_batch < 1) return servd_fail(SERVD_EINVAL, "graph state: max batch %d: expected >= 1", max_batch);
  g->max_batch = max_batch;
  g->n_buckets = servd_graph_n_buckets(max_batch);
  size_t n = (size_t)g->n_buckets;
  g->buckets = calloc(n, sizeof *g->buckets);
  g->seen = calloc(n, sizeof *g->seen);
  g->captured = calloc(n, sizeof *g->captured);
  g->disabled = calloc(n, sizeof *g->disabled);
  g->unstable = calloc(n, sizeof *g->unstable);
  if (!g->buckets || !g->seen || !g->captured || !g->disabled || !g->unstable) {
    servd_graph_state_free(g);
    return servd_fail(SERVD_ENOMEM, "graph state: %zu buckets", n);
  }
  servd_graph_buckets(max_batch, g->buckets, g->n_buckets);
  return 0;
}

void servd_graph_state_free(servd_graph_state *g) {
  free(g->buckets);
  free(g->seen);
  free(g->captured);
  free(g->disabled);
  free(g->unstable);
  memset(g, 0, sizeof *g);
}

servd_graph_action servd_graph_decide(const servd_graph_state *g, const servd_forward_batch *b, int *bucket) {
  *bucket = -1;
  if (!g->n_buckets || !servd_step_is_decode(b)) return SERVD_GRAPH_EAGER;
  int bi = servd_graph_bucket_index(g->buckets, g->n_buckets, b->attn.n_seqs);
  if (bi < 0 || g->disabled[bi]) return SERVD_GRAPH_EAGER;
  *bucket = bi;
  return g->captured[bi] ? SERVD_GRAPH_REPLAY : g->seen[bi] ? SERVD_GRAPH_CAPTURE : SERVD_GRAPH_WARMUP;
}

void servd_graph_ran(servd_graph_state *g, servd_graph_action a, int bucket) {
  if (a == SERVD_GRAPH_WARMUP && bucket >= 0 && bucket < g->n_buckets) g->seen[bucket] = true;
}

bool servd_graph_capture_done(servd_graph_state *g, int bucket, bool ok, bool unstable) {
  if (bucket < 0 || bucket >= g->n_buckets) return false;
  if (ok) {
    g->captured[bucket] = true;
    return false;
  }
  g->captured[bucket] = false;
  if (unstable && ++g->unstable[bucket] < SERVD_GRAPH_MAX_UNSTABLE) {
    g->seen[bucket] = false; /* warm up again, then retry */
    return false;
  }
  g->disabled[bucket] = true;
  return true;
}

void servd_graph_reset(servd_graph_state *g) {
  if (!g->n_buckets) return;
  memset(g->seen, 0, sizeof *g->seen * (size_t)g->n_buckets);
  memset(g->captured, 0, sizeof *g->captured * (size_t)g->n_buckets);
}
