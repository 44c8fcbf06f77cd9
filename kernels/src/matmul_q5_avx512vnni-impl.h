/* The AVX-512 VNNI kernel for q5_0/q5_1 weights against q8 activations in the quad layout
 * (servd__q8x): the q4_1 kernel's design (matmul_avx512vnni.c) with the fifth bit added.
 * - Per weight row, blocks go in groups of 16: their 16 f16 scales (q5_1: and mins) come in with
 *   word permutes over the group's bytes (load_headers), are converted at once and multiplied by the
 *   group's activation scales; the offsets (q5_0: -16*d, q5_1: m) meet s = d_x*sum(q_x) in one
 *   vector FMA per group.
 * - 4 blocks per step: two loads inside the 4 blocks; a word permute puts their 16-byte nibble runs
 *   in the 4 lanes of a zmm, low/high nibbles are elements 0..15 / 16..31, matching the quad-layout
 *   activations, and vpdpbusd takes the unsigned 5-bit values. Bit 4 comes from the 4 qh words of
 *   the same two registers:
 *   GFNI (Q5_GFNI 1): one byte permute puts qh bytes at bytes 3 and 7 of each qword, one affine
 *   transform (gf2p8affineqb, a bit-matrix product) spreads them to bit 4 (elements 0..15) and
 *   bit 0 (16..31) of each byte; two ternary-logic merges and one more affine transform (a 4-bit
 *   byte rotate for the high half) give both 5-bit vectors: 2 instructions more than q4_1's step.
 *   Without GFNI: qh words spread to bytes (vpshufb), tested per bit into two masks, added under
 *   them (vpaddb with a mask register): 5 more.
 * - A last group of 1..4 blocks (k = 576 leaves 2) is one masked window: nibbles, headers spread to
 *   the lanes of their block and both masks from three permutes of the same two registers.
 * Up to RQ activation rows share each weight load (decode, batched decode).
 * - x's residual level (servd__q8x.qs2, when the call carries it) meets the same decoded quad: two
 *   more vpdpbusd per x row onto the first level's dot * 128, and one more offset FMA per group.
 * - Prompts (m > 2*RQ; below, decoding per x row tile measured as fast): a chunk of weight rows
 *   is decoded once per call into the thread's L1 scratch (q5_run_decoded), and every x row tile
 *   meets the decoded bytes: the fifth bit costs once per weight block per call instead of once
 *   per x row tile (q4_1, whose decode is cheaper, decodes its scales once per chunk and its
 *   nibbles per tile). Weights stay as the package stores them;
 *   the scratch is ~16 KiB per thread, not a second copy of the weights.
 *
 * Two files compile this header: matmul_q5_gfni_avx512vnni.c with GFNI and VBMI enabled (Ice Lake,
 * Zen 4 and later) and matmul_q5_avx512vnni.c without them (Cascade Lake), which picks one of the
 * two at run time. Each defines Q5_GFNI before including it.
 */
#ifndef SERVD_MATMUL_Q5_AVX512VNNI_IMPL_H
#define SERVD_MATMUL_Q5_AVX512VNNI_IMPL_H

#include <immintrin.h>
#include <string.h>

#include "avx512-impl.h"
#include "matmul-impl.h"
#include "matmul_avx512vnni-impl.h"

/* The GFNI build of the kernel (matmul_q5_gfni_avx512vnni.c). */
void servd__mm_q5_avx512gfni(const servd__mm *p, int64_t j0, int64_t j1);
/* on: use the GFNI build where the CPU has GFNI and VBMI (the default); off: the other one, which
 * the kernel tests also check on CPUs that have both (matmul_q5_avx512vnni.c). */
void servd__q5_use_gfni(bool on);

#define RQ 4
#define NWMAX 4
#define WINDOWS 3 /* 128-byte windows over a group: 16 * 24 = 384 bytes at most */

