/* Timing helpers shared by the benchmark programs (kernels/bench, package_format/bench): a monotonic
 * clock and medians. Header-only so that a benchmark directory can include it without a library. */
#ifndef SERVD_BENCH_UTIL_H
#define SERVD_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

/* Monotonic seconds: wall-clock jumps must not show up as speed changes. */
static inline double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median of v[0..n) (n >= 1); sorts v in place, so v[0] is the minimum afterwards. */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
  return v[n / 2];
}

#endif
