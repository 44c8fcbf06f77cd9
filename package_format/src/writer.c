/* Package writer: a zip of stored entries, each entry's data 64-byte aligned in the file by a
 * padding extra field in its local header (as PyTorch's zip writer does), SHA-256 and CRC-32
 * computed while streaming, manifest.json last, zip64 records when sizes or offsets need them,
 * written to a temporary name and renamed into place at the end. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>
#include <openssl/evp.h>

#include "mpk-impl.h"
#include "mpk/package.h"
#include "mpk/safetensors.h"
#include "mpk/writer.h"

#define PAD_ID 0x4246 /* "FB": padding extra field, the id PyTorch uses */
#define ZIP64_ID 0x0001
#define U32_MAX_FIELD 0xFFFFFFFFull
#define WRITEBACK_CHUNK ((uint64_t)32 << 20)

typedef struct wentry {
  char *name;
  uint64_t lho, size;
  uint32_t crc;
} wentry;

struct mpk_writer {
  char *path, *tmp;
  int fd;
  uint64_t pos;
  uint64_t flushed; /* writeback started up to here (sync_file_range) */
  bool finished, failed;
  bool force_zip64; /* tests: zip64 records even for small archives */
  bool writing_manifest;
  wentry *e;
  size_t n, cap;
  json_t *meta, *files, *tensors;
  /* the open entry */
  bool open;
  uint64_t want, got;
  uLong crc;
  EVP_MD_CTX *sha;
  json_t *pending_tensor; /* index record of the tensor being streamed */
};

static int wfail(mpk_writer *w, int rc) {
  w->failed = true;
  return rc;
}

static int write_all(mpk_writer *w, const void *data, size_t len) {
  const char *p = data;
  while (len) {
    ssize_t k = write(w->fd, p, len > (1u << 30) ? (1u << 30) : len);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return wfail(w, servd_fail(SERVD_EIO, "%s: write failed: %s", w->tmp, k < 0 ? strerror(errno) : "no progress"));
    p += k;
    len -= (size_t)k;
    w->pos += (uint64_t)k;
  }
  /* Start writeback as we go, so the disk works while we hash and the final fsync is short. */
  if (w->pos - w->flushed >= WRITEBACK_CHUNK) {
    sync_file_range(w->fd, (off64_t)w->flushed, (off64_t)(w->pos - w->flushed), SYNC_FILE_RANGE_WRITE);
    w->flushed = w->pos;
  }
  return 0;
}

int mpk_writer_create(const char *path, mpk_writer **out) {
  *out = NULL;
  mpk_writer *w = calloc(1, sizeof *w);
  if (!w) return servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
  w->fd = -1;
  int rc = 0;
  w->path = strdup(path);
  if (w->path) w->tmp = malloc(strlen(path) + 16);
  w->meta = json_object();
  w->files = json_object();
  w->tensors = json_array();
  w->sha = EVP_MD_CTX_new();
  if (!w->tmp || !w->meta || !w->files || !w->tensors || !w->sha) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  sprintf(w->tmp, "%s.tmp.XXXXXX", path); /* same folder: rename is atomic */
  w->fd = mkostemp(w->tmp, O_CLOEXEC);
  if (w->fd < 0) {
    rc = servd_fail(SERVD_EIO, "%s: cannot create a temporary file next to it: %s", path, strerror(errno));
    w->tmp[0] = 0;
    goto fail;
  }
  (void)fchmod(w->fd, 0644); /* mkstemp makes 0600 */
  *out = w;
  return 0;
fail:
  mpk_writer_destroy(w);
  return rc;
}

void mpk_writer_destroy(mpk_writer *w) {
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  if (!w->finished && w->tmp && w->tmp[0]) unlink(w->tmp);
  for (size_t i = 0; i < w->n; i++) free(w->e[i].name);
  free(w->e);
  json_decref(w->meta);
  json_decref(w->files);
  json_decref(w->tensors);
  json_decref(w->pending_tensor);
  EVP_MD_CTX_free(w->sha);
  free(w->path);
  free(w->tmp);
  free(w);
}

uint64_t mpk_writer_bytes(const mpk_writer *w) { return w->pos; }

