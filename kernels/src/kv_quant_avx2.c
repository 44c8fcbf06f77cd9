/* Attention's two kernels over a quantized cache (q8_0, q4_0) with AVX2+FMA, reading the codes in
 * place (layout in ops-impl.h): codes become f32 in registers, never a dequantized copy.
 *
 * scores: 16 keys' codes of one dim are one load, as with f16, times the 16 keys' scales of that
 * block, FMA'd with each query's broadcast dim. accum: a value row's 16 dims are one load, times its
 * block scale, shared by every query's FMA. Both give the very floats the f32 kernels give on the
 * tile dequant_k / dequant_v write (what a prefill's many queries read): a row's attention does not
 * depend on whether it ran in a prefill chunk or as a decode row. */
#include "ops-impl.h"
#include "attention_avx2-impl.h"

#include "servd/blocks.h"

/* 16 int8 codes -> two vectors of 8 f32 */
static inline void cvt16(__m128i x, __m256 *lo, __m256 *hi) {
  *lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
  *hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)));
}

/* The same from memory: each half sign-extended straight from its 8 bytes (no shuffle for the high
 * half), what q8_0's codes allow. */
static inline void cvt16_at(const void *p, __m256 *lo, __m256 *hi) {
  *lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
  *hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const char *)p + 8))));
}

/* Codes of keys [off, off+16) of one K dim row, as int8 (q4_0: nibble - 8). */
static inline __m128i key_codes(const uint8_t *row, servd_dtype kt, int off) {
  if (kt == SERVD_Q8_0) return _mm_loadu_si128((const __m128i *)(row + off));
  __m128i b = _mm_loadl_epi64((const __m128i *)(row + off / 2)), m = _mm_set1_epi8(15);
  __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  return _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), _mm_set1_epi8(8)); /* even, odd, even, ... */
}

/* The same for n < 16 keys or a q4_0 run read from an odd key: codes one by one, zero past n. */
static inline __m128i key_codes_slow(const uint8_t *row, servd_dtype kt, int off, int n) {
  int8_t tmp[16] = {0};
  for (int j = 0; j < n; j++) {
    int t = off + j;
    tmp[j] = kt == SERVD_Q8_0 ? (int8_t)row[t] : (int8_t)(((row[t / 2] >> ((t & 1) * 4)) & 15) - 8);
  }
  return _mm_loadu_si128((const __m128i *)tmp);
}

/* f16 scales of keys [off, off+n) of one block, zero past n. */
static inline void key_scales(const uint16_t *s, int n, __m256 *lo, __m256 *hi) {
  if (n == 16) {
    *lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
    *hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 8)));
    return;
  }
  uint16_t tmp[16] = {0};
  memcpy(tmp, s, (size_t)n * sizeof *tmp);
  *lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tmp));
  *hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tmp + 8)));
}

/* NQ (<= 6, constant after inlining) queries against n <= 16 keys from key off: per dim, the 16
 * keys' codes times their block's scales (the f32 values dequant_k would write), then one FMA per
 * query, as the f32 kernel runs on such a tile: a row's scores are the same floats either way. */
static inline __attribute__((always_inline)) void scores_block(int NQ, float *out, int ld, const float *const *q,
                                                               const char *run, servd_dtype kt, int off, int n, int hd,
                                                               int bs, float scale, const char *pf) {
  const uint16_t *scales = (const uint16_t *)run + off;
  const uint8_t *codes = (const uint8_t *)run + ops__kvq_scale_bytes(hd, bs);
  size_t krow = ops__kvq_krow(kt, bs), lines = (ops__kvq_scale_bytes(hd, bs) + (size_t)hd * krow + 63) / 64;
  bool fast = n == 16 && (kt == SERVD_Q8_0 || (off & 1) == 0);
  __m256 a0[6], a1[6];
  for (int i = 0; i < NQ; i++) a0[i] = a1[i] = _mm256_setzero_ps();
  for (int b = 0; b < hd / 32; b++) {
    __m256 s0, s1;
    key_scales(scales + (size_t)b * (size_t)bs, n, &s0, &s1);
    for (int e = 0; e < 32; e++) {
      int d = b * 32 + e;
      if (pf && (size_t)d < lines) _mm_prefetch(pf + (size_t)d * 64, _MM_HINT_T0); /* the run, a line per dim */
      const uint8_t *row = codes + (size_t)d * krow;
      __m256 k0, k1;
      if (fast && kt == SERVD_Q8_0) cvt16_at(row + off, &k0, &k1);
      else cvt16(fast ? key_codes(row, kt, off) : key_codes_slow(row, kt, off, n), &k0, &k1);
      k0 = _mm256_mul_ps(k0, s0);
      k1 = _mm256_mul_ps(k1, s1);
      attn16_fma_q(NQ, a0, a1, q, d, k0, k1);
    }
  }
  attn16_store_scaled(NQ, a0, a1, scale, out, ld, n);
}

