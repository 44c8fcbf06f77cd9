/* AVX-512 VNNI kernel for q2_k, q3_k and iq4_xs weights against q8_K activations (servd__q8k,
 * natural order).
 *
 * Per super-block each 64-value chunk c of the weight row is decoded once into a zmm of unsigned
 * bytes: q2_k's 2-bit q (0..3), q3_k's q + 4 (0..7), iq4_xs's codebook value + 128 (vpshufb). For
 * every x row vpdpbusd (u8 weights x s8 activations) sums 4 products into each int32 lane exactly;
 * lane l of chunk c belongs to the 16-value group 4c + l/4, so one f32 vector per chunk carries the
 * group scales times d (the same lanes every time). The offsets (q3_k's -4 and iq4_xs's -128 times the
 * scale, q2_k's -dmin*m) multiply the activation's 16-value sums (bsums) in one more vector per
 * super-block, and d_x scales the super-block's sum once. x's residual level (servd__q8k.qs2) meets
 * the same decoded vectors: one more vpdpbusd per chunk, joined to the first level's dot in integers.
 */
#include <immintrin.h>
#include <string.h>

#include "avx512-impl.h"
#include "matmul_lowbit-impl.h"
#include "servd/blocks.h"

typedef struct dec512 {
  __m512i u[4]; /* chunk c: values 64c .. 64c + 63 as unsigned bytes */
  __m512 sc[4]; /* chunk c: lane l <- scale of group 4c + l/4, times d */
  __m512 off;   /* group g <- the offset per unit of bsum (group order) */
} dec512;

static inline __m512 group_lanes(__m512 s16, int c) {
  const __m512i idx =
      _mm512_add_epi32(_mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2),
                       _mm512_set1_epi32(4 * c));
  return _mm512_permutexvar_ps(idx, s16);
}

/* s16, off16: the 16 group scales and offsets in group order. */
static inline void set_scales(dec512 *o, __m512 s16, __m512 off16) {
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) o->sc[c] = group_lanes(s16, c);
  o->off = off16;
}

static inline __m512i lane_index(void) {
  return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* Both 32-byte halves of a zmm from one 32-byte load, shifted right by a (low half) and b (high). */
static inline __m512i halves_shifted(const uint8_t *p, int a, int b) {
  const __m256i v = _mm256_loadu_si256((const __m256i *)p);
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1);
  const __m512i cnt = _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
  return _mm512_srlv_epi16(z, cnt);
}

static inline __attribute__((always_inline)) void decode_q2_k(const servd_block_q2_k *b, dec512 *o) {
  const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->scales)), m4 = _mm512_set1_epi32(0xF);
  set_scales(o, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(sc, m4)), _mm512_set1_ps(_cvtsh_ss(b->d))),
             _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4)), _mm512_set1_ps(-_cvtsh_ss(b->dmin))));
  const __m512i m3 = _mm512_set1_epi8(3);
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) /* chunk c: half n = c/2, steps j = 2(c%2) and j + 1 */
    o->u[c] = _mm512_and_si512(halves_shifted(b->qs + 32 * (c / 2), 4 * (c % 2), 4 * (c % 2) + 2), m3);
}

static inline __attribute__((always_inline)) void decode_q3_k(const servd_block_q3_k *b, dec512 *o) {
  /* servd_k3_scale for all 16 groups: low 4 bits from nibble g/8 of byte g%8, high 2 from bits
   * 2*(g/4) of byte 8 + g%4 */
  const __m512i g = lane_index(), m4 = _mm512_set1_epi32(0xF), m2 = _mm512_set1_epi32(3);
  /* The 12 scale bytes end 2 bytes before the block does: a 16-byte load would read past the last one. */
  uint8_t sb[16] = {0};
  memcpy(sb, b->scales, sizeof b->scales);
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sb));
  const __m512i lo =
      _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(_mm512_and_si512(g, _mm512_set1_epi32(7)), bytes),
                                         _mm512_slli_epi32(_mm512_srli_epi32(g, 3), 2)),
                       m4);
  const __m512i hi =
      _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(
                                             _mm512_add_epi32(_mm512_and_si512(g, m2), _mm512_set1_epi32(8)), bytes),
                                         _mm512_slli_epi32(_mm512_srli_epi32(g, 2), 1)),
                       m2);
  const __m512 s16 = _mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32))),
      _mm512_set1_ps(_cvtsh_ss(b->d)));
  set_scales(o, s16, _mm512_mul_ps(s16, _mm512_set1_ps(-4.0f))); /* stored q + 4 */
  const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) {
    const int n = c / 2, j = 2 * (c % 2);
    const __m512i lo = _mm512_and_si512(halves_shifted(b->qs + 32 * n, 2 * j, 2 * j + 2), m3);
    const __m512i hb = _mm512_and_si512(halves_shifted(b->hmask, 4 * n + j, 4 * n + j + 1), one);
    o->u[c] = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 2));
  }
}

