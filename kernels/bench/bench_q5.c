/* bench_q5: batch-1 and small-batch matmul of q5_0/q5_1 weights against q4_1 at the default model's
 * shapes (SmolLM2-135M: hidden 576, intermediate 1536) and one large one, timed in alternating rounds
 * of the same run; each figure is the fastest round (on a shared machine the one least disturbed by
 * other work). Columns: microseconds per call and GB/s of weight bytes; "q5_0 avx2" is q5_0 with the
 * ISA forced to AVX2 (what machines without VNNI run), in the same rounds.
 *
 * Usage: bench_q5 [threads] [rounds]
 */
#include <stdio.h>
#include <stdlib.h>

#include "servd/ops.h"
#include "servd/threadpool.h"

#include "bench-matmul.h"
#include "bench-util.h"

int main(int argc, char **argv) {
  int rounds;
  bench_matmul_args(argc, argv, &rounds);
  static const int shapes[][2] = {{576, 576}, {1536, 576}, {576, 1536}, {4096, 4096}};
  static const int ms[] = {1, 8};
  /* the last entry is q5_0 again, timed with the ISA forced to AVX2 */
  static const servd_dtype dts[] = {SERVD_Q4_1, SERVD_Q5_0, SERVD_Q5_1, SERVD_Q5_0};
  enum { ND = sizeof dts / sizeof *dts };
  const bool avx2 = servd_cpu_best_isa() > SERVD_ISA_AVX2;
  printf("| n x k | m | q4_1 us | q5_0 us | q5_1 us | q5_0 avx2 us | q4_1 GB/s | q5_0 GB/s | q5_0 / q4_1 time |\n"
         "|---|---|---|---|---|---|---|---|---|\n");
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    const int n = shapes[s][0], k = shapes[s][1];
    servd_tensor *w[ND];
    for (int d = 0; d < ND; d++) w[d] = bench_matmul_weight(dts[d], n, k);
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
      const int m = ms[mi];
      servd_tensor *x = bench_matmul_input(m, k), *o = servd_tensor_new(SERVD_F32, 2, (int64_t[]){m, n});
      double t[ND][BENCH_MATMUL_MAX_ROUNDS];
      const int calls = (int)(5e7 / ((double)n * k)) + 1;
      for (int r = 0; r < rounds; r++) {
        double tr[ND];
        bench_matmul_round(o, x, w, ND, avx2, calls, tr);
        for (int d = 0; d < ND; d++) t[d][r] = tr[d];
      }
      double best[ND];
      for (int d = 0; d < ND; d++) {
        best[d] = t[d][0];
        for (int r = 1; r < rounds; r++) best[d] = t[d][r] < best[d] ? t[d][r] : best[d];
      }
      printf("| %dx%d | %d |", n, k, m);
      for (int d = 0; d < ND; d++) {
        if (best[d] > 0) printf(" %.1f |", best[d] * 1e6);
        else printf(" - |");
      }
      for (int d = 0; d < 2; d++) printf(" %.1f |", (double)servd_tensor_nbytes(w[d]) / best[d] * 1e-9);
      printf(" %.2f |\n", best[1] / best[0]);
      servd_tensor_release(x);
      servd_tensor_release(o);
    }
    for (int d = 0; d < ND; d++) servd_tensor_release(w[d]);
  }
  return 0;
}