void servd__attn_scores_q_avx2(float *out, int ld, const float *const *q, int nq, const char *run, servd_dtype kt,
                               int off, int n, int hd, int bs, float scale, const char *pf) {
  for (int j = 0; j < n; j += 16) {
    int nj = n - j < 16 ? n - j : 16;
    for (int i = 0; i < nq; i += 6) {
      int c = nq - i < 6 ? nq - i : 6;
      float *o = out + (size_t)i * (size_t)ld + (size_t)j;
      const char *pj = i == 0 && j == 0 ? pf : NULL; /* once per run */
      switch (c) {
      case 1: scores_block(1, o, ld, q + i, run, kt, off + j, nj, hd, bs, scale, pj); break;
      case 2: scores_block(2, o, ld, q + i, run, kt, off + j, nj, hd, bs, scale, pj); break;
      case 3: scores_block(3, o, ld, q + i, run, kt, off + j, nj, hd, bs, scale, pj); break;
      case 4: scores_block(4, o, ld, q + i, run, kt, off + j, nj, hd, bs, scale, pj); break;
      case 5: scores_block(5, o, ld, q + i, run, kt, off + j, nj, hd, bs, scale, pj); break;
      default: scores_block(6, o, ld, q + i, run, kt, off + j, nj, hd, bs, scale, pj); break;
      }
    }
  }
}

/* 16 dims [e, e+16) (e 0 or 16) of one block of a value row, as int8. */
static inline __m128i value_codes(const char *blk, servd_dtype vt, int e) {
  if (vt == SERVD_Q8_0) return _mm_loadu_si128((const __m128i *)(((const servd_block_q8_0 *)blk)->qs + e));
  __m128i b = _mm_loadu_si128((const __m128i *)((const servd_block_q4_0 *)blk)->qs);
  if (e) b = _mm_srli_epi16(b, 4);
  return _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(15)), _mm_set1_epi8(8));
}

/* NQ (<= 6, constant after inlining) queries x 16 dims [d, d+16) of acc in registers while the n
 * value rows stream by: each row's codes times its block scale (the f32 values dequant_v would write),
 * then one FMA per query, as the f32 kernel runs on such a tile. */
static inline __attribute__((always_inline)) void accum_block(int NQ, float *acc, int acc_ld, const float *p, int ld,
                                                              const char *rows, servd_dtype vt, int n, size_t vrow,
                                                              int d, const char *pf) {
  size_t at = (size_t)(d / 32) * servd_dtype_block_bytes(vt);
  __m256 a0[6], a1[6];
  attn16_load(NQ, a0, a1, acc, acc_ld);
  for (int j = 0; j < n; j++) {
    const char *blk = rows + (size_t)j * vrow + at;
    if (pf) _mm_prefetch(pf + (size_t)j * vrow + at, _MM_HINT_T0); /* this block's line in the later run */
    __m256 ds = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)blk)), v0, v1;
    if (vt == SERVD_Q8_0) cvt16_at(((const servd_block_q8_0 *)blk)->qs + d % 32, &v0, &v1);
    else cvt16(value_codes(blk, vt, d % 32), &v0, &v1);
    v0 = _mm256_mul_ps(v0, ds);
    v1 = _mm256_mul_ps(v1, ds);
    attn16_fma(NQ, a0, a1, p + j, (size_t)ld, v0, v1);
  }
  attn16_store(NQ, a0, a1, acc, acc_ld);
}

