/* Attention dot products and value accumulation with AVX-512 (f32 or f16 cache via F16C). */
#include "ops-impl.h"

static inline __mmask16 tail16(int left) {
  return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

static inline __m512 load16(const void *p, servd_dtype t, int64_t i, __mmask16 m) {
  if (t == SERVD_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
  return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

void servd__attn_scores_avx512(float *out, const float *q, const void *k, servd_dtype kt, int n, int hd,
                               int64_t kstride, float scale) {
  size_t esz = kt == SERVD_F16 ? 2 : 4;
  int j = 0;
  /* two keys at a time share the q loads and hide the FMA latency */
  for (; j + 2 <= n; j += 2) {
    const char *k0 = (const char *)k + (size_t)j * (size_t)kstride * esz, *k1 = k0 + (size_t)kstride * esz;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 16) {
      __mmask16 m = tail16(hd - d);
      __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
      a0 = _mm512_fmadd_ps(qv, load16(k0, kt, d, m), a0);
      a1 = _mm512_fmadd_ps(qv, load16(k1, kt, d, m), a1);
    }
    out[j] = _mm512_reduce_add_ps(a0) * scale;
    out[j + 1] = _mm512_reduce_add_ps(a1) * scale;
  }
  for (; j < n; j++) {
    const char *k0 = (const char *)k + (size_t)j * (size_t)kstride * esz;
    __m512 a0 = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 16) {
      __mmask16 m = tail16(hd - d);
      a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), load16(k0, kt, d, m), a0);
    }
    out[j] = _mm512_reduce_add_ps(a0) * scale;
  }
}

void servd__attn_accum_avx512(float *acc, const float *p, const void *v, servd_dtype vt, int n, int hd,
                              int64_t vstride) {
  size_t esz = vt == SERVD_F16 ? 2 : 4;
  /* 64 dims of acc stay in 4 registers while all n value rows stream by */
  for (int d = 0; d < hd; d += 64) {
    __mmask16 m0 = tail16(hd - d), m1 = tail16(hd - d - 16), m2 = tail16(hd - d - 32), m3 = tail16(hd - d - 48);
    if (hd - d < 16) m1 = 0;
    if (hd - d < 32) m2 = 0;
    if (hd - d < 48) m3 = 0;
    __m512 a0 = _mm512_maskz_loadu_ps(m0, acc + d), a1 = _mm512_maskz_loadu_ps(m1, acc + d + 16);
    __m512 a2 = _mm512_maskz_loadu_ps(m2, acc + d + 32), a3 = _mm512_maskz_loadu_ps(m3, acc + d + 48);
    for (int j = 0; j < n; j++) {
      const char *vr = (const char *)v + (size_t)j * (size_t)vstride * esz;
      __m512 pj = _mm512_set1_ps(p[j]);
      a0 = _mm512_fmadd_ps(pj, load16(vr, vt, d, m0), a0);
      if (m1) a1 = _mm512_fmadd_ps(pj, load16(vr, vt, d + 16, m1), a1);
      if (m2) a2 = _mm512_fmadd_ps(pj, load16(vr, vt, d + 32, m2), a2);
      if (m3) a3 = _mm512_fmadd_ps(pj, load16(vr, vt, d + 48, m3), a3);
    }
    _mm512_mask_storeu_ps(acc + d, m0, a0);
    _mm512_mask_storeu_ps(acc + d + 16, m1, a1);
    _mm512_mask_storeu_ps(acc + d + 32, m2, a2);
    _mm512_mask_storeu_ps(acc + d + 48, m3, a3);
  }
}
