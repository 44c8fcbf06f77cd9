/* Validation of OpenAI-compatible request bodies: every field's type and range, with messages that
 * name the field and what was expected. No server state: see api/request_params.h. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/request_params.h"
#include "http/buf.h"

#define MAX_STOP 16
#define MAX_TOP_LOGPROBS 20

typedef struct vctx {
  api_param_error *err;
  servd_arena *arena;
  bool failed;
} vctx;

static bool bad(vctx *v, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool bad(vctx *v, const char *param, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!v->failed) {
    v->err->status = 400;
    snprintf(v->err->param, sizeof v->err->param, "%s", param ? param : "");
    snprintf(v->err->message, sizeof v->err->message, "%s", msg[0] ? msg : "invalid request");
    api_utf8_fix(v->err->message);
  }
  v->failed = true;
  return false;
}

static const char *jtype(const json_t *j) {
  switch (json_typeof(j)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  default: return "null";
  }
}

/* Field present and not null. */
static json_t *field(json_t *body, const char *key) {
  json_t *j = json_object_get(body, key);
  return j && !json_is_null(j) ? j : NULL;
}

static bool get_number(vctx *v, json_t *body, const char *key, double lo, double hi, bool lo_open, float *out) {
  json_t *j = field(body, key);
  if (!j) return true;
  if (!json_is_number(j)) return bad(v, key, "'%s' must be a number, got %s", key, jtype(j));
  double d = json_number_value(j);
  if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
    return bad(v, key, "'%s' must be in %s%g, %g], got %g", key, lo_open ? "(" : "[", lo, hi, d);
  *out = (float)d;
  return true;
}

static bool as_int(json_t *j, long long *out) {
  if (json_is_integer(j)) {
    *out = json_integer_value(j);
    return true;
  }
  if (json_is_real(j)) { /* 5.0 is accepted as 5, as lax JSON schema validators do */
    double d = json_real_value(j);
    if (isfinite(d) && d == floor(d) && fabs(d) < 9.0e15) {
      *out = (long long)d;
      return true;
    }
  }
  return false;
}

