/* Request bodies for the three kinds of request servd-bench sends. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* Merges --extra-body (validated at startup) into obj; its keys win. */
static int merge_extra(const bench_config *cfg, json_t *obj) {
  if (!cfg->extra_body) return 0;
  json_t *extra = json_loads(cfg->extra_body, 0, NULL);
  if (!json_is_object(extra)) {
    json_decref(extra);
    return -1;
  }
  int rc = json_object_update(obj, extra);
  json_decref(extra);
  return rc;
}

static char *dump(json_t *obj) {
  char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
  json_decref(obj);
  return s;
}

/* A streaming request with `input` (a "prompt" string or a "messages" array) under `key`; steals
 * input's reference. */
static char *body_with(const bench_config *cfg, const char *key, json_t *input, int max_tokens) {
  json_t *o = json_object();
  if (!o || !input) {
    json_decref(o);
    json_decref(input);
    return NULL;
  }
  if (cfg->model) json_object_set_new(o, "model", json_string(cfg->model));
  json_object_set_new(o, key, input);
  json_object_set_new(o, "max_tokens", json_integer(max_tokens));
  json_object_set_new(o, "stream", json_true());
  if (cfg->include_usage) json_object_set_new(o, "stream_options", json_pack("{s:b}", "include_usage", 1));
  if (cfg->ignore_eos) {
    /* vLLM and llama.cpp's server accept ignore_eos; vLLM also min_tokens. Servers that do not
     * know them ignore them (or reject them: then use --no-ignore-eos / --no-min-tokens). */
    json_object_set_new(o, "ignore_eos", json_true());
    if (cfg->min_tokens) json_object_set_new(o, "min_tokens", json_integer(max_tokens));
  }
  if (cfg->temperature >= 0) json_object_set_new(o, "temperature", json_real(cfg->temperature));
  if (merge_extra(cfg, o)) {
    json_decref(o);
    return NULL;
  }
  return dump(o);
}

char *bench_body_openai(const bench_config *cfg, const char *prompt, int max_tokens) {
  if (cfg->api == BENCH_API_CHAT)
    return body_with(cfg, "messages", json_pack("[{s:s, s:s}]", "role", "user", "content", prompt), max_tokens);
  return body_with(cfg, "prompt", json_string(prompt), max_tokens);
}

char *bench_body_chat_messages(const bench_config *cfg, json_t *messages, int max_tokens) {
  return body_with(cfg, "messages", json_incref(messages), max_tokens);
}

/* llama.cpp's server reads "content" and "add_special"; vLLM and servd read "prompt" and
 * "add_special_tokens" (and "model"); each ignores the other's fields. Both flags false count only
 * the text's own tokens (no BOS). */
char *bench_body_tokenize(const bench_config *cfg, const char *text, size_t len) {
  json_t *o = json_object();
  if (!o) return NULL;
  if (cfg->model) json_object_set_new(o, "model", json_string(cfg->model));
  json_object_set_new(o, "content", json_stringn(text, len));
  json_object_set_new(o, "prompt", json_stringn(text, len));
  json_object_set_new(o, "add_special", json_false());
  json_object_set_new(o, "add_special_tokens", json_false());
  return dump(o);
}

static const char *const kWordsBytes[] = {"alpha", "beta", "gamma", "delta", "omega", "sigma"};

/* One input tensor of --shape and --datatype filled with seeded values: floats uniform in
 * [-1, 1), integers in [0, 100), booleans, or short strings for BYTES. */
char *bench_body_kserve(const bench_config *cfg, uint64_t seed) {
  int64_t count = 1;
  for (int i = 0; i < cfg->ndim; i++) count *= cfg->shape[i];
  const char *dt = cfg->datatype;
  bool is_float =
      strcmp(dt, "FP32") == 0 || strcmp(dt, "FP64") == 0 || strcmp(dt, "FP16") == 0 || strcmp(dt, "BF16") == 0;
  bool is_bool = strcmp(dt, "BOOL") == 0;
  bool is_bytes = strcmp(dt, "BYTES") == 0;
  bench_rng r;
  bench_rng_seed(&r, seed);
  json_t *data = json_array();
  json_t *shape = json_array();
  for (int i = 0; i < cfg->ndim; i++) json_array_append_new(shape, json_integer(cfg->shape[i]));
  for (int64_t i = 0; i < count; i++) {
    json_t *v;
    if (is_float) {
      /* rounded to 1/1024 so the JSON stays short and exactly representable in FP16 */
      v = json_real((double)((int)(bench_rng_uniform(&r) * 2048.0) - 1024) / 1024.0);
    } else if (is_bool) {
      v = json_boolean(bench_rng_next(&r) & 1);
    } else if (is_bytes) {
      v = json_string(kWordsBytes[bench_rng_next(&r) % 6]);
    } else {
      v = json_integer((json_int_t)(bench_rng_next(&r) % 100));
    }
    json_array_append_new(data, v);
  }
  json_t *input =
      json_pack("{s:s, s:o, s:s, s:o}", "name", cfg->input_name, "shape", shape, "datatype", dt, "data", data);
  json_t *o = json_pack("{s:[o]}", "inputs", input);
  if (o && merge_extra(cfg, o)) {
    json_decref(o);
    return NULL;
  }
  return dump(o);
}
