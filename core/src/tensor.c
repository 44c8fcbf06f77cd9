/* dtypes, refcounted storage and tensor views. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/dtype_traits.h"
#include "servd/tensor.h"

#define SERVD__UNPAREN(...) __VA_ARGS__
/* One row per row of servd/dtypes.def; the count of scales is that of their names. */
static const servd_dtype_traits dtypes[] = {
#define SERVD_DTYPE(ID, value, name_, elems, bytes, ggml, scales_) \
  [SERVD_##ID] = { \
      .name = #name_, \
      .block_elems = elems, \
      .block_bytes = bytes, \
      .ggml_type = ggml, \
      .n_scales = \
          (int)(sizeof((servd_dtype_scale[]){{0, NULL}, SERVD__UNPAREN scales_}) / sizeof(servd_dtype_scale)) - 1, \
      .scales = {SERVD__UNPAREN scales_}},
#include "servd/dtypes.def"
};
_Static_assert(sizeof dtypes / sizeof dtypes[0] == SERVD_DTYPE_COUNT, "one traits row per dtype");

/* Rows in value order with none skipped: a row's value is its position. */
enum {
#define SERVD_DTYPE(ID, ...) ROW_##ID,
#include "servd/dtypes.def"
};
#define SERVD_DTYPE(ID, ...) _Static_assert(SERVD_##ID == (int)ROW_##ID, "servd/dtypes.def: rows in value order");
#include "servd/dtypes.def"

static bool dtype_ok(servd_dtype t) { return (unsigned)t < SERVD_DTYPE_COUNT; }

const servd_dtype_traits *servd_dtype_get_traits(servd_dtype t) { return dtype_ok(t) ? &dtypes[t] : NULL; }

const char *servd_dtype_name(servd_dtype t) { return dtype_ok(t) ? dtypes[t].name : "invalid"; }

const char *servd_dtype_quantized_name(servd_dtype t) { return servd_dtype_is_quantized(t) ? dtypes[t].name : NULL; }

const char *servd_dtype_list(char *buf, size_t cap, const char *(*name_of)(servd_dtype t), const char *sep,
                             const char *last_sep) {
  const char *names[SERVD_DTYPE_COUNT];
  int n = 0;
  for (int i = 0; i < SERVD_DTYPE_COUNT; i++) {
    const char *name = name_of ? name_of((servd_dtype)i) : dtypes[i].name;
    if (name) names[n++] = name;
  }
  size_t len = 0;
  if (cap) buf[0] = '\0';
  for (int i = 0; i < n && len < cap; i++) {
    const int k = snprintf(buf + len, cap - len, "%s%s", i == 0 ? "" : i == n - 1 ? last_sep : sep, names[i]);
    if (k < 0) break;
    len += (size_t)k;
  }
  return buf;
}

int servd_dtype_from_name(const char *name, servd_dtype *out) {
  for (int i = 0; name && i < SERVD_DTYPE_COUNT; i++) {
    if (strcmp(name, dtypes[i].name) == 0) {
      *out = (servd_dtype)i;
      return 0;
    }
  }
  char names[256];
  return servd_fail(SERVD_EINVAL, "dtype: unknown name '%s' (expected %s)", name ? name : "(null)",
                    servd_dtype_list(names, sizeof names, NULL, " ", " "));
}

int servd_dtype_from_ggml(uint32_t ggml_type, servd_dtype *out) {
  for (int i = 0; i < SERVD_DTYPE_COUNT; i++) {
    if (dtypes[i].ggml_type >= 0 && (uint32_t)dtypes[i].ggml_type == ggml_type) {
      *out = (servd_dtype)i;
      return 0;
    }
  }
  return SERVD_EUNSUPPORTED;
}

