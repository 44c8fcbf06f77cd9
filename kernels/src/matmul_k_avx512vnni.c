/* AVX-512 VNNI matmul kernel for k-quant weights (q4_k q5_k q6_k) against q8_K activations.
 *
 * out (m,n) = x (m,k) @ w (n,k)^T, w in 256-value super-blocks. Per super-block the weight quanta
 * are unpacked into four zmm of unsigned bytes (64 values each) and the sub-block scales, unpacked
 * by byte shuffles (servd__k4_scales_mins), into i16 vectors by vpermw. Then per x row:
 * - q4_k/q5_k: a 16-byte run qs[32c + 16P ..] holds sub-block 2c in its low nibbles and 2c+1 in its
 *   high ones, so two quadword permutes give zmm whose lane c always belongs to sub-block 2c (low
 *   nibbles) or 2c+1 (high). x is stored to match (servd__q8k.perm, servd__q8k_group_off): four
 *   vpdpbusd give the unscaled even and odd sub-block dots (|dot| <= 8*31*127 fits an i16), then one
 *   madd and one vpdpwssd apply the eight scales: 6 multiplies per 256 values.
 * - q6_k: 16-value sub-blocks and 6-bit quanta (dots would overflow i16): maddubs (u8 x s8 pairs,
 *   at most 2*63*127) then vpdpwssd by the sub-block scale per 64 values: 8 multiplies.
 * The offsets (q4_k/q5_k: -dmin*m[j]; q6_k: -32*d*sc[g]) multiply the 16-value sums of x (bsums);
 * q4_k/q5_k dots and offsets share one f32 accumulator per row (lanes 0..7 and 8..15), q6_k's
 * offset comes off the dots in integers (both scale by d).
 * x's residual level (servd__q8k.qs2, d2 = d/128) meets the same decoded super-block: its unscaled
 * dots take the same scale multiplies and join the first level's in integers (s*128 + s2, in
 * units of d2; krows_batch: before its f32 scales), and its bsums join the offsets the same way.
 * q6_k's totals reach ~2^25, so there the two levels meet in f32 (tot*128 + tot2, then d*d2).
 * Every kernel has both forms, chosen once per call (servd__mm.residual_fused): one pass over
 * the weights either way.
 *
 * Amortization: a super-block is decoded once for up to RQ x rows (batched decode, prefill); at
 * batch 1, four weight rows share the x loads and one scale unpack. Weights never reach memory as
 * floats. Batches of q4_k/q5_k take krows_batch instead (f32 sub-block scales, as q4_1's kernel
 * scales its blocks), and so does batch 1 when batch invariance is on (servd/ops.h); every batch
 * meets x in blocks of RQ rows by 16 weight rows, both in L1.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "avx512-impl.h"
#include "matmul-impl.h"
#include "matmul_k-impl.h"

#define RQ 8    /* x rows per pass over a weight row: 8 accumulators + 8 decoded vectors fit in 32 zmm */
#define NWMAX 4 /* weight rows per pass at batch 1 */

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* vpermw indices of the scale vectors (words of a 16-word vector of scales), built once:
 * k4[e]: q4_k/q5_k parity e, dword lane 4c+i takes sc[2c + e] in its low word and 0 (word 16);
 * k6[s]: step s of q6_k, word t takes group 4s + t/8; k4m: bsum group g takes min m[g/2] (word 8+g/2). */
static uint16_t idx_k4[2][32], idx_k6[4][32], idx_k4m[32], unmix[2][16];

SERVD__AVX512_CONSTRUCTOR(idx_init) {
  for (int s = 0; s < 4; s++)
    for (int t = 0; t < 32; t++) idx_k6[s][t] = (uint16_t)(4 * s + t / 8);
  for (int e = 0; e < 2; e++)
    for (int t = 0; t < 32; t++) idx_k4[e][t] = (uint16_t)(t % 2 ? 16 : 2 * (t / 8) + e); /* word 16 is 0 */
  for (int g = 0; g < 32; g++) idx_k4m[g] = (uint16_t)(g < 16 ? 8 + g / 2 : 0);
  /* the quantizer's sums come in slot order 0,4,1,5,2,6,3,7, 8,12,9,13,...; group g sits in slot
   * servd__q8k_group_off / 16 */
  for (int perm = 0; perm < 2; perm++) {
    const servd__q8k q = {.perm = perm};
    for (int g = 0; g < 16; g++) {
      const int p = servd__q8k_group_off(&q, g) / 16, o = p & 7;
      unmix[perm][g] = (uint16_t)((p & 8) + (o < 4 ? 2 * o : 2 * (o - 4) + 1));
    }
  }
}

