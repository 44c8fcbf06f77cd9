/* Summary statistics over per-request samples. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Linear interpolation between the two nearest ranks, rank = p/100 * (n-1): numpy's default. */
double bench_percentile_sorted(const double *v, long n, double p) {
  if (n <= 0) return 0.0;
  double rank = p / 100.0 * (double)(n - 1);
  long lo = (long)floor(rank);
  long hi = lo + 1 < n ? lo + 1 : n - 1;
  double frac = rank - (double)lo;
  return v[lo] + (v[hi] - v[lo]) * frac;
}

void bench_summarize(double *v, long n, bench_summary *out) {
  memset(out, 0, sizeof *out);
  out->count = n;
  if (n <= 0) return;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  double sum = 0;
  for (long i = 0; i < n; i++) sum += v[i];
  out->mean = sum / (double)n;
  double ss = 0;
  for (long i = 0; i < n; i++) ss += (v[i] - out->mean) * (v[i] - out->mean);
  out->stddev = sqrt(ss / (double)n);
  out->min = v[0];
  out->max = v[n - 1];
  out->median = bench_percentile_sorted(v, n, 50);
  out->p90 = bench_percentile_sorted(v, n, 90);
  out->p99 = bench_percentile_sorted(v, n, 99);
}
