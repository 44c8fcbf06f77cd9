/* LoRA adapters from PEFT files (mpk/lora.h): config and tensor names checked, every tensor checked
 * against the base's projection shapes and for non-finite values, then laid out as servd.ops.lora's
 * ab (r, in + out) per (layer, projection). */
#include "mpk/lora.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mpk-impl.h"
#include "mpk/gguf.h"
#include "mpk/safetensors.h"
#include "mpk/writer.h"

static const char *const module_names[MPK_LORA_MODULES] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                           "gate_proj", "up_proj", "down_proj"};
/* where each projection sits in a layer (Hugging Face names) and its GGUF name */
static const char *const module_parent[MPK_LORA_MODULES] = {"self_attn", "self_attn", "self_attn", "self_attn",
                                                            "mlp",       "mlp",       "mlp"};
static const char *const module_gguf[MPK_LORA_MODULES] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                          "ffn_gate", "ffn_up", "ffn_down"};

const char *mpk_lora_module_name(mpk_lora_module m) { return m >= 0 && m < MPK_LORA_MODULES ? module_names[m] : "?"; }

static int find_module(const char *s, size_t len) {
  for (int m = 0; m < MPK_LORA_MODULES; m++)
    if (strlen(module_names[m]) == len && !memcmp(s, module_names[m], len)) return m;
  return -1;
}

/* ---- the base ------------------------------------------------------------------------------------ */
static int info_of(mpk_package *p, const char *name, mpk_tensor_info *ti) {
  for (int i = 0, n = mpk_tensor_count(p); i < n; i++)
    if (!strcmp(mpk_tensor_name(p, i), name)) return mpk_tensor_info_at(p, i, ti);
  return SERVD_ERANGE;
}

static int projection(mpk_package *p, int layer, int m, mpk_tensor_info *ti) {
  char name[160];
  snprintf(name, sizeof name, "model.layers.%d.%s.%s.weight", layer, module_parent[m], module_names[m]);
  if (info_of(p, name, ti) == 0) return 0;
  snprintf(name, sizeof name, "blk.%d.%s.weight", layer, module_gguf[m]);
  return info_of(p, name, ti);
}

/* The hash of the weights: SHA-256 over each weights/ entry's path and manifest sha256, in path order. */
static void weights_hash(mpk_package *p, char out[72]) {
  json_t *files = json_object_get(mpk_manifest(p), "files");
  out[0] = 0;
  if (!json_is_object(files)) return;
  size_t n = json_object_size(files), i = 0, cap = 1;
  const char **keys = calloc(n ? n : 1, sizeof *keys);
  if (!keys) return;
  const char *k;
  json_t *v;
  json_object_foreach(files, k, v) if (!strncmp(k, "weights/", 8)) keys[i++] = k;
  n = i;
  for (size_t a = 1; a < n; a++)
    for (size_t b = a; b > 0 && strcmp(keys[b - 1], keys[b]) > 0; b--) {
      const char *t = keys[b];
      keys[b] = keys[b - 1];
      keys[b - 1] = t;
    }
  for (i = 0; i < n; i++) cap += strlen(keys[i]) + 66;
  char *buf = malloc(cap), hex[65];
  if (buf) {
    size_t o = 0;
    for (i = 0; i < n; i++) {
      const char *h = json_string_value(json_object_get(json_object_get(files, keys[i]), "sha256"));
      o += (size_t)snprintf(buf + o, cap - o, "%s %s\n", keys[i], h ? h : "");
    }
    mpk__sha256_hex(buf, o, hex);
    snprintf(out, 72, "sha256:%s", hex);
  }
  free(buf);
  free(keys);
}

