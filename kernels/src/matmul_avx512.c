#include "matmul-impl.h"

void servd__mm_float_avx512(const servd__mm *p, int64_t j0, int64_t j1) { servd__mm_float_scalar(p, j0, j1); }
void servd__quantize_q8x_avx512(const char *x, int64_t ldx, int64_t m, int64_t k, const servd__q8x *q) {
  servd__quantize_q8x(x, ldx, m, k, q);
}
