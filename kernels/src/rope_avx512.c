/* RoPE rotation of one row with AVX-512 (tables as in rope.c). */
#include "avx512-impl.h"
#include "ops-impl.h"

void servd__rope_row_avx512(float *x, int64_t n_heads, int head_dim, servd_rope_layout layout, const float *cs,
                            const float *sn) {
  int h = head_dim / 2;
  for (int64_t hd = 0; hd < n_heads; hd++, x += head_dim) {
    if (layout == SERVD_ROPE_HALF) {
      for (int i = 0; i < h; i += 16) {
        __mmask16 k = tail16(h - i);
        __m512 a = _mm512_maskz_loadu_ps(k, x + i), b = _mm512_maskz_loadu_ps(k, x + i + h);
        __m512 c = _mm512_maskz_loadu_ps(k, cs + i), s = _mm512_maskz_loadu_ps(k, sn + i);
        _mm512_mask_storeu_ps(x + i, k, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
        _mm512_mask_storeu_ps(x + i + h, k, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)));
      }
    } else {
      for (int i = 0; i < head_dim; i += 16) { /* head_dim is even: tails hold whole pairs */
        __mmask16 k = tail16(head_dim - i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        __m512 sw = _mm512_permute_ps(v, 0xB1);
        _mm512_mask_storeu_ps(
            x + i, k,
            _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(k, cs + i), _mm512_mul_ps(sw, _mm512_maskz_loadu_ps(k, sn + i))));
      }
    }
  }
}
