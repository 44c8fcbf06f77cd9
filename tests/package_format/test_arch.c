/* The architecture registry (mpk_check_model: config and shapes against the family), and the
 * hardening of the format: entry modes (symlinks, devices, FIFOs, setuid, folders with content),
 * the name charset, and mpk_unpack (regular files only, all or nothing). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "arch.h"
#include "mpk-impl.h"
#include "mpk/import.h"
#include "mpk/package.h"
#include "mpk/writer.h"

#define TEST_DIR_TEMPLATE "/tmp/mpk-arch-XXXXXX"
#include "test-util.h"

static const char *tiny_pkg(void) {
  static char path[512];
  snprintf(path, sizeof path, "%s/tiny.mpk", dir);
  if (access(path, F_OK) == 0) return path;
  mpk_import_options o;
  mpk_import_options_init(&o);
  o.code_dir = MPK_TEST_CODE_DIR;
  assert_int_equal(mpk_synth("tiny", 1, SERVD_F32, NULL, path, &o), 0);
  return path;
}

static unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(*len);
  assert_int_equal(fread(b, 1, *len, f), *len);
  fclose(f);
  return b;
}

static int open_bytes(const unsigned char *b, size_t len, mpk_package **out) {
  char path[512];
  snprintf(path, sizeof path, "%s/mut.mpk", dir);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, len, f), len);
  fclose(f);
  mpk_package *p = NULL;
  int rc = mpk_open(path, &p);
  if (out) *out = p;
  else mpk_close(p);
  return rc;
}

/* The central directory header of entry `name`. */
static unsigned char *central(unsigned char *b, size_t len, const char *name) {
  size_t nl = strlen(name);
  for (unsigned char *c = memmem(b, len, "PK\x01\x02", 4); c;
       c = memmem(c + 4, len - (size_t)(c + 4 - b), "PK\x01\x02", 4))
    if (rd16(c + 28) == nl && !memcmp(c + 46, name, nl)) return c;
  fail_msg("no central header for %s", name);
  return NULL;
}

static void model_checks(void **state) {
  (void)state;
  mpk_package *p;
  assert_int_equal(mpk_open(tiny_pkg(), &p), 0);
  assert_string_equal(json_string_value(json_object_get(mpk_manifest(p), "architecture")), "llama");
  assert_int_equal(mpk_check_model(p), 0);
  /* the config says more layers than the weights have: the first missing tensor is named */
  json_object_set_new(mpk_config(p), "num_hidden_layers", json_integer(3));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "model.layers.2.input_layernorm.weight"));
  /* fewer layers than the weights: a layer would be ignored */
  json_object_set_new(mpk_config(p), "num_hidden_layers", json_integer(1));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "model.layers.1"));
  json_object_set_new(mpk_config(p), "num_hidden_layers", json_integer(2));
  /* a hidden size the weights contradict */
  json_object_set_new(mpk_config(p), "intermediate_size", json_integer(96));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "mlp.gate_proj.weight\": shape (128, 64), expected (96, 64)"));
  json_object_set_new(mpk_config(p), "intermediate_size", json_integer(128));
  json_object_set_new(mpk_config(p), "num_key_value_heads", json_integer(3));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "num_key_value_heads"));
  json_object_set_new(mpk_config(p), "num_key_value_heads", json_integer(2));
  json_object_set_new(mpk_config(p), "rms_norm_eps", json_real(-1));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "rms_norm_eps"));
  json_object_set_new(mpk_config(p), "rms_norm_eps", json_real(1e-5));
  json_object_set_new(mpk_config(p), "rope_scaling", json_pack("{s:s,s:f}", "type", "linear", "factor", 2.0));
  assert_int_equal(mpk_check_model(p), SERVD_EUNSUPPORTED);
  json_object_set_new(mpk_config(p), "rope_scaling", json_null());
  assert_int_equal(mpk_check_model(p), 0);
  /* a family nobody declared: the message names the known ones */
  json_object_set_new(mpk_manifest(p), "architecture", json_string("gpt9"));
  assert_int_equal(mpk_check_model(p), SERVD_EUNSUPPORTED);
  assert_non_null(strstr(servd_last_error(), "known architectures are: llama"));
  /* no architecture field (older packages): config.model_type decides, mistral included */
  json_object_del(mpk_manifest(p), "architecture");
  json_object_set_new(mpk_config(p), "model_type", json_string("mistral"));
  assert_int_equal(mpk_check_model(p), 0);
  json_object_set_new(mpk_config(p), "model_type", json_string("qwen\x1b[31m"));
  assert_int_equal(mpk_check_model(p), SERVD_EUNSUPPORTED);
  assert_null(strchr(servd_last_error(), 0x1b));
  assert_non_null(strstr(servd_last_error(), "qwen\\x1b[31m"));
  mpk_close(p);
}

