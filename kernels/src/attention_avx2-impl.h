/* The register steps of the AVX2 attention kernels over 16 keys or dims (attention_avx2.c for f32/f16/bf16
 * caches, kv_quant_avx2.c for q8_0/q4_0): NQ (<= 6) queries' two 8-lane accumulators. Both files run
 * them, so a quantized cache's decode adds exactly what the f32 kernel adds over a prefill's tile. */
#ifndef SERVD_ATTENTION_AVX2_IMPL_H
#define SERVD_ATTENTION_AVX2_IMPL_H

#ifndef __AVX2__
#error "attention_avx2-impl.h is for files compiled with AVX2 enabled"
#endif

#include <immintrin.h>
#include <string.h>

/* a += w[i * stride] * (v0 | v1) for each query i. */
static inline __attribute__((always_inline)) void attn16_fma(int NQ, __m256 *a0, __m256 *a1, const float *w,
                                                             size_t stride, __m256 v0, __m256 v1) {
  for (int i = 0; i < NQ; i++) {
    __m256 s = _mm256_set1_ps(w[(size_t)i * stride]);
    a0[i] = _mm256_fmadd_ps(s, v0, a0[i]);
    a1[i] = _mm256_fmadd_ps(s, v1, a1[i]);
  }
}

/* a += q[i][d] * (k0 | k1) for each query i (the scores' step over dim d). */
static inline __attribute__((always_inline)) void attn16_fma_q(int NQ, __m256 *a0, __m256 *a1, const float *const *q,
                                                               int d, __m256 k0, __m256 k1) {
  for (int i = 0; i < NQ; i++) {
    __m256 qd = _mm256_set1_ps(q[i][d]);
    a0[i] = _mm256_fmadd_ps(qd, k0, a0[i]);
    a1[i] = _mm256_fmadd_ps(qd, k1, a1[i]);
  }
}

/* Scores: out row i, its first n (<= 16) values = a * scale. */
static inline __attribute__((always_inline)) void attn16_store_scaled(int NQ, const __m256 *a0, const __m256 *a1,
                                                                      float scale, float *out, int ld, int n) {
  __m256 sv = _mm256_set1_ps(scale);
  for (int i = 0; i < NQ; i++) {
    float r[16];
    _mm256_storeu_ps(r, _mm256_mul_ps(a0[i], sv));
    _mm256_storeu_ps(r + 8, _mm256_mul_ps(a1[i], sv));
    memcpy(out + (size_t)i * (size_t)ld, r, (size_t)n * sizeof(float));
  }
}

/* Value sums: 16 dims of each query's row of acc into registers, and back. */
static inline __attribute__((always_inline)) void attn16_load(int NQ, __m256 *a0, __m256 *a1, const float *acc,
                                                              int acc_ld) {
  for (int i = 0; i < NQ; i++) {
    a0[i] = _mm256_loadu_ps(acc + (size_t)i * (size_t)acc_ld);
    a1[i] = _mm256_loadu_ps(acc + (size_t)i * (size_t)acc_ld + 8);
  }
}

static inline __attribute__((always_inline)) void attn16_store(int NQ, const __m256 *a0, const __m256 *a1, float *acc,
                                                               int acc_ld) {
  for (int i = 0; i < NQ; i++) {
    _mm256_storeu_ps(acc + (size_t)i * (size_t)acc_ld, a0[i]);
    _mm256_storeu_ps(acc + (size_t)i * (size_t)acc_ld + 8, a1[i]);
  }
}

#endif
