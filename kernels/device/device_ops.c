/* Tensor-level device ops: check the tensors (same device, contiguous, dtypes, shapes), then run the
 * launcher on this thread's stream of that device. Nothing here waits for the GPU, so a decode step
 * made of these ops can be captured in a graph. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"

#define TRY(x) \
  do { \
    int rc_ = (x); \
    if (rc_ != 0) return rc_; \
  } while (0)

#define DATA(t) servd_tensor_data(t)

static int64_t cols(const servd_tensor *t) { return t->shape[t->ndim - 1]; }
static int64_t rows(const servd_tensor *t) { return cols(t) ? servd_tensor_numel(t) / cols(t) : 0; }

/* Passes a failed check on; otherwise this thread's context on t's device (t is read only then, so it
 * may be NULL when the check failed). */
static int checked_ctx(const char *op, int checked, const servd_tensor *t, servd_cuda_ctx **c) {
  if (checked != 0) return checked;
  return servd__dev_ctx(op, t->device, c);
}

/* SERVD_TRACE_GEMM=1: one stderr line per matmul before it is enqueued (shape, output dtype, thread),
 * to tell which GEMM a driver fault happens in. */
static int trace_gemm(void) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("SERVD_TRACE_GEMM");
    on = e && *e && strcmp(e, "0") != 0;
  }
  return on;
}

/* The jobs that run these functions on the device's executor (device_executor.c). */
typedef struct matmul_args {
  servd_tensor *out;
  const servd_tensor *x;
  const servd_tensor *w;
} matmul_args;
SERVD__DEV_JOB(matmul, servd_device_matmul(a->out, a->x, a->w))
typedef struct matmul_tune_args {
  int device;
  int n;
  int k;
  char *report;
  size_t cap;
} matmul_tune_args;
SERVD__DEV_JOB(matmul_tune, servd_device_matmul_tune(a->device, a->n, a->k, a->report, a->cap))
typedef struct embedding_args {
  servd_tensor *out;
  const servd_tensor *table;
  const servd_tensor *ids;
  int64_t row_offset;
} embedding_args;
SERVD__DEV_JOB(embedding, servd_device_embedding(a->out, a->table, a->ids, a->row_offset))
typedef struct rmsnorm_args {
  servd_tensor *out;
  const servd_tensor *x;
  const servd_tensor *weight;
  float eps;
} rmsnorm_args;
SERVD__DEV_JOB(rmsnorm, servd_device_rmsnorm(a->out, a->x, a->weight, a->eps))
typedef struct rope_args {
  servd_tensor *x;
  const servd_tensor *positions;
  servd_rope_params p;
} rope_args;
SERVD__DEV_JOB(rope, servd_device_rope(a->x, a->positions, &a->p))
typedef struct swiglu_args {
  servd_tensor *out;
  const servd_tensor *gate;
  const servd_tensor *up;
} swiglu_args;
SERVD__DEV_JOB(swiglu, servd_device_swiglu(a->out, a->gate, a->up))
typedef struct add_args {
  servd_tensor *out;
  const servd_tensor *a;
  const servd_tensor *b;
} add_args;
SERVD__DEV_JOB(add, servd_device_add(a->out, a->a, a->b))
typedef struct add_rmsnorm_args {
  servd_tensor *x;
  const servd_tensor *o;
  servd_tensor *out;
  const servd_tensor *weight;
  float eps;
} add_rmsnorm_args;
SERVD__DEV_JOB(add_rmsnorm, servd_device_add_rmsnorm(a->x, a->o, a->out, a->weight, a->eps))
typedef struct matmul_many_args {
  int count;
  servd_tensor *outs[SERVD_DEVICE_MATMUL_MANY_MAX];
  const servd_tensor *x;
  const servd_tensor *ws[SERVD_DEVICE_MATMUL_MANY_MAX];
} matmul_many_args;
SERVD__DEV_JOB(matmul_many, servd_device_matmul_many(a->count, a->outs, a->x, a->ws))
typedef struct fused_check_args {
  int device;
  char *report;
  size_t cap;
} fused_check_args;
SERVD__DEV_JOB(fused_check, servd_device_fused_check(a->device, a->report, a->cap))
typedef struct argmax_args {
  servd_tensor *out;
  const servd_tensor *x;
} argmax_args;
SERVD__DEV_JOB(argmax, servd_device_argmax(a->out, a->x))
typedef struct topk_args {
  servd_tensor *values;
  servd_tensor *indices;
  const servd_tensor *x;
  int k;
} topk_args;
SERVD__DEV_JOB(topk, servd_device_topk(a->values, a->indices, a->x, a->k))

