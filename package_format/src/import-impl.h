/* Shared pieces of the importers. */
#ifndef MPK_IMPORT_IMPL_H
#define MPK_IMPORT_IMPL_H

#include <jansson.h>

#include "mpk/import.h"
#include "mpk/writer.h"

/* Converts one row of n source elements to f32 (returns 0 or a negative code). */
typedef int (*mpk_row_to_f32_fn)(const void *ctx, const void *src, float *dst, int64_t n);

typedef struct mpk_progress {
  const mpk_import_options *o;
  uint64_t done, total;
} mpk_progress;

void mpk__progress_add(mpk_progress *pr, uint64_t bytes);

/* Writes a tensor whose bytes are already in the target layout (chunked, for progress). */
int mpk__emit_raw(mpk_writer *w, mpk_progress *pr, const char *name, servd_dtype dt, int ndim, const int64_t *shape,
                  const void *data, uint64_t nbytes, int src_fd, uint64_t src_offset); /* src_fd < 0: no fd */
/* SERVD_EFORMAT naming the tensor, block and field when an f16 scale of a block-quantized tensor's
 * nbytes is NaN or infinite (block_scales.c); 0 for other dtypes. */
int mpk__check_block_scales(const char *what, const char *tensor, servd_dtype dt, const void *data, uint64_t nbytes);
/* Writes a tensor converted row by row: rows of `src_row_bytes` at `src` -> f32 -> `dt`. */
int mpk__emit_converted(mpk_writer *w, mpk_progress *pr, const char *name, servd_dtype dt, int ndim,
                        const int64_t *shape, const void *src, uint64_t src_row_bytes, mpk_row_to_f32_fn conv,
                        const void *conv_ctx);

/* Parses a JSON file of the source (bounded size); messages name the file. */
int mpk__load_json_file(const char *path, json_t **out);
/* Adds a file of the source folder under `entry` if it exists (optional) after checking it is JSON
 * when `json` is set. *present tells whether it was there. */
int mpk__add_source_file(mpk_writer *w, const char *path, const char *entry, bool json, bool *present);

struct mpk_arch;
/* Sets name (default_name made safe unless o->name), model_version, kind, architecture, entry_point
 * in the manifest and embeds the code folder: o->code_dir, else $SERVD_MODEL_CODE, else the
 * architecture's folder found from the executable (code_dir.c). */
int mpk__common_fields(mpk_writer *w, const mpk_import_options *o, const struct mpk_arch *a, const char *default_name);
/* 0 unless `path` is a symbolic link resolving outside `root` (or not resolving): the packer never
 * copies files from outside the folder it was given. */
int mpk__source_inside(const char *root, const char *path);
/* A model folder's file (config, tokenizer, shards) may be a link to a regular file anywhere: the
 * Hugging Face hub cache links the files of snapshots/REV to ../../blobs. Only code folders must keep their
 * links inside (mpk__source_inside); anything but a regular file is refused. */
int mpk__source_regular(const char *path);

/* A sentence-transformers folder's 1_Pooling/config.json as the config's "pooling" (import_pooling.c);
 * nothing when the config names one or the file is absent. */
int mpk__hf_pooling(const char *dir, json_t *config);
/* import_pooling.c: modules.json's Normalize module -> config "normalize": true, and
 * sentence_bert_config.json's max_seq_length -> config "max_seq_length" (the config's own win). */
int mpk__hf_sentence_modules(const char *dir, json_t *config);

#define MPK_MAX_SIDE_FILE ((size_t)256 << 20) /* tokenizer.json and friends */

#endif