static inline __attribute__((always_inline)) void decode_iq4_xs(const servd_block_iq4_xs *b, dec512 *o) {
  /* servd_iq4xs_scale of sub-block ib = g/2 for every group g */
  const __m512i ib = _mm512_srli_epi32(lane_index(), 1);
  uint32_t l4;
  memcpy(&l4, b->scales_l, 4);
  const __m512i lo =
      _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)l4), _mm512_slli_epi32(ib, 2)), _mm512_set1_epi32(0xF));
  const __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(b->scales_h), _mm512_slli_epi32(ib, 1)),
                                      _mm512_set1_epi32(3));
  const __m512 s16 = _mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32))),
      _mm512_set1_ps(_cvtsh_ss(b->d)));
  set_scales(o, s16, _mm512_mul_ps(s16, _mm512_set1_ps(-128.0f))); /* stored value + 128 */
  const __m512i table = _mm512_broadcast_i32x4(
      _mm_add_epi8(_mm_loadu_si128((const __m128i *)servd_iq4_values), _mm_set1_epi8((char)0x80)));
  const __m512i nib = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++) { /* sub-blocks 2c and 2c+1: each 16 code bytes give low then high nibbles */
    const __m256i v0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b->qs + 32 * c)));
    const __m256i v1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b->qs + 32 * c + 16)));
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v0), v1, 1);
    z = _mm512_and_si512(_mm512_mask_srli_epi16(z, 0xFF00FF00u, z, 4), nib);
    o->u[c] = _mm512_shuffle_epi8(table, z);
  }
}

enum { MAX_ROWS = 128 }; /* the driver's row blocks (ITEM_ROWS) */

/* (The decoders are always inlined: called from both forms below, GCC otherwise makes them calls,
 * their vectors passed through memory: 1.2-1.7x the batch-1 time measured.)
 *
 * Columns [j0, j1) at either activation precision (two: with x's residual level, chosen once per
 * call). With it each dot is joined in integers, dot*128 + dot2 in units of d2, and so are the
 * bsums: |dot| <= 4*241*(127*128 + 64) < 2^24 (iq4_xs, the widest values), exact in f32 too. */
static inline __attribute__((always_inline)) void run_levels(const servd__mm *p, int64_t j0, int64_t j1,
                                                             const bool two) {
  const servd__q8k *q = &p->xk;
  const float *xd = two ? q->d2 : q->d;
  const size_t bb = servd_dtype_block_bytes(p->wt);
  for (int64_t i0 = 0; i0 < p->m; i0 += MAX_ROWS) {
    const int rows = p->m - i0 < MAX_ROWS ? (int)(p->m - i0) : MAX_ROWS;
    for (int64_t j = j0; j < j1; j++) {
      __m512 acc[MAX_ROWS];
      for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
      const char *wr = p->w + j * p->ldw;
      for (int64_t b = 0; b < q->nb; b++) {
        dec512 w;
        const void *blk = wr + b * bb;
        if (p->wt == SERVD_Q2_K) decode_q2_k(blk, &w);
        else if (p->wt == SERVD_Q3_K) decode_q3_k(blk, &w);
        else decode_iq4_xs(blk, &w);
        for (int r = 0; r < rows; r++) {
          const int64_t i = i0 + r, at = i * q->nb + b;
          const int8_t *x = q->qs + i * q->ldq + b * SERVD_QK_K;
          __m512i bsi = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(q->bsums + at * 16)));
          if (two)
            bsi = _mm512_add_epi32(_mm512_slli_epi32(bsi, 7),
                                   _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(q->bsums2 + at * 16))));
          __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(bsi), w.off);
#pragma GCC unroll 4
          for (int c = 0; c < 4; c++) {
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.u[c], _mm512_loadu_si512(x + 64 * c));
            if (two)
              dot = _mm512_dpbusd_epi32(_mm512_slli_epi32(dot, 7), w.u[c],
                                        _mm512_loadu_si512(q->qs2 + i * q->ldq + b * SERVD_QK_K + 64 * c));
            t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), w.sc[c], t);
          }
          acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(xd[at]), acc[r]);
        }
      }
      for (int r = 0; r < rows; r++) ((float *)(p->out + (i0 + r) * p->ldo))[j] = hsum16(acc[r]);
    }
  }
}

void servd__mm_lowbit_k_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1) {
  if (p->residual_fused) run_levels(p, j0, j1, true);
  else run_levels(p, j0, j1, false);
}
