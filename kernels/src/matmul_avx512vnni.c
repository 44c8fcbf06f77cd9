/* AVX-512 VNNI kernels for q8_0/q4_0/q4_1/iq4_nl weights against q8 activations (servd__q8x).
 *
 * Per weight row, blocks go in groups of 16: their 16 f16 scales (and q4_1 mins) are collected into
 * one vector with word permutes (load_headers) and multiplied by the activation scales of the group;
 * the offset terms of q4_0 (-8*d) and q4_1 (m) meet s = d_x*sum(q_x) in one vector FMA per group.
 * iq4_nl is q4_0's layout with codes into a 16-value table: one vpshufb per nibble vector turns codes
 * into table value + 128 (unsigned for vpdpbusd), and the +128 comes off as the offset -128*d.
 * Inside a group:
 * - q4: 4 blocks per step; their 16-byte nibble runs fill the 4 lanes of a zmm (two loads and one
 *   word permute), low and high nibbles are split with one shift and two ands and multiplied
 *   (vpdpbusd, u8 x s8) with activations kept in the matching "quad" layout: no byte shuffles.
 * - q8_0: the same 4 blocks per step and quad activations: two word permutes gather the 4 blocks'
 *   values 0..15 and 16..31 into one zmm each. vpdpbusd multiplies x + 128 (unsigned: a copy of
 *   the activations xor 0x80, once per call) with the signed quanta; the dots start from -128 *
 *   the lane sums of w (two vpdpbusd per quad and weight row, shared by the R rows), so they are
 *   exact integers, as the scalar path's. (Taking a +128 off in f32 with an offset term, as iq4_nl
 *   does, cancelled badly on real activations: TP=1 and TP=3 logits differed by 7e-3.) Per x row
 *   a q8_0 quad then costs what a q4 quad does (two vpdpbusd, one conversion, one FMA).
 * Each 4-lane run of int32 dot lanes belongs to one block; one permute spreads the group's block
 * scales to those lanes, then one FMA accumulates in f32.
 * Up to RQ activation rows share each weight load (batched decode and prefill).
 */
#include <immintrin.h>

#include "avx512-impl.h"
#include "matmul-impl.h"
#include "matmul_avx512vnni-impl.h"
#include "servd/blocks.h"

#define RQ 4

/* Nibble runs of 4 whole q4 blocks starting at block `blk`: two loads inside the 4 blocks and one
 * word permute (the runs start at even byte offsets for both q4_0 and q4_1). */
static inline __attribute__((always_inline)) __m512i load_quad_full(const char *blk, const int bb) {
  const __m512i a = _mm512_loadu_si512(blk);
  const __m512i b = bb == 20 ? _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk + 64)))
                             : _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)(blk + 64)));
  /* lane p takes words (bb*p + qoff)/2 .. +8 */
  static const uint16_t idx20[32] = {2,  3,  4,  5,  6,  7,  8,  9,  12, 13, 14, 15, 16, 17, 18, 19,
                                     22, 23, 24, 25, 26, 27, 28, 29, 32, 33, 34, 35, 36, 37, 38, 39};
  static const uint16_t idx18[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12, 13, 14, 15, 16, 17,
                                     19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31, 32, 33, 34, 35};
  const __m512i idx = _mm512_loadu_si512(bb == 20 ? idx20 : idx18);
  return _mm512_permutex2var_epi16(a, idx, b);
}

static inline __attribute__((always_inline)) __m512i load_quad(const char *b0, int bb, int valid) {
  __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)b0));
  if (valid >= 4) {
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(b0 + bb)), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(b0 + 2 * bb)), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(b0 + 3 * bb)), 3);
  }
  z = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)b0));
  if (valid > 1) z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(b0 + bb)), 1);
  if (valid > 2) z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(b0 + 2 * bb)), 2);
  return z;
}

#define NWMAX 4

/* Block headers of a whole group of 16 blocks without a gather (slow on some cores): the group's
 * 16*bb bytes are loaded as zmm pairs and word permutes (vpermt2w) pick, for block i, the words at
 * byte i*bb (d) and i*bb+2 (q4_1: m) into dword i. Only the low word is meaningful for q8_0/q4_0.
 * The index vectors depend only on the block size and are built once. */