static bool get_int(vctx *v, json_t *body, const char *key, long long lo, long long hi, bool *present, long long *out) {
  json_t *j = field(body, key);
  if (present) *present = j != NULL;
  if (!j) return true;
  long long x;
  if (!as_int(j, &x)) return bad(v, key, "'%s' must be an integer, got %s", key, jtype(j));
  if (x < lo || x > hi) return bad(v, key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
  *out = x;
  return true;
}

static bool get_bool(vctx *v, json_t *body, const char *key, bool *out) {
  json_t *j = field(body, key);
  if (!j) return true;
  if (!json_is_boolean(j)) return bad(v, key, "'%s' must be a boolean, got %s", key, jtype(j));
  *out = json_is_true(j);
  return true;
}

/* A JSON array of token ids into a malloc'd int32 array. */
static bool parse_ids(vctx *v, const char *key, json_t *arr, int32_t **ids, int *n) {
  size_t len = json_array_size(arr);
  if (len == 0) return bad(v, key, "'%s' must not be an empty list of token ids", key);
  if (len > (1u << 24)) return bad(v, key, "'%s' has too many token ids (%zu)", key, len);
  int32_t *p = malloc(len * sizeof(int32_t));
  if (!p) return bad(v, key, "out of memory");
  for (size_t i = 0; i < len; i++) {
    long long x;
    if (!as_int(json_array_get(arr, i), &x) || x < 0 || x > INT32_MAX) {
      free(p);
      return bad(v, key, "'%s'[%zu] must be a non-negative token id", key, i);
    }
    p[i] = (int32_t)x;
  }
  *ids = p;
  *n = (int)len;
  return true;
}

static bool parse_prompt(vctx *v, oai_params *o, json_t *body) {
  json_t *p = field(body, "prompt");
  if (!p) return bad(v, "prompt", "'prompt' is required: a string, a list of strings, or token ids");
  if (json_is_string(p)) {
    o->n_prompts = 1;
    o->prompts = servd_arena_calloc(v->arena, sizeof(oai_prompt));
    if (!o->prompts) return bad(v, NULL, "out of memory");
    o->prompts[0].text = servd_arena_strndup(v->arena, json_string_value(p), json_string_length(p));
    return true;
  }
  if (!json_is_array(p) || json_array_size(p) == 0)
    return bad(v, "prompt", "'prompt' must be a string, a non-empty list of strings, a list of token ids or a "
                            "list of lists of token ids, got %s", jtype(p));
  json_t *first = json_array_get(p, 0);
  if (json_is_integer(first)) {
    o->n_prompts = 1;
    o->prompts = servd_arena_calloc(v->arena, sizeof(oai_prompt));
    if (!o->prompts) return bad(v, NULL, "out of memory");
    return parse_ids(v, "prompt", p, &o->prompts[0].ids, &o->prompts[0].n_ids);
  }
  size_t np = json_array_size(p);
  if (np > 64) return bad(v, "prompt", "at most 64 prompts per request, got %zu", np);
  o->n_prompts = (int)np;
  o->prompts = servd_arena_calloc(v->arena, np * sizeof(oai_prompt));
  if (!o->prompts) return bad(v, NULL, "out of memory");
  for (size_t i = 0; i < np; i++) {
    json_t *e = json_array_get(p, i);
    if (json_is_string(e)) {
      o->prompts[i].text = servd_arena_strndup(v->arena, json_string_value(e), json_string_length(e));
    } else if (json_is_array(e)) {
      if (!parse_ids(v, "prompt", e, &o->prompts[i].ids, &o->prompts[i].n_ids)) return false;
    } else {
      return bad(v, "prompt", "'prompt'[%zu] must be a string or a list of token ids, got %s", i, jtype(e));
    }
  }
  return true;
}

/* Messages are checked and normalized: content given as a list of text parts becomes one string. */
static bool parse_messages(vctx *v, oai_params *o, json_t *body) {
  json_t *m = field(body, "messages");
  if (!m) return bad(v, "messages", "'messages' is required: a non-empty list of {role, content}");
  if (!json_is_array(m) || json_array_size(m) == 0)
    return bad(v, "messages", "'messages' must be a non-empty list of {role, content}, got %s",
               json_is_array(m) ? "an empty list" : jtype(m));
  if (json_array_size(m) > 4096) return bad(v, "messages", "too many messages (%zu)", json_array_size(m));
  static const char *roles[] = {"system", "user", "assistant", "tool", "developer"};
  json_t *out = json_array();
  for (size_t i = 0; i < json_array_size(m); i++) {
    json_t *e = json_array_get(m, i);
    char param[48];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!json_is_object(e)) {
      json_decref(out);
      return bad(v, param, "'%s' must be an object with 'role' and 'content', got %s", param, jtype(e));
    }
    json_t *role = json_object_get(e, "role");
    bool ok = false;
    for (size_t k = 0; role && json_is_string(role) && k < sizeof roles / sizeof roles[0]; k++)
      ok |= strcmp(json_string_value(role), roles[k]) == 0;
    if (!ok) {
      json_decref(out);
      return bad(v, param, "'%s.role' must be one of system, user, assistant, tool, developer", param);
    }
    json_t *content = json_object_get(e, "content");
    json_t *text;
    if (!content || json_is_null(content)) {
      text = json_string("");
    } else if (json_is_string(content)) {
      text = json_incref(content);
    } else if (json_is_array(content)) {
      servd_buf b;
      servd_buf_init(&b);
      for (size_t k = 0; k < json_array_size(content); k++) {
        json_t *part = json_array_get(content, k);
        json_t *type = json_object_get(part, "type");
        json_t *t = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(t)) {
          servd_buf_free(&b);
          json_decref(out);
          return bad(v, param, "'%s.content'[%zu] must be {\"type\": \"text\", \"text\": string}; only text "
                               "content is supported", param, k);
        }
        servd_buf_append(&b, json_string_value(t), json_string_length(t));
      }
      text = json_stringn(b.data ? b.data : "", b.len);
      servd_buf_free(&b);
    } else {
      json_decref(out);
      return bad(v, param, "'%s.content' must be a string or a list of text parts, got %s", param, jtype(content));
    }
    json_t *msg = json_pack("{s:O, s:o}", "role", role, "content", text);
    json_t *name = json_object_get(e, "name");
    if (json_is_string(name)) json_object_set(msg, "name", name);
    json_array_append_new(out, msg);
  }
  o->messages = out;
  o->n_prompts = 1; /* the rendered template */
  o->prompts = servd_arena_calloc(v->arena, sizeof(oai_prompt));
  if (!o->prompts) return bad(v, NULL, "out of memory");
  return true;
}

