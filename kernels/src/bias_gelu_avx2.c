/* bias_gelu rows with AVX2+FMA: gelu(z) = z/2 (1 + erf(z / sqrt 2)) with erfc(a), a = |z| / sqrt 2, from
 * Abramowitz & Stegun 7.1.26 (t = 1 / (1 + p a), a degree-5 polynomial in t times exp(-a^2); absolute
 * error under 1.5e-7): 1 + erf = 2 - erfc for z >= 0 and erfc(a) for z < 0, so the negative side has
 * no cancellation. Bound against float64 (tests/kernels/test_encoder_ops.c): 2e-7 |z| + 4 ulp. */
#include "ops-impl.h"

static inline __m256 gelu8(__m256 z) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 a = _mm256_mul_ps(_mm256_andnot_ps(sign, z), _mm256_set1_ps(0.70710678118654752f));
  __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, _mm256_set1_ps(1.0f)));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  p = _mm256_mul_ps(p, t);
  __m256 erfc = _mm256_mul_ps(p, ops__exp256(_mm256_mul_ps(_mm256_xor_ps(a, sign), a)));
  __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
  __m256 one_plus_erf = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.0f), erfc), erfc, neg);
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), z), one_plus_erf);
}

void servd__bias_gelu_avx2(float *out, const float *x, const float *b, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, gelu8(_mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(b + i))));
  if (i < n) {
    __m256i m = ops__tailmask256(n - i);
    _mm256_maskstore_ps(out + i, m, gelu8(_mm256_add_ps(_mm256_maskload_ps(x + i, m), _mm256_maskload_ps(b + i, m))));
  }
}