static inline __m512i idx(const uint16_t *t) { return _mm512_loadu_si512(t); }

/* servd__k4_scales_mins of block b of four q4_k/q5_k weight rows at once (128-bit lane c: row c):
 * the same shuffles on a zmm, a quarter of the work per row at batch 1. */
static inline __attribute__((always_inline)) __m512i k4_scales_mins_x4(const char *const *w, int64_t b, int bb) {
  __m512i q = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(w[0] + b * bb + 4)));
  q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(w[1] + b * bb + 4)), 1);
  q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(w[2] + b * bb + 4)), 2);
  q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(w[3] + b * bb + 4)), 3);
  const __m512i a =
      _mm512_shuffle_epi8(q, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11)));
  const __m512i lo = _mm512_or_si512(
      _mm512_and_si512(
          a, _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0))),
      _mm512_and_si512(_mm512_srli_epi16(a, 4),
                       _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15))));
  const __m512i hb = _mm512_shuffle_epi8(
      q, _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7)));
  return _mm512_or_si512(lo, _mm512_and_si512(_mm512_srli_epi16(hb, 2), _mm512_set1_epi8(0x30)));
}

/* Super-block b of weight row w decoded: quanta of the four 64-value steps (wv), their i16
 * sub-block scales (sv), the i16 multipliers of the 16 bsums (msv) and [d x8, offset scale x8]. */
static inline __attribute__((always_inline)) void decode(const char *w, int64_t b, const __m128i *smp, __m512i *wv,
                                                         __m512i *sv, __m256i *msvp, __m512 *dwc,
                                                         const servd_dtype wt) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m256i msv;
  float dw = 0, cw = 0;
  if (wt == SERVD_Q6_K) {
    const servd_block_q6_k *blk = (const servd_block_q6_k *)w + b;
    dw = f16(blk->d);
    cw = 32.0f * dw; /* offsets are subtracted at the end */
    msv = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)blk->scales));
    const __m512i sc16 = _mm512_castsi256_si512(msv);
    /* step s covers values 64s..64s+63: 16-value groups 4s..4s+3, 8 words each */
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) sv[s] = _mm512_permutexvar_epi16(idx(idx_k6[s]), sc16);
      /* half h: ql[64h..] low nibbles are values 128h + 0..63, high nibbles 128h + 64..127; their
     * top 2 bits are qh[32h + l] >> 2t for the 32-value run t: moved to bits 4..5 by 64-bit shifts
     * (bits that cross bytes are masked off). */
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      const __m512i l = _mm512_loadu_si512(blk->ql + 64 * h);
      const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h)));
      const __m512i m30 = _mm512_set1_epi8(0x30);
      const __m512i h01 = _mm512_and_si512(_mm512_sllv_epi64(hb, _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2)), m30);
      const __m512i h23 = _mm512_and_si512(_mm512_srlv_epi64(hb, _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2)), m30);
      /* (l & 0x0f) | h: ternary logic 0xEA = (a & b) | c */
      wv[2 * h] = _mm512_ternarylogic_epi32(m4, l, h01, 0xEA);
      wv[2 * h + 1] = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi16(l, 4), h23, 0xEA);
    }
  } else {
    const uint16_t *dd;
    const uint8_t *scales, *qs;
    if (wt == SERVD_Q4_K) {
      const servd_block_q4_k *blk = (const servd_block_q4_k *)w + b;
      dd = &blk->d;
      scales = blk->scales;
      qs = blk->qs;
    } else {
      const servd_block_q5_k *blk = (const servd_block_q5_k *)w + b;
      dd = &blk->d;
      scales = blk->scales;
      qs = blk->qs;
    }
    if (!smp) {
      dw = f16(dd[0]);
      cw = f16(dd[1]);
    }
    const __m128i sm = smp ? *smp : servd__k4_scales_mins(scales);              /* smp: unpacked by the caller */
    const __m512i sc16 = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(sm));      /* words 0..7 sc, 8..15 m, then 0 */
    msv = _mm512_castsi512_si256(_mm512_permutexvar_epi16(idx(idx_k4m), sc16)); /* group g takes m[g / 2] */
    /* dword lanes 4c..4c+3 of the even (odd) sums take sc[2c] (sc[2c+1]) in their low word, 0 */
    sv[0] = _mm512_permutexvar_epi16(idx(idx_k4[0]), sc16);
    sv[1] = _mm512_permutexvar_epi16(idx(idx_k4[1]), sc16);
    /* run P of each 32-byte chunk c (qs[32c + 16P ..]) into 128-bit lane c: quadwords 4c+2P, +1 */
    const __m512i a = _mm512_loadu_si512(qs), b2 = _mm512_loadu_si512(qs + 64);
    const __m512i z0 = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), b2);
    const __m512i z1 = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), b2);
    if (wt == SERVD_Q4_K) {
      wv[0] = _mm512_and_si512(z0, m4);
      wv[1] = _mm512_and_si512(z1, m4);
      wv[2] = _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4);
      wv[3] = _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4);
    } else {
      /* bit 4 of sub-block j's value l is bit j of qh[l]: lane c of an even (odd) step needs bit 2c
       * (2c+1) of qh[16P + i] at bit 4: rotations of 64-bit lanes (62 = right by 2, ...), the
       * bits that cross bytes masked off */
      const __m512i m10 = _mm512_set1_epi8(0x10);
      const uint8_t *qhp = ((const servd_block_q5_k *)w + b)->qh;
      const __m512i ev = _mm512_setr_epi64(4, 4, 2, 2, 0, 0, 62, 62),
                    od = _mm512_setr_epi64(3, 3, 1, 1, 63, 63, 61, 61);
#pragma GCC unroll 2
      for (int P = 0; P < 2; P++) {
        const __m512i qh = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(qhp + 16 * P)));
        const __m512i z = P ? z1 : z0;
        wv[P] = _mm512_ternarylogic_epi32(m4, z, _mm512_and_si512(_mm512_rolv_epi64(qh, ev), m10), 0xEA);
        wv[2 + P] = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi16(z, 4),
                                              _mm512_and_si512(_mm512_rolv_epi64(qh, od), m10), 0xEA);
      }
    }
  }
  *msvp = msv;
  if (!smp) *dwc = _mm512_insertf32x8(_mm512_set1_ps(dw), _mm256_set1_ps(cw), 1); /* else the caller's */
}

