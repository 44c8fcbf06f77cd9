/* GGUF reader (versions 2 and 3, little-endian), validated, zero-copy over a caller's buffer.
 *
 * Layout: "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv x (string key, u32 type, value),
 * n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset), padding to
 * general.alignment (default 32), then the data section. Strings are u64 length + bytes (no NUL).
 * Dimensions ne[] are innermost first: ne = [576, 49152] is a row-major (49152, 576) matrix.
 *
 * mpk_gguf_parse rejects, with a message naming the file, the field and the expectation: truncation,
 * counts and lengths larger than the bytes left, nested arrays, unknown value or tensor types,
 * n_dims outside 1..4, dimension products, byte sizes or offsets that overflow, offsets that are not
 * aligned, run past the end or overlap, duplicate keys or tensor names, and a general.alignment that
 * is not a u32 power of two. Memory used is bounded by the input size.
 */
#ifndef MPK_GGUF_H
#define MPK_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "servd/status.h"

enum {
  MPK_GGUF_UINT8 = 0,
  MPK_GGUF_INT8 = 1,
  MPK_GGUF_UINT16 = 2,
  MPK_GGUF_INT16 = 3,
  MPK_GGUF_UINT32 = 4,
  MPK_GGUF_INT32 = 5,
  MPK_GGUF_FLOAT32 = 6,
  MPK_GGUF_BOOL = 7,
  MPK_GGUF_STRING = 8,
  MPK_GGUF_ARRAY = 9,
  MPK_GGUF_UINT64 = 10,
  MPK_GGUF_INT64 = 11,
  MPK_GGUF_FLOAT64 = 12,
  MPK_GGUF_TYPE_COUNT
};

/* ggml tensor types we know the layout of. */
enum {
  MPK_GGML_F32 = 0,
  MPK_GGML_F16 = 1,
  MPK_GGML_Q4_0 = 2,
  MPK_GGML_Q4_1 = 3,
  MPK_GGML_Q5_0 = 6,
  MPK_GGML_Q5_1 = 7,
  MPK_GGML_Q8_0 = 8,
  MPK_GGML_Q8_1 = 9,
  MPK_GGML_Q2_K = 10,
  MPK_GGML_Q3_K = 11,
  MPK_GGML_Q4_K = 12,
  MPK_GGML_Q5_K = 13,
  MPK_GGML_Q6_K = 14,
  MPK_GGML_Q8_K = 15,
  MPK_GGML_IQ2_XXS = 16,
  MPK_GGML_IQ2_XS = 17,
  MPK_GGML_IQ3_XXS = 18,
  MPK_GGML_IQ1_S = 19,
  MPK_GGML_IQ4_NL = 20,
  MPK_GGML_IQ3_S = 21,
  MPK_GGML_IQ2_S = 22,
  MPK_GGML_IQ4_XS = 23,
  MPK_GGML_I8 = 24,
  MPK_GGML_I16 = 25,
  MPK_GGML_I32 = 26,
  MPK_GGML_I64 = 27,
  MPK_GGML_F64 = 28,
  MPK_GGML_IQ1_M = 29,
  MPK_GGML_BF16 = 30,
  MPK_GGML_TQ1_0 = 34,
  MPK_GGML_TQ2_0 = 35,
  MPK_GGML_MXFP4 = 39,
};

typedef struct mpk_gguf_kv {
  char *key;               /* owned, NUL-terminated */
  uint32_t type;           /* MPK_GGUF_* */
  uint32_t arr_type;       /* element type when type == MPK_GGUF_ARRAY */
  uint64_t n;              /* array length (1 for scalars) */
  const uint8_t *data;     /* the raw value (scalar bytes, string length prefix, array elements) */
  const uint64_t *str_off; /* string arrays: offset of element i's length prefix from data (owned) */
} mpk_gguf_kv;

typedef struct mpk_gguf_tensor {
  char *name;    /* owned, NUL-terminated */
  uint32_t type; /* MPK_GGML_* */
  int ndim;
  int64_t ne[4];   /* innermost first, unused entries 1 */
  uint64_t offset; /* absolute offset in the buffer */
  uint64_t nbytes;
} mpk_gguf_tensor;

typedef struct mpk_gguf {
  uint32_t version;
  uint64_t alignment;
  uint64_t data_offset; /* absolute start of the data section */
  size_t n_kv;
  mpk_gguf_kv *kv;
  size_t n_tensors;
  mpk_gguf_tensor *tensors; /* in file order */
  const uint8_t *buf;       /* borrowed: the caller keeps the buffer alive */
  char *what;               /* owned copy of the file name used in messages */
  size_t len;
} mpk_gguf;

SERVD_API int mpk_gguf_parse(const char *what, const void *buf, size_t len, mpk_gguf **out);
SERVD_API void mpk_gguf_free(mpk_gguf *g); /* accepts NULL */

SERVD_API const char *mpk_ggml_type_name(uint32_t type); /* "Q4_K", or NULL when unknown */
/* Elements and bytes per block of a ggml type; SERVD_EUNSUPPORTED when unknown. */
SERVD_API int mpk_ggml_type_size(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);

/* Lookups. Return SERVD_EINVAL when the key is absent and SERVD_EFORMAT (with a message naming
 * `what`, the key and the expected type) when it has another type. Integers of any width convert
 * when the value fits. */
SERVD_API const mpk_gguf_kv *mpk_gguf_find(const mpk_gguf *g, const char *key);
SERVD_API int mpk_gguf_get_u64(const mpk_gguf *g, const char *key, uint64_t *out);
SERVD_API int mpk_gguf_get_f64(const mpk_gguf *g, const char *key, double *out);
SERVD_API int mpk_gguf_get_bool(const mpk_gguf *g, const char *key, bool *out);
/* String value (not NUL-terminated), borrowed from the buffer. */
SERVD_API int mpk_gguf_get_str(const mpk_gguf *g, const char *key, const char **s, size_t *len);
/* Element i of an array of strings / of integers (any integer type) / of floats. */
SERVD_API void mpk_gguf_arr_str(const mpk_gguf *g, const mpk_gguf_kv *kv, uint64_t i, const char **s, size_t *len);
SERVD_API int64_t mpk_gguf_arr_int(const mpk_gguf_kv *kv, uint64_t i);
SERVD_API double mpk_gguf_arr_f64(const mpk_gguf_kv *kv, uint64_t i);

/* Dequantizes/converts n elements (whole blocks) of one packed row of ggml type `type` to f32.
 * Supports F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K; SERVD_EUNSUPPORTED otherwise. */
SERVD_API int mpk_ggml_row_to_f32(uint32_t type, const void *src, float *dst, int64_t n);

#endif
