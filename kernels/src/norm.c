/* rmsnorm: out = x / sqrt(mean(x^2) + eps) * weight, per row; weight f32, f16 or bf16. */
#include "ops-impl.h"

#include <math.h>

#include "servd/threadpool.h"

float servd__sumsq_scalar(const float *x, int64_t n) {
  /* same 16 partial sums as the vector paths, so results stay close for long rows */
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) acc[l] += x[i + l] * x[i + l];
  for (int l = 0; i < n; i++, l++) acc[l] += x[i] * x[i];
  float s = 0.0f;
  for (int l = 0; l < 16; l++) s += acc[l];
  return s;
}

static inline float weight_at(const void *w, servd_dtype wt, int64_t i) {
  switch (wt) {
  case SERVD_F16: return servd_f16_to_f32(((const uint16_t *)w)[i]);
  case SERVD_BF16: return servd_bf16_to_f32(((const uint16_t *)w)[i]);
  default: return ((const float *)w)[i];
  }
}

void servd__scale_mul_scalar(float *out, const float *x, float r, const void *w, servd_dtype wt, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * r * weight_at(w, wt, i);
}

typedef struct norm_job {
  ops__rows o, x;
  const void *w;
  servd_dtype wt;
  float eps;
  float (*sumsq)(const float *, int64_t);
  void (*scale_mul)(float *, const float *, float, const void *, servd_dtype, int64_t);
} norm_job;

static void norm_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const norm_job *j = ctx;
  for (int64_t r = begin; r < end; r++) {
    const float *x = (const float *)(j->x.data + r * j->x.stride);
    float ms = j->sumsq(x, j->x.cols) / (float)j->x.cols;
    float rs = 1.0f / sqrtf(ms + j->eps);
    j->scale_mul((float *)(j->o.data + r * j->o.stride), x, rs, j->w, j->wt, j->x.cols);
  }
}

int servd_rmsnorm(servd_tensor *out, const servd_tensor *x, const servd_tensor *weight, float eps) {
  static float (*const sumsq[SERVD_ISA_COUNT])(const float *, int64_t) = {servd__sumsq_scalar, servd__sumsq_avx2,
                                                                          servd__sumsq_avx512};
  static void (*const scale_mul[SERVD_ISA_COUNT])(float *, const float *, float, const void *, servd_dtype, int64_t) = {
      servd__scale_mul_scalar, servd__scale_mul_avx2, servd__scale_mul_avx512};
  char bo[96], bx[96], bw[96];
  norm_job j;
  bool ok = out && x && weight && out->dtype == SERVD_F32 && x->dtype == SERVD_F32 &&
            (weight->dtype == SERVD_F32 || weight->dtype == SERVD_F16 || weight->dtype == SERVD_BF16) &&
            weight->ndim == 1 && out->ndim == x->ndim && ops__as_rows(out, &j.o) == 0 && ops__as_rows(x, &j.x) == 0 &&
            j.o.rows == j.x.rows && j.o.cols == j.x.cols && weight->shape[0] == j.x.cols && !(eps < 0.0f) &&
            !isnan(eps);
  for (int i = 0; ok && i < out->ndim; i++) ok = out->shape[i] == x->shape[i];
  if (!ok)
    return servd_fail(SERVD_EINVAL,
                      "rmsnorm: expected out, x f32 (m,d) of one shape and weight (d) f32/f16/bf16, eps >= 0; "
                      "got out %s, x %s, weight %s, eps %g",
                      ops__desc(out, bo, sizeof bo), ops__desc(x, bx, sizeof bx), ops__desc(weight, bw, sizeof bw),
                      (double)eps);
  if (j.x.rows == 0 || j.x.cols == 0) return 0;
  servd_isa isa = ops__isa();
  j.w = servd_tensor_data(weight);
  j.wt = weight->dtype;
  j.eps = eps;
  j.sumsq = sumsq[isa];
  j.scale_mul = scale_mul[isa];
  int64_t grain = j.x.cols >= 8192 ? 1 : 8192 / j.x.cols;
  servd_parallel_for(j.x.rows, grain, norm_task, &j);
  return 0;
}
