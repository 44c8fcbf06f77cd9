/* Package reader: maps the file, validates the zip, the manifest and the tensor index (cross-checked
 * against each weight file's safetensors header), and hands out tensors that are views into the
 * mapping. The mapping is one servd_storage whose release callback unmaps the file: it lives until
 * mpk_close and the last tensor taken from the package are gone. */
#include <stdio.h>
#include <stdlib.h>
#include <zlib.h>
#include <openssl/evp.h>

#include "mpk-impl.h"
#include "mpk/integrity.h"
#include "mpk/package.h"
#include "mpk/safetensors.h"
#include "mpk/writer.h"

typedef struct pkg_tensor {
  const char *name; /* borrowed from the manifest */
  servd_dtype dtype;
  int ndim;
  int64_t shape[SERVD_MAX_DIMS];
  int entry;
  uint64_t abs, nbytes;
} pkg_tensor;

struct mpk_package {
  char *path;
  mpk_map map;         /* until wrapped into `storage` */
  const uint8_t *base; /* the mapping, valid while `storage` lives */
  mpk_zip zip;
  json_t *manifest;
  uint8_t **inflated; /* per entry: inflated data of deflated entries, else NULL */
  int *files;         /* entry indices of file entries (not folders), central-directory order */
  int nfiles;
  pkg_tensor *t;
  size_t nt;
  size_t *t_by_name;
  servd_storage *storage;
  const char *name, *kind, *entry_point, *model_version, *rope_layout;
};

static void release_mapping(void *ctx) {
  mpk_map *m = ctx;
  mpk__unmap(m);
  free(m);
}

static int cmp_tensor_name(const void *a, const void *b, void *ctx) {
  const mpk_package *p = ctx;
  return strcmp(p->t[*(const size_t *)a].name, p->t[*(const size_t *)b].name);
}
static int cmp_tensor_abs(const void *a, const void *b, void *ctx) {
  const mpk_package *p = ctx;
  uint64_t x = p->t[*(const size_t *)a].abs, y = p->t[*(const size_t *)b].abs;
  return x < y ? -1 : x > y;
}

static int find_tensor(const mpk_package *p, const char *name) {
  size_t lo = 0, hi = p->nt;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(p->t[p->t_by_name[mid]].name, name);
    if (c == 0) return (int)p->t_by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

static const uint8_t *entry_data(const mpk_package *p, int i) {
  return p->inflated[i] ? p->inflated[i] : p->base + p->zip.e[i].data;
}

static const char *req_str(const char *what, json_t *m, const char *key, int *rc) {
  json_t *v = json_object_get(m, key);
  if (!json_is_string(v) || json_string_length(v) == 0) {
    *rc = servd_fail(SERVD_EFORMAT, "%s: manifest.json: \"%s\": expected a non-empty string", what, key);
    return NULL;
  }
  return json_string_value(v);
}

static bool is_ident(const char *s, size_t n, bool dots) {
  if (n == 0 || !(s[0] == '_' || ((s[0] | 32) >= 'a' && (s[0] | 32) <= 'z'))) return false;
  for (size_t i = 1; i < n; i++) {
    char c = s[i];
    bool ok = c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z') || (c >= '0' && c <= '9') ||
              (dots && c == '.' && s[i - 1] != '.');
    if (!ok) return false;
  }
  return s[n - 1] != '.';
}

static int check_entry_ref(const char *what, mpk_package *p, json_t *obj, const char *key, const char *field) {
  json_t *v = json_object_get(obj, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v) || mpk__zip_find(&p->zip, json_string_value(v)) < 0)
    return servd_fail(SERVD_EFORMAT, "%s: manifest.json: %s: expected the path of an entry of the archive", what,
                      field);
  return 0;
}

/* "inputs" / "outputs" (optional): the tensors a generic package's predict takes and gives, as KServe
 * v2 model metadata lists them (GET /v2/models/{m}, /config and gRPC ModelMetadata/ModelConfig copy
 * them): each {"name", "datatype" (a KServe datatype), "shape" (1..8 integers, -1 a free size)}. */
