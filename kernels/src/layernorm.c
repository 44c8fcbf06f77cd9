/* layernorm: out = (x - mean) / sqrt(var + eps) * weight + bias over each row, the biased variance as
 * torch.nn.LayerNorm computes it (BERT's embedding and post-block norms); f32, two passes over the
 * row in double accumulators (rows are a few hundred to a few thousand wide: the sums cost little
 * next to the matmuls around them, and cancellation in var stays out of the picture). */
#include <math.h>

#include "ops-impl.h"
#include "servd/threadpool.h"

int servd__check_layernorm(servd_tensor *out, const servd_tensor *x, const servd_tensor *weight,
                           const servd_tensor *bias, float eps) {
  char bo[96], bx[96], bw[96], bb[96];
  int rc = servd__check_rows_bias("layernorm", out, x, bias);
  if (rc) return rc;
  if (!weight || weight->dtype != SERVD_F32 || weight->ndim != 1 || weight->shape[0] != out->shape[out->ndim - 1] ||
      !(eps > 0.0f) || !isfinite(eps))
    return servd_fail(SERVD_EINVAL,
                      "layernorm: expected weight f32 (n) like bias and eps > 0; got out %s, x %s, weight %s, bias %s, "
                      "eps %g",
                      ops__desc(out, bo, sizeof bo), ops__desc(x, bx, sizeof bx), ops__desc(weight, bw, sizeof bw),
                      ops__desc(bias, bb, sizeof bb), (double)eps);
  return 0;
}

typedef struct ln_job {
  ops__rows o, x;
  const float *w, *b;
  float eps;
} ln_job;

static void ln_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const ln_job *j = ctx;
  int64_t n = j->o.cols;
  for (int64_t r = begin; r < end; r++) {
    const float *x = (const float *)(j->x.data + r * j->x.stride);
    float *o = (float *)(j->o.data + r * j->o.stride);
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    double mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) ss += (x[i] - mean) * (x[i] - mean);
    float m = (float)mean, inv = (float)(1.0 / sqrt(ss / (double)n + (double)j->eps));
    for (int64_t i = 0; i < n; i++) o[i] = (x[i] - m) * inv * j->w[i] + j->b[i];
  }
}

int servd_layernorm(servd_tensor *out, const servd_tensor *x, const servd_tensor *weight, const servd_tensor *bias,
                    float eps) {
  char bo[96];
  int rc = servd__check_layernorm(out, x, weight, bias, eps);
  if (rc) return rc;
  ln_job j = {.w = servd_tensor_data(weight), .b = servd_tensor_data(bias), .eps = eps};
  if (ops__as_rows(out, &j.o) || ops__as_rows(x, &j.x))
    return servd_fail(SERVD_EINVAL, "layernorm: out and x need contiguous rows; got out %s",
                      ops__desc(out, bo, sizeof bo));
  if (j.o.rows == 0 || j.o.cols == 0) return 0;
  servd_parallel_for(j.o.rows, j.o.cols >= 2048 ? 1 : 2048 / j.o.cols, ln_task, &j);
  return 0;
}
