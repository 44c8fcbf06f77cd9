/* GGUF parser. Every count, length and offset read from the file is checked against the bytes
 * left before it is used or multiplied, so memory stays bounded by the input size (the classes of
 * CVE-2024-21802, CVE-2024-23605, CVE-2025-53630 and CVE-2026-33298). */
#include <stdio.h>
#include <stdlib.h>

#include "mpk-impl.h"
#include "mpk/gguf.h"

#define MAX_ALIGNMENT (1u << 20)

/* Every ggml type, also those servd does not keep (i-quants, ternary, fp4): a refusal names them. */
static const struct {
  const char *name;
  uint32_t elems, bytes;
} ggml_types[] = {
    [MPK_GGML_F32] = {"F32", 1, 4},
    [MPK_GGML_F16] = {"F16", 1, 2},
    [MPK_GGML_Q4_0] = {"Q4_0", 32, 18},
    [MPK_GGML_Q4_1] = {"Q4_1", 32, 20},
    [MPK_GGML_Q5_0] = {"Q5_0", 32, 22},
    [MPK_GGML_Q5_1] = {"Q5_1", 32, 24},
    [MPK_GGML_Q8_0] = {"Q8_0", 32, 34},
    [MPK_GGML_Q8_1] = {"Q8_1", 32, 36},
    [MPK_GGML_Q2_K] = {"Q2_K", 256, 84},
    [MPK_GGML_Q3_K] = {"Q3_K", 256, 110},
    [MPK_GGML_Q4_K] = {"Q4_K", 256, 144},
    [MPK_GGML_Q5_K] = {"Q5_K", 256, 176},
    [MPK_GGML_Q6_K] = {"Q6_K", 256, 210},
    [MPK_GGML_Q8_K] = {"Q8_K", 256, 292},
    [MPK_GGML_I8] = {"I8", 1, 1},
    [MPK_GGML_I16] = {"I16", 1, 2},
    [MPK_GGML_I32] = {"I32", 1, 4},
    [MPK_GGML_I64] = {"I64", 1, 8},
    [MPK_GGML_F64] = {"F64", 1, 8},
    [MPK_GGML_BF16] = {"BF16", 1, 2},
    [MPK_GGML_IQ2_XXS] = {"IQ2_XXS", 256, 66},
    [MPK_GGML_IQ2_XS] = {"IQ2_XS", 256, 74},
    [MPK_GGML_IQ3_XXS] = {"IQ3_XXS", 256, 98},
    [MPK_GGML_IQ1_S] = {"IQ1_S", 256, 50},
    [MPK_GGML_IQ4_NL] = {"IQ4_NL", 32, 18},
    [MPK_GGML_IQ3_S] = {"IQ3_S", 256, 110},
    [MPK_GGML_IQ2_S] = {"IQ2_S", 256, 82},
    [MPK_GGML_IQ4_XS] = {"IQ4_XS", 256, 136},
    [MPK_GGML_IQ1_M] = {"IQ1_M", 256, 56},
    [MPK_GGML_TQ1_0] = {"TQ1_0", 256, 54},
    [MPK_GGML_TQ2_0] = {"TQ2_0", 256, 66},
    [MPK_GGML_MXFP4] = {"MXFP4", 32, 17},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *mpk_ggml_type_name(uint32_t type) { return type < N_GGML_TYPES ? ggml_types[type].name : NULL; }

int mpk_ggml_type_size(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes) {
  if (type >= N_GGML_TYPES || !ggml_types[type].name) return SERVD_EUNSUPPORTED;
  *block_elems = ggml_types[type].elems;
  *block_bytes = ggml_types[type].bytes;
  return 0;
}

static const unsigned scalar_size[MPK_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *const value_type_names[MPK_GGUF_TYPE_COUNT] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                                  "bool", "string", "array", "u64", "i64", "f64"};

typedef struct cursor {
  const uint8_t *b;
  uint64_t pos, len;
  const char *what;
} cursor;

static uint64_t left(const cursor *c) { return c->len - c->pos; }

static int need(cursor *c, uint64_t n, const char *field) {
  if (left(c) < n)
    return servd_fail(SERVD_EFORMAT, "%s: %s: needs %llu bytes at offset %llu but only %llu remain (truncated?)",
                      c->what, field, (unsigned long long)n, (unsigned long long)c->pos, (unsigned long long)left(c));
  return 0;
}

/* A string: u64 length then bytes; the length is checked against the bytes left. */
static int read_str(cursor *c, const char *field, const uint8_t **s, uint64_t *n) {
  int rc;
  if ((rc = need(c, 8, field))) return rc;
  uint64_t l = rd64(c->b + c->pos);
  c->pos += 8;
  if (l > left(c))
    return servd_fail(SERVD_EFORMAT, "%s: %s: string length %llu is larger than the %llu bytes left", c->what, field,
                      (unsigned long long)l, (unsigned long long)left(c));
  *s = c->b + c->pos;
  *n = l;
  c->pos += l;
  return 0;
}

static int dup_name(const char *what, const char *field, const uint8_t *s, uint64_t n, char **out) {
  if (n == 0 || n > 65535)
    return servd_fail(SERVD_EFORMAT, "%s: %s: length %llu, expected 1..65535", what, field, (unsigned long long)n);
  if (memchr(s, 0, n)) return servd_fail(SERVD_EFORMAT, "%s: %s: NUL byte inside the name", what, field);
  *out = malloc(n + 1);
  if (!*out) return servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
  memcpy(*out, s, n);
  (*out)[n] = 0;
  return 0;
}

void mpk_gguf_free(mpk_gguf *g) {
  if (!g) return;
  for (size_t i = 0; i < g->n_kv; i++) {
    free(g->kv[i].key);
    free((void *)g->kv[i].str_off);
  }
  for (size_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
  free(g->kv);
  free(g->tensors);
  free(g->what);
  free(g);
}

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int cmp_off(const void *a, const void *b) {
  const mpk_gguf_tensor *x = *(mpk_gguf_tensor *const *)a, *y = *(mpk_gguf_tensor *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Finds a duplicate among n NUL-terminated names (sorted copy of the pointers). */
static const char *find_duplicate(char **names, size_t n) {
  qsort(names, n, sizeof *names, cmp_str_ptr);
  for (size_t i = 1; i < n; i++)
    if (strcmp(names[i - 1], names[i]) == 0) return names[i];
  return NULL;
}

static int read_value(cursor *c, mpk_gguf_kv *kv) {
  int rc;
  const char *key = kv->key;
  if (kv->type >= MPK_GGUF_TYPE_COUNT)
    return servd_fail(SERVD_EFORMAT, "%s: key \"%s\": value type %u, expected 0..12", c->what, key, kv->type);
  kv->data = c->b + c->pos;
  kv->n = 1;
  if (kv->type == MPK_GGUF_STRING) {
    const uint8_t *s;
    uint64_t n;
    return read_str(c, key, &s, &n);
  }
  if (kv->type != MPK_GGUF_ARRAY) {
    if ((rc = need(c, scalar_size[kv->type], key))) return rc;
    if (kv->type == MPK_GGUF_BOOL && c->b[c->pos] > 1)
      return servd_fail(SERVD_EFORMAT, "%s: key \"%s\": bool value %u, expected 0 or 1", c->what, key, c->b[c->pos]);
    c->pos += scalar_size[kv->type];
    return 0;
  }
  if ((rc = need(c, 12, key))) return rc;
  kv->arr_type = rd32(c->b + c->pos);
  kv->n = rd64(c->b + c->pos + 4);
  c->pos += 12;
  kv->data = c->b + c->pos;
  if (kv->arr_type >= MPK_GGUF_TYPE_COUNT || kv->arr_type == MPK_GGUF_ARRAY)
    return servd_fail(SERVD_EFORMAT, "%s: key \"%s\": array element type %u, expected a scalar or string type", c->what,
                      key, kv->arr_type);
  if (kv->arr_type != MPK_GGUF_STRING) {
    uint64_t bytes;
    if (!mpk__mul(kv->n, scalar_size[kv->arr_type], &bytes) || bytes > left(c))
      return servd_fail(SERVD_EFORMAT, "%s: key \"%s\": array of %llu %s needs more than the %llu bytes left", c->what,
                        key, (unsigned long long)kv->n, value_type_names[kv->arr_type], (unsigned long long)left(c));
    if (kv->arr_type == MPK_GGUF_BOOL)
      for (uint64_t i = 0; i < kv->n; i++)
        if (c->b[c->pos + i] > 1)
          return servd_fail(SERVD_EFORMAT, "%s: key \"%s\"[%llu]: bool value, expected 0 or 1", c->what, key,
                            (unsigned long long)i);
    c->pos += bytes;
    return 0;
  }
  /* Each string takes at least its 8-byte length: bound the count before allocating. */
  if (kv->n > left(c) / 8)
    return servd_fail(SERVD_EFORMAT, "%s: key \"%s\": array of %llu strings cannot fit in the %llu bytes left", c->what,
                      key, (unsigned long long)kv->n, (unsigned long long)left(c));
  uint64_t *off = malloc((kv->n ? kv->n : 1) * sizeof *off);
  if (!off) return servd_fail(SERVD_ENOMEM, "%s: key \"%s\": out of memory", c->what, key);
  kv->str_off = off;
  for (uint64_t i = 0; i < kv->n; i++) {
    off[i] = c->pos - (uint64_t)(kv->data - c->b);
    const uint8_t *s;
    uint64_t n;
    if ((rc = read_str(c, key, &s, &n))) return rc;
  }
  return 0;
}

/* The start shared by a key/value and a tensor info: a name (`field` in messages), copied into *name
 * (the caller frees it, also when this fails later), then a u32 into *v. */
static int read_name_u32(cursor *c, const char *field, char **name, uint32_t *v) {
  const uint8_t *s = NULL; /* set by read_str on success; initialized for gcc's flow analysis */
  uint64_t n = 0;
  int rc;
  if ((rc = read_str(c, field, &s, &n)) || (rc = dup_name(c->what, field, s, n, name))) return rc;
  if ((rc = need(c, 4, *name))) return rc;
  *v = rd32(c->b + c->pos);
  c->pos += 4;
  return 0;
}

/* Bounds a header count by the bytes left, `min_bytes` being the smallest encoding of one entry, before
 * allocating `n` zeroed entries of `size` bytes into *out (the caller frees): a hostile count fails
 * here instead of asking for terabytes. */
static int alloc_entries(const cursor *c, const char *count_name, uint64_t n, uint64_t min_bytes, size_t size,
                         void **out) {
  if (n > left(c) / min_bytes)
    return servd_fail(SERVD_EFORMAT, "%s: %s = %llu cannot fit in the %llu bytes left", c->what, count_name,
                      (unsigned long long)n, (unsigned long long)left(c));
  *out = calloc(n ? n : 1, size);
  if (!*out) return servd_fail(SERVD_ENOMEM, "%s: out of memory", c->what);
  return 0;
}

int mpk_gguf_parse(const char *what, const void *buf, size_t len, mpk_gguf **out) {
  *out = NULL;
  cursor c = {.b = buf, .pos = 0, .len = len, .what = what};
  int rc = 0;
  char **names = NULL;
  mpk_gguf_tensor **by_off = NULL;
  mpk_gguf *g = calloc(1, sizeof *g);
  if (!g) return servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
  g->buf = buf;
  g->len = len;
  g->what = strdup(what);
  if (len < 24 || memcmp(buf, "GGUF", 4) != 0) {
    rc = servd_fail(SERVD_EFORMAT, "%s: magic: expected \"GGUF\" and a 24-byte header (%zu bytes)", what, len);
    goto fail;
  }
  g->version = rd32(c.b + 4);
  if (g->version != 2 && g->version != 3) {
    rc = servd_fail(SERVD_EUNSUPPORTED, "%s: version %u, expected 2 or 3 (little-endian)%s", what, g->version,
                    (g->version & 0xFFFF) == 0 ? "; big-endian files are not supported" : "");
    goto fail;
  }
  uint64_t n_tensors = rd64(c.b + 8), n_kv = rd64(c.b + 16);
  void *mem;
  c.pos = 24;
  /* Minimum encoded sizes: a key/value 8+1+4+1 bytes, a tensor info 8+1+4+8+4+8 bytes. */
  if ((rc = alloc_entries(&c, "n_kv", n_kv, 14, sizeof *g->kv, &mem))) goto fail;
  g->kv = mem;
  for (uint64_t i = 0; i < n_kv; i++) {
    mpk_gguf_kv *kv = &g->kv[i];
    char field[48];
    snprintf(field, sizeof field, "key %llu", (unsigned long long)i);
    g->n_kv = i + 1; /* entries start zeroed: mpk_gguf_free may take this one whatever is read */
    if ((rc = read_name_u32(&c, field, &kv->key, &kv->type))) goto fail;
    if ((rc = read_value(&c, kv))) goto fail;
  }
  if ((rc = alloc_entries(&c, "n_tensors", n_tensors, 33, sizeof *g->tensors, &mem))) goto fail;
  g->tensors = mem;
  for (uint64_t i = 0; i < n_tensors; i++) {
    mpk_gguf_tensor *t = &g->tensors[i];
    char field[48];
    snprintf(field, sizeof field, "tensor %llu name", (unsigned long long)i);
    g->n_tensors = i + 1; /* as for the keys */
    uint32_t nd;
    if ((rc = read_name_u32(&c, field, &t->name, &nd))) goto fail;
    if (nd < 1 || nd > 4) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": n_dims = %u, expected 1..4", what, t->name, nd);
      goto fail;
    }
    t->ndim = (int)nd;
    if ((rc = need(&c, 8ull * nd + 12, t->name))) goto fail;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
      uint64_t v = rd64(c.b + c.pos + 8ull * d);
      if (v < 1 || v > (uint64_t)INT64_MAX) {
        rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": ne[%u] = %llu, expected 1..2^63-1", what, t->name, d,
                        (unsigned long long)v);
        goto fail;
      }
      t->ne[d] = (int64_t)v;
    }
    c.pos += 8ull * nd;
    t->type = rd32(c.b + c.pos);
    t->offset = rd64(c.b + c.pos + 4);
    c.pos += 12;
    uint32_t be, bb;
    if (mpk_ggml_type_size(t->type, &be, &bb)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": unknown ggml type %u", what, t->name, t->type);
      goto fail;
    }
    if ((uint64_t)t->ne[0] % be) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": ne[0] = %lld is not a multiple of the %s block of %u", what,
                      t->name, (long long)t->ne[0], ggml_types[t->type].name, be);
      goto fail;
    }
    uint64_t rows = 1, nb;
    bool ok = mpk__mul((uint64_t)t->ne[1], (uint64_t)t->ne[2], &rows) && mpk__mul(rows, (uint64_t)t->ne[3], &rows) &&
              mpk__mul((uint64_t)t->ne[0] / be, bb, &nb) && mpk__mul(nb, rows, &nb) &&
              mpk__mul(rows, (uint64_t)t->ne[0], &(uint64_t){0}) && nb <= (uint64_t)INT64_MAX;
    if (!ok) {
      rc = servd_fail(SERVD_ERANGE, "%s: tensor \"%s\": element count or byte size overflows", what, t->name);
      goto fail;
    }
    t->nbytes = nb;
  }
  /* general.alignment, if present, must be a u32 power of two. */
  g->alignment = 32;
  const mpk_gguf_kv *al = mpk_gguf_find(g, "general.alignment");
  if (al) {
    uint32_t a = al->type == MPK_GGUF_UINT32 ? rd32(al->data) : 0;
    if (al->type != MPK_GGUF_UINT32 || a == 0 || (a & (a - 1)) || a > MAX_ALIGNMENT) {
      rc = servd_fail(SERVD_EFORMAT, "%s: general.alignment: expected a u32 power of two <= %u", what, MAX_ALIGNMENT);
      goto fail;
    }
    g->alignment = a;
  }
  uint64_t data = (c.pos + g->alignment - 1) / g->alignment * g->alignment; /* c.pos <= len, no overflow */
  if (data > len && n_tensors > 0) {
    rc = servd_fail(SERVD_EFORMAT, "%s: data section at %llu starts past the end (%zu bytes)", what,
                    (unsigned long long)data, len);
    goto fail;
  }
  g->data_offset = data;
  for (size_t i = 0; i < g->n_tensors; i++) {
    mpk_gguf_tensor *t = &g->tensors[i];
    uint64_t abs, end;
    if (t->offset % g->alignment) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": offset %llu is not a multiple of the alignment %llu", what,
                      t->name, (unsigned long long)t->offset, (unsigned long long)g->alignment);
      goto fail;
    }
    if (!mpk__add(data, t->offset, &abs) || !mpk__add(abs, t->nbytes, &end) || end > len) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": data [%llu, +%llu) runs past the end of the file (%zu bytes)",
                      what, t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes, len);
      goto fail;
    }
    t->offset = abs;
  }
  /* Duplicates and overlaps. */
  size_t nn = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
  names = malloc((nn ? nn : 1) * sizeof *names);
  by_off = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *by_off);
  if (!names || !by_off) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
    goto fail;
  }
  for (size_t i = 0; i < g->n_kv; i++) names[i] = g->kv[i].key;
  const char *dup = find_duplicate(names, g->n_kv);
  if (dup) {
    rc = servd_fail(SERVD_EFORMAT, "%s: duplicate key \"%s\"", what, dup);
    goto fail;
  }
  for (size_t i = 0; i < g->n_tensors; i++) names[i] = g->tensors[i].name;
  dup = find_duplicate(names, g->n_tensors);
  if (dup) {
    rc = servd_fail(SERVD_EFORMAT, "%s: duplicate tensor name \"%s\"", what, dup);
    goto fail;
  }
  for (size_t i = 0; i < g->n_tensors; i++) by_off[i] = &g->tensors[i];
  qsort(by_off, g->n_tensors, sizeof *by_off, cmp_off);
  for (size_t i = 1; i < g->n_tensors; i++) {
    if (by_off[i]->offset < by_off[i - 1]->offset + by_off[i - 1]->nbytes) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\" overlaps tensor \"%s\"", what, by_off[i]->name,
                      by_off[i - 1]->name);
      goto fail;
    }
  }
  free(names);
  free(by_off);
  *out = g;
  return 0;
