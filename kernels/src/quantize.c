/* Activation quantization for quantized matmul: each block of 32 x values becomes int8 with one f32
 * scale d = amax/127 (q = round(x/d), as ggml's quantize_row_q8_0/q8_1, but keeping d in f32), plus
 * s = d * sum(q), which q4_0/q4_1 need for their offset terms. */
#include <math.h>
#include <string.h>

#include "matmul-impl.h"

void servd__quantize_q8x(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8x *q) {
  for (int64_t r = 0; r < m; r++) {
    const float *xr = (const float *)(x + r * ldx);
    int8_t *qs = q->qs + r * q->ldq;
    for (int64_t b = q->nb; b < q->lds; b++) q->d[r * q->lds + b] = q->s[r * q->lds + b] = 0.0f;
    if (q->quad && q->nb % 4) memset(qs + q->nb / 4 * 128, 0, 128); /* padding of the last quad */
    for (int64_t b = 0; b < q->nb; b++) {
      const float *v = xr + b * SERVD_QK;
      float amax = 0.0f;
      bool finite = true;
      for (int j = 0; j < SERVD_QK; j++) {
        amax = fmaxf(amax, fabsf(v[j]));
        finite &= isfinite(v[j]) != 0;
      }
      if (!finite) { /* NaN/inf in x: the block's outputs become NaN, not undefined casts */
        memset(qs + (q->quad ? (b / 4) * 128 + (b % 4) * 16 : b * SERVD_QK), 0, 16);
        memset(qs + (q->quad ? (b / 4) * 128 + 64 + (b % 4) * 16 : b * SERVD_QK + 16), 0, 16);
        q->d[r * q->lds + b] = q->s[r * q->lds + b] = NAN;
        continue;
      }
      const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
      int sum = 0;
      for (int j = 0; j < SERVD_QK; j++) {
        const int qv = (int)roundf(v[j] * id);
        /* quad: group b/4, block b%4 within it; halves 64 bytes apart */
        const int64_t at = q->quad ? (b / 4) * 128 + (j / 16) * 64 + (b % 4) * 16 + j % 16 : b * SERVD_QK + j;
        qs[at] = (int8_t)qv;
        sum += qv;
      }
      q->d[r * q->lds + b] = d;
      q->s[r * q->lds + b] = d * (float)sum;
    }
    (void)k;
  }
}
