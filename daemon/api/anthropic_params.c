/* Validation of /v1/messages and /v1/messages/count_tokens bodies and their translation into the
 * equivalent chat completions (or /tokenize) body, which the chat parser (openai_params.c) then
 * checks like any other: sampling fields keep their names, so only what Anthropic shapes differently
 * is checked here. No server state. */
#include <stdio.h>
#include <string.h>

#include "api/anthropic.h"
#include "api/params_check.h"
#include "http/buf.h"

/* Fields of the Messages API that servd takes, and servd's sampling extensions (as on chat). */
static const char *const known[] = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "stream",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
    "seed",
    "ignore_eos",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "output_config",
    "cache_control",
    "guided_regex",
};

/* Copied into the chat body as they are: the chat parser checks them under the same names. */
static const char *const passed[] = {
    "model",
    "top_p",
    "top_k",
    "stream",
    "seed",
    "ignore_eos",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "guided_regex", /* vLLM's: the output as a regular expression (forces a reply, as in tests) */
};

/* What count_tokens takes. */
static const char *const known_count[] = {"model", "messages", "system", "tools", "tool_choice", "thinking"};

static bool is_one_of(const char *s, const char *const *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(s, set[i])) return true;
  return false;
}

#define N(a) (sizeof(a) / sizeof((a)[0]))

static bool oom(api_check *v) { return api_check_fail(v, NULL, "out of memory"); }

/* A block's type, or a 400: every content block is an object with a string 'type'. */
static const char *block_type(api_check *v, const char *param, json_t *b) {
  const char *t = json_is_object(b) ? json_string_value(json_object_get(b, "type")) : NULL;
  if (!t) api_check_fail(v, param, "'%s' must be a content block: an object with a string 'type'", param);
  return t;
}

static bool no_media(api_check *v, const char *param, const char *type) {
  if (!strcmp(type, "image"))
    return api_check_fail(v, param, "'%s': image content is not supported: the models servd serves take text only",
                          param);
  if (!strcmp(type, "document"))
    return api_check_fail(v, param, "'%s': document content is not supported: send the text as a text block", param);
  return true;
}

/* Text: a string, or a list of text blocks (joined with sep). New reference, NULL on a 400. */
static json_t *text_of(api_check *v, const char *param, json_t *content, const char *sep, const char *what) {
  if (json_is_string(content)) return json_incref(content);
  if (!json_is_array(content))
    return api_check_fail(v, param, "'%s' must be a string or a list of text blocks, got %s", param,
                          api_json_type(content)),
           NULL;
  servd_buf b;
  servd_buf_init(&b);
  for (size_t k = 0; k < json_array_size(content); k++) {
    json_t *blk = json_array_get(content, k);
    char p[96];
    snprintf(p, sizeof p, "%s[%zu]", param, k);
    const char *type = block_type(v, p, blk);
    if (!type || !no_media(v, p, type)) return servd_buf_free(&b), NULL;
    json_t *t = json_object_get(blk, "text");
    if (strcmp(type, "text") || !json_is_string(t)) {
      servd_buf_free(&b);
      api_check_fail(v, p, "'%s' must be {\"type\": \"text\", \"text\": string}%s, got type \"%.32s\"", p, what, type);
      return NULL;
    }
    if (k > 0) servd_buf_puts(&b, sep);
    servd_buf_append(&b, json_string_value(t), json_string_length(t));
  }
  json_t *s = b.oom ? NULL : json_stringn(b.data ? b.data : "", b.len);
  servd_buf_free(&b);
  if (!s) oom(v);
  return s;
}

static bool str_in(api_check *v, const char *param, json_t *b, const char *key, json_t **out) {
  *out = json_object_get(b, key);
  if (json_is_string(*out)) return true;
  return api_check_fail(v, param, "'%s.%s' is required: a string", param, key);
}

/* A text block's text appended to b; false: the 400 naming p.text. */
static bool text_block(api_check *v, const char *p, json_t *blk, servd_buf *b) {
  json_t *t = json_object_get(blk, "text");
  if (!json_is_string(t)) return api_check_fail(v, p, "'%s.text' is required: a string", p);
  servd_buf_append(b, json_string_value(t), json_string_length(t));
  return true;
}

/* A user message's blocks: tool_result blocks become tool messages (first, in their order), the text
 * blocks one user message. ids: the tool_use ids of the assistant message just before. */
