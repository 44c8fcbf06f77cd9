/* Attention dot products and value accumulation with AVX-512 (f32 or f16 cache via F16C). */
#include "avx512-impl.h"
#include "ops-impl.h"

static inline __m512 load16(const void *p, servd_dtype t, int64_t i, __mmask16 m) {
  if (t == SERVD_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
  return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

/* NQ queries (a compile-time constant after inlining, so acc[] lives in registers) against 16 keys:
 * per dim, one K vector (16 keys) and NQ broadcast FMAs. Even and odd dims go to separate
 * accumulators so that 2*NQ independent FMA chains hide the FMA latency when NQ is small. */
static inline __attribute__((always_inline)) void scores_block(int NQ, float *out, int ld, const float *const *q,
                                                               const char *k, servd_dtype kt, __mmask16 m, int hd,
                                                               size_t krow, float scale, const char *pf) {
  /* the second line of a dim pair, when the two rows span more than one */
  size_t second = 2 * krow > 64 ? krow + 15 * (kt == SERVD_F16 ? 2 : 4) : 0;
  __m512 a0[8], a1[8];
  for (int i = 0; i < NQ; i++) a0[i] = a1[i] = _mm512_setzero_ps();
  int d = 0;
  for (; d + 2 <= hd; d += 2) {
    __m512 k0, k1;
    if (pf) { /* the lines of the two rows read below, in the later block */
      _mm_prefetch(pf + (size_t)d * krow, _MM_HINT_T0);
      if (second) _mm_prefetch(pf + (size_t)d * krow + second, _MM_HINT_T0);
    }
    if (kt == SERVD_F16) {
      k0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, k + (size_t)d * krow));
      k1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, k + (size_t)(d + 1) * krow));
    } else {
      k0 = _mm512_maskz_loadu_ps(m, k + (size_t)d * krow);
      k1 = _mm512_maskz_loadu_ps(m, k + (size_t)(d + 1) * krow);
    }
    for (int i = 0; i < NQ; i++) {
      a0[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d]), k0, a0[i]);
      a1[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d + 1]), k1, a1[i]);
    }
  }
  if (d < hd) {
    __m512 k0 = kt == SERVD_F16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, k + (size_t)d * krow))
                                : _mm512_maskz_loadu_ps(m, k + (size_t)d * krow);
    for (int i = 0; i < NQ; i++) a0[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d]), k0, a0[i]);
  }
  __m512 sv = _mm512_set1_ps(scale);
  for (int i = 0; i < NQ; i++)
    _mm512_mask_storeu_ps(out + (size_t)i * (size_t)ld, m, _mm512_mul_ps(_mm512_add_ps(a0[i], a1[i]), sv));
}

void servd__attn_scores_avx512(float *out, int ld, const float *const *q, int nq, const void *k, servd_dtype kt, int n,
                               int hd, int64_t kstride, float scale, const void *pf) {
  size_t esz = kt == SERVD_F16 ? 2 : 4, krow = (size_t)kstride * esz;
  for (int j = 0; j < n; j += 16) {
    __mmask16 m = tail16(n - j);
    const char *kj = (const char *)k + (size_t)j * esz;
    for (int i = 0; i < nq; i += 8) {
      int c = nq - i < 8 ? nq - i : 8;
      float *o = out + (size_t)i * (size_t)ld + (size_t)j;
      const char *pj = pf && i == 0 ? (const char *)pf + (size_t)j * esz : NULL; /* once per K row */
      switch (c) {
      case 1: scores_block(1, o, ld, q + i, kj, kt, m, hd, krow, scale, pj); break;
      case 2: scores_block(2, o, ld, q + i, kj, kt, m, hd, krow, scale, pj); break;
      case 3: scores_block(3, o, ld, q + i, kj, kt, m, hd, krow, scale, pj); break;
      case 4: scores_block(4, o, ld, q + i, kj, kt, m, hd, krow, scale, pj); break;
      case 5: scores_block(5, o, ld, q + i, kj, kt, m, hd, krow, scale, pj); break;
      case 6: scores_block(6, o, ld, q + i, kj, kt, m, hd, krow, scale, pj); break;
      case 7: scores_block(7, o, ld, q + i, kj, kt, m, hd, krow, scale, pj); break;
      default: scores_block(8, o, ld, q + i, kj, kt, m, hd, krow, scale, pj); break;
      }
    }
  }
}