int mpk_lora_base_of(mpk_package *p, mpk_lora_base *out) {
  memset(out, 0, sizeof *out);
  mpk_tensor_info ti;
  for (int m = 0; m < MPK_LORA_MODULES; m++) {
    if (projection(p, 0, m, &ti) != 0)
      return servd_fail(SERVD_EUNSUPPORTED,
                        "LoRA: the base %s has no separate %s projection (layer 0): adapters apply to models with "
                        "q/k/v/o/gate/up/down projections",
                        mpk_name(p), module_names[m]);
    out->out[m] = ti.shape[0];
    out->in[m] = ti.shape[1];
  }
  while (projection(p, out->n_layers, MPK_LORA_Q, &ti) == 0) out->n_layers++;
  const char *layout = mpk_rope_layout(p);
  if (layout && !strcmp(layout, "interleaved")) {
    json_t *cfg = mpk_config(p);
    json_t *h = json_object_get(cfg, "num_attention_heads"), *kvh = json_object_get(cfg, "num_key_value_heads");
    out->q_heads = (int)json_integer_value(h);
    out->kv_heads = kvh ? (int)json_integer_value(kvh) : out->q_heads;
    if (out->q_heads < 1 || out->kv_heads < 1 || out->out[MPK_LORA_Q] % (2 * out->q_heads) ||
        out->out[MPK_LORA_K] % (2 * out->kv_heads))
      return servd_fail(SERVD_EFORMAT, "LoRA: the base %s has interleaved RoPE rows but no head counts that split them",
                        mpk_name(p));
    out->permute_qk = true;
  }
  snprintf(out->name, sizeof out->name, "%s", mpk_name(p));
  weights_hash(p, out->hash);
  return 0;
}

/* ---- the adapter --------------------------------------------------------------------------------- */
void mpk_lora_free(mpk_lora *l) {
  if (!l) return;
  for (int i = 0; l->ab && i < l->n_layers * MPK_LORA_MODULES; i++) servd_tensor_release(l->ab[i]);
  free(l->ab);
  free(l);
}

/* Reads the config's numbers and refuses what servd does not apply. */
static int read_config(const char *what, const char *text, size_t len, mpk_lora *l) {
  json_error_t je;
  json_t *c = json_loadb(text, len, 0, &je);
  int rc = 0;
  if (!json_is_object(c)) {
    rc = servd_fail(SERVD_EFORMAT, "%s: adapter_config.json: not a JSON object (%s, line %d)", what, je.text, je.line);
    goto out;
  }
  const char *pt = json_string_value(json_object_get(c, "peft_type"));
  if (pt && strcmp(pt, "LORA")) {
    rc = servd_fail(SERVD_EUNSUPPORTED, "%s: adapter_config.json: peft_type \"%s\": only LORA adapters are served",
                    what, pt);
    goto out;
  }
  json_t *r = json_object_get(c, "r");
  if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > MPK_LORA_MAX_RANK) {
    rc = servd_fail(SERVD_EINVAL, "%s: adapter_config.json: r: expected an integer 1..%d (servd's rank limit)", what,
                    MPK_LORA_MAX_RANK);
    goto out;
  }
  l->rank = (int)json_integer_value(r);
  json_t *a = json_object_get(c, "lora_alpha");
  if (a && !json_is_number(a)) {
    rc = servd_fail(SERVD_EINVAL, "%s: adapter_config.json: lora_alpha: expected a number", what);
    goto out;
  }
  l->alpha = a ? json_number_value(a) : 8.0; /* PEFT's default */
  l->rslora = json_is_true(json_object_get(c, "use_rslora"));
  double s = l->rslora ? l->alpha / sqrt((double)l->rank) : l->alpha / (double)l->rank;
  if (!isfinite(s) || fabs(s) > 1e6) {
    rc = servd_fail(SERVD_EINVAL, "%s: adapter_config.json: lora_alpha %g gives the scale %g", what, l->alpha, s);
    goto out;
  }
  l->scale = (float)s;
  static const char *const refused[][2] = {{"use_dora", "DoRA"}, {"fan_in_fan_out", "fan_in_fan_out weights"}};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
    if (json_is_true(json_object_get(c, refused[i][0]))) {
      rc = servd_fail(SERVD_EUNSUPPORTED, "%s: adapter_config.json: %s: %s is not supported", what, refused[i][0],
                      refused[i][1]);
      goto out;
    }
  const char *bias = json_string_value(json_object_get(c, "bias"));
  if (bias && strcmp(bias, "none")) {
    rc = servd_fail(SERVD_EUNSUPPORTED, "%s: adapter_config.json: bias \"%s\": only \"none\" is supported", what, bias);
    goto out;
  }
  const char *pats[] = {"rank_pattern", "alpha_pattern"};
  for (int i = 0; i < 2; i++) {
    json_t *p = json_object_get(c, pats[i]);
    if (json_is_object(p) && json_object_size(p)) {
      rc = servd_fail(SERVD_EUNSUPPORTED, "%s: adapter_config.json: %s: per-module ranks and alphas are not supported",
                      what, pats[i]);
      goto out;
    }
  }
  json_t *mts = json_object_get(c, "modules_to_save");
  if (json_is_array(mts) && json_array_size(mts)) {
    rc = servd_fail(SERVD_EUNSUPPORTED,
                    "%s: adapter_config.json: modules_to_save: full copies of modules are not supported", what);
    goto out;
  }
  json_t *tm = json_object_get(c, "target_modules");
  size_t i;
  json_t *v;
  if (json_is_array(tm)) json_array_foreach(tm, i, v) {
      const char *s = json_string_value(v);
      if (!s || find_module(s, strlen(s)) < 0) {
        rc = servd_fail(SERVD_EUNSUPPORTED,
                        "%s: adapter_config.json: target_modules: \"%s\" is not a projection servd adapts (q_proj, "
                        "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                        what, s ? s : "(not a string)");
        goto out;
      }
    }
  const char *bm = json_string_value(json_object_get(c, "base_model_name_or_path"));
  snprintf(l->base_model, sizeof l->base_model, "%s", bm ? bm : "");
out:
  json_decref(c);
  return rc;
}

