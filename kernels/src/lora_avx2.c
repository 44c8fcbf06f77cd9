/* LoRA row kernels with AVX2+FMA (+F16C for f16 adapters). down: 4 rows of A per pass share each
 * load of x; up: 32 columns in 4 accumulators, one fused multiply-add per rank component, so each
 * output element is the scalar kernel's chain of fmaf (only the dot products of down sum in
 * another order). */
#include "lora-impl.h"
#include "ops-impl.h"

static inline __m256 ld8(const void *ab, servd_dtype t, int64_t i) {
  if (t == SERVD_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)ab + i)));
  return _mm256_loadu_ps((const float *)ab + i);
}

static inline float ld1(const void *ab, servd_dtype t, int64_t i) {
  return t == SERVD_F16 ? _cvtsh_ss(((const uint16_t *)ab)[i]) : ((const float *)ab)[i];
}

void servd__lora_down_avx2(float *t, const float *x, const void *ab, servd_dtype abt, int64_t r, int64_t k, int64_t ld,
                           float scale) {
  int64_t j = 0;
  for (; j + 4 <= r; j += 4) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
      __m256 xv = _mm256_loadu_ps(x + i);
      s0 = _mm256_fmadd_ps(xv, ld8(ab, abt, (j + 0) * ld + i), s0);
      s1 = _mm256_fmadd_ps(xv, ld8(ab, abt, (j + 1) * ld + i), s1);
      s2 = _mm256_fmadd_ps(xv, ld8(ab, abt, (j + 2) * ld + i), s2);
      s3 = _mm256_fmadd_ps(xv, ld8(ab, abt, (j + 3) * ld + i), s3);
    }
    float h[4] = {ops__hsum256(s0), ops__hsum256(s1), ops__hsum256(s2), ops__hsum256(s3)};
    for (; i < k; i++)
      for (int q = 0; q < 4; q++) h[q] = fmaf(x[i], ld1(ab, abt, (j + q) * ld + i), h[q]);
    for (int q = 0; q < 4; q++) t[j + q] = scale * h[q];
  }
  for (; j < r; j++) {
    __m256 s = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), ld8(ab, abt, j * ld + i), s);
    float h = ops__hsum256(s);
    for (; i < k; i++) h = fmaf(x[i], ld1(ab, abt, j * ld + i), h);
    t[j] = scale * h;
  }
}

void servd__lora_up_avx2(float *out, const float *t, const void *ab, servd_dtype abt, int64_t r, int64_t k, int64_t ld,
                         int64_t c0, int64_t c1) {
  const char *b = (const char *)ab + k * (abt == SERVD_F16 ? 2 : 4); /* B's columns start after A's row */
  int64_t c = c0;
  for (; c + 32 <= c1; c += 32) {
    __m256 a0 = _mm256_loadu_ps(out + c), a1 = _mm256_loadu_ps(out + c + 8), a2 = _mm256_loadu_ps(out + c + 16),
           a3 = _mm256_loadu_ps(out + c + 24);
    for (int64_t j = 0; j < r; j++) {
      __m256 tj = _mm256_broadcast_ss(t + j);
      int64_t o = j * ld + c;
      a0 = _mm256_fmadd_ps(tj, ld8(b, abt, o), a0);
      a1 = _mm256_fmadd_ps(tj, ld8(b, abt, o + 8), a1);
      a2 = _mm256_fmadd_ps(tj, ld8(b, abt, o + 16), a2);
      a3 = _mm256_fmadd_ps(tj, ld8(b, abt, o + 24), a3);
    }
    _mm256_storeu_ps(out + c, a0);
    _mm256_storeu_ps(out + c + 8, a1);
    _mm256_storeu_ps(out + c + 16, a2);
    _mm256_storeu_ps(out + c + 24, a3);
  }
  for (; c + 8 <= c1; c += 8) {
    __m256 a = _mm256_loadu_ps(out + c);
    for (int64_t j = 0; j < r; j++) a = _mm256_fmadd_ps(_mm256_broadcast_ss(t + j), ld8(b, abt, j * ld + c), a);
    _mm256_storeu_ps(out + c, a);
  }
  for (; c < c1; c++) {
    float a = out[c];
    for (int64_t j = 0; j < r; j++) a = fmaf(t[j], ld1(b, abt, j * ld + c), a);
    out[c] = a;
  }
}
