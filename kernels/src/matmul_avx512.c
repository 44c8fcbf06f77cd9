/* AVX-512 matmul for f32/f16/bf16 weights, and the AVX-512 activation quantizer.
 *
 * out (m,n) = x (m,k) @ w (n,k)^T with k contiguous in both operands, so the kernel is a tile of dot
 * products (as llamafile's tinyBLAS): RM x rows against 4 w rows, 16 k values per step, RM*4 vector
 * accumulators, reduced at the end of each k block straight into 4 adjacent outputs. Weights are
 * widened to f32 in registers (bf16: shift; f16: vcvtph2ps), never converted in memory, and x stays
 * f32, so the only rounding is f32 accumulation. No packing: every tile streams its rows directly.
 * Blocking: per k block of KC, a 4-row weight tile (<= 16 KiB) stays in L1 while the x block
 * (m x KC) is swept from L2.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "avx512-impl.h"
#include "matmul-impl.h"

#define RN 4
#define RM_MAX 6
#define KC 1024
#define MC 120 /* x rows per L2 block: MC*KC*4 bytes stay in L2 while weight tiles pass */

static inline __attribute__((always_inline)) __m512 load_w(servd_dtype wt, const char *row, int64_t l) {
  if (wt == SERVD_BF16)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + l))), 16));
  if (wt == SERVD_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + l)));
  return _mm512_loadu_ps((const float *)row + l);
}

static inline __attribute__((always_inline)) __m512 load_w_tail(servd_dtype wt, const char *row, int64_t l,
                                                                __mmask16 mk) {
  if (wt == SERVD_BF16)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)row + l)), 16));
  if (wt == SERVD_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)row + l));
  return _mm512_maskz_loadu_ps(mk, (const float *)row + l);
}

typedef struct tile_args {
  const float *x[RM_MAX];  /* x rows, at column l0 */
  const float *xe[RM_MAX]; /* bf16 only: even/odd split x rows (servd__mm.xeo), at column l0 */
  const char *w[RN];       /* weight rows (repeated when fewer than RN remain) */
  float *o[RM_MAX];        /* out rows, at column j */
  int64_t l0, kc;
  int nvalid; /* columns of out to write, 1..4 */
  bool first; /* first k block: store, else accumulate */
  int64_t pf; /* bytes from a weight row to the row to prefetch at the same column; 0: none */
} tile_args;

/* Weights streamed from DRAM: one line of each of the rows a->pf bytes ahead, at column l. */
static inline __attribute__((always_inline)) void prefetch_rows(const tile_args *a, size_t es, int64_t l) {
  if (!a->pf) return;
#pragma GCC unroll 4
  for (int c = 0; c < RN; c++)
    _mm_prefetch((const char *)((uintptr_t)a->w[c] + (uintptr_t)a->pf + (uintptr_t)l * es), _MM_HINT_T0);
}

