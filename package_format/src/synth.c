/* Synthetic Llama models with seeded random weights, for tests and benchmarks that must not depend
 * on a download: a Hugging Face folder (config.json, model.safetensors, a small byte-level BPE
 * tokenizer.json, tokenizer_config.json with a ChatML template, generation_config.json) and, from
 * it, a package. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import-impl.h"
#include "mpk-impl.h"

typedef struct synth_cfg {
  const char *name;
  int vocab, hidden, inter, layers, heads, kv_heads, max_pos;
  bool tied;
} synth_cfg;

/* dir/name into out; SERVD_ERANGE when it does not fit. */
static int join_path(char *out, size_t cap, const char *dir, const char *name) {
  int n = snprintf(out, cap, "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= cap) return servd_fail(SERVD_ERANGE, "%s/%s: path too long", dir, name);
  return 0;
}

static const synth_cfg configs[] = {
    {"tiny", 320, 64, 128, 2, 4, 2, 512, false},
    {"200mb", 32000, 768, 2048, 12, 12, 4, 2048, true},      /* ~100M parameters: 200 MB in bf16 */
    {"small-1b", 32000, 2048, 5632, 22, 32, 4, 2048, false}, /* TinyLlama-1.1B shape */
    {"tiny-hd32", 320, 128, 256, 2, 4, 2, 512, false},       /* tiny with head_dim 32: quantized KV caches */
};

const char *mpk_synth_configs(void) { return "tiny, 200mb, small-1b, tiny-hd32"; }

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* GPT-2's byte -> printable code point map, as UTF-8. */
static void byte_char(int b, char out[5]) {
  int cp;
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) cp = b;
  else {
    int n = 0;
    for (int x = 0; x < b; x++)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
    cp = 256 + n;
  }
  if (cp < 0x80) {
    out[0] = (char)cp;
    out[1] = 0;
  } else {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    out[2] = 0;
  }
}

static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
static const char chatml[] = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                             "message['content'] + '<|im_end|>' + '\\n' }}"
                             "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* ids 0..2 special, 3..258 the bytes, then two-byte merges of letters and space-letters. */
static int write_tokenizer(const char *dir, int vocab) {
  json_t *v = json_object(), *merges = json_array(), *added = json_array();
  for (int i = 0; i < 3; i++) {
    json_object_set_new(v, specials[i], json_integer(i));
    json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", i, "content", specials[i],
                                           "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
  }
  char bc[256][5];
  for (int b = 0; b < 256; b++) {
    byte_char(b, bc[b]);
    json_object_set_new(v, bc[b], json_integer(3 + b));
  }
  static const char order[] = " etaoinshrdlucmfwypvbgkjqxz";
  int id = 259;
  for (size_t i = 0; order[i] && id < vocab; i++)
    for (size_t j = 1; order[j] && id < vocab; j++) {
      char tok[16];
      snprintf(tok, sizeof tok, "%s%s", bc[(unsigned char)order[i]], bc[(unsigned char)order[j]]);
      json_object_set_new(v, tok, json_integer(id++));
      char m[16];
      snprintf(m, sizeof m, "%s %s", bc[(unsigned char)order[i]], bc[(unsigned char)order[j]]);
      json_array_append_new(merges, json_string(m));
    }
  /* Larger vocabularies: filler tokens that no merge produces (ids stay dense). */
  for (; id < vocab; id++) {
    char tok[32];
    snprintf(tok, sizeof tok, "<|reserved_%d|>", id);
    json_object_set_new(v, tok, json_integer(id));
  }
  json_t *root = json_pack(
      "{s:s,s:n,s:n,s:o,s:n,s:{s:s,s:b,s:b,s:b},s:n,s:{s:s,s:b,s:b,s:b},s:{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:b,s:o,s:o}}",
      "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer", "type",
      "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1, "post_processor", "decoder", "type",
      "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1, "model", "type", "BPE", "dropout",
      "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
      "ignore_merges", 0, "vocab", v, "merges", merges);
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  int rc = json_dump_file(root, path, JSON_COMPACT) ? servd_fail(SERVD_EIO, "%s: write failed", path) : 0;
  json_decref(root);
  if (rc) return rc;
  json_t *tc = json_pack("{s:s,s:s,s:s,s:b,s:s}", "bos_token", "<|im_start|>", "eos_token", "<|im_end|>", "pad_token",
                         "<|endoftext|>", "add_bos_token", 0, "chat_template", chatml);
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  rc = json_dump_file(tc, path, JSON_INDENT(2)) ? servd_fail(SERVD_EIO, "%s: write failed", path) : 0;
  json_decref(tc);
  return rc;
}

