/* softmax row pieces with AVX2+FMA. */
#include "ops-impl.h"

#include <math.h>

float servd__max_avx2(const float *x, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  float r = ops__hmax256(m);
  for (; i < n; i++) r = x[i] > r ? x[i] : r;
  return r;
}

float servd__exp_shift_sum_avx2(float *x, int64_t n, float scale, float max) {
  __m256 sv = _mm256_set1_ps(scale), mv = _mm256_set1_ps(max), acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = ops__exp256(_mm256_fmsub_ps(_mm256_loadu_ps(x + i), sv, mv));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  if (i < n) {
    __m256i mk = ops__tailmask256(n - i);
    __m256 e = ops__exp256(_mm256_fmsub_ps(_mm256_maskload_ps(x + i, mk), sv, mv));
    e = _mm256_and_ps(e, _mm256_castsi256_ps(mk));
    _mm256_maskstore_ps(x + i, mk, e);
    acc = _mm256_add_ps(acc, e);
  }
  return ops__hsum256(acc);
}

void servd__mul_scalar_avx2(float *x, int64_t n, float s) {
  __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
  for (; i < n; i++) x[i] *= s;
}
