/* The per-ISA geglu row kernels (f32). Private to kernels/src/geglu*.c. */
#ifndef SERVD_GEGLU_IMPL_H
#define SERVD_GEGLU_IMPL_H

#include <stdint.h>

/* out[i] = gelu_tanh(g[i]) * u[i] for n elements */
void servd__geglu_scalar(float *out, const float *g, const float *u, int64_t n);
void servd__geglu_avx2(float *out, const float *g, const float *u, int64_t n);
void servd__geglu_avx512(float *out, const float *g, const float *u, int64_t n);

#endif