#define HDR_WINDOWS 5 /* ceil(16*34 / 128) */
typedef struct hdr_plan {
  __m512i idx[HDR_WINDOWS];
  __mmask32 take[HDR_WINDOWS];
} hdr_plan;
static hdr_plan plans[3]; /* q8_0, q4_0, q4_1 */

static void plan_build(hdr_plan *p, int bb, bool both_words) {
  uint16_t idx[HDR_WINDOWS][32] = {{0}};
  for (int t = 0; t < HDR_WINDOWS; t++) p->take[t] = 0;
  for (int o = 0; o < 32; o++) {
    if ((o & 1) && !both_words) continue;
    int src = (o / 2) * (bb / 2) + (o & 1); /* source word */
    idx[src / 64][o] = (uint16_t)(src % 64);
    p->take[src / 64] |= (__mmask32)1u << o;
  }
  for (int t = 0; t < HDR_WINDOWS; t++) p->idx[t] = _mm512_loadu_si512(idx[t]);
}

SERVD__AVX512_CONSTRUCTOR(plans_init) {
  plan_build(&plans[0], 34, false);
  plan_build(&plans[1], 18, false);
  plan_build(&plans[2], 20, true);
}

/* Headers of the first nblk (<= 16) blocks at wg; dwords of missing blocks are zero. */
static inline __attribute__((always_inline)) __m512i load_headers(const char *wg, const int bb, const int nblk,
                                                                  const hdr_plan *pl) {
  const int bytes = nblk * bb;
  __m512i res = _mm512_setzero_si512();
#pragma GCC unroll 5
  for (int t = 0; t < HDR_WINDOWS; t++) {
    if (t * 128 >= 16 * bb) break;
    const int rem = bytes - t * 128;
    if (rem <= 0) break;
    res = _mm512_mask_mov_epi16(res, pl->take[t], window_permute(wg + t * 128, rem, pl->idx[t]));
  }
  return res;
}

/* ggml's iq4_nl codebook plus 128, as unsigned bytes in every 128-bit lane. */
static inline __m512i iq4_table(void) {
  return _mm512_broadcast_i32x4(
      _mm_add_epi8(_mm_loadu_si128((const __m128i *)servd_iq4_values), _mm_set1_epi8((char)0x80)));
}

/* q4_0's and iq4_nl's offset per unit of s: -8*d, -128*d (q8_0 has none: its dots are exact). */
static inline __m512 offset_of(__m512 dw, const servd_dtype wt) {
  return _mm512_mul_ps(dw, _mm512_set1_ps(wt == SERVD_Q4_0 ? -8.0f : -128.0f));
}

/* Values 0..15 (*lo) and 16..31 (*hi) of 4 q8_0 blocks whose quanta start at qs (`valid` < 4: the
 * lanes of missing blocks are zero), block i in 128-bit lane i as in the quad activations, as signed
 * bytes. Whole quads: lo from the window [qs-2, qs+126), hi from [qs+6, qs+134) (both inside the 4
 * blocks' 136 bytes), one word permute each; block i's runs start at words 17i+1 and 17i+5 of them. */
static inline __attribute__((always_inline)) void load_q8_quad(const char *qs, int valid, __m512i *lo, __m512i *hi) {
  if (valid >= 4) {
    static const uint16_t ilo[32] = {1,  2,  3,  4,  5,  6,  7,  8,  18, 19, 20, 21, 22, 23, 24, 25,
                                     35, 36, 37, 38, 39, 40, 41, 42, 52, 53, 54, 55, 56, 57, 58, 59};
    static const uint16_t ihi[32] = {5,  6,  7,  8,  9,  10, 11, 12, 22, 23, 24, 25, 26, 27, 28, 29,
                                     39, 40, 41, 42, 43, 44, 45, 46, 56, 57, 58, 59, 60, 61, 62, 63};
    const __m512i l =
        _mm512_permutex2var_epi16(_mm512_loadu_si512(qs - 2), _mm512_loadu_si512(ilo), _mm512_loadu_si512(qs + 62));
    const __m512i h =
        _mm512_permutex2var_epi16(_mm512_loadu_si512(qs + 6), _mm512_loadu_si512(ihi), _mm512_loadu_si512(qs + 70));
    *lo = l;
    *hi = h;
    return;
  }
  __m512i l = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)qs));
  __m512i h = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(qs + 16)));
  if (valid > 1) {
    l = _mm512_inserti32x4(l, _mm_loadu_si128((const __m128i *)(qs + 34)), 1);
    h = _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)(qs + 50)), 1);
  }
  if (valid > 2) {
    l = _mm512_inserti32x4(l, _mm_loadu_si128((const __m128i *)(qs + 68)), 2);
    h = _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)(qs + 84)), 2);
  }
  *lo = l;
  *hi = h;
}