static int check_tensor_specs(const char *what, json_t *m, const char *key) {
  static const char *const dts[] = {"BOOL",  "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                    "INT32", "INT64", "FP16",   "FP32",   "FP64",   "BF16", "BYTES"};
  json_t *v = json_object_get(m, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_array(v) || json_array_size(v) > 64)
    return servd_fail(SERVD_EFORMAT, "%s: manifest.json: %s: expected an array of at most 64 tensors", what, key);
  for (size_t i = 0; i < json_array_size(v); i++) {
    json_t *t = json_array_get(v, i), *shape = json_object_get(t, "shape");
    const char *name = json_string_value(json_object_get(t, "name"));
    const char *dt = json_string_value(json_object_get(t, "datatype"));
    bool ok = json_is_object(t) && name && name[0] && strlen(name) <= 128 && dt && json_is_array(shape) &&
              json_array_size(shape) >= 1 && json_array_size(shape) <= 8;
    bool known = false;
    for (size_t k = 0; ok && k < sizeof dts / sizeof dts[0]; k++) known |= strcmp(dt, dts[k]) == 0;
    for (size_t d = 0; ok && d < json_array_size(shape); d++) {
      json_t *e = json_array_get(shape, d);
      ok = json_is_integer(e) && json_integer_value(e) >= -1;
    }
    if (!ok || !known)
      return servd_fail(SERVD_EFORMAT,
                        "%s: manifest.json: %s[%zu]: expected {\"name\": 1..128 characters, \"datatype\": a KServe "
                        "datatype (FP32, INT32, BYTES, ...), \"shape\": 1..8 integers, -1 for a free size}",
                        what, key, i);
  }
  return 0;
}

/* "capabilities" (optional): what the package's Python may do beyond the interpreters' guards,
 * distinct names servd knows ("native": ctypes/cffi; "fd": descriptors it did not open). An unknown
 * one is refused, not ignored: the package would be run without what it asked for. */
static int check_capabilities(const char *what, json_t *m) {
  static const char *const known[] = {"native", "fd"};
  json_t *v = json_object_get(m, "capabilities");
  if (!v || json_is_null(v)) return 0;
  bool seen[sizeof known / sizeof known[0]] = {false};
  for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++) {
    const char *c = json_string_value(json_array_get(v, i));
    size_t k = 0;
    while (c && k < sizeof known / sizeof known[0] && strcmp(c, known[k])) k++;
    if (!c || k == sizeof known / sizeof known[0] || seen[k])
      return servd_fail(SERVD_EFORMAT,
                        "%s: manifest.json: capabilities[%zu]: expected one of \"native\", \"fd\", each once", what, i);
    seen[k] = true;
  }
  if (!json_is_array(v))
    return servd_fail(SERVD_EFORMAT, "%s: manifest.json: capabilities: expected an array of strings", what);
  return 0;
}