static bool parse_stop(vctx *v, oai_params *o, json_t *body) {
  json_t *s = field(body, "stop");
  if (s) {
    size_t n = json_is_string(s) ? 1 : json_is_array(s) ? json_array_size(s) : 0;
    if (!json_is_string(s) && !json_is_array(s))
      return bad(v, "stop", "'stop' must be a string or a list of strings, got %s", jtype(s));
    if (n > MAX_STOP) return bad(v, "stop", "'stop' may hold at most %d strings, got %zu", MAX_STOP, n);
    const char **list = servd_arena_calloc(v->arena, (n ? n : 1) * sizeof(char *));
    if (!list) return bad(v, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
      json_t *e = json_is_string(s) ? s : json_array_get(s, i);
      if (!json_is_string(e) || json_string_length(e) == 0 || json_string_length(e) > 1024)
        return bad(v, "stop", "'stop' entries must be non-empty strings of at most 1024 bytes");
      list[i] = servd_arena_strndup(v->arena, json_string_value(e), json_string_length(e));
    }
    o->gp.stop = list;
    o->gp.n_stop = (int)n;
  }
  json_t *ids = field(body, "stop_token_ids");
  if (ids) {
    if (!json_is_array(ids)) return bad(v, "stop_token_ids", "'stop_token_ids' must be a list of token ids");
    size_t n = json_array_size(ids);
    if (n > 256) return bad(v, "stop_token_ids", "'stop_token_ids' may hold at most 256 ids");
    int32_t *p = servd_arena_alloc(v->arena, (n ? n : 1) * sizeof(int32_t));
    if (!p) return bad(v, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
      long long x;
      if (!as_int(json_array_get(ids, i), &x) || x < 0 || x > INT32_MAX)
        return bad(v, "stop_token_ids", "'stop_token_ids'[%zu] must be a non-negative token id", i);
      p[i] = (int32_t)x;
    }
    o->gp.stop_token_ids = p;
    o->gp.n_stop_token_ids = (int)n;
  }
  return true;
}

static bool unsupported(vctx *v, json_t *body, const char *key, const char *why) {
  json_t *j = field(body, key);
  if (!j) return true;
  return bad(v, key, "'%s' is not supported: %s", key, why);
}

