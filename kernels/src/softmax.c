/* Row-wise scaled softmax in place: x = softmax(x * scale). */
#include "ops-impl.h"

#include <math.h>

#include "servd/threadpool.h"

float servd__max_scalar(const float *x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

float servd__exp_shift_sum_scalar(float *x, int64_t n, float scale, float max) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) {
    x[i] = expf(x[i] * scale - max);
    s += x[i];
  }
  return (float)s;
}

void servd__mul_scalar_scalar(float *x, int64_t n, float s) {
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

typedef struct softmax_job {
  ops__rows x;
  float scale;
  servd_isa isa;
} softmax_job;

static void softmax_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  static float (*const maxf[SERVD_ISA_COUNT])(const float *, int64_t) = {servd__max_scalar, servd__max_avx2,
                                                                         servd__max_avx512};
  static float (*const expf_[SERVD_ISA_COUNT])(float *, int64_t, float, float) = {
      servd__exp_shift_sum_scalar, servd__exp_shift_sum_avx2, servd__exp_shift_sum_avx512};
  static void (*const mulf[SERVD_ISA_COUNT])(float *, int64_t, float) = {
      servd__mul_scalar_scalar, servd__mul_scalar_avx2, servd__mul_scalar_avx512};
  const softmax_job *j = ctx;
  for (int64_t r = begin; r < end; r++) {
    float *x = (float *)(j->x.data + r * j->x.stride);
    float m;
    if (j->scale >= 0.0f) {
      m = maxf[j->isa](x, j->x.cols) * j->scale;
    } else { /* the largest of x*scale is the smallest x */
      float mn = INFINITY;
      for (int64_t i = 0; i < j->x.cols; i++) mn = x[i] < mn ? x[i] : mn;
      m = mn * j->scale;
    }
    float s = expf_[j->isa](x, j->x.cols, j->scale, m);
    mulf[j->isa](x, j->x.cols, 1.0f / s);
  }
}

int servd_softmax(servd_tensor *x, float scale) {
  char bx[96];
  softmax_job j;
  if (!x || x->dtype != SERVD_F32 || ops__as_rows(x, &j.x) != 0 || !isfinite(scale))
    return servd_fail(SERVD_EINVAL,
                      "softmax: expected x f32 (m,n) with contiguous rows and a finite scale, got x %s, scale %g",
                      ops__desc(x, bx, sizeof bx), (double)scale);
  if (j.x.rows == 0 || j.x.cols == 0) return 0;
  j.scale = scale;
  j.isa = ops__isa();
  int64_t grain = j.x.cols >= 8192 ? 1 : 8192 / j.x.cols;
  servd_parallel_for(j.x.rows, grain, softmax_task, &j);
  return 0;
}
