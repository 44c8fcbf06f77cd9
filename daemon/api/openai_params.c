/* Validation of OpenAI-compatible request bodies: every field's type and range, with messages that
 * name the field and what was expected. No server state: see api/request_params.h. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/openai_guided.h"
#include "api/openai_tools.h"
#include "api/params_check.h"
#include "http/buf.h"

#define MAX_TOP_LOGPROBS 20

/* A JSON array of token ids into a malloc'd int32 array. */
static bool parse_ids(api_check *v, const char *key, json_t *arr, int32_t **ids, int *n) {
  size_t len = json_array_size(arr);
  if (len == 0) return api_check_fail(v, key, "'%s' must not be an empty list of token ids", key);
  if (len > (1u << 24)) return api_check_fail(v, key, "'%s' has too many token ids (%zu)", key, len);
  int32_t *p = malloc(len * sizeof(int32_t));
  if (!p) return api_check_fail(v, key, "out of memory");
  for (size_t i = 0; i < len; i++) {
    long long x;
    if (!api_check_as_int(json_array_get(arr, i), &x) || x < 0 || x > INT32_MAX) {
      free(p);
      return api_check_fail(v, key, "'%s'[%zu] must be a non-negative token id", key, i);
    }
    p[i] = (int32_t)x;
  }
  *ids = p;
  *n = (int)len;
  return true;
}

/* 'prompt' (completions, /tokenize) or 'input' (embeddings): a string, a list of strings, token ids or
 * a list of token id lists; at most max of them. */
static bool parse_prompt(api_check *v, oai_params *o, json_t *body, const char *key, size_t max) {
  json_t *p = api_check_field(body, key);
  if (!p) return api_check_fail(v, key, "'%s' is required: a string, a list of strings, or token ids", key);
  if (json_is_string(p)) {
    o->n_prompts = 1;
    o->prompts = servd_arena_calloc(v->arena, sizeof(oai_prompt));
    if (!o->prompts) return api_check_fail(v, NULL, "out of memory");
    o->prompts[0].text = servd_arena_strndup(v->arena, json_string_value(p), json_string_length(p));
    return true;
  }
  if (!json_is_array(p) || json_array_size(p) == 0)
    return api_check_fail(v, key,
                          "'%s' must be a string, a non-empty list of strings, a list of token ids or a "
                          "list of lists of token ids, got %s",
                          key, json_is_array(p) ? "an empty list" : api_json_type(p));
  json_t *first = json_array_get(p, 0);
  if (json_is_integer(first)) {
    o->n_prompts = 1;
    o->prompts = servd_arena_calloc(v->arena, sizeof(oai_prompt));
    if (!o->prompts) return api_check_fail(v, NULL, "out of memory");
    return parse_ids(v, key, p, &o->prompts[0].ids, &o->prompts[0].n_ids);
  }
  size_t np = json_array_size(p);
  if (np > max) return api_check_fail(v, key, "at most %zu %ss per request, got %zu", max, key, np);
  o->n_prompts = (int)np;
  o->prompts = servd_arena_calloc(v->arena, np * sizeof(oai_prompt));
  if (!o->prompts) return api_check_fail(v, NULL, "out of memory");
  for (size_t i = 0; i < np; i++) {
    json_t *e = json_array_get(p, i);
    /* OpenAI's shapes are a list of strings or a list of token-id lists, never a mix of them. */
    if (i > 0 && ((json_is_string(e) && json_is_array(first)) || (json_is_array(e) && json_is_string(first))))
      return api_check_fail(v, key,
                            "'%s' must be a list of strings or a list of lists of token ids, not a mix: "
                            "'%s'[0] is %s, '%s'[%zu] %s",
                            key, key, api_json_type(first), key, i, api_json_type(e));
    if (json_is_string(e)) {
      o->prompts[i].text = servd_arena_strndup(v->arena, json_string_value(e), json_string_length(e));
    } else if (json_is_array(e)) {
      if (!parse_ids(v, key, e, &o->prompts[i].ids, &o->prompts[i].n_ids)) return false;
    } else {
      return api_check_fail(v, key, "'%s'[%zu] must be a string or a list of token ids, got %s", key, i,
                            api_json_type(e));
    }
  }
  return true;
}