static bool user_blocks(api_check *v, const char *param, json_t *content, json_t *ids, json_t *msgs) {
  servd_buf b;
  servd_buf_init(&b);
  bool any_text = false, ok = true;
  for (size_t k = 0; ok && k < json_array_size(content); k++) {
    json_t *blk = json_array_get(content, k);
    char p[96];
    snprintf(p, sizeof p, "%s.content[%zu]", param, k);
    const char *type = block_type(v, p, blk);
    if (!type || !no_media(v, p, type)) {
      ok = false;
    } else if (!strcmp(type, "text")) {
      ok = any_text = text_block(v, p, blk, &b);
    } else if (!strcmp(type, "tool_result")) {
      json_t *id, *err = api_check_field(blk, "is_error");
      if (!str_in(v, p, blk, "tool_use_id", &id)) {
        ok = false;
      } else if (!json_object_get(ids, json_string_value(id))) {
        ok = api_check_fail(v, p,
                            "'%s.tool_use_id' \"%.64s\" matches no tool_use block of the assistant message just "
                            "before",
                            p, json_string_value(id));
      } else if (err && !json_is_boolean(err)) {
        ok = api_check_fail(v, p, "'%s.is_error' must be a boolean", p);
      } else {
        char cp[112];
        snprintf(cp, sizeof cp, "%s.content", p);
        json_t *c = api_check_field(blk, "content");
        json_t *text = c ? text_of(v, cp, c, "\n", " (a tool result holds text)") : json_string("");
        ok = text && json_array_append_new(
                         msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", text)) == 0;
      }
    } else if (!strcmp(type, "tool_use") || !strcmp(type, "thinking") || !strcmp(type, "redacted_thinking")) {
      ok = api_check_fail(v, p, "'%s': a %s block belongs in an assistant message", p, type);
    } else {
      ok = api_check_fail(v, p, "'%s.type' \"%.32s\" is not a content block type servd takes (text, tool_result)", p,
                          type);
    }
  }
  if (ok && (any_text || json_array_size(content) == 0)) {
    json_t *s = json_stringn(b.data ? b.data : "", b.len);
    ok = s && json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "user", "content", s)) == 0;
    if (!s) oom(v);
  }
  servd_buf_free(&b);
  return ok;
}

/* An assistant message's blocks: text joined, tool_use blocks its tool_calls (their ids into ids),
 * thinking blocks dropped (the template sees the answer, as the model's next turn would). */
static bool assistant_blocks(api_check *v, const char *param, json_t *content, json_t *ids, json_t *msgs) {
  servd_buf b;
  servd_buf_init(&b);
  json_t *calls = json_array();
  bool ok = calls != NULL;
  for (size_t k = 0; ok && k < json_array_size(content); k++) {
    json_t *blk = json_array_get(content, k);
    char p[96];
    snprintf(p, sizeof p, "%s.content[%zu]", param, k);
    const char *type = block_type(v, p, blk);
    if (!type || !no_media(v, p, type)) {
      ok = false;
    } else if (!strcmp(type, "text")) {
      ok = text_block(v, p, blk, &b);
    } else if (!strcmp(type, "tool_use")) {
      json_t *id, *name, *input = json_object_get(blk, "input");
      if (!str_in(v, p, blk, "id", &id) || !str_in(v, p, blk, "name", &name)) {
        ok = false;
      } else if (!json_is_object(input)) {
        ok = api_check_fail(v, p, "'%s.input' is required: an object", p);
      } else {
        char *args = json_dumps(input, JSON_COMPACT);
        json_t *call = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name",
                                        name, "arguments", args)
                            : NULL;
        free(args);
        ok = call && json_array_append_new(calls, call) == 0 && json_object_set(ids, json_string_value(id), id) == 0;
        if (!ok) oom(v);
      }
    } else if (!strcmp(type, "thinking") || !strcmp(type, "redacted_thinking")) {
      continue;
    } else if (!strcmp(type, "tool_result")) {
      ok = api_check_fail(v, p, "'%s': a tool_result block belongs in a user message", p);
    } else {
      ok = api_check_fail(
          v, p, "'%s.type' \"%.32s\" is not a content block type servd takes (text, tool_use, thinking)", p, type);
    }
  }
  if (ok) {
    json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", b.data ? b.data : "", b.len);
    if (m && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    ok = m && json_array_append_new(msgs, m) == 0;
    if (!m) api_check_fail(v, param, "'%s.content' is not valid UTF-8 text", param);
  }
  json_decref(calls);
  servd_buf_free(&b);
  return ok;
}