static inline __attribute__((always_inline)) void tile(const tile_args *a, const int rm, const servd_dtype wt) {
  __m512 acc[RM_MAX][RN];
#pragma GCC unroll 8
  for (int r = 0; r < rm; r++)
#pragma GCC unroll 4
    for (int c = 0; c < RN; c++) acc[r][c] = _mm512_setzero_ps();
  const int64_t l0 = a->l0, kc = a->kc;
  int64_t l = 0;
  if (wt == SERVD_BF16) {
    /* 32 weights per 64-byte load: even elements are the low halves of the dwords (shift up),
     * odd ones the high halves (mask); x was split the same way once per call. One FMA chain per
     * output whatever rm is (a second chain for odd terms at rm == 1 would round a row alone
     * differently from the same row in a batch). */
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    for (; l + 32 <= kc; l += 32) {
      prefetch_rows(a, 2, l0 + l);
      __m512 we[RN], wo[RN];
#pragma GCC unroll 4
      for (int c = 0; c < RN; c++) {
        const __m512i v = _mm512_loadu_si512((const uint16_t *)a->w[c] + l0 + l);
        we[c] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        wo[c] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
      }
#pragma GCC unroll 8
      for (int r = 0; r < rm; r++) {
        const __m512 xe = _mm512_loadu_ps(a->xe[r] + l), xo = _mm512_loadu_ps(a->xe[r] + l + 16);
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++) acc[r][c] = _mm512_fmadd_ps(xo, wo[c], _mm512_fmadd_ps(xe, we[c], acc[r][c]));
      }
    }
  }
  for (; l + 16 <= kc; l += 16) {
    if (wt == SERVD_F32 || (l & 16) == 0) prefetch_rows(a, wt == SERVD_F32 ? 4 : 2, l0 + l); /* a line per row */
    __m512 wv[RN];
#pragma GCC unroll 4
    for (int c = 0; c < RN; c++) wv[c] = load_w(wt, a->w[c], l0 + l);
#pragma GCC unroll 8
    for (int r = 0; r < rm; r++) {
      __m512 xv = _mm512_loadu_ps(a->x[r] + l);
#pragma GCC unroll 4
      for (int c = 0; c < RN; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (l < kc) {
    const __mmask16 mk = (__mmask16)((1u << (kc - l)) - 1);
    __m512 wv[RN];
#pragma GCC unroll 4
    for (int c = 0; c < RN; c++) wv[c] = load_w_tail(wt, a->w[c], l0 + l, mk);
#pragma GCC unroll 8
    for (int r = 0; r < rm; r++) {
      __m512 xv = _mm512_maskz_loadu_ps(mk, a->x[r] + l);
#pragma GCC unroll 4
      for (int c = 0; c < RN; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  const __mmask8 om = (__mmask8)((1u << a->nvalid) - 1);
#pragma GCC unroll 8
  for (int r = 0; r < rm; r++) {
    __m128 s = reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    if (!a->first) s = _mm_add_ps(s, _mm_maskz_loadu_ps(om, a->o[r]));
    _mm_mask_storeu_ps(a->o[r], om, s);
  }
}

#define TILE_FN(wt, name) \
  static void name(const tile_args *a, int rm) { \
    switch (rm) { \
    case 1: tile(a, 1, wt); break; \
    case 2: tile(a, 2, wt); break; \
    case 3: tile(a, 3, wt); break; \
    case 4: tile(a, 4, wt); break; \
    case 5: tile(a, 5, wt); break; \
    default: tile(a, 6, wt); break; \
    } \
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
    a->xe[r] = p->xeo ? p->xeo + (i + r) * p->ldxeo + l0 : NULL;
    a->o[r] = (float *)(p->out + (i + r) * p->ldo) + j;
  }
  fn(a, rm);
}

static void set_w(const servd__mm *p, tile_args *a, int64_t j, int64_t j1) {
  a->nvalid = j1 - j < RN ? (int)(j1 - j) : RN;
  for (int c = 0; c < RN; c++) a->w[c] = p->w + (j + (c < a->nvalid ? c : a->nvalid - 1)) * p->ldw;
}

void servd__mm_float_avx512(const servd__mm *p, int64_t j0, int64_t j1) {
  void (*fn)(const tile_args *, int) = p->wt == SERVD_BF16 ? tile_bf16 : p->wt == SERVD_F16 ? tile_f16 : tile_f32;
  tile_args a;
  /* Every output is summed over k blocks of KC, whatever m is, so a row's value does not depend on
   * how many rows share the call (batch invariance). k blocks keep a weight tile in L1 across x row
   * tiles; with a single x tile (decode) a tile's k blocks run back to back, so whole rows stream. */
  /* Single pass over weights of 1 MiB or more (decode): prefetch the next tile's rows, which
   * hardware prefetchers pick up late when four rows stream at once (+~30% from DRAM). */
  const int64_t row_bytes = p->k * (p->wt == SERVD_F32 ? 4 : 2);
  a.pf = p->m <= RM_MAX && p->n * row_bytes >= (1 << 20) ? RN * p->ldw : 0;
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

void servd__split_even_odd_avx512(const char *x, int64_t ldx, int64_t m, int64_t k, float *xeo, int64_t ldxeo) {
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
  for (int64_t r = 0; r < m; r++) {
    const float *xr = (const float *)(x + r * ldx);
    float *o = xeo + r * ldxeo;
    for (int64_t l = 0; l + 32 <= k; l += 32) {
      const __m512 a = _mm512_loadu_ps(xr + l), b = _mm512_loadu_ps(xr + l + 16);
      _mm512_storeu_ps(o + l, _mm512_permutex2var_ps(a, ie, b));
      _mm512_storeu_ps(o + l + 16, _mm512_permutex2var_ps(a, io, b));
    }
  }
}

/* Same rounding as servd__quantize_q8x: q = round-half-away(x * (1/d)), d = amax/127; the residual
 * level as servd__residual_q. */
void servd__quantize_q8x_avx512(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8x *q) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  (void)k;
  for (int64_t r = 0; r < m; r++) {
    const float *xr = (const float *)(x + r * ldx);
    int8_t *qs = q->qs + r * q->ldq, *qs2 = q->qs2 ? q->qs2 + r * q->ldq : NULL;
    servd__q8x_clear_tail(q, r);
    for (int64_t b = 0; b < q->nb; b++) {
      const int64_t at = r * q->lds + b;
      __m512 v0 = _mm512_loadu_ps(xr + b * 32), v1 = _mm512_loadu_ps(xr + b * 32 + 16);
      __m512 am = _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1));
      const float amax = _mm512_reduce_max_ps(am);
      /* both layouts: servd__q8x, servd__q8x_off */
      const int64_t lo = servd__q8x_off(q, b, 0), hi = servd__q8x_off(q, b, 1);
      /* NaN/inf anywhere (fpclass: NaN and both infinities): as servd__quantize_q8x, NaN outputs */
      if (_mm512_fpclass_ps_mask(v0, 0x99) | _mm512_fpclass_ps_mask(v1, 0x99)) {
        for (int8_t *dst = qs; dst; dst = dst == qs ? qs2 : NULL) {
          _mm_storeu_si128((__m128i *)(dst + lo), _mm_setzero_si128());
          _mm_storeu_si128((__m128i *)(dst + hi), _mm_setzero_si128());
        }
        q->d[at] = q->s[at] = NAN;
        if (qs2) q->d2[at] = q->s2[at] = NAN;
        continue;
      }
      const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
      const __m512 idv = _mm512_set1_ps(id);
      const __m512 t0 = round_half_away(_mm512_mul_ps(v0, idv)), t1 = round_half_away(_mm512_mul_ps(v1, idv));
      __m512i i0 = _mm512_cvttps_epi32(t0), i1 = _mm512_cvttps_epi32(t1);
      _mm_storeu_si128((__m128i *)(qs + lo), _mm512_cvtsepi32_epi8(i0));
      _mm_storeu_si128((__m128i *)(qs + hi), _mm512_cvtsepi32_epi8(i1));
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
      q->d[at] = d;
      q->s[at] = d * (float)sum;
      if (qs2) {
        const __m512 dv = _mm512_set1_ps(d), id2 = _mm512_set1_ps(id * 128.0f);
        const __m512i r0 = residual_q16(v0, t0, dv, id2), r1 = residual_q16(v1, t1, dv, id2);
        _mm_storeu_si128((__m128i *)(qs2 + lo), _mm512_cvtsepi32_epi8(r0));
        _mm_storeu_si128((__m128i *)(qs2 + hi), _mm512_cvtsepi32_epi8(r1));
        const float d2 = d * SERVD__RESIDUAL_SCALE;
        q->d2[at] = d2;
        q->s2[at] = d2 * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1));
      }
    }
  }
}