/* Index vectors of one block type, built once (they depend only on the block layout). */
typedef struct q5_plan {
  __m512i hdr[WINDOWS];    /* group: dword i <- d_i (low word), m_i (high word, q5_1) */
  __mmask32 take[WINDOWS]; /* words each window supplies */
  __m512i quad;            /* 4 blocks' nibble runs, b loaded at byte 4*bb - 32 */
  __m512i quad_qh;         /* the same two registers: every dword of lane p <- qh_p */
  __m512i quad_qhb;        /* bytes: qword k of lane p <- byte 3: qh_p byte k, byte 7: byte 2+k */
  __mmask64 qhb_take;
  __m512i tail_nib; /* the same with b at byte 64 (the tail window) */
  __m512i tail_hdr; /* tail: dword lane l <- d, m of block l/4 */
  __m512i tail_qh;  /* tail: words 0..3 <- qh low halves, 4..7 <- high halves */
} q5_plan;
static q5_plan plans[2]; /* q5_0, q5_1 */

static void plan_build(q5_plan *p, int bb, int hoff, bool has_m) {
  uint16_t hdr[WINDOWS][32] = {{0}}, quad[32], qq[32], tn[32], th[32], tq[32] = {0};
  const int qoff = hoff + 4; /* the nibbles follow qh */
  for (int t = 0; t < WINDOWS; t++) p->take[t] = 0;
  for (int o = 0; o < 32; o++) {
    const int blk = o / 2, hi = o & 1;
    const int hw = (blk * bb) / 2 + hi; /* source word */
    if (!hi || has_m) {
      hdr[hw / 64][o] = (uint16_t)(hw % 64);
      p->take[hw / 64] |= (__mmask32)1u << o;
    }
  }
  for (int o = 0; o < 32; o++) {
    const int lane = o / 8, w = (lane * bb + qoff) / 2 + o % 8; /* nibble run words */
    const int bstart = (4 * bb - 32) / 2;
    quad[o] = (uint16_t)(w < 32 ? w : 32 + w - bstart);
    const int hw = (lane * bb + hoff) / 2 + (o & 1); /* qh words */
    qq[o] = (uint16_t)(hw < 32 ? hw : 32 + hw - bstart);
    tn[o] = (uint16_t)w;
    th[o] = (uint16_t)((lane * bb) / 2 + (o & 1));
  }
  for (int q = 0; q < 4; q++) {
    tq[q] = (uint16_t)((q * bb + hoff) / 2);
    tq[4 + q] = (uint16_t)((q * bb + hoff) / 2 + 1);
  }
  for (int t = 0; t < WINDOWS; t++) {
    p->hdr[t] = _mm512_loadu_si512(hdr[t]);
  }
  p->quad = _mm512_loadu_si512(quad);
  uint8_t qb[64] = {0};
  p->qhb_take = 0;
  for (int o = 0; o < 64; o++) {
    const int lane = o / 16, k = (o / 8) % 2, pos = o % 8;
    if (pos != 3 && pos != 7) continue;
    const int src = lane * bb + hoff + k + (pos == 7 ? 2 : 0), bstart = 4 * bb - 32;
    qb[o] = (uint8_t)(src < 64 ? src : 64 + src - bstart);
    p->qhb_take |= 1ull << o;
  }
  p->quad_qhb = _mm512_loadu_si512(qb);
  p->quad_qh = _mm512_loadu_si512(qq);
  p->tail_nib = _mm512_loadu_si512(tn);
  p->tail_hdr = _mm512_loadu_si512(th);
  p->tail_qh = _mm512_loadu_si512(tq);
}

SERVD__AVX512_CONSTRUCTOR(plans_init) {
  plan_build(&plans[0], 22, 2, false);
  plan_build(&plans[1], 24, 4, true);
}

/* Headers of the first nblk (<= 16) blocks at wg (dword i <- d_i, and m_i in the high word for
 * q5_1); dwords of missing blocks are zero. */
