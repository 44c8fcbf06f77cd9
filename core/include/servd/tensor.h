/* Tensors: dtype, shape, byte strides, and refcounted storage.
 *
 * Storage is owned (allocated here, 64-byte aligned), borrowed (e.g. a region of a mapped package
 * file, released through a callback when the last reference goes), or on a device. Reference counts
 * are atomic: weights are shared by many interpreters on many threads.
 *
 * Layout: shape[0] is the outermost dimension. strides[] are in bytes. The innermost dimension of
 * every tensor is contiguous: for plain dtypes strides[ndim-1] == element size; for GGUF block dtypes
 * (servd/dtypes.def: blocks of 32 or 256 values) the innermost dimension is a run of packed blocks,
 * its length is a multiple of the block size and strides[ndim-1] == block bytes / block elements is
 * not an integer, so it is stored as 0 and never used. Outer strides may be anything (views of rows, column slices of a row).
 */
#ifndef SERVD_TENSOR_H
#define SERVD_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "servd/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One value per row of servd/dtypes.def (the registry: layouts, names, sizes, GGUF types); new
 * dtypes are appended there, as the values are stored in packages. */
typedef enum servd_dtype {
#define SERVD_DTYPE(ID, value, ...) SERVD_##ID = value,
#include "servd/dtypes.def"
  SERVD_DTYPE_COUNT
} servd_dtype;

#define SERVD_QK 32    /* elements per block of q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl */
#define SERVD_QK_K 256 /* elements per super-block of the k-quants q2_k..q6_k and iq4_xs */
#define SERVD_MAX_DIMS 4
#define SERVD_ALIGN 64

SERVD_API const char *servd_dtype_name(servd_dtype t);                   /* "f32", "q4_1", ... */
SERVD_API int servd_dtype_from_name(const char *name, servd_dtype *out); /* 0 or SERVD_EINVAL */
SERVD_API size_t servd_dtype_block_elems(servd_dtype t);                 /* 1 for plain dtypes */
SERVD_API size_t servd_dtype_block_bytes(servd_dtype t);                 /* element size for plain */
SERVD_API bool servd_dtype_is_quantized(servd_dtype t);
/* Bytes of a packed row of n elements. When n is negative or not a multiple of the block (or t is
 * unknown) returns 0 and records SERVD_EINVAL (servd_last_error); an empty row is also 0 bytes. */
SERVD_API size_t servd_dtype_row_bytes(servd_dtype t, int64_t n);

typedef enum servd_storage_kind {
  SERVD_STORAGE_OWNED = 0,
  SERVD_STORAGE_BORROWED = 1,
  SERVD_STORAGE_DEVICE = 2,
} servd_storage_kind;

typedef struct servd_storage servd_storage;

/* Owned host storage of `bytes`, zeroed, 64-byte aligned. NULL on failure. Refcount 1. */
SERVD_API servd_storage *servd_storage_alloc(size_t bytes);
/* Borrowed storage: data stays valid until release(ctx) is called after the last reference.
 * release may be NULL. Refcount 1. */
SERVD_API servd_storage *servd_storage_wrap(void *data, size_t bytes, void (*release)(void *ctx), void *ctx);
SERVD_API void servd_storage_retain(servd_storage *s);
SERVD_API void servd_storage_release(servd_storage *s); /* accepts NULL */
SERVD_API void *servd_storage_data(const servd_storage *s);
/* References held on s right now (tensors and views over it, and direct holders): lets a cache tell
 * whether anything but itself still uses the memory. */
SERVD_API int servd_storage_refs(const servd_storage *s);
SERVD_API size_t servd_storage_bytes(const servd_storage *s);
SERVD_API servd_storage_kind servd_storage_get_kind(const servd_storage *s);

typedef struct servd_tensor {
  servd_dtype dtype;
  int ndim;
  int64_t shape[SERVD_MAX_DIMS];
  int64_t strides[SERVD_MAX_DIMS]; /* bytes */
  servd_storage *storage;          /* one reference held by the tensor */
  size_t offset;                   /* bytes from storage start to element 0 */
  int device;                      /* -1 host, else GPU ordinal */
  int refcount;                    /* atomic; use servd_tensor_retain/release */
} servd_tensor;

/* New contiguous owned tensor, zeroed. NULL on failure (servd_last_error says why). */
SERVD_API servd_tensor *servd_tensor_new(servd_dtype t, int ndim, const int64_t *shape);
/* New contiguous tensor over existing storage at `offset` (takes its own reference to storage).
 * Fails when the data would run past the storage or offset is misaligned for the dtype. */
SERVD_API servd_tensor *servd_tensor_from_storage(servd_storage *s, size_t offset, servd_dtype t, int ndim,
                                                  const int64_t *shape);
/* A view sharing storage: new shape/strides (bytes) at byte offset `offset` from base's element 0.
 * Checks that every addressed byte lies inside the storage. */
SERVD_API servd_tensor *servd_tensor_view(const servd_tensor *base, size_t offset, int ndim, const int64_t *shape,
                                          const int64_t *strides);
/* Rows [start, start+len) of dimension `dim` (for dim == ndim-1 of block dtypes, start and len must
 * be multiples of the block size). */
SERVD_API servd_tensor *servd_tensor_narrow(const servd_tensor *base, int dim, int64_t start, int64_t len);
/* Same data, new shape; only for contiguous tensors. */
SERVD_API servd_tensor *servd_tensor_reshape(const servd_tensor *base, int ndim, const int64_t *shape);
SERVD_API void servd_tensor_retain(servd_tensor *t);
SERVD_API void servd_tensor_release(servd_tensor *t); /* accepts NULL */

SERVD_API int64_t servd_tensor_numel(const servd_tensor *t);
SERVD_API bool servd_tensor_is_contiguous(const servd_tensor *t);
SERVD_API size_t servd_tensor_nbytes(const servd_tensor *t); /* bytes of the elements if contiguous */
static inline void *servd_tensor_data(const servd_tensor *t) {
  return (char *)servd_storage_data(t->storage) + t->offset;
}
/* "f32[2,3]" into buf; returns buf. For error messages. */
SERVD_API const char *servd_tensor_describe(const servd_tensor *t, char *buf, size_t cap);

/* Scalar conversions shared by every kernel and importer. */
SERVD_API float servd_f16_to_f32(uint16_t h);
SERVD_API uint16_t servd_f32_to_f16(float f); /* round to nearest even */
static inline float servd_bf16_to_f32(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } v = {.u = (uint32_t)h << 16};
  return v.f;
}
SERVD_API uint16_t servd_f32_to_bf16(float f); /* round to nearest even, NaN preserved */

/* Dequantize/convert n elements (a whole number of blocks for block dtypes) of one packed row. */
SERVD_API int servd_row_to_f32(servd_dtype t, const void *src, float *dst, int64_t n);
/* Quantize/convert n f32 values into one packed row of dtype t (reference rounding as in ggml). */
SERVD_API int servd_row_from_f32(servd_dtype t, const float *src, void *dst, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
