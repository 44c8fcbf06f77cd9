/* swiglu and add: element-wise f32 ops over rows, dispatched per ISA. */
#include "ops-impl.h"

#include <math.h>

#include "servd/threadpool.h"

void servd__add_scalar(float *out, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void servd__swiglu_scalar(float *out, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

typedef void (*binary_fn)(float *out, const float *a, const float *b, int64_t n);

typedef struct binary_job {
  binary_fn fn;
  ops__rows o, a, b;
} binary_job;

static void binary_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const binary_job *j = ctx;
  for (int64_t r = begin; r < end; r++)
    j->fn((float *)(j->o.data + r * j->o.stride), (const float *)(j->a.data + r * j->a.stride),
          (const float *)(j->b.data + r * j->b.stride), j->o.cols);
}

static int binary_op(const char *op, servd_tensor *out, const servd_tensor *a, const servd_tensor *b,
                     const binary_fn fns[SERVD_ISA_COUNT]) {
  char bo[96], ba[96], bb[96];
  binary_job j;
  bool ok = out && a && b && out->dtype == SERVD_F32 && a->dtype == SERVD_F32 && b->dtype == SERVD_F32 &&
            out->ndim == a->ndim && out->ndim == b->ndim;
  for (int i = 0; ok && i < out->ndim; i++) ok = out->shape[i] == a->shape[i] && out->shape[i] == b->shape[i];
  ok = ok && ops__as_rows(out, &j.o) == 0 && ops__as_rows(a, &j.a) == 0 && ops__as_rows(b, &j.b) == 0;
  if (!ok)
    return servd_fail(SERVD_EINVAL, "%s: expected out, a, b f32 of one shape (rows contiguous), got out %s, a %s, b %s",
                      op, ops__desc(out, bo, sizeof bo), ops__desc(a, ba, sizeof ba), ops__desc(b, bb, sizeof bb));
  j.fn = fns[ops__isa()];
  if (j.o.rows == 0 || j.o.cols == 0) return 0;
  /* rows are cheap: keep ~16k elements per task so small decode rows stay on the caller thread */
  int64_t grain = j.o.cols >= 16384 ? 1 : 16384 / j.o.cols;
  servd_parallel_for(j.o.rows, grain, binary_task, &j);
  return 0;
}

int servd_add(servd_tensor *out, const servd_tensor *a, const servd_tensor *b) {
  static const binary_fn fns[SERVD_ISA_COUNT] = {servd__add_scalar, servd__add_avx2, servd__add_avx512};
  return binary_op("add", out, a, b, fns);
}

int servd_swiglu(servd_tensor *out, const servd_tensor *gate, const servd_tensor *up) {
  static const binary_fn fns[SERVD_ISA_COUNT] = {servd__swiglu_scalar, servd__swiglu_avx2, servd__swiglu_avx512};
  return binary_op("swiglu", out, gate, up, fns);
}