static inline __attribute__((always_inline)) __m512i load_headers(const char *wg, const int bb, const int nblk,
                                                                  const q5_plan *pl) {
  const int bytes = nblk * bb;
  __m512i h = _mm512_setzero_si512();
#pragma GCC unroll 3
  for (int t = 0; t < WINDOWS; t++) {
    const int rem = bytes - t * 128;
    if (rem <= 0) break;
    h = _mm512_mask_mov_epi16(h, pl->take[t], window_permute(wg + t * 128, rem, pl->hdr[t]));
  }
  return h;
}

/* Nibble runs of a last partial quad (valid < 4 blocks from b0): one 16-byte load per block,
 * missing lanes zero. */
static inline __attribute__((always_inline)) __m512i load_quad(const char *b0, const int bb, int valid) {
  const char *qs = b0 + bb - 16; /* the nibbles end each block */
  __m512i z = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)qs));
  if (valid > 1) z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(qs + bb)), 1);
  if (valid > 2) z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(qs + 2 * bb)), 2);
  return z;
}

/* Bit e of the first (h = 0) or second (h = 1) 16 bits of each 128-bit lane p of v as mask bit
 * 16p+e: bytes spread (byte e <- byte 2h + e/8 of the lane) and each tested for its own bit. */
static inline __attribute__((always_inline)) __mmask64 lane_bits(__m512i v, const int h) {
  const long long b0 = 0x0202020202020202ll * h, b1 = b0 + 0x0101010101010101ll;
  const __m512i spread = _mm512_set_epi64(b1, b0, b1, b0, b1, b0, b1, b0);
  return _mm512_test_epi8_mask(_mm512_shuffle_epi8(v, spread), _mm512_set1_epi64((long long)0x8040201008040201ull));
}

/* Half h (0: elements 0..15, 1: 16..31) of the qh words of 4 blocks from b0 (`valid` of them) as
 * the mask of a quad's nibble vector: bit 16p+e = bit 16h+e of block p's qh. Built with scalar
 * loads and shifts, which run beside the vector work (the vector ports are the busy ones). */
static inline __attribute__((always_inline)) __mmask64 quad_mask(const char *b0, const int bb, int valid, int h) {
  const int off = bb - 20 + 2 * h; /* qh is the 4 bytes before the 16 nibble bytes that end a block */
  uint64_t m = 0;
  for (int p = 0; p < valid; p++) { /* valid < 4 */
    uint16_t v;
    memcpy(&v, b0 + p * bb + off, 2);
    m |= (uint64_t)v << (16 * p);
  }
  return (__mmask64)m;
}

/* The 5-bit values of a quad: lo = elements 0..15 of each block, hi = 16..31, bit 4 added where the
 * block's qh bit is set (mlo, mhi: bit 16p+e for block p, element e or 16+e). */
static inline __attribute__((always_inline)) void split5(__m512i z, __mmask64 mlo, __mmask64 mhi, __m512i *lo,
                                                         __m512i *hi) {
  const __m512i nib = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
  const __m512i l = _mm512_and_si512(z, nib), h = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
  *lo = _mm512_mask_add_epi8(l, mlo, l, bit4);
  *hi = _mm512_mask_add_epi8(h, mhi, h, bit4);
}

/* The 5-bit values of 4 blocks from b0 (`valid` of them; missing ones zero) in the quad layout:
 * lo = elements 0..15 of each block, hi = 16..31. */
static inline __attribute__((always_inline)) void decode_quad(const char *b0, const int bb, const q5_plan *pl,
                                                              int valid, __m512i *plo, __m512i *phi) {
  __m512i lo, hi;
  if (valid >= 4) { /* two loads inside the 4 blocks; word permutes give nibble runs and qh words */
    const __m512i a = _mm512_loadu_si512(b0);
    const __m512i b = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 4 * bb - 32)));
    const __m512i z = _mm512_permutex2var_epi16(a, pl->quad, b);