/* The manifest's top-level fields, the file list and hashes. */
static int check_manifest(const char *what, mpk_package *p) {
  json_t *m = p->manifest;
  int rc = 0;
  json_t *fv = json_object_get(m, "format_version");
  if (!json_is_integer(fv) || json_integer_value(fv) < 1 || json_integer_value(fv) > MPK_FORMAT_VERSION)
    return servd_fail(SERVD_EFORMAT, "%s: manifest.json: format_version: expected an integer 1..%d", what,
                      MPK_FORMAT_VERSION);
  if (!(p->name = req_str(what, m, "name", &rc)) || !(p->model_version = req_str(what, m, "model_version", &rc)) ||
      !(p->kind = req_str(what, m, "kind", &rc)) || !(p->entry_point = req_str(what, m, "entry_point", &rc)))
    return rc;
  if ((rc = mpk_check_name(what, "manifest.json: name", p->name)) ||
      (rc = mpk_check_name(what, "manifest.json: model_version", p->model_version)))
    return rc;
  json_t *an = json_object_get(m, "architecture"); /* registry name; checked against the registry by mpk_check_model */
  if (an && (!json_is_string(an) || mpk_check_name(what, "manifest.json: architecture", json_string_value(an))))
    return json_is_string(an) ? SERVD_EFORMAT
                              : servd_fail(SERVD_EFORMAT, "%s: manifest.json: architecture: expected a string", what);
  if (strcmp(p->kind, "causal-lm") && strcmp(p->kind, "generic") && strcmp(p->kind, "lora-adapter"))
    return servd_fail(SERVD_EFORMAT,
                      "%s: manifest.json: kind \"%.32s\": expected \"causal-lm\", \"generic\" or \"lora-adapter\"",
                      what, p->kind);
  const char *colon = strchr(p->entry_point, ':');
  if (!colon || !is_ident(p->entry_point, (size_t)(colon - p->entry_point), true) ||
      !is_ident(colon + 1, strlen(colon + 1), true))
    return servd_fail(SERVD_EFORMAT, "%s: manifest.json: entry_point \"%.64s\": expected \"module:callable\"", what,
                      p->entry_point);
  if (!json_is_object(json_object_get(m, "config")))
    return servd_fail(SERVD_EFORMAT, "%s: manifest.json: config: expected an object (the model config)", what);
  json_t *rl = json_object_get(m, "rope_layout");
  if (rl && !json_is_null(rl)) {
    if (!json_is_string(rl) || (strcmp(json_string_value(rl), "half") && strcmp(json_string_value(rl), "interleaved")))
      return servd_fail(SERVD_EFORMAT, "%s: manifest.json: rope_layout: expected \"half\" or \"interleaved\"", what);
    p->rope_layout = json_string_value(rl);
  }
  json_t *tok = json_object_get(m, "tokenizer");
  if (tok && !json_is_null(tok)) {
    if (!json_is_object(tok))
      return servd_fail(SERVD_EFORMAT, "%s: manifest.json: tokenizer: expected an object", what);
    if ((rc = check_entry_ref(what, p, tok, "file", "tokenizer.file")) ||
        (rc = check_entry_ref(what, p, tok, "config", "tokenizer.config")))
      return rc;
  }
  if (!strcmp(p->kind, "causal-lm") &&
      (!json_is_object(tok) || !json_is_string(json_object_get(tok, "file")) || !p->rope_layout))
    return servd_fail(SERVD_EFORMAT, "%s: manifest.json: a causal-lm package needs tokenizer.file and rope_layout",
                      what);
  if ((rc = check_entry_ref(what, p, m, "chat_template_file", "chat_template_file"))) return rc;
  if ((rc = check_tensor_specs(what, m, "inputs")) || (rc = check_tensor_specs(what, m, "outputs")) ||
      (rc = check_capabilities(what, m)))
    return rc;

  /* files: exactly the archive's file entries other than manifest.json, each with size and sha256. */
  json_t *files = json_object_get(m, "files");
  if (!json_is_object(files)) return servd_fail(SERVD_EFORMAT, "%s: manifest.json: files: expected an object", what);
  size_t listed = 0;
  for (int k = 0; k < p->nfiles; k++) {
    const mpk_zip_entry *e = &p->zip.e[p->files[k]];
    if (!strcmp(e->name, "manifest.json") || !strcmp(e->name, MPK_SIGNATURE_ENTRY)) continue; /* not hashed there */
    json_t *f = json_object_get(files, e->name);
    json_t *sz = json_object_get(f, "size"), *h = json_object_get(f, "sha256");
    if (!json_is_object(f))
      return servd_fail(SERVD_EFORMAT, "%s: entry \"%s\" is not listed in manifest.json files", what, e->name);
    if (!json_is_integer(sz) || (uint64_t)json_integer_value(sz) != e->usize)
      return servd_fail(SERVD_EFORMAT, "%s: manifest.json: files[\"%s\"].size: expected %llu", what, e->name,
                        (unsigned long long)e->usize);
    const char *hs = json_string_value(h);
    if (!hs || strlen(hs) != 64 || strspn(hs, "0123456789abcdef") != 64)
      return servd_fail(SERVD_EFORMAT, "%s: manifest.json: files[\"%s\"].sha256: expected 64 lowercase hex digits",
                        what, e->name);
    listed++;
  }
  if (listed != json_object_size(files)) {
    const char *key;
    json_t *v;
    json_object_foreach(files, key, v) {
      int i = mpk__zip_find(&p->zip, key);
      if (i < 0 || p->zip.e[i].is_dir || !strcmp(key, "manifest.json") || !strcmp(key, MPK_SIGNATURE_ENTRY))
        return servd_fail(SERVD_EFORMAT,
                          "%s: manifest.json: files lists \"%.128s\", which is not a file of the archive", what, key);
    }
  }
  return 0;
}

