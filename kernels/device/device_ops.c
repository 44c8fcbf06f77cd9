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

int servd_device_matmul(servd_tensor *out, const servd_tensor *x, const servd_tensor *w) {
  const char *op = "device matmul";
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
  servd_cuda_ctx *c;
  TRY(servd__dev_ctx(op, device, &c));
  return servd__dev_wrap(servd_cuda_gemv_tune(c, n, k, report, cap), op);
}

int servd_device_embedding(servd_tensor *out, const servd_tensor *table, const servd_tensor *ids, int64_t row_offset) {
  const char *op = "device embedding";
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_embedding(out, table, ids, row_offset), table, &c));
  return servd__dev_wrap(servd_cuda_embedding_rows(c, DATA(out), DATA(table), DATA(ids), (int)ids->shape[0],
                                                   (int)table->shape[1], table->shape[0], row_offset),
                         op);
}

int servd_device_rmsnorm(servd_tensor *out, const servd_tensor *x, const servd_tensor *weight, float eps) {
  const char *op = "device rmsnorm";
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_rmsnorm(out, x, weight, eps), x, &c));
  return servd__dev_wrap(servd_cuda_rmsnorm(c, DATA(out), DATA(x), DATA(weight), (int)rows(x), (int)cols(x), eps), op);
}

int servd_device_rope(servd_tensor *x, const servd_tensor *positions, const servd_rope_params *p) {
  const char *op = "device rope";
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
  return elementwise("device swiglu", servd_cuda_swiglu, out, gate, up);
}

int servd_device_add(servd_tensor *out, const servd_tensor *a, const servd_tensor *b) {
  return elementwise("device add", servd_cuda_add, out, a, b);
}

int servd_device_add_rmsnorm(servd_tensor *x, const servd_tensor *o, servd_tensor *out, const servd_tensor *weight,
                             float eps) {
  const char *op = "device add_rmsnorm";
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
  servd_cuda_ctx *c;
  TRY(servd__dev_ctx(op, device, &c));
  return servd__dev_wrap(servd_cuda_fused_check(c, report, cap), op);
}

int servd_device_argmax(servd_tensor *out, const servd_tensor *x) {
  const char *op = "device argmax";
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_argmax(out, x), x, &c));
  return servd__dev_wrap(servd_cuda_argmax(c, DATA(out), DATA(x), (int)x->shape[0], (int)x->shape[1]), op);
}

int servd_device_topk(servd_tensor *values, servd_tensor *indices, const servd_tensor *x, int k) {
  const char *op = "device topk";
  servd_cuda_ctx *c;
  TRY(checked_ctx(op, servd__dev_check_topk(values, indices, x, k), x, &c));
  return servd__dev_wrap(
      servd_cuda_topk(c, DATA(values), DATA(indices), DATA(x), (int)x->shape[0], (int)x->shape[1], k), op);
}

/* ANYT rows of servd/ops.def: the generic checks, then the op's tensor-level launcher (<name>.cu). */
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANYT_##dispatch(int servd_device_##name(SERVD__PARAMS(sig, names)) { \
    SERVD__DEV_CHECK_ANYT(name, sig, names); \
    const servd_tensor *first_[] = {SERVD__EACH(sig, SERVD__DEV_TENSOR_OF, names)}; \
    servd_cuda_ctx *c; \
    TRY(servd__dev_ctx("device " #name, first_[0]->device, &c)); \
    return servd__dev_wrap(servd_cuda_##name(c, SERVD__ARGS(names)), "device " #name); \
  })
#include "servd/ops.def"
#undef SERVD_OP
