/* Small shared helpers: file mapping, whole-file I/O, hashing, checked sizes, name checks. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <openssl/evp.h>

#include "mpk-impl.h"
#include "mpk/writer.h"
#include "servd/tensor.h"

static int map_file(const char *path, mpk_map *m, bool keep_fd) {
  m->data = NULL;
  m->len = 0;
  m->has_fd = false;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return servd_fail(SERVD_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return servd_fail(SERVD_EIO, "%s: not a regular file", path);
  }
  if (st.st_size > 0) {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      return servd_fail(SERVD_EIO, "%s: mmap of %lld bytes failed: %s", path, (long long)st.st_size, strerror(e));
    }
    m->data = p;
    m->len = (size_t)st.st_size;
  }
  if (keep_fd) {
    m->fd = fd;
    m->has_fd = true;
  } else {
    close(fd); /* the mapping keeps the file */
  }
  return 0;
}

int mpk__map_file(const char *path, mpk_map *m) { return map_file(path, m, false); }
int mpk__map_file_fd(const char *path, mpk_map *m) { return map_file(path, m, true); }

void mpk__unmap(mpk_map *m) {
  if (m && m->data) munmap(m->data, m->len);
  if (m && m->has_fd) close(m->fd);
  if (m) {
    m->has_fd = false;
    m->data = NULL;
    m->len = 0;
  }
}

int mpk__read_file(const char *path, size_t max, char **out, size_t *len) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return servd_fail(SERVD_EIO, "%s: cannot open: %s", path, strerror(errno));
  int rc = 0;
  char *buf = NULL;
  if (fseeko(f, 0, SEEK_END) != 0) {
    rc = servd_fail(SERVD_EIO, "%s: cannot seek", path);
    goto fail;
  }
  off_t sz = ftello(f);
  if (sz < 0 || (uint64_t)sz > max) {
    rc = servd_fail(SERVD_EFORMAT, "%s: size %lld bytes, expected at most %zu", path, (long long)sz, max);
    goto fail;
  }
  rewind(f);
  buf = malloc((size_t)sz + 1);
  if (!buf) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
    rc = servd_fail(SERVD_EIO, "%s: short read", path);
    goto fail;
  }
  buf[sz] = 0;
  *out = buf;
  if (len) *len = (size_t)sz;
  buf = NULL;
fail:
  free(buf);
  fclose(f);
  return rc;
}

int mpk__write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return servd_fail(SERVD_EIO, "%s: cannot create: %s", path, strerror(errno));
  size_t w = len ? fwrite(data, 1, len, f) : 0;
  int bad = fclose(f) != 0 || w != len;
  if (bad) return servd_fail(SERVD_EIO, "%s: write failed: %s", path, strerror(errno));
  return 0;
}

void mpk__sha256_hex(const void *data, size_t len, char hex[65]) {
  unsigned char md[32];
  unsigned int mdlen = 0;
  EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL);
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

int mpk__inflate(const char *what, const uint8_t *src, uint64_t csize, uint64_t usize, uint8_t **out) {
  *out = NULL;
  if (usize > MPK_MAX_INFLATE)
    return servd_fail(SERVD_ERANGE, "%s: uncompressed size %llu, expected at most %llu bytes", what,
                      (unsigned long long)usize, (unsigned long long)MPK_MAX_INFLATE);
  if (csize > 2 * MPK_MAX_INFLATE)
    return servd_fail(SERVD_ERANGE, "%s: compressed size %llu, expected at most %llu bytes", what,
                      (unsigned long long)csize, (unsigned long long)(2 * MPK_MAX_INFLATE));
  uint8_t *buf = malloc(usize + 1); /* +1 catches data that expands beyond the declared size */
  if (!buf) return servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
  z_stream zs = {0};
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) {
    free(buf);
    return servd_fail(SERVD_ENOMEM, "%s: inflateInit failed", what);
  }
  zs.next_in = (Bytef *)src;
  zs.avail_in = (uInt)csize; /* csize <= MPK_MAX_INFLATE checked by the caller's bounds */
  zs.next_out = buf;
  zs.avail_out = (uInt)(usize + 1);
  int zr = inflate(&zs, Z_FINISH);
  uint64_t got = zs.total_out;
  inflateEnd(&zs);
  int rc = 0;
  if (zr != Z_STREAM_END && got > usize)
    rc = servd_fail(SERVD_EFORMAT, "%s: deflated data expands beyond the declared %llu bytes", what,
                    (unsigned long long)usize);
  else if (zr != Z_STREAM_END) rc = servd_fail(SERVD_EFORMAT, "%s: corrupt deflate stream (zlib %d)", what, zr);
  else if (got != usize)
    rc = servd_fail(SERVD_EFORMAT, "%s: inflated to %llu bytes, expected %llu", what, (unsigned long long)got,
                    (unsigned long long)usize);
  if (rc) {
    free(buf);
    return rc;
  }
  *out = buf;
  return 0;
}