static bool parse(vctx *v, json_t *body, oai_mode mode, const api_param_limits *lim, oai_params *o) {
  if (!json_is_object(body)) return bad(v, NULL, "the request body must be a JSON object, got %s", jtype(body));
  o->gp = lim->defaults;
  o->logprobs = -1;
  o->n = 1;

  if (mode == OAI_DETOKENIZE) {
    json_t *t = field(body, "tokens");
    if (!t || !json_is_array(t)) return bad(v, "tokens", "'tokens' must be a list of token ids");
    o->n_prompts = 1;
    o->prompts = servd_arena_calloc(v->arena, sizeof(oai_prompt));
    if (!o->prompts) return bad(v, NULL, "out of memory");
    if (json_array_size(t) == 0) return true;
    return parse_ids(v, "tokens", t, &o->prompts[0].ids, &o->prompts[0].n_ids);
  }
  if (mode == OAI_TOKENIZE) {
    o->add_special = true;
    o->add_generation_prompt = true;
    if (field(body, "messages")) {
      o->add_special = false;
      if (!parse_messages(v, o, body) || !get_bool(v, body, "add_generation_prompt", &o->add_generation_prompt))
        return false;
    } else if (!parse_prompt(v, o, body)) {
      return false;
    }
    if (!get_bool(v, body, "add_special_tokens", &o->add_special)) return false;
    if (o->n_prompts > 1) return bad(v, "prompt", "/tokenize takes one prompt");
    return true;
  }

  bool chat = mode == OAI_CHAT;
  if (chat ? !parse_messages(v, o, body) : !parse_prompt(v, o, body)) return false;
  o->add_special = !chat; /* chat templates write their own special tokens */
  o->add_generation_prompt = true;
  bool present;
  long long x = 0;
  const char *mt_key = chat && field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (!get_int(v, body, mt_key, 1, 1 << 24, &present, &x)) return false;
  if (present) o->gp.max_tokens = (int)x;
  if (!get_number(v, body, "temperature", 0, 2, false, &o->gp.temperature) ||
      !get_number(v, body, "top_p", 0, 1, true, &o->gp.top_p) ||
      !get_number(v, body, "min_p", 0, 1, false, &o->gp.min_p) ||
      !get_number(v, body, "repetition_penalty", 0, 10, true, &o->gp.repetition_penalty) ||
      !get_number(v, body, "presence_penalty", -2, 2, false, &o->gp.presence_penalty) ||
      !get_number(v, body, "frequency_penalty", -2, 2, false, &o->gp.frequency_penalty))
    return false;
  if (!get_int(v, body, "top_k", -1, 1 << 20, &present, &x)) return false;
  if (present) o->gp.top_k = (int)x;
  json_t *seed = field(body, "seed");
  if (seed) {
    if (!json_is_integer(seed)) return bad(v, "seed", "'seed' must be an integer, got %s", jtype(seed));
    o->gp.has_seed = true;
    o->gp.seed = (uint64_t)json_integer_value(seed);
  }
  if (!get_int(v, body, "n", 1, lim->max_n, &present, &x)) return false;
  if (present) o->n = (int)x;
  json_t *best_of = field(body, "best_of");
  if (best_of && (!json_is_integer(best_of) || json_integer_value(best_of) != o->n))
    return bad(v, "best_of", "'best_of' is not supported (only best_of == n)");
  if (!parse_stop(v, o, body)) return false;
  if (!get_bool(v, body, "ignore_eos", &o->gp.ignore_eos) || !get_bool(v, body, "stream", &o->stream)) return false;
  json_t *so = field(body, "stream_options");
  if (so) {
    if (!json_is_object(so)) return bad(v, "stream_options", "'stream_options' must be an object");
    if (!o->stream) return bad(v, "stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (!get_bool(v, so, "include_usage", &o->include_usage)) return false;
  }
  if (chat) {
    bool lp = false;
    if (!get_bool(v, body, "logprobs", &lp)) return false;
    if (!get_int(v, body, "top_logprobs", 0, MAX_TOP_LOGPROBS, &present, &x)) return false;
    if (present && !lp) return bad(v, "top_logprobs", "'top_logprobs' requires 'logprobs': true");
    if (lp) o->logprobs = present ? (int)x : 0;
  } else {
    json_t *lp = field(body, "logprobs");
    if (lp && json_is_boolean(lp)) return bad(v, "logprobs", "'logprobs' must be an integer in [0, %d] for "
                                                              "completions", MAX_TOP_LOGPROBS);
    if (!get_int(v, body, "logprobs", 0, MAX_TOP_LOGPROBS, &present, &x)) return false;
    if (present) o->logprobs = (int)x;
    json_t *echo = field(body, "echo");
    if (echo && !json_is_boolean(echo)) return bad(v, "echo", "'echo' must be a boolean");
    if (echo && json_is_true(echo)) return bad(v, "echo", "'echo' is not supported");
    if (!unsupported(v, body, "suffix", "insertion is not supported")) return false;
  }
  o->gp.logprobs = o->logprobs;
  if (!unsupported(v, body, "tools", "tool calling is not supported") ||
      !unsupported(v, body, "logit_bias", "logit bias is not supported"))
    return false;
  json_t *rf = field(body, "response_format");
  if (rf) {
    json_t *t = json_object_get(rf, "type");
    if (!json_is_object(rf) || !json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
      return bad(v, "response_format", "only {\"type\": \"text\"} is supported for 'response_format'");
  }
  float timeout = 0;
  if (!get_number(v, body, "timeout", 0, 86400, true, &timeout)) return false;
  o->gp.deadline_ms = timeout > 0 ? (int64_t)(timeout * 1000.0f) : lim->default_deadline_ms;
  json_t *user = field(body, "user");
  if (user && !json_is_string(user)) return bad(v, "user", "'user' must be a string");
  if ((long long)o->n * o->n_prompts > 256)
    return bad(v, "n", "n times the number of prompts must be at most 256");
  return true;
}

int oai_params_parse(json_t *body, oai_mode mode, const api_param_limits *lim, servd_arena *arena, oai_params *out,
                     api_param_error *err) {
  memset(out, 0, sizeof(*out));
  memset(err, 0, sizeof(*err));
  vctx v = {err, arena, false};
  if (parse(&v, body, mode, lim, out)) return 0;
  oai_params_free(out);
  return -1;
}

int oai_params_parse_text(const char *text, size_t len, oai_mode mode, const api_param_limits *lim,
                          servd_arena *arena, oai_params *out, api_param_error *err) {
  memset(out, 0, sizeof(*out));
  json_t *body = NULL;
  if (api_body_parse(text, len, &body, err) != 0) return -1;
  int rc = oai_params_parse(body, mode, lim, arena, out, err);
  json_decref(body);
  return rc;
}

void oai_params_free(oai_params *p) {
  if (!p) return;
  for (int i = 0; p->prompts && i < p->n_prompts; i++) free(p->prompts[i].ids);
  json_decref(p->messages);
  memset(p, 0, sizeof(*p));
}