/* The residual level joined to a quad's dots in integers: (dot << 7) + the dots of the residual
 * quanta at xp2 (quad layout; q8_0: stored + 128 with the same -128 * sum(w) start z as the first
 * level's), so the dot is exact in units of d2 = d/128. A lane adds 8 products: |lane| <= 8*127*128*128 +
 * 8*64*128 < 2^24 (q8_0, the widest), so its conversion to f32 stays exact. */
static inline __attribute__((always_inline)) __m512i residual_dots(__m512i dot, __m512i z, __m512i lo, __m512i hi,
                                                                   const int8_t *xp2, const servd_dtype wt) {
  if (wt != SERVD_Q8_0) return residual_quad_dots(dot, lo, hi, xp2);
  const __m512i y0 = _mm512_load_si512((const void *)xp2), y1 = _mm512_load_si512((const void *)(xp2 + 64));
  dot = _mm512_slli_epi32(dot, 7);
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_add_epi32(dot, z), y0, lo), y1, hi);
}

/* Blocks g+q.. of weight row c (4 of them, or `valid` < 4) against R activation rows; wq points at
 * block g+q's quanta (q4_1: past d and m). */
static inline __attribute__((always_inline)) void quad_step(const char *wq, int bb, int64_t g, int q, int valid,
                                                            const int8_t *const *xq, const int8_t *const *xq2,
                                                            const __m512 (*ds)[NWMAX], __m512 (*acc)[NWMAX],
                                                            const int c, const int R, const servd_dtype wt,
                                                            const bool two) {
  __m512i lo, hi;
  if (wt == SERVD_Q8_0) {
    load_q8_quad(wq + q * bb, valid, &lo, &hi);
  } else {
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const __m512i z =
        valid >= 4 ? load_quad_full(wq - (bb == 20 ? 4 : 2) + q * bb, bb) : load_quad(wq + q * bb, bb, valid);
    lo = _mm512_and_si512(z, nib), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
    if (wt == SERVD_IQ4_NL) {
      lo = _mm512_shuffle_epi8(iq4_table(), lo);
      hi = _mm512_shuffle_epi8(iq4_table(), hi);
    }
  }
  const __m512i idx =
      _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_set1_epi32(q));
  /* q8_0: x + 128 (unsigned, stored so by the driver) times signed w; the dots start from -128 *
   * the lane sums of w, taken once for the R rows: exact integers */
  __m512i z = _mm512_setzero_si512();
  if (wt == SERVD_Q8_0) {
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    z = _mm512_sub_epi32(z, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, c128, lo), c128, hi));
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    const int8_t *xp = xq[r] + (g + q) * 32; /* quad layout: 4 blocks per 128 bytes */
    const __m512i x0 = _mm512_load_si512((const void *)xp), x1 = _mm512_load_si512((const void *)(xp + 64));
    __m512i dot = wt == SERVD_Q8_0 ? _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, x0, lo), x1, hi)
                                   : _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo, x0), hi, x1);
    if (two) dot = residual_dots(dot, z, lo, hi, xq2[r] + (g + q) * 32, wt);
    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(idx, ds[r][c]), acc[r][c]);
  }
}

/* The last group of a q4 row when it holds 1..4 blocks (k = 576 leaves 2): one masked window of the
 * weight row yields both the nibble runs and the block headers, already spread to the 4 lanes of
 * each block, so the per-group header pass is skipped. */
