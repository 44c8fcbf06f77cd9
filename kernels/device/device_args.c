/* Argument checks of the device API, done before any CUDA call (and in the build without CUDA), so
 * a caller's mistake gives the same SERVD_EINVAL and message whether or not a GPU is present. */
#include <stdio.h>

#include "device_internal.h"
#include "servd/cuda_blocks.h"
#include "servd/dtype_traits.h"

const char *servd__dev_describe(const servd_tensor *t, char *buf, size_t cap) {
  char d[96];
  if (!t) {
    snprintf(buf, cap, "NULL");
    return buf;
  }
  servd_tensor_describe(t, d, sizeof d);
  if (t->device >= 0) snprintf(buf, cap, "%s on cuda:%d", d, t->device);
  else snprintf(buf, cap, "%s on the host", d);
  return buf;
}

int servd__dev_wrap(int rc, const char *op) {
  if (rc == 0) return 0;
  char msg[512]; /* servd_fail writes the buffer servd_last_error returns: copy it first */
  snprintf(msg, sizeof msg, "%s", servd_last_error());
  return servd_fail(rc, "%s: %s", op, msg);
}

/* What an upload into each dtype takes; 0: nothing (not a device dtype to upload into). A block dtype
 * has a row once a device op reads its blocks (dequantize.cu; the GPU matmul: those that
 * servd/cuda_blocks.h decodes): its packed rows go up as they are. */
enum { UP_CONVERT = 1 /* converted from any dtype but i32 */, UP_SAME /* from its own dtype, as it is */ };
static const unsigned char upload_of[SERVD_DTYPE_COUNT] = {
    [SERVD_F32] = UP_CONVERT, [SERVD_BF16] = UP_CONVERT, [SERVD_I32] = UP_SAME,  [SERVD_Q8_0] = UP_SAME,
    [SERVD_Q4_0] = UP_SAME,   [SERVD_Q4_1] = UP_SAME,    [SERVD_Q5_0] = UP_SAME, [SERVD_Q5_1] = UP_SAME,
    [SERVD_Q4_K] = UP_SAME,   [SERVD_Q5_K] = UP_SAME,    [SERVD_Q6_K] = UP_SAME,
};

/* The weight dtypes of the device matmul: bf16, and the blocks the GPU GEMV decodes. */
static const char *matmul_weight_name(servd_dtype t) {
  return t == SERVD_BF16 || servd_qb_supported((int)t) ? servd_dtype_name(t) : NULL;
}

/* Block dtypes live on a device as their packed rows (uploaded as they are, read by ops that take them,
 * e.g. dequantize); copies to and from devices refuse them (servd__dev_check_copy). */
static bool device_dtype(servd_dtype t) {
  return t == SERVD_BF16 || t == SERVD_F32 || t == SERVD_I32 || servd_dtype_is_quantized(t);
}

int servd__dev_check_new(const char *op, servd_dtype dtype, int ndim, const int64_t *shape) {
  if (!device_dtype(dtype))
    return servd_fail(SERVD_EINVAL, "%s: dtype %s (%d) is not a device dtype (bf16, f32, i32, block dtypes)", op,
                      servd_dtype_name(dtype), (int)dtype);
  if (ndim < 0 || ndim > SERVD_MAX_DIMS || (ndim > 0 && !shape))
    return servd_fail(SERVD_EINVAL, "%s: ndim %d outside [0, %d]", op, ndim, SERVD_MAX_DIMS);
  uint64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return servd_fail(SERVD_EINVAL, "%s: dimension %d is negative (%lld)", op, i, (long long)shape[i]);
    if (shape[i] && n > ((uint64_t)1 << 50) / (uint64_t)shape[i])
      return servd_fail(SERVD_ERANGE, "%s: shape overflows (dimension %d = %lld)", op, i, (long long)shape[i]);
    n *= (uint64_t)shape[i];
  }
  if (servd_dtype_is_quantized(dtype) && (ndim < 1 || shape[ndim - 1] % (int64_t)servd_dtype_block_elems(dtype)))
    return servd_fail(SERVD_EINVAL, "%s: a %s tensor needs an innermost dimension that is a multiple of %zu", op,
                      servd_dtype_name(dtype), servd_dtype_block_elems(dtype));
  return SERVD_OK;
}

