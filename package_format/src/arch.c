/* The architecture registry's table and lookups, the helpers its rows share, and mpk_check_model. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "mpk-impl.h"
#include "mpk/package.h"
#include "servd/status.h"

/* One line per family. */
static const mpk_arch *const arches[] = {&mpk__arch_llama,  &mpk__arch_mistral, &mpk__arch_qwen2, &mpk__arch_qwen3,
                                         &mpk__arch_gemma3, &mpk__arch_phi3,    &mpk__arch_bert};
#define N_ARCHES (sizeof arches / sizeof *arches)

static void join(char *buf, size_t cap, size_t *o, const char *const *list) {
  for (size_t i = 0; list && list[i] && *o < cap; i++)
    *o += (size_t)snprintf(buf + *o, cap - *o, "%s%s", i ? ", " : "", list[i]);
}

void mpk__arch_known(char *buf, size_t cap) {
  size_t o = 0;
  buf[0] = 0;
  for (size_t i = 0; i < N_ARCHES && o < cap; i++) {
    const mpk_arch *a = arches[i];
    o += (size_t)snprintf(buf + o, cap - o, "%s%s (model_type ", i ? "; " : "", a->name);
    join(buf, cap, &o, a->hf_model_types);
    if (o < cap && a->gguf_archs) o += (size_t)snprintf(buf + o, cap - o, ", GGUF ");
    join(buf, cap, &o, a->gguf_archs);
    if (o < cap) o += (size_t)snprintf(buf + o, cap - o, ")");
  }
}

static bool in_list(const char *const *list, const char *s, size_t n) {
  for (size_t i = 0; list && list[i]; i++)
    if (strlen(list[i]) == n && !memcmp(list[i], s, n)) return true;
  return false;
}

const mpk_arch *mpk__arch_by_name(const char *name) {
  for (size_t i = 0; name && i < N_ARCHES; i++)
    if (!strcmp(arches[i]->name, name)) return arches[i];
  return NULL;
}

int mpk__arch_for_hf(const char *what, const json_t *config, const mpk_arch **out) {
  char known[512], q[400];
  const char *mt = json_string_value(json_object_get(config, "model_type"));
  json_t *archs = json_object_get(config, "architectures");
  for (size_t i = 0; mt && i < N_ARCHES; i++)
    if (in_list(arches[i]->hf_model_types, mt, strlen(mt))) return *out = arches[i], 0;
  if (!mt && json_is_array(archs)) { /* model_type missing: the architectures list decides */
    for (size_t i = 0; i < N_ARCHES; i++)
      for (size_t j = 0; j < json_array_size(archs); j++) {
        const char *s = json_string_value(json_array_get(archs, j));
        if (s && in_list(arches[i]->hf_architectures, s, strlen(s))) return *out = arches[i], 0;
      }
  }
  mpk__arch_known(known, sizeof known);
  if (!mt)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "%s: model_type: missing (and no known architectures entry); known architectures are: %s", what,
                      known);
  return servd_fail(SERVD_EUNSUPPORTED, "%s: model_type \"%s\" is no known architecture; known architectures are: %s",
                    what, mpk__printable(mt, strlen(mt), q, sizeof q), known);
}

int mpk__arch_for_gguf(const char *what, const char *arch, size_t len, const mpk_arch **out) {
  char known[512], q[400];
  for (size_t i = 0; arch && i < N_ARCHES; i++)
    if (in_list(arches[i]->gguf_archs, arch, len)) return *out = arches[i], 0;
  mpk__arch_known(known, sizeof known);
  if (!arch)
    return servd_fail(SERVD_EUNSUPPORTED, "%s: general.architecture: missing; known architectures are: %s", what,
                      known);
  return servd_fail(SERVD_EUNSUPPORTED,
                    "%s: general.architecture \"%s\" is no known architecture; known architectures are: %s", what,
                    mpk__printable(arch, len, q, sizeof q), known);
}

int mpk__arch_config(const mpk_arch *a, const char *what, json_t *config) {
  int rc = a->prepare_config ? a->prepare_config(a, what, config) : 0;
  return rc ? rc : a->check_config(a, what, config);
}

void mpk__arch_map_name(const mpk_name_map *m, const char *src, char *out, size_t cap) {
  for (const mpk_name_pair *p = m->global; p && p->src; p++)
    if (!strcmp(src, p->src)) {
      snprintf(out, cap, "%s", p->dst);
      return;
    }
  size_t pl = m->block_prefix ? strlen(m->block_prefix) : 0;
  if (pl && !strncmp(src, m->block_prefix, pl)) {
    const char *s = src + pl;
    char *end;
    unsigned long layer = strtoul(s, &end, 10);
    if (end > s && *end == '.' && s[0] != '+' && s[0] != '-' && (s[0] != '0' || end == s + 1))
      for (const mpk_name_pair *p = m->block; p && p->src; p++)
        if (!strcmp(end + 1, p->src)) {
          snprintf(out, cap, "model.layers.%lu.%s", layer, p->dst);
          return;
        }
  }
  snprintf(out, cap, "%s", src);
}