int servd_device_matmul(servd_tensor *out, const servd_tensor *x, const servd_tensor *w) {
  const char *op = "device matmul";
  SERVD__DEV_ASYNC(op, matmul, (out, (servd_tensor *)x, (servd_tensor *)w), out, x, w);
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_matmul(out, x, w), x, &c));
  const int m = (int)x->shape[0], n = (int)w->shape[0], k = (int)x->shape[1];
  if (trace_gemm())
    fprintf(stderr, "servd: gemm cuda:%d m=%d n=%d k=%d out=%s thread=%lu\n", x->device, m, n, k,
            servd_dtype_name(out->dtype), (unsigned long)pthread_self());
  int rc =
      w->dtype != SERVD_BF16 /* q8_0, q4_k, q6_k blocks as packed (gemv_quant.cu) */
          ? servd_cuda_matmul_quant(c, DATA(out), out->dtype == SERVD_F32, DATA(x), DATA(w), (int)w->dtype, m, n, k)
          : out->dtype == SERVD_F32 ? servd_cuda_matmul_f32out(c, DATA(out), DATA(x), DATA(w), m, n, k)
                                    : servd_cuda_matmul(c, DATA(out), DATA(x), DATA(w), m, n, k);
  return servd__dev_wrap(rc, op);
}

int servd_device_matmul_tune(int device, int n, int k, char *report, size_t cap) {
  const char *op = "device matmul tune";
  TRY(servd__dev_valid(op, device));
  SERVD__DEV_SYNC(op, device, matmul_tune, 0, device, n, k, report, cap);
  servd_cuda_ctx *c;
  TRY(servd__dev_ctx(op, device, &c));
  return servd__dev_wrap(servd_cuda_gemv_tune(c, n, k, report, cap), op);
}

int servd_device_embedding(servd_tensor *out, const servd_tensor *table, const servd_tensor *ids, int64_t row_offset) {
  const char *op = "device embedding";
  SERVD__DEV_ASYNC(op, embedding, (out, (servd_tensor *)table, (servd_tensor *)ids), out, table, ids, row_offset);
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_embedding(out, table, ids, row_offset), table, &c));
  return servd__dev_wrap(servd_cuda_embedding_rows(c, DATA(out), DATA(table), DATA(ids), (int)ids->shape[0],
                                                   (int)table->shape[1], table->shape[0], row_offset),
                         op);
}

int servd_device_rmsnorm(servd_tensor *out, const servd_tensor *x, const servd_tensor *weight, float eps) {
  const char *op = "device rmsnorm";
  SERVD__DEV_ASYNC(op, rmsnorm, (out, (servd_tensor *)x, (servd_tensor *)weight), out, x, weight, eps);
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_rmsnorm(out, x, weight, eps), x, &c));
  return servd__dev_wrap(servd_cuda_rmsnorm(c, DATA(out), DATA(x), DATA(weight), (int)rows(x), (int)cols(x), eps), op);
}

int servd_device_rope(servd_tensor *x, const servd_tensor *positions, const servd_rope_params *p) {
  const char *op = "device rope";
  if (!p) return servd_fail(SERVD_EINVAL, "%s: NULL parameters", op);
  SERVD__DEV_ASYNC(op, rope, (x, (servd_tensor *)positions), x, positions, *p); /* the parameters by value */
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_rope(x, positions, p), x, &c));
  const int64_t m = x->shape[0], n_heads = m ? servd_tensor_numel(x) / m / p->head_dim : 0;
  if (m == 0) return SERVD_OK;
  return servd__dev_wrap(servd_cuda_rope(c, DATA(x), DATA(positions), (int)m, (int)n_heads, p), op);
}

/* swiglu and add: bf16 elementwise over out, a and b of one shape. */
typedef int (*elementwise_fn)(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *a, const servd_bf16_t *b,
                              int64_t n);
