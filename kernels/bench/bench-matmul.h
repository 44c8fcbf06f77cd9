/* What the block-quantized matmul benchmarks (bench_kquant, bench_q5, bench_lowbit) share: their
 * command line, their weights and one timing round of several weight dtypes at one shape. */
#ifndef SERVD_BENCH_MATMUL_H
#define SERVD_BENCH_MATMUL_H

#include <stdbool.h>
#include <stdlib.h>

#include "servd/bench-util.h"
#include "servd/ops.h"
#include "servd/threadpool.h"

/* The round arrays' size: more rounds than this are not run. */
#define BENCH_MATMUL_MAX_ROUNDS 64

/* The command line [threads] [rounds] (defaults 2 and 7, rounds kept in 1..BENCH_MATMUL_MAX_ROUNDS so
 * that the medians read only timed rounds); starts the thread pool. */
static inline void bench_matmul_args(int argc, char **argv, int *rounds) {
  const int threads = argc > 1 ? atoi(argv[1]) : 2, r = argc > 2 ? atoi(argv[2]) : 7;
  *rounds = r < 1 ? 1 : r > BENCH_MATMUL_MAX_ROUNDS ? BENCH_MATMUL_MAX_ROUNDS : r;
  servd_threadpool_init(threads);
}

/* A deterministic n x k weight of type dt, quantized from the same f32 values in every benchmark so
 * that the dtypes are timed on the same matrix. The caller releases it. */
static inline servd_tensor *bench_matmul_weight(servd_dtype dt, int n, int k) {
  servd_tensor *w = servd_tensor_new(dt, 2, (int64_t[]){n, k});
  float *row = malloc((size_t)k * sizeof(float));
  for (int j = 0; j < n; j++) {
    for (int l = 0; l < k; l++) row[l] = (float)((j * 7919 + l * 104729) % 2001) / 1000.0f - 1.0f;
    servd_row_from_f32(dt, row, (char *)servd_tensor_data(w) + (size_t)j * w->strides[0], k);
  }
  free(row);
  return w;
}

/* The m x k activations every matmul benchmark times, the same values in each. The caller releases it. */
static inline servd_tensor *bench_matmul_input(int m, int k) {
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, (int64_t[]){m, k});
  for (int i = 0; i < m * k; i++) ((float *)servd_tensor_data(x))[i] = (float)(i % 17) / 8.0f - 1.0f;
  return x;
}

/* One timing round: the last weight is timed on the AVX2 kernel (when the CPU has it: else its time
 * is 0), the others on the best kernel the CPU has.
 * t[d] = seconds per call of out = x @ w[d]^T, over `calls` calls after one warm-up call. */
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
