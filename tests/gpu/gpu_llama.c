#include "gpu_llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call) \
  do { \
    int rc_ = (call); \
    if (rc_) return rc_; \
  } while (0)

enum { BLOCK = 16 };

struct gpu_llama {
  servd_cuda_ctx *c;
  llama_shape s;
  llama_weights w;
  int max_seqs, max_ctx, max_tokens, blocks_per_seq;
  servd_bf16_t **k_cache, **v_cache;
  /* activations */
  servd_bf16_t *x, *xb, *q, *k, *v, *att, *h1, *h3, *last;
  float *logits;
  int32_t *d_tokens, *d_pos, *d_slots, *d_last, *d_next;
  int32_t *d_q_start, *d_q_len, *d_kv_len, *d_tables;
  /* host staging */
  int32_t *h_pos, *h_slots, *h_last, *h_q_start, *h_tables;
  servd_cuda_graph *graphs[128];
};

static servd_bf16_t *dalloc(servd_cuda_ctx *c, size_t n) { return servd_cuda_alloc(c, n * sizeof(servd_bf16_t)); }

static int fill_ones(servd_cuda_ctx *c, servd_bf16_t *p, size_t n) {
  uint16_t *h = malloc(n * sizeof *h);
  if (!h) return SERVD_ENOMEM;
  for (size_t i = 0; i < n; i++) h[i] = 0x3f80; /* bf16 1.0 */
  int rc = servd_cuda_upload(c, p, h, n * sizeof *h);
  if (!rc) rc = servd_cuda_sync(c);
  free(h);
  return rc;
}

static int synth(servd_cuda_ctx *c, servd_bf16_t **p, size_t n, uint64_t seed) {
  *p = dalloc(c, n);
  if (!*p) return SERVD_ENOMEM;
  /* uniform in [-a, a] has std a/sqrt(3): std 0.02 */
  return servd_cuda_fill_random_bf16(c, *p, n, seed, 0.02f * sqrtf(3.f));
}

