// Which GEMV variant each weight shape uses: measured on the device itself. servd_cuda_gemv_tune
// runs every variant on random data, refuses any whose products differ from the warp-per-column
// kernel's (at 1 and 8 rows), times the rest at 1 row and keeps the fastest when it beats the
// warp-per-column kernel by 3% or more. Choices are read on every launch without a lock: a choice is
// written before the count that publishes it.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "gemv_choice.h"

namespace {
struct choice {
  int device, n, k;
  int variant;
};
constexpr int MAX_CHOICES = 256;
choice choices[MAX_CHOICES];
int n_choices;
pthread_mutex_t choices_mu = PTHREAD_MUTEX_INITIALIZER;

const char *const names[SERVD_GEMV_VARIANTS] = {"warp", "split1", "split2", "split4", "split8"};

void set_choice(int device, int n, int k, int variant) {
  pthread_mutex_lock(&choices_mu);
  int cnt = n_choices;
  for (int i = 0; i < cnt; i++)
    if (choices[i].device == device && choices[i].n == n && choices[i].k == k) {
      __atomic_store_n(&choices[i].variant, variant, __ATOMIC_RELAXED);
      pthread_mutex_unlock(&choices_mu);
      return;
    }
  if (cnt < MAX_CHOICES) { /* past it, a shape keeps the default kernel */
    choices[cnt] = choice{device, n, k, variant};
    __atomic_store_n(&n_choices, cnt + 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&choices_mu);
}

// max over i of |a - b| / (1 + |a|), as the bits of a non-negative float (ordered like unsigned ints)
__global__ void max_rel_err_kernel(const float *a, const float *b, long long n, unsigned int *out) {
  float e = 0.f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float d = fabsf(a[i] - b[i]) / (1.f + fabsf(a[i]));
    if (!(d <= e)) e = isnan(d) ? INFINITY : d; /* NaN counts as wrong */
  }
  e = warp_max(e);
  if (threadIdx.x % 32 == 0) atomicMax(out, __float_as_uint(e));
}

struct buffers {
  __nv_bfloat16 *w = nullptr, *x = nullptr;
  float *ref1 = nullptr, *ref8 = nullptr, *got = nullptr;
  unsigned int *err = nullptr;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  ~buffers() {
    cudaFree(w), cudaFree(x), cudaFree(ref1), cudaFree(ref8), cudaFree(got), cudaFree(err);
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
  }
};

constexpr float TOLERANCE = 1e-3f; /* f32 sums in another order differ by ~1e-6 of their size */
} // namespace

int servd__gemv_choice(int device, int n, int k) {
  int cnt = __atomic_load_n(&n_choices, __ATOMIC_ACQUIRE);
  for (int i = 0; i < cnt; i++)
    if (choices[i].n == n && choices[i].k == k && choices[i].device == device)
      return __atomic_load_n(&choices[i].variant, __ATOMIC_RELAXED);
  return SERVD_GEMV_WARP;
}

const char *servd__gemv_name(int variant) {
  return variant >= 0 && variant < SERVD_GEMV_VARIANTS ? names[variant] : "?";
}

// Largest relative difference of got from ref over m x n products (downloads 4 bytes).
static int max_error(cudaStream_t s, const float *ref, const float *got, long long count, unsigned int *d_err,
                     float *out) {
  SERVD_CUDA_CHECK(cudaMemsetAsync(d_err, 0, sizeof *d_err, s));
  max_rel_err_kernel<<<256, 256, 0, s>>>(ref, got, count, d_err);
  SERVD_CUDA_LAUNCH_CHECK();
  unsigned int bits = 0;
  SERVD_CUDA_CHECK(cudaMemcpyAsync(&bits, d_err, sizeof bits, cudaMemcpyDeviceToHost, s));
  SERVD_CUDA_CHECK(cudaStreamSynchronize(s));
  memcpy(out, &bits, sizeof *out);
  return SERVD_OK;
}

// Seconds per launch of `variant` at one row: the best of three runs of ten launches.
static int time_variant(cudaStream_t s, buffers &b, int variant, int n, int k, double *secs) {
  *secs = INFINITY;
  for (int run = 0; run < 3; run++) {
    SERVD_CUDA_CHECK(cudaEventRecord(b.t0, s));
    for (int i = 0; i < 10; i++) {
      int rc = servd__gemv_launch_f32(s, variant, b.got, b.x, b.w, 1, n, k);
      if (rc) return rc;
    }
    SERVD_CUDA_CHECK(cudaEventRecord(b.t1, s));
    SERVD_CUDA_CHECK(cudaEventSynchronize(b.t1));
    float ms = 0.f;
    SERVD_CUDA_CHECK(cudaEventElapsedTime(&ms, b.t0, b.t1));
    if (ms / 1e4 < *secs) *secs = ms / 1e4;
  }
  return SERVD_OK;
}

