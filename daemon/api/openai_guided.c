/* The OpenAI request fields of constrained decoding (response_format json_object / json_schema,
 * vLLM's guided_* and structured_outputs), and the refusal of the fields servd does not implement:
 * a field a client sets expecting an effect is a 400 naming it, never silently ignored. */
#include <stdlib.h>
#include <string.h>

#include "api/openai_guided.h"

#define MAX_CHOICES 1024

/* A constraint's text, kept in the arena. A JSON value is written out as compact JSON text. */
static bool set_guide(api_check *v, oai_params *o, const char *param, servd_guide_kind kind, json_t *spec) {
  if (o->guide_kind != SERVD_GUIDE_NONE)
    return api_check_fail(v, param, "'%s' and '%s' both constrain the output: give one of them", o->guide_param, param);
  if (!api_json_depth_ok(spec, API_MAX_SCHEMA_DEPTH))
    return api_check_fail(v, param, "'%s' nests deeper than %d levels (use \"$defs\" and \"$ref\" for deep structures)",
                          param, API_MAX_SCHEMA_DEPTH);
  char *text = NULL;
  if (json_is_string(spec)) {
    text = servd_arena_strndup(v->arena, json_string_value(spec), json_string_length(spec));
  } else {
    char *dump = json_dumps(spec, JSON_COMPACT | JSON_ENCODE_ANY);
    if (dump) text = servd_arena_strdup(v->arena, dump);
    free(dump);
  }
  if (!text) return api_check_fail(v, NULL, "out of memory");
  o->guide_kind = kind;
  o->guide_spec = text;
  o->guide_param = param;
  return true;
}

static bool set_json_object(api_check *v, oai_params *o, const char *param) {
  json_t *empty = json_string("");
  bool ok = set_guide(v, o, param, SERVD_GUIDE_JSON_OBJECT, empty);
  json_decref(empty);
  return ok;
}

static bool parse_json_schema(api_check *v, oai_params *o, json_t *rf) {
  json_t *js = json_object_get(rf, "json_schema");
  if (!json_is_object(js))
    return api_check_fail(v, "response_format.json_schema",
                          "'response_format.json_schema' must be an object with "
                          "'name' and 'schema' for type \"json_schema\", got %s",
                          js ? api_json_type(js) : "nothing");
  json_t *name = api_check_field(js, "name");
  if (name && !json_is_string(name))
    return api_check_fail(v, "response_format.json_schema.name", "'response_format.json_schema.name' must be a string");
  json_t *strict = api_check_field(js, "strict");
  if (strict && !json_is_boolean(strict))
    return api_check_fail(v, "response_format.json_schema.strict",
                          "'response_format.json_schema.strict' must be a boolean");
  json_t *schema = api_check_field(js, "schema");
  if (!schema) /* OpenAI's default: any JSON object */
    return set_json_object(v, o, "response_format");
  if (!json_is_object(schema))
    return api_check_fail(v, "response_format.json_schema.schema",
                          "'response_format.json_schema.schema' must be a JSON Schema object, got %s",
                          api_json_type(schema));
  /* strict or not, the schema is enforced exactly: constrained decoding cannot be lenient. */
  return set_guide(v, o, "response_format", SERVD_GUIDE_JSON_SCHEMA, schema);
}

static bool parse_response_format(api_check *v, oai_params *o, json_t *body) {
  json_t *rf = api_check_field(body, "response_format");
  if (!rf) return true;
  json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
  if (!json_is_string(t))
    return api_check_fail(v, "response_format",
                          "'response_format' must be an object with a 'type' (\"text\", "
                          "\"json_object\" or \"json_schema\")");
  const char *type = json_string_value(t);
  if (!strcmp(type, "text")) return true;
  if (!strcmp(type, "json_object")) return set_json_object(v, o, "response_format");
  if (!strcmp(type, "json_schema")) return parse_json_schema(v, o, rf);
  return api_check_fail(v, "response_format.type",
                        "'response_format.type' must be \"text\", \"json_object\" or "
                        "\"json_schema\", got \"%s\"",
                        type);
}

