/* Validation of /v1/responses bodies and their translation into the equivalent chat completions
 * body, which the chat parser (openai_params.c) then checks like any other: sampling fields keep
 * their names, so only what the Responses API shapes differently is checked here. No server state. */
#include <stdio.h>
#include <string.h>

#include "api/params_check.h"
#include "api/responses.h"
#include "http/buf.h"

/* Fields of the Responses API that servd takes, and servd's sampling extensions (as on chat). */
static const char *const known[] = {
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "stream",
    "store",
    "metadata",
    "user",
    "previous_response_id",
    "seed",
    "top_k",
    "min_p",
    "ignore_eos",
    "stop",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "chat_template_kwargs",
    "guided_regex",
};

/* Copied into the chat body as they are: the chat parser checks them under the same names. */
static const char *const passed[] = {
    "model",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "stream",
    "seed",
    "top_k",
    "min_p",
    "ignore_eos",
    "stop",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "chat_template_kwargs",
    "guided_regex",
};

static bool is_one_of(const char *s, const char *const *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(s, set[i])) return true;
  return false;
}

/* Text content: a string, or a list of input_text / output_text parts (output items sent back). */
static json_t *content_text(api_check *v, const char *param, json_t *content) {
  if (json_is_string(content)) return json_incref(content);
  if (!json_is_array(content)) {
    api_check_fail(v, param, "'%s' must be a string or a list of input_text parts, got %s", param,
                   api_json_type(content));
    return NULL;
  }
  servd_buf b;
  servd_buf_init(&b);
  for (size_t k = 0; k < json_array_size(content); k++) {
    json_t *part = json_array_get(content, k);
    const char *type = json_string_value(json_object_get(part, "type"));
    json_t *t = json_object_get(part, "text");
    if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text")) || !json_is_string(t)) {
      servd_buf_free(&b);
      api_check_fail(v, param,
                     "'%s'[%zu] must be {\"type\": \"input_text\", \"text\": string}; only text content is "
                     "supported",
                     param, k);
      return NULL;
    }
    servd_buf_append(&b, json_string_value(t), json_string_length(t));
  }
  json_t *s = b.oom ? NULL : json_stringn(b.data ? b.data : "", b.len);
  servd_buf_free(&b);
  if (!s) api_check_fail(v, param, "'%s' is not valid UTF-8 text", param);
  return s;
}

static bool str_field(api_check *v, json_t *e, const char *param, const char *key, json_t **out) {
  *out = json_object_get(e, key);
  if (json_is_string(*out)) return true;
  return api_check_fail(v, param, "'%s.%s' must be a string", param, key);
}

/* One input item appended to msgs as chat messages. Function calls join the assistant message
 * before them, as chat carries a turn's calls in one message. */
static bool input_item(api_check *v, json_t *msgs, json_t *e, size_t i) {
  char param[48];
  snprintf(param, sizeof param, "input[%zu]", i);
  if (!json_is_object(e)) return api_check_fail(v, param, "'%s' must be an object, got %s", param, api_json_type(e));
  json_t *jt = api_check_field(e, "type");
  const char *type = jt ? json_string_value(jt) : "message";
  if (!type) return api_check_fail(v, param, "'%s.type' must be a string", param);
  if (!strcmp(type, "message")) {
    static const char *const roles[] = {"user", "assistant", "system", "developer"};
    const char *role = json_string_value(json_object_get(e, "role"));
    if (!role || !is_one_of(role, roles, 4))
      return api_check_fail(v, param, "'%s.role' must be one of user, assistant, system, developer", param);
    char cp[64];
    snprintf(cp, sizeof cp, "%s.content", param);
    json_t *text = content_text(v, cp, json_object_get(e, "content"));
    if (!text) return false;
    return json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", role, "content", text)) == 0 ||
           api_check_fail(v, NULL, "out of memory");
  }
  if (!strcmp(type, "function_call")) {
    json_t *name, *args, *call_id;
    if (!str_field(v, e, param, "name", &name) || !str_field(v, e, param, "arguments", &args) ||
        !str_field(v, e, param, "call_id", &call_id))
      return false;
    json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function", "function", "name", name,
                             "arguments", args);
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    if (!last || strcmp(json_string_value(json_object_get(last, "role")), "assistant")) {
      last = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
      json_array_append_new(msgs, last);
    }
    json_t *calls = json_object_get(last, "tool_calls");
    if (!calls) json_object_set_new(last, "tool_calls", calls = json_array());
    return json_array_append_new(calls, call) == 0 || api_check_fail(v, NULL, "out of memory");
  }
  if (!strcmp(type, "function_call_output")) {
    json_t *call_id;
    if (!str_field(v, e, param, "call_id", &call_id)) return false;
    char op[64];
    snprintf(op, sizeof op, "%s.output", param);
    json_t *out = content_text(v, op, json_object_get(e, "output"));
    if (!out) return false;
    return json_array_append_new(
               msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", call_id, "content", out)) == 0 ||
           api_check_fail(v, NULL, "out of memory");
  }
  return api_check_fail(v, param, "'%s.type' must be message, function_call or function_call_output, got \"%s\"", param,
                        type);
}

