/* The tile table and weight prefetch shared by the AVX-512 VNNI block-quantized kernels
 * (matmul_avx512vnni.c, matmul_q5_avx512vnni.c). The including file defines RQ (rows of x per tile at most) and
 * `static void tile_levels(const servd__mm *p, int64_t i0, int64_t j, int R, int NW, servd_dtype wt, bool two)`
 * (always inlined, so each TILE instance is specialized for its R, NW, dtype and activation levels), then
 * calls TILES(dtype, suffix) once per weight dtype to get `tiles_<suffix>[2][RQ + 1][2]`: [two]: the
 * activation levels (p->residual_fused); [R-1][0]: NW = 2 (4 when m == 1: row RQ); [R-1][1]: NW = 1. */
#ifndef SERVD_MATMUL_AVX512VNNI_IMPL_H
#define SERVD_MATMUL_AVX512VNNI_IMPL_H

#include <immintrin.h>
#include <stdint.h>

typedef void (*tile_fn)(const servd__mm *p, int64_t i0, int64_t j);
/* Each activation precision has functions of its own and its own table (tiles_<sfx>[two]): one
 * function holding both forms compiled the one-level form 4-6% slower in batches (register
 * allocation over the larger body), and a dispatching wrapper cost batch 1 a call per tile. */
#define TILE(wt, R, NW, name) \
  static void name##_1(const servd__mm *p, int64_t i0, int64_t j) { tile_levels(p, i0, j, R, NW, wt, false); } \
  static void name##_2(const servd__mm *p, int64_t i0, int64_t j) { tile_levels(p, i0, j, R, NW, wt, true); }