int gpu_llama_create(servd_cuda_ctx *c, const llama_shape *s, int max_seqs, int max_ctx, int max_tokens, uint64_t seed,
                     gpu_llama **out) {
  gpu_llama *m = calloc(1, sizeof *m);
  if (!m) return SERVD_ENOMEM;
  *out = m;
  m->c = c;
  m->s = *s;
  m->max_seqs = max_seqs;
  m->max_ctx = max_ctx;
  m->max_tokens = max_tokens;
  m->blocks_per_seq = (max_ctx + BLOCK - 1) / BLOCK;
  const size_t h = s->hidden, qd = (size_t)s->heads * s->head_dim, kd = (size_t)s->kv_heads * s->head_dim;
  const int L = s->layers;
  llama_weights *w = &m->w;
  servd_bf16_t ***lists[] = {&w->attn_norm, &w->wq, &w->wk, &w->wv,      &w->wo,     &w->ffn_norm,
                             &w->w1,        &w->w2, &w->w3, &m->k_cache, &m->v_cache};
  for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) {
    *lists[i] = calloc((size_t)L, sizeof(servd_bf16_t *));
    if (!*lists[i]) return SERVD_ENOMEM;
  }
  uint64_t sd = seed;
  TRY(synth(c, &w->embed, (size_t)s->vocab * h, sd++));
  TRY(synth(c, &w->lm_head, (size_t)s->vocab * h, sd++));
  w->norm = dalloc(c, h);
  if (!w->norm) return SERVD_ENOMEM;
  TRY(fill_ones(c, w->norm, h));
  const size_t slots = (size_t)max_seqs * m->blocks_per_seq * BLOCK;
  for (int l = 0; l < L; l++) {
    TRY(synth(c, &w->wq[l], qd * h, sd++));
    TRY(synth(c, &w->wk[l], kd * h, sd++));
    TRY(synth(c, &w->wv[l], kd * h, sd++));
    TRY(synth(c, &w->wo[l], h * qd, sd++));
    TRY(synth(c, &w->w1[l], (size_t)s->inter * h, sd++));
    TRY(synth(c, &w->w3[l], (size_t)s->inter * h, sd++));
    TRY(synth(c, &w->w2[l], h * s->inter, sd++));
    w->attn_norm[l] = dalloc(c, h);
    w->ffn_norm[l] = dalloc(c, h);
    m->k_cache[l] = dalloc(c, slots * kd);
    m->v_cache[l] = dalloc(c, slots * kd);
    if (!w->attn_norm[l] || !w->ffn_norm[l] || !m->k_cache[l] || !m->v_cache[l]) return SERVD_ENOMEM;
    TRY(fill_ones(c, w->attn_norm[l], h));
    TRY(fill_ones(c, w->ffn_norm[l], h));
  }
  const size_t T = (size_t)max_tokens;
  m->x = dalloc(c, T * h);
  m->xb = dalloc(c, T * h);
  m->q = dalloc(c, T * qd);
  m->k = dalloc(c, T * kd);
  m->v = dalloc(c, T * kd);
  m->att = dalloc(c, T * qd);
  m->h1 = dalloc(c, T * s->inter);
  m->h3 = dalloc(c, T * s->inter);
  m->last = dalloc(c, (size_t)max_seqs * h);
  m->logits = servd_cuda_alloc(c, (size_t)max_seqs * s->vocab * sizeof(float));
  int32_t **ints[] = {&m->d_tokens, &m->d_pos, &m->d_slots};
  for (size_t i = 0; i < 3; i++)
    if (!(*ints[i] = servd_cuda_alloc(c, T * sizeof(int32_t)))) return SERVD_ENOMEM;
  int32_t **seqs[] = {&m->d_last, &m->d_next, &m->d_q_start, &m->d_q_len, &m->d_kv_len};
  for (size_t i = 0; i < 5; i++)
    if (!(*seqs[i] = servd_cuda_alloc(c, (size_t)max_seqs * sizeof(int32_t)))) return SERVD_ENOMEM;
  m->d_tables = servd_cuda_alloc(c, (size_t)max_seqs * m->blocks_per_seq * sizeof(int32_t));
  m->h_pos = malloc(T * sizeof(int32_t));
  m->h_slots = malloc(T * sizeof(int32_t));
  m->h_last = malloc((size_t)max_seqs * sizeof(int32_t));
  m->h_q_start = malloc((size_t)max_seqs * sizeof(int32_t));
  m->h_tables = malloc((size_t)max_seqs * m->blocks_per_seq * sizeof(int32_t));
  if (!m->x || !m->xb || !m->q || !m->k || !m->v || !m->att || !m->h1 || !m->h3 || !m->last || !m->logits ||
      !m->d_tables || !m->h_pos || !m->h_slots || !m->h_last || !m->h_q_start || !m->h_tables)
    return SERVD_ENOMEM;
  /* Sequence i owns blocks [i*bps, (i+1)*bps), listed in reverse so tables are not the identity. */
  for (int i = 0; i < max_seqs; i++)
    for (int b = 0; b < m->blocks_per_seq; b++)
      m->h_tables[i * m->blocks_per_seq + b] = i * m->blocks_per_seq + (m->blocks_per_seq - 1 - b);
  TRY(servd_cuda_upload(c, m->d_tables, m->h_tables, (size_t)max_seqs * m->blocks_per_seq * sizeof(int32_t)));
  return servd_cuda_sync(c);
}

void gpu_llama_drop_graphs(gpu_llama *m) {
  for (int i = 0; i < 128; i++) {
    servd_cuda_graph_destroy(m->graphs[i]);
    m->graphs[i] = NULL;
  }
}

void gpu_llama_destroy(gpu_llama *m) {
  if (!m) return;
  gpu_llama_drop_graphs(m);
  free(m->w.attn_norm);
  free(m->w.wq);
  free(m->w.wk);
  free(m->w.wv);
  free(m->w.wo);
  free(m->w.ffn_norm);
  free(m->w.w1);
  free(m->w.w2);
  free(m->w.w3);
  free(m->k_cache);
  free(m->v_cache);
  free(m->h_pos);
  free(m->h_slots);
  free(m->h_last);
  free(m->h_q_start);
  free(m->h_tables);
  free(m); /* device memory goes with the context's pool */
}

