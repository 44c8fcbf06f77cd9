/* q2_k, q3_k, iq4_xs (on q8_K activations) and iq4_nl (on natural-layout q8 activations) in matmul:
 * the scalar references (matmul_lowbit.c), the AVX2 kernels (matmul_lowbit_avx2.c, also used on
 * AVX-512 CPUs without VNNI) and the AVX-512 VNNI kernels (iq4_nl: q4_0's, matmul_avx512vnni.c). */
#ifndef SERVD_MATMUL_LOWBIT_IMPL_H
#define SERVD_MATMUL_LOWBIT_IMPL_H

#include "matmul-impl.h"

void servd__mm_iq4nl_scalar(const servd__mm *p, int64_t j0, int64_t j1);
void servd__mm_lowbit_avx2(const servd__mm *p, int64_t j0, int64_t j1);
/* q2_k q3_k iq4_xs (matmul_lowbit_avx512vnni.c) */
void servd__mm_lowbit_k_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1);

#endif