fail:
  free(names);
  free(by_off);
  mpk_gguf_free(g);
  return rc;
}

/* ---- lookups ---- */

const mpk_gguf_kv *mpk_gguf_find(const mpk_gguf *g, const char *key) {
  for (size_t i = 0; i < g->n_kv; i++)
    if (strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
  return NULL;
}

static int is_int_type(uint32_t t) { return t <= MPK_GGUF_INT32 || t == MPK_GGUF_UINT64 || t == MPK_GGUF_INT64; }

static int64_t int_at(uint32_t type, const uint8_t *p) {
  switch (type) {
  case MPK_GGUF_UINT8: return p[0];
  case MPK_GGUF_INT8: return (int8_t)p[0];
  case MPK_GGUF_UINT16: return rd16(p);
  case MPK_GGUF_INT16: return (int16_t)rd16(p);
  case MPK_GGUF_UINT32: return rd32(p);
  case MPK_GGUF_INT32: return (int32_t)rd32(p);
  case MPK_GGUF_UINT64: return (int64_t)rd64(p); /* values >= 2^63 read as negative and are rejected */
  case MPK_GGUF_INT64: return (int64_t)rd64(p);
  default: return 0;
  }
}

static double f64_at(uint32_t type, const uint8_t *p) {
  if (type == MPK_GGUF_FLOAT32) {
    union {
      uint32_t u;
      float f;
    } v = {.u = rd32(p)};
    return v.f;
  }
  if (type == MPK_GGUF_FLOAT64) {
    union {
      uint64_t u;
      double f;
    } v = {.u = rd64(p)};
    return v.f;
  }
  return (double)int_at(type, p);
}

static const char *gwhat(const mpk_gguf *g) { return g->what ? g->what : "gguf"; }

int mpk_gguf_get_u64(const mpk_gguf *g, const char *key, uint64_t *out) {
  const mpk_gguf_kv *kv = mpk_gguf_find(g, key);
  if (!kv) return SERVD_EINVAL;
  int64_t v = is_int_type(kv->type) ? int_at(kv->type, kv->data) : -1;
  if (v < 0) return servd_fail(SERVD_EFORMAT, "%s: %s: expected a non-negative integer", gwhat(g), key);
  *out = (uint64_t)v;
  return 0;
}

int mpk_gguf_get_f64(const mpk_gguf *g, const char *key, double *out) {
  const mpk_gguf_kv *kv = mpk_gguf_find(g, key);
  if (!kv) return SERVD_EINVAL;
  if (kv->type != MPK_GGUF_FLOAT32 && kv->type != MPK_GGUF_FLOAT64 && !is_int_type(kv->type))
    return servd_fail(SERVD_EFORMAT, "%s: %s: expected a number", gwhat(g), key);
  *out = f64_at(kv->type, kv->data);
  return 0;
}

int mpk_gguf_get_bool(const mpk_gguf *g, const char *key, bool *out) {
  const mpk_gguf_kv *kv = mpk_gguf_find(g, key);
  if (!kv) return SERVD_EINVAL;
  if (kv->type != MPK_GGUF_BOOL) return servd_fail(SERVD_EFORMAT, "%s: %s: expected a bool", gwhat(g), key);
  *out = kv->data[0] != 0;
  return 0;
}

int mpk_gguf_get_str(const mpk_gguf *g, const char *key, const char **s, size_t *len) {
  const mpk_gguf_kv *kv = mpk_gguf_find(g, key);
  if (!kv) return SERVD_EINVAL;
  if (kv->type != MPK_GGUF_STRING) return servd_fail(SERVD_EFORMAT, "%s: %s: expected a string", gwhat(g), key);
  *len = rd64(kv->data);
  *s = (const char *)kv->data + 8;
  return 0;
}

void mpk_gguf_arr_str(const mpk_gguf *g, const mpk_gguf_kv *kv, uint64_t i, const char **s, size_t *len) {
  (void)g;
  const uint8_t *p = kv->data + kv->str_off[i];
  *len = rd64(p);
  *s = (const char *)p + 8;
}

int64_t mpk_gguf_arr_int(const mpk_gguf_kv *kv, uint64_t i) {
  return int_at(kv->arr_type, kv->data + i * scalar_size[kv->arr_type]);
}

double mpk_gguf_arr_f64(const mpk_gguf_kv *kv, uint64_t i) {
  return f64_at(kv->arr_type, kv->data + i * scalar_size[kv->arr_type]);
}
