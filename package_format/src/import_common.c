/* Pieces shared by the Hugging Face and GGUF importers: code embedding, manifest fields, tensor
 * emission with conversion, progress. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "arch.h"
#include "import-impl.h"
#include "mpk-impl.h"

void mpk_import_options_init(mpk_import_options *o) {
  memset(o, 0, sizeof *o);
  o->dtype = SERVD_Q8_0;
}

void mpk__progress_add(mpk_progress *pr, uint64_t bytes) {
  pr->done += bytes;
  if (pr->o && pr->o->progress) pr->o->progress(pr->o->progress_ctx, pr->done, pr->total);
}

int mpk__emit_raw(mpk_writer *w, mpk_progress *pr, const char *name, servd_dtype dt, int ndim, const int64_t *shape,
                  const void *data, uint64_t nbytes, int src_fd, uint64_t src_offset) {
  int rc;
  if ((rc = mpk_writer_begin_tensor(w, name, dt, ndim, shape))) return rc;
  const uint64_t chunk = 64u << 20;
  for (uint64_t off = 0; off < nbytes; off += chunk) {
    uint64_t k = nbytes - off < chunk ? nbytes - off : chunk;
    rc = src_fd >= 0 ? mpk_writer_write_fd(w, src_fd, src_offset + off, (const char *)data + off, k)
                     : mpk_writer_write(w, (const char *)data + off, k);
    if (rc) return rc;
    mpk__progress_add(pr, k);
  }
  return mpk_writer_end_tensor(w);
}

int mpk__emit_converted(mpk_writer *w, mpk_progress *pr, const char *name, servd_dtype dt, int ndim,
                        const int64_t *shape, const void *src, uint64_t src_row_bytes, mpk_row_to_f32_fn conv,
                        const void *conv_ctx) {
  int rc;
  int64_t n = shape[ndim - 1], rows = 1;
  for (int i = 0; i < ndim - 1; i++) rows *= shape[i]; /* sizes checked by the source parser */
  size_t out_row = servd_dtype_row_bytes(dt, n);
  if (!out_row)
    return servd_fail(SERVD_EINVAL, "%s: cannot store %lld columns as %s", name, (long long)n, servd_dtype_name(dt));
  float *f = malloc((size_t)n * sizeof *f);
  size_t per = out_row >= (4u << 20) ? 1 : (4u << 20) / out_row;
  uint8_t *obuf = malloc(per * out_row);
  if (!f || !obuf) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory converting", name);
    goto fail;
  }
  if ((rc = mpk_writer_begin_tensor(w, name, dt, ndim, shape))) goto fail;
  for (int64_t r = 0; r < rows;) {
    size_t k = 0;
    for (; k < per && r < rows; k++, r++) {
      if ((rc = conv(conv_ctx, (const uint8_t *)src + (uint64_t)r * src_row_bytes, f, n)) ||
          (rc = servd_row_from_f32(dt, f, obuf + k * out_row, n)))
        goto fail;
    }
    if ((rc = mpk_writer_write(w, obuf, k * out_row))) goto fail;
    mpk__progress_add(pr, k * src_row_bytes);
  }
  rc = mpk_writer_end_tensor(w);
fail:
  free(f);
  free(obuf);
  return rc;
}

int mpk__load_json_file(const char *path, json_t **out) {
  char *buf = NULL;
  size_t len = 0;
  int rc = mpk__read_file(path, MPK_MAX_SIDE_FILE, &buf, &len);
  if (rc) return rc;
  json_error_t err;
  *out = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &err);
  free(buf);
  if (!*out) return servd_fail(SERVD_EFORMAT, "%s: line %d: %s", path, err.line, err.text);
  return 0;
}

int mpk__add_source_file(mpk_writer *w, const char *path, const char *entry, bool json, bool *present) {
  struct stat st;
  if (present) *present = false;
  if (stat(path, &st) != 0) return 0;
  char *buf = NULL;
  size_t len = 0;
  int rc = mpk__read_file(path, MPK_MAX_SIDE_FILE, &buf, &len);
  if (rc) return rc;
  if (json) {
    json_error_t err;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &err);
    if (!j) {
      free(buf);
      return servd_fail(SERVD_EFORMAT, "%s: line %d: %s", path, err.line, err.text);
    }
    json_decref(j);
  }
  rc = mpk_writer_add_file(w, entry, buf, len);
  free(buf);
  if (!rc && present) *present = true;
  return rc;
}