static int st_dtype_for(servd_dtype dt, const char **out) {
  switch (dt) {
  case SERVD_F32: *out = "F32"; return 0;
  case SERVD_F16: *out = "F16"; return 0;
  case SERVD_BF16: *out = "BF16"; return 0;
  case SERVD_I32: *out = "I32"; return 0;
  default: *out = "U8"; return 0; /* block dtypes: raw bytes, shape (..., row bytes) */
  }
}

/* The tensor index: names, dtypes, shapes, sizes, placement, alignment, overlaps, and agreement
 * with the safetensors header of each weight file. */
static int check_tensors(const char *what, mpk_package *p) {
  int rc = 0;
  mpk_st_header **st = NULL;
  size_t *matched = NULL, *order = NULL;
  json_t *ts = json_object_get(p->manifest, "tensors");
  if (!json_is_array(ts)) return servd_fail(SERVD_EFORMAT, "%s: manifest.json: tensors: expected an array", what);
  p->nt = json_array_size(ts);
  p->t = calloc(p->nt ? p->nt : 1, sizeof *p->t);
  p->t_by_name = calloc(p->nt ? p->nt : 1, sizeof *p->t_by_name);
  order = calloc(p->nt ? p->nt : 1, sizeof *order);
  st = calloc(p->zip.n ? p->zip.n : 1, sizeof *st);
  matched = calloc(p->zip.n ? p->zip.n : 1, sizeof *matched);
  if (!p->t || !p->t_by_name || !order || !st || !matched) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
    goto fail;
  }
  for (size_t i = 0; i < p->nt; i++) {
    json_t *o = json_array_get(ts, i);
    pkg_tensor *t = &p->t[i];
    json_t *name = json_object_get(o, "name"), *dt = json_object_get(o, "dtype"), *shape = json_object_get(o, "shape"),
           *file = json_object_get(o, "file"), *off = json_object_get(o, "offset"), *nb = json_object_get(o, "nbytes");
    if (!json_is_string(name) || !json_is_string(dt) || !json_is_array(shape) || !json_is_string(file) ||
        !json_is_integer(off) || !json_is_integer(nb) || json_integer_value(off) < 0 || json_integer_value(nb) < 0) {
      rc = servd_fail(SERVD_EFORMAT,
                      "%s: manifest.json: tensors[%zu]: expected {name, dtype, shape, file, offset, nbytes}", what, i);
      goto fail;
    }
    t->name = json_string_value(name);
    char field[320];
    snprintf(field, sizeof field, "%s: tensor \"%.256s\"", what, t->name);
    if ((rc = mpk_check_tensor_name(what, t->name))) goto fail;
    if (servd_dtype_from_name(json_string_value(dt), &t->dtype)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: dtype \"%.16s\": expected f32 f16 bf16 i32 q8_0 q4_0 q4_1", field,
                      json_string_value(dt));
      goto fail;
    }
    if (json_array_size(shape) < 1 || json_array_size(shape) > SERVD_MAX_DIMS) {
      rc = servd_fail(SERVD_EFORMAT, "%s: %zu dimensions, expected 1..%d", field, json_array_size(shape),
                      SERVD_MAX_DIMS);
      goto fail;
    }
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
      json_t *v = json_array_get(shape, (size_t)d);
      if (!json_is_integer(v) || json_integer_value(v) < 1) {
        rc = servd_fail(SERVD_EFORMAT, "%s: shape[%d]: expected a positive integer", field, d);
        goto fail;
      }
      t->shape[d] = json_integer_value(v);
    }
    uint64_t expect;
    if ((rc = mpk__packed_bytes(field, t->dtype, t->ndim, t->shape, &expect))) goto fail;
    t->nbytes = (uint64_t)json_integer_value(nb);
    if (t->nbytes != expect) {
      rc = servd_fail(SERVD_EFORMAT, "%s: nbytes %llu, expected %llu (%s x shape)", field,
                      (unsigned long long)t->nbytes, (unsigned long long)expect, servd_dtype_name(t->dtype));
      goto fail;
    }
    t->entry = mpk__zip_find(&p->zip, json_string_value(file));
    if (t->entry < 0) {
      rc = servd_fail(SERVD_EFORMAT, "%s: file \"%.200s\" is not in the archive", field, json_string_value(file));
      goto fail;
    }
    const mpk_zip_entry *e = &p->zip.e[t->entry];
    if (e->method != 0) {
      rc = servd_fail(SERVD_EFORMAT, "%s: file \"%s\" is compressed, expected stored", field, e->name);
      goto fail;
    }
    uint64_t rel = (uint64_t)json_integer_value(off), end;
    if (!mpk__add(rel, t->nbytes, &end) || end > e->usize) {
      rc = servd_fail(SERVD_EFORMAT, "%s: [%llu, +%llu) runs past the end of \"%s\" (%llu bytes)", field,
                      (unsigned long long)rel, (unsigned long long)t->nbytes, e->name, (unsigned long long)e->usize);
      goto fail;
    }
    t->abs = e->data + rel;
    if (t->abs % SERVD_ALIGN) {
      rc = servd_fail(SERVD_EFORMAT, "%s: data at file offset %llu, expected a multiple of %d", field,
                      (unsigned long long)t->abs, SERVD_ALIGN);
      goto fail;
    }
    /* The weight file's own header must describe the same tensor at the same place. */
    if (!st[t->entry] && (rc = mpk_st_parse(e->name, entry_data(p, t->entry), e->usize, &st[t->entry]))) goto fail;
    const mpk_st_header *h = st[t->entry];
    int k = mpk_st_find(h, t->name);
    const char *sdt;
    st_dtype_for(t->dtype, &sdt);
    if (k < 0) {
      rc = servd_fail(SERVD_EFORMAT, "%s: not in the safetensors header of \"%s\"", field, e->name);
      goto fail;
    }
    const mpk_st_tensor *s = &h->tensors[k];
    bool same = !strcmp(s->dtype, sdt) && s->ndim == t->ndim && h->data_start + s->begin == rel &&
                s->end - s->begin == t->nbytes;
    for (int d = 0; same && d < t->ndim; d++) {
      int64_t want = t->shape[d];
      if (d == t->ndim - 1 && servd_dtype_is_quantized(t->dtype))
        want = (int64_t)servd_dtype_row_bytes(t->dtype, t->shape[d]);
      same = s->shape[d] == want;
    }
    if (!same) {
      rc = servd_fail(SERVD_EFORMAT,
                      "%s: manifest (%s, offset %llu) disagrees with the safetensors header of \"%s\" (%s at %llu)",
                      field, servd_dtype_name(t->dtype), (unsigned long long)rel, e->name, s->dtype,
                      (unsigned long long)(h->data_start + s->begin));
      goto fail;
    }
    matched[t->entry]++;
  }
  for (size_t i = 0; i < p->zip.n; i++) {
    if (!st[i] && !p->zip.e[i].is_dir && !strncmp(p->zip.e[i].name, "weights/", 8)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: \"%s\": a weight file that no tensor of the manifest index uses", what,
                      p->zip.e[i].name);
      goto fail;
    }
    if (st[i] && matched[i] != st[i]->n) {
      rc = servd_fail(SERVD_EFORMAT, "%s: \"%s\" holds %zu tensors, the manifest indexes %zu of them", what,
                      p->zip.e[i].name, st[i]->n, matched[i]);
      goto fail;
    }
  }
  for (size_t i = 0; i < p->nt; i++) p->t_by_name[i] = order[i] = i;
  qsort_r(p->t_by_name, p->nt, sizeof *p->t_by_name, cmp_tensor_name, p);
  for (size_t i = 1; i < p->nt; i++) {
    if (!strcmp(p->t[p->t_by_name[i - 1]].name, p->t[p->t_by_name[i]].name)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: manifest.json: duplicate tensor \"%s\"", what, p->t[p->t_by_name[i]].name);
      goto fail;
    }
  }
  qsort_r(order, p->nt, sizeof *order, cmp_tensor_abs, p);
  for (size_t i = 1; i < p->nt; i++) {
    const pkg_tensor *a = &p->t[order[i - 1]], *b = &p->t[order[i]];
    if (b->abs < a->abs + a->nbytes) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\" overlaps tensor \"%s\"", what, b->name, a->name);
      goto fail;
    }
  }