#if Q5_GFNI
    /* the 4 qh words' bytes to bytes 3 and 7 of the qwords (vpermb), then one affine transform
     * spreads them: byte i of each qword gets bit 4 <- bit i of byte 3 (elements 0..15), bit 0 <-
     * bit i of byte 7 (elements 16..31) */
    const __m512i arr = _mm512_maskz_permutex2var_epi8(pl->qhb_take, a, pl->quad_qhb, b);
    const __m512i hb = _mm512_gf2p8affine_epi64_epi8(_mm512_set1_epi64(0x8040201008040201ll), arr, 0);
    const __m512i k0f = _mm512_set1_epi8(0x0f);
    lo = _mm512_ternarylogic_epi32(z, hb, k0f, 0xE4); /* bits 0..3 from z, 4..7 from hb */
    const __m512i y = _mm512_ternarylogic_epi32(z, hb, _mm512_set1_epi8((char)0xf0), 0xE4);
    /* y = high nibble | bit 0 = the element's bit 4: rotate each byte by 4 (output bit i <- bit
     * (i+4)%8: matrix byte 7-i = 1 << ((i+4)%8)) */
    hi = _mm512_gf2p8affine_epi64_epi8(y, _mm512_set1_epi64(0x1020408001020408ll), 0);
#else
    const __m512i qh = _mm512_permutex2var_epi16(a, pl->quad_qh, b);
    split5(z, lane_bits(qh, 0), lane_bits(qh, 1), &lo, &hi);
#endif
  } else {
    split5(load_quad(b0, bb, valid), quad_mask(b0, bb, valid, 0), quad_mask(b0, bb, valid, 1), &lo, &hi);
  }
  *plo = lo;
  *phi = hi;
}

/* Blocks g+q.. (4 of them, or `valid` < 4) of weight row w against R activation rows. */
static inline __attribute__((always_inline)) void q5_step(const char *w, const int bb, const q5_plan *pl, int64_t g,
                                                          int q, int valid, const int8_t *const *xq,
                                                          const int8_t *const *xq2, const __m512 (*ds)[NWMAX],
                                                          __m512 (*acc)[NWMAX], const int c, const int R,
                                                          const bool two) {
  __m512i lo, hi;
  decode_quad(w + (g + q) * bb, bb, pl, valid, &lo, &hi);
  const __m512i idx =
      _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_set1_epi32(q));
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    const int8_t *xp = xq[r] + (g + q) * 32; /* quad layout: 4 blocks per 128 bytes */
    __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512((const void *)xp));
    dot = _mm512_dpbusd_epi32(dot, hi, _mm512_load_si512((const void *)(xp + 64)));
    if (two) dot = residual_quad_dots(dot, lo, hi, xq2[r] + (g + q) * 32);
    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(idx, ds[r][c]), acc[r][c]);
  }
}

/* Offset per unit of s: q5_0 -16*d, q5_1 m (the high words of hdr). */
static inline __m512 offset_of(__m512 dw, __m512i hdr, const servd_dtype wt) {
  return wt == SERVD_Q5_0 ? _mm512_mul_ps(dw, _mm512_set1_ps(-16.0f))
                          : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16)));
}

/* A last group's terms for weight row c (5-bit values lo/hi, block scales dw and offsets cw spread to
 * their blocks' lanes) against R activation rows: the block dot, then the offset. q5_tail and the
 * decoded prompt path (tile_dec) both add them here, so a row's value is the same on either path. */
static inline __attribute__((always_inline)) void tail_terms(__m512i lo, __m512i hi, __m512 dw, __m512 cw,
                                                             const int8_t *const *xq, const int8_t *const *xq2,
                                                             int64_t g, const __m512 *dxe, const __m512 *sxe,
                                                             __m512 (*acc)[NWMAX], int c, const int R, const bool two) {
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    const int8_t *xp = xq[r] + g * 32;
    __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512((const void *)xp));
    dot = _mm512_dpbusd_epi32(dot, hi, _mm512_load_si512((const void *)(xp + 64)));
    if (two) dot = residual_quad_dots(dot, lo, hi, xq2[r] + g * 32);
    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, dxe[r]), acc[r][c]);
    acc[r][c] = _mm512_fmadd_ps(cw, sxe[r], acc[r][c]);
  }
}

