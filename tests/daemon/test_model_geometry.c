/* The model geometry the engine and the GPU warm-up share (daemon/engine/model_geometry.h), read from
 * config JSON as packages carry it: Hugging Face names, GGUF names, defaults, and bad values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/model_geometry.h"

static servd_model_geometry read_text(const char *text) {
  json_error_t err;
  json_t *cfg = json_loads(text, 0, &err);
  assert_non_null(cfg);
  servd_model_geometry g;
  servd_model_geometry_read(cfg, &g);
  json_decref(cfg);
  return g;
}

/* SmolLM2-135M-Instruct's config.json (the fields that matter, as Hugging Face ships them). */
static void test_hf_config(void **state) {
  (void)state;
  servd_model_geometry g =
      read_text("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 576, \"intermediate_size\": 1536,"
                " \"max_position_embeddings\": 8192, \"model_type\": \"llama\", \"num_attention_heads\": 9,"
                " \"num_hidden_layers\": 30, \"num_key_value_heads\": 3, \"rms_norm_eps\": 1e-05,"
                " \"rope_theta\": 100000, \"tie_word_embeddings\": true, \"vocab_size\": 49152}");
  assert_int_equal(g.n_layers, 30);
  assert_int_equal(g.n_heads, 9);
  assert_int_equal(g.n_kv_heads, 3);
  assert_int_equal(g.dim, 576);
  assert_int_equal(g.head_dim, 64); /* absent: hidden_size / num_attention_heads */
  assert_int_equal(g.ffn_dim, 1536);
  assert_int_equal(g.vocab, 49152);
  assert_int_equal(g.context_length, 8192);
}

/* GGUF metadata names; an explicit head_dim wins over dim / heads (Gemma, Qwen3). */
static void test_gguf_names(void **state) {
  (void)state;
  servd_model_geometry g =
      read_text("{\"block_count\": 2, \"head_count\": 4, \"head_count_kv\": 2, \"embedding_length\": 64,"
                " \"feed_forward_length\": 128, \"context_length\": 512, \"head_dim\": 32}");
  assert_int_equal(g.n_layers, 2);
  assert_int_equal(g.n_heads, 4);
  assert_int_equal(g.n_kv_heads, 2);
  assert_int_equal(g.dim, 64);
  assert_int_equal(g.head_dim, 32);
  assert_int_equal(g.ffn_dim, 128);
  assert_int_equal(g.vocab, 0); /* absent: the caller's choice */
  assert_int_equal(g.context_length, 512);
}

/* Both spellings present: the Hugging Face one is read. */
static void test_hf_name_wins(void **state) {
  (void)state;
  servd_model_geometry g = read_text("{\"num_hidden_layers\": 3, \"block_count\": 7, \"hidden_size\": 16,"
                                     " \"embedding_length\": 32, \"num_attention_heads\": 2, \"head_count\": 8}");
  assert_int_equal(g.n_layers, 3);
  assert_int_equal(g.dim, 16);
  assert_int_equal(g.n_heads, 2);
  assert_int_equal(g.head_dim, 8);
}

static void test_defaults(void **state) {
  (void)state;
  servd_model_geometry g = read_text("{\"num_attention_heads\": 6, \"hidden_size\": 96}");
  assert_int_equal(g.n_kv_heads, 6); /* no grouped-query attention */
  assert_int_equal(g.head_dim, 16);
  assert_int_equal(g.context_length, 2048);
  assert_int_equal(g.n_layers, 0);
  assert_int_equal(g.ffn_dim, 0);

  servd_model_geometry_read(NULL, &g); /* no config at all: everything absent */
  assert_int_equal(g.n_layers, 0);
  assert_int_equal(g.n_heads, 0);
  assert_int_equal(g.n_kv_heads, 0);
  assert_int_equal(g.head_dim, 0);
  assert_int_equal(g.context_length, 2048);
}

/* null and non-integers read as absent (configs carry "head_dim": null); integers that do not fit
 * read as -1, never as a truncated value a "> 0" check would let through. */
static void test_bad_values(void **state) {
  (void)state;
  servd_model_geometry g =
      read_text("{\"num_attention_heads\": 4, \"hidden_size\": 64, \"head_dim\": null, \"num_key_value_heads\": \"2\","
                " \"num_hidden_layers\": 4294967298, \"vocab_size\": -5, \"intermediate_size\": 1.5,"
                " \"max_position_embeddings\": 2147483648}");
  assert_int_equal(g.head_dim, 16);
  assert_int_equal(g.n_kv_heads, 4);
  assert_int_equal(g.n_layers, -1); /* 2^32 + 2 would truncate to 2 */
  assert_int_equal(g.vocab, -1);
  assert_int_equal(g.ffn_dim, 0);
  assert_int_equal(g.context_length, -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hf_config), cmocka_unit_test(test_gguf_names), cmocka_unit_test(test_hf_name_wins),
      cmocka_unit_test(test_defaults),  cmocka_unit_test(test_bad_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
