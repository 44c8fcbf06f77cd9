#include "matmul-impl.h"

void servd__mm_quant_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1) { servd__mm_quant_scalar(p, j0, j1); }
