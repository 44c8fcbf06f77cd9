/* add_bias: out = x + b on every row (the bias of an nn.Linear, after the matmul); f32. */
#include "ops-impl.h"

#include "servd/threadpool.h"

/* x and out (m,n) of one shape, b (n); all f32. Shared by bias_gelu. */
int servd__check_rows_bias(const char *op, servd_tensor *out, const servd_tensor *x, const servd_tensor *b) {
  char bo[96], bx[96], bb[96];
  bool ok = out && x && b && out->dtype == SERVD_F32 && x->dtype == SERVD_F32 && b->dtype == SERVD_F32 &&
            out->ndim == x->ndim && out->ndim >= 1 && b->ndim == 1 && b->shape[0] == out->shape[out->ndim - 1];
  for (int i = 0; ok && i < out->ndim; i++) ok = out->shape[i] == x->shape[i];
  if (!ok)
    return servd_fail(SERVD_EINVAL,
                      "%s: expected f32 out and x of one shape (..., n) and b (n); got out %s, x %s, b %s", op,
                      ops__desc(out, bo, sizeof bo), ops__desc(x, bx, sizeof bx), ops__desc(b, bb, sizeof bb));
  return 0;
}

int servd__check_add_bias(servd_tensor *out, const servd_tensor *x, const servd_tensor *b) {
  return servd__check_rows_bias("add_bias", out, x, b);
}

typedef struct bias_job {
  ops__rows o, x;
  const float *b;
} bias_job;

static void add_bias_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const bias_job *j = ctx;
  static void (*const adds[SERVD_ISA_COUNT])(float *, const float *, const float *,
                                             int64_t) = {servd__add_scalar, servd__add_avx2, servd__add_avx512};
  void (*add)(float *, const float *, const float *, int64_t) = adds[ops__isa()];
  for (int64_t r = begin; r < end; r++)
    add((float *)(j->o.data + r * j->o.stride), (const float *)(j->x.data + r * j->x.stride), j->b, j->o.cols);
}

int servd_add_bias(servd_tensor *out, const servd_tensor *x, const servd_tensor *b) {
  char bo[96];
  int rc = servd__check_add_bias(out, x, b);
  if (rc) return rc;
  bias_job j = {.b = servd_tensor_data(b)};
  if (ops__as_rows(out, &j.o) || ops__as_rows(x, &j.x) || b->strides[0] != 4)
    return servd_fail(SERVD_EINVAL, "add_bias: out, x need contiguous rows and b contiguous; got out %s",
                      ops__desc(out, bo, sizeof bo));
  if (j.o.rows == 0 || j.o.cols == 0) return 0;
  servd_parallel_for(j.o.rows, j.o.cols >= 4096 ? 1 : 4096 / j.o.cols, add_bias_task, &j);
  return 0;
}