int servd__dev_check_upload(const char *op, const servd_tensor *host, servd_dtype dtype) {
  char b[128];
  if (!host) return servd_fail(SERVD_EINVAL, "%s: NULL host tensor", op);
  if (host->device >= 0)
    return servd_fail(SERVD_EINVAL, "%s: source %s is not on the host", op, servd__dev_describe(host, b, sizeof b));
  if ((unsigned)host->dtype >= SERVD_DTYPE_COUNT || host->ndim < 0 || host->ndim > SERVD_MAX_DIMS)
    return servd_fail(SERVD_EINVAL, "%s: source tensor has dtype %d and ndim %d", op, (int)host->dtype, host->ndim);
  const int up = (unsigned)dtype < SERVD_DTYPE_COUNT ? upload_of[dtype] : 0;
  if (!up)
    return servd_fail(SERVD_EINVAL, "%s: dtype %s (%d) is not a device dtype (bf16, f32, i32)", op,
                      servd_dtype_name(dtype), (int)dtype);
  if (up == UP_CONVERT ? host->dtype == SERVD_I32 : host->dtype != dtype)
    return servd_fail(
        SERVD_EINVAL,
        "%s: cannot convert %s to %s (bf16/f32 from float and block dtypes, i32 from i32, block dtypes as they are)",
        op, servd__dev_describe(host, b, sizeof b), servd_dtype_name(dtype));
  return SERVD_OK;
}

int servd__dev_check_tensor(const char *op, const char *name, const servd_tensor *t, int dtype) {
  char b[128];
  if (!t) return servd_fail(SERVD_EINVAL, "%s: %s is NULL", op, name);
  if (t->device < 0 || !t->storage)
    return servd_fail(SERVD_EINVAL, "%s: %s %s is not a device tensor", op, name, servd__dev_describe(t, b, sizeof b));
  if (dtype >= 0 && t->dtype != (servd_dtype)dtype)
    return servd_fail(SERVD_EINVAL, "%s: %s %s must be %s", op, name, servd__dev_describe(t, b, sizeof b),
                      servd_dtype_name((servd_dtype)dtype));
  if (!device_dtype(t->dtype))
    return servd_fail(SERVD_EINVAL, "%s: %s %s has no device dtype", op, name, servd__dev_describe(t, b, sizeof b));
  if (!servd_tensor_is_contiguous(t))
    return servd_fail(SERVD_EINVAL, "%s: %s %s is not contiguous (device ops take contiguous tensors)", op, name,
                      servd__dev_describe(t, b, sizeof b));
  return SERVD_OK;
}

int servd__dev_check_same(const char *op, const servd_tensor *const *ts, int n) {
  char a[128], b[128];
  for (int i = 1; i < n; i++)
    if (ts[i] && ts[i]->device != ts[0]->device)
      return servd_fail(SERVD_EINVAL, "%s: tensors on different devices: %s and %s", op,
                        servd__dev_describe(ts[0], a, sizeof a), servd__dev_describe(ts[i], b, sizeof b));
  return SERVD_OK;
}

#define TRY(x) \
  do { \
    int rc_ = (x); \
    if (rc_ != 0) return rc_; \
  } while (0)

/* One tensor argument: its name in messages and the dtype it must have (-1: any device dtype). */
typedef struct dev_arg {
  const char *name;
  const servd_tensor *t;
  int dtype;
} dev_arg;

/* Checks each argument with servd__dev_check_tensor, in order, then that all are on one device. */
static int check_args(const char *op, const dev_arg *args, int n) {
  const servd_tensor *ts[4];
  for (int i = 0; i < n; i++) {
    TRY(servd__dev_check_tensor(op, args[i].name, args[i].t, args[i].dtype));
    ts[i] = args[i].t;
  }
  return servd__dev_check_same(op, ts, n);
}
#define CHECK_ARGS(op, ...) \
  check_args(op, (const dev_arg[]){__VA_ARGS__}, (int)(sizeof((const dev_arg[]){__VA_ARGS__}) / sizeof(dev_arg)))

static int64_t cols(const servd_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }
static int64_t rows(const servd_tensor *t) {
  int64_t c = cols(t);
  return c ? servd_tensor_numel(t) / c : 0;
}