/* Messages are checked and normalized: content given as a list of text parts becomes one string. */
static bool parse_messages(api_check *v, oai_params *o, json_t *body) {
  json_t *m = api_check_field(body, "messages");
  if (!m) return api_check_fail(v, "messages", "'messages' is required: a non-empty list of {role, content}");
  if (!json_is_array(m) || json_array_size(m) == 0)
    return api_check_fail(v, "messages", "'messages' must be a non-empty list of {role, content}, got %s",
                          json_is_array(m) ? "an empty list" : api_json_type(m));
  if (json_array_size(m) > 4096) return api_check_fail(v, "messages", "too many messages (%zu)", json_array_size(m));
  static const char *roles[] = {"system", "user", "assistant", "tool", "developer"};
  json_t *out = json_array();
  for (size_t i = 0; i < json_array_size(m); i++) {
    json_t *e = json_array_get(m, i);
    char param[48];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!json_is_object(e)) {
      json_decref(out);
      return api_check_fail(v, param, "'%s' must be an object with 'role' and 'content', got %s", param,
                            api_json_type(e));
    }
    json_t *role = json_object_get(e, "role");
    bool ok = false;
    for (size_t k = 0; role && json_is_string(role) && k < sizeof roles / sizeof roles[0]; k++)
      ok |= strcmp(json_string_value(role), roles[k]) == 0;
    if (!ok) {
      json_decref(out);
      return api_check_fail(v, param, "'%s.role' must be one of system, user, assistant, tool, developer", param);
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
          return api_check_fail(v, param,
                                "'%s.content'[%zu] must be {\"type\": \"text\", \"text\": string}; only text "
                                "content is supported",
                                param, k);
        }
        servd_buf_append(&b, json_string_value(t), json_string_length(t));
      }
      text = json_stringn(b.data ? b.data : "", b.len);
      servd_buf_free(&b);
    } else {
      json_decref(out);
      return api_check_fail(v, param, "'%s.content' must be a string or a list of text parts, got %s", param,
                            api_json_type(content));
    }
    json_t *msg = json_pack("{s:O, s:o}", "role", role, "content", text);
    json_t *name = json_object_get(e, "name");
    if (json_is_string(name)) json_object_set(msg, "name", name);
    json_array_append_new(out, msg);
    if (!oai_check_message_tools(v, param, e, msg)) {
      json_decref(out);
      return false;
    }
  }
  o->messages = out;
  o->n_prompts = 1; /* the rendered template */
  o->prompts = servd_arena_calloc(v->arena, sizeof(oai_prompt));
  if (!o->prompts) return api_check_fail(v, NULL, "out of memory");
  return true;
}

