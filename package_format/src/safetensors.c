/* safetensors header parser (validated, as strict as the reference implementation) and builder. */
#include <stdio.h>
#include <stdlib.h>

#include "mpk-impl.h"
#include "mpk/safetensors.h"

static const struct {
  const char *name;
  unsigned size;
} st_dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},  {"I32", 4},     {"I16", 2},     {"I8", 1},
    {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},   {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

unsigned mpk_st_dtype_size(const char *dtype) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (strcmp(st_dtypes[i].name, dtype) == 0) return st_dtypes[i].size;
  return 0;
}

int mpk_st_dtype_to_servd(const char *dtype, servd_dtype *out) {
  if (!strcmp(dtype, "F32")) *out = SERVD_F32;
  else if (!strcmp(dtype, "F16")) *out = SERVD_F16;
  else if (!strcmp(dtype, "BF16")) *out = SERVD_BF16;
  else if (!strcmp(dtype, "I32")) *out = SERVD_I32;
  else return SERVD_EUNSUPPORTED;
  return 0;
}

static int cmp_begin(const void *a, const void *b) {
  const mpk_st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}
static int cmp_idx_name(const void *a, const void *b, void *ctx) {
  const mpk_st_header *h = ctx;
  return strcmp(h->tensors[*(const size_t *)a].name, h->tensors[*(const size_t *)b].name);
}

void mpk_st_free(mpk_st_header *h) {
  if (!h) return;
  json_decref(h->root);
  free(h->tensors);
  free(h->by_name);
  free(h);
}

int mpk_st_find(const mpk_st_header *h, const char *name) {
  size_t lo = 0, hi = h->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(h->tensors[h->by_name[mid]].name, name);
    if (c == 0) return (int)h->by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

static int get_u64(json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

int mpk_st_parse(const char *what, const void *buf, size_t len, mpk_st_header **out) {
  *out = NULL;
  const uint8_t *b = buf;
  if (len < 8)
    return servd_fail(SERVD_EFORMAT, "%s: %zu bytes, too short for a safetensors header length (8)", what, len);
  uint64_t n = rd64(b);
  if (n > len - 8)
    return servd_fail(SERVD_EFORMAT, "%s: header length %llu is larger than the %zu bytes that follow", what,
                      (unsigned long long)n, len - 8);
  if (n > MPK_ST_MAX_HEADER)
    return servd_fail(SERVD_EFORMAT, "%s: header length %llu, expected at most %u", what, (unsigned long long)n,
                      MPK_ST_MAX_HEADER);
  if (n < 2 || b[8] != '{')
    return servd_fail(SERVD_EFORMAT, "%s: header must be a JSON object starting with '{'", what);
  int rc = 0;
  mpk_st_header *h = calloc(1, sizeof *h);
  if (!h) return servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
  json_error_t jerr;
  h->root = json_loadb((const char *)b + 8, n, JSON_REJECT_DUPLICATES, &jerr);
  if (!h->root || !json_is_object(h->root)) {
    rc = servd_fail(SERVD_EFORMAT, "%s: header: %s", what, h->root ? "expected a JSON object" : jerr.text);
    goto fail;
  }
  h->data_start = 8 + n;
  h->data_len = len - 8 - n;
  size_t cap = json_object_size(h->root);
  h->tensors = calloc(cap ? cap : 1, sizeof *h->tensors);
  h->by_name = calloc(cap ? cap : 1, sizeof *h->by_name);
  if (!h->tensors || !h->by_name) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
    goto fail;
  }
  const char *key;
  json_t *val;
  json_object_foreach(h->root, key, val) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(val)) {
        rc = servd_fail(SERVD_EFORMAT, "%s: __metadata__: expected an object of strings", what);
        goto fail;
      }
      const char *mk;
      json_t *mv;
      json_object_foreach(val, mk, mv) {
        if (!json_is_string(mv)) {
          rc = servd_fail(SERVD_EFORMAT, "%s: __metadata__.%s: expected a string", what, mk);
          goto fail;
        }
      }
      h->metadata = val;
      continue;
    }
    mpk_st_tensor *t = &h->tensors[h->n];
    t->name = key;
    json_t *dt = json_object_get(val, "dtype"), *shape = json_object_get(val, "shape"),
           *offs = json_object_get(val, "data_offsets");
    if (!json_is_object(val) || !json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) ||
        json_array_size(offs) != 2) {
      rc = servd_fail(SERVD_EFORMAT,
                      "%s: tensor \"%s\": expected {\"dtype\": str, \"shape\": [int], \"data_offsets\": [begin, end]}",
                      what, key);
      goto fail;
    }
    const char *dts = json_string_value(dt);
    t->elem_bytes = mpk_st_dtype_size(dts);
    if (!t->elem_bytes || strlen(dts) >= sizeof t->dtype) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": unknown dtype \"%.16s\"", what, key, dts);
      goto fail;
    }
    strcpy(t->dtype, dts);
    if (json_array_size(shape) > MPK_ST_MAX_DIMS) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": %zu dimensions, expected at most %d", what, key,
                      json_array_size(shape), MPK_ST_MAX_DIMS);
      goto fail;
    }
    t->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
      uint64_t v;
      if (get_u64(json_array_get(shape, (size_t)d), &v) || v > (uint64_t)INT64_MAX) {
        rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": shape[%d]: expected a non-negative integer", what, key, d);
        goto fail;
      }
      t->shape[d] = (int64_t)v;
      if (!mpk__mul(numel, v, &numel)) {
        rc = servd_fail(SERVD_ERANGE, "%s: tensor \"%s\": element count overflows", what, key);
        goto fail;
      }
    }
    uint64_t nbytes;
    if (get_u64(json_array_get(offs, 0), &t->begin) || get_u64(json_array_get(offs, 1), &t->end) || t->end < t->begin) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": data_offsets: expected non-negative integers begin <= end",
                      what, key);
      goto fail;
    }
    if (!mpk__mul(numel, t->elem_bytes, &nbytes)) {
      rc = servd_fail(SERVD_ERANGE, "%s: tensor \"%s\": byte size overflows", what, key);
      goto fail;
    }
    if (nbytes != t->end - t->begin) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": data_offsets span %llu bytes, expected %llu (%s x shape)",
                      what, key, (unsigned long long)(t->end - t->begin), (unsigned long long)nbytes, t->dtype);
      goto fail;
    }
    h->n++;
  }
  /* Exact tiling of the buffer, like the reference implementation. */
  qsort(h->tensors, h->n, sizeof *h->tensors, cmp_begin);
  uint64_t expect = 0;
  for (size_t i = 0; i < h->n; i++) {
    const mpk_st_tensor *t = &h->tensors[i];
    if (t->begin != expect) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": data starts at %llu, expected %llu (%s)", what, t->name,
                      (unsigned long long)t->begin, (unsigned long long)expect, t->begin < expect ? "overlap" : "hole");
      goto fail;
    }
    expect = t->end;
  }
  if (expect != h->data_len) {
    rc = servd_fail(SERVD_EFORMAT, "%s: tensors cover %llu bytes of a %llu-byte buffer, expected all of it%s", what,
                    (unsigned long long)expect, (unsigned long long)h->data_len,
                    expect > h->data_len ? " (runs past the end)" : "");
    goto fail;
  }
  for (size_t i = 0; i < h->n; i++) h->by_name[i] = i;
  qsort_r(h->by_name, h->n, sizeof *h->by_name, cmp_idx_name, h);
  *out = h;
  return 0;