int servd__dev_check_matmul(servd_tensor *out, const servd_tensor *x, const servd_tensor *w) {
  const char *op = "device matmul";
  char a[128], b[128], c[128];
  TRY(CHECK_ARGS(op, {"x", x, SERVD_BF16}, {"w", w, -1}, {"out", out, -1}));
  if (out->dtype != SERVD_BF16 && out->dtype != SERVD_F32)
    return servd_fail(SERVD_EINVAL, "%s: out %s must be bf16 or f32", op, servd__dev_describe(out, a, sizeof a));
  /* quantized weights stay as their blocks: servd_cuda_matmul_quant reads these */
  if (!matmul_weight_name(w->dtype))
    return servd_fail(SERVD_EINVAL, "%s: w %s must be %s", op, servd__dev_describe(w, a, sizeof a),
                      servd_dtype_list(b, sizeof b, matmul_weight_name, ", ", " or "));
  if (x->ndim != 2 || w->ndim != 2 || out->ndim != 2 || x->shape[1] != w->shape[1] || out->shape[0] != x->shape[0] ||
      out->shape[1] != w->shape[0])
    return servd_fail(SERVD_EINVAL, "%s: out %s = x %s @ w^T %s: expected x (m,k), w (n,k), out (m,n)", op,
                      servd__dev_describe(out, a, sizeof a), servd__dev_describe(x, b, sizeof b),
                      servd__dev_describe(w, c, sizeof c));
  if (x->shape[0] > INT32_MAX || w->shape[0] > INT32_MAX || x->shape[1] > INT32_MAX)
    return servd_fail(SERVD_ERANGE, "%s: dimensions of x %s, w %s exceed int", op, servd__dev_describe(x, a, sizeof a),
                      servd__dev_describe(w, b, sizeof b));
  if (x->shape[1] % 8)
    return servd_fail(SERVD_EINVAL, "%s: k = %lld must be a multiple of 8 (x %s)", op, (long long)x->shape[1],
                      servd__dev_describe(x, a, sizeof a));
  return SERVD_OK;
}

int servd__dev_check_embedding(servd_tensor *out, const servd_tensor *table, const servd_tensor *ids,
                               int64_t row_offset) {
  const char *op = "device embedding";
  char a[128], b[128], c[128];
  TRY(CHECK_ARGS(op, {"out", out, SERVD_BF16}, {"table", table, SERVD_BF16}, {"ids", ids, SERVD_I32}));
  if (table->ndim != 2 || ids->ndim != 1 || out->ndim != 2 || out->shape[0] != ids->shape[0] ||
      out->shape[1] != table->shape[1] || table->shape[0] == 0 || table->shape[1] == 0)
    return servd_fail(SERVD_EINVAL, "%s: out %s, table %s, ids %s: expected table (rows,d), ids (m), out (m,d)", op,
                      servd__dev_describe(out, a, sizeof a), servd__dev_describe(table, b, sizeof b),
                      servd__dev_describe(ids, c, sizeof c));
  if (ids->shape[0] > INT32_MAX || table->shape[1] > INT32_MAX || row_offset < 0)
    return servd_fail(SERVD_ERANGE, "%s: %lld ids, d %lld, row_offset %lld out of range", op, (long long)ids->shape[0],
                      (long long)table->shape[1], (long long)row_offset);
  return SERVD_OK;
}

int servd__dev_check_rmsnorm(servd_tensor *out, const servd_tensor *x, const servd_tensor *w, float eps) {
  (void)eps; /* any eps: the kernel adds it as given */
  const char *op = "device rmsnorm";
  char a[128], b[128], c[128];
  TRY(CHECK_ARGS(op, {"out", out, SERVD_BF16}, {"x", x, SERVD_BF16}, {"weight", w, SERVD_BF16}));
  int64_t d = cols(x);
  if (x->ndim < 1 || out->ndim != x->ndim || servd_tensor_numel(out) != servd_tensor_numel(x) || cols(out) != d ||
      w->ndim != 1 || w->shape[0] != d || d == 0)
    return servd_fail(SERVD_EINVAL, "%s: out %s, x %s, weight %s: expected x (m,d), out like x, weight (d)", op,
                      servd__dev_describe(out, a, sizeof a), servd__dev_describe(x, b, sizeof b),
                      servd__dev_describe(w, c, sizeof c));
  if (rows(x) > INT32_MAX || d > INT32_MAX)
    return servd_fail(SERVD_ERANGE, "%s: x %s too large", op, servd__dev_describe(x, a, sizeof a));
  return SERVD_OK;
}

