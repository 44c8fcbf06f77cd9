/* bias_gelu: out = gelu(x + b) on every row, gelu(z) = z/2 (1 + erf(z / sqrt 2)), BERT's "gelu"
 * (transformers' GELUActivation, erf form); f32. The AVX2 row (bias_gelu_avx2.c) is tested against
 * this one and float64. */
#include <math.h>

#include "ops-impl.h"
#include "servd/threadpool.h"

int servd__check_bias_gelu(servd_tensor *out, const servd_tensor *x, const servd_tensor *b) {
  return servd__check_rows_bias("bias_gelu", out, x, b);
}

void servd__bias_gelu_scalar(float *out, const float *x, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float z = x[i] + b[i];
    out[i] = 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
  }
}

typedef void (*bias_gelu_fn)(float *, const float *, const float *, int64_t);
typedef struct gelu_job {
  ops__rows o, x;
  const float *b;
  bias_gelu_fn fn;
} gelu_job;

static void gelu_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const gelu_job *j = ctx;
  for (int64_t r = begin; r < end; r++)
    j->fn((float *)(j->o.data + r * j->o.stride), (const float *)(j->x.data + r * j->x.stride), j->b, j->o.cols);
}

int servd_bias_gelu(servd_tensor *out, const servd_tensor *x, const servd_tensor *b) {
  char bo[96];
  int rc = servd__check_bias_gelu(out, x, b);
  if (rc) return rc;
  static const bias_gelu_fn fns[SERVD_ISA_COUNT] = {servd__bias_gelu_scalar, servd__bias_gelu_avx2,
                                                    servd__bias_gelu_avx2};
  gelu_job j = {.b = servd_tensor_data(b), .fn = fns[ops__isa()]};
  if (ops__as_rows(out, &j.o) || ops__as_rows(x, &j.x))
    return servd_fail(SERVD_EINVAL, "bias_gelu: out and x need contiguous rows; got out %s",
                      ops__desc(out, bo, sizeof bo));
  if (j.o.rows == 0 || j.o.cols == 0) return 0;
  servd_parallel_for(j.o.rows, j.o.cols >= 2048 ? 1 : 2048 / j.o.cols, gelu_task, &j);
  return 0;
}