static inline __attribute__((always_inline)) void
q4_tail(const char *const *w, int bb, int64_t g, int nbg, const int8_t *const *xq, const int8_t *const *xq2,
        const float *const *xd, const float *const *xs, const float *const *xs2, __m512 (*acc)[NWMAX],
        __m512 (*accm)[NWMAX], const int R, const int NW, const servd_dtype wt, const bool two) {
  static const uint16_t nib20[32] = {2,  3,  4,  5,  6,  7,  8,  9,  12, 13, 14, 15, 16, 17, 18, 19,
                                     22, 23, 24, 25, 26, 27, 28, 29, 32, 33, 34, 35, 36, 37, 38, 39};
  static const uint16_t nib18[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12, 13, 14, 15, 16, 17,
                                     19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31, 32, 33, 34, 35};
  /* dword lane l <- words (bb/2)*(l/4) and +1: block l/4's d (and q4_1's m) */
  static const uint16_t hdr20[32] = {0,  1,  0,  1,  0,  1,  0,  1,  10, 11, 10, 11, 10, 11, 10, 11,
                                     20, 21, 20, 21, 20, 21, 20, 21, 30, 31, 30, 31, 30, 31, 30, 31};
  static const uint16_t hdr18[32] = {0,  1,  0,  1,  0,  1,  0,  1,  9,  10, 9,  10, 9,  10, 9,  10,
                                     18, 19, 18, 19, 18, 19, 18, 19, 27, 28, 27, 28, 27, 28, 27, 28};
  const __m512i nib = _mm512_set1_epi8(0x0f);
  const __m512i inib = _mm512_loadu_si512(bb == 20 ? nib20 : nib18);
  const __m512i ihdr = _mm512_loadu_si512(bb == 20 ? hdr20 : hdr18);
  __mmask64 ma, mb;
  __m512 dxe[RQ], sxe[RQ];
  tail_setup_levels(nbg * bb, &ma, &mb, xd, xs, xs2, g, R, dxe, sxe, two); /* the offsets meet both levels' sums */
#pragma GCC unroll 4
  for (int c = 0; c < NW; c++) {
    const char *src = w[c] + g * bb;
    const __m512i a = _mm512_maskz_loadu_epi8(ma, src), b = _mm512_maskz_loadu_epi8(mb, src + 64);
    const __m512i z = _mm512_permutex2var_epi16(a, inib, b), hv = _mm512_permutex2var_epi16(a, ihdr, b);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hv));
    const __m512 cw =
        wt != SERVD_Q4_1 ? offset_of(dw, wt) : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hv, 16)));
    __m512i lo = _mm512_and_si512(z, nib), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
    if (wt == SERVD_IQ4_NL) {
      lo = _mm512_shuffle_epi8(iq4_table(), lo);
      hi = _mm512_shuffle_epi8(iq4_table(), hi);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      const int8_t *xp = xq[r] + g * 32;
      __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512((const void *)xp));
      dot = _mm512_dpbusd_epi32(dot, hi, _mm512_load_si512((const void *)(xp + 64)));
      if (two) dot = residual_dots(dot, _mm512_setzero_si512(), lo, hi, xq2[r] + g * 32, wt);
      acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, dxe[r]), acc[r][c]);
      accm[r][c] = _mm512_fmadd_ps(cw, sxe[r], accm[r][c]);
    }
  }
}

/* The scales (*dw) and offsets per unit of s (*cw: q4_1's m, else offset_of) of the nbg (<= 16)
 * blocks at wg; zero for missing blocks. */
static inline __attribute__((always_inline)) void group_scales(const char *wg, const int nbg, const hdr_plan *pl,
                                                               __m512 *dw, __m512 *cw, const servd_dtype wt) {
  const int bb = wt == SERVD_Q8_0 ? 34 : wt == SERVD_Q4_1 ? 20 : 18;
  const __m512i raw = nbg == 16 ? load_headers(wg, bb, 16, pl) : load_headers(wg, bb, nbg, pl);
  *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
  *cw = wt != SERVD_Q4_1 ? offset_of(*dw, wt) : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(raw, 16)));
}

/* out rows i0..i0+R, columns j..j+NW = x rows . weight rows j..j+NW; two: with the residual
 * activation level (x's block scales are then d2's, and the offsets meet both levels' sums). */
