/* Hugging Face model folder -> package: config.json, model.safetensors or sharded shards with
 * model.safetensors.index.json, tokenizer.json, tokenizer_config.json, generation_config.json,
 * chat_template.jinja. Tensors keep their names and (f32/f16/bf16) dtypes; others are converted. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "arch.h"
#include "import-impl.h"
#include "mpk-impl.h"
#include "mpk/safetensors.h"

typedef struct shard {
  char *file;
  mpk_map map;
  mpk_st_header *h;
} shard;

typedef struct st_src {
  const char *dtype;
} st_src;

static int st_row_to_f32(const void *ctx, const void *src, float *dst, int64_t n) {
  const st_src *s = ctx;
  const uint8_t *p = src;
  if (!strcmp(s->dtype, "F32")) memcpy(dst, p, (size_t)n * 4);
  else if (!strcmp(s->dtype, "F16"))
    for (int64_t i = 0; i < n; i++) dst[i] = servd_f16_to_f32(rd16(p + 2 * i));
  else if (!strcmp(s->dtype, "BF16"))
    for (int64_t i = 0; i < n; i++) dst[i] = servd_bf16_to_f32(rd16(p + 2 * i));
  else if (!strcmp(s->dtype, "F64")) {
    for (int64_t i = 0; i < n; i++) {
      union {
        uint64_t u;
        double d;
      } v = {.u = rd64(p + 8 * i)};
      dst[i] = (float)v.d;
    }
  } else
    return servd_fail(SERVD_EUNSUPPORTED, "tensor dtype %s cannot be converted (expected F64 F32 F16 BF16)", s->dtype);
  return 0;
}

static const char *tokstr(json_t *v) {
  if (json_is_object(v)) v = json_object_get(v, "content"); /* AddedToken form */
  return json_string_value(v);
}

static int load_shards(const char *dir, shard **out, size_t *nout) {
  char path[4096];
  int rc = 0;
  json_t *idx = NULL;
  shard *sh = NULL;
  size_t n = 0;
  struct stat st;
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  if (stat(path, &st) == 0) {
    if ((rc = mpk__source_regular(path)) || (rc = mpk__load_json_file(path, &idx))) return rc;
    json_t *wm = json_object_get(idx, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
      rc = servd_fail(SERVD_EFORMAT, "%s: weight_map: expected a non-empty object of tensor -> file", path);
      goto fail;
    }
    sh = calloc(json_object_size(wm), sizeof *sh);
    if (!sh) {
      rc = servd_fail(SERVD_ENOMEM, "out of memory");
      goto fail;
    }
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
      const char *f = json_string_value(v);
      if (!f || strchr(f, '/') || !strcmp(f, "..") || !strcmp(f, ".")) {
        rc = servd_fail(SERVD_EFORMAT, "%s: weight_map[\"%s\"]: expected a file name in the same folder", path, k);
        goto fail;
      }
      size_t j = 0;
      while (j < n && strcmp(sh[j].file, f)) j++;
      if (j == n && !(sh[n++].file = strdup(f))) {
        rc = servd_fail(SERVD_ENOMEM, "out of memory");
        goto fail;
      }
    }
  } else {
    sh = calloc(1, sizeof *sh);
    if (!sh || !(sh[0].file = strdup("model.safetensors"))) {
      rc = servd_fail(SERVD_ENOMEM, "out of memory");
      goto fail;
    }
    n = 1;
  }
  for (size_t i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, sh[i].file);
    if ((rc = mpk__source_regular(path)) || (rc = mpk__map_file_fd(path, &sh[i].map)) ||
        (rc = mpk_st_parse(path, sh[i].map.data, sh[i].map.len, &sh[i].h)))
      goto fail;
  }
  if (idx) { /* the index and the shards must agree */
    json_t *wm = json_object_get(idx, "weight_map");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += sh[i].h->n;
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
      size_t j = 0;
      while (strcmp(sh[j].file, json_string_value(v))) j++;
      if (mpk_st_find(sh[j].h, k) < 0) {
        rc = servd_fail(SERVD_EFORMAT, "%s/model.safetensors.index.json: tensor \"%s\" is not in %s", dir, k,
                        sh[j].file);
        goto fail;
      }
    }
    if (total != json_object_size(wm)) {
      rc = servd_fail(SERVD_EFORMAT,
                      "%s: the shards hold %zu tensors, the index lists %zu (duplicates or unlisted tensors)", dir,
                      total, json_object_size(wm));
      goto fail;
    }
  }
  json_decref(idx);
  *out = sh;
  *nout = n;
  return 0;
fail:
  json_decref(idx);
  for (size_t i = 0; sh && i < n; i++) {
    mpk_st_free(sh[i].h);
    mpk__unmap(&sh[i].map);
    free(sh[i].file);
  }
  free(sh);
  return rc;
}