static int elementwise(const char *op, elementwise_fn fn, servd_tensor *out, const servd_tensor *a,
                       const servd_tensor *b) {
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_binary(op, out, a, b), out, &c));
  return servd__dev_wrap(fn(c, DATA(out), DATA(a), DATA(b), servd_tensor_numel(out)), op);
}

int servd_device_swiglu(servd_tensor *out, const servd_tensor *gate, const servd_tensor *up) {
  SERVD__DEV_ASYNC("device swiglu", swiglu, (out, (servd_tensor *)gate, (servd_tensor *)up), out, gate, up);
  return elementwise("device swiglu", servd_cuda_swiglu, out, gate, up);
}

int servd_device_add(servd_tensor *out, const servd_tensor *a, const servd_tensor *b) {
  SERVD__DEV_ASYNC("device add", add, (out, (servd_tensor *)a, (servd_tensor *)b), out, a, b);
  return elementwise("device add", servd_cuda_add, out, a, b);
}

int servd_device_add_rmsnorm(servd_tensor *x, const servd_tensor *o, servd_tensor *out, const servd_tensor *weight,
                             float eps) {
  const char *op = "device add_rmsnorm";
  SERVD__DEV_ASYNC(op, add_rmsnorm, (x, (servd_tensor *)o, out, (servd_tensor *)weight), x, o, out, weight, eps);
  servd_cuda_ctx *c;
  TRY(servd__dev_check_binary(op, x, x, o));
  TRY(checked_ctx(op, servd__dev_check_rmsnorm(out, x, weight, eps), x, &c));
  if (DATA(out) == DATA(x)) return servd_fail(SERVD_EINVAL, "%s: out must not be x (x keeps the sum)", op);
  return servd__dev_wrap(
      servd_cuda_add_rmsnorm(c, DATA(x), DATA(o), DATA(out), DATA(weight), (int)rows(x), (int)cols(x), eps), op);
}

int servd_device_matmul_many(int count, servd_tensor *const *outs, const servd_tensor *x,
                             const servd_tensor *const *ws) {
  const char *op = "device matmul_many";
  if (count < 1 || count > SERVD_DEVICE_MATMUL_MANY_MAX)
    return servd_fail(SERVD_EINVAL, "%s: %d weights (1..%d)", op, count, SERVD_DEVICE_MATMUL_MANY_MAX);
  for (int i = 0; i < count; i++) /* quantized weights have no fused kernel: one matmul each */
    if (ws && ws[i] && ws[i]->dtype != SERVD_BF16) {
      for (int j = 0; j < count; j++) TRY(servd_device_matmul(outs[j], x, ws[j]));
      return SERVD_OK;
    }
  if (servd__dev_forwarding()) { /* the arrays by value */
    matmul_many_args a = {.count = count, .x = x};
    servd_tensor *hold[2 * SERVD_DEVICE_MATMUL_MANY_MAX + 1] = {(servd_tensor *)x};
    for (int i = 0; i < count; i++) {
      a.outs[i] = hold[1 + 2 * i] = outs[i];
      a.ws[i] = ws[i];
      hold[2 + 2 * i] = (servd_tensor *)ws[i];
    }
    return servd__dev_forward(op, -1, matmul_many_job, &a, sizeof a, 0, hold, 1 + 2 * count);
  }
  servd_bf16_t *o[SERVD_DEVICE_MATMUL_MANY_MAX];
  const servd_bf16_t *w[SERVD_DEVICE_MATMUL_MANY_MAX];
  int ns[SERVD_DEVICE_MATMUL_MANY_MAX];
  for (int i = 0; i < count; i++) {
    int rc = servd__dev_check_matmul(outs[i], x, ws[i]);
    if (rc) return servd_fail(rc, "%s: weight %d: %s", op, i, servd_last_error());
    if (outs[i]->dtype != SERVD_BF16)
      return servd_fail(SERVD_EINVAL, "%s: out %d must be bf16 (f32 outputs: servd_device_matmul)", op, i);
    o[i] = DATA(outs[i]);
    w[i] = DATA(ws[i]);
    ns[i] = (int)ws[i]->shape[0];
  }
  servd_cuda_ctx *c;
  TRY(servd__dev_ctx(op, x->device, &c));
  if (trace_gemm())
    fprintf(stderr, "servd: gemm cuda:%d m=%d n=%d+%d%s k=%d out=bf16 (%d weights) thread=%lu\n", x->device,
            (int)x->shape[0], ns[0], count > 1 ? ns[1] : 0, count > 2 ? "+..." : "", (int)x->shape[1], count,
            (unsigned long)pthread_self());
  return servd__dev_wrap(servd_cuda_matmul_many(c, count, o, DATA(x), w, ns, (int)x->shape[0], (int)x->shape[1]), op);
}