/* The last group of a row when it holds 1..4 blocks: one masked window of the weight row. */
static inline __attribute__((always_inline)) void
q5_tail(const char *const *w, const int bb, const q5_plan *pl, int64_t g, int nbg, const int8_t *const *xq,
        const int8_t *const *xq2, const float *const *xd, const float *const *xs, const float *const *xs2,
        __m512 (*acc)[NWMAX], const int R, const int NW, const servd_dtype wt, const bool two) {
  __mmask64 ma, mb;
  __m512 dxe[RQ], sxe[RQ];
  tail_setup_levels(nbg * bb, &ma, &mb, xd, xs, xs2, g, R, dxe, sxe, two);
#pragma GCC unroll 4
  for (int c = 0; c < NW; c++) {
    const char *src = w[c] + g * bb;
    const __m512i a = _mm512_maskz_loadu_epi8(ma, src), b = _mm512_maskz_loadu_epi8(mb, src + 64);
    const __m512i z = _mm512_permutex2var_epi16(a, pl->tail_nib, b);
    const __m512i hv = _mm512_permutex2var_epi16(a, pl->tail_hdr, b);
    const __m128i qh = _mm512_castsi512_si128(_mm512_permutex2var_epi16(a, pl->tail_qh, b));
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hv)), cw = offset_of(dw, hv, wt);
    __m512i lo, hi;
    split5(z, (__mmask64)_mm_cvtsi128_si64(qh), (__mmask64)_mm_extract_epi64(qh, 1), &lo, &hi);
    tail_terms(lo, hi, dw, cw, xq, xq2, g, dxe, sxe, acc, c, R, two);
  }
}

/* out rows i0..i0+R, columns j..j+NW = x rows . weight rows j..j+NW; two: with x's residual level
 * (its dots joined to the first level's in integers, x's block scales then d2, and the offsets
 * meeting both levels' block sums). */
static inline __attribute__((always_inline)) void tile_levels(const servd__mm *p, int64_t i0, int64_t j, const int R,
                                                              const int NW, const servd_dtype wt, const bool two) {
  const q5_plan *pl = &plans[wt == SERVD_Q5_0 ? 0 : 1];
  const int bb = wt == SERVD_Q5_0 ? 22 : 24; /* constant here, so offsets fold */
  const int64_t nb = p->xq.nb;
  const int8_t *xq[RQ], *xq2[RQ] = {0};
  const float *xd[RQ], *xs[RQ], *xs2[RQ] = {0};
  const char *w[NWMAX];
  /* one accumulator per output: the block terms and the offset terms sit in different lanes, but
   * only the sum of all lanes is wanted (and fewer live registers leave room for the constants) */
  __m512 acc[RQ][NWMAX];
#pragma GCC unroll 4
  for (int c = 0; c < NW; c++) w[c] = p->w + (j + c) * p->ldw;
  tile_x_rows(p, i0, R, xq, xd, xs);
  if (two) tile_x_rows2(p, i0, R, xq2, xd, xs2);
#pragma GCC unroll 4
  for (int r = 0; r < R; r++)
#pragma GCC unroll 4
    for (int c = 0; c < NW; c++) acc[r][c] = _mm512_setzero_ps();
  const int64_t row_bytes = nb * bb;
  const int64_t pf_rows = prefetch_rows(p->n, row_bytes, NW); /* as in the q4 kernel */
  for (int64_t g = 0; g < nb; g += 16) {
    const int nbg = nb - g < 16 ? (int)(nb - g) : 16;
    if (pf_rows) prefetch_group(w, NW, p->ldw, pf_rows, (int)(g * bb), (int)(g + nbg) * bb);
    if (nbg <= 4) {
      q5_tail(w, bb, pl, g, nbg, xq, xq2, xd, xs, xs2, acc, R, NW, wt, two);
      continue;
    }
    __m512 ds[RQ][NWMAX];
#pragma GCC unroll 4
    for (int c = 0; c < NW; c++) {
      const __m512i hdr =
          nbg == 16 ? load_headers(w[c] + g * bb, bb, 16, pl) : load_headers(w[c] + g * bb, bb, nbg, pl);
      const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr)), cw = offset_of(dw, hdr, wt);
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        ds[r][c] = _mm512_mul_ps(dw, _mm512_loadu_ps(xd[r] + g));
        acc[r][c] = _mm512_fmadd_ps(cw, _mm512_loadu_ps(xs[r] + g), acc[r][c]);
        if (two) acc[r][c] = _mm512_fmadd_ps(cw, _mm512_loadu_ps(xs2[r] + g), acc[r][c]);
      }
    }
    if (nbg == 16) { /* unrolled: the lane permutes and offsets become constants */
#pragma GCC unroll 4
      for (int q = 0; q < 16; q += 4)
#pragma GCC unroll 4
        for (int c = 0; c < NW; c++) q5_step(w[c], bb, pl, g, q, 4, xq, xq2, ds, acc, c, R, two);
    } else {
      for (int q = 0; q < nbg; q += 4)
#pragma GCC unroll 4
        for (int c = 0; c < NW; c++) q5_step(w[c], bb, pl, g, q, nbg - q, xq, xq2, ds, acc, c, R, two);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    float *o = (float *)(p->out + (i0 + r) * p->ldo) + j;
    if (NW == 4) {
      _mm_storeu_ps(o, reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < NW; c++) o[c] = hsum16(acc[r][c]);
    }
  }
}