fail:
  mpk_st_free(h);
  return rc;
}

int mpk_st_build_single(const char *name, const char *st_dtype, int ndim, const int64_t *shape, uint64_t nbytes,
                        json_t *metadata, size_t align, char **out, size_t *len) {
  *out = NULL;
  int rc = 0;
  json_t *root = json_object(), *t = json_object(), *sh = json_array();
  char *js = NULL;
  if (!root || !t || !sh) {
    rc = servd_fail(SERVD_ENOMEM, "safetensors header: out of memory");
    goto fail;
  }
  if (metadata) json_object_set(root, "__metadata__", metadata);
  for (int i = 0; i < ndim; i++) json_array_append_new(sh, json_integer(shape[i]));
  json_object_set_new(t, "dtype", json_string(st_dtype));
  json_object_set_new(t, "shape", sh);
  sh = NULL;
  json_object_set_new(t, "data_offsets", json_pack("[I,I]", (json_int_t)0, (json_int_t)nbytes));
  json_object_set_new(root, name, t);
  t = NULL;
  js = json_dumps(root, JSON_COMPACT);
  if (!js) {
    rc = servd_fail(SERVD_ENOMEM, "safetensors header: out of memory");
    goto fail;
  }
  size_t jl = strlen(js), total = 8 + jl;
  if (align > 1) total = (total + align - 1) / align * align;
  char *b = malloc(total);
  if (!b) {
    rc = servd_fail(SERVD_ENOMEM, "safetensors header: out of memory");
    goto fail;
  }
  wr64((uint8_t *)b, total - 8);
  memcpy(b + 8, js, jl);
  memset(b + 8 + jl, ' ', total - 8 - jl); /* trailing spaces are allowed by the format */
  *out = b;
  *len = total;
fail:
  free(js);
  json_decref(sh);
  json_decref(t);
  json_decref(root);
  return rc;
}