/* NQ queries (constant after inlining) x 32 dims of acc in registers while the n value rows stream by:
 * each loaded value vector serves all NQ queries. */
static inline __attribute__((always_inline)) void accum_block(int NQ, float *acc, int acc_ld, const float *p, int ld,
                                                              const char *v, servd_dtype vt, int n, size_t vrow,
                                                              __mmask16 m0, __mmask16 m1, const char *pf) {
  size_t second = vt == SERVD_F16 ? 0 : 64; /* 32 dims of f32 are two lines, of f16 one */
  __m512 a0[8], a1[8];
  for (int i = 0; i < NQ; i++) {
    a0[i] = _mm512_maskz_loadu_ps(m0, acc + (size_t)i * (size_t)acc_ld);
    a1[i] = _mm512_maskz_loadu_ps(m1, acc + (size_t)i * (size_t)acc_ld + 16);
  }
  for (int j = 0; j < n; j++) {
    const char *vr = v + (size_t)j * vrow;
    if (pf) {
      _mm_prefetch(pf + (size_t)j * vrow, _MM_HINT_T0);
      if (second) _mm_prefetch(pf + (size_t)j * vrow + second, _MM_HINT_T0);
    }
    __m512 v0 = load16(vr, vt, 0, m0), v1 = load16(vr, vt, 16, m1);
    for (int i = 0; i < NQ; i++) {
      __m512 pj = _mm512_set1_ps(p[(size_t)i * (size_t)ld + (size_t)j]);
      a0[i] = _mm512_fmadd_ps(pj, v0, a0[i]);
      a1[i] = _mm512_fmadd_ps(pj, v1, a1[i]);
    }
  }
  for (int i = 0; i < NQ; i++) {
    _mm512_mask_storeu_ps(acc + (size_t)i * (size_t)acc_ld, m0, a0[i]);
    _mm512_mask_storeu_ps(acc + (size_t)i * (size_t)acc_ld + 16, m1, a1[i]);
  }
}

void servd__attn_accum_avx512(float *acc, int acc_ld, const float *p, int ld, int nq, const void *v, servd_dtype vt,
                              int n, int hd, int64_t vstride, const void *pf) {
  size_t esz = vt == SERVD_F16 ? 2 : 4, vrow = (size_t)vstride * esz;
  for (int d = 0; d < hd; d += 32) {
    __mmask16 m0 = tail16(hd - d), m1 = tail16(hd - d - 16);
    const char *vd = (const char *)v + (size_t)d * esz;
    for (int i = 0; i < nq; i += 8) {
      int c = nq - i < 8 ? nq - i : 8;
      float *a = acc + (size_t)i * (size_t)acc_ld + d;
      const float *pi = p + (size_t)i * (size_t)ld;
      const char *pd = pf && i == 0 ? (const char *)pf + (size_t)d * esz : NULL; /* once per V row */
      switch (c) {
      case 1: accum_block(1, a, acc_ld, pi, ld, vd, vt, n, vrow, m0, m1, pd); break;
      case 2: accum_block(2, a, acc_ld, pi, ld, vd, vt, n, vrow, m0, m1, pd); break;
      case 3: accum_block(3, a, acc_ld, pi, ld, vd, vt, n, vrow, m0, m1, pd); break;
      case 4: accum_block(4, a, acc_ld, pi, ld, vd, vt, n, vrow, m0, m1, pd); break;
      case 5: accum_block(5, a, acc_ld, pi, ld, vd, vt, n, vrow, m0, m1, pd); break;
      case 6: accum_block(6, a, acc_ld, pi, ld, vd, vt, n, vrow, m0, m1, pd); break;
      case 7: accum_block(7, a, acc_ld, pi, ld, vd, vt, n, vrow, m0, m1, pd); break;
      default: accum_block(8, a, acc_ld, pi, ld, vd, vt, n, vrow, m0, m1, pd); break;
      }
    }
  }
}