/* The rows that share Llama's decoder: each family's own tensors and keys, on the tiny Llama. */
static void family_checks(void **state) {
  (void)state;
  mpk_package *p;
  assert_int_equal(mpk_open(tiny_pkg(), &p), 0);
  json_t *man = mpk_manifest(p), *cfg = mpk_config(p);
  json_object_set_new(man, "architecture", json_string("qwen2"));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(
      strstr(servd_last_error(), "\"model.layers.0.self_attn.q_proj.bias\": missing, expected shape (64,)"));
  json_object_set_new(man, "architecture", json_string("qwen3"));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(
      strstr(servd_last_error(), "\"model.layers.0.self_attn.q_norm.weight\": missing, expected shape (16,)"));
  /* YaRN: each key checked by name; a valid one passes on to the tensors */
  json_object_set_new(man, "architecture", json_string("qwen2"));
  json_object_set_new(cfg, "rope_scaling", json_pack("{s:s,s:f}", "type", "yarn", "factor", 0.5));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "\"rope_scaling.factor\": expected a finite number >= 1"));
  json_object_set_new(cfg, "rope_scaling",
                      json_pack("{s:s,s:f,s:f}", "type", "yarn", "factor", 4.0, "beta_fast", -1.0));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "\"rope_scaling.beta_fast\""));
  json_object_set_new(
      cfg, "rope_scaling",
      json_pack("{s:s,s:f,s:s}", "type", "yarn", "factor", 4.0, "original_max_position_embeddings", "x"));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "\"original_max_position_embeddings\""));
  json_object_set_new(
      cfg, "rope_scaling",
      json_pack("{s:s,s:f,s:i}", "type", "yarn", "factor", 4.0, "original_max_position_embeddings", 64));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT); /* past the config: the missing bias */
  assert_non_null(strstr(servd_last_error(), "q_proj.bias"));
  json_object_set_new(cfg, "rope_scaling", json_pack("{s:s,s:f}", "type", "dynamic", "factor", 2.0));
  assert_int_equal(mpk_check_model(p), SERVD_EUNSUPPORTED);
  assert_non_null(strstr(servd_last_error(), "expected null or \"llama3\" with a positive factor, or \"yarn\""));
  json_object_set_new(cfg, "rope_scaling", json_null());
  /* a window smaller than the context: refused at load (the attention has no window) */
  json_object_set_new(man, "architecture", json_string("mistral"));
  assert_int_equal(mpk_check_model(p), 0);
  json_object_set_new(cfg, "max_position_embeddings", json_integer(256));
  json_object_set_new(cfg, "sliding_window", json_integer(64));
  assert_int_equal(mpk_check_model(p), SERVD_EUNSUPPORTED);
  assert_non_null(strstr(servd_last_error(), "sliding_window 64 < max_position_embeddings 256"));
  /* ... which packing turns into a context capped at the window */
  json_t *c = json_deep_copy(cfg);
  const mpk_arch *a = mpk__arch_by_name("mistral");
  assert_int_equal(mpk__arch_config(a, "t", c), 0);
  assert_int_equal(json_integer_value(json_object_get(c, "max_position_embeddings")), 64);
  json_decref(c);
  json_object_set_new(cfg, "sliding_window", json_integer(256));
  assert_int_equal(mpk_check_model(p), 0);
  /* Qwen's window applies only with use_sliding_window */
  json_object_set_new(cfg, "sliding_window", json_integer(64));
  json_object_set_new(man, "architecture", json_string("qwen2"));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT); /* past the config: the missing bias */
  json_object_set_new(cfg, "use_sliding_window", json_true());
  assert_int_equal(mpk_check_model(p), SERVD_EUNSUPPORTED);
  assert_non_null(strstr(servd_last_error(), "sliding_window 64"));
  /* Gemma 3: its four norms per block; soft-capping refused; GGUF and multimodal names mapped */
  json_object_set_new(man, "architecture", json_string("gemma3"));
  json_object_del(cfg, "use_sliding_window");
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "\"model.layers.0.pre_feedforward_layernorm.weight\": missing"));
  json_object_set_new(cfg, "final_logit_softcapping", json_real(30.0));
  assert_int_equal(mpk_check_model(p), SERVD_EUNSUPPORTED);
  assert_non_null(strstr(servd_last_error(), "\"final_logit_softcapping\": expected null"));
  json_object_del(cfg, "final_logit_softcapping");
  const mpk_arch *g3 = mpk__arch_by_name("gemma3");
  char cn[128];
  mpk__arch_map_name(&g3->gguf_names, "blk.2.post_ffw_norm.weight", cn, sizeof cn);
  assert_string_equal(cn, "model.layers.2.post_feedforward_layernorm.weight");
  mpk__arch_map_name(&g3->gguf_names, "blk.0.ffn_norm.weight", cn, sizeof cn);
  assert_string_equal(cn, "model.layers.0.pre_feedforward_layernorm.weight");
  mpk__arch_map_name(&g3->hf_names, "language_model.model.layers.11.self_attn.q_norm.weight", cn, sizeof cn);
  assert_string_equal(cn, "model.layers.11.self_attn.q_norm.weight");
  mpk__arch_map_name(&g3->hf_names, "language_model.model.embed_tokens.weight", cn, sizeof cn);
  assert_string_equal(cn, "model.embed_tokens.weight");
  /* Phi-3: fused Q/K/V and gate/up (GGUF ffn_up is the fused gate_up); LongRoPE factors of head_dim/2 */
  json_object_set_new(man, "architecture", json_string("phi3"));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(
      strstr(servd_last_error(), "\"model.layers.0.self_attn.qkv_proj.weight\": missing, expected shape (128, 64)"));
  json_object_set_new(cfg, "rope_scaling",
                      json_pack("{s:s,s:[f],s:[f]}", "type", "longrope", "short_factor", 1.0, "long_factor", 2.0));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(
      strstr(servd_last_error(), "\"rope_scaling.short_factor\": expected a list of head_dim/2 = 8 numbers"));
  json_object_set_new(cfg, "rope_scaling", json_pack("{s:s}", "type", "su"));
  assert_int_equal(mpk_check_model(p), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "\"rope_scaling.short_factor\""));
  json_object_set_new(cfg, "rope_scaling", json_pack("{s:s,s:f}", "type", "dynamic", "factor", 2.0));
  assert_int_equal(mpk_check_model(p), SERVD_EUNSUPPORTED);
  assert_non_null(strstr(servd_last_error(), "rope_scaling type \"dynamic\": expected null or \"longrope\""));
  json_object_set_new(cfg, "rope_scaling", json_null());
  const mpk_arch *phi3 = mpk__arch_by_name("phi3");
  mpk__arch_map_name(&phi3->gguf_names, "blk.3.ffn_up.weight", cn, sizeof cn);
  assert_string_equal(cn, "model.layers.3.mlp.gate_up_proj.weight");
  mpk__arch_map_name(&phi3->gguf_names, "blk.0.attn_qkv.weight", cn, sizeof cn);
  assert_string_equal(cn, "model.layers.0.self_attn.qkv_proj.weight");
  /* the known architectures are listed when none matches */
  json_object_set_new(man, "architecture", json_string("gemma9"));
  assert_int_equal(mpk_check_model(p), SERVD_EUNSUPPORTED);
  assert_non_null(strstr(servd_last_error(), "qwen2 (model_type qwen2, GGUF qwen2); qwen3"));
  mpk_close(p);
}

