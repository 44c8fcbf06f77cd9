/* AVX2 kernel for q5_0/q5_1 weights against q8 activations (servd__q8x, natural layout).
 *
 * Per block: the 16 nibble bytes give elements 0..15 (low) | 16..31 (high) in one ymm, as for q4;
 * the 32 high bits qh become 0x10 bytes with one shuffle, and, cmpeq; the 5-bit values (0..31,
 * unsigned) meet the int8 activations in maddubs (|31*127*2| fits int16). Offsets (q5_0: -16*d,
 * q5_1: m) multiply s = d_x*sum(q_x), as in matmul_q5.c. Up to RQ activation rows share each block.
 */
#include <immintrin.h>
#include <string.h>

#include "matmul_avx2-impl.h"

/* Byte i = 0x10 where bit i of the block's qh is set, else 0. */
static inline __m256i high_bits(const uint8_t *qh) {
  uint32_t h;
  memcpy(&h, qh, 4);
  const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread), bit);
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

static inline __attribute__((always_inline)) void q5_rows(const servd__mm *p, const char *w, int64_t i0, float *res,
                                                          const int R, const servd_dtype wt) {
  const __m256i ones = _mm256_set1_epi16(1), nib = _mm256_set1_epi8(0x0f);
  const int64_t nb = p->xq.nb;
  __m256 acc[RQ];
  float accm[RQ];
  const int8_t *xq[RQ];
  const float *xd[RQ], *xs[RQ];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    acc[r] = _mm256_setzero_ps();
    accm[r] = 0.0f;
    xq[r] = p->xq.qs + (i0 + r) * p->xq.ldq;
    xd[r] = p->xq.d + (i0 + r) * p->xq.lds;
    xs[r] = p->xq.s + (i0 + r) * p->xq.lds;
  }
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *qh, *qs;
    float dw, cw;
    if (wt == SERVD_Q5_0) {
      const servd_block_q5_0 *blk = (const servd_block_q5_0 *)w + b;
      qh = blk->qh;
      qs = blk->qs;
      dw = f16(blk->d);
      cw = -16.0f * dw;
    } else {
      const servd_block_q5_1 *blk = (const servd_block_q5_1 *)w + b;
      qh = blk->qh;
      qs = blk->qs;
      dw = f16(blk->d);
      cw = f16(blk->m);
    }
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    const __m256i wv = _mm256_or_si256(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), nib), high_bits(qh));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq[r] + b * 32));
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * xd[r][b]), acc[r]);
      accm[r] += cw * xs[r][b];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) res[r] = hsum8(acc[r]) + accm[r];
}

ROWS_FN(q5_rows, SERVD_Q5_0, rows_q5_0)
ROWS_FN(q5_rows, SERVD_Q5_1, rows_q5_1)

void servd__mm_q5_avx2(const servd__mm *p, int64_t j0, int64_t j1) {
  rows_fn fn = p->wt == SERVD_Q5_0 ? rows_q5_0 : rows_q5_1;
  mm_rows(p, j0, j1, fn);
}
