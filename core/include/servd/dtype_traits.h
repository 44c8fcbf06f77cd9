/* The traits of a dtype: its row of servd/dtypes.def as data, for the code that handles every dtype
 * alike (importers, package checks, error messages) instead of switching on servd_dtype.
 *
 * Conversions stay behind servd_row_to_f32 / servd_row_from_f32 (servd/tensor.h), which check their
 * arguments; the CPU kernels' traits (activation quantization, kernel per ISA) are the kernels' own
 * table (kernels/src/dtype_cpu.c).
 */
#ifndef SERVD_DTYPE_TRAITS_H
#define SERVD_DTYPE_TRAITS_H

#include "servd/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SERVD_DTYPE_MAX_SCALES 2

/* An f16 scale of a block: its byte offset in the block and its field name in servd/blocks.h. */
typedef struct servd_dtype_scale {
  uint16_t offset;
  const char *name;
} servd_dtype_scale;

typedef struct servd_dtype_traits {
  const char *name;   /* "q4_1": servd_dtype_name, the manifest's dtype */
  size_t block_elems; /* 1 for plain dtypes */
  size_t block_bytes; /* the element size for plain dtypes */
  int ggml_type;      /* the GGUF tensor type kept byte for byte as this dtype; -1: none */
  int n_scales;       /* the block's f16 scales (0 for plain dtypes) */
  servd_dtype_scale scales[SERVD_DTYPE_MAX_SCALES];
} servd_dtype_traits;

/* Borrowed, static: t's row; NULL when t is not a dtype. */
SERVD_API const servd_dtype_traits *servd_dtype_get_traits(servd_dtype t);
/* The dtype a GGUF tensor of ggml type `ggml_type` is kept as: 0, or SERVD_EUNSUPPORTED (nothing
 * recorded: the caller names the tensor) when no dtype keeps it. */
SERVD_API int servd_dtype_from_ggml(uint32_t ggml_type, servd_dtype *out);
/* For error messages that list dtypes: name_of(t) of every dtype in value order (servd_dtype_name
 * when name_of is NULL; a NULL name leaves t out), joined by sep and by last_sep before the last,
 * into buf (truncated to cap); returns buf. servd_dtype_quantized_name lists the block dtypes. */
SERVD_API const char *servd_dtype_list(char *buf, size_t cap, const char *(*name_of)(servd_dtype t), const char *sep,
                                       const char *last_sep);
SERVD_API const char *servd_dtype_quantized_name(servd_dtype t); /* its name if a block dtype, else NULL */

#ifdef __cplusplus
}
#endif
#endif