static void entry_modes(void **state) {
  (void)state;
  size_t len;
  unsigned char *good = slurp(tiny_pkg(), &len), *b = malloc(len);
  assert_int_equal(open_bytes(good, len, NULL), 0);
  static const struct {
    unsigned mode;
    const char *why;
  } bad[] = {{0120777, "symbolic link"}, {0020644, "device"}, {0060644, "device"}, {0010644, "FIFO"},
             {0140644, "socket"},        {0104755, "setuid"}, {0102755, "setuid"}, {0040755, "folder with content"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    memcpy(b, good, len);
    unsigned char *c = central(b, len, "code/llama/model.py");
    wr32(c + 38, (uint32_t)bad[i].mode << 16);
    assert_int_equal(open_bytes(b, len, NULL), SERVD_EFORMAT);
    assert_non_null(strstr(servd_last_error(), "code/llama/model.py"));
    assert_non_null(strstr(servd_last_error(), bad[i].why));
  }
  /* permissions only (no type bits), and attributes of a host without Unix modes, are plain files */
  memcpy(b, good, len);
  unsigned char *c = central(b, len, "code/llama/model.py");
  wr32(c + 38, 0600u << 16);
  assert_int_equal(open_bytes(b, len, NULL), 0);
  wr32(c + 38, 0120777u << 16);
  wr16(c + 4, 20); /* made by MS-DOS */
  assert_int_equal(open_bytes(b, len, NULL), 0);
  free(b);
  free(good);
}

static void names(void **state) {
  (void)state;
  assert_int_equal(mpk_check_name("t", "name", "smollm2-135m_v1.2"), 0);
  static const char *const bad[] = {
      "",    ".hidden",  "../../etc",   "a b",
      "x\n", "\x1b[31m", "caf\xc3\xa9", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}; /* 65 */
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(mpk_check_name("t", "name", bad[i]), SERVD_EFORMAT);
    const char *e = servd_last_error();
    for (const char *q = e; *q; q++) assert_true((unsigned char)*q >= 0x20 && (unsigned char)*q < 0x7f);
  }
  /* the writer refuses them */
  char path[512];
  snprintf(path, sizeof path, "%s/n.mpk", dir);
  mpk_writer *w;
  assert_int_equal(mpk_writer_create(path, &w), 0);
  assert_int_equal(mpk_writer_set(w, "name", json_string("../../etc")), SERVD_EFORMAT);
  assert_int_equal(mpk_writer_set(w, "model_version", json_string("1\n")), SERVD_EFORMAT);
  mpk_writer_destroy(w);
  /* the reader refuses a crafted manifest: the name patched in place (open does not hash) */
  mpk_import_options o;
  mpk_import_options_init(&o);
  o.code_dir = MPK_TEST_CODE_DIR;
  o.name = "aaaaaaaaaaaaaaaaaaaaa"; /* 21 characters, as long as the JSON escape below */
  snprintf(path, sizeof path, "%s/named.mpk", dir);
  assert_int_equal(mpk_synth("tiny", 1, SERVD_F32, NULL, path, &o), 0);
  size_t len;
  unsigned char *b = slurp(path, &len);
  unsigned char *at = memmem(b, len, "\"aaaaaaaaaaaaaaaaaaaaa\"", 23);
  assert_non_null(at);
  memcpy(at + 1, "../../etc\\n\\u001b[31m", 21);
  assert_int_equal(open_bytes(b, len, NULL), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "manifest.json: name"));
  assert_null(strchr(servd_last_error(), 0x1b));
  assert_null(strchr(servd_last_error(), '\n'));
  free(b);
}

