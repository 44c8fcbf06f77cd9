/* AVX2 kernel for q5_0/q5_1 weights against q8 activations (servd__q8x, natural layout).
 *
 * Per block: the 16 nibble bytes give elements 0..15 (low) | 16..31 (high) in one ymm, as for q4;
 * the 32 high bits qh become 0x10 bytes with one shuffle, and, cmpeq; the 5-bit values (0..31,
 * unsigned) meet the int8 activations in maddubs (|31*127*2| fits int16). Block headers are taken
 * 8 blocks at a time (headers8: 8 scalar loads, one f16 conversion, the d_w*d_x products of each x
 * row in one multiply, the offsets q5_0: -16*d, q5_1: m against s = d_x*sum(q_x) in one FMA), so a
 * block costs only its quanta and one scale permute per x row; this brings q5 per byte level with
 * q4_1's kernel, whose per-block scalar headers are about as costly as q5's fifth bit.
 * Up to RQ activation rows share each block.
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

/* Headers of blocks b0..b0+nbc (nbc <= 8) of row w, from one gather of each block's first dword:
 * *dw = d, *cw = the offset per unit of s (q5_0: -16*d, q5_1: m); lanes past nbc zero. */
static inline __attribute__((always_inline)) void headers8(const char *w, int64_t b0, int nbc, __m256 *dw, __m256 *cw,
                                                           const servd_dtype wt) {
  const int bb = wt == SERVD_Q5_0 ? 22 : 24;
  /* no gather: slow on some cores, and 8 scalar loads are few next to 8 blocks' work */
  int v[8] = {0};
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++)
    if (i < nbc) memcpy(&v[i], w + (b0 + i) * bb, 4);
  const __m256i raw = _mm256_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
  /* per lane: low words (d) to bytes 0..7, high words (q5_1's m) to 8..15; then lanes' halves joined */
  const __m256i pack = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13,
                                        2, 3, 6, 7, 10, 11, 14, 15);
  const __m256i dm = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(raw, pack), 0xD8);
  *dw = _mm256_cvtph_ps(_mm256_castsi256_si128(dm));
  *cw =
      wt == SERVD_Q5_0 ? _mm256_mul_ps(*dw, _mm256_set1_ps(-16.0f)) : _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1));
}

/* Block b (the i-th of the 8 in hand) of row w against R x rows. */
static inline __attribute__((always_inline)) void q5_block(const char *w, int64_t b, int i, const int8_t *const *xq,
                                                           const __m256 *ds, __m256 *acc, const int R,
                                                           const servd_dtype wt) {
  const __m256i ones = _mm256_set1_epi16(1), nib = _mm256_set1_epi8(0x0f);
  const int bb = wt == SERVD_Q5_0 ? 22 : 24, hoff = wt == SERVD_Q5_0 ? 2 : 4;
  const char *blk = w + b * bb;
  const __m128i v = _mm_loadu_si128((const __m128i *)(blk + hoff + 4));
  const __m256i wv = _mm256_or_si256(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), nib),
                                     high_bits((const uint8_t *)blk + hoff));
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq[r] + b * 32));
    const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_permutevar8x32_ps(ds[r], _mm256_set1_epi32(i)), acc[r]);
  }
}

static inline __attribute__((always_inline)) void q5_rows(const servd__mm *p, const char *w, int64_t i0, float *res,
                                                          const int R, const servd_dtype wt) {
  const int64_t nb = p->xq.nb;
  __m256 acc[RQ], accm[RQ];
  const int8_t *xq[RQ];
  const float *xd[RQ], *xs[RQ];
  __m256 ds[RQ]; /* d_w * d_x of the 8 blocks in hand */
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    acc[r] = accm[r] = _mm256_setzero_ps();
    xq[r] = p->xq.qs + (i0 + r) * p->xq.ldq;
    xd[r] = p->xq.d + (i0 + r) * p->xq.lds;
    xs[r] = p->xq.s + (i0 + r) * p->xq.lds;
  }
  /* Headers 8 blocks at a time (vector f16 conversion and scale products, the offsets
   * in one FMA): per block only the quanta are decoded. d and s are zero from nb up to lds, a multiple
   * of 16, so the 8-wide loads stay inside. */
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int nbc = nb - b0 < 8 ? (int)(nb - b0) : 8;
    __m256 dw, cw;
    if (nbc == 8) headers8(w, b0, 8, &dw, &cw, wt);
    else headers8(w, b0, nbc, &dw, &cw, wt);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      ds[r] = _mm256_mul_ps(dw, _mm256_loadu_ps(xd[r] + b0));
      accm[r] = _mm256_fmadd_ps(cw, _mm256_loadu_ps(xs[r] + b0), accm[r]);
    }
    if (nbc == 8) {
#pragma GCC unroll 8
      for (int i = 0; i < 8; i++) q5_block(w, b0 + i, i, xq, ds, acc, R, wt);
    } else {
      for (int i = 0; i < nbc; i++) q5_block(w, b0 + i, i, xq, ds, acc, R, wt);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) res[r] = hsum8(_mm256_add_ps(acc[r], accm[r]));
}

ROWS_FN(q5_rows, SERVD_Q5_0, rows_q5_0)
ROWS_FN(q5_rows, SERVD_Q5_1, rows_q5_1)

void servd__mm_q5_avx2(const servd__mm *p, int64_t j0, int64_t j1) {
  rows_fn fn = p->wt == SERVD_Q5_0 ? rows_q5_0 : rows_q5_1;
  mm_rows(p, j0, j1, fn);
}
