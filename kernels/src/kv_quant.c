/* The quantized KV cache (q8_0, q4_0; run layout in ops-impl.h): writing a token's K and V, and the
 * scalar reference of attention's two kernels over it, which the SIMD ones are tested against. */
#include "ops-impl.h"

#include "servd/blocks.h"

/* q4_0 codes of K: two tokens per byte. Writers of the two tokens of a byte may run on different
 * threads (kv_write splits its rows), so each nibble is set with atomic byte operations. */
static void put_nibble(uint8_t *p, int off, int code) {
  int sh = (off & 1) * 4;
  __atomic_and_fetch(p, (uint8_t) ~(0xF << sh), __ATOMIC_RELAXED);
  __atomic_or_fetch(p, (uint8_t)(code << sh), __ATOMIC_RELAXED);
}

void ops__kvq_write(const struct servd_kv_cache *c, char *krun, char *vrun, int off, const float *k, const float *v) {
  int hd = c->head_dim, bs = c->block_size, nb = hd / 32;
  size_t bb = servd_dtype_block_bytes(c->dtype), krow = ops__kvq_krow(c->dtype, bs);
  /* V: the token's blocks as they are */
  servd_row_from_f32(c->dtype, v, vrun + (size_t)off * (size_t)nb * bb, hd);
  uint16_t *scales = (uint16_t *)krun;
  uint8_t *codes = (uint8_t *)krun + ops__kvq_scale_bytes(hd, bs);
  for (int b = 0; b < nb; b++) {
    /* K: one block through the reference quantizer, then scattered into the transposed rows */
    union {
      servd_block_q8_0 q8;
      servd_block_q4_0 q4;
    } blk;
    servd_row_from_f32(c->dtype, k + b * 32, &blk, 32);
    scales[(size_t)b * (size_t)bs + (size_t)off] = c->dtype == SERVD_Q8_0 ? blk.q8.d : blk.q4.d;
    for (int e = 0; e < 32; e++) {
      uint8_t *row = codes + (size_t)(b * 32 + e) * krow;
      if (c->dtype == SERVD_Q8_0) row[off] = (uint8_t)blk.q8.qs[e];
      else put_nibble(row + off / 2, off, e < 16 ? blk.q4.qs[e] & 15 : blk.q4.qs[e - 16] >> 4);
    }
  }
}

/* Dim d of key t of a K run, dequantized. */
static float k_value(const char *run, servd_dtype kt, int hd, int bs, int t, int d) {
  const uint16_t *scales = (const uint16_t *)run;
  const uint8_t *row = (const uint8_t *)run + ops__kvq_scale_bytes(hd, bs) + (size_t)d * ops__kvq_krow(kt, bs);
  float s = servd_f16_to_f32(scales[(size_t)(d / 32) * (size_t)bs + (size_t)t]);
  if (kt == SERVD_Q8_0) return s * (float)(int8_t)row[t];
  return s * (float)(((row[t / 2] >> ((t & 1) * 4)) & 15) - 8);
}

/* Dim d of value row t of a V run, dequantized. */
static float v_value(const char *run, servd_dtype vt, int hd, int t, int d) {
  size_t bb = servd_dtype_block_bytes(vt);
  const char *blk = run + ((size_t)t * (size_t)(hd / 32) + (size_t)(d / 32)) * bb;
  int e = d % 32;
  if (vt == SERVD_Q8_0) {
    const servd_block_q8_0 *b = (const servd_block_q8_0 *)blk;
    return servd_f16_to_f32(b->d) * (float)b->qs[e];
  }
  const servd_block_q4_0 *b = (const servd_block_q4_0 *)blk;
  int code = e < 16 ? b->qs[e] & 15 : b->qs[e - 16] >> 4;
  return servd_f16_to_f32(b->d) * (float)(code - 8);
}

void servd__attn_scores_q_scalar(float *out, int ld, const float *const *q, int nq, const char *run, servd_dtype kt,
                                 int off, int n, int hd, int bs, float scale, const char *pf) {
  (void)pf; /* the reference kernel does not prefetch */
  for (int i = 0; i < nq; i++)
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int d = 0; d < hd; d++) s += q[i][d] * k_value(run, kt, hd, bs, off + j, d);
      out[(size_t)i * (size_t)ld + (size_t)j] = s * scale;
    }
}

void servd__attn_accum_q_scalar(float *acc, int acc_ld, const float *p, int ld, int nq, const char *run, servd_dtype vt,
                                int off, int n, int hd, const char *pf) {
  (void)pf;
  for (int i = 0; i < nq; i++)
    for (int j = 0; j < n; j++) {
      float pj = p[(size_t)i * (size_t)ld + (size_t)j];
      float *a = acc + (size_t)i * (size_t)acc_ld;
      for (int d = 0; d < hd; d++) a[d] += pj * v_value(run, vt, hd, off + j, d);
    }
}

void servd__kvq_dequant_k_scalar(float *out, int ld, const char *run, servd_dtype kt, int off, int n, int hd, int bs) {
  for (int d = 0; d < hd; d++)
    for (int j = 0; j < n; j++) out[(size_t)d * (size_t)ld + (size_t)j] = k_value(run, kt, hd, bs, off + j, d);
}

void servd__kvq_dequant_v_scalar(float *out, const char *run, servd_dtype vt, int off, int n, int hd) {
  for (int j = 0; j < n; j++)
    for (int d = 0; d < hd; d++) out[(size_t)j * (size_t)hd + (size_t)d] = v_value(run, vt, hd, off + j, d);
}