fail:
  for (size_t i = 0; st && i < p->zip.n; i++) mpk_st_free(st[i]);
  free(st);
  free(matched);
  free(order);
  return rc;
}

int mpk_open(const char *path, mpk_package **out) {
  *out = NULL;
  int rc = 0;
  mpk_package *p = calloc(1, sizeof *p);
  if (!p || !(p->path = strdup(path))) {
    free(p);
    return servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
  }
  if ((rc = mpk__map_file(path, &p->map))) goto fail;
  p->base = p->map.data;
  if ((rc = mpk__zip_parse(path, p->map.data, p->map.len, &p->zip))) goto fail;
  p->inflated = calloc(p->zip.n ? p->zip.n : 1, sizeof *p->inflated);
  p->files = calloc(p->zip.n ? p->zip.n : 1, sizeof *p->files);
  if (!p->inflated || !p->files) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  uint64_t inflated_total = 0;
  for (size_t i = 0; i < p->zip.n; i++) {
    const mpk_zip_entry *e = &p->zip.e[i];
    if (e->is_dir) continue;
    p->files[p->nfiles++] = (int)i;
    if (e->method != 8) continue;
    char what[1100];
    snprintf(what, sizeof what, "%s: entry \"%s\"", path, e->name);
    if (!mpk__add(inflated_total, e->usize, &inflated_total) || inflated_total > MPK_MAX_INFLATE_TOTAL) {
      rc = servd_fail(SERVD_ERANGE, "%s: compressed entries expand beyond %llu bytes in total", what,
                      (unsigned long long)MPK_MAX_INFLATE_TOTAL);
      goto fail;
    }
    if ((rc = mpk__inflate(what, (const uint8_t *)p->map.data + e->data, e->csize, e->usize, &p->inflated[i])))
      goto fail;
    if (crc32(0, p->inflated[i], (uInt)e->usize) != e->crc) {
      rc = servd_fail(SERVD_EFORMAT, "%s: CRC-32 mismatch after inflating", what);
      goto fail;
    }
  }
  int mi = mpk__zip_find(&p->zip, "manifest.json");
  if (mi < 0) {
    rc = servd_fail(SERVD_EFORMAT, "%s: manifest.json: missing from the archive", path);
    goto fail;
  }
  if (p->zip.e[mi].usize > MPK_MAX_MANIFEST) {
    rc = servd_fail(SERVD_EFORMAT, "%s: manifest.json: %llu bytes, expected at most %llu", path,
                    (unsigned long long)p->zip.e[mi].usize, (unsigned long long)MPK_MAX_MANIFEST);
    goto fail;
  }
  json_error_t jerr;
  p->manifest = json_loadb((const char *)entry_data(p, mi), p->zip.e[mi].usize, JSON_REJECT_DUPLICATES, &jerr);
  if (!p->manifest || !json_is_object(p->manifest)) {
    rc = servd_fail(SERVD_EFORMAT, "%s: manifest.json: %s (line %d)", path,
                    p->manifest ? "expected a JSON object" : jerr.text, jerr.line);
    goto fail;
  }
  if ((rc = check_manifest(path, p)) || (rc = check_tensors(path, p))) goto fail;
  mpk_map *m = malloc(sizeof *m);
  if (!m) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  *m = p->map;
  p->storage = servd_storage_wrap(m->data, m->len, release_mapping, m);
  if (!p->storage) {
    free(m);
    rc = servd_fail(SERVD_ENOMEM, "%s: cannot wrap the mapping", path);
    goto fail;
  }
  p->map.data = NULL; /* owned by the storage now */
  *out = p;
  return 0;
fail:
  mpk_close(p);
  return rc;
}