static bool parse_messages(api_check *v, json_t *body, json_t *chat) {
  json_t *in = api_check_field(body, "messages");
  if (!in) return api_check_fail(v, "messages", "'messages' is required: a non-empty list of {role, content}");
  if (!json_is_array(in) || json_array_size(in) == 0)
    return api_check_fail(v, "messages", "'messages' must be a non-empty list of {role, content}, got %s",
                          json_is_array(in) ? "an empty list" : api_json_type(in));
  if (json_array_size(in) > 4096) return api_check_fail(v, "messages", "too many messages (%zu)", json_array_size(in));
  json_t *msgs = json_array();
  json_object_set_new(chat, "messages", msgs);
  json_t *sys = api_check_field(body, "system");
  if (sys) {
    json_t *s = text_of(v, "system", sys, "\n", "");
    if (!s) return false;
    if (json_string_length(s)) json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content", s));
    else json_decref(s);
  }
  json_t *ids = json_object(); /* the tool_use ids of the last assistant message */
  bool ok = ids != NULL;
  size_t n = json_array_size(in);
  for (size_t i = 0; ok && i < n; i++) {
    json_t *m = json_array_get(in, i);
    char p[48];
    snprintf(p, sizeof p, "messages[%zu]", i);
    const char *role = json_is_object(m) ? json_string_value(json_object_get(m, "role")) : NULL;
    json_t *content = json_is_object(m) ? json_object_get(m, "content") : NULL;
    if (!json_is_object(m)) {
      ok = api_check_fail(v, p, "'%s' must be an object {role, content}, got %s", p, api_json_type(m));
    } else if (!role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
      ok = api_check_fail(v, p, "'%s.role' must be \"user\" or \"assistant\"", p);
    } else if (!json_is_string(content) && !json_is_array(content)) {
      ok = api_check_fail(v, p, "'%s.content' is required: a string or a list of content blocks, got %s", p,
                          api_json_type(content));
    } else if (!strcmp(role, "assistant") && i == n - 1) {
      ok = api_check_fail(v, p,
                          "'%s': a final assistant message (prefill) is not supported: the last message must be the "
                          "user's",
                          p);
    } else if (json_is_string(content)) {
      json_object_clear(ids);
      ok = json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", content)) == 0;
    } else if (!strcmp(role, "user")) {
      ok = user_blocks(v, p, content, ids, msgs);
      json_object_clear(ids);
    } else {
      json_object_clear(ids);
      ok = assistant_blocks(v, p, content, ids, msgs);
    }
  }
  json_decref(ids);
  return ok;
}

/* Client tools {name, description, input_schema} into chat's {type, function: {...}}. */
static bool parse_tools(api_check *v, json_t *body, json_t *chat) {
  json_t *tools = api_check_field(body, "tools");
  if (!tools) return true;
  if (!json_is_array(tools))
    return api_check_fail(v, "tools", "'tools' must be a list of tools, got %s", api_json_type(tools));
  json_t *out = json_array();
  json_object_set_new(chat, "tools", out);
  for (size_t i = 0; i < json_array_size(tools); i++) {
    json_t *t = json_array_get(tools, i);
    char p[48];
    snprintf(p, sizeof p, "tools[%zu]", i);
    if (!json_is_object(t)) return api_check_fail(v, p, "'%s' must be an object {name, description, input_schema}", p);
    json_t *type = api_check_field(t, "type");
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "custom")))
      return api_check_fail(v, p, "'%s.type' must be \"custom\" (or left out): servd runs no server tools (%.40s)", p,
                            json_is_string(type) ? json_string_value(type) : "not a string");
    json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
    if (!json_is_string(name)) return api_check_fail(v, p, "'%s.name' is required: a string", p);
    if (!json_is_object(schema))
      return api_check_fail(v, p, "'%s.input_schema' is required: a JSON Schema object, got %s", p,
                            api_json_type(schema));
    json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
    json_t *desc = api_check_field(t, "description");
    if (desc) json_object_set(fn, "description", desc); /* the chat parser checks its type */
    json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
  }
  return true;
}

