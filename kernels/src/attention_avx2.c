/* Attention dot products and value accumulation with AVX2+FMA (f32 or f16 cache via F16C).
 * Dims past the last multiple of 8 are done in scalar code. */
#include "ops-impl.h"

static inline __m256 load8(const void *p, servd_dtype t, int64_t i) {
  if (t == SERVD_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
  return _mm256_loadu_ps((const float *)p + i);
}

static inline float elem(const void *p, servd_dtype t, int64_t i) {
  return t == SERVD_F16 ? servd_f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

void servd__attn_scores_avx2(float *out, const float *q, const void *k, servd_dtype kt, int n, int hd,
                             int64_t kstride, float scale) {
  size_t esz = kt == SERVD_F16 ? 2 : 4;
  int hd8 = hd & ~7;
  for (int j = 0; j < n; j++) {
    const char *kr = (const char *)k + (size_t)j * (size_t)kstride * esz;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= hd8; d += 16) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(kr, kt, d), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load8(kr, kt, d + 8), a1);
    }
    if (d < hd8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(kr, kt, d), a0);
    float s = ops__hsum256(_mm256_add_ps(a0, a1));
    for (d = hd8; d < hd; d++) s += q[d] * elem(kr, kt, d);
    out[j] = s * scale;
  }
}

void servd__attn_accum_avx2(float *acc, const float *p, const void *v, servd_dtype vt, int n, int hd,
                            int64_t vstride) {
  size_t esz = vt == SERVD_F16 ? 2 : 4;
  int hd8 = hd & ~7, d = 0;
  for (; d + 32 <= hd8; d += 32) { /* 32 dims of acc in 4 registers across all rows */
    __m256 a0 = _mm256_loadu_ps(acc + d), a1 = _mm256_loadu_ps(acc + d + 8);
    __m256 a2 = _mm256_loadu_ps(acc + d + 16), a3 = _mm256_loadu_ps(acc + d + 24);
    for (int j = 0; j < n; j++) {
      const char *vr = (const char *)v + (size_t)j * (size_t)vstride * esz;
      __m256 pj = _mm256_set1_ps(p[j]);
      a0 = _mm256_fmadd_ps(pj, load8(vr, vt, d), a0);
      a1 = _mm256_fmadd_ps(pj, load8(vr, vt, d + 8), a1);
      a2 = _mm256_fmadd_ps(pj, load8(vr, vt, d + 16), a2);
      a3 = _mm256_fmadd_ps(pj, load8(vr, vt, d + 24), a3);
    }
    _mm256_storeu_ps(acc + d, a0);
    _mm256_storeu_ps(acc + d + 8, a1);
    _mm256_storeu_ps(acc + d + 16, a2);
    _mm256_storeu_ps(acc + d + 24, a3);
  }
  for (; d < hd8; d += 8) {
    __m256 a0 = _mm256_loadu_ps(acc + d);
    for (int j = 0; j < n; j++)
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), load8((const char *)v + (size_t)j * (size_t)vstride * esz, vt, d), a0);
    _mm256_storeu_ps(acc + d, a0);
  }
  for (; d < hd; d++)
    for (int j = 0; j < n; j++) acc[d] += p[j] * elem((const char *)v + (size_t)j * (size_t)vstride * esz, vt, d);
}