typedef struct tref {
  const char *name;
  size_t shard, idx;
  char *canon;
} tref;
static int cmp_tref(const void *a, const void *b) { return strcmp(((const tref *)a)->canon, ((const tref *)b)->canon); }

/* Side files of the folder (links to regular files are followed: the hub cache layout). */
static int add_side_file(mpk_writer *w, const char *dir, const char *file, bool json, bool *present) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  int rc = mpk__source_regular(path);
  return rc ? rc : mpk__add_source_file(w, path, file, json, present);
}

int mpk_pack_hf(const char *dir, const char *out_path, const mpk_import_options *opt) {
  mpk_import_options defaults;
  if (!opt) {
    mpk_import_options_init(&defaults);
    opt = &defaults;
  }
  int rc = 0;
  char path[4096];
  json_t *config = NULL, *tcfg = NULL, *gcfg = NULL;
  shard *sh = NULL;
  size_t nsh = 0, nt = 0;
  tref *refs = NULL;
  mpk_writer *w = NULL;
  mpk_shapes shapes = {0};
  const mpk_arch *arch;
  snprintf(path, sizeof path, "%s/config.json", dir);
  if ((rc = mpk__source_regular(path)) || (rc = mpk__load_json_file(path, &config))) goto fail;
  if (!json_is_object(config)) {
    rc = servd_fail(SERVD_EFORMAT, "%s: expected a JSON object", path);
    goto fail;
  }
  if ((rc = mpk__arch_for_hf(path, config, &arch)) || (rc = mpk__arch_config(arch, path, config))) goto fail;
  if ((rc = mpk__hf_pooling(dir, config)) || (rc = mpk__hf_sentence_modules(dir, config))) goto fail;
  if ((rc = load_shards(dir, &sh, &nsh))) goto fail;

  /* Tensors under canonical names, sorted for reproducible packages, checked against the config
   * before the first byte is written. */
  for (size_t i = 0; i < nsh; i++) nt += sh[i].h->n;
  refs = calloc(nt ? nt : 1, sizeof *refs);
  shapes.e = calloc(nt ? nt : 1, sizeof *shapes.e);
  if (!refs || !shapes.e) {
    rc = servd_fail(SERVD_ENOMEM, "out of memory");
    goto fail;
  }
  mpk_progress pr = {.o = opt};
  size_t k = 0;
  for (size_t i = 0; i < nsh; i++)
    for (size_t j = 0; j < sh[i].h->n; j++) {
      const mpk_st_tensor *t = &sh[i].h->tensors[j];
      char cn[512];
      const char *src = t->name;
      size_t hp = arch->hf_prefix ? strlen(arch->hf_prefix) : 0;
      if (hp && !strncmp(src, arch->hf_prefix, hp)) src += hp;
      mpk__arch_map_name(&arch->hf_names, src, cn, sizeof cn);
      if (!cn[0]) continue; /* a buffer the family's code never reads (mapped to "") */
      refs[k] = (tref){t->name, i, j, strdup(cn)};
      if (!refs[k++].canon) {
        rc = servd_fail(SERVD_ENOMEM, "out of memory");
        goto fail;
      }
      pr.total += t->end - t->begin;
    }
  nt = k;
  qsort(refs, nt, sizeof *refs, cmp_tref);
  for (size_t i = 0; i < nt; i++) {
    const mpk_st_tensor *t = &sh[refs[i].shard].h->tensors[refs[i].idx];
    if (i && !strcmp(refs[i - 1].canon, refs[i].canon)) {
      rc = servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\" appears in two shards", dir, refs[i].canon);
      goto fail;
    }
    mpk_shape_entry *e = &shapes.e[shapes.n++];
    e->name = refs[i].canon;
    e->ndim = t->ndim > SERVD_MAX_DIMS ? SERVD_MAX_DIMS : t->ndim;
    memcpy(e->shape, t->shape, sizeof(int64_t) * (size_t)e->ndim);
    if (t->ndim == 0) e->shape[0] = 1, e->ndim = 1; /* scalars become (1,) */
  }
  if ((rc = arch->check_tensors(arch, dir, config, &shapes))) goto fail;
  if ((rc = mpk_writer_create(out_path, &w))) goto fail;

  char name[256];
  snprintf(path, sizeof path, "%s", dir);
  size_t l = strlen(path);
  while (l > 1 && path[l - 1] == '/') path[--l] = 0;
  snprintf(name, sizeof name, "%.255s",
           strrchr(path, '/') ? strrchr(path, '/') + 1 : path); /* made safe and short by common_fields */
  if ((rc = mpk__common_fields(w, opt, arch, name))) goto fail;

  /* Tokenizer and side files, checked to be JSON. */
  bool has_tok, has_tcfg, has_gen, has_tmpl;
  if ((rc = add_side_file(w, dir, "tokenizer.json", true, &has_tok))) goto fail;
  if (!has_tok) {
    rc = servd_fail(SERVD_EINVAL, "%s/tokenizer.json: missing (a causal LM package needs its tokenizer)", dir);
    goto fail;
  }
  if ((rc = add_side_file(w, dir, "tokenizer_config.json", true, &has_tcfg))) goto fail;
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  if (has_tcfg && (rc = mpk__load_json_file(path, &tcfg))) goto fail;
  if ((rc = add_side_file(w, dir, "generation_config.json", true, &has_gen))) goto fail;
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  if (has_gen && (rc = mpk__load_json_file(path, &gcfg))) goto fail;
  if ((rc = add_side_file(w, dir, "chat_template.jinja", false, &has_tmpl))) goto fail;

  json_t *tok = json_pack("{s:s}", "file", "tokenizer.json");
  if (has_tcfg) {
    json_object_set_new(tok, "config", json_string("tokenizer_config.json"));
    json_t *abos = json_object_get(tcfg, "add_bos_token");
    if (json_is_boolean(abos)) json_object_set(tok, "add_bos_token", abos);
  }
  if ((rc = mpk_writer_set(w, "tokenizer", tok))) goto fail;
  if (has_tmpl && (rc = mpk_writer_set(w, "chat_template_file", json_string("chat_template.jinja")))) goto fail;
  json_t *special = json_object();
  static const char *const sk[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
  for (size_t i = 0; tcfg && i < 4; i++) {
    const char *s = tokstr(json_object_get(tcfg, sk[i]));
    if (s) json_object_set_new(special, sk[i], json_string(s));
  }
  if ((rc = mpk_writer_set(w, "special_tokens", special))) goto fail;
  /* generation_config's eos ids complete the model config when it has none. */
  if (gcfg && !json_object_get(config, "eos_token_id") && json_object_get(gcfg, "eos_token_id"))
    json_object_set(config, "eos_token_id", json_object_get(gcfg, "eos_token_id"));
  if ((rc = mpk_writer_set(w, "rope_layout", json_string(arch->rope_layout_hf)))) goto fail;
  json_incref(config);
  if ((rc = mpk_writer_set(w, "config", config))) goto fail;

  for (size_t i = 0; i < nt; i++) {
    const shard *s = &sh[refs[i].shard];
    const mpk_st_tensor *t = &s->h->tensors[refs[i].idx];
    const uint8_t *data = (const uint8_t *)s->map.data + s->h->data_start + t->begin;
    int64_t shape[SERVD_MAX_DIMS];
    int nd = t->ndim;
    if (nd > SERVD_MAX_DIMS) {
      rc = servd_fail(SERVD_EUNSUPPORTED, "%s: tensor \"%s\": %d dimensions, expected at most 4", s->file, t->name, nd);
      goto fail;
    }
    if (nd == 0) {
      shape[0] = 1;
      nd = 1;
    } /* scalars become (1,) */
    else
      memcpy(shape, t->shape, sizeof(int64_t) * (size_t)nd);
    bool any_zero = false;
    for (int d = 0; d < nd; d++) any_zero |= shape[d] == 0;
    if (any_zero) {
      rc = servd_fail(SERVD_EUNSUPPORTED, "%s: tensor \"%s\": empty tensors are not supported", s->file, t->name);
      goto fail;
    }
    servd_dtype native;
    bool is_native = mpk_st_dtype_to_servd(t->dtype, &native) == 0;
    servd_dtype target = is_native ? native : SERVD_F32;
    if (!is_native || (opt->convert_all && nd == 2 && native != SERVD_I32)) {
      target = opt->dtype;
      if (servd_dtype_is_quantized(target) && (nd < 2 || shape[nd - 1] % (int64_t)servd_dtype_block_elems(target)))
        target = SERVD_F32;
    }
    if (is_native && target == native)
      rc = mpk__emit_raw(w, &pr, refs[i].canon, target, nd, shape, data, t->end - t->begin, s->map.fd,
                         s->h->data_start + t->begin);
    else {
      st_src ctx = {t->dtype};
      uint64_t row = (uint64_t)shape[nd - 1] * t->elem_bytes;
      rc = mpk__emit_converted(w, &pr, refs[i].canon, target, nd, shape, data, row, st_row_to_f32, &ctx);
    }
    if (rc) goto fail;
  }
  rc = mpk_writer_finish(w);
fail:
  mpk_writer_destroy(w);
  for (size_t i = 0; refs && i < nt; i++) free(refs[i].canon);
  free(refs);
  free(shapes.e);
  for (size_t i = 0; sh && i < nsh; i++) {
    mpk_st_free(sh[i].h);
    mpk__unmap(&sh[i].map);
    free(sh[i].file);
  }
  free(sh);
  json_decref(config);
  json_decref(tcfg);
  json_decref(gcfg);
  return rc;
}