int mpk__source_inside(const char *root, const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode)) return 0; /* absent files are the caller's business */
  char *r = realpath(root, NULL), *t = realpath(path, NULL);
  int rc = 0;
  size_t rl = r ? strlen(r) : 0;
  if (!r || !t) rc = servd_fail(SERVD_EINVAL, "%s: a symbolic link that does not resolve: %s", path, strerror(errno));
  else if (strncmp(t, r, rl) || (t[rl] != '/' && !(rl == 1 && r[0] == '/')))
    rc = servd_fail(SERVD_EINVAL,
                    "%s: a symbolic link to %s, outside %s: the packer takes only files inside the source folder "
                    "(copy the file in instead of linking it)",
                    path, t, r);
  free(r);
  free(t);
  return rc;
}

int mpk__source_regular(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return 0; /* absent files are the caller's business */
  if (!S_ISREG(st.st_mode))
    return servd_fail(SERVD_EINVAL, "%s: not a regular file (a folder, device, FIFO or socket cannot be packed)", path);
  return 0;
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Adds dir's files under prefix, sorted (reproducible packages), recursing into folders. Symbolic
 * links are followed only when they stay inside `root`; other special files are refused. */
static int add_tree(mpk_writer *w, const char *root, const char *dir, const char *prefix, int depth) {
  if (depth > 16) return servd_fail(SERVD_EINVAL, "%s: folders nested too deeply", dir);
  DIR *d = opendir(dir);
  if (!d) return servd_fail(SERVD_EIO, "%s: cannot open the code folder: %s", dir, strerror(errno));
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    const char *s = de->d_name;
    size_t l = strlen(s);
    if (s[0] == '.' || !strcmp(s, "__pycache__") || (l > 4 && !strcmp(s + l - 4, ".pyc"))) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 32;
      char **nn = realloc(names, cap * sizeof *nn);
      if (!nn) {
        rc = servd_fail(SERVD_ENOMEM, "out of memory");
        goto fail;
      }
      names = nn;
    }
    if (!(names[n] = strdup(s))) {
      rc = servd_fail(SERVD_ENOMEM, "out of memory");
      goto fail;
    }
    n++;
  }
  qsort(names, n, sizeof *names, cmp_cstr);
  for (size_t i = 0; i < n && !rc; i++) {
    char path[4096], entry[2048];
    if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= (int)sizeof path ||
        snprintf(entry, sizeof entry, "%s/%s", prefix, names[i]) >= (int)sizeof entry) {
      rc = servd_fail(SERVD_EINVAL, "%s/%s: path too long", dir, names[i]);
      break;
    }
    struct stat st;
    if ((rc = mpk__source_inside(root, path))) break;
    if (stat(path, &st) != 0) {
      rc = servd_fail(SERVD_EIO, "%s: %s", path, strerror(errno));
      break;
    }
    if (S_ISDIR(st.st_mode)) rc = add_tree(w, root, path, entry, depth + 1);
    else if (S_ISREG(st.st_mode)) rc = mpk__add_source_file(w, path, entry, false, NULL);
    else
      rc = servd_fail(SERVD_EINVAL, "%s: not a regular file or folder (a device, FIFO or socket cannot be packed)",
                      path);
  }
fail:
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  closedir(d);
  return rc;
}

int mpk_add_code_dir(mpk_writer *w, const char *dir) {
  char copy[4096];
  snprintf(copy, sizeof copy, "%s", dir);
  size_t l = strlen(copy);
  while (l > 1 && copy[l - 1] == '/') copy[--l] = 0;
  const char *base = strrchr(copy, '/');
  base = base ? base + 1 : copy;
  struct stat st;
  if (stat(copy, &st) != 0 || !S_ISDIR(st.st_mode))
    return servd_fail(SERVD_EINVAL, "%s: the model code folder does not exist (set --code or SERVD_MODEL_CODE)", copy);
  char prefix[sizeof copy + 8]; /* "code/" + a base name that fits in copy */
  snprintf(prefix, sizeof prefix, "code/%s", base);
  return add_tree(w, copy, copy, prefix, 0);
}

int mpk__common_fields(mpk_writer *w, const mpk_import_options *o, const mpk_arch *a, const char *default_name) {
  int rc;
  char name[80], code[4096];
  mpk__safe_name(default_name, name, sizeof name);
  const char *dir = o->code_dir;
  if (!dir && (dir = getenv("SERVD_MODEL_CODE")) && !*dir) dir = NULL;
  if (!dir) {
    if ((rc = mpk__code_dir_for(a, code, sizeof code))) return rc;
    dir = code;
  }
  if ((rc = mpk_writer_set(w, "name", json_string(o->name ? o->name : name))) ||
      (rc = mpk_writer_set(w, "model_version", json_string(o->model_version ? o->model_version : "1"))) ||
      (rc = mpk_writer_set(w, "kind", json_string("causal-lm"))) ||
      (rc = mpk_writer_set(w, "architecture", json_string(a->name))) ||
      (rc = mpk_writer_set(w, "entry_point", json_string(o->entry_point ? o->entry_point : a->entry_point))))
    return rc;
  return mpk_add_code_dir(w, dir);
}