/* q6_k's scaled dots of one super-block (quanta wv, scales sv) with x's four 64-value steps: two
 * chains of two (madd, then vpdpwssd), shorter latency when one row runs alone. */
static inline __attribute__((always_inline)) __m512i q6_dots(const __m512i *wv, const __m512i *sv, __m512i x0,
                                                             __m512i x1, __m512i x2, __m512i x3) {
  __m512i s0 = _mm512_madd_epi16(_mm512_maddubs_epi16(wv[0], x0), sv[0]);
  __m512i s1 = _mm512_madd_epi16(_mm512_maddubs_epi16(wv[2], x2), sv[2]);
  s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(wv[1], x1), sv[1]);
  s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(wv[3], x3), sv[3]);
  return _mm512_add_epi32(s0, s1);
}

/* res[c][r] = x row i0+r . weight row w[c], for R x rows and NW weight rows (R*NW <= RQ). Each
 * super-block of a weight row is decoded once for the R rows; with NW > 1 (batch 1) the x loads
 * are shared by the NW weight rows. two: with x's residual level, joined to the first in each dot. */
static inline __attribute__((always_inline)) void krows(const servd__mm *p, const char *const *w, int64_t i0,
                                                        float (*res)[RQ], const int R, const int NW,
                                                        const servd_dtype wt, const bool two) {
  const servd__q8k *q = &p->xk;
  const int64_t nb = q->nb;
  const int8_t *xq[RQ], *xq2[RQ] = {0};
  const float *xd = two ? q->d2 : q->d; /* two: the joined dots count in units of d2 */
  /* per row, q4_k/q5_k: lanes 0..7 sum the scaled sub-block dots (times d), lanes 8..15 the
   * offsets (as positive magnitudes dmin*m, subtracted at the end); q6_k: all 16 lanes sum dots
   * with the offset already taken off */
  __m512 acc[NWMAX][RQ];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    xq[r] = q->qs + (i0 + r) * q->ldq;
    if (two) xq2[r] = q->qs2 + (i0 + r) * q->ldq;
#pragma GCC unroll 4
    for (int c = 0; c < NW; c++) acc[c][r] = _mm512_setzero_ps();
  }
  /* Four weight rows are four interleaved streams, which hardware prefetchers pick up late from
   * DRAM (measured: half the byte rate at 14336x4096): fetch the same block of the next four rows,
   * ~9 KiB ahead at k = 4096. Weights under 1 MiB are assumed to sit in cache. */
  const int bb = wt == SERVD_Q4_K   ? sizeof(servd_block_q4_k)
                 : wt == SERVD_Q5_K ? sizeof(servd_block_q5_k)
                                    : sizeof(servd_block_q6_k);
  const bool pf = NW == NWMAX && p->n * p->ldw >= (1 << 20);
  for (int64_t b = 0; b < nb; b++) {
    if (pf) {
#pragma GCC unroll 4
      for (int c = 0; c < NW; c++) {
        /* integer arithmetic: the target may lie past the tensor (prefetches never fault) */
        const char *nx = (const char *)((uintptr_t)w[c] + (uintptr_t)(NW * p->ldw) + (uintptr_t)(b * bb));
#pragma GCC unroll 4
        for (int l = 0; l < bb; l += 64) _mm_prefetch(nx + l, _MM_HINT_T0);
        /* and the line of its last byte, which the loop misses when the block starts late in a line
         * (q5_k's 176 bytes from offset 32 reach a fourth line) */
        _mm_prefetch(nx + bb - 1, _MM_HINT_T0);
      }
    }
    __m128i sm[NWMAX];
    __m512 dwc4[NWMAX];
    if (NW == NWMAX && wt != SERVD_Q6_K) {
      const __m512i sm4 = k4_scales_mins_x4(w, b, bb);
      /* d and dmin of the four blocks in one conversion: [d0 dmin0 d1 dmin1 ...], then
       * [d x8, dmin x8] per row by one permute */
      uint32_t hd[NWMAX];
#pragma GCC unroll 4
      for (int c = 0; c < NW; c++) memcpy(&hd[c], w[c] + b * bb, 4);
      const __m512 h = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hd)));