/* "base_model.model.model.layers.N.<parent>.<module>.lora_<A|B>[.default].weight" -> layer, module, B?
 * 0, -1 (not such a name), -2 (a layer the base lacks). */
static int parse_peft_name(const char *name, int n_layers, int *layer, int *module, int *is_b) {
  const char *s = name;
  if (!strncmp(s, "base_model.model.", 17)) s += 17;
  if (strncmp(s, "model.layers.", 13)) return -1;
  s += 13;
  char *end;
  errno = 0;
  long li = strtol(s, &end, 10);
  if (end == s || *end != '.' || errno || li < 0 || li >= 1 << 20) return -1;
  s = end + 1;
  const char *dot = strchr(s, '.');
  if (!dot) return -1;
  const char *parent = s;
  size_t parent_len = (size_t)(dot - s);
  s = dot + 1;
  if (!(dot = strchr(s, '.'))) return -1;
  int m = find_module(s, (size_t)(dot - s));
  if (m < 0 || strlen(module_parent[m]) != parent_len || memcmp(parent, module_parent[m], parent_len)) return -1;
  s = dot + 1;
  if (!strcmp(s, "lora_A.weight") || !strcmp(s, "lora_A.default.weight")) *is_b = 0;
  else if (!strcmp(s, "lora_B.weight") || !strcmp(s, "lora_B.default.weight")) *is_b = 1;
  else return -1;
  *layer = (int)li;
  *module = m;
  return li < n_layers ? 0 : -2;
}

/* llama.cpp's "blk.N.<attn_q|...>.weight.lora_<a|b>" -> layer, module, B? (as parse_peft_name) */
static int parse_gguf_name(const char *name, int n_layers, int *layer, int *module, int *is_b) {
  if (strncmp(name, "blk.", 4)) return -1;
  char *end;
  errno = 0;
  long li = strtol(name + 4, &end, 10);
  if (end == name + 4 || *end != '.' || errno || li < 0 || li >= 1 << 20) return -1;
  const char *s = end + 1;
  for (int m = 0; m < MPK_LORA_MODULES; m++) {
    size_t n = strlen(module_gguf[m]);
    if (strncmp(s, module_gguf[m], n)) continue;
    if (!strcmp(s + n, ".weight.lora_a")) *is_b = 0;
    else if (!strcmp(s + n, ".weight.lora_b")) *is_b = 1;
    else continue;
    *layer = (int)li;
    *module = m;
    return li < n_layers ? 0 : -2;
  }
  return -1;
}

