/* Generic (non-LLM) packages: a code folder, safetensors weight files and an optional JSON config
 * become a package of kind "generic" (the entry object has predict(inputs) -> outputs).
 * Everything is validated before the writer starts, so bad input fails fast; the writer is atomic
 * anyway. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "import-impl.h"
#include "mpk-impl.h"
#include "mpk/safetensors.h"

typedef struct wfile {
  const char *path; /* borrowed from the caller */
  mpk_map map;
  mpk_st_header *h;
} wfile;

typedef struct gref {
  const char *name;
  size_t file, idx;
} gref;
static int cmp_gref(const void *a, const void *b) { return strcmp(((const gref *)a)->name, ((const gref *)b)->name); }

static bool ident(const char *s, size_t n) {
  if (n == 0 || !(s[0] == '_' || ((s[0] | 32) >= 'a' && (s[0] | 32) <= 'z'))) return false;
  for (size_t i = 1; i < n; i++)
    if (!(s[i] == '_' || ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z') || (s[i] >= '0' && s[i] <= '9'))) return false;
  return true;
}

/* "a.b.c": every component an identifier. */
static bool dotted(const char *s, size_t n) {
  size_t start = 0;
  for (size_t i = 0; i <= n; i++)
    if (i == n || s[i] == '.') {
      if (!ident(s + start, i - start)) return false;
      start = i + 1;
    }
  return true;
}

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The code folder's files are imported as the package <basename of dir> (they go under
 * code/<basename>/), so the module's first component must be that name and the rest a file in dir:
 * "pkg.sub.mod" -> dir/sub/mod.py or dir/sub/mod/__init__.py; "pkg" -> dir/__init__.py. */
static int check_entry_point(const char *dir, const char *base, const char *ep) {
  const char *colon = strchr(ep, ':');
  if (!colon || !dotted(ep, (size_t)(colon - ep)) || !dotted(colon + 1, strlen(colon + 1)))
    return servd_fail(SERVD_EINVAL,
                      "--entry-point \"%.128s\": expected \"module:callable\" (dotted Python identifiers)", ep);
  size_t mlen = (size_t)(colon - ep), blen = strlen(base);
  if (mlen < blen || memcmp(ep, base, blen) || (mlen > blen && ep[blen] != '.'))
    return servd_fail(SERVD_EINVAL,
                      "--entry-point \"%.128s\": module must be inside the code folder, imported as package \"%s\" "
                      "(e.g. \"%s.model:Model\")",
                      ep, base, base);
  char rel[1024], a[4096 + 1040], b[4096 + 1040];
  size_t rl = mlen > blen ? mlen - blen - 1 : 0;
  if (rl >= sizeof rel) return servd_fail(SERVD_EINVAL, "--entry-point: module name too long");
  if (rl) memcpy(rel, ep + blen + 1, rl);
  rel[rl] = 0;
  for (char *c = rel; *c; c++)
    if (*c == '.') *c = '/';
  if (!rl) {
    snprintf(a, sizeof a, "%s/__init__.py", dir);
    if (is_file(a)) return 0;
    return servd_fail(SERVD_EINVAL, "--entry-point \"%.128s\": module file %s not found", ep, a);
  }
  snprintf(a, sizeof a, "%s/%s.py", dir, rel);
  snprintf(b, sizeof b, "%s/%s/__init__.py", dir, rel);
  if (is_file(a) || is_file(b)) return 0;
  return servd_fail(SERVD_EINVAL, "--entry-point \"%.128s\": module file %s (or %s) not found", ep, a, b);
}

/* The tensors of every file, checked (dtype, rank, size, name) and sorted by name; a name in two
 * files is an error naming both. *out owned by the caller. */
static int collect(wfile *wf, size_t nf, gref **out, size_t *nout, uint64_t *total) {
  size_t nt = 0, k = 0;
  for (size_t i = 0; i < nf; i++) nt += wf[i].h->n;
  gref *r = calloc(nt ? nt : 1, sizeof *r);
  if (!r) return servd_fail(SERVD_ENOMEM, "out of memory");
  int rc = 0;
  *total = 0;
  for (size_t i = 0; i < nf; i++)
    for (size_t j = 0; j < wf[i].h->n; j++) {
      const mpk_st_tensor *t = &wf[i].h->tensors[j];
      servd_dtype dt;
      if (mpk_st_dtype_to_servd(t->dtype, &dt) || dt == SERVD_I32) {
        rc =
            servd_fail(SERVD_EUNSUPPORTED, "%s: tensor \"%.64s\": dtype %s is not supported, expected F32, F16 or BF16",
                       wf[i].path, t->name, t->dtype);
        goto fail;
      }
      if (t->ndim > SERVD_MAX_DIMS) {
        rc = servd_fail(SERVD_EUNSUPPORTED, "%s: tensor \"%.64s\": %d dimensions, expected at most %d", wf[i].path,
                        t->name, t->ndim, SERVD_MAX_DIMS);
        goto fail;
      }
      for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0) {
          rc = servd_fail(SERVD_EUNSUPPORTED, "%s: tensor \"%.64s\": empty tensors are not supported", wf[i].path,
                          t->name);
          goto fail;
        }
      if ((rc = mpk_check_tensor_name(wf[i].path, t->name))) goto fail;
      r[k++] = (gref){t->name, i, j};
      *total += t->end - t->begin;
    }
  qsort(r, nt, sizeof *r, cmp_gref);
  for (size_t i = 1; i < nt; i++)
    if (!strcmp(r[i - 1].name, r[i].name)) {
      rc = servd_fail(SERVD_EFORMAT, "tensor \"%.64s\" is in both %s and %s, expected each name once", r[i].name,
                      wf[r[i - 1].file].path, wf[r[i].file].path);
      goto fail;
    }
  *out = r;
  *nout = nt;
  return 0;
fail:
  free(r);
  return rc;
}