/* tool_choice {type: auto | any | tool | none, name, disable_parallel_tool_use}. */
static bool parse_tool_choice(api_check *v, json_t *body, json_t *chat) {
  json_t *tc = api_check_field(body, "tool_choice");
  if (!tc) return true;
  const char *type = json_is_object(tc) ? json_string_value(json_object_get(tc, "type")) : NULL;
  if (!type)
    return api_check_fail(v, "tool_choice",
                          "'tool_choice' must be an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
  json_t *dp = api_check_field(tc, "disable_parallel_tool_use");
  if (dp && !json_is_boolean(dp))
    return api_check_fail(v, "tool_choice", "'tool_choice.disable_parallel_tool_use' must be a boolean");
  if (json_is_true(dp)) json_object_set_new(chat, "parallel_tool_calls", json_false());
  if (!strcmp(type, "auto") || !strcmp(type, "none")) {
    json_object_set_new(chat, "tool_choice", json_string(type));
  } else if (!strcmp(type, "any")) {
    json_object_set_new(chat, "tool_choice", json_string("required"));
  } else if (!strcmp(type, "tool")) {
    json_t *name = json_object_get(tc, "name");
    if (!json_is_string(name))
      return api_check_fail(v, "tool_choice", "'tool_choice.name' is required with type \"tool\": a string");
    json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
  } else {
    return api_check_fail(v, "tool_choice", "'tool_choice.type' must be auto, any, tool or none, got \"%.32s\"", type);
  }
  return true;
}

static bool parse_thinking(api_check *v, json_t *body, long long max_tokens, anth_request *q) {
  json_t *th = api_check_field(body, "thinking");
  if (!th) return true;
  const char *type = json_is_object(th) ? json_string_value(json_object_get(th, "type")) : NULL;
  if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled") && strcmp(type, "adaptive")))
    return api_check_fail(v, "thinking",
                          "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": "
                          "\"adaptive\"} or {\"type\": \"disabled\"}");
  /* The template's switch (Qwen3's and SmolLM3's enable_thinking); absent, the template's default. */
  json_t *chat = q->chat;
  json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", strcmp(type, "disabled")));
  if (!strcmp(type, "disabled")) return true;
  if (!strcmp(type, "adaptive")) return q->thinking = true, true;
  bool present;
  long long budget = 0;
  v->where = "thinking.";
  bool ok = api_check_int(v, th, "budget_tokens", 1024, 1 << 24, &present, &budget);
  v->where = "";
  if (!ok) return false;
  if (!present) return api_check_fail(v, "thinking.budget_tokens", "'thinking.budget_tokens' is required: >= 1024");
  if (max_tokens > 0 && budget >= max_tokens)
    return api_check_fail(v, "thinking.budget_tokens", "'thinking.budget_tokens' must be less than 'max_tokens'");
  q->thinking = true;
  q->thinking_budget = (int)budget;
  return true;
}

/* output_config {format: {type: "json_schema", schema}, effort}: the format is chat's
 * response_format json_schema (structured outputs); effort is accepted (no effect). */
static bool parse_output_config(api_check *v, json_t *body, json_t *chat) {
  json_t *oc = api_check_field(body, "output_config");
  if (!oc) return true;
  if (!json_is_object(oc)) return api_check_fail(v, "output_config", "'output_config' must be an object");
  const char *key;
  json_t *val;
  json_object_foreach(oc, key, val) {
    if (strcmp(key, "format") && strcmp(key, "effort"))
      return api_check_fail(v, "output_config", "'output_config.%.32s' is not supported", key);
  }
  json_t *effort = api_check_field(oc, "effort");
  if (effort && !json_is_string(effort))
    return api_check_fail(v, "output_config.effort", "'output_config.effort' must be a string");
  json_t *f = api_check_field(oc, "format");
  if (!f) return true;
  const char *type = json_is_object(f) ? json_string_value(json_object_get(f, "type")) : NULL;
  json_t *schema = json_is_object(f) ? json_object_get(f, "schema") : NULL;
  if (!type || strcmp(type, "json_schema") || !json_is_object(schema))
    return api_check_fail(v, "output_config.format",
                          "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}");
  json_object_set_new(
      chat, "response_format",
      json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema", "name", "output", "schema", schema));
  return true;
}

static bool parse(api_check *v, json_t *body, bool count, anth_request *q) {
  json_t *chat = q->chat;
  if (!json_is_object(body))
    return api_check_fail(v, NULL, "the request body must be a JSON object, got %s", api_json_type(body));
  const char *key;
  json_t *val;
  json_object_foreach(body, key, val) {
    if (count ? !is_one_of(key, known_count, N(known_count)) : !is_one_of(key, known, N(known))) {
      char param[48];
      snprintf(param, sizeof param, "%.47s", key);
      return api_check_fail(v, param, "'%s' is not a field servd's /v1/messages%s takes", param,
                            count ? "/count_tokens" : "");
    }
    if (!count && is_one_of(key, passed, N(passed))) json_object_set(chat, key, val);
  }
  json_t *model = api_check_field(body, "model");
  if (!json_is_string(model)) return api_check_fail(v, "model", "'model' is required: a string");
  if (count) json_object_set(chat, "model", model);
  bool present = false;
  long long max = 0;
  if (!count) {
    if (!api_check_int(v, body, "max_tokens", 1, 1 << 24, &present, &max)) return false;
    if (!present) return api_check_fail(v, "max_tokens", "'max_tokens' is required: an integer >= 1");
    json_object_set_new(chat, "max_tokens", json_integer(max));
    double t;
    if (!api_check_number(v, body, "temperature", 0, 1, false, &present, &t)) return false;
    if (present) json_object_set_new(chat, "temperature", json_real(t));
    json_t *stop = api_check_field(body, "stop_sequences");
    if (stop && !json_is_array(stop))
      return api_check_fail(v, "stop_sequences", "'stop_sequences' must be a list of strings");
    for (size_t i = 0; i < json_array_size(stop); i++)
      if (!json_is_string(json_array_get(stop, i)))
        return api_check_fail(v, "stop_sequences", "'stop_sequences'[%zu] must be a string", i);
    if (json_array_size(stop)) {
      json_object_set(chat, "stop", stop);
      q->stop = json_incref(stop);
    }
    json_t *md = api_check_field(body, "metadata");
    if (md && !json_is_object(md)) return api_check_fail(v, "metadata", "'metadata' must be an object {user_id}");
    json_t *uid = md ? api_check_field(md, "user_id") : NULL;
    if (uid && !json_is_string(uid))
      return api_check_fail(v, "metadata.user_id", "'metadata.user_id' must be a string");
    json_t *tier = api_check_field(body, "service_tier");
    if (tier && !json_is_string(tier)) return api_check_fail(v, "service_tier", "'service_tier' must be a string");
    json_t *cc = api_check_field(body, "cache_control"); /* servd's prefix cache needs no asking */
    if (cc && !json_is_object(cc)) return api_check_fail(v, "cache_control", "'cache_control' must be an object");
  }
  if (!parse_messages(v, body, chat) || !parse_tools(v, body, chat) || !parse_thinking(v, body, max, q)) return false;
  if (!count) return parse_output_config(v, body, chat) && parse_tool_choice(v, body, chat);
  /* Counting: the prompt as generation would render it; tool_choice none hides the tools. */
  json_t *scratch = json_object();
  bool ok = scratch && parse_tool_choice(v, body, scratch);
  const char *tc = json_string_value(json_object_get(scratch, "tool_choice"));
  if (ok && tc && !strcmp(tc, "none")) json_object_del(chat, "tools");
  json_decref(scratch);
  return ok;
}

int anth_params_parse(json_t *body, bool count, anth_request *out, api_param_error *err) {
  memset(out, 0, sizeof *out);
  memset(err, 0, sizeof *err);
  api_check v = {err, NULL, "", false};
  out->chat = json_object();
  if (out->chat && parse(&v, body, count, out)) return 0;
  if (!v.failed) oom(&v);
  anth_request_free(out);
  return -1;
}

void anth_request_free(anth_request *q) {
  if (!q) return;
  json_decref(q->chat);
  json_decref(q->stop);
  memset(q, 0, sizeof *q);
}

void anth_param_name(const char *p, char *out, size_t cap) {
  size_t n;
  if (!strncmp(p, "messages", 8)) {
    snprintf(out, cap, "messages");
  } else if (!strcmp(p, "stop")) {
    snprintf(out, cap, "stop_sequences");
  } else if (!strcmp(p, "parallel_tool_calls")) {
    snprintf(out, cap, "tool_choice");
  } else if (!strncmp(p, "response_format", 15)) {
    snprintf(out, cap, "output_config.format");
  } else if (!strncmp(p, "tools[", 6) && (n = strcspn(p, "]")) && !strncmp(p + n, "].function", 10)) {
    const char *rest = p + n + 10;
    snprintf(out, cap, "%.*s]%s", (int)n, p, !strcmp(rest, ".parameters") ? ".input_schema" : rest);
  } else {
    snprintf(out, cap, "%s", p);
  }
}
