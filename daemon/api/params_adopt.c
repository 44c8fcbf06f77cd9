/* The request parameters an engine request adopts, shared by the OpenAI-compatible routes (the
 * body's fields) and KServe v2 inference (the request's 'parameters'): one row per numeric or
 * boolean field, with its range and its place in servd_gen_params, then the fields of other shapes
 * (seed, stop strings, stop token ids, timeout, priority). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/params_check.h"

#define MAX_STOP 16
#define MAX_STOP_IDS 64 /* the engine's limit (servd_model_submit) */

typedef enum { F_FLOAT, F_INT, F_BOOL } field_kind;

static const struct {
  const char *key;
  field_kind kind;
  double lo, hi;
  bool lo_open;
  size_t off;
} fields[] = {
    {"temperature", F_FLOAT, 0, 2, false, offsetof(servd_gen_params, temperature)},
    {"top_p", F_FLOAT, 0, 1, true, offsetof(servd_gen_params, top_p)},
    {"min_p", F_FLOAT, 0, 1, false, offsetof(servd_gen_params, min_p)},
    {"repetition_penalty", F_FLOAT, 0, 10, true, offsetof(servd_gen_params, repetition_penalty)},
    {"presence_penalty", F_FLOAT, -2, 2, false, offsetof(servd_gen_params, presence_penalty)},
    {"frequency_penalty", F_FLOAT, -2, 2, false, offsetof(servd_gen_params, frequency_penalty)},
    {"top_k", F_INT, -1, 1 << 20, false, offsetof(servd_gen_params, top_k)},
    /* Both names are checked wherever they appear; the newer one wins when both are given. */
    {"max_tokens", F_INT, 1, 1 << 24, false, offsetof(servd_gen_params, max_tokens)},
    {"max_completion_tokens", F_INT, 1, 1 << 24, false, offsetof(servd_gen_params, max_tokens)},
    {"min_tokens", F_INT, 0, 1 << 24, false, offsetof(servd_gen_params, min_tokens)},
    {"ignore_eos", F_BOOL, 0, 0, false, offsetof(servd_gen_params, ignore_eos)},
};

static bool adopt_fields(api_check *c, json_t *obj, servd_gen_params *gp) {
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    char *dst = (char *)gp + fields[i].off;
    bool present = false;
    if (fields[i].kind == F_FLOAT) {
      double d = 0;
      if (!api_check_number(c, obj, fields[i].key, fields[i].lo, fields[i].hi, fields[i].lo_open, &present, &d))
        return false;
      if (present) *(float *)dst = (float)d;
    } else if (fields[i].kind == F_INT) {
      long long x = 0;
      if (!api_check_int(c, obj, fields[i].key, (long long)fields[i].lo, (long long)fields[i].hi, &present, &x))
        return false;
      if (present) *(int *)dst = (int)x;
    } else if (!api_check_bool(c, obj, fields[i].key, (bool *)dst)) {
      return false;
    }
  }
  return true;
}

static bool adopt_stop(api_check *c, json_t *obj, servd_gen_params *gp) {
  const char *w = c->where;
  json_t *s = api_check_field(obj, "stop");
  if (s) {
    if (!json_is_string(s) && !json_is_array(s))
      return api_check_fail(c, "stop", "'%sstop' must be a string or a list of strings, got %s", w, api_json_type(s));
    size_t n = json_is_string(s) ? 1 : json_array_size(s);
    if (n > MAX_STOP) return api_check_fail(c, "stop", "'%sstop' may hold at most %d strings, got %zu", w, MAX_STOP, n);
    const char **list = servd_arena_calloc(c->arena, (n ? n : 1) * sizeof(char *));
    if (!list) return api_check_fail(c, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
      json_t *e = json_is_string(s) ? s : json_array_get(s, i);
      if (!json_is_string(e) || json_string_length(e) == 0 || json_string_length(e) > 1024)
        return api_check_fail(c, "stop", "'%sstop' entries must be non-empty strings of at most 1024 bytes", w);
      list[i] = servd_arena_strndup(c->arena, json_string_value(e), json_string_length(e));
      if (!list[i]) return api_check_fail(c, NULL, "out of memory");
    }
    gp->stop = list;
    gp->n_stop = (int)n;
  }
  json_t *ids = api_check_field(obj, "stop_token_ids");
  if (ids) {
    if (!json_is_array(ids))
      return api_check_fail(c, "stop_token_ids", "'%sstop_token_ids' must be a list of token ids, got %s", w,
                            api_json_type(ids));
    size_t n = json_array_size(ids);
    if (n > MAX_STOP_IDS)
      return api_check_fail(c, "stop_token_ids", "'%sstop_token_ids' may hold at most %d ids, got %zu", w, MAX_STOP_IDS,
                            n);
    int32_t *p = servd_arena_alloc(c->arena, (n ? n : 1) * sizeof(int32_t));
    if (!p) return api_check_fail(c, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
      long long x;
      if (!api_check_as_int(json_array_get(ids, i), &x) || x < 0 || x > INT32_MAX)
        return api_check_fail(c, "stop_token_ids", "'%sstop_token_ids'[%zu] must be a non-negative token id", w, i);
      p[i] = (int32_t)x;
    }
    gp->stop_token_ids = p;
    gp->n_stop_token_ids = (int)n;
  }
  return true;
}

