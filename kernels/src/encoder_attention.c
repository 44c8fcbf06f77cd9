/* encoder_attention: bidirectional attention within packed sequences (BERT-family encoders): every
 * query row sees every key of its own sequence and none of the others, so sequences of different
 * lengths share one batch without padding. q, k, v (t, n_heads, head_dim) f32 as the Q/K/V
 * projections write them; offsets i32 (n_seqs + 1) delimit the sequences. Work is split over query
 * rows; each row's heads run the per-ISA head kernel (encoder_attention_avx2.c). */
#include <math.h>
#include <stdlib.h>

#include "ops-impl.h"
#include "servd/threadpool.h"

int servd__check_encoder_attention(servd_tensor *out, const servd_tensor *q, const servd_tensor *k,
                                   const servd_tensor *v, const servd_tensor *offsets) {
  char bo[96], bq[96], bk[96], bv[96], bs[96];
  bool ok = out && q && k && v && offsets && q->ndim == 3 && q->dtype == SERVD_F32 && k->dtype == SERVD_F32 &&
            v->dtype == SERVD_F32 && out->dtype == SERVD_F32 && k->ndim == 3 && v->ndim == 3 && out->ndim == 2 &&
            offsets->dtype == SERVD_I32 && offsets->ndim == 1 && offsets->shape[0] >= 1;
  for (int i = 0; ok && i < 3; i++) ok = k->shape[i] == q->shape[i] && v->shape[i] == q->shape[i];
  ok = ok && out->shape[0] == q->shape[0] && out->shape[1] == q->shape[1] * q->shape[2] && q->shape[2] > 0;
  if (!ok)
    return servd_fail(SERVD_EINVAL,
                      "encoder_attention: expected q, k, v f32 (t, n_heads, head_dim), out f32 (t, n_heads*head_dim), "
                      "offsets i32 (n_seqs+1); got out %s, q %s, k %s, v %s, offsets %s",
                      ops__desc(out, bo, sizeof bo), ops__desc(q, bq, sizeof bq), ops__desc(k, bk, sizeof bk),
                      ops__desc(v, bv, sizeof bv), ops__desc(offsets, bs, sizeof bs));
  return 0;
}

void servd__enc_attn_head_scalar(float *o, const float *q, const float *k, const float *v, int n, int hd,
                                 int64_t stride, float scale, float *p) {
  float mx = -INFINITY;
  for (int j = 0; j < n; j++) {
    const float *kj = k + j * stride;
    float s = 0;
    for (int d = 0; d < hd; d++) s += q[d] * kj[d];
    p[j] = s * scale;
    if (p[j] > mx) mx = p[j];
  }
  float sum = 0;
  for (int j = 0; j < n; j++) sum += p[j] = expf(p[j] - mx);
  float inv = 1.0f / sum;
  for (int d = 0; d < hd; d++) o[d] = 0;
  for (int j = 0; j < n; j++) {
    const float *vj = v + j * stride;
    float w = p[j] * inv;
    for (int d = 0; d < hd; d++) o[d] += w * vj[d];
  }
}

typedef void (*head_fn)(float *, const float *, const float *, const float *, int, int, int64_t, float, float *);
typedef struct enc_job {
  char *o, *q, *k, *v;
  int64_t o_stride, q_stride, k_stride, v_stride; /* bytes between rows (tokens) */
  const int32_t *off;
  int n_seqs, heads, hd, longest;
  float scale;
  head_fn fn;
  float *scratch; /* longest floats per compute slot */
} enc_job;

static void enc_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const enc_job *j = ctx;
  float *p = j->scratch + (int64_t)thread * j->longest;
  int s = 0;
  for (int64_t r = begin; r < end; r++) {
    while (j->off[s + 1] <= r) s++; /* rows ascend: the sequence only moves forward */
    int first = j->off[s], n = j->off[s + 1] - first;
    for (int h = 0; h < j->heads; h++)
      j->fn((float *)(j->o + r * j->o_stride) + (int64_t)h * j->hd, (const float *)(j->q + r * j->q_stride) + h * j->hd,
            (const float *)(j->k + first * j->k_stride) + h * j->hd,
            (const float *)(j->v + first * j->v_stride) + h * j->hd, n, j->hd, j->k_stride / 4, j->scale, p);
  }
}

int servd_encoder_attention(servd_tensor *out, const servd_tensor *q, const servd_tensor *k, const servd_tensor *v,
                            const servd_tensor *offsets) {
  int rc = servd__check_encoder_attention(out, q, k, v, offsets);
  if (rc) return rc;
  int64_t t = q->shape[0];
  const int32_t *off = servd_tensor_data(offsets);
  int n_seqs = (int)offsets->shape[0] - 1, longest = 1;
  if (offsets->strides[0] != 4 || off[0] != 0 || off[n_seqs] != t)
    return servd_fail(SERVD_EINVAL, "encoder_attention: offsets must run from 0 to t = %lld (got %d .. %d)",
                      (long long)t, off[0], off[n_seqs]);
  for (int s = 0; s < n_seqs; s++) {
    if (off[s + 1] < off[s])
      return servd_fail(SERVD_EINVAL, "encoder_attention: offsets[%d] = %d is below offsets[%d] = %d", s + 1,
                        off[s + 1], s, off[s]);
    if (off[s + 1] - off[s] > longest) longest = off[s + 1] - off[s];
  }
  /* every row's heads contiguous, and k and v read with one row stride */
  bool rows_ok = q->strides[1] == q->shape[2] * 4 && k->strides[1] == k->shape[2] * 4 &&
                 v->strides[1] == v->shape[2] * 4 && k->strides[0] == v->strides[0] && out->strides[1] == 4;
  if (!rows_ok)
    return servd_fail(SERVD_EINVAL, "encoder_attention: the heads of a row must be contiguous, k and v one row stride");
  static const head_fn fns[SERVD_ISA_COUNT] = {servd__enc_attn_head_scalar, servd__enc_attn_head_avx2,
                                               servd__enc_attn_head_avx2};
  enc_job j = {servd_tensor_data(out),
               servd_tensor_data(q),
               servd_tensor_data(k),
               servd_tensor_data(v),
               out->strides[0],
               q->strides[0],
               k->strides[0],
               v->strides[0],
               off,
               n_seqs,
               (int)q->shape[1],
               (int)q->shape[2],
               longest,
               1.0f / sqrtf((float)q->shape[2]),
               fns[ops__isa()],
               NULL};
  if (t == 0) return 0;
  int slots = servd_threadpool_size();
  j.scratch = malloc((size_t)(slots > 0 ? slots : 1) * (size_t)longest * sizeof(float));
  if (!j.scratch) return servd_fail(SERVD_ENOMEM, "encoder_attention: out of memory for %d scores", longest);
  /* a row costs ~4 n hd flops per head: aim for a few hundred thousand per task */
  int64_t per_row = 4ll * longest * j.hd * j.heads, grain = per_row >= 200000 ? 1 : 200000 / per_row;
  servd_parallel_for(t, grain, enc_task, &j);
  free(j.scratch);
  return 0;
}
