/* The host table's ops: the CPU kernel or the device op, by where the tensors are (op_dispatch.h). */
#include "op_dispatch.h"

#include <stdio.h>
#include <string.h>

typedef struct arg {
  const char *name;
  const servd_tensor *t;
} arg;
#define A(x) \
  { #x, x }
#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int dev_of(const servd_tensor *t) { return t->device < 0 ? -1 : t->device; }

static const char *dev_name(int d, char *buf, size_t cap) {
  if (d < 0) return "the cpu";
  snprintf(buf, cap, "cuda:%d", d);
  return buf;
}

/* The device every tensor of a is on (-1: the host), or SERVD_EINVAL naming the first that differs. */
static int where(const char *op, const arg *a, int n, int *device) {
  for (int i = 0; i < n; i++)
    if (!a[i].t) return servd_fail(SERVD_EINVAL, "%s: %s is NULL", op, a[i].name);
  int d = dev_of(a[0].t);
  for (int i = 1; i < n; i++) {
    int di = dev_of(a[i].t);
    if (di != d) {
      char b0[24], b1[24];
      return servd_fail(SERVD_EINVAL, "%s: %s is on %s but %s is on %s", op, a[0].name, dev_name(d, b0, sizeof b0),
                        a[i].name, dev_name(di, b1, sizeof b1));
    }
  }
  *device = d;
  return 0;
}

/* For ops whose other operand (a host cache, a host communicator) lives on the host. */
static int host_only(const char *op, const arg *a, int n, const char *what) {
  int d;
  int rc = where(op, a, n, &d);
  if (rc < 0) return rc;
  if (d >= 0) return servd_fail(SERVD_EINVAL, "%s: %s is on cuda:%d but %s", op, a[0].name, d, what);
  return 0;
}

/* For ops on a device object of device `want` (-1: any device, taken from the tensors). */
static int device_only(const char *op, const arg *a, int n, int want, const char *what) {
  int d;
  int rc = where(op, a, n, &d);
  if (rc < 0) return rc;
  if (d < 0 || (want >= 0 && d != want)) {
    char b0[24];
    return servd_fail(SERVD_EINVAL, "%s: %s is on %s but %s", op, a[0].name, dev_name(d, b0, sizeof b0), what);
  }
  return 0;
}

/* ANY/ANYT rows of servd/ops.def: every tensor parameter on one device (or all on the host), then the
 * CPU op or the device op. */
#define ARG_OF(t) {#t, t},
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANY_##dispatch(int servd_op__##name(SERVD__PARAMS(sig, names)) { \
    const arg args_[] = {SERVD__EACH(sig, ARG_OF, names)}; /* not `a`: add's parameter */ \
    int d, rc = where(#name, args_, N(args_), &d); \
    return rc < 0 ? rc : d < 0 ? servd_##name(SERVD__ARGS(names)) : servd_device_##name(SERVD__ARGS(names)); \
  })
#include "servd/ops.def"
#undef SERVD_OP

/* ---- HAND rows ---------------------------------------------------------------------------------- */
int servd_op__add_rmsnorm(servd_tensor *x, const servd_tensor *o, servd_tensor *out, const servd_tensor *weight,
                          float eps) {
  const arg a[] = {A(x), A(o), A(out), A(weight)};
  int d = -1, rc = where("add_rmsnorm", a, N(a), &d);
  if (rc < 0) return rc;
  if (servd_tensor_data(out) == servd_tensor_data(x))
    return servd_fail(SERVD_EINVAL, "add_rmsnorm: out must not be x (x keeps the sum)");
  if (d >= 0) return servd_device_add_rmsnorm(x, o, out, weight, eps);
  rc = servd_add(x, x, o);
  return rc < 0 ? rc : servd_rmsnorm(out, x, weight, eps);
}

int servd_op__matmul_many(int count, servd_tensor *const *outs, const servd_tensor *x, const servd_tensor *const *ws) {
  if (count < 1 || count > SERVD_DEVICE_MATMUL_MANY_MAX)
    return servd_fail(SERVD_EINVAL, "matmul_many: %d weights (1..%d)", count, SERVD_DEVICE_MATMUL_MANY_MAX);
  arg a[1 + 2 * SERVD_DEVICE_MATMUL_MANY_MAX] = {A(x)};
  for (int i = 0; i < count; i++) {
    a[1 + 2 * i] = (arg){"out", outs[i]};
    a[2 + 2 * i] = (arg){"w", ws[i]};
  }
  int d = -1, rc = where("matmul_many", a, 1 + 2 * count, &d);
  if (rc < 0) return rc;
  return d < 0 ? servd_matmul_many(count, outs, x, ws) : servd_device_matmul_many(count, outs, x, ws);
}