int mpk_writer_set(mpk_writer *w, const char *key, json_t *value) {
  if (!value) return servd_fail(SERVD_EINVAL, "%s: manifest field \"%s\": NULL value", w->path, key);
  if (!strcmp(key, "format_version") || !strcmp(key, "tensors") || !strcmp(key, "files")) {
    json_decref(value);
    return servd_fail(SERVD_EINVAL, "%s: manifest field \"%s\" is written by the writer", w->path, key);
  }
  if (!strcmp(key, "name") || !strcmp(key, "model_version")) {
    int rc = json_is_string(value)
                 ? mpk_check_name(w->path, key, json_string_value(value))
                 : servd_fail(SERVD_EFORMAT, "%s: manifest field \"%s\": expected a string", w->path, key);
    if (rc) {
      json_decref(value);
      return rc;
    }
  }
  json_object_set_new(w->meta, key, value);
  return 0;
}

/* Starts an entry of `size` bytes: local header with zip64 sizes when needed and padding so that
 * the data starts on a 64-byte boundary. The CRC is patched in when the entry ends. */
static int begin_entry(mpk_writer *w, const char *name, uint64_t size) {
  int rc;
  if (w->failed || w->finished) return servd_fail(SERVD_EINVAL, "%s: writer already failed or finished", w->path);
  if (w->open) return wfail(w, servd_fail(SERVD_EINVAL, "%s: entry still open", w->path));
  size_t nlen = strlen(name);
  if ((rc = mpk_check_entry_path(w->path, name, nlen))) return wfail(w, rc);
  if (!strcmp(name, "manifest.json") && !w->writing_manifest)
    return wfail(w, servd_fail(SERVD_EINVAL, "%s: \"manifest.json\" is written by the writer", w->path));
  if (json_object_get(w->files, name)) {
    for (size_t i = 0; i < w->n; i++)
      if (!strcmp(w->e[i].name, name))
        return wfail(w, servd_fail(SERVD_EINVAL, "%s: duplicate entry \"%s\"", w->path, name));
  }
  if (w->n == w->cap) {
    size_t nc = w->cap ? 2 * w->cap : 64;
    wentry *ne = realloc(w->e, nc * sizeof *ne);
    if (!ne) return wfail(w, servd_fail(SERVD_ENOMEM, "%s: out of memory", w->path));
    w->e = ne;
    w->cap = nc;
  }
  wentry *e = &w->e[w->n];
  e->name = strdup(name);
  if (!e->name) return wfail(w, servd_fail(SERVD_ENOMEM, "%s: out of memory", w->path));
  w->n++;
  e->lho = w->pos;
  e->size = size;
  bool z64 = size >= U32_MAX_FIELD || w->force_zip64;
  uint8_t h[30 + 1024 + 20 + 4 + 64];
  size_t fixed = 30 + nlen + (z64 ? 20 : 0) + 4;
  size_t pad = (SERVD_ALIGN - (w->pos + fixed) % SERVD_ALIGN) % SERVD_ALIGN;
  wr32(h, 0x04034b50);
  wr16(h + 4, z64 ? 45 : 20);
  wr16(h + 6, 0x0800); /* UTF-8 names */
  wr16(h + 8, 0);      /* stored */
  wr16(h + 10, 0);     /* 00:00, 1980-01-01: reproducible packages */
  wr16(h + 12, 0x21);
  wr32(h + 14, 0); /* CRC patched at the end of the entry */
  wr32(h + 18, z64 ? 0xFFFFFFFFu : (uint32_t)size);
  wr32(h + 22, z64 ? 0xFFFFFFFFu : (uint32_t)size);
  wr16(h + 26, (uint16_t)nlen);
  wr16(h + 28, (uint16_t)(fixed - 30 - nlen + pad));
  memcpy(h + 30, name, nlen);
  uint8_t *x = h + 30 + nlen;
  if (z64) {
    wr16(x, ZIP64_ID);
    wr16(x + 2, 16);
    wr64(x + 4, size);
    wr64(x + 12, size);
    x += 20;
  }
  wr16(x, PAD_ID);
  wr16(x + 2, (uint16_t)pad);
  memset(x + 4, 0, pad);
  if ((rc = write_all(w, h, fixed + pad))) return rc;
  w->open = true;
  w->want = size;
  w->got = 0;
  w->crc = crc32(0, NULL, 0);
  if (EVP_DigestInit_ex(w->sha, EVP_sha256(), NULL) != 1)
    return wfail(w, servd_fail(SERVD_ENOMEM, "%s: sha256 init failed", w->path));
  return 0;
}