/* OpenAI's logit_bias: {"<token id>": bias in [-100, 100]}, at most 300 entries. */
static bool adopt_logit_bias(api_check *c, json_t *obj, const api_param_limits *lim, servd_gen_params *gp) {
  const char *w = c->where;
  json_t *lb = api_check_field(obj, "logit_bias");
  if (!lb) return true;
  if (!json_is_object(lb))
    return api_check_fail(c, "logit_bias", "'%slogit_bias' must be an object mapping token ids to biases, got %s", w,
                          api_json_type(lb));
  size_t n = json_object_size(lb);
  if (n > SERVD_MAX_LOGIT_BIAS)
    return api_check_fail(c, "logit_bias", "'%slogit_bias' may hold at most %d entries, got %zu", w,
                          SERVD_MAX_LOGIT_BIAS, n);
  if (!n) return true;
  servd_logit_bias *b = servd_arena_alloc(c->arena, n * sizeof *b);
  if (!b) return api_check_fail(c, NULL, "out of memory");
  const char *key;
  json_t *val;
  size_t i = 0;
  json_object_foreach(lb, key, val) {
    char *end = NULL;
    long long id = strtoll(key, &end, 10);
    if (!*key || *end || id < 0 || id > INT32_MAX || (key[0] == '0' && key[1]))
      return api_check_fail(c, "logit_bias", "'%slogit_bias' keys must be token ids, got \"%.40s\"", w, key);
    if (lim->n_vocab > 0 && id >= lim->n_vocab)
      return api_check_fail(c, "logit_bias", "'%slogit_bias' token id %lld is outside the vocabulary of %d tokens", w,
                            id, lim->n_vocab);
    if (!json_is_number(val) || !(json_number_value(val) >= -100 && json_number_value(val) <= 100))
      return api_check_fail(c, "logit_bias", "'%slogit_bias'[\"%s\"] must be a number in [-100, 100]", w, key);
    b[i++] = (servd_logit_bias){(int32_t)id, (float)json_number_value(val)};
  }
  gp->logit_bias = b;
  gp->n_logit_bias = (int)n;
  return true;
}

int api_params_adopt(json_t *obj, unsigned sets, const char *where, const api_param_limits *lim, servd_arena *arena,
                     servd_gen_params *gp, api_param_error *err) {
  api_check c = {err, arena, where ? where : "", false};
  if (sets & API_ADOPT_SAMPLING) {
    if (!adopt_fields(&c, obj, gp) || !adopt_stop(&c, obj, gp) || !adopt_logit_bias(&c, obj, lim, gp)) return -1;
    if (gp->max_tokens > 0 && gp->min_tokens > gp->max_tokens)
      return api_check_fail(&c, "min_tokens", "'%smin_tokens' (%d) must not exceed max_tokens (%d)", c.where,
                            gp->min_tokens, gp->max_tokens),
             -1;
    json_t *seed = api_check_field(obj, "seed");
    if (seed) {
      long long x;
      if (!api_check_as_int(seed, &x))
        return api_check_fail(&c, "seed", "'%sseed' must be an integer, got %s", c.where, api_json_type(seed)), -1;
      gp->has_seed = true;
      gp->seed = (uint64_t)x;
    }
  }
  if (sets & API_ADOPT_PRIORITY) {
    bool present = false;
    long long x = 0;
    /* Any int as in vLLM, short of the ends, which are left to servers' own uses. */
    if (!api_check_int(&c, obj, "priority", -1000000000, 1000000000, &present, &x)) return -1;
    if (present) gp->priority = (int)x;
  }
  if (sets & API_ADOPT_DEADLINE) {
    bool present = false;
    double t = 0;
    if (!api_check_number(&c, obj, "timeout", 0, 86400, true, &present, &t)) return -1;
    gp->deadline_ms = present ? (int64_t)(t * 1000.0) : lim->default_deadline_ms;
  }
  return 0;
}