static bool parse_choice(api_check *v, oai_params *o, const char *param, json_t *c) {
  size_t n = json_array_size(c);
  if (!json_is_array(c) || n == 0 || n > MAX_CHOICES)
    return api_check_fail(v, param, "'%s' must be a list of 1 to %d strings", param, MAX_CHOICES);
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(c, i);
    if (!json_is_string(e) || json_string_length(e) == 0)
      return api_check_fail(v, param, "'%s'[%zu] must be a non-empty string", param, i);
  }
  return set_guide(v, o, param, SERVD_GUIDE_CHOICE, c);
}

/* One constraint field: guided_json / structured_outputs.json and the like. */
static bool parse_one(api_check *v, oai_params *o, json_t *obj, const char *key, const char *param) {
  json_t *j = api_check_field(obj, key);
  if (!j) return true;
  if (!strcmp(key, "json") || !strcmp(key, "guided_json")) {
    if (json_is_string(j)) {
      json_error_t e;
      json_t *parsed = json_loads(json_string_value(j), 0, &e);
      bool obj_ok = json_is_object(parsed), deep = obj_ok && !api_json_depth_ok(parsed, API_MAX_SCHEMA_DEPTH);
      json_decref(parsed);
      if (!obj_ok) return api_check_fail(v, param, "'%s' must be a JSON Schema (an object, or its JSON text)", param);
      if (deep)
        return api_check_fail(v, param,
                              "'%s' nests deeper than %d levels (use \"$defs\" and \"$ref\" for deep structures)",
                              param, API_MAX_SCHEMA_DEPTH);
    } else if (!json_is_object(j)) {
      return api_check_fail(v, param, "'%s' must be a JSON Schema (an object, or its JSON text), got %s", param,
                            api_json_type(j));
    }
    return set_guide(v, o, param, SERVD_GUIDE_JSON_SCHEMA, j);
  }
  if (!strcmp(key, "choice") || !strcmp(key, "guided_choice")) return parse_choice(v, o, param, j);
  if (!json_is_string(j) || json_string_length(j) == 0)
    return api_check_fail(v, param, "'%s' must be a non-empty string", param);
  bool regex = !strcmp(key, "regex") || !strcmp(key, "guided_regex");
  return set_guide(v, o, param, regex ? SERVD_GUIDE_REGEX : SERVD_GUIDE_GRAMMAR, j);
}

static bool parse_structured_outputs(api_check *v, oai_params *o, json_t *body) {
  json_t *so = api_check_field(body, "structured_outputs");
  if (!so) return true;
  if (!json_is_object(so)) return api_check_fail(v, "structured_outputs", "'structured_outputs' must be an object");
  static const char *const known[] = {"json", "regex", "choice", "grammar", "json_object"};
  const char *key;
  json_t *val;
  json_object_foreach(so, key, val) {
    bool ok = false;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok |= !strcmp(key, known[i]);
    if (!ok && !json_is_null(val))
      return api_check_fail(v, "structured_outputs",
                            "'structured_outputs.%s' is not supported (supported: json, "
                            "regex, choice, grammar, json_object)",
                            key);
  }
  if (!parse_one(v, o, so, "json", "structured_outputs.json") ||
      !parse_one(v, o, so, "regex", "structured_outputs.regex") ||
      !parse_one(v, o, so, "choice", "structured_outputs.choice") ||
      !parse_one(v, o, so, "grammar", "structured_outputs.grammar"))
    return false;
  json_t *jo = api_check_field(so, "json_object");
  if (jo && !json_is_boolean(jo))
    return api_check_fail(v, "structured_outputs.json_object", "'structured_outputs.json_object' must be a boolean");
  return json_is_true(jo) ? set_json_object(v, o, "structured_outputs.json_object") : true;
}

