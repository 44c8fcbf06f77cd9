/* iq4_nl weights in matmul, scalar reference: per block of 32 the exact integer dot of the codebook
 * values (servd_iq4_values) with the q8 activation quanta, times both scales, as ggml's
 * ggml_vec_dot_iq4_nl_q8_0. q2_k, q3_k and iq4_xs use the k-quant reference (matmul_k.c), which
 * decodes rows through servd_row_to_f32. */
#include "matmul_lowbit-impl.h"
#include "servd/blocks.h"

void servd__mm_iq4nl_scalar(const servd__mm *p, int64_t j0, int64_t j1) {
  const servd__q8x *q = &p->xq;
  for (int64_t i = 0; i < p->m; i++) {
    const int8_t *xq = q->qs + i * q->ldq;
    const float *xd = q->d + i * q->lds;
    float *o = (float *)(p->out + i * p->ldo);
    for (int64_t j = j0; j < j1; j++) {
      const servd_block_iq4_nl *w = (const servd_block_iq4_nl *)(p->w + j * p->ldw);
      double acc = 0;
      for (int64_t b = 0; b < q->nb; b++) {
        const int8_t *xb = xq + b * SERVD_QK;
        int32_t dot = 0;
        for (int l = 0; l < SERVD_QK / 2; l++)
          dot += servd_iq4_values[w[b].qs[l] & 0xF] * xb[l] + servd_iq4_values[w[b].qs[l] >> 4] * xb[l + SERVD_QK / 2];
        acc += (double)servd_f16_to_f32(w[b].d) * xd[b] * dot;
      }
      o[j] = (float)acc;
    }
  }
}
