/* AVX2+FMA matmul kernels (placeholder: the scalar reference until the SIMD kernels land). */
#include "matmul-impl.h"

void servd__mm_float_avx2(const servd__mm *p, int64_t j0, int64_t j1) { servd__mm_float_scalar(p, j0, j1); }
void servd__mm_quant_avx2(const servd__mm *p, int64_t j0, int64_t j1) { servd__mm_quant_scalar(p, j0, j1); }