static int cmp_shape(const void *a, const void *b) {
  return strcmp(((const mpk_shape_entry *)a)->name, ((const mpk_shape_entry *)b)->name);
}

void mpk__shapes_sort(mpk_shapes *s) { qsort(s->e, s->n, sizeof *s->e, cmp_shape); }

const mpk_shape_entry *mpk__shapes_find(const mpk_shapes *s, const char *name) {
  mpk_shape_entry key = {.name = name};
  return s->n ? bsearch(&key, s->e, s->n, sizeof *s->e, cmp_shape) : NULL;
}

static void fmt_shape(int ndim, const int64_t *shape, char *buf, size_t cap) {
  size_t o = (size_t)snprintf(buf, cap, "(");
  for (int d = 0; d < ndim && o < cap; d++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (o < cap) snprintf(buf + o, cap - o, "%s)", ndim == 1 ? "," : "");
}

int mpk__shapes_expect(const char *what, const mpk_shapes *s, const char *name, int ndim, ...) {
  int64_t want[SERVD_MAX_DIMS] = {0};
  va_list ap;
  va_start(ap, ndim);
  for (int d = 0; d < ndim && d < SERVD_MAX_DIMS; d++) want[d] = va_arg(ap, int64_t);
  va_end(ap);
  char ws[96], hs[96];
  fmt_shape(ndim, want, ws, sizeof ws);
  const mpk_shape_entry *e = mpk__shapes_find(s, name);
  if (!e)
    return servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": missing, expected shape %s from the config", what, name, ws);
  bool same = e->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = e->shape[d] == want[d];
  if (same) return 0;
  fmt_shape(e->ndim, e->shape, hs, sizeof hs);
  return servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": shape %s, expected %s from the config", what, name, hs, ws);
}

int mpk__cfg_int(const char *what, const json_t *c, const char *key, bool required, int64_t dflt, int64_t *out) {
  json_t *v = json_object_get(c, key);
  if (!v || json_is_null(v)) {
    if (required)
      return servd_fail(SERVD_EFORMAT, "%s: config: \"%s\": missing, expected a positive integer", what, key);
    *out = dflt;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > ((json_int_t)1 << 31))
    return servd_fail(SERVD_EFORMAT, "%s: config: \"%s\": expected an integer in 1..2^31", what, key);
  *out = (int64_t)json_integer_value(v);
  return 0;
}

int mpk__cfg_pos(const char *what, const json_t *c, const char *key, bool zero_ok, double dflt, double *out) {
  json_t *v = json_object_get(c, key);
  if (!v || json_is_null(v)) {
    *out = dflt;
    return 0;
  }
  double x = json_number_value(v);
  if (!json_is_number(v) || !isfinite(x) || x < 0 || (x == 0 && !zero_ok))
    return servd_fail(SERVD_EFORMAT, "%s: config: \"%s\": expected a finite number %s 0", what, key,
                      zero_ok ? ">=" : ">");
  *out = x;
  return 0;
}

int mpk__decoder_dims_read(const char *what, const json_t *c, int64_t head_dim_dflt, mpk_decoder_dims *d) {
  int rc;
  if ((rc = mpk__cfg_int(what, c, "hidden_size", true, 0, &d->hidden)) ||
      (rc = mpk__cfg_int(what, c, "intermediate_size", true, 0, &d->inter)) ||
      (rc = mpk__cfg_int(what, c, "num_hidden_layers", true, 0, &d->layers)) ||
      (rc = mpk__cfg_int(what, c, "num_attention_heads", true, 0, &d->heads)) ||
      (rc = mpk__cfg_int(what, c, "num_key_value_heads", false, d->heads, &d->kv_heads)) ||
      (rc = mpk__cfg_int(what, c, "head_dim", false, head_dim_dflt ? head_dim_dflt : d->hidden / d->heads,
                         &d->head_dim)))
    return rc;
  return mpk__cfg_int(what, c, "vocab_size", false, -1, &d->vocab);
}

int mpk__decoder_dims_check(const char *what, const mpk_decoder_dims *d) {
  if (d->head_dim == 0)
    return servd_fail(SERVD_EFORMAT, "%s: config: hidden_size %lld < num_attention_heads %lld and no head_dim", what,
                      (long long)d->hidden, (long long)d->heads);
  if (d->heads % d->kv_heads)
    return servd_fail(SERVD_EFORMAT,
                      "%s: config: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", what,
                      (long long)d->heads, (long long)d->kv_heads);
  if ((uint64_t)d->heads * (uint64_t)d->head_dim > (1ull << 31))
    return servd_fail(SERVD_EFORMAT, "%s: config: num_attention_heads x head_dim too large", what);
  return 0;
}

int mpk__cfg_tie(const char *what, const json_t *c) {
  json_t *tie = json_object_get(c, "tie_word_embeddings");
  if (tie && !json_is_boolean(tie) && !json_is_null(tie))
    return servd_fail(SERVD_EFORMAT, "%s: config: \"tie_word_embeddings\": expected true or false", what);
  return 0;
}