/* Host: one split of every segment (servd_lora_sgmv). Device: servd_device_lora per segment, on views
 * of its rows. */
int servd_op__lora_sgmv(servd_tensor *out, const servd_tensor *x, int n_segs, const servd_lora_seg *segs) {
  const arg a[] = {A(out), A(x)};
  int d = -1, rc = where("lora_sgmv", a, N(a), &d);
  if (rc < 0) return rc;
  if (d < 0) return servd_lora_sgmv(out, x, n_segs, segs);
  for (int i = 0; i < n_segs && rc == 0; i++) {
    if (!segs[i].ab || segs[i].n == 0) continue;
    servd_tensor *o = servd_tensor_narrow(out, 0, segs[i].first, segs[i].n);
    servd_tensor *xi = servd_tensor_narrow(x, 0, segs[i].first, segs[i].n);
    rc = o && xi ? servd_op__lora(o, xi, segs[i].ab, segs[i].scale)
                 : servd_fail(SERVD_EINVAL, "lora_sgmv: %s", servd_last_error());
    servd_tensor_release(o);
    servd_tensor_release(xi);
  }
  return rc;
}

int servd_op__softmax(servd_tensor *x, float scale) {
  const arg a[] = {A(x)};
  int rc = host_only("softmax", a, N(a), "softmax runs on the host only (sample on the device with argmax/topk)");
  return rc < 0 ? rc : servd_softmax(x, scale);
}

int servd_op__kv_write(servd_kv_cache *c, int layer, const servd_tensor *k, const servd_tensor *v,
                       const servd_tensor *slots) {
  const arg a[] = {A(k), A(v), A(slots)};
  int rc = host_only("kv_write", a, N(a), "the KV cache is on the cpu");
  return rc < 0 ? rc : servd_kv_write(c, layer, k, v, slots);
}

int servd_op__attention(servd_tensor *out, const servd_tensor *q, const servd_kv_cache *c, int layer,
                        const servd_attn_batch *b, int n_heads, float scale) {
  const arg a[] = {A(out), A(q)};
  int rc = host_only("attention", a, N(a), "the KV cache is on the cpu");
  return rc < 0 ? rc : servd_attention(out, q, c, layer, b, n_heads, scale);
}

int servd_op__attention_window(servd_tensor *out, const servd_tensor *q, const servd_kv_cache *c, int layer,
                               const servd_attn_batch *b, int n_heads, float scale, int window) {
  const arg a[] = {A(out), A(q)};
  int rc = host_only("attention", a, N(a), "the KV cache is on the cpu");
  return rc < 0 ? rc : servd_attention_window(out, q, c, layer, b, n_heads, scale, window);
}

int servd_op__allreduce_sum(servd_comm *c, int rank, servd_tensor *x) {
  const arg a[] = {A(x)};
  int rc = host_only("allreduce", a, N(a), "the communicator is for host tensors");
  return rc < 0 ? rc : servd_allreduce_sum(c, rank, x);
}

int servd_op__allgather_cols(servd_comm *c, int rank, servd_tensor *out, const servd_tensor *x) {
  const arg a[] = {A(out), A(x)};
  int rc = host_only("allgather_cols", a, N(a), "the communicator is for host tensors");
  return rc < 0 ? rc : servd_allgather_cols(c, rank, out, x);
}

int servd_op__device_kv_write(servd_device_kv *kv, int layer, const servd_tensor *k, const servd_tensor *v,
                              const servd_tensor *slots) {
  if (!kv) return servd_fail(SERVD_EINVAL, "kv_write: no device KV cache");
  int kd = servd_device_kv_device(kv);
  char what[48];
  snprintf(what, sizeof what, "the KV cache is on cuda:%d", kd);
  const arg a[] = {A(k), A(v), A(slots)};
  int rc = device_only("kv_write", a, N(a), kd, what);
  return rc < 0 ? rc : servd_device_kv_write(kv, layer, k, v, slots);
}