size_t servd_dtype_block_elems(servd_dtype t) { return dtype_ok(t) ? dtypes[t].block_elems : 0; }
size_t servd_dtype_block_bytes(servd_dtype t) { return dtype_ok(t) ? dtypes[t].block_bytes : 0; }
bool servd_dtype_is_quantized(servd_dtype t) { return dtype_ok(t) && dtypes[t].block_elems > 1; }

/* 0 (and a recorded error) when n is negative or not a whole number of blocks. */
size_t servd_dtype_row_bytes(servd_dtype t, int64_t n) {
  if (!dtype_ok(t) || n < 0 || n % (int64_t)dtypes[t].block_elems != 0) {
    servd_fail(SERVD_EINVAL, "dtype_row_bytes: %lld elements of %s is not a whole number of blocks", (long long)n,
               servd_dtype_name(t));
    return 0;
  }
  return (size_t)n / dtypes[t].block_elems * dtypes[t].block_bytes;
}

/* ---- storage ---------------------------------------------------------------------------------- */

struct servd_storage {
  atomic_int refs;
  servd_storage_kind kind;
  void *data;
  size_t bytes;
  void (*release)(void *ctx);
  void *ctx;
};

servd_storage *servd_storage_alloc(size_t bytes) {
  size_t cap = (bytes + SERVD_ALIGN - 1) / SERVD_ALIGN * SERVD_ALIGN;
  if (cap < bytes) {
    servd_fail(SERVD_ENOMEM, "storage_alloc: %zu bytes overflows", bytes);
    return NULL;
  }
  servd_storage *s = calloc(1, sizeof *s);
  void *data = aligned_alloc(SERVD_ALIGN, cap ? cap : SERVD_ALIGN);
  if (!s || !data) {
    free(s);
    free(data);
    servd_fail(SERVD_ENOMEM, "storage_alloc: cannot allocate %zu bytes", bytes);
    return NULL;
  }
  memset(data, 0, cap);
  atomic_init(&s->refs, 1);
  s->kind = SERVD_STORAGE_OWNED;
  s->data = data;
  s->bytes = bytes;
  return s;
}

servd_storage *servd_storage_wrap(void *data, size_t bytes, void (*release)(void *ctx), void *ctx) {
  servd_storage *s = calloc(1, sizeof *s);
  if (!s) {
    servd_fail(SERVD_ENOMEM, "storage_wrap: out of memory");
    return NULL;
  }
  atomic_init(&s->refs, 1);
  s->kind = SERVD_STORAGE_BORROWED;
  s->data = data;
  s->bytes = bytes;
  s->release = release;
  s->ctx = ctx;
  return s;
}

void servd_storage_retain(servd_storage *s) {
  if (s) atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

void servd_storage_release(servd_storage *s) {
  if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1) return;
  if (s->kind == SERVD_STORAGE_OWNED) {
    free(s->data);
  } else if (s->release) {
    s->release(s->ctx);
  }
  free(s);
}

void *servd_storage_data(const servd_storage *s) { return s ? s->data : NULL; }
size_t servd_storage_bytes(const servd_storage *s) { return s ? s->bytes : 0; }
servd_storage_kind servd_storage_get_kind(const servd_storage *s) { return s->kind; }
int servd_storage_refs(const servd_storage *s) { return atomic_load_explicit(&s->refs, memory_order_acquire); }

/* ---- tensors ---------------------------------------------------------------------------------- */

static const char *fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t n = 0;
  buf[0] = 0;
  for (int i = 0; i < ndim && n < cap; i++) {
    n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)shape[i]);
  }
  return buf;
}

const char *servd_tensor_describe(const servd_tensor *t, char *buf, size_t cap) {
  if (!buf || cap == 0) return "";
  if (!t) {
    snprintf(buf, cap, "(null)");
    return buf;
  }
  char s[128];
  snprintf(buf, cap, "%s[%s]", servd_dtype_name(t->dtype), fmt_shape(s, sizeof s, t->ndim, t->shape));
  return buf;
}

