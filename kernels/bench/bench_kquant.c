/* bench_kquant: batch-1 and small-batch matmul of k-quant weights against q4_1 at the same shape,
 * timed in alternating rounds of the same run (medians), as GB/s of weight bytes. The last column
 * compares the fastest rounds (bytes per second, q4_k over q4_1): on a shared machine the best round
 * is the one least disturbed by other work. "q4_k avx2" is q4_k with the ISA forced to AVX2 for its
 * calls (the kernel AVX-512 machines ran before the VNNI one), in the same rounds.
 *
 * Usage: bench_kquant [threads] [rounds]
 */
#include <stdio.h>
#include <stdlib.h>

#include "servd/ops.h"
#include "servd/threadpool.h"

#include "bench-matmul.h"
#include "servd/bench-util.h"

int main(int argc, char **argv) {
  int rounds;
  bench_matmul_args(argc, argv, &rounds);
  static const int shapes[][2] = {{576, 1536}, {4096, 4096}, {14336, 4096}};
  static const int ms[] = {1, 8};
  /* the last entry is q4_k again, timed with the ISA forced to AVX2 */
  static const servd_dtype dts[] = {SERVD_Q4_1, SERVD_Q4_K, SERVD_Q5_K, SERVD_Q6_K, SERVD_Q4_K};
  enum { ND = sizeof dts / sizeof *dts };
  const bool avx2 = servd_cpu_best_isa() > SERVD_ISA_AVX2;
  printf("| n x k | m | %s GB/s | %s GB/s | %s GB/s | %s GB/s | q4_k avx2 GB/s | q4_k / q4_1 time | q4_k / q4_1 GB/s, "
         "best rounds |\n"
         "|---|---|---|---|---|---|---|---|---|\n",
         servd_dtype_name(dts[0]), servd_dtype_name(dts[1]), servd_dtype_name(dts[2]), servd_dtype_name(dts[3]));
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    const int n = shapes[s][0], k = shapes[s][1];
    servd_tensor *w[ND];
    for (int d = 0; d < ND; d++) w[d] = bench_matmul_weight(dts[d], n, k);
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
      const int m = ms[mi];
      servd_tensor *x = bench_matmul_input(m, k), *o = servd_tensor_new(SERVD_F32, 2, (int64_t[]){m, n});
      double t[ND][BENCH_MATMUL_MAX_ROUNDS], ratio[BENCH_MATMUL_MAX_ROUNDS];
      const int calls = (int)(2e8 / ((double)n * k)) + 1;
      for (int r = 0; r < rounds; r++) {
        double tr[ND];
        bench_matmul_round(o, x, w, ND, avx2, calls, tr);
        for (int d = 0; d < ND; d++) t[d][r] = tr[d];
        ratio[r] = t[1][r] / t[0][r];
      }
      double best[ND];
      for (int d = 0; d < ND; d++) {
        best[d] = t[d][0];
        for (int r = 1; r < rounds; r++) best[d] = t[d][r] < best[d] ? t[d][r] : best[d];
      }
      printf("| %dx%d | %d |", n, k, m);
      for (int d = 0; d < ND; d++) {
        const double tm = bench_median(t[d], rounds);
        if (tm > 0) printf(" %.1f |", (double)servd_tensor_nbytes(w[d]) / tm * 1e-9);
        else printf(" - |");
      }
      printf(" %.2f | %.2f |\n", bench_median(ratio, rounds),
             (double)servd_tensor_nbytes(w[1]) / best[1] / ((double)servd_tensor_nbytes(w[0]) / best[0]));
      servd_tensor_release(x);
      servd_tensor_release(o);
    }
    for (int d = 0; d < ND; d++) servd_tensor_release(w[d]);
  }
  return 0;
}
