/* The CPU reference of gpu_llama: the same weights copied to the host, f32 activations, the CPU ops. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_llama.h"
#include "servd/tensor.h"

#define TRY(call) \
  do { \
    int rc_ = (call); \
    if (rc_) goto fail; \
  } while (0)

enum { CPU_BLOCK = 16 };

/* gpu_llama's layout is private; cpu_llama reads the shape through this accessor. */
struct cpu_llama {
  llama_shape s;
  int max_ctx, n_blocks;
  servd_tensor *embed, *norm, *lm_head;
  servd_tensor **attn_norm, **wq, **wk, **wv, **wo, **ffn_norm, **w1, **w2, **w3;
  servd_kv_cache *kv;
  int32_t *table;
};

const llama_shape *gpu_llama_shape(const gpu_llama *g);

static servd_tensor *download(servd_cuda_ctx *c, const servd_bf16_t *src, int64_t rows, int64_t cols) {
  int64_t shape[2] = {rows, cols};
  servd_tensor *t = servd_tensor_new(SERVD_BF16, cols ? 2 : 1, cols ? shape : &rows);
  if (!t) return NULL;
  if (servd_cuda_download(c, servd_tensor_data(t), src, (size_t)servd_tensor_nbytes(t))) {
    servd_tensor_release(t);
    return NULL;
  }
  return t;
}

int cpu_llama_create(servd_cuda_ctx *c, const gpu_llama *g, int max_ctx, cpu_llama **out) {
  cpu_llama *m = calloc(1, sizeof *m);
  if (!m) return SERVD_ENOMEM;
  *out = m;
  m->s = *gpu_llama_shape(g);
  const llama_shape *s = &m->s;
  const llama_weights *w = gpu_llama_weights(g);
  const int64_t h = s->hidden, qd = (int64_t)s->heads * s->head_dim, kd = (int64_t)s->kv_heads * s->head_dim;
  servd_tensor ***lists[] = {&m->attn_norm, &m->wq, &m->wk, &m->wv, &m->wo, &m->ffn_norm, &m->w1, &m->w2, &m->w3};
  for (size_t i = 0; i < 9; i++)
    if (!(*lists[i] = calloc((size_t)s->layers, sizeof(servd_tensor *)))) return SERVD_ENOMEM;
  if (!(m->embed = download(c, w->embed, s->vocab, h)) || !(m->lm_head = download(c, w->lm_head, s->vocab, h)) ||
      !(m->norm = download(c, w->norm, h, 0)))
    return SERVD_ENOMEM;
  for (int l = 0; l < s->layers; l++) {
    if (!(m->wq[l] = download(c, w->wq[l], qd, h)) || !(m->wk[l] = download(c, w->wk[l], kd, h)) ||
        !(m->wv[l] = download(c, w->wv[l], kd, h)) || !(m->wo[l] = download(c, w->wo[l], h, qd)) ||
        !(m->w1[l] = download(c, w->w1[l], s->inter, h)) || !(m->w3[l] = download(c, w->w3[l], s->inter, h)) ||
        !(m->w2[l] = download(c, w->w2[l], h, s->inter)) || !(m->attn_norm[l] = download(c, w->attn_norm[l], h, 0)) ||
        !(m->ffn_norm[l] = download(c, w->ffn_norm[l], h, 0)))
      return SERVD_ENOMEM;
  }
  m->max_ctx = max_ctx;
  m->n_blocks = (max_ctx + CPU_BLOCK - 1) / CPU_BLOCK;
  int rc = servd_kv_cache_create(&m->kv, s->layers, s->kv_heads, s->head_dim, CPU_BLOCK, m->n_blocks, SERVD_F32);
  if (rc) return rc;
  m->table = malloc(sizeof(int32_t) * m->n_blocks);
  if (!m->table) return SERVD_ENOMEM;
  return servd_kv_cache_alloc(m->kv, m->n_blocks, m->table);
}

void cpu_llama_destroy(cpu_llama *m) {
  if (!m) return;
  servd_tensor_release(m->embed);
  servd_tensor_release(m->norm);
  servd_tensor_release(m->lm_head);
  servd_tensor **lists[] = {m->attn_norm, m->wq, m->wk, m->wv, m->wo, m->ffn_norm, m->w1, m->w2, m->w3};
  for (size_t i = 0; i < 9; i++) {
    for (int l = 0; lists[i] && l < m->s.layers; l++) servd_tensor_release(lists[i][l]);
    free(lists[i]);
  }
  servd_kv_cache_destroy(m->kv);
  free(m->table);
  free(m);
}