static bool parse_input(api_check *v, json_t *body, json_t *chat) {
  json_t *in = api_check_field(body, "input");
  if (!in) return api_check_fail(v, "input", "'input' is required: a string or a list of input items");
  json_t *msgs = json_array();
  json_object_set_new(chat, "messages", msgs);
  json_t *ins = api_check_field(body, "instructions");
  if (ins && !json_is_string(ins)) return api_check_fail(v, "instructions", "'instructions' must be a string");
  if (ins) json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
  if (json_is_string(in)) {
    json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", in));
    return true;
  }
  if (!json_is_array(in) || json_array_size(in) == 0)
    return api_check_fail(v, "input", "'input' must be a string or a non-empty list of input items, got %s",
                          json_is_array(in) ? "an empty list" : api_json_type(in));
  if (json_array_size(in) > 4096) return api_check_fail(v, "input", "too many input items (%zu)", json_array_size(in));
  for (size_t i = 0; i < json_array_size(in); i++)
    if (!input_item(v, msgs, json_array_get(in, i), i)) return false;
  return true;
}

/* Function tools {type, name, description, parameters, strict} into chat's {type, function: {...}}. */
static bool parse_tools(api_check *v, json_t *body, json_t *chat, json_t *echo) {
  json_t *tools = api_check_field(body, "tools");
  json_object_set_new(echo, "tools", tools ? json_incref(tools) : json_array());
  if (!tools) return true;
  if (!json_is_array(tools)) return api_check_fail(v, "tools", "'tools' must be a list of function tools");
  json_t *out = json_array();
  json_object_set_new(chat, "tools", out);
  for (size_t i = 0; i < json_array_size(tools); i++) {
    json_t *t = json_array_get(tools, i);
    char param[48];
    snprintf(param, sizeof param, "tools[%zu]", i);
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!json_is_object(t) || !type || strcmp(type, "function"))
      return api_check_fail(v, param,
                            "'%s' must be a function tool {\"type\": \"function\", \"name\", ...}; servd has "
                            "no built-in tools",
                            param);
    json_t *fn = json_object();
    const char *keys[] = {"name", "description", "parameters", "strict"};
    for (size_t k = 0; k < 4; k++)
      if (api_check_field(t, keys[k])) json_object_set(fn, keys[k], json_object_get(t, keys[k]));
    json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
  }
  return true;
}