int servd__dev_check_rope(servd_tensor *x, const servd_tensor *positions, const servd_rope_params *p) {
  const char *op = "device rope";
  char a[128], b[128];
  TRY(CHECK_ARGS(op, {"x", x, SERVD_BF16}, {"positions", positions, SERVD_I32}));
  if (!p) return servd_fail(SERVD_EINVAL, "%s: NULL parameters", op);
  if (p->head_dim <= 0 || p->head_dim % 2 || (p->layout != SERVD_ROPE_INTERLEAVED && p->layout != SERVD_ROPE_HALF))
    return servd_fail(SERVD_EINVAL, "%s: head_dim %d (positive, even), layout %d", op, p->head_dim, (int)p->layout);
  int64_t m = x->ndim ? x->shape[0] : 0, width = m ? servd_tensor_numel(x) / m : 0;
  if (x->ndim < 2 || x->ndim > 3 || positions->ndim != 1 || positions->shape[0] != m || width % p->head_dim)
    return servd_fail(SERVD_EINVAL,
                      "%s: x %s, positions %s, head_dim %d: expected x (m, n_heads*head_dim) or "
                      "(m, n_heads, head_dim), positions (m)",
                      op, servd__dev_describe(x, a, sizeof a), servd__dev_describe(positions, b, sizeof b),
                      p->head_dim);
  if (m > INT32_MAX || width / p->head_dim > INT32_MAX)
    return servd_fail(SERVD_ERANGE, "%s: x %s too large", op, servd__dev_describe(x, a, sizeof a));
  return SERVD_OK;
}

int servd__dev_check_binary(const char *op, const servd_tensor *out, const servd_tensor *a, const servd_tensor *b) {
  char x[128], y[128], z[128];
  TRY(CHECK_ARGS(op, {"out", out, SERVD_BF16}, {"a", a, SERVD_BF16}, {"b", b, SERVD_BF16}));
  bool same = out->ndim == a->ndim && a->ndim == b->ndim;
  for (int i = 0; same && i < a->ndim; i++) same = out->shape[i] == a->shape[i] && a->shape[i] == b->shape[i];
  if (!same)
    return servd_fail(SERVD_EINVAL, "%s: out %s, a %s, b %s must have the same shape", op,
                      servd__dev_describe(out, x, sizeof x), servd__dev_describe(a, y, sizeof y),
                      servd__dev_describe(b, z, sizeof z));
  return SERVD_OK;
}

int servd__dev_check_swiglu(servd_tensor *out, const servd_tensor *gate, const servd_tensor *up) {
  return servd__dev_check_binary("device swiglu", out, gate, up);
}

int servd__dev_check_add(servd_tensor *out, const servd_tensor *a, const servd_tensor *b) {
  return servd__dev_check_binary("device add", out, a, b);
}

int servd__dev_check_argmax(servd_tensor *out, const servd_tensor *x) {
  const char *op = "device argmax";
  char a[128], b[128];
  TRY(CHECK_ARGS(op, {"out", out, SERVD_I32}, {"x", x, SERVD_F32}));
  if (x->ndim != 2 || out->ndim != 1 || out->shape[0] != x->shape[0] || x->shape[1] == 0 || x->shape[0] > INT32_MAX ||
      x->shape[1] > INT32_MAX)
    return servd_fail(SERVD_EINVAL, "%s: out %s, x %s: expected x (m,n) with n > 0, out (m)", op,
                      servd__dev_describe(out, a, sizeof a), servd__dev_describe(x, b, sizeof b));
  return SERVD_OK;
}

int servd__dev_check_topk(servd_tensor *values, servd_tensor *indices, const servd_tensor *x, int k) {
  const char *op = "device topk";
  char a[128], b[128], c[128];
  TRY(CHECK_ARGS(op, {"values", values, SERVD_F32}, {"indices", indices, SERVD_I32}, {"x", x, SERVD_F32}));
  if (x->ndim != 2 || x->shape[0] > INT32_MAX || x->shape[1] > INT32_MAX || k < 1 || k > 64 || k > x->shape[1] ||
      values->ndim != 2 || indices->ndim != 2 || values->shape[0] != x->shape[0] || values->shape[1] != k ||
      indices->shape[0] != x->shape[0] || indices->shape[1] != k)
    return servd_fail(SERVD_EINVAL,
                      "%s: values %s, indices %s, x %s, k %d: expected x (m,n), 1 <= k <= min(64,n), "
                      "values and indices (m,k)",
                      op, servd__dev_describe(values, a, sizeof a), servd__dev_describe(indices, b, sizeof b),
                      servd__dev_describe(x, c, sizeof c), k);
  return SERVD_OK;
}

