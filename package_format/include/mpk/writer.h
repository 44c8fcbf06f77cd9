/* Writing model packages (format: docs/package-format.md).
 *
 * The writer streams entries into "<path>.tmp.XXXXXX" in the destination's folder and renames it to
 * `path` only in mpk_writer_finish, after fsync: a failed or interrupted pack never leaves a
 * half-written package under the final name. Every entry is stored (not compressed) and its data
 * starts on a 64-byte boundary of the file (padding extra field in the local header); tensors are
 * one-tensor safetensors files "weights/<name>.safetensors" whose buffer also starts on a 64-byte
 * boundary. SHA-256 and CRC-32 are computed while writing. manifest.json (the tensor index and
 * the hashes of every entry) is written last, then the central directory (zip64 when needed).
 */
#ifndef MPK_WRITER_H
#define MPK_WRITER_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "servd/status.h"
#include "servd/tensor.h"

typedef struct mpk_writer mpk_writer;

/* Creates the temporary file next to `path`. *out owned by the caller (mpk_writer_destroy). */
SERVD_API int mpk_writer_create(const char *path, mpk_writer **out);
/* Finishes: writes the manifest and central directory, fsyncs and renames into place. After it
 * (success or not) only mpk_writer_destroy may be called. */
SERVD_API int mpk_writer_finish(mpk_writer *w);
/* Frees the writer; removes the temporary file unless finished. Accepts NULL. */
SERVD_API void mpk_writer_destroy(mpk_writer *w);

/* Sets a manifest field ("name", "model_version", "kind", "entry_point", "config", "tokenizer",
 * "rope_layout", "special_tokens", ...). Steals the reference to `value`. The fields "format_version",
 * "tensors" and "files" are the writer's own. */
SERVD_API int mpk_writer_set(mpk_writer *w, const char *key, json_t *value);

/* A whole file entry (code, tokenizer, JSON). `path` is the archive path (validated). */
SERVD_API int mpk_writer_add_file(mpk_writer *w, const char *path, const void *data, size_t len);

/* A tensor, contiguous, `nbytes` == packed size of dtype x shape. */
SERVD_API int mpk_writer_add_tensor(mpk_writer *w, const char *name, servd_dtype dtype, int ndim, const int64_t *shape,
                                    const void *data, size_t nbytes);
/* Streaming form: begin, then write exactly the packed size in any pieces, then end. */
SERVD_API int mpk_writer_begin_tensor(mpk_writer *w, const char *name, servd_dtype dtype, int ndim,
                                      const int64_t *shape);
SERVD_API int mpk_writer_write(mpk_writer *w, const void *data, size_t len);
/* Same, copying in the kernel (copy_file_range) from `fd` at `offset`; `data` is the same bytes
 * mapped in memory, read for the hashes. */
SERVD_API int mpk_writer_write_fd(mpk_writer *w, int fd, uint64_t offset, const void *data, size_t len);
SERVD_API int mpk_writer_end_tensor(mpk_writer *w);

/* Bytes written so far (for progress). */
SERVD_API uint64_t mpk_writer_bytes(const mpk_writer *w);

/* Checks an archive path: 1..1024 bytes, relative, '/'-separated, no empty, "." or ".." component,
 * no backslash, colon or control character. 0 or SERVD_EFORMAT naming `what`. */
SERVD_API int mpk_check_entry_path(const char *what, const char *path, size_t len);
/* Checks a tensor name: 1..256 bytes of [A-Za-z0-9._-], not starting with '.'. */
SERVD_API int mpk_check_tensor_name(const char *what, const char *name);

/* Checks a package name or model version (`field` names which): 1..64 bytes of [A-Za-z0-9._-], not
 * starting with '.'. 0 or SERVD_EFORMAT naming `what` and the value (escaped). */
SERVD_API int mpk_check_name(const char *what, const char *field, const char *s);

#endif