/* Checks dtype/ndim/shape and computes contiguous strides and the byte size. */
static int contiguous_layout(const char *op, servd_dtype t, int ndim, const int64_t *shape, int64_t *strides,
                             size_t *bytes) {
  char s[128];
  if (!dtype_ok(t)) return servd_fail(SERVD_EINVAL, "%s: invalid dtype %d", op, (int)t);
  if (ndim < 0 || ndim > SERVD_MAX_DIMS || (ndim > 0 && !shape))
    return servd_fail(SERVD_EINVAL, "%s: ndim %d outside [0, %d]", op, ndim, SERVD_MAX_DIMS);
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return servd_fail(SERVD_EINVAL, "%s: negative dimension in shape [%s]", op, fmt_shape(s, sizeof s, ndim, shape));
  }
  size_t be = dtypes[t].block_elems, bb = dtypes[t].block_bytes;
  uint64_t acc;
  if (ndim == 0) {
    if (be != 1) return servd_fail(SERVD_EINVAL, "%s: a %s scalar is not a whole block", op, dtypes[t].name);
    *bytes = bb;
    return 0;
  }
  if ((uint64_t)shape[ndim - 1] % be != 0)
    return servd_fail(SERVD_EINVAL, "%s: innermost dimension of [%s] is not a multiple of the %s block (%zu)", op,
                      fmt_shape(s, sizeof s, ndim, shape), dtypes[t].name, be);
  strides[ndim - 1] = be == 1 ? (int64_t)bb : 0;
  acc = (uint64_t)shape[ndim - 1] / be * bb;
  for (int i = ndim - 2; i >= 0; i--) {
    strides[i] = (int64_t)acc;
    if (shape[i] != 0 && acc > (uint64_t)INT64_MAX / (uint64_t)shape[i])
      return servd_fail(SERVD_ERANGE, "%s: shape [%s] overflows", op, fmt_shape(s, sizeof s, ndim, shape));
    acc *= (uint64_t)shape[i];
  }
  if (acc > (uint64_t)INT64_MAX)
    return servd_fail(SERVD_ERANGE, "%s: shape [%s] overflows", op, fmt_shape(s, sizeof s, ndim, shape));
  *bytes = (size_t)acc;
  return 0;
}

static servd_tensor *tensor_make(servd_storage *s, size_t offset, servd_dtype t, int ndim, const int64_t *shape,
                                 const int64_t *strides, int device) {
  servd_tensor *x = calloc(1, sizeof *x);
  if (!x) {
    servd_fail(SERVD_ENOMEM, "tensor: out of memory");
    return NULL;
  }
  x->dtype = t;
  x->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    x->shape[i] = shape[i];
    x->strides[i] = strides[i];
  }
  servd_storage_retain(s);
  x->storage = s;
  x->offset = offset;
  x->device = device;
  x->refcount = 1;
  return x;
}

servd_tensor *servd_tensor_new(servd_dtype t, int ndim, const int64_t *shape) {
  int64_t strides[SERVD_MAX_DIMS];
  size_t bytes;
  if (contiguous_layout("tensor_new", t, ndim, shape, strides, &bytes) != 0) return NULL;
  servd_storage *s = servd_storage_alloc(bytes);
  if (!s) return NULL;
  servd_tensor *x = tensor_make(s, 0, t, ndim, shape, strides, -1);
  servd_storage_release(s); /* the tensor holds the only reference now */
  return x;
}

/* Alignment an element address needs: the element size, or the f16 fields of a block. */
static size_t dtype_align(servd_dtype t) { return dtypes[t].block_elems == 1 ? dtypes[t].block_bytes : 2; }