/* One tensor of an adapter file, whatever the file: (rows, cols) row-major values. */
typedef struct src_tensor {
  const char *name;
  char dtype[12]; /* the file's name of its dtype */
  servd_dtype dt; /* F32, F16 or BF16; else SERVD_DTYPE_COUNT (refused when used) */
  int ndim;
  int64_t shape[2];
  const uint8_t *data;
} src_tensor;

static float src_value(const uint8_t *p, servd_dtype t, int64_t i) {
  uint16_t h;
  float f;
  switch (t) {
  case SERVD_F16: memcpy(&h, p + 2 * i, 2); return servd_f16_to_f32(h);
  case SERVD_BF16: memcpy(&h, p + 2 * i, 2); return servd_bf16_to_f32(h);
  default: memcpy(&f, p + 4 * i, 4); return f;
  }
}

typedef struct pair {
  int a, b; /* tensor indices, -1: absent */
} pair;

/* Checks one tensor's dtype, shape and values. */
static int check_tensor(const char *what, const src_tensor *t, int64_t rows, int64_t cols, const char *shape_why) {
  if (t->dt != SERVD_F32 && t->dt != SERVD_F16 && t->dt != SERVD_BF16)
    return servd_fail(SERVD_EUNSUPPORTED, "%s: tensor %s: dtype %s (expected F32, F16 or BF16)", what, t->name,
                      t->dtype);
  if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
    return servd_fail(SERVD_EINVAL, "%s: tensor %s: shape %s[%lld, %lld]%s, expected [%lld, %lld] (%s)", what, t->name,
                      t->dtype, t->ndim > 0 ? (long long)t->shape[0] : -1LL,
                      t->ndim > 1 ? (long long)t->shape[1] : -1LL, t->ndim != 2 ? " (not 2-D)" : "", (long long)rows,
                      (long long)cols, shape_why);
  for (int64_t i = 0, n = rows * cols; i < n; i++) {
    float v = src_value(t->data, t->dt, i);
    if (!isfinite(v))
      return servd_fail(SERVD_EINVAL, "%s: tensor %s: value %lld (row %lld, column %lld) is %s", what, t->name,
                        (long long)i, (long long)(i / cols), (long long)(i % cols), isnan(v) ? "NaN" : "infinite");
  }
  return 0;
}

/* The B row that lands at row c of an interleaved-RoPE base (llama.cpp's permute of Q/K rows: within
 * each head, pair i of the half-split layout becomes rows 2i, 2i+1). heads 0: no permutation. */
static int64_t source_row(int64_t c, int64_t out, int heads) {
  if (!heads) return c;
  int64_t hd = out / heads, h = c / hd, w = c % hd;
  return h * hd + (w % 2) * (hd / 2) + w / 2;
}

/* ab (r, in + out): row j = A[j, :], then B[:, j] (its rows permuted for an interleaved base). */
static servd_tensor *build_ab(const src_tensor *A, const src_tensor *B, int64_t r, int64_t in, int64_t out, int heads) {
  bool f16 = A->dt == SERVD_F16 && B->dt == SERVD_F16;
  const int64_t shape[2] = {r, in + out};
  servd_tensor *t = servd_tensor_new(f16 ? SERVD_F16 : SERVD_F32, 2, shape);
  if (!t) return NULL;
  const uint8_t *a = A->data, *b = B->data;
  for (int64_t j = 0; j < r; j++) {
    if (f16) {
      uint16_t *row = (uint16_t *)servd_tensor_data(t) + j * (in + out);
      memcpy(row, a + (size_t)(j * in) * 2, (size_t)in * 2);
      for (int64_t c = 0; c < out; c++) memcpy(row + in + c, b + (size_t)(source_row(c, out, heads) * r + j) * 2, 2);
    } else {
      float *row = (float *)servd_tensor_data(t) + j * (in + out);
      for (int64_t c = 0; c < in; c++) row[c] = src_value(a, A->dt, j * in + c);
      for (int64_t c = 0; c < out; c++) row[in + c] = src_value(b, B->dt, source_row(c, out, heads) * r + j);
    }
  }
  return t;
}

