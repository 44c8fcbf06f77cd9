/* Activation quantization for quantized matmul: each block of 32 x values becomes int8 with one f32
 * scale d = amax/127 (q = round(x/d), as ggml's quantize_row_q8_0/q8_1, but keeping d in f32), plus
 * s = d * sum(q), which q4_0/q4_1 need for their offset terms; with two levels, the residual as well
 * (servd__q8x). */
#include <math.h>
#include <string.h>

#include "matmul-impl.h"

void servd__quantize_q8x(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8x *q) {
  for (int64_t r = 0; r < m; r++) {
    const float *xr = (const float *)(x + r * ldx);
    int8_t *qs = q->qs + r * q->ldq;
    servd__q8x_clear_tail(q, r);
    for (int64_t b = 0; b < q->nb; b++) {
      const float *v = xr + b * SERVD_QK;
      float amax;
      int8_t *qs2 = q->qs2 ? q->qs2 + r * q->ldq : NULL;
      if (!servd__block_absmax(v, SERVD_QK, &amax)) {
        memset(qs + servd__q8x_off(q, b, 0), 0, 16);
        memset(qs + servd__q8x_off(q, b, 1), 0, 16);
        q->d[r * q->lds + b] = q->s[r * q->lds + b] = NAN;
        if (qs2) {
          memset(qs2 + servd__q8x_off(q, b, 0), 0, 16);
          memset(qs2 + servd__q8x_off(q, b, 1), 0, 16);
          q->d2[r * q->lds + b] = q->s2[r * q->lds + b] = NAN;
        }
        continue;
      }
      const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
      int sum = 0;
      for (int j = 0; j < SERVD_QK; j++) {
        const int qv = (int)roundf(v[j] * id);
        qs[servd__q8x_off(q, b, j / 16) + j % 16] = (int8_t)qv;
        sum += qv;
      }
      q->d[r * q->lds + b] = d;
      q->s[r * q->lds + b] = d * (float)sum;
      if (qs2) { /* a loop of its own: the first level's stays as it was without the residual */
        int sum2 = 0;
        for (int j = 0; j < SERVD_QK; j++) {
          const int64_t at = servd__q8x_off(q, b, j / 16) + j % 16;
          const int q2 = servd__residual_q(v[j], qs[at], d, id);
          qs2[at] = (int8_t)q2;
          sum2 += q2;
        }
        const float d2 = d * SERVD__RESIDUAL_SCALE;
        q->d2[r * q->lds + b] = d2;
        q->s2[r * q->lds + b] = d2 * (float)sum2;
      }
    }
    (void)k;
  }
}
