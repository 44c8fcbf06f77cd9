/* The q5_0/q5_1 AVX-512 VNNI kernel (matmul_q5_avx512vnni-impl.h) built with GFNI and VBMI (the file
 * name gives it those flags, kernels/CMakeLists.txt), for the CPUs that have them;
 * matmul_q5_avx512vnni.c calls it when they do. */
#define Q5_GFNI 1
#include "matmul_q5_avx512vnni-impl.h"

void servd__mm_q5_avx512gfni(const servd__mm *p, int64_t j0, int64_t j1) {
  if (p->m > 2 * RQ) q5_run_decoded(p, j0, j1);
  else q5_run(p, j0, j1);
}
