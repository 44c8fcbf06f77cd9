/* bench_kquant_stream: batch-1 matvec of k-quant weights (and q8_0, q4_1) that do not fit in L3,
 * as a fraction of the streaming-read rate of the same threads in the same run.
 *
 * Per dtype, 4096x4096 weights are cycled through until FOOTPRINT bytes were read (so each call
 * finds its weight in DRAM, not in a 32 MiB L3); the anchor reads a FOOTPRINT buffer with 64-bit
 * loads over the same thread pool. Rounds alternate anchor and dtypes; each dtype's figure is the
 * median over rounds of (weight bytes per second / the anchor's rate in that round), so a machine
 * shared with other work moves both sides together.
 *
 * Usage: bench_kquant_stream [threads] [rounds] [dtype ...]   (default: q4_k q5_k q6_k q8_0 q4_1)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/ops.h"
#include "servd/threadpool.h"

#include "servd/bench-util.h"

#define FOOTPRINT ((size_t)192 << 20) /* bytes per side and round: six times the L3 */
#define N 4096
#define K 4096
static servd_tensor *weight(servd_dtype dt, int seed) {
  servd_tensor *w = servd_tensor_new(dt, 2, (int64_t[]){N, K});
  float *row = malloc((size_t)K * sizeof(float));
  for (int j = 0; j < N; j++) {
    for (int l = 0; l < K; l++) row[l] = (float)((j * 7919 + l * 104729 + seed * 31) % 2001) / 1000.0f - 1.0f;
    servd_row_from_f32(dt, row, (char *)servd_tensor_data(w) + (size_t)j * w->strides[0], K);
  }
  free(row);
  return w;
}

int main(int argc, char **argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 9;
  servd_threadpool_init(threads);
  enum { MAXD = 8, MAXW = 64 };
  servd_dtype dts[MAXD] = {SERVD_Q4_K, SERVD_Q5_K, SERVD_Q6_K, SERVD_Q8_0, SERVD_Q4_1};
  int ND = 5;
  if (argc > 3) {
    for (ND = 0; ND + 3 < argc && ND < MAXD; ND++)
      if (servd_dtype_from_name(argv[ND + 3], &dts[ND]) || !servd_dtype_is_quantized(dts[ND])) {
        fprintf(stderr, "bench_kquant_stream: %s is not a block dtype\n", argv[ND + 3]);
        return 2;
      }
  }
  servd_tensor *ws[MAXD][MAXW];
  int nw[MAXD];
  for (int d = 0; d < ND; d++) {
    const size_t bytes = (size_t)servd_dtype_row_bytes(dts[d], K) * N;
    nw[d] = (int)((FOOTPRINT + bytes - 1) / bytes);
    if (nw[d] > MAXW) nw[d] = MAXW;
    for (int i = 0; i < nw[d]; i++) ws[d][i] = weight(dts[d], i);
  }
  uint64_t *buf = aligned_alloc(64, FOOTPRINT);
  memset(buf, 1, FOOTPRINT);
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, (int64_t[]){1, K}),
               *out = servd_tensor_new(SERVD_F32, 2, (int64_t[]){1, N});
  for (int l = 0; l < K; l++) ((float *)servd_tensor_data(x))[l] = (float)(l % 17) / 8.0f - 1.0f;

  double *stream = malloc(sizeof(double) * rounds), *rate[MAXD], *ratio[MAXD];
  for (int d = 0; d < ND; d++) rate[d] = malloc(sizeof(double) * rounds), ratio[d] = malloc(sizeof(double) * rounds);
  bench_stream_job sj = {.p = buf};
  for (int r = -1; r < rounds; r++) { /* round -1 warms up */
    double t0 = bench_now_s();
    servd_parallel_for((int64_t)(FOOTPRINT / 8 / BENCH_STREAM_CHUNK), 1, bench_stream_task, &sj);
    const double s = (double)FOOTPRINT / (bench_now_s() - t0) / 1e9;
    for (int d = 0; d < ND; d++) {
      size_t bytes = 0;
      t0 = bench_now_s();
      for (int i = 0; i < nw[d]; i++) {
        if (servd_matmul(out, x, ws[d][i])) {
          fprintf(stderr, "matmul: %s\n", servd_last_error());
          return 1;
        }
        bytes += servd_tensor_nbytes(ws[d][i]);
      }
      if (r >= 0) {
        rate[d][r] = (double)bytes / (bench_now_s() - t0) / 1e9;
        ratio[d][r] = rate[d][r] / s;
      }
    }
    if (r >= 0) stream[r] = s;
  }
  printf("%d threads, %d rounds, %zu MiB per side and round, weights %dx%d (medians)\n\n", threads, rounds,
         FOOTPRINT >> 20, N, K);
  printf("| dtype | weight GB/s | / streaming read |\n|---|---|---|\n");
  for (int d = 0; d < ND; d++)
    printf("| %s | %.1f | %.2f |\n", servd_dtype_name(dts[d]), bench_median(rate[d], rounds),
           bench_median(ratio[d], rounds));
  printf("| streaming read | %.1f | 1 |\n", bench_median(stream, rounds));
  fflush(stdout);
  fprintf(stderr, "(checksum %llu)\n", (unsigned long long)(sj.sums[0] ^ sj.sums[1]));
  return 0;
}
