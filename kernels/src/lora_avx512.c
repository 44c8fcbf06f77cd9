/* LoRA row kernels with AVX-512F: as lora_avx2.c with 16 lanes (f16 adapters through the 512-bit
 * vcvtph2ps); each output element is the scalar kernel's chain of fused multiply-adds. */
#include "lora-impl.h"
#include "ops-impl.h"

static inline __m512 ld16(const void *ab, servd_dtype t, int64_t i) {
  if (t == SERVD_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)ab + i)));
  return _mm512_loadu_ps((const float *)ab + i);
}

static inline float ld1(const void *ab, servd_dtype t, int64_t i) {
  return t == SERVD_F16 ? _cvtsh_ss(((const uint16_t *)ab)[i]) : ((const float *)ab)[i];
}

void servd__lora_down_avx512(float *t, const float *x, const void *ab, servd_dtype abt, int64_t r, int64_t k,
                             int64_t ld, float scale) {
  int64_t j = 0;
  for (; j + 4 <= r; j += 4) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
      __m512 xv = _mm512_loadu_ps(x + i);
      s0 = _mm512_fmadd_ps(xv, ld16(ab, abt, (j + 0) * ld + i), s0);
      s1 = _mm512_fmadd_ps(xv, ld16(ab, abt, (j + 1) * ld + i), s1);
      s2 = _mm512_fmadd_ps(xv, ld16(ab, abt, (j + 2) * ld + i), s2);
      s3 = _mm512_fmadd_ps(xv, ld16(ab, abt, (j + 3) * ld + i), s3);
    }
    float h[4] = {_mm512_reduce_add_ps(s0), _mm512_reduce_add_ps(s1), _mm512_reduce_add_ps(s2),
                  _mm512_reduce_add_ps(s3)};
    for (; i < k; i++)
      for (int q = 0; q < 4; q++) h[q] = fmaf(x[i], ld1(ab, abt, (j + q) * ld + i), h[q]);
    for (int q = 0; q < 4; q++) t[j + q] = scale * h[q];
  }
  for (; j < r; j++) {
    __m512 s = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), ld16(ab, abt, j * ld + i), s);
    float h = _mm512_reduce_add_ps(s);
    for (; i < k; i++) h = fmaf(x[i], ld1(ab, abt, j * ld + i), h);
    t[j] = scale * h;
  }
}

void servd__lora_up_avx512(float *out, const float *t, const void *ab, servd_dtype abt, int64_t r, int64_t k,
                           int64_t ld, int64_t c0, int64_t c1) {
  const char *b = (const char *)ab + k * (abt == SERVD_F16 ? 2 : 4);
  int64_t c = c0;
  for (; c + 64 <= c1; c += 64) {
    __m512 a0 = _mm512_loadu_ps(out + c), a1 = _mm512_loadu_ps(out + c + 16), a2 = _mm512_loadu_ps(out + c + 32),
           a3 = _mm512_loadu_ps(out + c + 48);
    for (int64_t j = 0; j < r; j++) {
      __m512 tj = _mm512_set1_ps(t[j]);
      int64_t o = j * ld + c;
      a0 = _mm512_fmadd_ps(tj, ld16(b, abt, o), a0);
      a1 = _mm512_fmadd_ps(tj, ld16(b, abt, o + 16), a1);
      a2 = _mm512_fmadd_ps(tj, ld16(b, abt, o + 32), a2);
      a3 = _mm512_fmadd_ps(tj, ld16(b, abt, o + 48), a3);
    }
    _mm512_storeu_ps(out + c, a0);
    _mm512_storeu_ps(out + c + 16, a1);
    _mm512_storeu_ps(out + c + 32, a2);
    _mm512_storeu_ps(out + c + 48, a3);
  }
  for (; c + 16 <= c1; c += 16) {
    __m512 a = _mm512_loadu_ps(out + c);
    for (int64_t j = 0; j < r; j++) a = _mm512_fmadd_ps(_mm512_set1_ps(t[j]), ld16(b, abt, j * ld + c), a);
    _mm512_storeu_ps(out + c, a);
  }
  for (; c < c1; c++) {
    float a = out[c];
    for (int64_t j = 0; j < r; j++) a = fmaf(t[j], ld1(b, abt, j * ld + c), a);
    out[c] = a;
  }
}