typedef int (*name_parser)(const char *name, int n_layers, int *layer, int *module, int *is_b);

/* The adapter's ab tensors from its file's tensors: paired, checked against the base, laid out.
 * l->rank and l->scale are set; permute: lora_B's Q/K rows are in the half-split order (PEFT), so an
 * interleaved base needs them permuted (a GGUF adapter's already are). */
static int assemble(const char *file, const src_tensor *ts, size_t n, name_parser parse, bool permute,
                    const char *expected_names, const mpk_lora_base *base, mpk_lora *l) {
  int nl = base->n_layers, np = nl * MPK_LORA_MODULES, rc = 0;
  l->n_layers = nl;
  pair *pairs = malloc(sizeof *pairs * (size_t)np);
  if (!pairs || !(l->ab = calloc((size_t)np, sizeof *l->ab))) {
    free(pairs);
    return servd_fail(SERVD_ENOMEM, "%s: adapter of %d layers", file, nl);
  }
  for (int i = 0; i < np; i++) pairs[i] = (pair){-1, -1};
  for (size_t i = 0; i < n; i++) {
    int layer, m, is_b, pr = parse(ts[i].name, nl, &layer, &m, &is_b);
    if (pr == -2) {
      rc = servd_fail(SERVD_EINVAL, "%s: tensor %s: layer %d, but the base %s has %d layers", file, ts[i].name, layer,
                      base->name, nl);
      goto out;
    }
    if (pr < 0) {
      rc = servd_fail(SERVD_EUNSUPPORTED, "%s: tensor %s: not a LoRA weight of a projection servd adapts (expected %s)",
                      file, ts[i].name, expected_names);
      goto out;
    }
    int *slot = is_b ? &pairs[layer * MPK_LORA_MODULES + m].b : &pairs[layer * MPK_LORA_MODULES + m].a;
    if (*slot >= 0) {
      rc = servd_fail(SERVD_EINVAL, "%s: tensor %s: a second lora_%c of layer %d's %s", file, ts[i].name,
                      is_b ? 'B' : 'A', layer, module_names[m]);
      goto out;
    }
    *slot = (int)i;
  }
  int64_t r = l->rank;
  for (int p = 0; p < np; p++) {
    if (pairs[p].a < 0 && pairs[p].b < 0) continue;
    int layer = p / MPK_LORA_MODULES, m = p % MPK_LORA_MODULES;
    if (pairs[p].a < 0 || pairs[p].b < 0) {
      rc = servd_fail(SERVD_EINVAL, "%s: layer %d's %s has a lora_%c but no lora_%c", file, layer, module_names[m],
                      pairs[p].a < 0 ? 'B' : 'A', pairs[p].a < 0 ? 'A' : 'B');
      goto out;
    }
    const src_tensor *A = &ts[pairs[p].a], *B = &ts[pairs[p].b];
    char why[200];
    snprintf(why, sizeof why, "rank %lld of the adapter by the %lld input features of %s's %s", (long long)r,
             (long long)base->in[m], base->name, module_names[m]);
    if ((rc = check_tensor(file, A, r, base->in[m], why))) goto out;
    snprintf(why, sizeof why, "the %lld output features of %s's %s by rank %lld", (long long)base->out[m], base->name,
             module_names[m], (long long)r);
    if ((rc = check_tensor(file, B, base->out[m], r, why))) goto out;
    int heads = !permute || !base->permute_qk ? 0
                : m == MPK_LORA_Q             ? base->q_heads
                : m == MPK_LORA_K             ? base->kv_heads
                                              : 0;
    if (!(l->ab[p] = build_ab(A, B, r, base->in[m], base->out[m], heads))) {
      rc = servd_fail(SERVD_ENOMEM, "%s: layer %d's %s", file, layer, module_names[m]);
      goto out;
    }
    l->n_adapted++;
    l->bytes += servd_tensor_nbytes(l->ab[p]);
  }
  if (!l->n_adapted) rc = servd_fail(SERVD_EINVAL, "%s holds no LoRA weights", file);
out:
  free(pairs);
  return rc;
}