servd_tensor *servd_tensor_from_storage(servd_storage *s, size_t offset, servd_dtype t, int ndim,
                                        const int64_t *shape) {
  int64_t strides[SERVD_MAX_DIMS];
  size_t bytes;
  if (!s) {
    servd_fail(SERVD_EINVAL, "tensor_from_storage: NULL storage");
    return NULL;
  }
  if (contiguous_layout("tensor_from_storage", t, ndim, shape, strides, &bytes) != 0) return NULL;
  if (offset > s->bytes || bytes > s->bytes - offset) {
    servd_fail(SERVD_ERANGE, "tensor_from_storage: %zu bytes at offset %zu run past storage of %zu bytes", bytes,
               offset, s->bytes);
    return NULL;
  }
  if (((uintptr_t)s->data + offset) % dtype_align(t) != 0) {
    servd_fail(SERVD_EINVAL, "tensor_from_storage: offset %zu is misaligned for %s", offset, dtypes[t].name);
    return NULL;
  }
  return tensor_make(s, offset, t, ndim, shape, strides, s->kind == SERVD_STORAGE_DEVICE ? 0 : -1);
}

servd_tensor *servd_tensor_view(const servd_tensor *base, size_t offset, int ndim, const int64_t *shape,
                                const int64_t *strides) {
  char s[128];
  if (!base || ndim < 1 || ndim > SERVD_MAX_DIMS || !shape || !strides) {
    servd_fail(SERVD_EINVAL, "tensor_view: bad arguments (ndim %d)", ndim);
    return NULL;
  }
  servd_dtype t = base->dtype;
  size_t be = dtypes[t].block_elems, bb = dtypes[t].block_bytes;
  int64_t inner = be == 1 ? (int64_t)bb : 0;
  if (strides[ndim - 1] != inner || shape[ndim - 1] < 0 || (uint64_t)shape[ndim - 1] % be != 0) {
    servd_fail(SERVD_EINVAL,
               "tensor_view: %s view [%s] needs a contiguous innermost dimension (stride %lld, whole blocks)",
               dtypes[t].name, fmt_shape(s, sizeof s, ndim, shape), (long long)inner);
    return NULL;
  }
  /* Byte range touched, relative to base's element 0 plus offset. */
  __int128 lo = 0, hi = (__int128)shape[ndim - 1] / (int64_t)be * (int64_t)bb;
  bool empty = shape[ndim - 1] == 0;
  for (int i = 0; i < ndim - 1; i++) {
    if (shape[i] < 0) {
      servd_fail(SERVD_EINVAL, "tensor_view: negative dimension in [%s]", fmt_shape(s, sizeof s, ndim, shape));
      return NULL;
    }
    if (shape[i] == 0) empty = true;
    __int128 ext = (__int128)(shape[i] > 0 ? shape[i] - 1 : 0) * strides[i];
    if (ext < 0) lo += ext;
    else hi += ext;
  }
  __int128 start = (__int128)base->offset + offset;
  if (!empty && (start + lo < 0 || start + hi > (__int128)base->storage->bytes)) {
    servd_fail(SERVD_ERANGE, "tensor_view: view [%s] at offset %zu runs outside storage of %zu bytes",
               fmt_shape(s, sizeof s, ndim, shape), offset, base->storage->bytes);
    return NULL;
  }
  if (start > (__int128)base->storage->bytes) {
    servd_fail(SERVD_ERANGE, "tensor_view: offset %zu past storage of %zu bytes", offset, base->storage->bytes);
    return NULL;
  }
  size_t al = dtype_align(t);
  for (int i = 0; i < ndim - 1; i++) {
    if (strides[i] % (int64_t)al != 0) {
      servd_fail(SERVD_EINVAL, "tensor_view: stride %lld misaligned for %s", (long long)strides[i], dtypes[t].name);
      return NULL;
    }
  }
  if (((uintptr_t)base->storage->data + (size_t)start) % al != 0) {
    servd_fail(SERVD_EINVAL, "tensor_view: offset %zu misaligned for %s", offset, dtypes[t].name);
    return NULL;
  }
  return tensor_make(base->storage, (size_t)start, t, ndim, shape, strides, base->device);
}

