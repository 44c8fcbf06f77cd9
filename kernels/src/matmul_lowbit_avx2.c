/* q2_k, q3_k, iq4_xs and iq4_nl weights in matmul with AVX2 (also the path on AVX-512 CPUs).
 *
 * Each weight row is decoded once per call into thread scratch as int8 quanta in element order plus
 * the integer scales, then dotted with every x row by maddubs (unsigned weight x signed activation,
 * pairs summed to i16) and madd against the scales (i16 -> i32), exactly as integers per super-block
 * and in f32 across them (ggml's arithmetic):
 *   q2_k:   q in 0..3;  sum_g sc_g*dot_g * d - dmin * sum_g m_g*bsum_g       (times d_x)
 *   q3_k:   q + 4 in 0..7 stored, so sum_g sc_g*(dot_g - 4*bsum_g) * d      (sc_g = 6-bit scale - 32)
 *   iq4_xs: codebook values (-127..113) signed, maddubs(|w|, sign(x, w)); scale per 32
 *   iq4_nl: as iq4_xs on blocks of 32 with one f16 scale, on q8_0 activations.
 * The decode is amortised over the x rows of prefill; at batch 1 it stays in L1.
 */
#include <immintrin.h>

#include "matmul_lowbit-impl.h"
#include "servd/blocks.h"

/* One decoded 256-value super-block. */
typedef struct dec_k {
  int8_t q[SERVD_QK_K];
  int16_t sc[8][16]; /* per 32-value chunk c: lanes 0..7 the scale of group 2c, 8..15 of 2c+1 */
  int16_t scn[16];   /* the 16 group scales in order (q3_k's -4 offset) */
  int16_t mins[16];  /* q2_k's group mins */
  float d, dmin;
} dec_k;

static inline __m256i chunk_scales(__m128i sc8, int c) {
  const __m128i idx =
      _mm_setr_epi8((char)(2 * c), (char)(2 * c), (char)(2 * c), (char)(2 * c), (char)(2 * c), (char)(2 * c),
                    (char)(2 * c), (char)(2 * c), (char)(2 * c + 1), (char)(2 * c + 1), (char)(2 * c + 1),
                    (char)(2 * c + 1), (char)(2 * c + 1), (char)(2 * c + 1), (char)(2 * c + 1), (char)(2 * c + 1));
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, idx));
}

/* sc8: the 16 group scales as int8. */
static inline void store_scales(dec_k *o, __m128i sc8) {
#pragma GCC unroll 8
  for (int c = 0; c < 8; c++) _mm256_storeu_si256((__m256i *)o->sc[c], chunk_scales(sc8, c));
  _mm256_storeu_si256((__m256i *)o->scn, _mm256_cvtepi8_epi16(sc8));
}

static void decode_q2_k(const servd_block_q2_k *b, dec_k *o) {
  const __m128i s = _mm_loadu_si128((const __m128i *)b->scales), m4 = _mm_set1_epi8(0xF);
  store_scales(o, _mm_and_si128(s, m4));
  _mm256_storeu_si256((__m256i *)o->mins, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4)));
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int n = 0; n < 2; n++) {
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * n));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
      _mm256_storeu_si256((__m256i *)(o->q + 128 * n + 32 * j), _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3));
  }
  o->d = servd_f16_to_f32(b->d);
  o->dmin = servd_f16_to_f32(b->dmin);
}

static void decode_q3_k(const servd_block_q3_k *b, dec_k *o) {
  int8_t sc[16];
  for (int g = 0; g < 16; g++) sc[g] = (int8_t)(servd_k3_scale(b->scales, g) - 32);
  store_scales(o, _mm_loadu_si128((const __m128i *)sc));
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  const __m256i h = _mm256_loadu_si256((const __m256i *)b->hmask);
  for (int n = 0; n < 2; n++) {
    const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * n));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
      const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
      const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(h, 4 * n + j), one);
      _mm256_storeu_si256((__m256i *)(o->q + 128 * n + 32 * j), _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)));
    }
  }
  o->d = servd_f16_to_f32(b->d);
}

/* 16 bytes of iq4 codes -> 32 codebook values in element order (low nibbles, then high). */
static inline __m256i iq4_values(const uint8_t *qs) {
  const __m128i kv = _mm_loadu_si128((const __m128i *)servd_iq4_values), m4 = _mm_set1_epi8(0xF);
  const __m128i q = _mm_loadu_si128((const __m128i *)qs);
  return _mm256_setr_m128i(_mm_shuffle_epi8(kv, _mm_and_si128(q, m4)),
                           _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(q, 4), m4)));
}

