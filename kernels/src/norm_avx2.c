/* rmsnorm rows with AVX2+FMA (+F16C for f16 weights). */
#include "ops-impl.h"

float servd__sumsq_avx2(const float *x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    a0 = _mm256_fmadd_ps(v0, v0, a0);
    a1 = _mm256_fmadd_ps(v1, v1, a1);
  }
  for (; i < n; i += 8) {
    __m256i m = ops__tailmask256(n - i);
    __m256 v = _mm256_maskload_ps(x + i, m);
    a0 = _mm256_fmadd_ps(v, v, a0);
  }
  return ops__hsum256(_mm256_add_ps(a0, a1));
}

static inline __m256 load_w8(const void *w, servd_dtype wt, int64_t i) {
  if (wt == SERVD_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
  if (wt == SERVD_BF16)
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i))), 16));
  return _mm256_loadu_ps((const float *)w + i);
}

void servd__scale_mul_avx2(float *out, const float *x, float r, const void *w, servd_dtype wt, int64_t n) {
  __m256 rv = _mm256_set1_ps(r);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), load_w8(w, wt, i)));
  if (i < n)
    servd__scale_mul_scalar(
        out + i, x + i, r,
        wt == SERVD_F32 ? (const void *)((const float *)w + i) : (const void *)((const uint16_t *)w + i), wt, n - i);
}