/* POST /v1/embeddings: input, encoding_format, dimensions, user. */
static bool parse_embeddings(api_check *v, oai_params *o, json_t *body, const api_param_limits *lim) {
  if (!parse_prompt(v, o, body, "input", OAI_MAX_EMBEDDING_INPUTS)) return false;
  for (int i = 0; i < o->n_prompts; i++)
    if (o->prompts[i].text && !o->prompts[i].text[0])
      return api_check_fail(v, "input", "'input' must not hold an empty string (input %d is)", i);
  o->add_special = true;
  o->gp.embed = true;
  json_t *f = api_check_field(body, "encoding_format");
  if (f && (!json_is_string(f) || (strcmp(json_string_value(f), "float") && strcmp(json_string_value(f), "base64"))))
    return api_check_fail(v, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
  o->base64 = f && !strcmp(json_string_value(f), "base64");
  bool present;
  long long x = 0;
  if (!api_check_int(v, body, "dimensions", 1, 1 << 20, &present, &x)) return false;
  if (present) o->gp.dimensions = (int)x;
  if (!api_check_int(v, body, "truncate_prompt_tokens", -1, 1 << 24, &present, &x)) return false;
  if (present && x == 0)
    return api_check_fail(v, "truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 or at least 1");
  if (present) o->truncate_prompt_tokens = (int)x;
  if (api_params_adopt(body, API_ADOPT_DEADLINE | API_ADOPT_PRIORITY, "", lim, v->arena, &o->gp, v->err) != 0)
    return v->failed = true, false;
  json_t *user = api_check_field(body, "user");
  if (user && !json_is_string(user)) return api_check_fail(v, "user", "'user' must be a string");
  return true;
}

static bool unsupported(api_check *v, json_t *body, const char *key, const char *why) {
  json_t *j = api_check_field(body, key);
  if (!j) return true;
  return api_check_fail(v, key, "'%s' is not supported: %s", key, why);
}

/* chat_template_kwargs (vLLM's): extra variables for the chat template, such as Qwen3's
 * enable_thinking; the template's own variables (messages, tools, ...) are not replaced by them. */
static bool parse_template_kwargs(api_check *v, json_t *body, oai_params *o) {
  json_t *k = api_check_field(body, "chat_template_kwargs");
  if (!k) return true;
  if (!json_is_object(k))
    return api_check_fail(v, "chat_template_kwargs", "'chat_template_kwargs' must be an object, got %s",
                          api_json_type(k));
  if (!api_json_depth_ok(k, API_MAX_SCHEMA_DEPTH))
    return api_check_fail(v, "chat_template_kwargs", "'chat_template_kwargs' nests deeper than %d levels",
                          API_MAX_SCHEMA_DEPTH);
  o->template_kwargs = json_incref(k);
  return true;
}

static bool parse(api_check *v, json_t *body, oai_mode mode, const api_param_limits *lim, oai_params *o) {
  if (!json_is_object(body))
    return api_check_fail(v, NULL, "the request body must be a JSON object, got %s", api_json_type(body));
  o->gp = lim->defaults;
  o->logprobs = -1;
  o->n = 1;

  if (mode == OAI_DETOKENIZE) {
    json_t *t = api_check_field(body, "tokens");
    if (!t || !json_is_array(t)) return api_check_fail(v, "tokens", "'tokens' must be a list of token ids");
    o->n_prompts = 1;
    o->prompts = servd_arena_calloc(v->arena, sizeof(oai_prompt));
    if (!o->prompts) return api_check_fail(v, NULL, "out of memory");
    if (json_array_size(t) == 0) return true;
    return parse_ids(v, "tokens", t, &o->prompts[0].ids, &o->prompts[0].n_ids);
  }
  if (mode == OAI_TOKENIZE) {
    o->add_special = true;
    o->add_generation_prompt = true;
    if (api_check_field(body, "messages")) {
      o->add_special = false;
      /* With tools, as vLLM's chat /tokenize: the prompt the template renders with them. */
      if (!parse_messages(v, o, body) || !oai_parse_tools(v, body, o) || !parse_template_kwargs(v, body, o))
        return false;
    } else if (!parse_prompt(v, o, body, "prompt", 64)) {
      return false;
    }
    /* Checked even with a prompt, where it has no effect: a documented field is never taken unchecked. */
    if (!api_check_bool(v, body, "add_generation_prompt", &o->add_generation_prompt)) return false;
    if (!api_check_bool(v, body, "add_special_tokens", &o->add_special)) return false;
    if (o->n_prompts > 1) return api_check_fail(v, "prompt", "/tokenize takes one prompt");
    return true;
  }

  if (mode == OAI_EMBEDDINGS) return parse_embeddings(v, o, body, lim);
  bool chat = mode == OAI_CHAT;
  if (chat ? !parse_messages(v, o, body) : !parse_prompt(v, o, body, "prompt", 64)) return false;
  o->add_special = !chat; /* chat templates write their own special tokens */
  o->add_generation_prompt = true;
  bool present;
  long long x = 0;
  json_t *echo = chat ? NULL : api_check_field(body, "echo");
  if (echo && !json_is_boolean(echo)) return api_check_fail(v, "echo", "'echo' must be a boolean");
  o->echo = json_is_true(echo);
  /* max_tokens 0 with echo: the prompt and its logprobs only (lm-eval-harness' loglikelihood). */
  json_t *mt = api_check_field(body, "max_tokens");
  json_t *adopt = body;
  if (o->echo && json_is_integer(mt) && json_integer_value(mt) == 0) {
    o->gp.prompt_only = true;
    adopt = json_copy(body);
    json_object_del(adopt, "max_tokens");
  }
  int arc = api_params_adopt(adopt, API_ADOPT_SAMPLING | API_ADOPT_DEADLINE | API_ADOPT_PRIORITY, "", lim, v->arena,
                             &o->gp, v->err);
  if (adopt != body) json_decref(adopt);
  if (arc != 0) return v->failed = true, false;
  if (!api_check_int(v, body, "n", 1, lim->max_n, &present, &x)) return false;
  if (present) o->n = (int)x;
  json_t *best_of = api_check_field(body, "best_of");
  if (best_of && (!json_is_integer(best_of) || json_integer_value(best_of) != o->n))
    return api_check_fail(v, "best_of", "'best_of' is not supported (only best_of == n)");
  if (!api_check_bool(v, body, "stream", &o->stream)) return false;
  json_t *so = api_check_field(body, "stream_options");
  if (so) {
    if (!json_is_object(so)) return api_check_fail(v, "stream_options", "'stream_options' must be an object");
    if (!o->stream)
      return api_check_fail(v, "stream_options", "'stream_options' is only allowed when 'stream' is true");
    v->where = "stream_options.";
    bool ok = api_check_bool(v, so, "include_usage", &o->include_usage);
    v->where = "";
    if (!ok) return false;
  }
  if (chat) {
    bool lp = false;
    if (!api_check_bool(v, body, "logprobs", &lp)) return false;
    if (!api_check_int(v, body, "top_logprobs", 0, MAX_TOP_LOGPROBS, &present, &x)) return false;
    if (present && !lp) return api_check_fail(v, "top_logprobs", "'top_logprobs' requires 'logprobs': true");
    if (lp) o->logprobs = present ? (int)x : 0;
  } else {
    json_t *lp = api_check_field(body, "logprobs");
    if (lp && json_is_boolean(lp))
      return api_check_fail(v, "logprobs",
                            "'logprobs' must be an integer in [0, %d] for "
                            "completions",
                            MAX_TOP_LOGPROBS);
    if (!api_check_int(v, body, "logprobs", 0, MAX_TOP_LOGPROBS, &present, &x)) return false;
    if (present) o->logprobs = (int)x;
    o->gp.prompt_logprobs = o->echo && o->logprobs >= 0;
    if (!unsupported(v, body, "suffix", "insertion is not supported")) return false;
  }
  o->gp.logprobs = o->logprobs;
  if (!chat && (!unsupported(v, body, "tools", "tool calling is for /v1/chat/completions") ||
                !unsupported(v, body, "tool_choice", "tool calling is for /v1/chat/completions") ||
                !unsupported(v, body, "functions", "function calling is for /v1/chat/completions") ||
                !unsupported(v, body, "function_call", "function calling is for /v1/chat/completions")))
    return false;
  /* echo is vLLM's chat extension that servd refuses; completions take OpenAI's echo (above). */
  json_t *refusable = echo ? json_copy(body) : json_incref(body);
  if (echo) json_object_del(refusable, "echo");
  bool refused = !oai_refuse_unimplemented(v, refusable);
  json_decref(refusable);
  if (refused || !oai_parse_guided(v, body, o)) return false;
  if (chat && (!oai_parse_tools(v, body, o) || !parse_template_kwargs(v, body, o))) return false;
  if (!chat && !unsupported(v, body, "chat_template_kwargs", "chat template arguments are for chat requests"))
    return false;
  if (chat && !api_check_bool(v, body, "add_generation_prompt", &o->add_generation_prompt)) return false;
  json_t *user = api_check_field(body, "user");
  if (user && !json_is_string(user)) return api_check_fail(v, "user", "'user' must be a string");
  if ((long long)o->n * o->n_prompts > 256)
    return api_check_fail(v, "n", "n times the number of prompts must be at most 256");
  return true;
}

int oai_params_parse(json_t *body, oai_mode mode, const api_param_limits *lim, servd_arena *arena, oai_params *out,
                     api_param_error *err) {
  memset(out, 0, sizeof(*out));
  memset(err, 0, sizeof(*err));
  api_check v = {err, arena, "", false};
  if (parse(&v, body, mode, lim, out)) return 0;
  oai_params_free(out);
  return -1;
}

int oai_params_parse_text(const char *text, size_t len, oai_mode mode, const api_param_limits *lim, servd_arena *arena,
                          oai_params *out, api_param_error *err) {
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
  json_decref(p->template_kwargs);
  oai_tools_free(p->tools);
  memset(p, 0, sizeof(*p));
}