#pragma GCC unroll 4
      for (int c = 0; c < NW; c++)
        dwc4[c] =
            _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                                   _mm512_set1_epi32(2 * c)),
                                  h);
      /* immediates spelled out: unoptimized builds do not unroll the loop into constants */
      sm[0] = _mm512_castsi512_si128(sm4);
      sm[1] = _mm512_extracti32x4_epi32(sm4, 1);
      sm[2] = _mm512_extracti32x4_epi32(sm4, 2);
      sm[3] = _mm512_extracti32x4_epi32(sm4, 3);
    }
#pragma GCC unroll 4
    for (int c = 0; c < NW; c++) {
      __m512i wv[4], sv[4];
      __m256i msv;
      __m512 dwc = NW == NWMAX && wt != SERVD_Q6_K ? dwc4[c] : _mm512_setzero_ps();
      decode(w[c], b, NW == NWMAX && wt != SERVD_Q6_K ? &sm[c] : NULL, wv, sv, &msv, &dwc, wt);
      float dq6 = 0.0f;
      if (wt == SERVD_Q6_K) {
        dq6 = f16(((const servd_block_q6_k *)w[c] + b)->d);
        msv = _mm256_slli_epi16(msv, 5); /* 32 * sc: at most 4096 */
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        const int8_t *xb = xq[r] + b * SERVD_QK_K;
        const __m512i x0 = _mm512_load_si512((const void *)xb), x1 = _mm512_load_si512((const void *)(xb + 64));
        const __m512i x2 = _mm512_load_si512((const void *)(xb + 128)),
                      x3 = _mm512_load_si512((const void *)(xb + 192));
        const int64_t rb = (i0 + r) * nb + b;
        const __m256i bs = _mm256_loadu_si256((const __m256i *)(q->bsums + rb * 16));
        if (wt == SERVD_Q6_K) {
          /* q6_k's -32 shares d with the dots: taken off in integers (|32*sc*bsums| <= 16.6M per
           * lane pair), then one conversion and one FMA by d*d_x */
          const __m512i tot =
              _mm512_sub_epi32(q6_dots(wv, sv, x0, x1, x2, x3), _mm512_zextsi256_si512(_mm256_madd_epi16(bs, msv)));
          if (!two) {
            acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_set1_ps(dq6 * q->d[rb]), acc[c][r]);
            continue;
          }
          /* the residual's total the same way; the two meet in f32 (tot*128 would overflow an
           * int32: |tot| reaches ~2^25), the *128 exact */
          const int8_t *yb = xq2[r] + b * SERVD_QK_K;
          const __m256i bs2 = _mm256_loadu_si256((const __m256i *)(q->bsums2 + rb * 16));
          const __m512i tot2 = _mm512_sub_epi32(
              q6_dots(wv, sv, _mm512_load_si512((const void *)yb), _mm512_load_si512((const void *)(yb + 64)),
                      _mm512_load_si512((const void *)(yb + 128)), _mm512_load_si512((const void *)(yb + 192))),
              _mm512_zextsi256_si512(_mm256_madd_epi16(bs2, msv)));
          const __m512 joined =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_set1_ps(128.0f), _mm512_cvtepi32_ps(tot2));
          acc[c][r] = _mm512_fmadd_ps(joined, _mm512_set1_ps(dq6 * xd[rb]), acc[c][r]);
          continue;
        }
        /* even and odd sub-blocks in fixed lanes: unscaled dots by vpdpbusd (|sum| <= 8*31*127,
         * an i16), then one scale multiply each (madd / vpdpwssd on the low words) */
        const __m512i ev = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], x0), wv[1], x1);
        const __m512i od = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[2], x2), wv[3], x3);
        __m512i s = _mm512_dpwssd_epi32(_mm512_madd_epi16(ev, sv[0]), od, sv[1]);
        __m256i mins = _mm256_madd_epi16(bs, msv);
        if (two) {
          /* The residual's unscaled dots (|sum| <= 8*31*64, an i16 too) scaled by the same two
           * multiplies onto s*128: in units of d2 per lane |s*128 + s2| <= (2*31496*128 + 2*15872)
           * * 63 < 5.1e8, and the two halves' sum below < 1.02e9 < 2^31. The offsets likewise:
           * |bsums*128 + bsums2| * m * 2 < 3.3e7. */
          const int8_t *yb = xq2[r] + b * SERVD_QK_K;
          const __m512i ev2 = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], _mm512_load_si512((const void *)yb)), wv[1],
              _mm512_load_si512((const void *)(yb + 64)));
          const __m512i od2 = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[2], _mm512_load_si512((const void *)(yb + 128))), wv[3],
              _mm512_load_si512((const void *)(yb + 192)));
          s = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_slli_epi32(s, 7), ev2, sv[0]), od2, sv[1]);
          const __m256i bs2 = _mm256_loadu_si256((const __m256i *)(q->bsums2 + rb * 16));
          mins = _mm256_dpwssd_epi32(_mm256_slli_epi32(mins, 7), bs2, msv);
        }
        const __m256i dot = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(dot), mins, 1);
        acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(both), _mm512_mul_ps(dwc, _mm512_set1_ps(xd[rb])), acc[c][r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < NW; c++)
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
      res[c][r] =
          wt == SERVD_Q6_K
              ? hsum16(acc[c][r])
              : hsum16(_mm512_mul_ps(acc[c][r], _mm512_insertf32x8(_mm512_set1_ps(1.0f), _mm256_set1_ps(-1.0f), 1)));
}

