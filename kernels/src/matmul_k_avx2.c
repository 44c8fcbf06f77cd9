/* AVX2 matmul kernel for k-quant weights (q4_k q5_k q6_k) against q8_K activations.
 *
 * Per weight super-block, each run of 32 values t = 0..7 is unpacked in registers to unsigned
 * quanta (q4_k 0..15, q5_k 0..31, q6_k 0..63 with its -32 left for later), multiplied with the x
 * quanta by maddubs (u8 x s8 pairs -> i16, at most 2*63*127: no saturation) and by the sub-block
 * scales through madd (-> i32, at most 8 runs * 2*16002*128 in total: fits). The offsets (q4_k and
 * q5_k: -dmin*m[j]; q6_k: -32*d*sc[g]) multiply the 16-value sums of x (bsums) in one more madd.
 * Weights are decoded once per block for up to RQ x rows; they never reach memory as floats.
 */
#include <immintrin.h>
#include <string.h>

#include "matmul_avx2-impl.h"
#include "matmul_k-impl.h"

static inline __attribute__((always_inline)) void krows(const servd__mm *p, const char *w, int64_t i0, float *res,
                                                        const int R, const servd_dtype wt) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m1 = _mm256_set1_epi8(1), m3 = _mm256_set1_epi8(3);
  const servd__q8k *q = &p->xk;
  const int64_t nb = q->nb;
  __m256 acc[RQ];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    uint8_t sc[16];
    const uint8_t *lo, *hi = NULL;
    float dw, cw;
    __m256i msv; /* i16 multipliers of the 16 bsums */
    if (wt == SERVD_Q6_K) {
      const servd_block_q6_k *blk = (const servd_block_q6_k *)w + b;
      dw = f16(blk->d);
      cw = -32.0f * dw;
      memcpy(sc, blk->scales, 16);
      msv = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)blk->scales));
      lo = blk->ql;
      hi = blk->qh;
    } else {
      const uint16_t *dd;
      const uint8_t *scales;
      if (wt == SERVD_Q4_K) {
        const servd_block_q4_k *blk = (const servd_block_q4_k *)w + b;
        dd = &blk->d;
        scales = blk->scales;
        lo = blk->qs;
      } else {
        const servd_block_q5_k *blk = (const servd_block_q5_k *)w + b;
        dd = &blk->d;
        scales = blk->scales;
        lo = blk->qs;
        hi = blk->qh;
      }
      dw = f16(dd[0]);
      cw = -f16(dd[1]);
      const __m128i sm = servd__k4_scales_mins(scales);
      _mm_storeu_si128((__m128i *)sc, sm);
      const __m128i dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
      msv = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup)); /* group g takes m[g / 2] */
    }
    __m256i sumi[RQ];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) {
      __m256i wv, sv;
      if (wt == SERVD_Q6_K) {
        const int h = t / 4, u = t % 4;
        const __m256i l = _mm256_loadu_si256((const __m256i *)(lo + 64 * h + 32 * (u & 1)));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(hi + 32 * h));
        const __m256i low = _mm256_and_si256(u < 2 ? l : _mm256_srli_epi16(l, 4), m4);
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * u), m3), 4);
        wv = _mm256_or_si256(low, high);
        sv = _mm256_set_m128i(_mm_set1_epi16((int8_t)sc[2 * t + 1]), _mm_set1_epi16((int8_t)sc[2 * t]));
      } else {
        const __m256i l = _mm256_loadu_si256((const __m256i *)(lo + 32 * (t / 2)));
        wv = _mm256_and_si256(t % 2 ? _mm256_srli_epi16(l, 4) : l, m4);
        if (wt == SERVD_Q5_K) {
          const __m256i hb = _mm256_loadu_si256((const __m256i *)hi);
          wv = _mm256_or_si256(wv, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, t), m1), 4));
        }
        sv = _mm256_set1_epi16(sc[t]);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(q->qs + (i0 + r) * q->ldq + b * SERVD_QK_K + 32 * t));
        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), sv));
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const int64_t rb = (i0 + r) * nb + b;
      const float dx = q->d[rb];
      const __m256i bs = _mm256_loadu_si256((const __m256i *)(q->bsums + rb * 16));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), _mm256_set1_ps(dw * dx), acc[r]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, msv)), _mm256_set1_ps(cw * dx), acc[r]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) res[r] = hsum8(acc[r]);
}

ROWS_FN(krows, SERVD_Q4_K, rows_q4_k)
ROWS_FN(krows, SERVD_Q5_K, rows_q5_k)
ROWS_FN(krows, SERVD_Q6_K, rows_q6_k)

void servd__mm_kquant_avx2(const servd__mm *p, int64_t j0, int64_t j1) {
  rows_fn fn = p->wt == SERVD_Q4_K ? rows_q4_k : p->wt == SERVD_Q5_K ? rows_q5_k : rows_q6_k;
  mm_rows(p, j0, j1, fn);
}
