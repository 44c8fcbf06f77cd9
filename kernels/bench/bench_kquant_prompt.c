/* bench_kquant_prompt: q8_0, q4_k and q6_k matmul at batch 1 and prompt sizes (m = 8..512) against
 * q4_1 on the same shape in the same rounds, per weight byte and per value.
 *
 * Rounds alternate the dtypes; each row prints the median per dtype of weight GB/s times m (bytes
 * multiplied against x rows per second; prompt paths are compute-bound, so this is the rate the
 * work runs at) and, per dtype, the median over rounds of (its GB/s / q4_1's GB/s in that round):
 * 1.0 is q4_1's speed per byte, and the dtype's bytes per value over q4_1's (q8_0 1.70, q4_k 0.90,
 * q6_k 1.31) is q4_1's speed per value. "q8_0 avx2" is q8_0 with the ISA forced to AVX2.
 * Shapes: the default model's MLP projections (1536x576 is no k-quant: 576 is not a multiple of
 * 256) and a 4096-wide layer.
 *
 * Usage: bench_kquant_prompt [threads] [rounds] [m ...]   (default m: 1 8 64 512)
 */
#include <stdio.h>
#include <stdlib.h>

#include "servd/ops.h"
#include "servd/threadpool.h"

#include "bench-matmul.h"
#include "servd/bench-util.h"

typedef struct column {
  servd_dtype dt;
  bool avx2;
  const char *name;
} column;

static const column cols[] = {{SERVD_Q4_1, false, "q4_1"},
                              {SERVD_Q8_0, false, "q8_0"},
                              {SERVD_Q4_K, false, "q4_k"},
                              {SERVD_Q6_K, false, "q6_k"},
                              {SERVD_Q8_0, true, "q8_0 avx2"}};
enum { NC = sizeof cols / sizeof *cols };

int main(int argc, char **argv) {
  int rounds;
  bench_matmul_args(argc < 3 ? argc : 3, argv, &rounds);
  int ms[16] = {1, 8, 64, 512}, nm = 4;
  if (argc > 3)
    for (nm = 0; nm + 3 < argc && nm < 16; nm++) ms[nm] = atoi(argv[nm + 3]);
  static const int shapes[][2] = {{1536, 576}, {576, 1536}, {4096, 4096}};
  const bool has_avx2 = servd_cpu_best_isa() > SERVD_ISA_AVX2;
  printf("| n x k | m |");
  for (int c = 0; c < NC; c++) printf(" %s GB/s x m |", cols[c].name);
  for (int c = 1; c < NC; c++) printf(" %s / q4_1 per byte |", cols[c].name);
  printf("\n|---|---|");
  for (int c = 1; c < 2 * NC; c++) printf("---|");
  printf("\n");
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    const int n = shapes[s][0], k = shapes[s][1];
    servd_tensor *w[NC];
    for (int c = 0; c < NC; c++)
      w[c] = k % servd_dtype_block_elems(cols[c].dt) ? NULL : bench_matmul_weight(cols[c].dt, n, k);
    for (int mi = 0; mi < nm; mi++) {
      const int m = ms[mi];
      servd_tensor *x = bench_matmul_input(m, k), *o = servd_tensor_new(SERVD_F32, 2, (int64_t[]){m, n});
      double rate[NC][BENCH_MATMUL_MAX_ROUNDS], ratio[NC][BENCH_MATMUL_MAX_ROUNDS];
      const int calls = (int)(1e9 / ((double)n * k * m)) + 1;
      for (int r = 0; r < rounds; r++) {
        for (int c = 0; c < NC; c++) {
          rate[c][r] = 0;
          if (!w[c] || (cols[c].avx2 && !has_avx2)) continue;
          if (cols[c].avx2) servd_cpu_force_isa(SERVD_ISA_AVX2);
          servd_matmul(o, x, w[c]);
          const double t0 = bench_now_s();
          for (int i = 0; i < calls; i++) servd_matmul(o, x, w[c]);
          const double t = (bench_now_s() - t0) / calls;
          if (cols[c].avx2) servd_cpu_force_isa(SERVD_ISA_COUNT);
          rate[c][r] = (double)servd_tensor_nbytes(w[c]) * m / t * 1e-9;
        }
        for (int c = 0; c < NC; c++) ratio[c][r] = rate[c][r] / rate[0][r];
      }
      printf("| %dx%d | %d |", n, k, m);
      for (int c = 0; c < NC; c++) {
        const double v = bench_median(rate[c], rounds);
        if (v > 0) printf(" %.1f |", v);
        else printf(" - |");
      }
      for (int c = 1; c < NC; c++) {
        const double v = bench_median(ratio[c], rounds);
        if (v > 0) printf(" %.2f |", v);
        else printf(" - |");
      }
      printf("\n");
      fflush(stdout);
      servd_tensor_release(x);
      servd_tensor_release(o);
    }
    for (int c = 0; c < NC; c++)
      if (w[c]) servd_tensor_release(w[c]);
  }
  return 0;
}
