/* safetensors headers: parsing (validated) and building.
 *
 * A safetensors file is: u64 little-endian N, N bytes of JSON header (may end in spaces), then the
 * byte buffer. The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
 * (offsets relative to the buffer) plus an optional "__metadata__" object of strings.
 * mpk_st_parse accepts a file only when the tensors tile the buffer exactly (sorted by offset, no
 * overlap, no hole, nothing past the end) and every byte size equals dtype size x shape.
 */
#ifndef MPK_SAFETENSORS_H
#define MPK_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "servd/status.h"
#include "servd/tensor.h"

#define MPK_ST_MAX_DIMS 8
#define MPK_ST_MAX_HEADER (100u << 20) /* the limit of the reference implementation */

typedef struct mpk_st_tensor {
  const char *name; /* borrowed from the header object */
  char dtype[12];   /* "F32", "BF16", "U8", ... */
  unsigned elem_bytes;
  int ndim;
  int64_t shape[MPK_ST_MAX_DIMS];
  uint64_t begin, end; /* relative to the buffer */
} mpk_st_tensor;

typedef struct mpk_st_header {
  size_t n;
  mpk_st_tensor *tensors; /* in file order of data (sorted by begin) */
  uint64_t data_start;    /* 8 + N: where the buffer starts in the file */
  uint64_t data_len;
  json_t *metadata; /* "__metadata__" or NULL; borrowed from root */
  json_t *root;     /* owned */
  size_t *by_name;  /* indices sorted by name */
} mpk_st_header;

/* Parses and validates the header of a safetensors file of `len` bytes at `buf` (the whole file).
 * `what` names the file in error messages. *out is owned by the caller (mpk_st_free). */
SERVD_API int mpk_st_parse(const char *what, const void *buf, size_t len, mpk_st_header **out);
SERVD_API void mpk_st_free(mpk_st_header *h);                        /* accepts NULL */
SERVD_API int mpk_st_find(const mpk_st_header *h, const char *name); /* index or -1 */

/* Element size of a safetensors dtype string; 0 when unknown. */
SERVD_API unsigned mpk_st_dtype_size(const char *dtype);
/* Maps "F32" "F16" "BF16" "I32" to servd dtypes; SERVD_EUNSUPPORTED otherwise. */
SERVD_API int mpk_st_dtype_to_servd(const char *dtype, servd_dtype *out);

/* Builds the 8-byte length + JSON header of a file holding one tensor of `nbytes` bytes, padded
 * with spaces so the buffer starts at a multiple of `align`. *out is malloc'd (caller frees). */
SERVD_API int mpk_st_build_single(const char *name, const char *st_dtype, int ndim, const int64_t *shape,
                                  uint64_t nbytes, json_t *metadata, size_t align, char **out, size_t *len);

#endif
