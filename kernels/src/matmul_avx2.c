/* AVX2+FMA+F16C matmul kernels: the same designs as the AVX-512 files at half width.
 *
 * f32/f16/bf16 weights: tiles of RM (<= 2) x rows by 4 weight rows, 8 k values per step, weights
 * widened to f32 in registers, reduced into 4 adjacent outputs per k block.
 * q8_0/q4_0/q4_1 weights: per block one maddubs (u8 x s8 pairs -> i16; |w| and sign-moved x for
 * q8_0, raw nibbles for q4) and one madd to i32, then an f32 FMA with d_w*d_x; the q4 offset terms
 * use s = d_x*sum(q_x) as in the scalar reference. No sums can saturate: |pair| <= 2*128*127.
 */
#include <immintrin.h>
#include <string.h>

#include "matmul_avx2-impl.h"

#define RN 4
#define RM_MAX 2
#define KC 1024
#define MC 128 /* x rows per L2 block: MC*KC*4 bytes stay in L2 while weight tiles pass */

static inline __attribute__((always_inline)) __m256 load_w(servd_dtype wt, const char *row, int64_t l) {
  if (wt == SERVD_BF16)
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + l))), 16));
  if (wt == SERVD_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + l)));
  return _mm256_loadu_ps((const float *)row + l);
}

/* [sum a, sum b, sum c, sum d] */
static inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

typedef struct tile_args {
  const float *x[RM_MAX]; /* x rows at column l0 */
  const char *w[RN];      /* weight rows (repeated when fewer than RN remain) */
  float *o[RM_MAX];       /* out rows at column j */
  int64_t l0, kc;
  int nvalid;
  bool first;
} tile_args;