int servd_op__device_attention(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                               const servd_device_batch *db, int n_heads, float scale) {
  if (!kv || !db) return servd_fail(SERVD_EINVAL, "attention: the step has no device %s", kv ? "batch" : "KV cache");
  int kd = servd_device_kv_device(kv);
  char what[48];
  snprintf(what, sizeof what, "the KV cache is on cuda:%d", kd);
  const arg a[] = {A(out), A(q)};
  int rc = device_only("attention", a, N(a), kd, what);
  return rc < 0 ? rc : servd_device_attention(out, q, kv, layer, db, n_heads, scale);
}

int servd_op__device_attention_window(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                                      const servd_device_batch *db, int n_heads, float scale, int window) {
  if (!kv || !db) return servd_fail(SERVD_EINVAL, "attention: the step has no device %s", kv ? "batch" : "KV cache");
  int kd = servd_device_kv_device(kv);
  char what[48];
  snprintf(what, sizeof what, "the KV cache is on cuda:%d", kd);
  const arg a[] = {A(out), A(q)};
  int rc = device_only("attention", a, N(a), kd, what);
  return rc < 0 ? rc : servd_device_attention_window(out, q, kv, layer, db, n_heads, scale, window);
}

int servd_op__device_allreduce_sum(servd_device_comm *c, int rank, servd_tensor *x) {
  const arg a[] = {A(x)};
  int rc = device_only("allreduce", a, N(a), -1, "the communicator is for device tensors");
  return rc < 0 ? rc : servd_device_allreduce_sum(c, rank, x);
}

int servd_op__device_allgather_cols(servd_device_comm *c, int rank, servd_tensor *out, const servd_tensor *x) {
  const arg a[] = {A(out), A(x)};
  int rc = device_only("allgather_cols", a, N(a), -1, "the communicator is for device tensors");
  return rc < 0 ? rc : servd_device_allgather_cols(c, rank, out, x);
}

/* Host to host: row by row of the innermost dimension (the only one guaranteed contiguous). */
static int host_copy(servd_tensor *dst, const servd_tensor *src) {
  int nd = src->ndim;
  size_t row = nd ? servd_dtype_row_bytes(src->dtype, src->shape[nd - 1]) : servd_dtype_block_bytes(src->dtype);
  if (nd && src->shape[nd - 1] && !row) {
    char msg[512]; /* servd_fail writes the buffer servd_last_error returns: copy it first */
    snprintf(msg, sizeof msg, "%s", servd_last_error());
    return servd_fail(SERVD_EINVAL, "copy: %s", msg);
  }
  int64_t outer = 1;
  for (int d = 0; d + 1 < nd; d++) outer *= src->shape[d];
  char *dp = servd_tensor_data(dst);
  const char *sp = servd_tensor_data(src);
  for (int64_t r = 0; r < outer && row; r++) {
    int64_t rem = r, doff = 0, soff = 0;
    for (int d = nd - 2; d >= 0; d--) {
      int64_t i = rem % src->shape[d];
      rem /= src->shape[d];
      doff += i * dst->strides[d];
      soff += i * src->strides[d];
    }
    memmove(dp + doff, sp + soff, row);
  }
  return 0;
}

int servd_op__copy(servd_tensor *dst, const servd_tensor *src) {
  if (!dst || !src) return servd_fail(SERVD_EINVAL, "copy: %s is NULL", dst ? "src" : "dst");
  if (dst->dtype != src->dtype || dst->ndim != src->ndim ||
      memcmp(dst->shape, src->shape, sizeof(int64_t) * (size_t)src->ndim) != 0) {
    char a[96], b[96];
    return servd_fail(SERVD_EINVAL, "copy: dst %s and src %s differ (same dtype and shape expected)",
                      servd_tensor_describe(dst, a, sizeof a), servd_tensor_describe(src, b, sizeof b));
  }
  /* host storage that is not owned is a mapping of the package's weights: read-only */
  if (dst->device < 0 && servd_storage_get_kind(dst->storage) != SERVD_STORAGE_OWNED)
    return servd_fail(SERVD_EINVAL, "copy: dst is read-only (borrowed storage, e.g. package weights)");
  if (dst->device < 0 && src->device < 0) return host_copy(dst, src);
  return servd_device_copy(dst, src);
}