/* x rows i0..i0+R . weight row w for q4_k/q5_k when m > 1, in q4_1's arrangement: the sub-block
 * scales are f32 vectors (d*sc, exact in f32) that multiply the converted even and odd sub-block
 * dots (two conversions, one multiply and two FMAs per row and super-block, d_x applied once), and
 * the offsets are one 8-lane FMA of dmin*m against sx, x's sub-block sums times d_x (prepared once
 * per call by sub_block_sums). Against krows this drops the i16 scale multiplies and the
 * per-super-block folding and insertion of the offset lanes: ~10 instructions per row and
 * super-block besides the four vpdpbusd instead of ~15. */
static inline __attribute__((always_inline)) void krows_batch(const servd__mm *p, const char *const *w, int64_t i0,
                                                              float (*res)[RQ], const int R, const int NW,
                                                              const float *sx, const servd_dtype wt, const bool two) {
  const servd__q8k *q = &p->xk;
  const int64_t nb = q->nb;
  const float *xd = two ? q->d2 : q->d; /* two: the joined dots count in units of d2 */
  const __m512i ev_of = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
  const __m512i od_of = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
  const int bb = wt == SERVD_Q4_K ? sizeof(servd_block_q4_k) : sizeof(servd_block_q5_k);
  const bool pf = NW == NWMAX && p->n * p->ldw >= (1 << 20); /* as krows: four streams from DRAM */
  __m512 acc[NWMAX][RQ];
  __m256 accm[NWMAX][RQ];
#pragma GCC unroll 4
  for (int c = 0; c < NW; c++)
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[c][r] = _mm512_setzero_ps(), accm[c][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 4
    for (int c = 0; c < NW; c++) {
      if (pf) {
        const char *nx = (const char *)((uintptr_t)w[c] + (uintptr_t)(NW * p->ldw) + (uintptr_t)(b * bb));
#pragma GCC unroll 4
        for (int l = 0; l < bb; l += 64) _mm_prefetch(nx + l, _MM_HINT_T0);
        _mm_prefetch(nx + bb - 1, _MM_HINT_T0);
      }
      const uint16_t *dd;
      const uint8_t *scales;
      if (wt == SERVD_Q4_K) {
        dd = &((const servd_block_q4_k *)w[c] + b)->d;
        scales = ((const servd_block_q4_k *)w[c] + b)->scales;
      } else {
        dd = &((const servd_block_q5_k *)w[c] + b)->d;
        scales = ((const servd_block_q5_k *)w[c] + b)->scales;
      }
      const __m128i sm = servd__k4_scales_mins(scales);
      __m512i wv[4], sv[4];
      __m256i msv;
      __m512 dwc;
      decode(w[c], b, &sm, wv, sv, &msv, &dwc, wt);                    /* quanta only: the scale vectors go unused */
      const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sm)); /* sc[0..7], m[0..7] */
      const __m512 d = _mm512_set1_ps(f16(dd[0]));
      const __m512 dev = _mm512_mul_ps(_mm512_permutexvar_ps(ev_of, scf), d);
      const __m512 dod = _mm512_mul_ps(_mm512_permutexvar_ps(od_of, scf), d);
      const __m256 mins = _mm256_mul_ps(_mm512_extractf32x8_ps(scf, 1), _mm256_set1_ps(f16(dd[1])));
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        const int8_t *xb = q->qs + (i0 + r) * q->ldq + b * SERVD_QK_K;
        __m512i ev = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], _mm512_load_si512(xb)),
                                         wv[1], _mm512_load_si512(xb + 64));
        __m512i od =
            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[2], _mm512_load_si512(xb + 128)), wv[3],
                                _mm512_load_si512(xb + 192));
        if (two) { /* the residual's dots onto dot*128, in units of d2: |ev| <= 8*31*(127*128 + 64) < 2^22 */
          const int8_t *yb = q->qs2 + (i0 + r) * q->ldq + b * SERVD_QK_K;
          ev = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(ev, 7), wv[0], _mm512_load_si512(yb)), wv[1],
                                   _mm512_load_si512(yb + 64));
          od = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(od, 7), wv[2], _mm512_load_si512(yb + 128)),
                                   wv[3], _mm512_load_si512(yb + 192));
        }
        const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(od), dod, _mm512_mul_ps(_mm512_cvtepi32_ps(ev), dev));
        const int64_t rb = (i0 + r) * nb + b;
        acc[c][r] = _mm512_fmadd_ps(t, _mm512_set1_ps(xd[rb]), acc[c][r]);
        accm[c][r] = _mm256_fmadd_ps(mins, _mm256_loadu_ps(sx + rb * 8), accm[c][r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < NW; c++)
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) res[c][r] = hsum16(acc[c][r]) - hsum16(_mm512_castps256_ps512(accm[c][r]));
}