TILES(SERVD_Q5_0, q5_0)
TILES(SERVD_Q5_1, q5_1)

/* Decode and batched decode (m <= 2*RQ), and the fallback of q5_run_decoded. */
static void q5_run(const servd__mm *p, int64_t j0, int64_t j1) {
  const tile_fn(*t)[2] = p->wt == SERVD_Q5_0 ? tiles_q5_0[p->residual_fused] : tiles_q5_1[p->residual_fused];
  /* Weight rows outer: a tile of NW rows stays in L1 while every activation row passes over it. */
  for (int64_t j = j0; j < j1;) {
    const int nw_full = p->m == 1 ? 4 : 2;
    const int nw = j1 - j >= nw_full ? nw_full : 1;
    for (int64_t i = 0; i < p->m; i += RQ) {
      const int R = p->m - i < RQ ? (int)(p->m - i) : RQ;
      t[p->m == 1 ? RQ : R - 1][nw == 1](p, i, j);
    }
    j += nw;
  }
}

/* ---- prompts: weight rows decoded once per call ------------------------------------------------
 * With more than 2*RQ x rows every weight block would be decoded 3 or more times (once per x row
 * tile); instead a chunk of weight rows is decoded once into the thread's L1 scratch (per row: the 5-bit values in
 * the quad layout, nq*128 bytes, and the block scales and offsets as floats), and every x row tile
 * then meets it with q8_0-like steps: two loads, two vpdpbusd. The scratch is a few KiB, reused. */
typedef struct q5_dec {
  const int8_t *q; /* row c's quanta at q + c*ldq (quad layout, zero past nb) */
  const float *h;  /* row c's d at h + 2c*lds, offsets at h + (2c+1)*lds (zero past nb) */
  int64_t ldq;
} q5_dec;

static inline __attribute__((always_inline)) void decode_row(const char *w, int64_t nb, int64_t lds, const q5_plan *pl,
                                                             int8_t *q, float *h, const servd_dtype wt) {
  const int bb = wt == SERVD_Q5_0 ? 22 : 24;
  for (int64_t g = 0; g < nb; g += 16) {
    const int nbg = nb - g < 16 ? (int)(nb - g) : 16;
    const __m512i hdr = nbg == 16 ? load_headers(w + g * bb, bb, 16, pl) : load_headers(w + g * bb, bb, nbg, pl);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
    _mm512_storeu_ps(h + g, dw);
    _mm512_storeu_ps(h + lds + g, offset_of(dw, hdr, wt));
    for (int qd = 0; qd < nbg; qd += 4) {
      __m512i lo, hi;
      decode_quad(w + (g + qd) * bb, bb, pl, nbg - qd, &lo, &hi);
      _mm512_store_si512((void *)(q + (g + qd) * 32), lo);
      _mm512_store_si512((void *)(q + (g + qd) * 32 + 64), hi);
    }
  }
}