int mpk__cfg_rope_scaling(const char *what, const json_t *c, const char *type, double min_factor, bool min_strict,
                          const char *expected) {
  json_t *rs = json_object_get(c, "rope_scaling");
  if (!rs || json_is_null(rs) || (json_is_object(rs) && json_object_size(rs) == 0)) return 0;
  json_t *ty = json_object_get(rs, "rope_type");
  if (!ty) ty = json_object_get(rs, "type");
  double f = json_number_value(json_object_get(rs, "factor"));
  if (json_is_object(rs) && json_is_string(ty) && !strcmp(json_string_value(ty), type) && isfinite(f) &&
      (min_strict ? f > min_factor : f >= min_factor))
    return 0;
  char q[300];
  const char *s = json_string_value(ty);
  return servd_fail(SERVD_EUNSUPPORTED, "%s: config: rope_scaling type \"%s\": expected null or %s", what,
                    s ? mpk__printable(s, strlen(s), q, sizeof q) : "", expected);
}

int mpk__decoder_check_tensors(const char *what, const json_t *c, const mpk_shapes *s, const mpk_decoder_dims *d,
                               const mpk_layer_tensor *t, size_t n, const char *family) {
  int rc;
  int64_t H = d->hidden;
  const mpk_shape_entry *emb = mpk__shapes_find(s, "model.embed_tokens.weight");
  int64_t V = d->vocab > 0 ? d->vocab : emb && emb->ndim == 2 ? emb->shape[0] : 1;
  if ((rc = mpk__shapes_expect(what, s, "model.embed_tokens.weight", 2, V, H)) ||
      (rc = mpk__shapes_expect(what, s, "model.norm.weight", 1, H)))
    return rc;
  /* The model code ties the head to the embedding when lm_head is absent; a config that says
   * untied (false) while the head is missing contradicts the weights. */
  if (mpk__shapes_find(s, "lm_head.weight")) {
    if ((rc = mpk__shapes_expect(what, s, "lm_head.weight", 2, V, H))) return rc;
  } else if (json_is_false(json_object_get(c, "tie_word_embeddings"))) {
    return servd_fail(
        SERVD_EFORMAT,
        "%s: tensor \"lm_head.weight\": missing, expected (%lld, %lld) since tie_word_embeddings is false", what,
        (long long)V, (long long)H);
  }
  char name[128];
  for (int64_t l = 0; l < d->layers; l++)
    for (size_t i = 0; i < n; i++) {
      snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, t[i].name);
      /* A tensor of an option the family lacks would be ignored by the code: a wrong family. */
      if (!t[i].on) {
        if (mpk__shapes_find(s, name))
          return servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": unexpected for a %s model (its code would ignore it)",
                            what, name, family);
        continue;
      }
      if ((rc = t[i].ndim == 1 ? mpk__shapes_expect(what, s, name, 1, t[i].rows)
                               : mpk__shapes_expect(what, s, name, 2, t[i].rows, t[i].cols)))
        return rc;
    }
  /* A layer beyond num_hidden_layers would be ignored silently: the config and weights disagree. */
  snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)d->layers);
  if (mpk__shapes_find(s, name))
    return servd_fail(SERVD_EFORMAT, "%s: tensor \"%s\": the config has num_hidden_layers %lld, expected no layer %lld",
                      what, name, (long long)d->layers, (long long)d->layers);
  return 0;
}

int mpk_check_model(const mpk_package *p) {
  if (!p) return servd_fail(SERVD_EINVAL, "mpk_check_model: no package");
  const char *what = mpk_path(p);
  if (strcmp(mpk_kind(p), "causal-lm")) return 0; /* generic packages bring their own code and checks */
  json_t *config = mpk_config(p);
  const mpk_arch *a = NULL;
  json_t *an = json_object_get(mpk_manifest(p), "architecture");
  int rc;
  if (an) {
    char known[512], q[400];
    const char *s = json_string_value(an);
    if (!(a = mpk__arch_by_name(s))) {
      mpk__arch_known(known, sizeof known);
      return servd_fail(SERVD_EUNSUPPORTED,
                        "%s: manifest.json: architecture \"%s\" is no known architecture; known architectures are: %s",
                        what, s ? mpk__printable(s, strlen(s), q, sizeof q) : "(not a string)", known);
    }
  } else if ((rc = mpk__arch_for_hf(what, config, &a))) {
    return rc;
  }
  mpk_shapes s = {calloc((size_t)mpk_tensor_count(p) + 1, sizeof *s.e), 0};
  if (!s.e) return servd_fail(SERVD_ENOMEM, "%s: out of memory", what);
  for (int i = 0; i < mpk_tensor_count(p); i++) {
    mpk_tensor_info t;
    if (mpk_tensor_info_at(p, i, &t)) continue;
    mpk_shape_entry *e = &s.e[s.n++];
    e->name = t.name;
    e->ndim = t.ndim;
    memcpy(e->shape, t.shape, sizeof e->shape);
  }
  mpk__shapes_sort(&s);
  if (!(rc = a->check_config(a, what, config))) rc = a->check_tensors(a, what, config, &s);
  free(s.e);
  return rc;
}
