/* The per-ISA LoRA row kernels (kernels/src/lora*.c). ab is (r, ld) with ld = k + n: row j holds A's
 * row j (k values) then B's column j (n values), f32 or f16. Private to kernels/src/lora*.c. */
#ifndef SERVD_LORA_IMPL_H
#define SERVD_LORA_IMPL_H

#include <stdint.h>

#include "servd/tensor.h"

/* t[j] = scale * dot(x, A_j) for j < r: x (k) */
typedef void (*lora_down_fn)(float *t, const float *x, const void *ab, servd_dtype abt, int64_t r, int64_t k,
                             int64_t ld, float scale);
/* out[c] += sum_j t[j] * B_j[c] for c in [c0, c1), j in order (one fused multiply-add each): B_j at
 * ab row j, offset k. c0 is a multiple of LORA_COL_ALIGN, so a column's bits do not depend on the split. */
typedef void (*lora_up_fn)(float *out, const float *t, const void *ab, servd_dtype abt, int64_t r, int64_t k,
                           int64_t ld, int64_t c0, int64_t c1);

#define LORA_COL_ALIGN 64

void servd__lora_down_scalar(float *t, const float *x, const void *ab, servd_dtype abt, int64_t r, int64_t k,
                             int64_t ld, float scale);
void servd__lora_up_scalar(float *out, const float *t, const void *ab, servd_dtype abt, int64_t r, int64_t k,
                           int64_t ld, int64_t c0, int64_t c1);
void servd__lora_down_avx2(float *t, const float *x, const void *ab, servd_dtype abt, int64_t r, int64_t k, int64_t ld,
                           float scale);
void servd__lora_up_avx2(float *out, const float *t, const void *ab, servd_dtype abt, int64_t r, int64_t k, int64_t ld,
                         int64_t c0, int64_t c1);
void servd__lora_down_avx512(float *t, const float *x, const void *ab, servd_dtype abt, int64_t r, int64_t k,
                             int64_t ld, float scale);
void servd__lora_up_avx512(float *out, const float *t, const void *ab, servd_dtype abt, int64_t r, int64_t k,
                           int64_t ld, int64_t c0, int64_t c1);

#endif
