/* Attention dot products and value accumulation with AVX2+FMA (f32, f16 via F16C, or bf16 cache).
 * Dims past the last multiple of 8 are done in scalar code. */
#include "ops-impl.h"
#include "attention_avx2-impl.h"

static inline __m256 load8(const void *p, servd_dtype t, int64_t i) {
  if (t == SERVD_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
  if (t == SERVD_BF16) /* bf16 is the high half of an f32 */
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
  return _mm256_loadu_ps((const float *)p + i);
}

static inline float elem(const void *p, servd_dtype t, int64_t i) {
  if (t == SERVD_BF16) return servd_bf16_to_f32(((const uint16_t *)p)[i]);
  return t == SERVD_F16 ? servd_f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* K vector of keys [j0, j0+8) of dim row kr, zero past n keys. */
static inline __m256 load_keys(const char *kr, servd_dtype kt, int j0, int n) {
  if (j0 + 8 <= n) return load8(kr, kt, j0);
  float tmp[8] = {0};
  for (int j = j0; j < n; j++) tmp[j - j0] = elem(kr, kt, j);
  return _mm256_loadu_ps(tmp);
}

/* NQ queries (constant after inlining: acc[] stays in registers) against up to 16 keys, two vectors
 * of 8, so 2*NQ independent FMA chains hide the FMA latency. */
static inline __attribute__((always_inline)) void scores_block(int NQ, float *out, int ld, const float *const *q,
                                                               const char *k, servd_dtype kt, int hd, size_t krow,
                                                               float scale, int n, const char *pf) {
  __m256 a0[6], a1[6];
  for (int i = 0; i < NQ; i++) a0[i] = a1[i] = _mm256_setzero_ps();
  if (n == 16) {
    for (int d = 0; d < hd; d++) {
      const char *kr = k + (size_t)d * krow;
      if (pf) _mm_prefetch(pf + (size_t)d * krow, _MM_HINT_T0); /* this row (one line) in the later block */
      __m256 k0 = load8(kr, kt, 0), k1 = load8(kr, kt, 8);
      attn16_fma_q(NQ, a0, a1, q, d, k0, k1);
    }
  } else {
    for (int d = 0; d < hd; d++) {
      const char *kr = k + (size_t)d * krow;
      __m256 k0 = load_keys(kr, kt, 0, n), k1 = load_keys(kr, kt, 8, n);
      attn16_fma_q(NQ, a0, a1, q, d, k0, k1);
    }
  }
  attn16_store_scaled(NQ, a0, a1, scale, out, ld, n);
}

void servd__attn_scores_avx2(float *out, int ld, const float *const *q, int nq, const void *k, servd_dtype kt, int n,
                             int hd, int64_t kstride, float scale, const void *pf) {
  size_t esz = kt == SERVD_F32 ? 4 : 2, krow = (size_t)kstride * esz;
  for (int j = 0; j < n; j += 16) {
    int nj = n - j < 16 ? n - j : 16;
    const char *kj = (const char *)k + (size_t)j * esz;
    for (int i = 0; i < nq; i += 6) {
      int c = nq - i < 6 ? nq - i : 6;
      float *o = out + (size_t)i * (size_t)ld + (size_t)j;
      const char *pj = pf && i == 0 && nj == 16 ? (const char *)pf + (size_t)j * esz : NULL; /* once per K row */
      switch (c) {
      case 1: scores_block(1, o, ld, q + i, kj, kt, hd, krow, scale, nj, pj); break;
      case 2: scores_block(2, o, ld, q + i, kj, kt, hd, krow, scale, nj, pj); break;
      case 3: scores_block(3, o, ld, q + i, kj, kt, hd, krow, scale, nj, pj); break;
      case 4: scores_block(4, o, ld, q + i, kj, kt, hd, krow, scale, nj, pj); break;
      case 5: scores_block(5, o, ld, q + i, kj, kt, hd, krow, scale, nj, pj); break;
      default: scores_block(6, o, ld, q + i, kj, kt, hd, krow, scale, nj, pj); break;
      }
    }
  }
}

/* NQ queries (constant after inlining) x 16 dims of acc in registers while the n value rows stream by. */
static inline __attribute__((always_inline)) void accum_block(int NQ, float *acc, int acc_ld, const float *p, int ld,
                                                              const char *v, servd_dtype vt, int n, size_t vrow,
                                                              const char *pf) {
  __m256 a0[6], a1[6];
  attn16_load(NQ, a0, a1, acc, acc_ld);
  for (int j = 0; j < n; j++) {
    const char *vr = v + (size_t)j * vrow;
    if (pf) _mm_prefetch(pf + (size_t)j * vrow, _MM_HINT_T0); /* 16 dims: at most one line */
    __m256 v0 = load8(vr, vt, 0), v1 = load8(vr, vt, 8);
    attn16_fma(NQ, a0, a1, p + j, (size_t)ld, v0, v1);
  }
  attn16_store(NQ, a0, a1, acc, acc_ld);
}

void servd__attn_accum_avx2(float *acc, int acc_ld, const float *p, int ld, int nq, const void *v, servd_dtype vt,
                            int n, int hd, int64_t vstride, const void *pf) {
  size_t esz = vt == SERVD_F32 ? 4 : 2, vrow = (size_t)vstride * esz;
  int hd16 = hd & ~15, d = 0;
  for (; d < hd16; d += 16) {
    const char *vd = (const char *)v + (size_t)d * esz;
    for (int i = 0; i < nq; i += 6) {
      int c = nq - i < 6 ? nq - i : 6;
      float *a = acc + (size_t)i * (size_t)acc_ld + d;
      const float *pi = p + (size_t)i * (size_t)ld;
      const char *pd = pf && i == 0 ? (const char *)pf + (size_t)d * esz : NULL; /* once per V row */
      switch (c) {
      case 1: accum_block(1, a, acc_ld, pi, ld, vd, vt, n, vrow, pd); break;
      case 2: accum_block(2, a, acc_ld, pi, ld, vd, vt, n, vrow, pd); break;
      case 3: accum_block(3, a, acc_ld, pi, ld, vd, vt, n, vrow, pd); break;
      case 4: accum_block(4, a, acc_ld, pi, ld, vd, vt, n, vrow, pd); break;
      case 5: accum_block(5, a, acc_ld, pi, ld, vd, vt, n, vrow, pd); break;
      default: accum_block(6, a, acc_ld, pi, ld, vd, vt, n, vrow, pd); break;
      }
    }
  }
  for (int i = 0; i < nq; i++) { /* the last hd % 16 dims */
    float *a = acc + (size_t)i * (size_t)acc_ld;
    const float *pi = p + (size_t)i * (size_t)ld;
    for (int dd = d; dd < hd; dd++)
      for (int j = 0; j < n; j++) a[dd] += pi[j] * elem((const char *)v + (size_t)j * vrow, vt, dd);
  }
}
