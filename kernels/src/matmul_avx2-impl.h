/* The row driver shared by the AVX2 block-quant kernels (matmul_avx2.c, matmul_k_avx2.c,
 * matmul_q5_avx2.c): each decodes a weight row's blocks once for up to RQ x rows. */
#ifndef SERVD_MATMUL_AVX2_IMPL_H
#define SERVD_MATMUL_AVX2_IMPL_H

#ifndef __AVX2__
#error "matmul_avx2-impl.h is for files compiled with AVX2 enabled"
#endif

#include <immintrin.h>

#include "matmul-impl.h"

#define RQ 4 /* x rows per pass over a weight row */

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* Sum of the 8 lanes of a. */
static inline float hsum8(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

/* res[r] = x row i0+r . weight row w, for R (1..RQ) x rows. */
typedef void (*rows_fn)(const servd__mm *p, const char *w, int64_t i0, float *res, int R);

/* Defines the rows_fn `name` over the always-inline kernel(p, w, i0, res, R, wt), with R and wt
 * constants so that each row count is unrolled on its own. */
#define ROWS_FN(kernel, wt, name) \
  static void name(const servd__mm *p, const char *w, int64_t i0, float *res, int R) { \
    switch (R) { \
    case 1: kernel(p, w, i0, res, 1, wt); break; \
    case 2: kernel(p, w, i0, res, 2, wt); break; \
    case 3: kernel(p, w, i0, res, 3, wt); break; \
    default: kernel(p, w, i0, res, 4, wt); break; \
    } \
  }

/* Output columns [j0, j1) for every x row, RQ x rows per call of fn. */
static inline void mm_rows(const servd__mm *p, int64_t j0, int64_t j1, rows_fn fn) {
  float res[RQ];
  for (int64_t j = j0; j < j1; j++) {
    const char *w = p->w + j * p->ldw;
    for (int64_t i = 0; i < p->m; i += RQ) {
      const int R = p->m - i < RQ ? (int)(p->m - i) : RQ;
      fn(p, w, i, res, R);
      for (int r = 0; r < R; r++) ((float *)(p->out + (i + r) * p->ldo))[j] = res[r];
    }
  }
}

#endif