static int tune(servd_cuda_ctx *c, buffers &b, int n, int k, char *report, size_t cap) {
  cudaStream_t s = servd__stream(c);
  const size_t wn = (size_t)n * k;
  SERVD_CUDA_CHECK(cudaMalloc(&b.w, wn * sizeof *b.w));
  SERVD_CUDA_CHECK(cudaMalloc(&b.x, (size_t)8 * k * sizeof *b.x));
  SERVD_CUDA_CHECK(cudaMalloc(&b.ref1, (size_t)n * sizeof *b.ref1));
  SERVD_CUDA_CHECK(cudaMalloc(&b.ref8, (size_t)8 * n * sizeof *b.ref8));
  SERVD_CUDA_CHECK(cudaMalloc(&b.got, (size_t)8 * n * sizeof *b.got));
  SERVD_CUDA_CHECK(cudaMalloc(&b.err, sizeof *b.err));
  SERVD_CUDA_CHECK(cudaEventCreate(&b.t0));
  SERVD_CUDA_CHECK(cudaEventCreate(&b.t1));
  int rc;
  if ((rc = servd_cuda_fill_random_bf16(c, reinterpret_cast<servd_bf16_t *>(b.w), wn, 0x9e3779b9u, 1.f)) ||
      (rc = servd_cuda_fill_random_bf16(c, reinterpret_cast<servd_bf16_t *>(b.x), (size_t)8 * k, 0x85ebca6bu, 1.f)) ||
      (rc = servd__gemv_launch_f32(s, SERVD_GEMV_WARP, b.ref1, b.x, b.w, 1, n, k)) ||
      (rc = servd__gemv_launch_f32(s, SERVD_GEMV_WARP, b.ref8, b.x, b.w, 8, n, k)))
    return rc;
  double secs[SERVD_GEMV_VARIANTS];
  float err[SERVD_GEMV_VARIANTS] = {0};
  int best = SERVD_GEMV_WARP;
  if ((rc = time_variant(s, b, SERVD_GEMV_WARP, n, k, &secs[SERVD_GEMV_WARP]))) return rc;
  for (int v = SERVD_GEMV_WARP + 1; v < SERVD_GEMV_VARIANTS; v++) {
    float e1 = 0.f, e8 = 0.f;
    if ((rc = servd__gemv_launch_f32(s, v, b.got, b.x, b.w, 1, n, k)) ||
        (rc = max_error(s, b.ref1, b.got, n, b.err, &e1)) ||
        (rc = servd__gemv_launch_f32(s, v, b.got, b.x, b.w, 8, n, k)) ||
        (rc = max_error(s, b.ref8, b.got, (long long)8 * n, b.err, &e8)))
      return rc;
    err[v] = e1 > e8 ? e1 : e8;
    secs[v] = INFINITY;
    if (!(err[v] <= TOLERANCE)) continue; /* wrong products: never chosen */
    if ((rc = time_variant(s, b, v, n, k, &secs[v]))) return rc;
    if (secs[v] < secs[best]) best = v;
  }
  if (best != SERVD_GEMV_WARP && secs[best] > 0.97 * secs[SERVD_GEMV_WARP]) best = SERVD_GEMV_WARP;
  set_choice(servd_cuda_ctx_device(c), n, k, best);
  size_t used = 0;
  used += (size_t)snprintf(report, cap, "%d x %d bf16 at 1 row:", n, k);
  for (int v = 0; v < SERVD_GEMV_VARIANTS && used < cap; v++) {
    if (isinf(secs[v])) used += (size_t)snprintf(report + used, cap - used, " %s WRONG (error %.2g)", names[v], err[v]);
    else
      used += (size_t)snprintf(report + used, cap - used, " %s %.2f TB/s%s", names[v], wn * 2.0 / secs[v] / 1e12,
                               v == best ? " (chosen)" : "");
    if (used < cap && v + 1 < SERVD_GEMV_VARIANTS) used += (size_t)snprintf(report + used, cap - used, ",");
  }
  return SERVD_OK;
}

extern "C" int servd_cuda_gemv_tune(servd_cuda_ctx *c, int n, int k, char *report, size_t cap) {
  char none[1];
  if (!report || !cap) report = none, cap = sizeof none;
  report[0] = 0;
  if (n < 1 || k < 8 || k % 8 != 0)
    return servd_fail(SERVD_EINVAL, "cuda gemv tune: weight (%d, %d): expected n >= 1 and k a positive multiple of 8",
                      n, k);
  const char *env = getenv("SERVD_GEMV_TUNE");
  if (env && strcmp(env, "0") == 0) {
    snprintf(report, cap, "%d x %d: tuning off (SERVD_GEMV_TUNE=0), the warp kernel", n, k);
    return SERVD_OK;
  }
  SERVD_CUDA_DEVICE_SCOPE(c);
  int rc;
  {
    buffers b; /* freed, events destroyed, on every return */
    rc = tune(c, b, n, k, report, cap);
    if (rc) cudaStreamSynchronize(servd__stream(c)); /* nothing in flight reads b when it goes */
  }
  cudaGetLastError();
  return rc;
}