static void content_hash(const void *a, size_t na, const void *b, size_t nb, char out[72]) {
  char hex[65];
  uint8_t *both = malloc(na + nb ? na + nb : 1);
  out[0] = 0;
  if (!both) return;
  if (na) memcpy(both, a, na);
  if (nb) memcpy(both + na, b, nb);
  mpk__sha256_hex(both, na + nb, hex);
  free(both);
  snprintf(out, 72, "sha256:%s", hex);
}

static int check_base(const char *what, const mpk_lora_base *base) {
  if (base->n_layers < 1 || base->n_layers > (1 << 16))
    return servd_fail(SERVD_EINVAL, "%s: the base has %d layers", what, base->n_layers);
  return 0;
}

int mpk_lora_parse(const char *what, const char *config, size_t config_len, const void *st, size_t st_len,
                   const mpk_lora_base *base, mpk_lora **out) {
  *out = NULL;
  mpk_st_header *h = NULL;
  src_tensor *ts = NULL;
  int rc;
  mpk_lora *l = calloc(1, sizeof *l);
  if (!l) return servd_fail(SERVD_ENOMEM, "%s: adapter", what);
  if ((rc = check_base(what, base)) || (rc = read_config(what, config, config_len, l))) goto fail;
  char st_what[600];
  snprintf(st_what, sizeof st_what, "%s: adapter_model.safetensors", what);
  if ((rc = mpk_st_parse(st_what, st, st_len, &h))) goto fail;
  if (!(ts = calloc(h->n ? h->n : 1, sizeof *ts))) {
    rc = servd_fail(SERVD_ENOMEM, "%s: tensors", what);
    goto fail;
  }
  for (size_t i = 0; i < h->n; i++) {
    const mpk_st_tensor *t = &h->tensors[i];
    ts[i] = (src_tensor){.name = t->name, .ndim = t->ndim, .data = (const uint8_t *)st + h->data_start + t->begin};
    snprintf(ts[i].dtype, sizeof ts[i].dtype, "%s", t->dtype);
    if (mpk_st_dtype_to_servd(t->dtype, &ts[i].dt)) ts[i].dt = SERVD_DTYPE_COUNT;
    for (int d = 0; d < 2 && d < t->ndim; d++) ts[i].shape[d] = t->shape[d];
  }
  if ((rc = assemble(st_what, ts, h->n, parse_peft_name, true,
                     "base_model.model.model.layers.N.{self_attn.{q,k,v,o}_proj|mlp.{gate,up,down}_proj}.lora_{A,B}"
                     ".weight",
                     base, l)))
    goto fail;
  content_hash(config, config_len, st, st_len, l->content_hash);
  free(ts);
  mpk_st_free(h);
  *out = l;
  return 0;
fail:
  free(ts);
  mpk_st_free(h);
  mpk_lora_free(l);
  return rc;
}