void servd__attn_accum_q_avx2(float *acc, int acc_ld, const float *p, int ld, int nq, const char *run, servd_dtype vt,
                              int off, int n, int hd, const char *pf) {
  size_t vrow = (size_t)(hd / 32) * servd_dtype_block_bytes(vt);
  const char *rows = run + (size_t)off * vrow;
  const char *pfr = pf ? pf + (size_t)off * vrow : NULL;
  for (int d = 0; d < hd; d += 16) {
    for (int i = 0; i < nq; i += 6) {
      int c = nq - i < 6 ? nq - i : 6;
      float *a = acc + (size_t)i * (size_t)acc_ld + d;
      const float *pi = p + (size_t)i * (size_t)ld;
      const char *pd = pfr && i == 0 && d % 32 == 0 ? pfr : NULL; /* once per block of a row */
      switch (c) {
      case 1: accum_block(1, a, acc_ld, pi, ld, rows, vt, n, vrow, d, pd); break;
      case 2: accum_block(2, a, acc_ld, pi, ld, rows, vt, n, vrow, d, pd); break;
      case 3: accum_block(3, a, acc_ld, pi, ld, rows, vt, n, vrow, d, pd); break;
      case 4: accum_block(4, a, acc_ld, pi, ld, rows, vt, n, vrow, d, pd); break;
      case 5: accum_block(5, a, acc_ld, pi, ld, rows, vt, n, vrow, d, pd); break;
      default: accum_block(6, a, acc_ld, pi, ld, rows, vt, n, vrow, d, pd); break;
      }
    }
  }
}

void servd__kvq_dequant_k_avx2(float *out, int ld, const char *run, servd_dtype kt, int off, int n, int hd, int bs) {
  const uint16_t *scales = (const uint16_t *)run + off;
  const uint8_t *codes = (const uint8_t *)run + ops__kvq_scale_bytes(hd, bs);
  size_t krow = ops__kvq_krow(kt, bs);
  for (int j = 0; j < n; j += 16) {
    int nj = n - j < 16 ? n - j : 16;
    bool fast = nj == 16 && (kt == SERVD_Q8_0 || ((off + j) & 1) == 0);
    for (int b = 0; b < hd / 32; b++) {
      __m256 s0, s1;
      key_scales(scales + (size_t)b * (size_t)bs + j, nj, &s0, &s1);
      for (int d = b * 32; d < b * 32 + 32; d++) {
        const uint8_t *row = codes + (size_t)d * krow;
        __m256 k0, k1;
        cvt16(fast ? key_codes(row, kt, off + j) : key_codes_slow(row, kt, off + j, nj), &k0, &k1);
        float *o = out + (size_t)d * (size_t)ld + (size_t)j;
        if (nj == 16) {
          _mm256_storeu_ps(o, _mm256_mul_ps(k0, s0));
          _mm256_storeu_ps(o + 8, _mm256_mul_ps(k1, s1));
        } else {
          float tmp[16];
          _mm256_storeu_ps(tmp, _mm256_mul_ps(k0, s0));
          _mm256_storeu_ps(tmp + 8, _mm256_mul_ps(k1, s1));
          memcpy(o, tmp, (size_t)nj * sizeof(float));
        }
      }
    }
  }
}

void servd__kvq_dequant_v_avx2(float *out, const char *run, servd_dtype vt, int off, int n, int hd) {
  size_t bb = servd_dtype_block_bytes(vt), vrow = (size_t)(hd / 32) * bb;
  for (int j = 0; j < n; j++)
    for (int b = 0; b < hd / 32; b++) {
      const char *blk = run + (size_t)(off + j) * vrow + (size_t)b * bb;
      __m256 ds = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)blk));
      float *o = out + (size_t)j * (size_t)hd + (size_t)b * 32;
      for (int e = 0; e < 32; e += 16) {
        __m256 v0, v1;
        cvt16(value_codes(blk, vt, e), &v0, &v1);
        _mm256_storeu_ps(o + e, _mm256_mul_ps(v0, ds));
        _mm256_storeu_ps(o + e + 8, _mm256_mul_ps(v1, ds));
      }
    }
}
