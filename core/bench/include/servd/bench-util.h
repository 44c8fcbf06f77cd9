/* Timing helpers shared by the benchmark programs of every folder (kernels, tokenizer, package_format,
 * interp): a monotonic clock, medians and the streaming-read anchor. Header-only (libc only), in
 * core so that any folder may use it: a benchmark links the interface target servd_bench_util. */
#ifndef SERVD_BENCH_UTIL_H
#define SERVD_BENCH_UTIL_H

#include <stdint.h>
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

/* The streaming-read anchor of the bandwidth-bound benchmarks (bench_kquant_stream, bench_attention):
 * servd_parallel_for(chunks, 1, bench_stream_task, &job) reads chunks * BENCH_STREAM_CHUNK u64 from
 * job.p with 64-bit loads, their xor kept in sums so that the loads stay. */
#define BENCH_STREAM_CHUNK 8192 /* u64 per work item: 64 KiB */

typedef struct bench_stream_job {
  const uint64_t *p;
  uint64_t sums[64];
} bench_stream_job;

static inline void bench_stream_task(void *ctx, int64_t begin, int64_t end, int thread) {
  bench_stream_job *j = ctx;
  const uint64_t *p = j->p + begin * BENCH_STREAM_CHUNK;
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (int64_t i = 0; i < (end - begin) * BENCH_STREAM_CHUNK; i += 4) {
    a ^= p[i];
    b ^= p[i + 1];
    c ^= p[i + 2];
    d ^= p[i + 3];
  }
  j->sums[thread & 63] ^= a ^ b ^ c ^ d;
}

#endif
