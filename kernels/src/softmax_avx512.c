/* softmax row pieces with AVX-512. */
#include "avx512-impl.h"
#include "ops-impl.h"

#include <math.h>

float servd__max_avx512(const float *x, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16)
    m = _mm512_mask_max_ps(m, tail16(n - i), m, _mm512_maskz_loadu_ps(tail16(n - i), x + i));
  return _mm512_reduce_max_ps(m);
}

float servd__exp_shift_sum_avx512(float *x, int64_t n, float scale, float max) {
  __m512 sv = _mm512_set1_ps(scale), mv = _mm512_set1_ps(max), acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 k = tail16(n - i);
    __m512 e = ops__exp512(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, x + i), sv, mv));
    _mm512_mask_storeu_ps(x + i, k, e);
    acc = _mm512_mask_add_ps(acc, k, acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}

void servd__mul_scalar_avx512(float *x, int64_t n, float s) {
  __m512 sv = _mm512_set1_ps(s);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 k = tail16(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), sv));
  }
}