typedef struct stensor {
  char name[96];
  int ndim;
  int64_t shape[2];
  float scale; /* uniform in [-scale, scale]; 0: all ones (norms) */
  bool f32;    /* norms stay f32 */
} stensor;

static int add_t(stensor *ts, int *n, const char *name, int ndim, int64_t a, int64_t b, float scale, bool f32) {
  stensor *t = &ts[(*n)++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->shape[0] = a;
  t->shape[1] = b;
  t->scale = scale;
  t->f32 = f32;
  return 0;
}

static int cmp_stensor(const void *a, const void *b) {
  return strcmp(((const stensor *)a)->name, ((const stensor *)b)->name);
}

static const char *st_name(servd_dtype d) { return d == SERVD_F32 ? "F32" : d == SERVD_F16 ? "F16" : "BF16"; }

/* Writes model-XXXXX-of-YYYYY.safetensors shards (one file when shards == 1: model.safetensors). */
static int write_weights(const char *dir, const synth_cfg *c, uint64_t seed, servd_dtype dt, int shards,
                         mpk_progress *pr) {
  int maxn = 3 + 9 * c->layers;
  stensor *ts = calloc((size_t)maxn, sizeof *ts);
  if (!ts) return servd_fail(SERVD_ENOMEM, "synth: out of memory");
  int n = 0, hd = c->hidden / c->heads, rc = 0;
  float emb = 0.02f * 1.7320508f; /* uniform with std 0.02 */
  add_t(ts, &n, "model.embed_tokens.weight", 2, c->vocab, c->hidden, emb, false);
  add_t(ts, &n, "model.norm.weight", 1, c->hidden, 1, 0, true);
  if (!c->tied) add_t(ts, &n, "lm_head.weight", 2, c->vocab, c->hidden, 1.0f / sqrtf((float)c->hidden), false);
  for (int l = 0; l < c->layers; l++) {
    char nm[96];
    float sh = 1.0f / sqrtf((float)c->hidden), si = 1.0f / sqrtf((float)c->inter);
#define L(suffix, nd, a, b, s, f) \
  (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), add_t(ts, &n, nm, nd, a, b, s, f))
    L("input_layernorm.weight", 1, c->hidden, 1, 0, true);
    L("post_attention_layernorm.weight", 1, c->hidden, 1, 0, true);
    L("self_attn.q_proj.weight", 2, c->heads * hd, c->hidden, sh, false);
    L("self_attn.k_proj.weight", 2, c->kv_heads * hd, c->hidden, sh, false);
    L("self_attn.v_proj.weight", 2, c->kv_heads * hd, c->hidden, sh, false);
    L("self_attn.o_proj.weight", 2, c->hidden, c->heads * hd, sh, false);
    L("mlp.gate_proj.weight", 2, c->inter, c->hidden, sh, false);
    L("mlp.up_proj.weight", 2, c->inter, c->hidden, sh, false);
    L("mlp.down_proj.weight", 2, c->hidden, c->inter, si, false);
#undef L
  }
  qsort(ts, (size_t)n, sizeof *ts, cmp_stensor);
  for (int i = 0; i < n; i++) {
    servd_dtype d = ts[i].f32 ? SERVD_F32 : dt;
    pr->total +=
        (uint64_t)ts[i].shape[0] * (ts[i].ndim == 2 ? (uint64_t)ts[i].shape[1] : 1) * servd_dtype_block_bytes(d);
  }
  json_t *wm = json_object();
  float *row = malloc((size_t)(c->vocab > c->inter ? c->vocab : c->inter) * sizeof(float) * 4);
  uint8_t *obuf = malloc((size_t)(c->vocab > c->inter ? c->vocab : c->inter) * 16);
  FILE *f = NULL;
  if (!row || !obuf || !wm) {
    rc = servd_fail(SERVD_ENOMEM, "synth: out of memory");
    goto fail;
  }
  uint64_t rng = seed ^ 0x5eedu;
  for (int s = 0; s < shards; s++) {
    char file[64], path[4096];
    if (shards == 1) snprintf(file, sizeof file, "model.safetensors");
    else snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, shards);
    json_t *hdr = json_object();
    json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t off = 0;
    for (int i = s; i < n; i += shards) {
      servd_dtype d = ts[i].f32 ? SERVD_F32 : dt;
      uint64_t nb =
          (uint64_t)ts[i].shape[0] * (ts[i].ndim == 2 ? (uint64_t)ts[i].shape[1] : 1) * servd_dtype_block_bytes(d);
      json_t *sh = ts[i].ndim == 2 ? json_pack("[I,I]", (json_int_t)ts[i].shape[0], (json_int_t)ts[i].shape[1])
                                   : json_pack("[I]", (json_int_t)ts[i].shape[0]);
      json_object_set_new(hdr, ts[i].name,
                          json_pack("{s:s,s:o,s:[I,I]}", "dtype", st_name(d), "shape", sh, "data_offsets",
                                    (json_int_t)off, (json_int_t)(off + nb)));
      json_object_set_new(wm, ts[i].name, json_string(file));
      off += nb;
    }
    char *js = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    size_t jl = strlen(js), padded = (jl + 7) / 8 * 8;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    f = fopen(path, "wb");
    if (!f) {
      free(js);
      rc = servd_fail(SERVD_EIO, "%s: cannot create: %s", path, strerror(errno));
      goto fail;
    }
    setvbuf(f, NULL, _IOFBF, 1 << 22);
    uint8_t lenb[8];
    wr64(lenb, padded);
    fwrite(lenb, 1, 8, f);
    fwrite(js, 1, jl, f);
    for (size_t k = jl; k < padded; k++) fputc(' ', f);
    free(js);
    for (int i = s; i < n; i += shards) {
      const stensor *t = &ts[i];
      servd_dtype d = t->f32 ? SERVD_F32 : dt;
      int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
      for (int64_t r = 0; r < rows; r++) {
        for (int64_t k = 0; k < cols; k++) {
          if (t->scale == 0) row[k] = 1.0f;
          else row[k] = t->scale * ((float)(splitmix(&rng) >> 40) * (2.0f / 16777216.0f) - 1.0f);
        }
        servd_row_from_f32(d, row, obuf, cols);
        size_t nb = (size_t)cols * servd_dtype_block_bytes(d);
        fwrite(obuf, 1, nb, f);
        mpk__progress_add(pr, nb);
      }
    }
    if (ferror(f) | fclose(f)) {
      f = NULL;
      rc = servd_fail(SERVD_EIO, "%s: write failed", path);
      goto fail;
    }
    f = NULL;
  }
  if (shards > 1) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_t *idx = json_pack("{s:{},s:O}", "metadata", "weight_map", wm);
    if (json_dump_file(idx, path, JSON_INDENT(2))) rc = servd_fail(SERVD_EIO, "%s: write failed", path);
    json_decref(idx);
  }