// clang-format off: a list of macro uses, one a line
#define TILES(wt, sfx) \
  TILE(wt, 1, 4, t1x4_##sfx) \
  TILE(wt, 1, 2, t1x2_##sfx) \
  TILE(wt, 1, 1, t1x1_##sfx) \
  TILE(wt, 2, 2, t2x2_##sfx) \
  TILE(wt, 2, 1, t2x1_##sfx) \
  TILE(wt, 3, 2, t3x2_##sfx) \
  TILE(wt, 3, 1, t3x1_##sfx) \
  TILE(wt, 4, 2, t4x2_##sfx) \
  TILE(wt, 4, 1, t4x1_##sfx) \
  static const tile_fn tiles_##sfx[2][RQ + 1][2] = {{{t1x2_##sfx##_1, t1x1_##sfx##_1}, \
                                                     {t2x2_##sfx##_1, t2x1_##sfx##_1}, \
                                                     {t3x2_##sfx##_1, t3x1_##sfx##_1}, \
                                                     {t4x2_##sfx##_1, t4x1_##sfx##_1}, \
                                                     {t1x4_##sfx##_1, t1x1_##sfx##_1}}, \
                                                    {{t1x2_##sfx##_2, t1x1_##sfx##_2}, \
                                                     {t2x2_##sfx##_2, t2x1_##sfx##_2}, \
                                                     {t3x2_##sfx##_2, t3x1_##sfx##_2}, \
                                                     {t4x2_##sfx##_2, t4x1_##sfx##_2}, \
                                                     {t1x4_##sfx##_2, t1x1_##sfx##_2}}};
// clang-format on

/* Software prefetch pays for weights streamed from DRAM (+15-90% measured at k = 1536..8192) and
 * costs ~10% of instructions when they already sit in cache; below 1 MiB assume the latter. Large
 * weights come from DRAM in NW short interleaved streams (a 4096-wide q4 row is 2.5 KiB), which
 * hardware prefetchers pick up late: a tile fetches the same block group of its rows pf_rows rows
 * ahead (about 8 KiB ahead). Returns pf_rows, 0 for no prefetch. */
static inline int64_t prefetch_rows(int64_t n, int64_t row_bytes, int NW) {
  return n * row_bytes < (1 << 20) ? 0 : row_bytes >= 8192 / NW ? NW : (8192 + row_bytes - 1) / row_bytes;
}

/* Prefetches bytes [lo, hi) of the NW rows pf_rows rows past w[c] (stride ldw). */
static inline __attribute__((always_inline)) void prefetch_group(const char *const *w, int NW, int64_t ldw,
                                                                 int64_t pf_rows, int lo, int hi) {
#pragma GCC unroll 4
  for (int c = 0; c < NW; c++) {
    /* integer arithmetic: the target may lie past the tensor (prefetches never fault) */
    const char *nx = (const char *)((uintptr_t)w[c] + (uintptr_t)(pf_rows * ldw));
    for (int l = lo & ~63; l < hi; l += 64) _mm_prefetch(nx + l, _MM_HINT_T0);
  }
}

/* A tile's R x rows from row i0: their quantized values, block scales and block sums. */
static inline __attribute__((always_inline)) void tile_x_rows(const servd__mm *p, int64_t i0, int R, const int8_t **xq,
                                                              const float **xd, const float **xs) {
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    xq[r] = p->xq.qs + (i0 + r) * p->xq.ldq;
    xd[r] = p->xq.d + (i0 + r) * p->xq.lds;
    xs[r] = p->xq.s + (i0 + r) * p->xq.lds;
  }
}

/* A 128-byte window of block bytes at src, rem of them valid (> 0), permuted by idx: the two 64-byte
 * halves are loaded under masks, so that no byte past the blocks is touched (the tensor may end
 * there). The header loads of the q4/q8_0 and q5 kernels run their windows through it. */
static inline __attribute__((always_inline)) __m512i window_permute(const char *src, int rem, __m512i idx) {
  const __m512i a = rem >= 64 ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8((1ull << rem) - 1, src);
  const __m512i b = rem >= 128 ? _mm512_loadu_si512(src + 64)
                    : rem > 64 ? _mm512_maskz_loadu_epi8((1ull << (rem - 64)) - 1, src + 64)
                               : _mm512_setzero_si512();
  return _mm512_permutex2var_epi16(a, idx, b);
}

/* The last group of a row when it holds at most 4 blocks (bytes = their size): load masks for its two
 * 64-byte halves, and each x row's block scales (dxe) and block sums / 4 (sxe) spread over the
 * blocks' 4-lane groups. Padding past the last block is zero, so missing blocks weigh nothing. */
static inline __attribute__((always_inline)) void tail_setup(int bytes, __mmask64 *ma, __mmask64 *mb,
                                                             const float *const *xd, const float *const *xs, int64_t g,
                                                             int R, __m512 *dxe, __m512 *sxe) {
  const __m512i lanes4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  *ma = bytes >= 64 ? ~0ull : (1ull << bytes) - 1;
  *mb = bytes > 64 ? (1ull << (bytes - 64)) - 1 : 0;
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    dxe[r] = _mm512_permutexvar_ps(lanes4, _mm512_loadu_ps(xd[r] + g));
    sxe[r] = _mm512_mul_ps(_mm512_permutexvar_ps(lanes4, _mm512_loadu_ps(xs[r] + g)), _mm512_set1_ps(0.25f));
  }
}

/* tail_setup at either activation precision: two, the block sums of both levels (xs, xs2) meet the
 * offsets, and xd holds the residual's scales d2. */
static inline __attribute__((always_inline)) void tail_setup_levels(int bytes, __mmask64 *ma, __mmask64 *mb,
                                                                    const float *const *xd, const float *const *xs,
                                                                    const float *const *xs2, int64_t g, int R,
                                                                    __m512 *dxe, __m512 *sxe, const bool two) {
  tail_setup(bytes, ma, mb, xd, xs, g, R, dxe, sxe);
  if (!two) return;
  const __m512i lanes4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) /* the residual's sums spread as tail_setup spreads xs */
    sxe[r] = _mm512_add_ps(
        sxe[r], _mm512_mul_ps(_mm512_permutexvar_ps(lanes4, _mm512_loadu_ps(xs2[r] + g)), _mm512_set1_ps(0.25f)));
}

/* A quad's dots (unsigned weight bytes lo/hi against signed x) joined to the residual level's in
 * integers: (dot << 7) + the dots of the residual quanta at xp2 (quad layout), exact in units of
 * d2 = d/128 (|dot| < 2^25 for 8-bit weights, < 2^22 for 5-bit ones). */
static inline __attribute__((always_inline)) __m512i residual_quad_dots(__m512i dot, __m512i lo, __m512i hi,
                                                                        const int8_t *xp2) {
  const __m512i y0 = _mm512_load_si512((const void *)xp2), y1 = _mm512_load_si512((const void *)(xp2 + 64));
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(dot, 7), lo, y0), hi, y1);
}

/* The residual level's rows of a tile (two): their quanta (xq2) and block sums (xs2); xd is
 * pointed at their scales d2, in which the joined dots count. */
static inline __attribute__((always_inline)) void
tile_x_rows2(const servd__mm *p, int64_t i0, int R, const int8_t **xq2, const float **xd, const float **xs2) {
#pragma GCC unroll 4
  for (int r = 0; r < R; r++) {
    xq2[r] = p->xq.qs2 + (i0 + r) * p->xq.ldq;
    xd[r] = p->xq.d2 + (i0 + r) * p->xq.lds;
    xs2[r] = p->xq.s2 + (i0 + r) * p->xq.lds;
  }
}

#endif