/* out rows i0..i0+R, columns j..j+NW from decoded weight rows (d: row j's); two as tile_levels',
 * term for term */
static inline __attribute__((always_inline)) void tile_dec(const servd__mm *p, const q5_dec *d, int64_t i0, int64_t j,
                                                           const int R, const int NW, const bool two) {
  const int64_t nb = p->xq.nb, lds = p->xq.lds;
  const int8_t *xq[RQ], *xq2[RQ] = {0};
  const float *xd[RQ], *xs[RQ], *xs2[RQ] = {0};
  __m512 acc[RQ][NWMAX]; /* columns 0..NW-1 (NW <= 2) used */
  tile_x_rows(p, i0, R, xq, xd, xs);
  if (two) tile_x_rows2(p, i0, R, xq2, xd, xs2);
#pragma GCC unroll 4
  for (int r = 0; r < R; r++)
#pragma GCC unroll 2
    for (int c = 0; c < NW; c++) acc[r][c] = _mm512_setzero_ps();
  for (int64_t g = 0; g < nb; g += 16) {
    if (nb - g <= 4) { /* a last group of 1..4 blocks in q5_tail's arithmetic, term for term */
      const __m512i lanes4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
      __mmask64 ma, mb;
      __m512 dxe[RQ], sxe[RQ];
      tail_setup_levels((int)(nb - g) * 32, &ma, &mb, xd, xs, xs2, g, R, dxe, sxe, two);
#pragma GCC unroll 2
      for (int c = 0; c < NW; c++) {
        const __m512 dw = _mm512_permutexvar_ps(lanes4, _mm512_loadu_ps(d->h + 2 * c * lds + g));
        const __m512 cw = _mm512_permutexvar_ps(lanes4, _mm512_loadu_ps(d->h + (2 * c + 1) * lds + g));
        const __m512i lo = _mm512_load_si512((const void *)(d->q + c * d->ldq + g * 32));
        const __m512i hi = _mm512_load_si512((const void *)(d->q + c * d->ldq + g * 32 + 64));
        tail_terms(lo, hi, dw, cw, xq, xq2, g, dxe, sxe, acc, c, R, two);
      }
      break;
    }
    __m512 ds[RQ][2];
#pragma GCC unroll 2
    for (int c = 0; c < NW; c++) {
      const __m512 dw = _mm512_loadu_ps(d->h + 2 * c * lds + g), cw = _mm512_loadu_ps(d->h + (2 * c + 1) * lds + g);
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        ds[r][c] = _mm512_mul_ps(dw, _mm512_loadu_ps(xd[r] + g));
        acc[r][c] = _mm512_fmadd_ps(cw, _mm512_loadu_ps(xs[r] + g), acc[r][c]);
        if (two) acc[r][c] = _mm512_fmadd_ps(cw, _mm512_loadu_ps(xs2[r] + g), acc[r][c]);
      }
    }
    const int nq = nb - g < 16 ? (int)(nb - g + 3) / 4 : 4; /* decoded quads are zero padded */
#pragma GCC unroll 4
    for (int qi = 0; qi < 4; qi++) {
      if (qi >= nq) break;
      const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                           _mm512_set1_epi32(4 * qi));
      __m512i lo[2], hi[2];
#pragma GCC unroll 2
      for (int c = 0; c < NW; c++) {
        lo[c] = _mm512_load_si512((const void *)(d->q + c * d->ldq + (g + 4 * qi) * 32));
        hi[c] = _mm512_load_si512((const void *)(d->q + c * d->ldq + (g + 4 * qi) * 32 + 64));
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        const int8_t *xp = xq[r] + (g + 4 * qi) * 32;
        const __m512i xl = _mm512_load_si512((const void *)xp), xh = _mm512_load_si512((const void *)(xp + 64));
#pragma GCC unroll 2
        for (int c = 0; c < NW; c++) {
          __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[c], xl), hi[c], xh);
          if (two) dot = residual_quad_dots(dot, lo[c], hi[c], xq2[r] + (g + 4 * qi) * 32);
          acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(idx, ds[r][c]), acc[r][c]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    float *o = (float *)(p->out + (i0 + r) * p->ldo) + j;
#pragma GCC unroll 2
    for (int c = 0; c < NW; c++) o[c] = hsum16(acc[r][c]);
  }
}

