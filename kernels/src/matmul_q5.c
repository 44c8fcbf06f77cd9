/* q5_0 / q5_1 weights: the scalar reference matmul on q8 activations (servd__q8x, natural layout).
 *
 * out (m,n) f32 = x (m,k) f32 @ w (n,k)^T with w rows of q5 blocks. Per block: the exact integer dot
 * of the 5-bit weight values q (0..31) with the activation quanta, times d_w * d_x; the offset
 * (q5_0: -16*d_w, q5_1: m) multiplies s = d_x * sum(q_x). The SIMD kernels (matmul_q5_avx2.c,
 * matmul_q5_avx512vnni.c) do the same arithmetic and are tested against this one.
 */
#include "matmul-impl.h"

void servd__mm_q5_scalar(const servd__mm *p, int64_t j0, int64_t j1) {
  const int64_t nb = p->xq.nb;
  for (int64_t i = 0; i < p->m; i++) {
    const int8_t *xq = p->xq.qs + i * p->xq.ldq;
    const float *xd = p->xq.d + i * p->xq.lds, *xs = p->xq.s + i * p->xq.lds;
    float *o = (float *)(p->out + i * p->ldo);
    for (int64_t j = j0; j < j1; j++) {
      const char *w = p->w + j * p->ldw;
      double acc = 0;
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qh, *qs;
        float d, c;
        if (p->wt == SERVD_Q5_0) {
          const servd_block_q5_0 *blk = (const servd_block_q5_0 *)w + b;
          qh = blk->qh;
          qs = blk->qs;
          d = servd_f16_to_f32(blk->d);
          c = -16.0f * d;
        } else {
          const servd_block_q5_1 *blk = (const servd_block_q5_1 *)w + b;
          qh = blk->qh;
          qs = blk->qs;
          d = servd_f16_to_f32(blk->d);
          c = servd_f16_to_f32(blk->m);
        }
        const int8_t *xb = xq + b * SERVD_QK;
        int32_t dot = 0;
        for (int l = 0; l < SERVD_QK; l++) dot += servd_q5_at(qh, qs, l) * xb[l];
        acc += (double)d * xd[b] * dot + (double)c * xs[b];
      }
      o[j] = (float)acc;
    }
  }
}
