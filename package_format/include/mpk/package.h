/* Reading model packages (format: docs/package-format.md).
 *
 * mpk_open maps the package file read-only, validates the zip structure, the manifest schema and the
 * tensor index (offsets, sizes, alignment, dtypes, overlaps), and hands out tensors that point into
 * the mapping (no copy). The mapping lives until the package and every tensor taken from it are
 * released. Hash checking of every entry is mpk_verify (it reads every byte).
 */
#ifndef MPK_PACKAGE_H
#define MPK_PACKAGE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "servd/status.h"
#include "servd/tensor.h"

typedef struct mpk_package mpk_package;

/* On failure returns a negative SERVD_E* code; servd_last_error() names the file, the field and what
 * was expected. */
SERVD_API int mpk_open(const char *path, mpk_package **out);
SERVD_API void mpk_close(mpk_package *p); /* accepts NULL; tensors taken stay valid */

SERVD_API const char *mpk_path(const mpk_package *p);
SERVD_API json_t *mpk_manifest(const mpk_package *p); /* borrowed, valid until mpk_close */
SERVD_API json_t *mpk_config(const mpk_package *p);   /* manifest "config" (model config), borrowed */
SERVD_API const char *mpk_name(const mpk_package *p);
SERVD_API const char *mpk_kind(const mpk_package *p);        /* "causal-lm" or "generic" */
SERVD_API const char *mpk_entry_point(const mpk_package *p); /* "module:callable" */

SERVD_API int mpk_tensor_count(const mpk_package *p);
SERVD_API const char *mpk_tensor_name(const mpk_package *p, int i);
/* A tensor by name as a new reference (view into the mapping); SERVD_EINVAL if absent. */
SERVD_API int mpk_tensor(mpk_package *p, const char *name, servd_tensor **out);

/* Contents of an entry by its path in the archive (e.g. "code/llama/model.py", "tokenizer.json").
 * Stored entries point into the mapping; deflated ones are inflated once (bounded) and kept.
 * *data valid until mpk_close. SERVD_EINVAL if absent. */
SERVD_API int mpk_file(mpk_package *p, const char *path, const void **data, size_t *len);
SERVD_API int mpk_file_count(const mpk_package *p);
SERVD_API const char *mpk_file_path(const mpk_package *p, int i);

/* Recomputes the CRC-32 and SHA-256 of every entry and checks them against the central directory
 * and the manifest (mpk/integrity.h checks a part: mpk_verify_entries). */
SERVD_API int mpk_verify(mpk_package *p);

/* Checks a causal-lm package against its architecture in the registry (manifest "architecture",
 * else config.model_type): the config has the keys and ranges the family's model code needs, and
 * every tensor that code takes exists with the shape the config implies. Generic packages pass.
 * Not part of mpk_open (which checks the format, not the model); loaders call it before running
 * the model's code. SERVD_EUNSUPPORTED for an unknown family (the message lists the known ones),
 * SERVD_EFORMAT naming the tensor or config key otherwise. */
SERVD_API int mpk_check_model(const mpk_package *p);

/* Extracts every file of the package into the folder `dir`, which must not exist or be empty.
 * Regular files (0644) and folders (0755) only, created without following links, written into
 * "<dir>.tmp.XXXXXX" and renamed to `dir` at the end: on failure nothing is left. Call mpk_verify
 * first when the hashes matter. */
SERVD_API int mpk_unpack(mpk_package *p, const char *dir);

/* ---- Extensions: index details for tools (inspect, list) and loaders. ---- */

#define MPK_FORMAT_VERSION 1

typedef struct mpk_tensor_info {
  const char *name; /* borrowed, valid until mpk_close */
  servd_dtype dtype;
  int ndim;
  int64_t shape[SERVD_MAX_DIMS];
  const char *file; /* archive entry holding the data, borrowed */
  uint64_t offset;  /* absolute byte offset of the data in the package file (64-byte aligned) */
  uint64_t nbytes;
} mpk_tensor_info;

typedef struct mpk_file_info {
  const char *path;     /* borrowed, valid until mpk_close */
  uint64_t offset;      /* absolute offset of the entry's (stored) data in the package file */
  uint64_t size;        /* uncompressed bytes */
  uint64_t stored_size; /* bytes in the archive */
  int method;           /* 0 stored, 8 deflated */
  uint32_t crc32;       /* CRC-32 of the uncompressed bytes, from the central directory */
} mpk_file_info;

SERVD_API int mpk_tensor_info_at(const mpk_package *p, int i, mpk_tensor_info *out); /* SERVD_ERANGE */
SERVD_API int mpk_file_info_at(const mpk_package *p, int i, mpk_file_info *out);     /* SERVD_ERANGE */
SERVD_API uint64_t mpk_size(const mpk_package *p);                                   /* bytes of the package file */
SERVD_API const char *mpk_model_version(const mpk_package *p);
SERVD_API const char *mpk_rope_layout(const mpk_package *p); /* "half", "interleaved" or NULL */

#endif
