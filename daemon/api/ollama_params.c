/* Validation of Ollama's /api/chat, /api/generate and /api/embed bodies and their translation into
 * the equivalent OpenAI body, which the OpenAI parser (openai_params.c) then checks like any other.
 * No server state. */
#include <stdio.h>
#include <string.h>

#include "api/ollama.h"
#include "api/params_check.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

static bool is_one_of(const char *s, const char *const *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(s, set[i])) return true;
  return false;
}

/* options: Ollama's name -> the OpenAI field. */
static const struct {
  const char *ollama, *oai;
} option_map[] = {
    {"temperature", "temperature"},
    {"top_k", "top_k"},
    {"top_p", "top_p"},
    {"min_p", "min_p"},
    {"seed", "seed"},
    {"stop", "stop"},
    {"repeat_penalty", "repetition_penalty"},
    {"presence_penalty", "presence_penalty"},
    {"frequency_penalty", "frequency_penalty"},
};

/* Options of llama.cpp's runner that have no meaning in servd: accepted, as Ollama accepts options
 * its runner ignores. Any other option is a 400 naming it. */
static const char *const ignored_options[] = {
    "num_keep",
    "typical_p",
    "repeat_last_n",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "tfs_z",
    "penalize_newline",
    "numa",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "num_thread",
    "f16_kv",
    "logits_all",
    "embedding_only",
    "rope_frequency_base",
    "rope_frequency_scale",
};

static bool parse_options(api_check *v, json_t *body, json_t *out, ollama_request *q) {
  json_t *opt = api_check_field(body, "options");
  if (!opt) return true;
  if (!json_is_object(opt)) return api_check_fail(v, "options", "'options' must be an object");
  const char *key;
  json_t *val;
  json_object_foreach(opt, key, val) {
    char p[64];
    snprintf(p, sizeof p, "options.%.48s", key);
    if (json_is_null(val) || is_one_of(key, ignored_options, N(ignored_options))) continue;
    size_t k = 0;
    while (k < N(option_map) && strcmp(key, option_map[k].ollama)) k++;
    if (k < N(option_map)) {
      json_object_set(out, option_map[k].oai, val);
    } else if (!strcmp(key, "num_predict")) {
      long long n;
      if (!api_check_as_int(val, &n) || n < -2 || n == 0)
        return api_check_fail(v, p, "'%s' must be an integer >= 1, or -1 (no limit) or -2 (fill the context)", p);
      if (n > 0) json_object_set_new(out, "max_tokens", json_integer(n));
    } else if (!strcmp(key, "num_ctx")) {
      if (!api_check_as_int(val, &q->num_ctx) || q->num_ctx < 1)
        return api_check_fail(v, p, "'%s' must be an integer >= 1", p);
    } else {
      return api_check_fail(v, p, "'%s' is not an option servd takes", p);
    }
  }
  return true;
}