const llama_weights *gpu_llama_weights(const gpu_llama *m) { return &m->w; }
const llama_shape *gpu_llama_shape(const gpu_llama *m) { return &m->s; }

double gpu_llama_weight_bytes(const gpu_llama *m) {
  const llama_shape *s = &m->s;
  double h = s->hidden, qd = (double)s->heads * s->head_dim, kd = (double)s->kv_heads * s->head_dim;
  double per_layer = 2 * h + qd * h * 2 + kd * h * 2 + 3.0 * s->inter * h;
  return 2.0 * (per_layer * s->layers + h + (double)s->vocab * h); /* lm_head read in full; embedding: 1 row */
}

/* Host-side planning of one step into the staging arrays, then upload. */
static int plan(gpu_llama *m, int n_seqs, const int32_t *tokens, const int32_t *q_len, const int32_t *kv_len,
                int *n_tokens) {
  int t = 0;
  for (int i = 0; i < n_seqs; i++) {
    if (q_len[i] < 1 || kv_len[i] > m->max_ctx || kv_len[i] < q_len[i]) return SERVD_EINVAL;
    m->h_q_start[i] = t;
    for (int j = 0; j < q_len[i]; j++, t++) {
      const int pos = kv_len[i] - q_len[i] + j;
      m->h_pos[t] = pos;
      m->h_slots[t] = m->h_tables[i * m->blocks_per_seq + pos / BLOCK] * BLOCK + pos % BLOCK;
    }
    m->h_last[i] = t - 1;
  }
  if (t > m->max_tokens) return SERVD_EINVAL;
  *n_tokens = t;
  servd_cuda_ctx *c = m->c;
  TRY(servd_cuda_upload(c, m->d_tokens, tokens, t * sizeof(int32_t)));
  TRY(servd_cuda_upload(c, m->d_pos, m->h_pos, t * sizeof(int32_t)));
  TRY(servd_cuda_upload(c, m->d_slots, m->h_slots, t * sizeof(int32_t)));
  TRY(servd_cuda_upload(c, m->d_last, m->h_last, n_seqs * sizeof(int32_t)));
  TRY(servd_cuda_upload(c, m->d_q_start, m->h_q_start, n_seqs * sizeof(int32_t)));
  TRY(servd_cuda_upload(c, m->d_q_len, q_len, n_seqs * sizeof(int32_t)));
  TRY(servd_cuda_upload(c, m->d_kv_len, kv_len, n_seqs * sizeof(int32_t)));
  return SERVD_OK;
}

