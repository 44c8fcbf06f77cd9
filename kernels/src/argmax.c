/* argmax and topk over rows of f32. NaN ranks below every number (so a NaN never wins against a
 * number, and indices are always valid); ties go to the lower index. */
#include "ops-impl.h"

#include <math.h>

#include "servd/threadpool.h"

/* (a at ia) ranks before (b at ib) */
static inline bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  if (isnan(b)) return !isnan(a) || ia < ib;
  if (isnan(a)) return false;
  return a > b || (a == b && ia < ib);
}

typedef struct select_job {
  ops__rows x, v, i; /* v, i unused by argmax except i as the output */
  int32_t *argmax_out;
  int64_t argmax_stride;
  int k;
} select_job;

static void argmax_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const select_job *j = ctx;
  for (int64_t r = begin; r < end; r++) {
    const float *x = (const float *)(j->x.data + r * j->x.stride);
    int64_t best = 0;
    for (int64_t c = 1; c < j->x.cols; c++)
      if (ranks_before(x[c], c, x[best], best)) best = c;
    *(int32_t *)((char *)j->argmax_out + r * j->argmax_stride) = (int32_t)best;
  }
}

int servd_argmax(servd_tensor *out, const servd_tensor *x) {
  char bo[96], bx[96];
  select_job j;
  if (!out || !x || x->dtype != SERVD_F32 || x->ndim != 2 || ops__as_rows(x, &j.x) != 0 || out->dtype != SERVD_I32 ||
      out->ndim != 1 || out->shape[0] != j.x.rows || x->shape[1] < 1 || x->shape[1] > INT32_MAX)
    return servd_fail(SERVD_EINVAL, "argmax: expected x f32 (m,n) with n >= 1 and out i32 (m), got out %s, x %s",
                      ops__desc(out, bo, sizeof bo), ops__desc(x, bx, sizeof bx));
  j.argmax_out = servd_tensor_data(out);
  j.argmax_stride = out->strides[0];
  servd_parallel_for(j.x.rows, 1, argmax_task, &j);
  return 0;
}

static void topk_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const select_job *j = ctx;
  for (int64_t r = begin; r < end; r++) {
    const float *x = (const float *)(j->x.data + r * j->x.stride);
    float *vals = (float *)(j->v.data + r * j->v.stride);
    int32_t *idx = (int32_t *)(j->i.data + r * j->i.stride);
    int cnt = 0;
    /* sorted insertion: after the first k, most elements fail the one comparison with the k-th */
    for (int64_t c = 0; c < j->x.cols; c++) {
      float v = x[c];
      if (cnt == j->k && !ranks_before(v, c, vals[cnt - 1], idx[cnt - 1])) continue;
      int pos = cnt < j->k ? cnt++ : j->k - 1;
      while (pos > 0 && ranks_before(v, c, vals[pos - 1], idx[pos - 1])) {
        vals[pos] = vals[pos - 1];
        idx[pos] = idx[pos - 1];
        pos--;
      }
      vals[pos] = v;
      idx[pos] = (int32_t)c;
    }
  }
}

int servd_topk(servd_tensor *values, servd_tensor *indices, const servd_tensor *x, int k) {
  char bv[96], bi[96], bx[96];
  select_job j;
  if (!values || !indices || !x || x->dtype != SERVD_F32 || x->ndim != 2 || ops__as_rows(x, &j.x) != 0 ||
      values->dtype != SERVD_F32 || indices->dtype != SERVD_I32 || values->ndim != 2 || indices->ndim != 2 ||
      ops__as_rows(values, &j.v) != 0 || ops__as_rows(indices, &j.i) != 0 || k < 1 || k > j.x.cols ||
      j.x.cols > INT32_MAX || j.v.rows != j.x.rows || j.i.rows != j.x.rows || j.v.cols != k || j.i.cols != k)
    return servd_fail(SERVD_EINVAL,
                      "topk: expected x f32 (m,n), values f32 (m,k), indices i32 (m,k), 1 <= k <= n; "
                      "got values %s, indices %s, x %s, k %d",
                      ops__desc(values, bv, sizeof bv), ops__desc(indices, bi, sizeof bi), ops__desc(x, bx, sizeof bx),
                      k);
  j.k = k;
  servd_parallel_for(j.x.rows, 1, topk_task, &j);
  return 0;
}