static servd_tensor *f32(int64_t r, int64_t c) {
  int64_t shape[2] = {r, c};
  return servd_tensor_new(SERVD_F32, 2, shape);
}

int cpu_llama_step(cpu_llama *m, const int32_t *tokens, int n, int pos, int32_t *next, float *top2_margin) {
  const llama_shape *s = &m->s;
  const int64_t h = s->hidden, qd = (int64_t)s->heads * s->head_dim, kd = (int64_t)s->kv_heads * s->head_dim;
  int rc = SERVD_ENOMEM;
  int64_t nn = n;
  servd_tensor *ids = servd_tensor_new(SERVD_I32, 1, &nn), *posv = servd_tensor_new(SERVD_I32, 1, &nn),
               *slots = servd_tensor_new(SERVD_I32, 1, &nn);
  servd_tensor *x = f32(n, h), *xb = f32(n, h), *q = f32(n, qd), *k = f32(n, kd), *v = f32(n, kd), *att = f32(n, qd),
               *h1 = f32(n, s->inter), *h3 = f32(n, s->inter), *logits = f32(1, s->vocab), *last = NULL,
               *lastn = f32(1, h);
  if (!ids || !posv || !slots || !x || !xb || !q || !k || !v || !att || !h1 || !h3 || !logits || !lastn) goto fail;
  if (pos + n > m->max_ctx) {
    rc = SERVD_EINVAL;
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    ((int32_t *)servd_tensor_data(ids))[i] = tokens[i];
    ((int32_t *)servd_tensor_data(posv))[i] = pos + i;
    ((int32_t *)servd_tensor_data(slots))[i] = m->table[(pos + i) / CPU_BLOCK] * CPU_BLOCK + (pos + i) % CPU_BLOCK;
  }
  const int32_t q_start = 0, q_len = n, kv_len = pos + n;
  const int32_t *tables[1] = {m->table};
  const servd_attn_batch ab = {1, &q_start, &q_len, &kv_len, tables};
  const float scale = 1.0f / sqrtf((float)s->head_dim);
  TRY(rc = servd_embedding(x, m->embed, ids, 0));
  for (int l = 0; l < s->layers; l++) {
    TRY(rc = servd_rmsnorm(xb, x, m->attn_norm[l], s->eps));
    TRY(rc = servd_matmul(q, xb, m->wq[l]));
    TRY(rc = servd_matmul(k, xb, m->wk[l]));
    TRY(rc = servd_matmul(v, xb, m->wv[l]));
    TRY(rc = servd_rope(q, posv, &s->rope));
    TRY(rc = servd_rope(k, posv, &s->rope));
    TRY(rc = servd_kv_write(m->kv, l, k, v, slots));
    TRY(rc = servd_attention(att, q, m->kv, l, &ab, s->heads, scale));
    TRY(rc = servd_matmul(xb, att, m->wo[l]));
    TRY(rc = servd_add(x, x, xb));
    TRY(rc = servd_rmsnorm(xb, x, m->ffn_norm[l], s->eps));
    TRY(rc = servd_matmul(h1, xb, m->w1[l]));
    TRY(rc = servd_matmul(h3, xb, m->w3[l]));
    TRY(rc = servd_swiglu(h1, h1, h3));
    TRY(rc = servd_matmul(xb, h1, m->w2[l]));
    TRY(rc = servd_add(x, x, xb));
  }
  rc = SERVD_ENOMEM;
  if (!(last = servd_tensor_narrow(x, 0, n - 1, 1))) goto fail;
  TRY(rc = servd_rmsnorm(lastn, last, m->norm, s->eps));
  TRY(rc = servd_matmul(logits, lastn, m->lm_head));
  const float *lg = servd_tensor_data(logits);
  int best = 0;
  for (int i = 1; i < s->vocab; i++)
    if (lg[i] > lg[best]) best = i;
  float second = -INFINITY;
  for (int i = 0; i < s->vocab; i++)
    if (i != best && lg[i] > second) second = lg[i];
  *next = best;
  *top2_margin = lg[best] - second;
  rc = SERVD_OK;
fail:;
  servd_tensor *all[] = {ids, posv, slots, x, xb, q, k, v, att, h1, h3, logits, last, lastn};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) servd_tensor_release(all[i]);
  return rc;
}
