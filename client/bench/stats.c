/* Summary statistics over per-request samples. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
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
  out->p75 = bench_percentile_sorted(v, n, 75);
  out->p90 = bench_percentile_sorted(v, n, 90);
  out->p95 = bench_percentile_sorted(v, n, 95);
  out->p99 = bench_percentile_sorted(v, n, 99);
}

/* As vLLM's goodput: every objective set must be met (<=). */
bool bench_slo_met(const bench_slo *slo, double ttft_ms, double tpot_ms, double e2e_ms) {
  if (slo->ttft_ms >= 0 && ttft_ms > slo->ttft_ms) return false;
  if (slo->tpot_ms >= 0 && tpot_ms > slo->tpot_ms) return false;
  if (slo->e2el_ms >= 0 && e2e_ms > slo->e2el_ms) return false;
  return true;
}

int bench_slo_parse(const char *s, bench_slo *slo, char *err, size_t err_len) {
  const char *p = s;
  int n = 0;
  while (*p) {
    if (*p == ',' || *p == ' ') {
      p++;
      continue;
    }
    const char *colon = strchr(p, ':');
    size_t klen = colon ? (size_t)(colon - p) : 0;
    double *dst = NULL;
    if (klen == 4 && strncmp(p, "ttft", 4) == 0) dst = &slo->ttft_ms;
    else if (klen == 4 && strncmp(p, "tpot", 4) == 0) dst = &slo->tpot_ms;
    else if (klen == 4 && strncmp(p, "e2el", 4) == 0) dst = &slo->e2el_ms;
    if (!dst) {
      snprintf(err, err_len, "expected ttft:MS, tpot:MS or e2el:MS, got '%s'", p);
      return -1;
    }
    char *end;
    errno = 0;
    double v = strtod(colon + 1, &end);
    if (errno || end == colon + 1 || !(v >= 0) || (*end && *end != ',' && *end != ' ')) {
      snprintf(err, err_len, "%.4s expects milliseconds >= 0, got '%s'", p, colon + 1);
      return -1;
    }
    *dst = v;
    n++;
    p = end;
  }
  if (n == 0) {
    snprintf(err, err_len, "expected ttft:MS, tpot:MS or e2el:MS");
    return -1;
  }
  return 0;
}