static bool exists(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0;
}

static void unpack(void **state) {
  (void)state;
  mpk_package *p;
  char out[512], cmd[1200];
  assert_int_equal(mpk_open(tiny_pkg(), &p), 0);
  snprintf(out, sizeof out, "%s/un", dir);
  assert_int_equal(mpk_unpack(p, out), 0);
  snprintf(cmd, sizeof cmd, "%s/code/llama/model.py", out);
  struct stat st;
  assert_int_equal(lstat(cmd, &st), 0);
  assert_true(S_ISREG(st.st_mode));
  assert_int_equal(st.st_mode & 07777, 0644);
  /* a non-empty destination is left alone */
  assert_int_equal(mpk_unpack(p, out), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "not an empty folder"));
  /* an empty one is replaced */
  snprintf(out, sizeof out, "%s/empty", dir);
  assert_int_equal(mkdir(out, 0755), 0);
  assert_int_equal(mpk_unpack(p, out), 0);
  /* a link as destination is not followed */
  snprintf(out, sizeof out, "%s/link", dir);
  assert_int_equal(symlink("/tmp", out), 0);
  assert_int_equal(mpk_unpack(p, out), SERVD_EINVAL);
  mpk_close(p);

  /* all or nothing: "a" is a file, so "a/b" cannot be written after it; nothing may be left */
  char path[512];
  snprintf(path, sizeof path, "%s/ab.mpk", dir);
  mpk_writer *w;
  assert_int_equal(mpk_writer_create(path, &w), 0);
  assert_int_equal(mpk_writer_set(w, "name", json_string("ab")), 0);
  assert_int_equal(mpk_writer_set(w, "model_version", json_string("1")), 0);
  assert_int_equal(mpk_writer_set(w, "kind", json_string("generic")), 0);
  assert_int_equal(mpk_writer_set(w, "entry_point", json_string("a.m:M")), 0);
  assert_int_equal(mpk_writer_set(w, "config", json_object()), 0);
  assert_int_equal(mpk_writer_add_file(w, "code/a", "x", 1), 0);
  assert_int_equal(mpk_writer_add_file(w, "code/a/b", "y", 1), 0);
  assert_int_equal(mpk_writer_finish(w), 0);
  mpk_writer_destroy(w);
  assert_int_equal(mpk_open(path, &p), 0);
  snprintf(out, sizeof out, "%s/partial", dir);
  assert_int_equal(mpk_unpack(p, out), SERVD_EIO);
  assert_non_null(strstr(servd_last_error(), "code/a/b"));
  mpk_close(p);
  assert_false(exists(out));
  snprintf(cmd, sizeof cmd, "ls -d %s/partial* >/dev/null 2>&1", dir);
  assert_int_not_equal(system(cmd), 0); /* no temporary folder either */
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(model_checks), cmocka_unit_test(family_checks),
                                     cmocka_unit_test(entry_modes), cmocka_unit_test(names), cmocka_unit_test(unpack)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