static int entry_write(mpk_writer *w, const void *data, size_t len) {
  if (!w->open || w->failed) return servd_fail(SERVD_EINVAL, "%s: no open entry", w->path);
  if (len > w->want - w->got)
    return wfail(w, servd_fail(SERVD_EINVAL, "%s: entry \"%s\": %llu more bytes than declared", w->path,
                               w->e[w->n - 1].name, (unsigned long long)(len - (w->want - w->got))));
  const uint8_t *p = data;
  for (size_t off = 0; off < len;) {
    size_t k = len - off > (1u << 30) ? (1u << 30) : len - off;
    w->crc = crc32(w->crc, p + off, (uInt)k);
    off += k;
  }
  EVP_DigestUpdate(w->sha, data, len);
  w->got += len;
  return write_all(w, data, len);
}

static int end_entry(mpk_writer *w) {
  if (!w->open || w->failed) return servd_fail(SERVD_EINVAL, "%s: no open entry", w->path);
  wentry *e = &w->e[w->n - 1];
  if (w->got != w->want)
    return wfail(w, servd_fail(SERVD_EINVAL, "%s: entry \"%s\": %llu bytes written, %llu declared", w->path, e->name,
                               (unsigned long long)w->got, (unsigned long long)w->want));
  w->open = false;
  e->crc = (uint32_t)w->crc;
  uint8_t c[4];
  wr32(c, e->crc);
  if (pwrite(w->fd, c, 4, (off_t)(e->lho + 14)) != 4)
    return wfail(w, servd_fail(SERVD_EIO, "%s: write failed: %s", w->tmp, strerror(errno)));
  unsigned char md[32];
  unsigned mdlen = 0;
  EVP_DigestFinal_ex(w->sha, md, &mdlen);
  if (strcmp(e->name, "manifest.json")) {
    char hex[65];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    json_object_set_new(w->files, e->name, json_pack("{s:I,s:s}", "size", (json_int_t)e->size, "sha256", hex));
  }
  return 0;
}

int mpk_writer_add_file(mpk_writer *w, const char *path, const void *data, size_t len) {
  int rc;
  if ((rc = begin_entry(w, path, len)) || (rc = entry_write(w, data, len)) || (rc = end_entry(w))) return rc;
  return 0;
}

int mpk_writer_begin_tensor(mpk_writer *w, const char *name, servd_dtype dtype, int ndim, const int64_t *shape) {
  int rc;
  if (w->failed) return servd_fail(SERVD_EINVAL, "%s: writer already failed", w->path);
  if ((rc = mpk_check_tensor_name(w->path, name))) return wfail(w, rc);
  char what[300];
  snprintf(what, sizeof what, "%s: tensor \"%s\"", w->path, name);
  uint64_t nbytes;
  if ((rc = mpk__packed_bytes(what, dtype, ndim, shape, &nbytes))) return wfail(w, rc);
  int64_t stshape[SERVD_MAX_DIMS];
  memcpy(stshape, shape, sizeof(int64_t) * (size_t)ndim);
  const char *sdt = "U8";
  switch (dtype) {
  case SERVD_F32: sdt = "F32"; break;
  case SERVD_F16: sdt = "F16"; break;
  case SERVD_BF16: sdt = "BF16"; break;
  case SERVD_I32: sdt = "I32"; break;
  default: stshape[ndim - 1] = (int64_t)servd_dtype_row_bytes(dtype, shape[ndim - 1]); break;
  }
  json_t *md = NULL;
  if (servd_dtype_is_quantized(dtype)) { /* for other tools: what the raw bytes are */
    char shp[128] = "";
    for (int i = 0; i < ndim; i++)
      snprintf(shp + strlen(shp), sizeof shp - strlen(shp), "%s%lld", i ? "," : "", (long long)shape[i]);
    md = json_pack("{s:s,s:s}", "servd.dtype", servd_dtype_name(dtype), "servd.shape", shp);
  }
  char *hdr = NULL;
  size_t hlen = 0;
  rc = mpk_st_build_single(name, sdt, ndim, stshape, nbytes, md, SERVD_ALIGN, &hdr, &hlen);
  json_decref(md);
  if (rc) return wfail(w, rc);
  char path[300];
  snprintf(path, sizeof path, "weights/%s.safetensors", name);
  uint64_t total = hlen + nbytes;
  if ((rc = begin_entry(w, path, total)) || (rc = entry_write(w, hdr, hlen))) {
    free(hdr);
    return rc;
  }
  free(hdr);
  json_t *sh = json_array();
  for (int i = 0; i < ndim; i++) json_array_append_new(sh, json_integer(shape[i]));
  w->pending_tensor = json_pack("{s:s,s:s,s:o,s:s,s:I,s:I}", "name", name, "dtype", servd_dtype_name(dtype), "shape",
                                sh, "file", path, "offset", (json_int_t)hlen, "nbytes", (json_int_t)nbytes);
  if (!w->pending_tensor) return wfail(w, servd_fail(SERVD_ENOMEM, "%s: out of memory", w->path));
  return 0;
}

