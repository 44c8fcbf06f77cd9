/* rmsnorm rows with AVX-512. */
#include "avx512-impl.h"
#include "ops-impl.h"

float servd__sumsq_avx512(const float *x, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
    a0 = _mm512_fmadd_ps(v0, v0, a0);
    a1 = _mm512_fmadd_ps(v1, v1, a1);
  }
  for (; i < n; i += 16) {
    __mmask16 m = tail16(n - i);
    __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    a0 = _mm512_fmadd_ps(v, v, a0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

static inline __m512 load_w16(const void *w, servd_dtype wt, int64_t i, __mmask16 m) {
  if (wt == SERVD_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i));
  if (wt == SERVD_BF16)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i)), 16));
  return _mm512_maskz_loadu_ps(m, (const float *)w + i);
}

void servd__scale_mul_avx512(float *out, const float *x, float r, const void *w, servd_dtype wt, int64_t n) {
  __m512 rv = _mm512_set1_ps(r);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = tail16(n - i);
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), rv), load_w16(w, wt, i, m));
    _mm512_mask_storeu_ps(out + i, m, v);
  }
}
