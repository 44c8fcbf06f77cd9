/* swiglu and add rows with AVX2+FMA. */
#include "ops-impl.h"

void servd__add_avx2(float *out, const float *a, const float *b, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < n) {
    __m256i m = ops__tailmask256(n - i);
    _mm256_maskstore_ps(out + i, m, _mm256_add_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m)));
  }
}

static inline __m256 swiglu8(__m256 g, __m256 u) {
  __m256 e = ops__exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void servd__swiglu_avx2(float *out, const float *g, const float *u, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, swiglu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  if (i < n) {
    __m256i m = ops__tailmask256(n - i);
    _mm256_maskstore_ps(out + i, m, swiglu8(_mm256_maskload_ps(g + i, m), _mm256_maskload_ps(u + i, m)));
  }
}