fail:
  if (f) fclose(f);
  json_decref(wm);
  free(row);
  free(obuf);
  free(ts);
  return rc;
}

static int rm_tree_files(const char *dir) {
  static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                      "generation_config.json"};
  char path[4096];
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    unlink(path);
  }
  return rmdir(dir);
}

int mpk_synth(const char *config_name, uint64_t seed, servd_dtype dtype, const char *hf_dir, const char *pkg_path,
              const mpk_import_options *opt) {
  const synth_cfg *c = NULL;
  for (size_t i = 0; i < sizeof configs / sizeof *configs; i++)
    if (!strcmp(configs[i].name, config_name)) c = &configs[i];
  if (!c)
    return servd_fail(SERVD_EINVAL, "synth: unknown config \"%s\", expected one of: %s", config_name,
                      mpk_synth_configs());
  if (dtype != SERVD_F32 && dtype != SERVD_F16 && dtype != SERVD_BF16)
    return servd_fail(SERVD_EINVAL, "synth: dtype %s, expected f32, f16 or bf16", servd_dtype_name(dtype));
  mpk_import_options defaults;
  if (!opt) {
    mpk_import_options_init(&defaults);
    opt = &defaults;
  }
  int shards = 1;
  const char *sh = getenv("MPK_SYNTH_SHARDS"); /* tests of the sharded layout */
  if (sh && atoi(sh) > 1 && atoi(sh) < 100) shards = atoi(sh);
  char tmpdir[4096] = "";
  const char *dir = hf_dir;
  int rc = 0;
  if (!dir) {
    if (!pkg_path) return servd_fail(SERVD_EINVAL, "synth: nothing to write (give a folder or a package path)");
    snprintf(tmpdir, sizeof tmpdir, "%s.synth.XXXXXX", pkg_path);
    if (!mkdtemp(tmpdir))
      return servd_fail(SERVD_EIO, "%s: cannot create a temporary folder: %s", tmpdir, strerror(errno));
    dir = tmpdir;
  } else if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    return servd_fail(SERVD_EIO, "%s: cannot create: %s", dir, strerror(errno));
  }
  char path[4096];
  int hd = c->hidden / c->heads;
  json_t *cfg = json_pack(
      "{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:n,s:b,s:i,s:i,s:s,s:s,s:s}", "architectures",
      "LlamaForCausalLM", "model_type", "llama", "vocab_size", c->vocab, "hidden_size", c->hidden, "intermediate_size",
      c->inter, "num_hidden_layers", c->layers, "num_attention_heads", c->heads, "num_key_value_heads", c->kv_heads,
      "head_dim", hd, "max_position_embeddings", c->max_pos, "rms_norm_eps", 1e-5, "rope_theta", 10000.0,
      "rope_scaling", "tie_word_embeddings", c->tied, "bos_token_id", 1, "eos_token_id", 2, "torch_dtype",
      dtype == SERVD_F32   ? "float32"
      : dtype == SERVD_F16 ? "float16"
                           : "bfloat16",
      "hidden_act", "silu", "servd_synth", c->name);
  json_object_set_new(cfg, "servd_synth_seed", json_integer((json_int_t)seed));
  if ((rc = join_path(path, sizeof path, dir, "config.json"))) {
    json_decref(cfg);
    goto fail;
  }
  if (json_dump_file(cfg, path, JSON_INDENT(2))) rc = servd_fail(SERVD_EIO, "%s: write failed", path);
  json_decref(cfg);
  if (rc) goto fail;
  json_t *gen = json_pack("{s:i,s:i,s:b}", "bos_token_id", 1, "eos_token_id", 2, "do_sample", 0);
  if ((rc = join_path(path, sizeof path, dir, "generation_config.json"))) {
    json_decref(gen);
    goto fail;
  }
  if (json_dump_file(gen, path, JSON_INDENT(2))) rc = servd_fail(SERVD_EIO, "%s: write failed", path);
  json_decref(gen);
  if (rc || (rc = write_tokenizer(dir, c->vocab))) goto fail;
  mpk_progress pr = {.o = pkg_path ? NULL : opt}; /* one bar: the pack's when there is one */
  if ((rc = write_weights(dir, c, seed, dtype, shards, &pr))) goto fail;
  if (pkg_path) {
    mpk_import_options o = *opt;
    char nm[64];
    snprintf(nm, sizeof nm, "synth-%s", c->name);
    if (!o.name) o.name = nm;
    rc = mpk_pack_hf(dir, pkg_path, &o);
  }
fail:
  if (tmpdir[0]) rm_tree_files(tmpdir);
  return rc;
}