static inline __attribute__((always_inline)) void tile_levels(const servd__mm *p, int64_t i0, int64_t j, const int R,
                                                              const int NW, const servd_dtype wt, const bool two) {
  const int bb = wt == SERVD_Q8_0 ? 34 : wt == SERVD_Q4_1 ? 20 : 18; /* iq4_nl: q4_0's layout */
  const int qoff = wt == SERVD_Q4_1 ? 4 : 2;
  const int64_t nb = p->xq.nb;
  const hdr_plan *pl = &plans[wt == SERVD_Q8_0 ? 0 : wt == SERVD_Q4_1 ? 2 : 1];
  const int8_t *xq[RQ], *xq2[RQ] = {0};
  const float *xd[RQ], *xs[RQ], *xs2[RQ] = {0};
  const char *w[NWMAX];
  __m512 acc[RQ][NWMAX], accm[RQ][NWMAX];
#pragma GCC unroll 4
  for (int c = 0; c < NW; c++) w[c] = p->w + (j + c) * p->ldw;
  tile_x_rows(p, i0, R, xq, xd, xs);
  if (two) tile_x_rows2(p, i0, R, xq2, xd, xs2);
#pragma GCC unroll 4
  for (int r = 0; r < R; r++)
#pragma GCC unroll 4
    for (int c = 0; c < NW; c++) acc[r][c] = accm[r][c] = _mm512_setzero_ps();
  const int64_t row_bytes = nb * bb;
  const int64_t pf_rows = prefetch_rows(p->n, row_bytes, NW);
  for (int64_t g = 0; g < nb; g += 16) {
    const int nbg = nb - g < 16 ? (int)(nb - g) : 16;
    if (pf_rows) prefetch_group(w, NW, p->ldw, pf_rows, (int)(g * bb), (int)(g + nbg) * bb);
    if (wt != SERVD_Q8_0 && nbg <= 4) {
      q4_tail(w, bb, g, nbg, xq, xq2, xd, xs, xs2, acc, accm, R, NW, wt, two);
      continue;
    }
    __m512 ds[RQ][NWMAX];
#pragma GCC unroll 4
    for (int c = 0; c < NW; c++) {
      __m512 dw, cw;
      if (p->hdr) { /* decoded once for every x row tile */
        dw = _mm512_loadu_ps(p->hdr + 2 * c * p->xq.lds + g);
        cw = _mm512_loadu_ps(p->hdr + (2 * c + 1) * p->xq.lds + g);
      } else {
        group_scales(w[c] + g * bb, nbg, pl, &dw, &cw, wt);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) ds[r][c] = _mm512_mul_ps(dw, _mm512_loadu_ps(xd[r] + g));
      if (wt != SERVD_Q8_0) { /* q8_0's +128 is in its dots */
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
          accm[r][c] = _mm512_fmadd_ps(cw, _mm512_loadu_ps(xs[r] + g), accm[r][c]);
          if (two) accm[r][c] = _mm512_fmadd_ps(cw, _mm512_loadu_ps(xs2[r] + g), accm[r][c]);
        }
      }
    }
    if (nbg == 16) { /* unrolled: the lane permutes become constants */
#pragma GCC unroll 4
      for (int q = 0; q < 16; q += 4)
#pragma GCC unroll 4
        for (int c = 0; c < NW; c++) quad_step(w[c] + g * bb + qoff, bb, g, q, 4, xq, xq2, ds, acc, c, R, wt, two);
    } else {
      for (int q = 0; q < nbg; q += 4) {
#pragma GCC unroll 4
        for (int c = 0; c < NW; c++)
          quad_step(w[c] + g * bb + qoff, bb, g, q, nbg - q, xq, xq2, ds, acc, c, R, wt, two);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    float *o = (float *)(p->out + (i0 + r) * p->ldo) + j;
    if (NW == 4) {
      _mm_storeu_ps(o, reduce4(_mm512_add_ps(acc[r][0], accm[r][0]), _mm512_add_ps(acc[r][1], accm[r][1]),
                               _mm512_add_ps(acc[r][2], accm[r][2]), _mm512_add_ps(acc[r][3], accm[r][3])));
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < NW; c++) o[c] = hsum16(_mm512_add_ps(acc[r][c], accm[r][c]));
    }
  }
}

TILES(SERVD_Q8_0, q8_0)
TILES(SERVD_Q4_0, q4_0)
TILES(SERVD_Q4_1, q4_1)
TILES(SERVD_IQ4_NL, iq4_nl)

/* Scales and offsets of every block of weight rows j..j+nw as floats (group_scales), into hd:
 * row c's at hd[2c * lds ..] and hd[(2c + 1) * lds ..]. */