int mpk_writer_write(mpk_writer *w, const void *data, size_t len) { return entry_write(w, data, len); }

typedef struct sha_job {
  EVP_MD_CTX *sha;
  const void *data;
  size_t len;
} sha_job;

static void *sha_thread(void *arg) {
  sha_job *j = arg;
  EVP_DigestUpdate(j->sha, j->data, j->len);
  return NULL;
}

int mpk_writer_write_fd(mpk_writer *w, int fd, uint64_t offset, const void *data, size_t len) {
  if (!w->open || w->failed) return servd_fail(SERVD_EINVAL, "%s: no open entry", w->path);
  if (len > w->want - w->got) return entry_write(w, data, len); /* reports the overrun */
  const uint8_t *p = data;
  /* SHA-256 on a second thread while this one copies in the kernel and computes the CRC. */
  sha_job job = {w->sha, data, len};
  pthread_t th;
  bool threaded = len >= (64u << 10) && pthread_create(&th, NULL, sha_thread, &job) == 0;
  if (!threaded) EVP_DigestUpdate(w->sha, data, len);
  loff_t in = (loff_t)offset;
  size_t done = 0;
  while (done < len) {
    ssize_t k = copy_file_range(fd, &in, w->fd, NULL, len - done, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break; /* unsupported here (EXDEV, ENOSYS, ...): plain writes below */
    done += (size_t)k;
    w->pos += (uint64_t)k;
  }
  int rc = done < len ? write_all(w, p + done, len - done) : 0;
  for (size_t off = 0; off < len;) {
    size_t k = len - off > (1u << 30) ? (1u << 30) : len - off;
    w->crc = crc32(w->crc, p + off, (uInt)k);
    off += k;
  }
  if (threaded) pthread_join(th, NULL);
  w->got += len;
  if (rc) return rc;
  if (w->pos - w->flushed >= WRITEBACK_CHUNK) {
    sync_file_range(w->fd, (off64_t)w->flushed, (off64_t)(w->pos - w->flushed), SYNC_FILE_RANGE_WRITE);
    w->flushed = w->pos;
  }
  return 0;
}

int mpk_writer_end_tensor(mpk_writer *w) {
  if (!w->pending_tensor) return servd_fail(SERVD_EINVAL, "%s: no tensor being written", w->path);
  int rc = end_entry(w);
  if (rc) return rc;
  json_array_append_new(w->tensors, w->pending_tensor);
  w->pending_tensor = NULL;
  return 0;
}

int mpk_writer_add_tensor(mpk_writer *w, const char *name, servd_dtype dtype, int ndim, const int64_t *shape,
                          const void *data, size_t nbytes) {
  int rc;
  if ((rc = mpk_writer_begin_tensor(w, name, dtype, ndim, shape))) return rc;
  if (nbytes != w->want - w->got)
    return wfail(w, servd_fail(SERVD_EINVAL, "%s: tensor \"%s\": %zu bytes given, expected %llu", w->path, name, nbytes,
                               (unsigned long long)(w->want - w->got)));
  if ((rc = mpk_writer_write(w, data, nbytes))) return rc;
  return mpk_writer_end_tensor(w);
}

static int write_central(mpk_writer *w) {
  int rc;
  uint64_t cd_start = w->pos;
  for (size_t i = 0; i < w->n; i++) {
    const wentry *e = &w->e[i];
    size_t nlen = strlen(e->name);
    bool zs = e->size >= U32_MAX_FIELD || w->force_zip64, zo = e->lho >= U32_MAX_FIELD || w->force_zip64;
    size_t xlen = zs || zo ? 4 + (zs ? 16 : 0) + (zo ? 8 : 0) : 0;
    uint8_t h[46 + 1024 + 28];
    wr32(h, 0x02014b50);
    wr16(h + 4, (3 << 8) | 45); /* made by: unix, 4.5 */
    wr16(h + 6, zs || zo ? 45 : 20);
    wr16(h + 8, 0x0800);
    wr16(h + 10, 0);
    wr16(h + 12, 0);
    wr16(h + 14, 0x21);
    wr32(h + 16, e->crc);
    wr32(h + 20, zs ? 0xFFFFFFFFu : (uint32_t)e->size);
    wr32(h + 24, zs ? 0xFFFFFFFFu : (uint32_t)e->size);
    wr16(h + 28, (uint16_t)nlen);
    wr16(h + 30, (uint16_t)xlen);
    wr16(h + 32, 0);
    wr16(h + 34, 0);
    wr16(h + 36, 0);
    wr32(h + 38, 0100644u << 16);
    wr32(h + 42, zo ? 0xFFFFFFFFu : (uint32_t)e->lho);
    memcpy(h + 46, e->name, nlen);
    uint8_t *x = h + 46 + nlen;
    if (xlen) {
      wr16(x, ZIP64_ID);
      wr16(x + 2, (uint16_t)(xlen - 4));
      x += 4;
      if (zs) {
        wr64(x, e->size);
        wr64(x + 8, e->size);
        x += 16;
      }
      if (zo) {
        wr64(x, e->lho);
        x += 8;
      }
    }
    if ((rc = write_all(w, h, 46 + nlen + xlen))) return rc;
  }
  uint64_t cd_size = w->pos - cd_start;
  bool z64 = w->n >= 0xFFFF || cd_start >= U32_MAX_FIELD || cd_size >= U32_MAX_FIELD || w->force_zip64;
  uint8_t t[MPK_ZIP_END_MAX];
  return write_all(w, t, mpk__zip_end_records(t, w->n, cd_start, cd_size, z64));
}

int mpk_writer_finish(mpk_writer *w) {
  int rc = 0;
  char *js = NULL;
  if (w->failed || w->finished || w->open)
    return wfail(w, servd_fail(SERVD_EINVAL, "%s: cannot finish: %s", w->path,
                               w->open ? "an entry is still open" : "writer failed"));
  static const char *const required[] = {"name", "model_version", "kind", "entry_point", "config"};
  for (size_t i = 0; i < sizeof required / sizeof *required; i++)
    if (!json_object_get(w->meta, required[i]))
      return wfail(w, servd_fail(SERVD_EINVAL, "%s: manifest field \"%s\" was not set", w->path, required[i]));
  json_t *m = json_object();
  json_object_set_new(m, "format_version", json_integer(MPK_FORMAT_VERSION));
  json_object_update(m, w->meta);
  json_object_set(m, "tensors", w->tensors);
  json_object_set(m, "files", w->files);
  js = json_dumps(m, JSON_INDENT(1));
  json_decref(m);
  if (!js) return wfail(w, servd_fail(SERVD_ENOMEM, "%s: cannot serialize the manifest", w->path));
  w->writing_manifest = true;
  if ((rc = mpk_writer_add_file(w, "manifest.json", js, strlen(js))) || (rc = write_central(w))) goto fail;
  if (fsync(w->fd) != 0) {
    rc = wfail(w, servd_fail(SERVD_EIO, "%s: fsync failed: %s", w->tmp, strerror(errno)));
    goto fail;
  }
  close(w->fd);
  w->fd = -1;
  if (rename(w->tmp, w->path) != 0) {
    rc = wfail(w, servd_fail(SERVD_EIO, "%s: rename from %s failed: %s", w->path, w->tmp, strerror(errno)));
    goto fail;
  }
  w->finished = true;
  /* Make the rename durable. */
  char *dcopy = strdup(w->path);
  if (dcopy) {
    int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
    free(dcopy);
  }
fail:
  free(js);
  return rc;
}

void mpk__writer_force_zip64(mpk_writer *w) { w->force_zip64 = true; }

int mpk__writer_replace_index(mpk_writer *w, json_t *tensors) {
  json_decref(w->tensors);
  w->tensors = tensors;
  return 0;
}