int servd__dev_check_tensors(const char *op, const char *const *names, const servd_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++) TRY(servd__dev_check_tensor(op, names[i], ts[i], -1));
  return servd__dev_check_same(op, ts, n);
}

int servd__dev_check_copy(const servd_tensor *dst, const servd_tensor *src) {
  const char *op = "device_copy";
  char a[128], b[128];
  if (!dst || !src) return servd_fail(SERVD_EINVAL, "%s: NULL tensor", op);
  if (dst->device < 0 && src->device < 0)
    return servd_fail(SERVD_EINVAL, "%s: both %s and %s are on the host (use a host copy)", op,
                      servd__dev_describe(dst, a, sizeof a), servd__dev_describe(src, b, sizeof b));
  bool same = dst->dtype == src->dtype && dst->ndim == src->ndim && (unsigned)dst->dtype < SERVD_DTYPE_COUNT &&
              dst->ndim >= 0 && dst->ndim <= SERVD_MAX_DIMS;
  for (int i = 0; same && i < dst->ndim; i++) same = dst->shape[i] == src->shape[i];
  if (!same)
    return servd_fail(SERVD_EINVAL, "%s: dst %s and src %s must have the same dtype and shape", op,
                      servd__dev_describe(dst, a, sizeof a), servd__dev_describe(src, b, sizeof b));
  if (servd_dtype_is_quantized(dst->dtype))
    return servd_fail(SERVD_EINVAL, "%s: %s: block dtypes are not copied to or from devices (upload converts them)", op,
                      servd__dev_describe(src, a, sizeof a));
  /* Copies go as 2D slabs (rows of the second-innermost dimension at one pitch); negative pitches
   * cannot be expressed. */
  const servd_tensor *ts[] = {dst, src};
  for (int j = 0; j < 2; j++)
    for (int i = 0; i + 1 < ts[j]->ndim; i++)
      if (ts[j]->strides[i] < 0 && ts[j]->shape[i] > 1)
        return servd_fail(SERVD_EUNSUPPORTED, "%s: %s %s has a negative stride", op, j ? "src" : "dst",
                          servd__dev_describe(ts[j], a, sizeof a));
  return SERVD_OK;
}

int servd__dev_check_kv(const char *op, int n_layers, int kv_dim, int block_size, int n_blocks) {
  if (n_layers < 1 || kv_dim < 1 || block_size < 1 || n_blocks < 1)
    return servd_fail(SERVD_EINVAL, "%s: n_layers %d, kv_dim %d, block_size %d, n_blocks %d must all be positive", op,
                      n_layers, kv_dim, block_size, n_blocks);
  if ((int64_t)n_blocks * block_size > INT32_MAX)
    return servd_fail(SERVD_ERANGE, "%s: %d blocks of %d slots exceed int32 slot ids", op, n_blocks, block_size);
  return SERVD_OK;
}

int servd__dev_check_batch(const char *op, int max_tokens, int max_seqs, int max_blocks_per_seq) {
  if (max_tokens < 1 || max_seqs < 1 || max_blocks_per_seq < 1)
    return servd_fail(SERVD_EINVAL, "%s: max_tokens %d, max_seqs %d, max_blocks_per_seq %d must all be positive", op,
                      max_tokens, max_seqs, max_blocks_per_seq);
  if ((int64_t)max_seqs * max_blocks_per_seq > (1 << 28))
    return servd_fail(SERVD_ERANGE, "%s: block table of %d x %d entries is too large", op, max_seqs,
                      max_blocks_per_seq);
  return SERVD_OK;
}

int servd__dev_check_comm(const char *op, int world_size, const int *devices) {
  if (world_size < 1 || world_size > 64 || !devices)
    return servd_fail(SERVD_EINVAL, "%s: world_size %d (1..64) with %s devices", op, world_size,
                      devices ? "the" : "NULL");
  for (int r = 0; r < world_size; r++) {
    if (devices[r] < 0) return servd_fail(SERVD_EINVAL, "%s: rank %d has device %d", op, r, devices[r]);
    for (int q = 0; q < r; q++)
      if (devices[q] == devices[r])
        return servd_fail(SERVD_EINVAL, "%s: ranks %d and %d both on device %d (one rank per GPU)", op, q, r,
                          devices[r]);
  }
  return SERVD_OK;
}
