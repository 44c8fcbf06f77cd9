/* The package cache: `servd --model FILE.gguf` and `--model HF_FOLDER` serve the source directly by
 * packing it once into a cache folder and reusing that package on later starts.
 *
 * Sources are told apart by their first bytes, not their names: a zip ("PK\3\4") is a package and is
 * served as it is; "GGUF" is a GGUF file; a folder holding config.json is a Hugging Face model.
 *
 * A cache entry is <dir>/<stem>-<source id>-<key>.mpk, where <source id> is 8 hex digits of the
 * SHA-256 of the source's absolute path and <key> 16 hex digits of a SHA-256 over what decides the
 * package's bytes, read cheaply (a multi-GB source is never hashed whole on a start):
 *   - GGUF: size, mtime (ns), inode, its first 4 MiB (header, metadata, tokenizer, tensor table),
 *     16 samples of 64 KiB spread over the file and its last 64 KiB;
 *   - Hugging Face folder: every file's relative name, size and mtime (ns) down to 2 levels, dot
 *     files skipped, and the whole content of its *.json files (config, index, tokenizer);
 *   - the model code folder that goes into the package (names, sizes, mtimes), the import dtype,
 *     and servd's own executable (size, mtime): a new importer packs again.
 * A package is built into a temporary file in the cache folder and renamed into place (atomic), under
 * an flock on <stem>-<source id>.lock, so two servd processes starting together build it once and
 * never see half a package. Entries of the same source with another key are removed once a new one
 * is built (a process still serving one keeps its mapping).
 */
#ifndef SERVD_PACKAGE_CACHE_H
#define SERVD_PACKAGE_CACHE_H

#include <stddef.h>

typedef enum servd_source_kind {
  SERVD_SOURCE_PACKAGE, /* a .mpk zip: served as it is */
  SERVD_SOURCE_GGUF,
  SERVD_SOURCE_HF, /* a Hugging Face model folder (config.json, *.safetensors) */
} servd_source_kind;

/* Classifies `path` by its first bytes (or, for a folder, by its config.json). SERVD_EINVAL with a
 * message that lists what servd accepts and how to pack it when it is none of them, SERVD_EIO when
 * it cannot be read. */
int servd_source_detect(const char *path, servd_source_kind *kind);

/* $XDG_CACHE_HOME/servd/packages, else $HOME/.cache/servd/packages. */
int servd_package_cache_default_dir(char *out, size_t cap);

/* The package to load for `src`: a package path as it is; for a GGUF file or a Hugging Face folder,
 * its cache entry in `dir` (NULL: the default), packed now unless an entry with the same key opens
 * (a corrupt one is rebuilt once). Logs "built in N s" or "reused" on stderr. *out: the caller frees.
 * SERVD_EINVAL when src is no model or the cache folder cannot be used (what the operator must fix:
 * the message says how); another code when packing the source fails. */
int servd_package_cache_resolve(const char *dir, const char *src, char **out);

#endif
