/* bench_lowbit: matmul of q2_k, q3_k, iq4_nl and iq4_xs weights against q4_1 (the anchor) and q4_k at
 * the same shape, timed in alternating rounds of the same run; medians, as GB/s of weight bytes and
 * as time per call over q4_1's. The last column is q4_k on its AVX2 kernel, in the same rounds (the
 * kernel an AVX2-only CPU runs, for scale). *
 * Usage: bench_lowbit [threads] [rounds]
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
  static const int shapes[][2] = {{576, 1536}, {4096, 4096}}; /* k a multiple of 256 */
  static const int ms[] = {1, 8, 64};
  static const servd_dtype dts[] = {SERVD_Q4_1,   SERVD_Q4_K,   SERVD_Q2_K, SERVD_Q3_K,
                                    SERVD_IQ4_NL, SERVD_IQ4_XS, SERVD_Q4_K};
  enum { ND = sizeof dts / sizeof *dts };
  const bool avx2 = servd_cpu_best_isa() > SERVD_ISA_AVX2;
  printf("| n x k | m |");
  for (int d = 0; d < ND - 1; d++) printf(" %s GB/s (time / q4_1) |", servd_dtype_name(dts[d]));
  printf(" q4_k avx2 GB/s |\n|---|---|");
  for (int d = 0; d < ND; d++) printf("---|");
  printf("\n");
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    const int n = shapes[s][0], k = shapes[s][1];
    servd_tensor *w[ND];
    for (int d = 0; d < ND; d++) w[d] = bench_matmul_weight(dts[d], n, k);
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
      const int m = ms[mi];
      servd_tensor *x = bench_matmul_input(m, k), *o = servd_tensor_new(SERVD_F32, 2, (int64_t[]){m, n});
      double t[ND][BENCH_MATMUL_MAX_ROUNDS], ratio[ND][BENCH_MATMUL_MAX_ROUNDS];
      const int calls = (int)(2e8 / ((double)n * k * (m < 8 ? 1 : m / 4))) + 1;
      for (int r = 0; r < rounds; r++) {
        double tr[ND];
        bench_matmul_round(o, x, w, ND, avx2, calls, tr);
        for (int d = 0; d < ND; d++) {
          t[d][r] = tr[d];
          ratio[d][r] = tr[d] / tr[0];
        }
      }
      printf("| %dx%d | %d |", n, k, m);
      for (int d = 0; d < ND; d++) {
        const double tm = bench_median(t[d], rounds);
        if (tm <= 0) printf(" - |");
        else if (d == ND - 1) printf(" %.1f |", (double)servd_tensor_nbytes(w[d]) / tm * 1e-9);
        else printf(" %.1f (%.2f) |", (double)servd_tensor_nbytes(w[d]) / tm * 1e-9, bench_median(ratio[d], rounds));
      }
      printf("\n");
      servd_tensor_release(x);
      servd_tensor_release(o);
    }
    for (int d = 0; d < ND; d++) servd_tensor_release(w[d]);
  }
  return 0;
}