/* format: "json" (any JSON object) or a JSON schema; "" is none. */
static bool parse_format(api_check *v, json_t *body, json_t *out) {
  json_t *f = api_check_field(body, "format");
  if (!f || (json_is_string(f) && !json_string_length(f))) return true;
  if (json_is_string(f) && !strcmp(json_string_value(f), "json")) {
    json_object_set_new(out, "response_format", json_pack("{s:s}", "type", "json_object"));
    return true;
  }
  if (!json_is_object(f)) return api_check_fail(v, "format", "'format' must be \"json\" or a JSON schema (an object)");
  json_object_set_new(
      out, "response_format",
      json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema", "name", "format", "schema", f));
  return true;
}

/* keep_alive: a duration ("5m", "0") or seconds; accepted, as servd keeps its models loaded. think: a
 * boolean or an effort. */
static bool parse_accepted(api_check *v, json_t *body) {
  json_t *ka = api_check_field(body, "keep_alive");
  if (ka && !json_is_string(ka) && !json_is_number(ka))
    return api_check_fail(v, "keep_alive", "'keep_alive' must be a duration (\"5m\") or a number of seconds");
  json_t *th = api_check_field(body, "think");
  if (th && !json_is_boolean(th) && !json_is_string(th))
    return api_check_fail(v, "think", "'think' must be a boolean or \"low\", \"medium\", \"high\"");
  return true;
}

/* think: the template's switch (enable_thinking; an effort also as reasoning_effort, gpt-oss's);
 * absent, the template's default. Only for a chat body: a raw generate has no template. */
static void think_kwargs(json_t *body, json_t *out) {
  json_t *th = json_object_get(body, "think");
  if (!th || json_is_null(th)) return;
  json_t *kw = json_pack("{s:b}", "enable_thinking", !json_is_false(th));
  if (kw && json_is_string(th)) json_object_set(kw, "reasoning_effort", th);
  json_object_set_new(out, "chat_template_kwargs", kw);
}

/* Messages: content a string; images refused; an assistant's tool_calls {function: {name,
 * arguments}} as chat's; thinking and tool_name dropped. */
static bool parse_messages(api_check *v, json_t *body, json_t *out) {
  json_t *in = api_check_field(body, "messages");
  if (!in) return api_check_fail(v, "messages", "'messages' is required: a list of {role, content}");
  if (!json_is_array(in)) return api_check_fail(v, "messages", "'messages' must be a list of {role, content}");
  json_t *msgs = json_array();
  json_object_set_new(out, "messages", msgs);
  for (size_t i = 0; i < json_array_size(in); i++) {
    json_t *m = json_array_get(in, i);
    char p[48];
    snprintf(p, sizeof p, "messages[%zu]", i);
    if (!json_is_object(m)) return api_check_fail(v, p, "'%s' must be an object {role, content}", p);
    json_t *role = json_object_get(m, "role"), *content = api_check_field(m, "content");
    json_t *images = api_check_field(m, "images");
    if (!json_is_string(role)) return api_check_fail(v, p, "'%s.role' is required: a string", p);
    if (content && !json_is_string(content)) return api_check_fail(v, p, "'%s.content' must be a string", p);
    if (images && json_array_size(images))
      return api_check_fail(v, p, "'%s.images': images are not supported: the models servd serves take text only", p);
    json_t *msg = json_pack("{s:O, s:o}", "role", role, "content", content ? json_incref(content) : json_string(""));
    json_t *calls = api_check_field(m, "tool_calls");
    if (calls) {
      if (!json_is_array(calls)) return json_decref(msg), api_check_fail(v, p, "'%s.tool_calls' must be a list", p);
      json_t *tc = json_array();
      for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *fn = json_object_get(json_array_get(calls, k), "function");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_string(name) || (args && !json_is_object(args))) {
          json_decref(tc);
          json_decref(msg);
          return api_check_fail(v, p,
                                "'%s.tool_calls'[%zu] must be {\"function\": {\"name\": string, "
                                "\"arguments\": object}}",
                                p, k);
        }
        json_array_append_new(tc, json_pack("{s:s, s:{s:O, s:o}}", "type", "function", "function", "name", name,
                                            "arguments", args ? json_incref(args) : json_object()));
      }
      json_object_set_new(msg, "tool_calls", tc);
    }
    json_array_append_new(msgs, msg);
  }
  return true;
}

static const char *const known_chat[] = {"model",  "messages",   "tools", "format",   "options",
                                         "stream", "keep_alive", "think", "truncate", "shift"};
static const char *const known_generate[] = {"model",   "prompt",     "suffix", "system",   "template",
                                             "context", "stream",     "raw",    "format",   "images",
                                             "options", "keep_alive", "think",  "truncate", "shift"};
static const char *const known_embed[] = {"model", "input", "truncate", "options", "keep_alive", "dimensions"};