void mpk_close(mpk_package *p) {
  if (!p) return;
  for (size_t i = 0; p->inflated && i < p->zip.n; i++) free(p->inflated[i]);
  free(p->inflated);
  free(p->files);
  free(p->t);
  free(p->t_by_name);
  json_decref(p->manifest);
  mpk__zip_free(&p->zip);
  mpk__unmap(&p->map);
  servd_storage_release(p->storage); /* the mapping goes with the last tensor */
  free(p->path);
  free(p);
}

const char *mpk_path(const mpk_package *p) { return p->path; }
json_t *mpk_manifest(const mpk_package *p) { return p->manifest; }
json_t *mpk_config(const mpk_package *p) { return json_object_get(p->manifest, "config"); }
const char *mpk_name(const mpk_package *p) { return p->name; }
const char *mpk_kind(const mpk_package *p) { return p->kind; }
const char *mpk_entry_point(const mpk_package *p) { return p->entry_point; }
const char *mpk_model_version(const mpk_package *p) { return p->model_version; }
const char *mpk_rope_layout(const mpk_package *p) { return p->rope_layout; }
uint64_t mpk_size(const mpk_package *p) { return servd_storage_bytes(p->storage); }
int mpk_tensor_count(const mpk_package *p) { return (int)p->nt; }
const char *mpk_tensor_name(const mpk_package *p, int i) { return i >= 0 && (size_t)i < p->nt ? p->t[i].name : NULL; }
int mpk_file_count(const mpk_package *p) { return p->nfiles; }
const char *mpk_file_path(const mpk_package *p, int i) {
  return i >= 0 && i < p->nfiles ? p->zip.e[p->files[i]].name : NULL;
}