int mpk_lora_parse_gguf(const char *what, const void *buf, size_t len, const mpk_lora_base *base, mpk_lora **out) {
  *out = NULL;
  mpk_gguf *g = NULL;
  src_tensor *ts = NULL;
  int rc;
  mpk_lora *l = calloc(1, sizeof *l);
  if (!l) return servd_fail(SERVD_ENOMEM, "%s: adapter", what);
  if ((rc = check_base(what, base)) || (rc = mpk_gguf_parse(what, buf, len, &g))) goto fail;
  const char *s;
  size_t sl;
  if (mpk_gguf_get_str(g, "general.type", &s, &sl) || sl != 7 || memcmp(s, "adapter", 7) ||
      mpk_gguf_get_str(g, "adapter.type", &s, &sl) || sl != 4 || memcmp(s, "lora", 4)) {
    rc = servd_fail(SERVD_EFORMAT, "%s: not a llama.cpp LoRA adapter (general.type \"adapter\", adapter.type \"lora\")",
                    what);
    goto fail;
  }
  double alpha = 0;
  if (mpk_gguf_get_f64(g, "adapter.lora.alpha", &alpha) || !isfinite(alpha)) {
    rc = servd_fail(SERVD_EFORMAT, "%s: adapter.lora.alpha: expected a number", what);
    goto fail;
  }
  if (!(ts = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *ts))) {
    rc = servd_fail(SERVD_ENOMEM, "%s: tensors", what);
    goto fail;
  }
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const mpk_gguf_tensor *t = &g->tensors[i];
    ts[i] = (src_tensor){.name = t->name, .ndim = t->ndim, .data = (const uint8_t *)buf + t->offset};
    const char *tn = mpk_ggml_type_name(t->type);
    snprintf(ts[i].dtype, sizeof ts[i].dtype, "%s", tn ? tn : "?");
    ts[i].dt = t->type == MPK_GGML_F32    ? SERVD_F32
               : t->type == MPK_GGML_F16  ? SERVD_F16
               : t->type == MPK_GGML_BF16 ? SERVD_BF16
                                          : SERVD_DTYPE_COUNT;
    if (t->ndim == 2) ts[i].shape[0] = t->ne[1], ts[i].shape[1] = t->ne[0]; /* ne is innermost first */
    /* the rank: lora_a's rows (all pairs must agree: assemble checks every shape against it) */
    if (!l->rank && t->ndim == 2 && strstr(t->name, ".lora_a")) l->rank = (int)t->ne[1];
  }
  if (l->rank < 1 || l->rank > MPK_LORA_MAX_RANK) {
    rc = servd_fail(SERVD_EINVAL, "%s: rank %d (from the first lora_a): expected 1..%d (servd's rank limit)", what,
                    l->rank, MPK_LORA_MAX_RANK);
    goto fail;
  }
  l->alpha = alpha;
  l->scale = (float)(alpha / l->rank); /* llama.cpp: alpha / rank, times the user's scale (1 here) */
  /* llama.cpp's converter permutes lora_B's Q/K rows as it permutes its base's: taken as they are */
  if ((rc = assemble(what, ts, (size_t)g->n_tensors, parse_gguf_name, false,
                     "blk.N.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.weight.lora_{a,b}", base, l)))
    goto fail;
  content_hash(buf, len, NULL, 0, l->content_hash);
  free(ts);
  mpk_gguf_free(g);
  *out = l;
  return 0;
fail:
  free(ts);
  mpk_gguf_free(g);
  mpk_lora_free(l);
  return rc;
}

/* An adapter package (mpk_lora_pack): refused when made for another base, else its two files. */
static int load_package(const char *path, const mpk_lora_base *base, mpk_lora **out) {
  mpk_package *p = NULL;
  int rc = mpk_open(path, &p);
  if (rc) return rc;
  const void *config = NULL, *st = NULL;
  size_t clen = 0, slen = 0;
  json_t *b = json_object_get(json_object_get(mpk_manifest(p), "lora"), "base");
  const char *bname = json_string_value(json_object_get(b, "name")),
             *bhash = json_string_value(json_object_get(b, "hash"));
  if (strcmp(mpk_kind(p), "lora-adapter")) {
    rc = servd_fail(SERVD_EINVAL,
                    "LoRA adapter %s: a package of kind \"%s\", not an adapter package (modelpkg pack --lora)", path,
                    mpk_kind(p));
  } else if (!bname || !bhash) {
    rc = servd_fail(SERVD_EFORMAT, "LoRA adapter %s: manifest.json: lora.base.name and lora.base.hash are required",
                    path);
  } else if (base->hash[0] && strcmp(bhash, base->hash)) {
    rc = servd_fail(SERVD_EINVAL,
                    "LoRA adapter %s: made for the base %s (weights %s), not for %s (weights %s): pack it again "
                    "against this base",
                    path, bname, bhash, base->name, base->hash);
  } else if (!(rc = mpk_file(p, "adapter_config.json", &config, &clen)) &&
             !(rc = mpk_file(p, "adapter_model.safetensors", &st, &slen))) {
    rc = mpk_lora_parse(path, config, clen, st, slen, base, out);
    if (rc == 0) snprintf((*out)->base_hash, sizeof(*out)->base_hash, "%s", bhash);
  }
  mpk_close(p); /* the ab tensors are copies: nothing of the package stays in use */
  return rc;
}