static inline __attribute__((always_inline)) void tile(const tile_args *a, const int rm, const servd_dtype wt) {
  __m256 acc[RM_MAX][RN];
  const size_t es = wt == SERVD_F32 ? 4 : 2;
#pragma GCC unroll 2
  for (int r = 0; r < rm; r++)
#pragma GCC unroll 4
    for (int c = 0; c < RN; c++) acc[r][c] = _mm256_setzero_ps();
  const int64_t l0 = a->l0, kc = a->kc;
  int64_t l = 0;
  for (; l + 8 <= kc; l += 8) {
    __m256 wv[RN];
#pragma GCC unroll 4
    for (int c = 0; c < RN; c++) wv[c] = load_w(wt, a->w[c], l0 + l);
#pragma GCC unroll 2
    for (int r = 0; r < rm; r++) {
      __m256 xv = _mm256_loadu_ps(a->x[r] + l);
#pragma GCC unroll 4
      for (int c = 0; c < RN; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (l < kc) { /* tail: zero-padded copies, AVX2 has no 16-bit masked loads */
    const size_t t = (size_t)(kc - l);
    char wb[RN][32] = {{0}};
    float xb[8] = {0};
    __m256 wv[RN];
#pragma GCC unroll 4
    for (int c = 0; c < RN; c++) {
      memcpy(wb[c], a->w[c] + (size_t)(l0 + l) * es, t * es);
      wv[c] = load_w(wt, wb[c], 0);
    }
#pragma GCC unroll 2
    for (int r = 0; r < rm; r++) {
      memcpy(xb, a->x[r] + l, t * 4);
      __m256 xv = _mm256_loadu_ps(xb);
#pragma GCC unroll 4
      for (int c = 0; c < RN; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 2
  for (int r = 0; r < rm; r++) {
    float s[4];
    _mm_storeu_ps(s, reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    for (int c = 0; c < a->nvalid; c++) a->o[r][c] = a->first ? s[c] : a->o[r][c] + s[c];
  }
}

#define TILE_FN(wt, name) \
  static void name(const tile_args *a, int rm) { \
    if (rm == 1) tile(a, 1, wt); \
    else tile(a, 2, wt); \
  }
TILE_FN(SERVD_F32, tile_f32)
TILE_FN(SERVD_F16, tile_f16)
TILE_FN(SERVD_BF16, tile_bf16)

/* a's tile of weight rows j.. (set by the caller) against x rows i..i+rm over the k block at l0. */
static void tile_at(const servd__mm *p, tile_args *a, void (*fn)(const tile_args *, int), int64_t l0, int64_t i, int rm,
                    int64_t j) {
  a->l0 = l0;
  a->kc = p->k - l0 < KC ? p->k - l0 : KC;
  a->first = l0 == 0;
  for (int r = 0; r < rm; r++) {
    a->x[r] = (const float *)(p->x + (i + r) * p->ldx) + l0;
    a->o[r] = (float *)(p->out + (i + r) * p->ldo) + j;
  }
  fn(a, rm);
}

static void set_w(const servd__mm *p, tile_args *a, int64_t j, int64_t j1) {
  a->nvalid = j1 - j < RN ? (int)(j1 - j) : RN;
  for (int c = 0; c < RN; c++) a->w[c] = p->w + (j + (c < a->nvalid ? c : a->nvalid - 1)) * p->ldw;
}

void servd__mm_float_avx2(const servd__mm *p, int64_t j0, int64_t j1) {
  void (*fn)(const tile_args *, int) = p->wt == SERVD_BF16 ? tile_bf16 : p->wt == SERVD_F16 ? tile_f16 : tile_f32;
  tile_args a;
  /* Every output is summed over k blocks of KC, whatever m is, so a row's value does not depend on
   * how many rows share the call (batch invariance). k blocks keep a weight tile in L1 across x row
   * tiles; with a single x tile (decode) a tile's k blocks run back to back, so whole rows stream. */
  if (p->m <= RM_MAX) {
    for (int64_t j = j0; j < j1; j += RN) {
      set_w(p, &a, j, j1);
      for (int64_t l0 = 0; l0 < p->k; l0 += KC) tile_at(p, &a, fn, l0, 0, (int)p->m, j);
    }
    return;
  }
  for (int64_t l0 = 0; l0 < p->k; l0 += KC) {
    for (int64_t i0 = 0; i0 < p->m; i0 += MC) {
      const int64_t i1 = p->m - i0 < MC ? p->m : i0 + MC;
      for (int64_t j = j0; j < j1; j += RN) {
        set_w(p, &a, j, j1);
        for (int64_t i = i0; i < i1; i += RM_MAX)
          tile_at(p, &a, fn, l0, i, i1 - i < RM_MAX ? (int)(i1 - i) : RM_MAX, j);
      }
    }
  }
}

/* ---- quantized ------------------------------------------------------------------------------- */

/* two: with the residual activation level (p->residual_fused): each block's dot is (dot of q << 7)
 * + dot of q2, exact in units of d2 (|dot| < 2^24), times d_w*d2; the offsets meet s + s2. */
static inline __attribute__((always_inline)) void quant_rows_levels(const servd__mm *p, const char *w, int64_t i0,
                                                                    float *res, const int R, const servd_dtype wt,
                                                                    const bool two) {
  const __m256i ones = _mm256_set1_epi16(1), nib = _mm256_set1_epi8(0x0f);
  const int64_t nb = p->xq.nb;
  __m256 acc[RQ];
  float accm[RQ];
  const int8_t *xq[RQ], *xq2[RQ];
  const float *xd[RQ], *xs[RQ], *xs2[RQ];
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    acc[r] = _mm256_setzero_ps();
    accm[r] = 0.0f;
    xq[r] = p->xq.qs + (i0 + r) * p->xq.ldq;
    xd[r] = (two ? p->xq.d2 : p->xq.d) + (i0 + r) * p->xq.lds;
    xs[r] = p->xq.s + (i0 + r) * p->xq.lds;
    xq2[r] = two ? p->xq.qs2 + (i0 + r) * p->xq.ldq : NULL;
    xs2[r] = two ? p->xq.s2 + (i0 + r) * p->xq.lds : NULL;
  }
  for (int64_t b = 0; b < nb; b++) {
    __m256i wv;
    float dw, cw = 0.0f;
    if (wt == SERVD_Q8_0) {
      const servd__block_q8_0 *blk = (const servd__block_q8_0 *)w + b;
      wv = _mm256_loadu_si256((const __m256i *)blk->qs);
      dw = f16(blk->d);
    } else {
      const uint8_t *qs;
      if (wt == SERVD_Q4_0) {
        const servd__block_q4_0 *blk = (const servd__block_q4_0 *)w + b;
        qs = blk->qs;
        dw = f16(blk->d);
        cw = -8.0f * dw;
      } else {
        const servd__block_q4_1 *blk = (const servd__block_q4_1 *)w + b;
        qs = blk->qs;
        dw = f16(blk->d);
        cw = f16(blk->m);
      }
      const __m128i v = _mm_loadu_si128((const __m128i *)qs);
      wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), nib); /* elements 0..15 | 16..31 */
    }
    const __m256i aw = wt == SERVD_Q8_0 ? _mm256_sign_epi8(wv, wv) : wv;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
      __m256i xv = _mm256_loadu_si256((const __m256i *)(xq[r] + b * 32));
      if (wt == SERVD_Q8_0) xv = _mm256_sign_epi8(xv, wv);
      __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones);
      if (two) {
        __m256i yv = _mm256_loadu_si256((const __m256i *)(xq2[r] + b * 32));
        if (wt == SERVD_Q8_0) yv = _mm256_sign_epi8(yv, wv);
        dot = _mm256_add_epi32(_mm256_slli_epi32(dot, 7), _mm256_madd_epi16(_mm256_maddubs_epi16(aw, yv), ones));
      }
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * xd[r][b]), acc[r]);
      if (wt != SERVD_Q8_0) accm[r] += cw * xs[r][b];
      if (wt != SERVD_Q8_0 && two) accm[r] += cw * xs2[r][b];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) res[r] = hsum8(acc[r]) + accm[r];
}

/* Either activation precision, chosen once per call of up to RQ x rows, each form inlined. */
static inline __attribute__((always_inline)) void quant_rows(const servd__mm *p, const char *w, int64_t i0, float *res,
                                                             const int R, const servd_dtype wt) {
  if (p->residual_fused) quant_rows_levels(p, w, i0, res, R, wt, true);
  else quant_rows_levels(p, w, i0, res, R, wt, false);
}

ROWS_FN(quant_rows, SERVD_Q8_0, rows_q8_0)
ROWS_FN(quant_rows, SERVD_Q4_0, rows_q4_0)
ROWS_FN(quant_rows, SERVD_Q4_1, rows_q4_1)

void servd__mm_quant_avx2(const servd__mm *p, int64_t j0, int64_t j1) {
  rows_fn fn = p->wt == SERVD_Q8_0 ? rows_q8_0 : p->wt == SERVD_Q4_0 ? rows_q4_0 : rows_q4_1;
  mm_rows(p, j0, j1, fn);
}
