/* The q5_0/q5_1 AVX-512 VNNI kernel (matmul_q5_avx512vnni-impl.h) without GFNI, and the choice
 * between it and the GFNI build (matmul_q5_gfni_avx512vnni.c, 2 instructions a step fewer). */
#include <stdatomic.h>

#define Q5_GFNI 0
#include "matmul_q5_avx512vnni-impl.h"

static atomic_int use_gfni = -1;

void servd__q5_use_gfni(bool on) {
  __builtin_cpu_init();
  atomic_store(&use_gfni, on && __builtin_cpu_supports("gfni") && __builtin_cpu_supports("avx512vbmi"));
}

void servd__mm_q5_avx512vnni(const servd__mm *p, int64_t j0, int64_t j1) {
  int g = atomic_load_explicit(&use_gfni, memory_order_relaxed);
  if (g < 0) {
    servd__q5_use_gfni(true);
    g = atomic_load(&use_gfni);
  }
  if (g) servd__mm_q5_avx512gfni(p, j0, j1);
  else if (p->m > 2 * RQ) q5_run_decoded(p, j0, j1);
  else q5_run(p, j0, j1);
}