static void decode_scales(const servd__mm *p, int64_t j, int nw, float *hd) {
  const servd_dtype wt = p->wt;
  const int bb = wt == SERVD_Q8_0 ? 34 : wt == SERVD_Q4_1 ? 20 : 18;
  const hdr_plan *pl = &plans[wt == SERVD_Q8_0 ? 0 : wt == SERVD_Q4_1 ? 2 : 1];
  const int64_t nb = p->xq.nb, lds = p->xq.lds;
  for (int c = 0; c < nw; c++) {
    const char *w = p->w + (j + c) * p->ldw;
    for (int64_t g = 0; g < nb; g += 16) {
      const int nbg = nb - g < 16 ? (int)(nb - g) : 16;
      __m512 dw, cw;
      if (wt == SERVD_Q8_0) group_scales(w + g * bb, nbg, pl, &dw, &cw, SERVD_Q8_0);
      else if (wt == SERVD_Q4_1) group_scales(w + g * bb, nbg, pl, &dw, &cw, SERVD_Q4_1);
      else if (wt == SERVD_Q4_0) group_scales(w + g * bb, nbg, pl, &dw, &cw, SERVD_Q4_0);
      else group_scales(w + g * bb, nbg, pl, &dw, &cw, SERVD_IQ4_NL);
      _mm512_storeu_ps(hd + 2 * c * lds + g, dw);
      _mm512_storeu_ps(hd + (2 * c + 1) * lds + g, cw);
    }
  }
}

/* q8_0's activations as unsigned bytes, x + 128 (xor 0x80): the `bytes` (whole 64-byte lines) at qs
 * into dst (same layout). */
static void q8_flip(const int8_t *qs, int64_t bytes, int8_t *dst) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  for (int64_t i = 0; i < bytes; i += 64)
    _mm512_store_si512(dst + i, _mm512_xor_si512(_mm512_load_si512(qs + i), flip));
}

void servd__mm_quant_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1) {
  const int two = p->residual_fused;
  const tile_fn(*t)[2] = p->wt == SERVD_Q8_0   ? tiles_q8_0[two]
                         : p->wt == SERVD_Q4_0 ? tiles_q4_0[two]
                         : p->wt == SERVD_Q4_1 ? tiles_q4_1[two]
                                               : tiles_iq4_nl[two];
  servd__mm pd = *p;
  if (p->wt == SERVD_Q8_0) {
    const size_t level = (size_t)(p->m * p->xq.ldq); /* whole 64-byte lines */
    int8_t *xf = servd__scratch(2, level * (p->residual_fused ? 2 : 1) + 64);
    if (!xf) { /* no memory for x + 128: NaN marks the outputs rather than a wrong value */
      for (int64_t i = 0; i < p->m; i++)
        for (int64_t j = j0; j < j1; j++) ((float *)(p->out + i * p->ldo))[j] = NAN;
      return;
    }
    xf = (int8_t *)(((uintptr_t)xf + 63) & ~(uintptr_t)63);
    q8_flip(p->xq.qs, p->m * p->xq.ldq, xf);
    pd.xq.qs = xf;
    if (p->residual_fused) {
      q8_flip(p->xq.qs2, p->m * p->xq.ldq, xf + level);
      pd.xq.qs2 = xf + level;
    }
  }
  if (p->m <= RQ) { /* one x row tile: weight rows stream past it */
    for (int64_t j = j0; j < j1;) {
      const int nw_full = p->m == 1 ? 4 : 2;
      const int nw = j1 - j >= nw_full ? nw_full : 1;
      t[p->m == 1 ? RQ : p->m - 1][nw == 1](&pd, 0, j);
      j += nw;
    }
    return;
  }
  /* Batches: blocks of CHUNK weight rows and RQ x rows both stay in L1 while they meet (weight
   * rows outer streamed all of x from L2 for every pair of weight rows), and the chunk's block
   * scales are decoded once for every x row tile: the word permutes that collect them are slow on
   * some cores (q8_0's five per 16 blocks made its prefill ~1.4x slower per value than q4_1's). */
  enum { CHUNK = 16 };
  float *hd = servd__scratch(1, (size_t)(2 * CHUNK * p->xq.lds) * sizeof(float));
  for (int64_t jc = j0; jc < j1; jc += CHUNK) {
    const int64_t je = j1 - jc < CHUNK ? j1 : jc + CHUNK;
    if (hd) decode_scales(p, jc, (int)(je - jc), hd);
    for (int64_t i = 0; i < p->m; i += RQ) {
      const int R = p->m - i < RQ ? (int)(p->m - i) : RQ;
      for (int64_t j = jc; j < je;) {
        const int nw = je - j >= 2 ? 2 : 1;
        pd.hdr = hd ? hd + 2 * (j - jc) * p->xq.lds : NULL;
        t[R - 1][nw == 1](&pd, i, j);
        j += nw;
      }
    }
  }
}