/* The kernels of one step (no host work besides launches: capturable when decode-only). */
static int forward(gpu_llama *m, int n_seqs, int T, const int32_t *q_len, const int32_t *kv_len) {
  servd_cuda_ctx *c = m->c;
  const llama_shape *s = &m->s;
  const llama_weights *w = &m->w;
  const int h = s->hidden, qd = s->heads * s->head_dim, kd = s->kv_heads * s->head_dim;
  const servd_cuda_attn_batch ab = {n_seqs,      m->blocks_per_seq, m->d_q_start, m->d_q_len, m->d_kv_len,
                                    m->d_tables, m->h_q_start,      q_len,        kv_len};
  const float scale = 1.0f / sqrtf((float)s->head_dim);
  TRY(servd_cuda_embedding(c, m->x, w->embed, m->d_tokens, T, h, s->vocab));
  TRY(servd_cuda_rmsnorm(c, m->xb, m->x, w->attn_norm[0], T, h, s->eps));
  for (int l = 0; l < s->layers; l++) {
    /* The fused ops (one launch each once servd_cuda_fused_check passed; their parts before). */
    servd_bf16_t *qkv[3] = {m->q, m->k, m->v};
    const servd_bf16_t *wqkv[3] = {w->wq[l], w->wk[l], w->wv[l]};
    const int nqkv[3] = {qd, kd, kd};
    TRY(servd_cuda_matmul_many(c, 3, qkv, m->xb, wqkv, nqkv, T, h));
    TRY(servd_cuda_rope(c, m->q, m->d_pos, T, s->heads, &s->rope));
    TRY(servd_cuda_rope(c, m->k, m->d_pos, T, s->kv_heads, &s->rope));
    TRY(servd_cuda_kv_write(c, m->k_cache[l], m->v_cache[l], m->k, m->v, m->d_slots, T, kd,
                            (int64_t)m->max_seqs * m->blocks_per_seq * BLOCK));
    TRY(servd_cuda_attention(c, m->att, m->q, m->k_cache[l], m->v_cache[l], &ab, s->heads, s->kv_heads, s->head_dim,
                             BLOCK, scale));
    TRY(servd_cuda_matmul(c, m->xb, m->att, w->wo[l], T, h, qd));
    TRY(servd_cuda_add_rmsnorm(c, m->x, m->xb, m->xb, w->ffn_norm[l], T, h, s->eps));
    servd_bf16_t *gu[2] = {m->h1, m->h3};
    const servd_bf16_t *w13[2] = {w->w1[l], w->w3[l]};
    const int ngu[2] = {s->inter, s->inter};
    TRY(servd_cuda_matmul_many(c, 2, gu, m->xb, w13, ngu, T, h));
    TRY(servd_cuda_swiglu(c, m->h1, m->h1, m->h3, (int64_t)T * s->inter));
    TRY(servd_cuda_matmul(c, m->xb, m->h1, w->w2[l], T, h, s->inter));
    if (l + 1 < s->layers) TRY(servd_cuda_add_rmsnorm(c, m->x, m->xb, m->xb, w->attn_norm[l + 1], T, h, s->eps));
    else TRY(servd_cuda_add(c, m->x, m->x, m->xb, (int64_t)T * h));
  }
  /* Only the last row of each sequence needs logits: gather them with the embedding kernel. */
  TRY(servd_cuda_embedding(c, m->last, m->x, m->d_last, n_seqs, h, T));
  TRY(servd_cuda_rmsnorm(c, m->last, m->last, w->norm, n_seqs, h, s->eps));
  TRY(servd_cuda_matmul_f32out(c, m->logits, m->last, w->lm_head, n_seqs, s->vocab, h));
  return servd_cuda_argmax(c, m->d_next, m->logits, n_seqs, s->vocab);
}

int gpu_llama_step(gpu_llama *m, int n_seqs, const int32_t *tokens, const int32_t *q_len, const int32_t *kv_len,
                   int32_t *next) {
  if (n_seqs < 1 || n_seqs > m->max_seqs) return SERVD_EINVAL;
  int T;
  TRY(plan(m, n_seqs, tokens, q_len, kv_len, &T));
  TRY(forward(m, n_seqs, T, q_len, kv_len));
  if (next) return servd_cuda_download(m->c, next, m->d_next, n_seqs * sizeof(int32_t));
  return servd_cuda_sync(m->c);
}

int gpu_llama_decode_graph(gpu_llama *m, int n_seqs, const int32_t *tokens, const int32_t *kv_len, int32_t *next) {
  if (n_seqs < 1 || n_seqs > m->max_seqs || n_seqs > 128) return SERVD_EINVAL;
  int32_t ones[128];
  for (int i = 0; i < n_seqs; i++) ones[i] = 1;
  int T;
  TRY(plan(m, n_seqs, tokens, ones, kv_len, &T));
  if (!m->graphs[n_seqs - 1]) {
    TRY(forward(m, n_seqs, T, ones, kv_len)); /* warm-up: scratch and pool reach their sizes */
    TRY(servd_cuda_sync(m->c));
    TRY(plan(m, n_seqs, tokens, ones, kv_len, &T));
    TRY(servd_cuda_graph_begin(m->c));
    int rc = forward(m, n_seqs, T, ones, kv_len);
    servd_cuda_graph *g = NULL;
    int rc2 = servd_cuda_graph_end(m->c, &g);
    if (rc) return rc;
    if (rc2) return rc2;
    m->graphs[n_seqs - 1] = g;
  }
  TRY(servd_cuda_graph_launch(m->c, m->graphs[n_seqs - 1]));
  if (next) return servd_cuda_download(m->c, next, m->d_next, n_seqs * sizeof(int32_t));
  return servd_cuda_sync(m->c);
}
