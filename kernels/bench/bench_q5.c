/* bench_q5: matmul of q5_0/q5_1 weights against q4_1 (the anchor) at the default model's shapes
 * (SmolLM2-135M: hidden 576, intermediate 1536) and a 4096 square, for decode (m = 1), batched decode
 * (m = 8) and prompts (m = 64, 512), timed in alternating rounds of the same run. Figures are medians
 * over rounds: GB/s of weight bytes and, in brackets, the time per call over q4_1's in the same round
 * (q5 blocks hold 22/24 bytes per 32 values against q4_1's 20, so equal speed per byte is a time
 * ratio of 1.10 for q5_0 and 1.20 for q5_1). The AVX2 columns time q4_1 and q5_0 with the ISA forced
 * to AVX2 (what CPUs without AVX-512 VNNI run), q5_0's bracket being over q4_1 AVX2's time.
 *
 * Usage: bench_q5 [threads] [rounds]   (defaults 2 and 7)
 */
#include <stdio.h>
#include <stdlib.h>

#include "servd/ops.h"
#include "servd/threadpool.h"

#include "bench-matmul.h"
#include "servd/bench-util.h"

enum { Q41, Q50, Q51, Q41_AVX2, Q50_AVX2, ND };

int main(int argc, char **argv) {
  int rounds;
  bench_matmul_args(argc, argv, &rounds);
  static const int shapes[][2] = {{576, 576}, {1536, 576}, {576, 1536}, {4096, 4096}};
  static const int ms[] = {1, 8, 64, 512};
  static const servd_dtype dts[ND] = {SERVD_Q4_1, SERVD_Q5_0, SERVD_Q5_1, SERVD_Q4_1, SERVD_Q5_0};
  static const int anchor[ND] = {Q41, Q41, Q41, Q41_AVX2, Q41_AVX2};
  const bool avx2 = servd_cpu_best_isa() > SERVD_ISA_AVX2;
  printf(
      "| n x k | m | q4_1 GB/s | q5_0 GB/s (time / q4_1) | q5_1 GB/s (time / q4_1) | q4_1 avx2 GB/s | q5_0 avx2 GB/s "
      "(time / q4_1 avx2) |\n|---|---|---|---|---|---|---|\n");
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
        /* the last weight of each call runs on the AVX2 kernel: q4_1 in the first, q5_0 in the second */
        bench_matmul_round(o, x, w, Q50_AVX2, avx2, calls, tr);
        bench_matmul_round(o, x, &w[Q50_AVX2], 1, avx2, calls, &tr[Q50_AVX2]);
        for (int d = 0; d < ND; d++) {
          t[d][r] = tr[d];
          ratio[d][r] = tr[anchor[d]] > 0 ? tr[d] / tr[anchor[d]] : 0;
        }
      }
      printf("| %dx%d | %d |", n, k, m);
      for (int d = 0; d < ND; d++) {
        const double tm = bench_median(t[d], rounds);
        if (tm <= 0) printf(" - |");
        else if (anchor[d] == d) printf(" %.3g |", (double)servd_tensor_nbytes(w[d]) / tm * 1e-9);
        else printf(" %.3g (%.2f) |", (double)servd_tensor_nbytes(w[d]) / tm * 1e-9, bench_median(ratio[d], rounds));
      }
      printf("\n");
      fflush(stdout);
      servd_tensor_release(x);
      servd_tensor_release(o);
    }
    for (int d = 0; d < ND; d++) servd_tensor_release(w[d]);
  }
  return 0;
}