int mpk_lora_pack(const char *adapter_dir, mpk_package *base_pkg, const char *name, const char *out) {
  mpk_lora_base base;
  mpk_lora *l = NULL;
  mpk_writer *w = NULL;
  char *config = NULL;
  mpk_map st = {0};
  size_t clen = 0;
  char cp[4096], wp[4096];
  snprintf(cp, sizeof cp, "%s/adapter_config.json", adapter_dir);
  snprintf(wp, sizeof wp, "%s/adapter_model.safetensors", adapter_dir);
  int rc = mpk_lora_base_of(base_pkg, &base);
  if (!rc) rc = mpk_lora_load(adapter_dir, &base, &l); /* every check of a load, against this base */
  if (!rc && !base.hash[0])
    rc = servd_fail(SERVD_EFORMAT, "%s: the base package has no weight hashes to name it by", mpk_path(base_pkg));
  if (!rc) rc = mpk__read_file(cp, 1 << 20, &config, &clen);
  if (!rc) rc = mpk__map_file(wp, &st);
  json_error_t je;
  json_t *cj = rc ? NULL : json_loadb(config, clen, 0, &je);
  if (!rc && !cj) rc = servd_fail(SERVD_EFORMAT, "%s: not JSON: %s", cp, je.text);
  if (!rc) rc = mpk_check_name(out, "--name", name);
  if (!rc) rc = mpk_writer_create(out, &w);
  if (!rc) {
    json_t *lj = json_pack("{s:{s:s, s:s}, s:i, s:f, s:b}", "base", "name", base.name, "hash", base.hash, "rank",
                           l->rank, "alpha", l->alpha, "use_rslora", l->rslora);
    rc = mpk_writer_set(w, "name", json_string(name));
    if (!rc) rc = mpk_writer_set(w, "model_version", json_string("1"));
    if (!rc) rc = mpk_writer_set(w, "kind", json_string("lora-adapter"));
    if (!rc) rc = mpk_writer_set(w, "entry_point", json_string("peft:lora")); /* the format, not code */
    if (!rc) rc = mpk_writer_set(w, "config", json_incref(cj));
    if (!rc) rc = mpk_writer_set(w, "lora", lj);
    if (!rc) rc = mpk_writer_add_file(w, "adapter_config.json", config, clen);
    if (!rc) rc = mpk_writer_add_file(w, "adapter_model.safetensors", st.data, st.len);
    if (!rc) rc = mpk_writer_finish(w);
  }
  json_decref(cj);
  mpk_writer_destroy(w);
  mpk__unmap(&st);
  free(config);
  mpk_lora_free(l);
  return rc;
}

int mpk_lora_load(const char *path, const mpk_lora_base *base, mpk_lora **out) {
  *out = NULL;
  struct stat sb;
  if (stat(path, &sb) != 0) return servd_fail(SERVD_EIO, "LoRA adapter %s: %s", path, strerror(errno));
  if (!S_ISDIR(sb.st_mode)) { /* a llama.cpp GGUF LoRA file or an adapter package */
    mpk_map m = {0};
    int rc = mpk__map_file(path, &m);
    bool gguf = rc == 0 && m.len >= 4 && !memcmp(m.data, "GGUF", 4);
    if (rc == 0) rc = gguf ? mpk_lora_parse_gguf(path, m.data, m.len, base, out) : load_package(path, base, out);
    mpk__unmap(&m);
    return rc;
  }
  char cp[4096], wp[4096];
  snprintf(cp, sizeof cp, "%s/adapter_config.json", path);
  snprintf(wp, sizeof wp, "%s/adapter_model.safetensors", path);
  char *config = NULL;
  size_t clen = 0;
  mpk_map w = {0};
  int rc = mpk__read_file(cp, 1 << 20, &config, &clen);
  if (rc == 0) rc = mpk__map_file(wp, &w);
  if (rc == 0) rc = mpk_lora_parse(path, config, clen, w.data, w.len, base, out);
  free(config);
  mpk__unmap(&w);
  return rc;
}