/* sx for krows_batch: per x row and super-block the 8 sub-block sums of q times d_x (from bsums);
 * two: of both levels, sum*128 + sum2 (exact integers) times d2. */
static void sub_block_sums(const servd__q8k *q, int64_t m, float *sx, bool two) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t rb = 0; rb < m * q->nb; rb++) {
    const __m256i bs = _mm256_loadu_si256((const __m256i *)(q->bsums + rb * 16));
    __m256i pairs = _mm256_madd_epi16(bs, ones); /* sub-block j: groups 2j, 2j+1 */
    if (two)
      pairs = _mm256_dpwssd_epi32(_mm256_slli_epi32(pairs, 7),
                                  _mm256_loadu_si256((const __m256i *)(q->bsums2 + rb * 16)), ones);
    _mm256_storeu_ps(sx + rb * 8, _mm256_mul_ps(_mm256_cvtepi32_ps(pairs), _mm256_set1_ps(two ? q->d2[rb] : q->d[rb])));
  }
}

/* x rows i0..i0+R (1..RQ) against one weight row, or (R = 0) x row i0 against NWMAX weight rows:
 * res[c][r]. Each output takes the same arithmetic either way. */
typedef void (*batch_fn)(const servd__mm *p, const char *const *w, int64_t i0, float (*res)[RQ], int R,
                         const float *sx);
#define BATCH_FN(wt, two, name) \
  static void name(const servd__mm *p, const char *const *w, int64_t i0, float(*res)[RQ], int R, const float *sx) { \
    switch (R) { \
    case 0: krows_batch(p, w, i0, res, 1, NWMAX, sx, wt, two); break; \
    case 1: krows_batch(p, w, i0, res, 1, 1, sx, wt, two); break; \
    case 2: krows_batch(p, w, i0, res, 2, 1, sx, wt, two); break; \
    case 3: krows_batch(p, w, i0, res, 3, 1, sx, wt, two); break; \
    case 4: krows_batch(p, w, i0, res, 4, 1, sx, wt, two); break; \
    case 5: krows_batch(p, w, i0, res, 5, 1, sx, wt, two); break; \
    case 6: krows_batch(p, w, i0, res, 6, 1, sx, wt, two); break; \
    case 7: krows_batch(p, w, i0, res, 7, 1, sx, wt, two); break; \
    default: krows_batch(p, w, i0, res, 8, 1, sx, wt, two); break; \
    } \
  }