typedef void (*tile_dec_fn)(const servd__mm *p, const q5_dec *d, int64_t i0, int64_t j);
#define TILE_DEC(R, NW) \
  static void tile_dec_##R##x##NW(const servd__mm *p, const q5_dec *d, int64_t i0, int64_t j) { \
    if (p->residual_fused) tile_dec(p, d, i0, j, R, NW, true); \
    else tile_dec(p, d, i0, j, R, NW, false); \
  }
TILE_DEC(1, 1)
TILE_DEC(1, 2)
TILE_DEC(2, 1)
TILE_DEC(2, 2)
TILE_DEC(3, 1)
TILE_DEC(3, 2)
TILE_DEC(4, 1)
TILE_DEC(4, 2)
static const tile_dec_fn tiles_dec[RQ][2] = {{tile_dec_1x1, tile_dec_1x2},
                                             {tile_dec_2x1, tile_dec_2x2},
                                             {tile_dec_3x1, tile_dec_3x2},
                                             {tile_dec_4x1, tile_dec_4x2}};

/* Decoded chunks: about 16 KiB of quanta, so that a chunk and an x row tile share L1. */
static void q5_run_decoded(const servd__mm *p, int64_t j0, int64_t j1) {
  const q5_plan *pl = &plans[p->wt == SERVD_Q5_0 ? 0 : 1];
  const int64_t nb = p->xq.nb, lds = p->xq.lds, ldq = (nb + 3) / 4 * 128;
  int64_t chunk = (16 << 10) / ldq;
  chunk = chunk < 2 ? 2 : chunk > 16 ? 16 : chunk & ~1;
  char *buf = servd__scratch(1, (size_t)(chunk * (ldq + 2 * lds * (int64_t)sizeof(float))));
  if (!buf) { /* no scratch: decode per tile */
    q5_run(p, j0, j1);
    return;
  }
  int8_t *q = (int8_t *)buf;
  float *h = (float *)(buf + chunk * ldq);
  for (int64_t jc = j0; jc < j1; jc += chunk) {
    const int64_t je = j1 - jc < chunk ? j1 : jc + chunk;
    for (int64_t j = jc; j < je; j++) {
      const char *w = p->w + j * p->ldw;
      int8_t *qj = q + (j - jc) * ldq;
      float *hj = h + 2 * (j - jc) * lds;
      if (nb % 4) memset(qj + nb / 4 * 128, 0, 128); /* a last partial quad: missing blocks zero */
      if (p->wt == SERVD_Q5_0) decode_row(w, nb, lds, pl, qj, hj, SERVD_Q5_0);
      else decode_row(w, nb, lds, pl, qj, hj, SERVD_Q5_1);
    }
    for (int64_t i = 0; i < p->m; i += RQ) {
      const int R = p->m - i < RQ ? (int)(p->m - i) : RQ;
      for (int64_t j = jc; j < je;) {
        const int nw = je - j >= 2 ? 2 : 1;
        const q5_dec d = {.q = q + (j - jc) * ldq, .h = h + 2 * (j - jc) * lds, .ldq = ldq};
        tiles_dec[R - 1][nw - 1](p, &d, i, j);
        j += nw;
      }
    }
  }
}

#endif