int mpk_tensor_info_at(const mpk_package *p, int i, mpk_tensor_info *out) {
  if (i < 0 || (size_t)i >= p->nt) return servd_fail(SERVD_ERANGE, "%s: tensor index %d out of range", p->path, i);
  const pkg_tensor *t = &p->t[i];
  out->name = t->name;
  out->dtype = t->dtype;
  out->ndim = t->ndim;
  memcpy(out->shape, t->shape, sizeof out->shape);
  out->file = p->zip.e[t->entry].name;
  out->offset = t->abs;
  out->nbytes = t->nbytes;
  return 0;
}

int mpk_file_info_at(const mpk_package *p, int i, mpk_file_info *out) {
  if (i < 0 || i >= p->nfiles) return servd_fail(SERVD_ERANGE, "%s: file index %d out of range", p->path, i);
  const mpk_zip_entry *e = &p->zip.e[p->files[i]];
  out->path = e->name;
  out->offset = e->data;
  out->size = e->usize;
  out->stored_size = e->csize;
  out->method = e->method;
  out->crc32 = e->crc;
  return 0;
}

int mpk_tensor(mpk_package *p, const char *name, servd_tensor **out) {
  *out = NULL;
  int i = find_tensor(p, name);
  if (i < 0) return servd_fail(SERVD_EINVAL, "%s: no tensor \"%s\"", p->path, name);
  const pkg_tensor *t = &p->t[i];
  *out = servd_tensor_from_storage(p->storage, t->abs, t->dtype, t->ndim, t->shape);
  return *out ? 0 : SERVD_EINVAL;
}

int mpk_file(mpk_package *p, const char *path, const void **data, size_t *len) {
  int i = mpk__zip_find(&p->zip, path);
  if (i < 0 || p->zip.e[i].is_dir) return servd_fail(SERVD_EINVAL, "%s: no entry \"%s\"", p->path, path);
  *data = entry_data(p, i);
  *len = p->zip.e[i].usize;
  return 0;
}

/* One hashing path for every caller: mpk_verify_entries (integrity.c). */
int mpk_verify(mpk_package *p) { return mpk_verify_entries(p, MPK_VERIFY_ALL); }
