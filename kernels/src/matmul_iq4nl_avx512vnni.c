/* AVX-512 VNNI kernel for iq4_nl weights against q8 activations (servd__q8x, natural layout): the
 * q5_0 kernel's structure (matmul_q5_avx512vnni.c) with the codes looked up in the codebook.
 *
 * Two blocks per step fill a zmm: each block's 16 code bytes go to two 128-bit lanes (elements 0..15
 * low nibbles, 16..31 high nibbles, one masked shift), then one vpshufb maps every code to its table
 * value plus 128, an unsigned byte for vpdpbusd (u8 weights x s8 activations, exact int32 sums of 4
 * products). The +128 comes off as -128*d_w times s = d_x*sum(q_x), eight copies per block divided
 * out at the end. Up to RQ activation rows share each weight load, NW weight rows each x load.
 */
#include <immintrin.h>
#include <string.h>

#include "avx512-impl.h"
#include "matmul-impl.h"
#include "matmul_avx512vnni-impl.h"
#include "matmul_lowbit-impl.h"
#include "servd/blocks.h"

#define RQ 4
#define NWMAX 4

/* Block pairs' d/m/x scales: lanes 0..7 <- element 0, lanes 8..15 <- element 1. */
static inline __m512 pair_ps(const float *v) {
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)v))));
}

static inline uint16_t load_u16(const char *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

/* out rows i0..i0+R, columns j..j+NW = x rows . weight rows j..j+NW */
static inline __attribute__((always_inline)) void tile(const servd__mm *p, int64_t i0, int64_t j, const int R,
                                                       const int NW, const servd_dtype wt) {
  (void)wt;
  const int bb = 18;
  const int64_t nb = p->xq.nb;
  const __m512i nib = _mm512_set1_epi8(0x0f);
  /* the codebook plus 128, as unsigned bytes in every 128-bit lane */
  const __m512i table = _mm512_broadcast_i32x4(
      _mm_add_epi8(_mm_loadu_si128((const __m128i *)servd_iq4_values), _mm_set1_epi8((char)0x80)));
  const int8_t *xq[RQ];
  const float *xd[RQ], *xs[RQ];
  const char *w[NWMAX];
  __m512 acc[RQ][NWMAX], accm[RQ][NWMAX];
#pragma GCC unroll 4
  for (int c = 0; c < NW; c++) w[c] = p->w + (j + c) * p->ldw;
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    xq[r] = p->xq.qs + (i0 + r) * p->xq.ldq;
    xd[r] = p->xq.d + (i0 + r) * p->xq.lds;
    xs[r] = p->xq.s + (i0 + r) * p->xq.lds;
#pragma GCC unroll 4
    for (int c = 0; c < NW; c++) acc[r][c] = accm[r][c] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; b += 2) {
    const bool two = b + 1 < nb; /* a last odd block: the second half stays zero (its x d, s are zero) */
    __m512 xdv[RQ], xsv[RQ];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      xdv[r] = pair_ps(xd[r] + b); /* d and s are padded with zeros to lds >= nb + 1 for odd nb */
      xsv[r] = pair_ps(xs[r] + b);
    }
#pragma GCC unroll 4
    for (int c = 0; c < NW; c++) {
      const char *b0 = w[c] + b * bb, *b1 = b0 + bb;
      const __m256i v0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + 2)));
      const __m256i v1 =
          two ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b1 + 2))) : _mm256_setzero_si256();
      __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v0), v1, 1);
      z = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4), nib));
      const float d0 = _cvtsh_ss(load_u16(b0)), d1 = two ? _cvtsh_ss(load_u16(b1)) : 0.0f;
      const __m512 dw = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(d0), _mm512_set1_ps(d1));
      const __m512 cw = _mm512_mul_ps(dw, _mm512_set1_ps(-128.0f));
#pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        /* b even: 64-byte aligned (rows are multiples of 128 bytes); past nb only zero weights */
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z, _mm512_load_si512(xq[r] + b * 32));
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, xdv[r]), acc[r][c]);
        accm[r][c] = _mm512_fmadd_ps(cw, xsv[r], accm[r][c]);
      }
    }
  }
  const __m512 eighth = _mm512_set1_ps(0.125f); /* offsets were added once per lane: 8 lanes per block */
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    float *o = (float *)(p->out + (i0 + r) * p->ldo) + j;
    if (NW == 4) {
      _mm_storeu_ps(
          o, reduce4(_mm512_fmadd_ps(accm[r][0], eighth, acc[r][0]), _mm512_fmadd_ps(accm[r][1], eighth, acc[r][1]),
                     _mm512_fmadd_ps(accm[r][2], eighth, acc[r][2]), _mm512_fmadd_ps(accm[r][3], eighth, acc[r][3])));
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < NW; c++) o[c] = _mm512_reduce_add_ps(_mm512_fmadd_ps(accm[r][c], eighth, acc[r][c]));
    }
  }
}

TILES(SERVD_IQ4_NL, iq4_nl)

void servd__mm_iq4nl_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1) {
  const tile_fn(*t)[2] = tiles_iq4_nl;
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