static void decode_iq4_xs(const servd_block_iq4_xs *b, dec_k *o) {
  int8_t sc[16];
  for (int ib = 0; ib < 8; ib++) sc[2 * ib] = sc[2 * ib + 1] = (int8_t)(servd_iq4xs_scale(b, ib) - 32);
  store_scales(o, _mm_loadu_si128((const __m128i *)sc));
#pragma GCC unroll 8
  for (int ib = 0; ib < 8; ib++) _mm256_storeu_si256((__m256i *)(o->q + 32 * ib), iq4_values(b->qs + 16 * ib));
  o->d = servd_f16_to_f32(b->d);
}

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* One x row (q8_K) against one decoded weight row of nb super-blocks. */
static float dot_k(servd_dtype wt, const dec_k *w, const int8_t *xq, const float *xd, const int16_t *bsums,
                   int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++, w++, xq += SERVD_QK_K, bsums += 16) {
    __m256i dot = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
      const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 32 * c));
      const __m256i q = _mm256_loadu_si256((const __m256i *)(w->q + 32 * c));
      const __m256i p = wt == SERVD_IQ4_XS ? _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q))
                                           : _mm256_maddubs_epi16(q, x);
      dot = _mm256_add_epi32(dot, _mm256_madd_epi16(p, _mm256_loadu_si256((const __m256i *)w->sc[c])));
    }
    const __m256i bs = _mm256_loadu_si256((const __m256i *)bsums);
    if (wt == SERVD_Q3_K) /* stored q is q + 4 */
      dot = _mm256_sub_epi32(dot,
                             _mm256_slli_epi32(_mm256_madd_epi16(bs, _mm256_loadu_si256((const __m256i *)w->scn)), 2));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(w->d * xd[b]), acc);
    if (wt == SERVD_Q2_K) {
      const __m256i mb = _mm256_madd_epi16(bs, _mm256_loadu_si256((const __m256i *)w->mins));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mb), _mm256_set1_ps(-w->dmin * xd[b]), acc);
    }
  }
  return hsum(acc);
}

/* One decoded iq4_nl block. */
typedef struct dec_nl {
  int8_t q[SERVD_QK];
  float d;
} dec_nl;

static float dot_nl(const dec_nl *w, const int8_t *xq, const float *xd, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; b++, w++, xq += SERVD_QK) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)xq), q = _mm256_loadu_si256((const __m256i *)w->q);
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q)), ones);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(w->d * xd[b]), acc);
  }
  return hsum(acc);
}

void servd__mm_lowbit_avx2(const servd__mm *p, int64_t j0, int64_t j1) {
  const bool nl = p->wt == SERVD_IQ4_NL;
  const int64_t nb = nl ? p->xq.nb : p->xk.nb;
  void *dec = servd__scratch(1, (size_t)nb * (nl ? sizeof(dec_nl) : sizeof(dec_k)));
  if (!dec) { /* no memory for one row: NaN marks the outputs rather than a silent wrong value */
    for (int64_t i = 0; i < p->m; i++)
      for (int64_t j = j0; j < j1; j++) ((float *)(p->out + i * p->ldo))[j] = NAN;
    return;
  }
  for (int64_t j = j0; j < j1; j++) {
    const char *wr = p->w + j * p->ldw;
    if (nl) {
      dec_nl *o = dec;
      const servd_block_iq4_nl *b = (const servd_block_iq4_nl *)wr;
      for (int64_t k = 0; k < nb; k++) {
        _mm256_storeu_si256((__m256i *)o[k].q, iq4_values(b[k].qs));
        o[k].d = servd_f16_to_f32(b[k].d);
      }
      for (int64_t i = 0; i < p->m; i++)
        ((float *)(p->out + i * p->ldo))[j] = dot_nl(o, p->xq.qs + i * p->xq.ldq, p->xq.d + i * p->xq.lds, nb);
      continue;
    }
    dec_k *o = dec;
    for (int64_t k = 0; k < nb; k++) {
      switch (p->wt) {
      case SERVD_Q2_K: decode_q2_k((const servd_block_q2_k *)wr + k, o + k); break;
      case SERVD_Q3_K: decode_q3_k((const servd_block_q3_k *)wr + k, o + k); break;
      default: decode_iq4_xs((const servd_block_iq4_xs *)wr + k, o + k); break;
      }
    }
    const servd__q8k *q = &p->xk;
    for (int64_t i = 0; i < p->m; i++)
      ((float *)(p->out + i * p->ldo))[j] =
          dot_k(p->wt, o, q->qs + i * q->ldq, q->d + i * q->nb, q->bsums + i * q->nb * 16, nb);
  }
}