servd_tensor *servd_tensor_narrow(const servd_tensor *base, int dim, int64_t start, int64_t len) {
  if (!base || dim < 0 || dim >= base->ndim || start < 0 || len < 0 || start > base->shape[dim] ||
      len > base->shape[dim] - start) {
    servd_fail(SERVD_EINVAL, "tensor_narrow: [%lld, +%lld) of dim %d outside the tensor", (long long)start,
               (long long)len, dim);
    return NULL;
  }
  int64_t shape[SERVD_MAX_DIMS];
  for (int i = 0; i < base->ndim; i++) shape[i] = base->shape[i];
  shape[dim] = len;
  size_t off;
  size_t be = dtypes[base->dtype].block_elems;
  if (dim == base->ndim - 1) {
    if ((uint64_t)start % be != 0 || (uint64_t)len % be != 0) {
      servd_fail(SERVD_EINVAL, "tensor_narrow: %s columns [%lld, +%lld) are not whole blocks of %zu",
                 dtypes[base->dtype].name, (long long)start, (long long)len, be);
      return NULL;
    }
    off = (size_t)start / be * dtypes[base->dtype].block_bytes;
  } else {
    off = (size_t)(start * base->strides[dim]);
  }
  /* Negative outer strides would need a negative offset; views keep offsets non-negative. */
  if (base->strides[dim] < 0 && start > 0) {
    servd_fail(SERVD_EINVAL, "tensor_narrow: negative stride on dim %d", dim);
    return NULL;
  }
  return servd_tensor_view(base, off, base->ndim, shape, base->strides);
}

bool servd_tensor_is_contiguous(const servd_tensor *t) {
  int64_t strides[SERVD_MAX_DIMS];
  size_t bytes;
  if (!t || contiguous_layout("tensor_is_contiguous", t->dtype, t->ndim, t->shape, strides, &bytes) != 0) return false;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] != 1 && t->strides[i] != strides[i]) return false;
  }
  return true;
}

int64_t servd_tensor_numel(const servd_tensor *t) {
  int64_t n = 1;
  for (int i = 0; t && i < t->ndim; i++) n *= t->shape[i];
  return t ? n : 0;
}

size_t servd_tensor_nbytes(const servd_tensor *t) {
  if (!t) return 0;
  if (t->ndim == 0) return dtypes[t->dtype].block_bytes;
  int64_t outer = 1;
  for (int i = 0; i < t->ndim - 1; i++) outer *= t->shape[i];
  return (size_t)outer * servd_dtype_row_bytes(t->dtype, t->shape[t->ndim - 1]);
}

servd_tensor *servd_tensor_reshape(const servd_tensor *base, int ndim, const int64_t *shape) {
  int64_t strides[SERVD_MAX_DIMS];
  size_t bytes;
  char a[128], b[128];
  if (!base || !servd_tensor_is_contiguous(base)) {
    servd_fail(SERVD_EINVAL, "tensor_reshape: source %s is not contiguous", servd_tensor_describe(base, a, sizeof a));
    return NULL;
  }
  if (contiguous_layout("tensor_reshape", base->dtype, ndim, shape, strides, &bytes) != 0) return NULL;
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  if (n != servd_tensor_numel(base) || bytes != servd_tensor_nbytes(base)) {
    servd_fail(SERVD_EINVAL, "tensor_reshape: %s cannot become [%s]", servd_tensor_describe(base, a, sizeof a),
               fmt_shape(b, sizeof b, ndim, shape));
    return NULL;
  }
  return tensor_make(base->storage, base->offset, base->dtype, ndim, shape, strides, base->device);
}

void servd_tensor_retain(servd_tensor *t) {
  if (t) __atomic_fetch_add(&t->refcount, 1, __ATOMIC_RELAXED);
}

void servd_tensor_release(servd_tensor *t) {
  if (!t || __atomic_fetch_sub(&t->refcount, 1, __ATOMIC_ACQ_REL) != 1) return;
  servd_storage_release(t->storage);
  free(t);
}
