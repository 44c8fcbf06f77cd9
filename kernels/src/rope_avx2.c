/* RoPE rotation of one row with AVX2+FMA (tables as in rope.c). */
#include "ops-impl.h"

void servd__rope_row_avx2(float *x, int64_t n_heads, int head_dim, servd_rope_layout layout, const float *cs,
                          const float *sn) {
  int h = head_dim / 2;
  for (int64_t hd = 0; hd < n_heads; hd++, x += head_dim) {
    int i = 0;
    if (layout == SERVD_ROPE_HALF) {
      for (; i + 8 <= h; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + h);
        __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
        _mm256_storeu_ps(x + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
        _mm256_storeu_ps(x + i + h, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
      }
      for (; i < h; i++) {
        float a = x[i], b = x[i + h];
        x[i] = a * cs[i] - b * sn[i];
        x[i + h] = b * cs[i] + a * sn[i];
      }
    } else {
      for (; i + 8 <= head_dim; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 sw = _mm256_permute_ps(v, 0xB1); /* swap each pair */
        _mm256_storeu_ps(x + i,
                         _mm256_fmadd_ps(v, _mm256_loadu_ps(cs + i), _mm256_mul_ps(sw, _mm256_loadu_ps(sn + i))));
      }
      for (; i < head_dim; i += 2) {
        float a = x[i], b = x[i + 1];
        x[i] = a * cs[i] + b * sn[i];
        x[i + 1] = b * cs[i + 1] + a * sn[i + 1];
      }
    }
  }
}
