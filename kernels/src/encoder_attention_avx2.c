/* encoder_attention's head kernel with AVX2+FMA: the q.k dots and the p v sums 8 dims at a time
 * (head_dim 32 or 64 in BERT-family models), softmax with the vector exp of ops-impl.h. Tested
 * against the scalar kernel and float64 (tests/kernels/test_encoder_ops.c). */
#include <math.h>

#include "ops-impl.h"

static inline float dot(const float *a, const float *b, int hd) {
  __m256 acc = _mm256_setzero_ps();
  int d = 0;
  for (; d + 8 <= hd; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
  if (d < hd) {
    __m256i m = ops__tailmask256(hd - d);
    acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + d, m), _mm256_maskload_ps(b + d, m), acc);
  }
  return ops__hsum256(acc);
}

void servd__enc_attn_head_avx2(float *o, const float *q, const float *k, const float *v, int n, int hd, int64_t stride,
                               float scale, float *p) {
  float mx = -INFINITY;
  for (int j = 0; j < n; j++) {
    p[j] = dot(q, k + j * stride, hd) * scale;
    if (p[j] > mx) mx = p[j];
  }
  __m256 vmx = _mm256_set1_ps(mx), vsum = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 e = ops__exp256(_mm256_sub_ps(_mm256_loadu_ps(p + j), vmx));
    _mm256_storeu_ps(p + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = ops__hsum256(vsum);
  for (; j < n; j++) sum += p[j] = expf(p[j] - mx);
  float inv = 1.0f / sum;
  for (int d = 0; d < hd; d += 8) {
    __m256i m = ops__tailmask256(hd - d < 8 ? hd - d : 8);
    __m256 acc = _mm256_setzero_ps();
    for (int jj = 0; jj < n; jj++)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[jj]), _mm256_maskload_ps(v + jj * stride + d, m), acc);
    _mm256_maskstore_ps(o + d, m, _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
  }
}