/* The writer's temporary file (and the finished package) would be embedded as code if the output
 * went into the code folder. */
static int check_output_outside(const char *code_dir, const char *out_path) {
  char parent[4096];
  snprintf(parent, sizeof parent, "%s", out_path);
  char *slash = strrchr(parent, '/');
  if (slash == parent) parent[1] = 0;
  else if (slash) *slash = 0;
  else snprintf(parent, sizeof parent, ".");
  char *code = realpath(code_dir, NULL), *dst = realpath(parent, NULL);
  int rc = 0;
  if (code && dst) {
    size_t n = strlen(code);
    if (!strncmp(dst, code, n) && (dst[n] == 0 || dst[n] == '/' || n == 1))
      rc = servd_fail(SERVD_EINVAL, "%s: the output must not be inside the code folder %s (it would be packed as code)",
                      out_path, code_dir);
  }
  free(code);
  free(dst);
  return rc; /* an unresolvable output folder is reported by the writer */
}

int mpk_pack_generic(const char *const *weights, size_t n_weights, const char *config_path, const char *out_path,
                     const mpk_import_options *o) {
  int rc = 0;
  json_t *config = NULL;
  wfile *wf = NULL;
  gref *refs = NULL;
  size_t nt = 0;
  uint64_t total = 0;
  mpk_writer *w = NULL;
  if (!o || !o->code_dir || !o->entry_point)
    return servd_fail(SERVD_EINVAL, "generic package: a code folder and an entry point are required");
  char dir[4096];
  struct stat st;
  if (stat(o->code_dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return servd_fail(SERVD_EINVAL, "%s: the code folder does not exist or is not a folder (--code)", o->code_dir);
  /* Resolved so that "." or "dir/.." name the folder itself (its name is the import package). */
  char *real = realpath(o->code_dir, NULL);
  snprintf(dir, sizeof dir, "%s", real ? real : o->code_dir);
  free(real);
  size_t l = strlen(dir);
  while (l > 1 && dir[l - 1] == '/') dir[--l] = 0;
  const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
  if (!ident(base, strlen(base)))
    return servd_fail(SERVD_EINVAL,
                      "%s: the code folder's name \"%s\" must be a Python identifier (it is the import package)", dir,
                      base);
  if ((rc = check_entry_point(dir, base, o->entry_point)) || (rc = check_output_outside(dir, out_path))) return rc;

  if (config_path) {
    if ((rc = mpk__load_json_file(config_path, &config))) goto fail;
    if (!json_is_object(config)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: expected a JSON object (the model config)", config_path);
      goto fail;
    }
  } else if (!(config = json_object())) {
    rc = servd_fail(SERVD_ENOMEM, "out of memory");
    goto fail;
  }

  wf = calloc(n_weights ? n_weights : 1, sizeof *wf);
  if (!wf) {
    rc = servd_fail(SERVD_ENOMEM, "out of memory");
    goto fail;
  }
  for (size_t i = 0; i < n_weights; i++) {
    wf[i].path = weights[i];
    if ((rc = mpk__map_file_fd(weights[i], &wf[i].map)) ||
        (rc = mpk_st_parse(weights[i], wf[i].map.data, wf[i].map.len, &wf[i].h)))
      goto fail;
  }
  if ((rc = collect(wf, n_weights, &refs, &nt, &total))) goto fail;

  if ((rc = mpk_writer_create(out_path, &w))) goto fail;
  if ((rc = mpk_writer_set(w, "name", json_string(o->name ? o->name : base))) ||
      (rc = mpk_writer_set(w, "model_version", json_string(o->model_version ? o->model_version : "1"))) ||
      (rc = mpk_writer_set(w, "kind", json_string("generic"))) ||
      (rc = mpk_writer_set(w, "entry_point", json_string(o->entry_point))))
    goto fail;
  json_incref(config);
  if ((rc = mpk_writer_set(w, "config", config))) goto fail;
  if ((rc = mpk_add_code_dir(w, dir))) goto fail;

  mpk_progress pr = {.o = o, .total = total};
  for (size_t i = 0; i < nt; i++) {
    const wfile *f = &wf[refs[i].file];
    const mpk_st_tensor *t = &f->h->tensors[refs[i].idx];
    servd_dtype dt;
    mpk_st_dtype_to_servd(t->dtype, &dt); /* checked in collect */
    int64_t shape[SERVD_MAX_DIMS];
    int nd = t->ndim;
    if (nd == 0) {
      shape[0] = 1;
      nd = 1;
    } /* scalars become (1,), as in the Hugging Face import */
    else
      memcpy(shape, t->shape, sizeof(int64_t) * (size_t)nd);
    const uint8_t *data = (const uint8_t *)f->map.data + f->h->data_start + t->begin;
    if ((rc = mpk__emit_raw(w, &pr, t->name, dt, nd, shape, data, t->end - t->begin, f->map.fd,
                            f->h->data_start + t->begin)))
      goto fail;
  }
  rc = mpk_writer_finish(w);
fail:
  mpk_writer_destroy(w);
  free(refs);
  for (size_t i = 0; wf && i < n_weights; i++) {
    mpk_st_free(wf[i].h);
    mpk__unmap(&wf[i].map);
  }
  free(wf);
  json_decref(config);
  return rc;
}
