/* One timing round of several weight dtypes at one shape, shared by the block-quantized kernel
 * benchmarks (bench_kquant, bench_q5): the last weight is timed on the AVX2 kernel (when the CPU
 * has it: else its time is 0), the others on the best kernel the CPU has. */
#ifndef SERVD_BENCH_MATMUL_H
#define SERVD_BENCH_MATMUL_H

#include <stdbool.h>

#include "bench-util.h"
#include "servd/ops.h"

/* t[d] = seconds per call of out = x @ w[d]^T, over `calls` calls after one warm-up call. */
static inline void bench_matmul_round(servd_tensor *o, const servd_tensor *x, servd_tensor *const *w, int nd, bool avx2,
                                      int calls, double *t) {
  for (int d = 0; d < nd; d++) {
    if (d == nd - 1) {
      if (!avx2) {
        t[d] = 0;
        continue;
      }
      servd_cpu_force_isa(SERVD_ISA_AVX2);
    }
    servd_matmul(o, x, w[d]);
    const double t0 = bench_now_s();
    for (int c = 0; c < calls; c++) servd_matmul(o, x, w[d]);
    t[d] = (bench_now_s() - t0) / calls;
    if (d == nd - 1) servd_cpu_force_isa(SERVD_ISA_COUNT); /* back to the best */
  }
}

#endif