static bool parse_tool_choice(api_check *v, json_t *body, json_t *chat, json_t *echo) {
  json_t *tc = api_check_field(body, "tool_choice");
  json_object_set_new(echo, "tool_choice", tc ? json_incref(tc) : json_string("auto"));
  if (!tc || json_is_string(tc)) { /* "none", "auto", "required": the chat parser checks the value */
    if (tc) json_object_set(chat, "tool_choice", tc);
    return true;
  }
  const char *type = json_string_value(json_object_get(tc, "type"));
  json_t *name = json_object_get(tc, "name");
  if (!json_is_object(tc) || !type || strcmp(type, "function") || !json_is_string(name))
    return api_check_fail(v, "tool_choice",
                          "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                          "{\"type\": \"function\", \"name\": string}");
  json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
  return true;
}

/* text.format onto chat's response_format (structured outputs). */
static bool parse_text(api_check *v, json_t *body, json_t *chat, json_t *echo) {
  json_t *text = api_check_field(body, "text");
  if (!text) {
    json_object_set_new(echo, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    return true;
  }
  if (!json_is_object(text)) return api_check_fail(v, "text", "'text' must be an object {\"format\": {...}}");
  const char *key;
  json_t *val;
  json_object_foreach(text, key, val) {
    if (strcmp(key, "format") && !json_is_null(val)) {
      char param[48];
      snprintf(param, sizeof param, "text.%.40s", key);
      return api_check_fail(v, param, "'%s' is not supported", param);
    }
  }
  json_object_set(echo, "text", text);
  json_t *f = api_check_field(text, "format");
  if (!f) return true;
  const char *type = json_string_value(json_object_get(f, "type"));
  if (!json_is_object(f) || !type)
    return api_check_fail(v, "text.format",
                          "'text.format' must be an object with 'type': text, json_object or "
                          "json_schema");
  if (!strcmp(type, "text")) return true;
  if (!strcmp(type, "json_object")) {
    json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
    return true;
  }
  if (strcmp(type, "json_schema"))
    return api_check_fail(v, "text.format.type",
                          "'text.format.type' must be text, json_object or json_schema, got "
                          "\"%s\"",
                          type);
  json_t *name = json_object_get(f, "name"), *schema = json_object_get(f, "schema");
  if (!json_is_string(name)) return api_check_fail(v, "text.format.name", "'text.format.name' must be a string");
  if (!json_is_object(schema))
    return api_check_fail(v, "text.format.schema", "'text.format.schema' must be a JSON schema (an object)");
  json_t *js = json_pack("{s:O, s:O}", "name", name, "schema", schema);
  const char *opt[] = {"strict", "description"};
  for (size_t k = 0; k < 2; k++)
    if (api_check_field(f, opt[k])) json_object_set(js, opt[k], json_object_get(f, opt[k]));
  json_object_set_new(chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
  return true;
}

static bool parse(api_check *v, json_t *body, json_t *chat, json_t *echo) {
  if (!json_is_object(body))
    return api_check_fail(v, NULL, "the request body must be a JSON object, got %s", api_json_type(body));
  const char *key;
  json_t *val;
  json_object_foreach(body, key, val) {
    if (!is_one_of(key, known, sizeof known / sizeof known[0])) {
      char param[48];
      snprintf(param, sizeof param, "%.47s", key);
      return api_check_fail(v, param, "'%s' is not a field servd's /v1/responses takes", param);
    }
    if (is_one_of(key, passed, sizeof passed / sizeof passed[0])) json_object_set(chat, key, val);
  }
  if (api_check_field(body, "previous_response_id"))
    return api_check_fail(v, "previous_response_id",
                          "'previous_response_id' is not supported: servd keeps no "
                          "responses; send the whole conversation in 'input'");
  bool store = false;
  if (!api_check_bool(v, body, "store", &store)) return false;
  json_t *md = api_check_field(body, "metadata");
  if (md && !json_is_object(md)) return api_check_fail(v, "metadata", "'metadata' must be an object of strings");
  json_object_foreach(md, key, val) if (!json_is_string(val)) return api_check_fail(
      v, "metadata", "'metadata' must be an object of strings");
  bool present;
  long long max = 0;
  if (!api_check_int(v, body, "max_output_tokens", 1, 1 << 30, &present, &max)) return false;
  if (present) json_object_set_new(chat, "max_tokens", json_integer(max));
  if (!parse_input(v, body, chat) || !parse_tools(v, body, chat, echo) || !parse_tool_choice(v, body, chat, echo) ||
      !parse_text(v, body, chat, echo))
    return false;
  /* What the response object repeats; store is false whatever was asked: nothing is kept. */
  static const char *const repeated[] = {"instructions", "max_output_tokens", "temperature", "top_p", "user"};
  for (size_t k = 0; k < sizeof repeated / sizeof repeated[0]; k++) {
    json_t *j = json_object_get(body, repeated[k]);
    json_object_set_new(echo, repeated[k], j ? json_incref(j) : json_null());
  }
  json_t *ptc = json_object_get(body, "parallel_tool_calls");
  json_object_set_new(echo, "parallel_tool_calls", json_boolean(!json_is_false(ptc)));
  json_object_set_new(echo, "metadata", md ? json_incref(md) : json_object());
  json_object_set_new(echo, "store", json_false());
  return true;
}

int resp_params_parse(json_t *body, resp_request *out, api_param_error *err) {
  memset(out, 0, sizeof *out);
  memset(err, 0, sizeof *err);
  api_check v = {err, NULL, "", false};
  out->chat = json_object();
  out->echo = json_object();
  if (out->chat && out->echo && parse(&v, body, out->chat, out->echo)) return 0;
  if (!v.failed) api_check_fail(&v, NULL, "out of memory");
  resp_request_free(out);
  return -1;
}

void resp_request_free(resp_request *q) {
  if (!q) return;
  json_decref(q->chat);
  json_decref(q->echo);
  memset(q, 0, sizeof *q);
}

void resp_param_name(const char *p, char *out, size_t cap) {
  size_t n;
  if (!strncmp(p, "messages", 8)) {
    snprintf(out, cap, "input");
  } else if (!strcmp(p, "max_tokens") || !strcmp(p, "max_completion_tokens")) {
    snprintf(out, cap, "max_output_tokens");
  } else if (!strncmp(p, "response_format", 15)) {
    snprintf(out, cap, "text.format");
  } else if (!strncmp(p, "tools[", 6) && (n = strcspn(p, "]")) && !strncmp(p + n, "].function", 10)) {
    snprintf(out, cap, "%.*s]%s", (int)n, p, p + n + 10);
  } else {
    snprintf(out, cap, "%s", p);
  }
}
