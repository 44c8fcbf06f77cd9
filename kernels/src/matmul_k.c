/* k-quant weights (q4_k q5_k q6_k) in matmul: the q8_K activation quantizer and the scalar reference.
 *
 * out (m,n) = x (m,k) @ w (n,k)^T with w in 256-value super-blocks. x is quantized once per call to
 * q8_K (servd__q8k: int8 per value, one f32 scale and sixteen 16-value sums per super-block); the
 * SIMD kernels (matmul_k_*.c) take exact integer dots of weight and activation quanta per sub-block.
 * The reference here instead dequantizes each weight row to f32 with servd_row_to_f32 (ggml's
 * dequantizer, tested against gguf-py's) and dots it with the same q8_K values in double: it shares
 * no weight decoding with the SIMD kernels, so it checks their bit unpacking.
 */
#include <math.h>
#include <string.h>

#include "matmul-impl.h"

void servd__quantize_q8k(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8k *q) {
  (void)k;
  for (int64_t r = 0; r < m; r++) {
    const float *xr = (const float *)(x + r * ldx);
    int8_t *qs = q->qs + r * q->ldq, *qs2 = q->qs2 ? q->qs2 + r * q->ldq : NULL;
    for (int64_t b = 0; b < q->nb; b++, xr += SERVD_QK_K, qs += SERVD_QK_K, qs2 = qs2 ? qs2 + SERVD_QK_K : NULL) {
      const int64_t at = r * q->nb + b;
      int16_t *bs = q->bsums + at * 16, *bs2 = qs2 ? q->bsums2 + at * 16 : NULL;
      float amax;
      if (!servd__block_absmax(xr, SERVD_QK_K, &amax)) {
        memset(qs, 0, SERVD_QK_K);
        memset(bs, 0, 16 * sizeof *bs);
        q->d[at] = NAN;
        if (qs2) {
          memset(qs2, 0, SERVD_QK_K);
          memset(bs2, 0, 16 * sizeof *bs2);
          q->d2[at] = NAN;
        }
        continue;
      }
      const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
      for (int g = 0; g < 16; g++) {
        int sum = 0;
        int8_t *dst = qs + servd__q8k_group_off(q, g);
        for (int j = 16 * g; j < 16 * g + 16; j++) {
          const int v = servd__round(xr[j] * id);
          dst[j - 16 * g] = (int8_t)v;
          sum += v;
        }
        bs[g] = (int16_t)sum;
      }
      for (int g = 0; bs2 && g < 16; g++) { /* a loop of its own: the first level's stays as it was */
        int sum2 = 0;
        const int off = servd__q8k_group_off(q, g);
        for (int j = 16 * g; j < 16 * g + 16; j++) {
          const int v2 = servd__residual_q(xr[j], qs[off + j - 16 * g], d, id);
          qs2[off + j - 16 * g] = (int8_t)v2;
          sum2 += v2;
        }
        bs2[g] = (int16_t)sum2;
      }
      q->d[at] = d;
      if (qs2) q->d2[at] = d * SERVD__RESIDUAL_SCALE;
    }
  }
}

/* Each weight row is dequantized once into thread scratch (slot 1), then dotted with every x row. */
void servd__mm_kquant_scalar(const servd__mm *p, int64_t j0, int64_t j1) {
  float *wf = servd__scratch(1, (size_t)p->k * sizeof(float));
  if (!wf) { /* no memory for one row: NaN marks the outputs rather than a silent wrong value */
    for (int64_t i = 0; i < p->m; i++)
      for (int64_t j = j0; j < j1; j++) ((float *)(p->out + i * p->ldo))[j] = NAN;
    return;
  }
  const servd__q8k *q = &p->xk;
  for (int64_t j = j0; j < j1; j++) {
    servd_row_to_f32(p->wt, p->w + j * p->ldw, wf, p->k);
    for (int64_t i = 0; i < p->m; i++) {
      const int8_t *xq = q->qs + i * q->ldq;
      double acc = 0;
      for (int64_t b = 0; b < q->nb; b++) {
        double dot = 0;
        for (int l = 0; l < SERVD_QK_K; l++) dot += (double)wf[b * SERVD_QK_K + l] * xq[b * SERVD_QK_K + l];
        acc += dot * q->d[i * q->nb + b];
      }
      ((float *)(p->out + i * p->ldo))[j] = (float)acc;
    }
  }
}
