/* Private interface between the matmul driver (matmul.c) and its per-ISA kernels.
 *
 * out (m,n) f32 = x (m,k) f32 @ w (n,k)^T. A kernel computes all m rows for output columns [j0, j1);
 * the driver splits n over the thread pool. For block dtypes the driver first quantizes x once per
 * call into q8 activations (servd__q8x) that every kernel reads.
 */
#ifndef SERVD_MATMUL_IMPL_H
#define SERVD_MATMUL_IMPL_H

#include "cpu-impl.h"

/* x rows quantized to 8 bits per block of 32 (ggml's q8 activations, f32 scale):
 * row r block b: values qs[r*ldq + 32b .. +32] * d[r*nb + b]; s[r*nb + b] = d * sum(qs of the block). */
typedef struct servd__q8x {
  int8_t *qs;
  float *d, *s;
  int64_t nb, ldq; /* blocks per row; bytes between rows of qs (k rounded up to 64) */
} servd__q8x;

typedef struct servd__mm {
  const char *x, *w;
  char *out;
  int64_t ldx, ldw, ldo; /* bytes between rows */
  int64_t m, n, k;
  servd_dtype wt;
  servd__q8x xq; /* block dtypes only */
} servd__mm;

typedef void (*servd__mm_fn)(const servd__mm *p, int64_t j0, int64_t j1);

/* Quantizes m rows of x (k a multiple of 32) into q (sized by the caller). */
void servd__quantize_q8x(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8x *q);
void servd__quantize_q8x_avx512(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8x *q);

/* Scalar reference kernels (matmul.c). */
void servd__mm_float_scalar(const servd__mm *p, int64_t j0, int64_t j1); /* f32 f16 bf16 */
void servd__mm_quant_scalar(const servd__mm *p, int64_t j0, int64_t j1); /* q8_0 q4_0 q4_1 */

/* SIMD kernels; NULL-free: each covers every shape for its dtypes. */
void servd__mm_float_avx2(const servd__mm *p, int64_t j0, int64_t j1);
void servd__mm_float_avx512(const servd__mm *p, int64_t j0, int64_t j1);
void servd__mm_quant_avx2(const servd__mm *p, int64_t j0, int64_t j1);
void servd__mm_quant_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1);

#endif