BATCH_FN(SERVD_Q4_K, false, batch_q4_k)
BATCH_FN(SERVD_Q5_K, false, batch_q5_k)
BATCH_FN(SERVD_Q4_K, true, batch2_q4_k)
BATCH_FN(SERVD_Q5_K, true, batch2_q5_k)

/* The 16-value sums of one stored q8_K super-block (256 bytes at qs, group order as perm): vpsadbw
 * of q + 128 gives 8-byte sums + 1024, taken over the bytes as stored (16-byte slot p = 4t + lane of
 * step t) and put back in group order by unmix. */
static inline __m256i group_sums(const int8_t *qs, bool perm) {
  __m512i sad[4];
  const __m512i flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
  for (int t = 0; t < 4; t++)
    sad[t] =
        _mm512_sad_epu8(_mm512_xor_si512(_mm512_load_si512((const void *)(qs + 64 * t)), flip), _mm512_setzero_si512());
  /* 128-bit lane i of A: slots (i, 4 + i) as u64; of B: (8 + i, 12 + i) */
  const __m512i A = _mm512_add_epi64(_mm512_unpacklo_epi64(sad[0], sad[1]), _mm512_unpackhi_epi64(sad[0], sad[1]));
  const __m512i B = _mm512_add_epi64(_mm512_unpacklo_epi64(sad[2], sad[3]), _mm512_unpackhi_epi64(sad[2], sad[3]));
  const __m256i sums = _mm256_set_m128i(_mm512_cvtepi64_epi16(B), _mm512_cvtepi64_epi16(A));
  return _mm256_sub_epi16(_mm256_permutexvar_epi16(_mm256_loadu_si256((const __m256i *)unmix[perm]), sums),
                          _mm256_set1_epi16(2048));
}

/* q8_K activations with AVX-512: as servd__quantize_q8k value for value (roundf emulated by
 * round_half_away, the residual level by residual_q16), with the 16-value sums by group_sums. */
void servd__quantize_q8k_avx512(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8k *q) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  (void)k;
  for (int64_t r = 0; r < m; r++) {
    const float *xr = (const float *)(x + r * ldx);
    int8_t *qs = q->qs + r * q->ldq, *qs2 = q->qs2 ? q->qs2 + r * q->ldq : NULL;
    for (int64_t b = 0; b < q->nb; b++, xr += SERVD_QK_K, qs += SERVD_QK_K, qs2 = qs2 ? qs2 + SERVD_QK_K : NULL) {
      const int64_t at = r * q->nb + b;
      int16_t *bs = q->bsums + at * 16;
      __m512 am = _mm512_setzero_ps();
      __mmask16 bad = 0;
#pragma GCC unroll 16
      for (int g = 0; g < 16; g++) {
        const __m512 v = _mm512_loadu_ps(xr + 16 * g);
        am = _mm512_max_ps(am, _mm512_andnot_ps(sign, v));
        bad |= _mm512_fpclass_ps_mask(v, 0x99); /* NaN and both infinities */
      }
      if (bad) { /* as the scalar quantizer: the block's outputs become NaN */
        memset(qs, 0, SERVD_QK_K);
        memset(bs, 0, 16 * sizeof *bs);
        q->d[at] = NAN;
        if (qs2) {
          memset(qs2, 0, SERVD_QK_K);
          memset(q->bsums2 + at * 16, 0, 16 * sizeof *bs);
          q->d2[at] = NAN;
        }
        continue;
      }
      const float d = _mm512_reduce_max_ps(am) / 127.0f, id = d ? 1.0f / d : 0.0f;
      const __m512 idv = _mm512_set1_ps(id), dv = _mm512_set1_ps(d), id2 = _mm512_set1_ps(id * 128.0f);
#pragma GCC unroll 16
      for (int g = 0; g < 16; g++) {
        const __m512 v = _mm512_loadu_ps(xr + 16 * g), t = round_half_away(_mm512_mul_ps(v, idv));
        const int off = servd__q8k_group_off(q, g);
        _mm_storeu_si128((__m128i *)(qs + off), _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(t)));
        if (qs2) _mm_storeu_si128((__m128i *)(qs2 + off), _mm512_cvtsepi32_epi8(residual_q16(v, t, dv, id2)));
      }
      _mm256_storeu_si256((__m256i *)bs, group_sums(qs, q->perm));
      q->d[at] = d;
      if (qs2) {
        _mm256_storeu_si256((__m256i *)(q->bsums2 + at * 16), group_sums(qs2, q->perm));
        q->d2[at] = d * SERVD__RESIDUAL_SCALE;
      }
    }
  }
}

