/* Internal helpers of servd_package (not part of the API). */
#ifndef MPK_IMPL_H
#define MPK_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#include "servd/status.h"

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static inline void wr16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void wr32(uint8_t *p, uint32_t v) {
  wr16(p, (uint16_t)v);
  wr16(p + 2, (uint16_t)(v >> 16));
}
static inline void wr64(uint8_t *p, uint64_t v) {
  wr32(p, (uint32_t)v);
  wr32(p + 4, (uint32_t)(v >> 32));
}

/* A read-only mapping of a whole file. */
typedef struct mpk_map {
  void *data;
  size_t len;
  int fd; /* kept open by mpk__map_file_fd (for copy_file_range), else unused */
  bool has_fd;
} mpk_map;
int mpk__map_file(const char *path, mpk_map *m);    /* empty files map to data == NULL, len 0 */
int mpk__map_file_fd(const char *path, mpk_map *m); /* same, keeps the descriptor open */
void mpk__unmap(mpk_map *m);

/* Reads a whole (small) file, at most `max` bytes, NUL-terminated. Caller frees *out. */
int mpk__read_file(const char *path, size_t max, char **out, size_t *len);
int mpk__write_file(const char *path, const void *data, size_t len);

/* ---- zip ---- */
typedef struct mpk_zip_entry {
  char *name;     /* owned */
  uint64_t lho;   /* local header offset */
  uint64_t data;  /* absolute offset of the entry's data */
  uint64_t csize; /* bytes in the archive */
  uint64_t usize; /* uncompressed bytes */
  uint32_t crc;
  uint16_t method; /* 0 stored, 8 deflated */
  bool is_dir;
} mpk_zip_entry;

typedef struct mpk_zip {
  size_t n;
  mpk_zip_entry *e; /* central-directory order */
  size_t *by_name;  /* indices sorted by name */
  uint64_t cd_offset;
} mpk_zip;

/* Parses and validates the central directory and every local header of the zip in buf. */
int mpk__zip_parse(const char *what, const uint8_t *buf, size_t len, mpk_zip *z);
void mpk__zip_free(mpk_zip *z);
int mpk__zip_find(const mpk_zip *z, const char *name); /* index or -1 */
/* Writes the records after a central directory of n entries at cd_start (cd_size bytes) into t: the
 * ZIP64 end record and its locator when z64, then the end of central directory record (whose
 * counts and offsets then say 0xFFFF...). Returns the length (98 at most). */
#define MPK_ZIP_END_MAX (56 + 20 + 22)
size_t mpk__zip_end_records(uint8_t t[MPK_ZIP_END_MAX], uint64_t n, uint64_t cd_start, uint64_t cd_size, bool z64);

/* Bounds for compressed entries (foreign zips): one entry, and all of them together. */
#define MPK_MAX_INFLATE ((uint64_t)64 << 20)
#define MPK_MAX_INFLATE_TOTAL ((uint64_t)256 << 20)
#define MPK_MAX_MANIFEST ((uint64_t)64 << 20)

/* Inflates a raw-deflate entry into exactly usize bytes (more or fewer is an error). */
int mpk__inflate(const char *what, const uint8_t *src, uint64_t csize, uint64_t usize, uint8_t **out);

/* Copies s into out as printable ASCII (other bytes, '\\' and '"' as \\xNN), at most 64 source
 * bytes, for messages that quote a source's strings. Returns out. */
const char *mpk__printable(const char *s, size_t n, char *out, size_t cap);
/* A package name made from a file or folder name: characters outside [A-Za-z0-9._-] become '-',
 * no leading '.', at most 64; "model" when nothing is left. */
void mpk__safe_name(const char *src, char *out, size_t cap);

/* The shortest decimal that reads back as the same f32 (1e-05, not 9.99999974737875e-06). */
double mpk__shortest_f32(double v);

void mpk__sha256_hex(const void *data, size_t len, char hex[65]);

/* Checked arithmetic: false on overflow. */
static inline bool mpk__add(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool mpk__mul(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }

/* Packed bytes of dtype x shape; SERVD_ERANGE on overflow, SERVD_EFORMAT when the innermost
 * dimension is not a multiple of the block. `what` names the tensor. */
int mpk__packed_bytes(const char *what, int dtype, int ndim, const int64_t *shape, uint64_t *out);

/* Tests of the reader only: replaces the tensor index the writer will put in the manifest. */
struct mpk_writer;
int mpk__writer_replace_index(struct mpk_writer *w, json_t *tensors); /* steals tensors */
/* Tests of the zip64 paths without 4 GiB files: every size, offset and the end record in zip64 form. */
void mpk__writer_force_zip64(struct mpk_writer *w);

#endif