int mpk__packed_bytes(const char *what, int dtype, int ndim, const int64_t *shape, uint64_t *out) {
  if (dtype < 0 || dtype >= SERVD_DTYPE_COUNT) return servd_fail(SERVD_EFORMAT, "%s: unknown dtype %d", what, dtype);
  if (ndim < 1 || ndim > SERVD_MAX_DIMS)
    return servd_fail(SERVD_EFORMAT, "%s: %d dimensions, expected 1..%d", what, ndim, SERVD_MAX_DIMS);
  uint64_t be = servd_dtype_block_elems((servd_dtype)dtype), bb = servd_dtype_block_bytes((servd_dtype)dtype);
  uint64_t rows = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1)
      return servd_fail(SERVD_EFORMAT, "%s: shape[%d] = %lld, expected >= 1", what, i, (long long)shape[i]);
    if (i < ndim - 1 && !mpk__mul(rows, (uint64_t)shape[i], &rows))
      return servd_fail(SERVD_ERANGE, "%s: element count overflows", what);
  }
  uint64_t inner = (uint64_t)shape[ndim - 1];
  if (inner % be)
    return servd_fail(SERVD_EFORMAT, "%s: innermost dimension %llu is not a multiple of the %s block of %llu", what,
                      (unsigned long long)inner, servd_dtype_name((servd_dtype)dtype), (unsigned long long)be);
  uint64_t row, total;
  if (!mpk__mul(inner / be, bb, &row) || !mpk__mul(row, rows, &total) || total > (uint64_t)INT64_MAX)
    return servd_fail(SERVD_ERANGE, "%s: byte size overflows", what);
  *out = total;
  return 0;
}

int mpk_check_entry_path(const char *what, const char *path, size_t len) {
  if (len == 0 || len > 1024)
    return servd_fail(SERVD_EFORMAT, "%s: entry name of %zu bytes, expected 1..1024", what, len);
  if (path[0] == '/') return servd_fail(SERVD_EFORMAT, "%s: entry \"%.*s\" is an absolute path", what, (int)len, path);
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    unsigned char c = i < len ? (unsigned char)path[i] : '/';
    if (i < len && (c < 0x20 || c == 0x7f || c == '\\' || c == ':'))
      return servd_fail(SERVD_EFORMAT, "%s: entry \"%.*s\": byte 0x%02x not allowed in a path", what, (int)len, path,
                        c);
    if (c != '/') continue;
    size_t cl = i - start;
    bool trailing_dir = i == len && cl == 0 && len > 1; /* "dir/" names a folder */
    if (!trailing_dir &&
        (cl == 0 || (cl == 1 && path[start] == '.') || (cl == 2 && path[start] == '.' && path[start + 1] == '.')))
      return servd_fail(SERVD_EFORMAT, "%s: entry \"%.*s\": empty, \".\" or \"..\" path component", what, (int)len,
                        path);
    start = i + 1;
  }
  return 0;
}

const char *mpk__printable(const char *s, size_t n, char *out, size_t cap) {
  size_t o = 0;
  if (!cap) return out;
  for (size_t i = 0; i < n && i < 64 && o + 5 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') out[o++] = (char)c;
    else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
  }
  if (n > 64 && o + 4 < cap) o += (size_t)snprintf(out + o, cap - o, "...");
  out[o] = 0;
  return out;
}

int mpk_check_tensor_name(const char *what, const char *name) {
  size_t n = strlen(name);
  char q[400];
  if (n == 0 || n > 256 || name[0] == '.')
    return servd_fail(SERVD_EFORMAT, "%s: tensor name \"%s\": expected 1..256 characters, not starting with '.'", what,
                      mpk__printable(name, n, q, sizeof q));
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return servd_fail(SERVD_EFORMAT, "%s: tensor name \"%s\": character '%c' not allowed, expected [A-Za-z0-9._-]",
                        what, mpk__printable(name, n, q, sizeof q), c >= 0x20 && c < 0x7f ? c : '?');
  }
  return 0;
}

/* Names and versions reach logs, terminals and URLs: a small charset keeps escapes, newlines and
 * path tricks out of all of them. */
int mpk_check_name(const char *what, const char *field, const char *s) {
  size_t n = strlen(s);
  char q[400];
  bool ok = n >= 1 && n <= 64 && s[0] != '.';
  for (size_t i = 0; ok && i < n; i++) {
    char c = s[i];
    ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  }
  if (ok) return 0;
  return servd_fail(SERVD_EFORMAT, "%s: %s \"%s\": expected 1..64 characters of [A-Za-z0-9._-], not starting with '.'",
                    what, field, mpk__printable(s, n, q, sizeof q));
}

void mpk__safe_name(const char *src, char *out, size_t cap) {
  size_t o = 0;
  for (const char *p = src; *p && o + 1 < cap && o < 64; p++) {
    char c = *p;
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (o == 0 && c == '.') continue;
    out[o++] = ok ? c : '-';
  }
  if (o == 0 && cap > 5) o = (size_t)snprintf(out, cap, "model");
  out[o] = 0;
}

double mpk__shortest_f32(double v) {
  char b[32];
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(b, sizeof b, "%.*g", prec, v);
    if ((float)strtod(b, NULL) == (float)v) return strtod(b, NULL);
  }
  return v;
}