static bool parse(api_check *v, json_t *body, ollama_kind kind, ollama_request *q) {
  json_t *out = q->body;
  if (!json_is_object(body))
    return api_check_fail(v, NULL, "the request body must be a JSON object, got %s", api_json_type(body));
  const char *const *known = kind == OLLAMA_CHAT ? known_chat : kind == OLLAMA_GENERATE ? known_generate : known_embed;
  size_t n_known = kind == OLLAMA_CHAT ? N(known_chat) : kind == OLLAMA_GENERATE ? N(known_generate) : N(known_embed);
  const char *key;
  json_t *val;
  json_object_foreach(body, key, val) {
    if (!is_one_of(key, known, n_known)) {
      char p[48];
      snprintf(p, sizeof p, "%.47s", key);
      return api_check_fail(v, p, "'%s' is not a field servd's Ollama API takes", p);
    }
  }
  json_t *model = api_check_field(body, "model");
  if (!json_is_string(model) || !json_string_length(model))
    return api_check_fail(v, "model", "'model' is required: a model's name");
  q->model = json_string_value(model);
  json_object_set(out, "model", model);
  if (!parse_accepted(v, body)) return false;
  if (kind == OLLAMA_EMBED) {
    q->mode = OAI_EMBEDDINGS;
    json_t *in = api_check_field(body, "input");
    if (!in) return api_check_fail(v, "input", "'input' is required: a string or a list of strings");
    json_object_set(out, "input", in);
    json_t *tr = api_check_field(body, "truncate");
    if (tr && !json_is_boolean(tr)) return api_check_fail(v, "truncate", "'truncate' must be a boolean");
    if (api_check_field(body, "dimensions")) json_object_set(out, "dimensions", json_object_get(body, "dimensions"));
    json_t *scratch = json_object(); /* options are checked; sampling means nothing here */
    bool ok = scratch && parse_options(v, body, scratch, q);
    json_decref(scratch);
    return ok || api_check_fail(v, NULL, "out of memory");
  }
  json_t *stream = api_check_field(body, "stream");
  if (stream && !json_is_boolean(stream)) return api_check_fail(v, "stream", "'stream' must be a boolean");
  json_object_set_new(out, "stream", json_boolean(!json_is_false(stream)));
  if (!parse_options(v, body, out, q) || !parse_format(v, body, out)) return false;
  if (kind == OLLAMA_CHAT) {
    q->mode = OAI_CHAT;
    json_t *tools = api_check_field(body, "tools");
    /* OpenAI's shape: the chat parser checks them. The client sends [] for none. */
    if (tools && !(json_is_array(tools) && json_array_size(tools) == 0)) json_object_set(out, "tools", tools);
    if (!parse_messages(v, body, out)) return false;
    if (!json_array_size(json_object_get(out, "messages"))) q->empty = true; /* Ollama's "load the model" */
    think_kwargs(body, out);
    return true;
  }
  static const char *const refused[] = {"suffix", "template", "context"};
  for (size_t i = 0; i < N(refused); i++)
    if (api_check_field(body, refused[i]))
      return api_check_fail(v, refused[i], "'%s' is not supported by servd's /api/generate", refused[i]);
  json_t *images = api_check_field(body, "images");
  if (images && json_array_size(images))
    return api_check_fail(v, "images", "'images' are not supported: the models servd serves take text only");
  json_t *prompt = api_check_field(body, "prompt"), *system = api_check_field(body, "system");
  json_t *raw = api_check_field(body, "raw");
  if (prompt && !json_is_string(prompt)) return api_check_fail(v, "prompt", "'prompt' must be a string");
  if (system && !json_is_string(system)) return api_check_fail(v, "system", "'system' must be a string");
  if (raw && !json_is_boolean(raw)) return api_check_fail(v, "raw", "'raw' must be a boolean");
  if (!prompt || !json_string_length(prompt)) {
    q->empty = true;
    return true;
  }
  if (json_is_true(raw)) { /* the prompt as it is, no template */
    q->mode = OAI_COMPLETIONS;
    json_object_set(out, "prompt", prompt);
    return true;
  }
  q->mode = OAI_CHAT; /* the prompt as a user turn of the model's template, as Ollama renders it */
  json_t *msgs = json_array();
  json_object_set_new(out, "messages", msgs);
  if (system) json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", system));
  json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", prompt));
  think_kwargs(body, out);
  return true;
}

int ollama_params_parse(json_t *body, ollama_kind kind, ollama_request *out, api_param_error *err) {
  memset(out, 0, sizeof *out);
  memset(err, 0, sizeof *err);
  api_check v = {err, NULL, "", false};
  out->body = json_object();
  if (out->body && parse(&v, body, kind, out)) return 0;
  if (!v.failed) api_check_fail(&v, NULL, "out of memory");
  ollama_request_free(out);
  return -1;
}

void ollama_request_free(ollama_request *q) {
  if (!q) return;
  json_decref(q->body);
  memset(q, 0, sizeof *q);
}

void ollama_param_name(const char *p, char *out, size_t cap) {
  static const char *const sampling[] = {"temperature",      "top_k", "top_p", "min_p", "seed", "presence_penalty",
                                         "frequency_penalty"};
  if (!strcmp(p, "max_tokens")) snprintf(out, cap, "options.num_predict");
  else if (!strcmp(p, "repetition_penalty")) snprintf(out, cap, "options.repeat_penalty");
  else if (!strncmp(p, "stop", 4)) snprintf(out, cap, "options.%s", p);
  else if (!strncmp(p, "response_format", 15)) snprintf(out, cap, "format");
  else if (is_one_of(p, sampling, N(sampling))) snprintf(out, cap, "options.%s", p);
  else snprintf(out, cap, "%s", p);
}
