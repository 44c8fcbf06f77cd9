/* geglu rows with AVX-512: the AVX2 kernel's sigmoid form (geglu_avx2.c), 16 lanes. */
#include "avx512-impl.h"
#include "geglu-impl.h"
#include "ops-impl.h"

static inline __m512 geglu16(__m512 g, __m512 u) {
  const __m512 k = _mm512_set1_ps(-2.0f * 0.7978845608028654f);
  const __m512 kc = _mm512_set1_ps(-2.0f * 0.7978845608028654f * 0.044715f);
  __m512 minus_2z = _mm512_mul_ps(g, _mm512_fmadd_ps(kc, _mm512_mul_ps(g, g), k));
  __m512 e = ops__exp512(minus_2z);
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

void servd__geglu_avx512(float *out, const float *g, const float *u, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, geglu16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  if (i < n) {
    __mmask16 m = tail16(n - i);
    _mm512_mask_storeu_ps(out + i, m, geglu16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
  }
}