typedef void (*rows_fn)(const servd__mm *p, const char *const *w, int64_t i0, float (*res)[RQ], int R);
#define KROWS_FN(wt, two, name) \
  static void name(const servd__mm *p, const char *const *w, int64_t i0, float(*res)[RQ], int R) { \
    switch (R) { \
    case 0: krows(p, w, i0, res, 1, NWMAX, wt, two); break; /* batch 1: NWMAX weight rows */ \
    case 1: krows(p, w, i0, res, 1, 1, wt, two); break; \
    case 2: krows(p, w, i0, res, 2, 1, wt, two); break; \
    case 3: krows(p, w, i0, res, 3, 1, wt, two); break; \
    case 4: krows(p, w, i0, res, 4, 1, wt, two); break; \
    case 5: krows(p, w, i0, res, 5, 1, wt, two); break; \
    case 6: krows(p, w, i0, res, 6, 1, wt, two); break; \
    case 7: krows(p, w, i0, res, 7, 1, wt, two); break; \
    default: krows(p, w, i0, res, 8, 1, wt, two); break; \
    } \
  }
KROWS_FN(SERVD_Q4_K, false, rows_q4_k)
KROWS_FN(SERVD_Q5_K, false, rows_q5_k)
KROWS_FN(SERVD_Q6_K, false, rows_q6_k)
KROWS_FN(SERVD_Q4_K, true, rows2_q4_k)
KROWS_FN(SERVD_Q5_K, true, rows2_q5_k)
KROWS_FN(SERVD_Q6_K, true, rows2_q6_k)

void servd__mm_kquant_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1) {
  /* the activation precision chosen once per call: each form its own instances */
  const bool two = p->residual_fused;
  const rows_fn fn = p->wt == SERVD_Q4_K   ? (two ? rows2_q4_k : rows_q4_k)
                     : p->wt == SERVD_Q5_K ? (two ? rows2_q5_k : rows_q5_k)
                                           : (two ? rows2_q6_k : rows_q6_k);
  const batch_fn bf = p->wt == SERVD_Q4_K ? (two ? batch2_q4_k : batch_q4_k) : (two ? batch2_q5_k : batch_q5_k);
  float res[NWMAX][RQ];
  /* q4_k/q5_k batches take krows_batch, on x's sub-block sums; batch 1 takes krows (faster) unless
   * batch invariance is asked for (servd_cpu_batch_invariant): then krows_batch too, so that a row
   * alone takes the same arithmetic as in a batch. q6_k (and q4_k/q5_k without scratch memory) take
   * krows at every m. */
  const bool batch_form = p->wt != SERVD_Q6_K && (p->m > 1 || servd_cpu_batch_invariant());
  float *sx = batch_form ? servd__scratch(1, (size_t)(p->m * p->xk.nb * 8) * sizeof(float)) : NULL;
  if (sx) sub_block_sums(&p->xk, p->m, sx, two);
  if (p->m > 1) {
    /* Batches: blocks of CHUNK weight rows (CHUNK * 144..210 bytes) and RQ x rows (RQ * k bytes)
     * both stay in L1 while they meet; weight rows outer streamed all of x from L2 for every weight
     * row (q4_k at m = 512 ran at 0.6x the speed of this order). */
    enum { CHUNK = 16 };
    for (int64_t jc = j0; jc < j1; jc += CHUNK) {
      const int64_t je = j1 - jc < CHUNK ? j1 : jc + CHUNK;
      for (int64_t i = 0; i < p->m; i += RQ) {
        const int R = p->m - i < RQ ? (int)(p->m - i) : RQ;
        for (int64_t j = jc; j < je; j++) {
          const char *w = p->w + j * p->ldw;
          if (sx) bf(p, &w, i, res, R, sx);
          else fn(p, &w, i, res, R);
          for (int r = 0; r < R; r++) ((float *)(p->out + (i + r) * p->ldo))[j] = res[0][r];
        }
      }
    }
    return;
  }
  for (int64_t j = j0; j < j1;) {
    const char *w[NWMAX];
    /* q6_k stays at one weight row: measured 3-4x slower with four from DRAM (k = 4096) */
    if (p->wt != SERVD_Q6_K && j1 - j >= NWMAX) {
      for (int c = 0; c < NWMAX; c++) w[c] = p->w + (j + c) * p->ldw;
      if (sx) bf(p, w, 0, res, 0, sx);
      else fn(p, w, 0, res, 0);
      for (int c = 0; c < NWMAX; c++) ((float *)p->out)[j + c] = res[c][0];
      j += NWMAX;
      continue;
    }
    w[0] = p->w + j * p->ldw;
    if (sx) bf(p, w, 0, res, 1, sx);
    else fn(p, w, 0, res, 1);
    ((float *)p->out)[j] = res[0][0];
    j++;
  }
}