bool oai_parse_guided(api_check *v, json_t *body, oai_params *o) {
  if (!parse_response_format(v, o, body) || !parse_one(v, o, body, "guided_json", "guided_json") ||
      !parse_one(v, o, body, "guided_regex", "guided_regex") ||
      !parse_one(v, o, body, "guided_choice", "guided_choice") ||
      !parse_one(v, o, body, "guided_grammar", "guided_grammar") || !parse_structured_outputs(v, o, body))
    return false;
  json_t *backend = api_check_field(body, "guided_decoding_backend");
  if (backend) {
    const char *b = json_string_value(backend);
    if (!b || (strcmp(b, "llguidance") && strcmp(b, "guidance") && strcmp(b, "auto")))
      return api_check_fail(v, "guided_decoding_backend",
                            "'guided_decoding_backend' must be \"llguidance\" (the "
                            "one servd has) or \"auto\"");
  }
  return true;
}

/* ---- fields servd does not implement ---------------------------------------------------------- */

/* What value of a field is the behaviour servd has anyway (then it is accepted). */
typedef enum { OK_NONE, OK_FALSE, OK_TRUE, OK_ZERO, OK_ONE, OK_LIST_TEXT } ok_value;

static const struct {
  const char *key;
  ok_value ok;
  const char *what;
} refused[] = {
    /* vLLM extensions */
    {"guided_whitespace_pattern", OK_NONE, "a custom whitespace pattern"},
    {"use_beam_search", OK_FALSE, "beam search"},
    {"length_penalty", OK_ONE, "length penalty (beam search)"},
    {"include_stop_str_in_output", OK_FALSE, "stop strings in the output"},
    {"skip_special_tokens", OK_TRUE, "special tokens in the output"},
    {"spaces_between_special_tokens", OK_TRUE, "special-token spacing"},
    {"truncate_prompt_tokens", OK_NONE, "prompt truncation"},
    {"prompt_logprobs", OK_NONE, "prompt logprobs"},
    {"allowed_token_ids", OK_NONE, "allowed token ids"},
    {"bad_words", OK_NONE, "bad words"},
    {"logits_processors", OK_NONE, "logits processors"},
    {"return_tokens_as_token_ids", OK_FALSE, "tokens as token ids"},
    {"return_token_ids", OK_FALSE, "token ids in the response"},
    {"echo", OK_FALSE, "echoing the prompt"},
    {"continue_final_message", OK_FALSE, "continuing the final message"},
    {"chat_template", OK_NONE, "a request's own chat template"},
    {"documents", OK_NONE, "documents"},
    {"mm_processor_kwargs", OK_NONE, "multimodal inputs"},
    {"kv_transfer_params", OK_NONE, "KV transfer"},
    {"vllm_xargs", OK_NONE, "vllm_xargs"},
    /* OpenAI fields */
    {"prediction", OK_NONE, "predicted outputs"},
    {"audio", OK_NONE, "audio output"},
    {"modalities", OK_LIST_TEXT, "modalities other than text"},
    {"reasoning_effort", OK_NONE, "reasoning effort"},
    {"web_search_options", OK_NONE, "web search"},
    {"store", OK_FALSE, "stored completions"},
};

static bool is_ok(json_t *j, ok_value ok) {
  long long x;
  switch (ok) {
  case OK_FALSE: return json_is_false(j);
  case OK_TRUE: return json_is_true(j);
  case OK_ZERO: return api_check_as_int(j, &x) && x == 0;
  case OK_ONE: return json_is_number(j) && json_number_value(j) == 1.0;
  case OK_LIST_TEXT:
    return json_is_array(j) && json_array_size(j) == 1 && json_is_string(json_array_get(j, 0)) &&
           !strcmp(json_string_value(json_array_get(j, 0)), "text");
  default: return false;
  }
}

bool oai_refuse_unimplemented(api_check *v, json_t *body) {
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    json_t *j = api_check_field(body, refused[i].key);
    if (j && !is_ok(j, refused[i].ok))
      return api_check_fail(v, refused[i].key, "'%s' is not supported: servd does not implement %s", refused[i].key,
                            refused[i].what);
  }
  return true;
}