int servd_device_fused_check(int device, char *report, size_t cap) {
  const char *op = "device fused check";
  TRY(servd__dev_valid(op, device));
  SERVD__DEV_SYNC(op, device, fused_check, 0, device, report, cap);
  servd_cuda_ctx *c;
  TRY(servd__dev_ctx(op, device, &c));
  return servd__dev_wrap(servd_cuda_fused_check(c, report, cap), op);
}

int servd_device_argmax(servd_tensor *out, const servd_tensor *x) {
  const char *op = "device argmax";
  SERVD__DEV_ASYNC(op, argmax, (out, (servd_tensor *)x), out, x);
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_argmax(out, x), x, &c));
  return servd__dev_wrap(servd_cuda_argmax(c, DATA(out), DATA(x), (int)x->shape[0], (int)x->shape[1]), op);
}

int servd_device_topk(servd_tensor *values, servd_tensor *indices, const servd_tensor *x, int k) {
  const char *op = "device topk";
  SERVD__DEV_ASYNC(op, topk, (values, indices, (servd_tensor *)x), values, indices, x, k);
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_topk(values, indices, x, k), x, &c));
  return servd__dev_wrap(
      servd_cuda_topk(c, DATA(values), DATA(indices), DATA(x), (int)x->shape[0], (int)x->shape[1], k), op);
}

/* ANYT rows of servd/ops.def: the generic checks, then the op's tensor-level launcher (<name>.cu). A
 * job per signature kind carries the arguments to the executor (a new kind needs its ANYT_JOB_<kind>). */
#define ANYT_JOB_T2(name) \
  typedef struct anyt_##name##_args { \
    servd_tensor *p0; \
    const servd_tensor *p1; \
  } anyt_##name##_args; \
  SERVD__DEV_JOB(anyt_##name, servd_device_##name(a->p0, a->p1))
#define ANYT_JOB_T3(name) \
  typedef struct anyt_##name##_args { \
    servd_tensor *p0; \
    const servd_tensor *p1, *p2; \
  } anyt_##name##_args; \
  SERVD__DEV_JOB(anyt_##name, servd_device_##name(a->p0, a->p1, a->p2))
#define ANYT_JOB_T3F(name) \
  typedef struct anyt_##name##_args { \
    servd_tensor *p0; \
    const servd_tensor *p1, *p2; \
    float f; \
  } anyt_##name##_args; \
  SERVD__DEV_JOB(anyt_##name, servd_device_##name(a->p0, a->p1, a->p2, a->f))
#define ANYT_HOLD_OF(t) (servd_tensor *)t,
#define SERVD_OP(name, dispatch, py, sig, names) SERVD__IF_ANYT_##dispatch(ANYT_JOB_##sig(name))
#include "servd/ops.def"
#undef SERVD_OP
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANYT_##dispatch(int servd_device_##name(SERVD__PARAMS(sig, names)) { \
    if (servd__dev_forwarding()) { \
      anyt_##name##_args a_ = {SERVD__ARGS(names)}; \
      servd_tensor *const h_[] = {SERVD__EACH(sig, ANYT_HOLD_OF, names)}; \
      return servd__dev_forward("device " #name, -1, anyt_##name##_job, &a_, sizeof a_, 0, h_, \
                                (int)(sizeof h_ / sizeof h_[0])); \
    } \
    SERVD__DEV_CHECK_ANYT(name, sig, names); \
    const servd_tensor *first_[] = {SERVD__EACH(sig, SERVD__DEV_TENSOR_OF, names)}; \
    servd_cuda_ctx *c; \
    TRY(servd__dev_ctx("device " #name, first_[0]->device, &c)); \
    return servd__dev_wrap(servd_cuda_##name(c, SERVD__ARGS(names)), "device " #name); \
  })
#include "servd/ops.def"
#undef SERVD_OP
