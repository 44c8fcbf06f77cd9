/* bench_vnni_peak: the prompt (prefill) GEMM of each quantized dtype in multiply-adds per second, against
 * this CPU's AVX-512 VNNI peak measured in the same run.
 *
 * The peak: every thread of the pool runs a loop of independent vpdpbusd (zmm: 64 int8 multiply-adds
 * each) on 12 accumulators, long enough that the issue rate of vpdpbusd is all that limits it; the
 * pool's rate is the peak a GEMM could reach with these threads (what the core's ports and clock give,
 * measured rather than taken from a data sheet, so a VM's or a turbo state's clock is in it).
 *
 * The GEMM: out (m,n) = x (m,k) @ w (n,k)^T at m = 512 (a prompt), weights of the default model's
 * shapes and a 4096-wide layer; rate = m*n*k / seconds per call (the model's multiply-adds). With two
 * activation levels (the default) the kernels issue two int8 products per multiply-add, so the
 * vpdpbusd work is twice that: both are printed, each as a share of the peak.
 *
 * Usage: bench_vnni_peak [threads] [rounds]   (needs AVX-512 VNNI; says so and exits 0 without it)
 */
#include <immintrin.h>
#include <stdio.h>

#include "bench-matmul.h"

enum { PEAK_ITERS = 1 << 22, ACCS = 12 };

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void dpbusd_loop(void *ctx, int64_t b, int64_t e,
                                                                               int thread) {
  (void)thread;
  volatile int *sink = ctx;
  for (int64_t t = b; t < e; t++) {
    __m512i acc[ACCS];
    const __m512i a = _mm512_set1_epi8(3), w = _mm512_set1_epi8(-2);
    for (int i = 0; i < ACCS; i++) acc[i] = _mm512_set1_epi32(i);
    for (int it = 0; it < PEAK_ITERS; it++) {
#pragma GCC unroll 12
      for (int i = 0; i < ACCS; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, w);
      __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3])); /* keep the loop */
    }
    __m512i s = acc[0];
    for (int i = 1; i < ACCS; i++) s = _mm512_add_epi32(s, acc[i]);
    *sink += _mm512_reduce_add_epi32(s);
  }
}

/* int8 multiply-adds per second of `tasks` concurrent loops (one per pool thread). */
static double peak(int tasks) {
  volatile int sink = 0;
  const double t0 = bench_now_s();
  servd_parallel_for(tasks, 1, dpbusd_loop, (void *)&sink);
  const double t = bench_now_s() - t0;
  return (double)tasks * PEAK_ITERS * ACCS * 64 / t;
}

int main(int argc, char **argv) {
  int rounds;
  bench_matmul_args(argc, argv, &rounds);
  if (!__builtin_cpu_supports("avx512vnni") || servd_cpu_best_isa() < SERVD_ISA_AVX512) {
    printf("bench_vnni_peak: this CPU has no AVX-512 VNNI; nothing to measure\n");
    return 0;
  }
  const int threads = servd_threadpool_size();
  double pk[BENCH_MATMUL_MAX_ROUNDS];
  for (int r = 0; r < rounds; r++) pk[r] = peak(threads);
  const double p = bench_median(pk, rounds);
  printf("VNNI peak, %d thread%s: %.1f GMAC/s (vpdpbusd zmm on %d accumulators, median of %d)\n\n", threads,
         threads == 1 ? "" : "s", p * 1e-9, ACCS, rounds);

  static const servd_dtype types[] = {SERVD_Q4_0, SERVD_Q4_1, SERVD_Q8_0, SERVD_Q5_0,
                                      SERVD_Q4_K, SERVD_Q5_K, SERVD_Q6_K};
  static const int shapes[][2] = {{1536, 576}, {576, 1536}, {4096, 4096}};
  const int m = 512;
  printf("| n x k | dtype | levels | GMAC/s | of peak | int8 products / peak |\n|---|---|---|---|---|---|\n");
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    const int n = shapes[s][0], k = shapes[s][1];
    servd_tensor *x = bench_matmul_input(m, k), *o = servd_tensor_new(SERVD_F32, 2, (int64_t[]){m, n});
    for (size_t d = 0; d < sizeof types / sizeof *types; d++) {
      if (k % servd_dtype_block_elems(types[d])) continue;
      servd_tensor *w = bench_matmul_weight(types[d], n, k);
      const int calls = (int)(2e9 / ((double)n * k * m)) + 1;
      for (int levels = 1; levels <= 2; levels++) {
        double rate[BENCH_MATMUL_MAX_ROUNDS];
        servd_cpu_set_activation_levels(levels);
        for (int r = 0; r < rounds; r++) {
          servd_matmul(o, x, w);
          const double t0 = bench_now_s();
          for (int c = 0; c < calls; c++) servd_matmul(o, x, w);
          rate[r] = (double)m * n * k / ((bench_now_s() - t0) / calls);
        }
        const double g = bench_median(rate, rounds);
        printf("| %dx%d | %s | %d | %.1f | %.0f%% | %.0f%% |\n", n, k, servd_dtype_name(types[d]), levels, g * 1e-9,
               100 * g / p, 100 * g * levels / p);
        fflush(stdout);
      }
      servd_cpu_set_activation_levels(2);
      servd_tensor_release(w);
    }
    servd_tensor_release(x);
    servd_tensor_release(o);
  }
  return 0;
}
