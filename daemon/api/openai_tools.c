/* Tool calling on the OpenAI routes: see openai_tools.h. */
#include "api/openai_tools.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "servd/status.h"

typedef enum { CHOICE_AUTO, CHOICE_REQUIRED, CHOICE_NAMED } choice_kind;

typedef struct tool_gen {
  size_t released; /* streaming: text up to here went out as content (or is a call from here on) */
  bool in_call;    /* streaming: a call started at 'released'; the rest is held for the parser */
  json_t *calls;   /* after the parse: [{id, type, function}] or NULL */
  char *content;   /* after the parse: the text outside the calls, or NULL */
  bool withheld;   /* after the parse: a forced call that did not complete (cut by max_tokens) */
} tool_gen;

struct oai_tools {
  json_t *tools; /* [{type: "function", function: {name, description?, parameters}}] */
  choice_kind choice;
  char name[72]; /* CHOICE_NAMED: the function */
  bool parallel, legacy;
  json_t *markers; /* from the package: text that starts a call */
  json_t *family;
  tool_gen *g;
  int n_gens;
};

void oai_tools_free(oai_tools *t) {
  if (!t) return;
  for (int i = 0; i < t->n_gens; i++) {
    json_decref(t->g[i].calls);
    free(t->g[i].content);
  }
  free(t->g);
  json_decref(t->tools);
  json_decref(t->markers);
  json_decref(t->family);
  free(t);
}

static bool forced(const oai_tools *t) { return t->choice != CHOICE_AUTO; }
bool oai_tools_legacy(const oai_tools *t) { return t && t->legacy; }

/* ---- request fields ---------------------------------------------------------------------------- */

/* OpenAI's rule for function names: ^[a-zA-Z0-9_-]{1,64}$. */
static bool name_ok(const char *s, size_t n) {
  if (n == 0 || n > 64) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  }
  return true;
}

/* One function definition into its normalized copy (*out, new reference). */
static bool check_function(api_check *v, const char *param, json_t *f, json_t **out) {
  char p[96];
  if (!json_is_object(f))
    return api_check_fail(v, param, "'%s' must be an object with a 'name', got %s", param, api_json_type(f));
  json_t *name = json_object_get(f, "name");
  snprintf(p, sizeof p, "%s.name", param);
  if (!json_is_string(name)) return api_check_fail(v, p, "'%s' is required: a string", p);
  if (!name_ok(json_string_value(name), json_string_length(name)))
    return api_check_fail(v, p, "'%s' must be 1 to 64 letters, digits, '_' or '-', got \"%.64s\"", p,
                          json_string_value(name));
  json_t *desc = api_check_field(f, "description");
  snprintf(p, sizeof p, "%s.description", param);
  if (desc && !json_is_string(desc)) return api_check_fail(v, p, "'%s' must be a string", p);
  json_t *params = api_check_field(f, "parameters");
  snprintf(p, sizeof p, "%s.parameters", param);
  if (params && !json_is_object(params))
    return api_check_fail(v, p, "'%s' must be a JSON Schema object, got %s", p, api_json_type(params));
  if (params && !api_json_depth_ok(params, API_MAX_SCHEMA_DEPTH))
    return api_check_fail(v, p, "'%s' nests deeper than %d levels (use \"$defs\" and \"$ref\" for deep structures)", p,
                          API_MAX_SCHEMA_DEPTH);
  json_t *strict = api_check_field(f, "strict");
  snprintf(p, sizeof p, "%s.strict", param);
  if (strict && !json_is_boolean(strict)) return api_check_fail(v, p, "'%s' must be a boolean", p);
  /* Templates and the grammar read 'parameters': absent means no arguments. */
  json_t *pp = params ? json_incref(params) : json_pack("{s:s, s:{}}", "type", "object", "properties");
  *out = json_pack("{s:O, s:o}", "name", name, "parameters", pp);
  if (desc) json_object_set(*out, "description", desc);
  return *out ? true : api_check_fail(v, NULL, "out of memory");
}

static bool has_name(json_t *tools, const char *name) {
  size_t i;
  json_t *t;
  json_array_foreach(
      tools, i,
      t) if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), name)) return true;
  return false;
}

static bool parse_list(api_check *v, const char *key, json_t *arr, bool legacy, json_t **out) {
  if (!json_is_array(arr))
    return api_check_fail(v, key, "'%s' must be a list of %s, got %s", key, legacy ? "function definitions" : "tools",
                          api_json_type(arr));
  size_t n = json_array_size(arr);
  if (n == 0) return api_check_fail(v, key, "'%s' must not be empty (leave it out for no tools)", key);
  if (n > OAI_MAX_TOOLS)
    return api_check_fail(v, key, "'%s' has %zu entries; at most %d are allowed", key, n, OAI_MAX_TOOLS);
  char *dump = json_dumps(arr, JSON_COMPACT);
  size_t bytes = dump ? strlen(dump) : 0;
  free(dump);
  if (bytes > OAI_MAX_TOOLS_BYTES)
    return api_check_fail(v, key, "'%s' is %zu bytes of JSON; at most %d are allowed", key, bytes, OAI_MAX_TOOLS_BYTES);
  json_t *list = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(arr, i), *f = NULL;
    char param[48];
    snprintf(param, sizeof param, "%s[%zu]", key, i);
    if (!legacy) {
      json_t *type = json_is_object(e) ? json_object_get(e, "type") : NULL;
      if (!json_is_string(type) || strcmp(json_string_value(type), "function")) {
        json_decref(list);
        return api_check_fail(v, param, "'%s' must be {\"type\": \"function\", \"function\": {...}}", param);
      }
      /* The Responses API's flat form {type, name, parameters, ...} (the openai client passes such a
       * dict through unchanged) is the function itself. */
      json_t *fn = json_object_get(e, "function");
      if (fn || !json_object_get(e, "name")) {
        e = fn;
        snprintf(param, sizeof param, "%s[%zu].function", key, i);
      }
    }
    if (!check_function(v, param, e, &f)) {
      json_decref(list);
      return false;
    }
    const char *name = json_string_value(json_object_get(f, "name"));
    if (has_name(list, name)) {
      json_decref(f);
      json_decref(list);
      return api_check_fail(v, param, "'%s.name': \"%s\" is defined twice", param, name);
    }
    json_array_append_new(list, json_pack("{s:s, s:o}", "type", "function", "function", f));
  }
  *out = list;
  return true;
}

/* tool_choice or the legacy function_call. */
static bool parse_choice(api_check *v, const char *key, json_t *c, oai_tools *t) {
  if (!c) return true;
  if (json_is_string(c)) {
    const char *s = json_string_value(c);
    if (!strcmp(s, "auto")) return true;
    if (!strcmp(s, "none")) return t->choice = CHOICE_AUTO, t->name[0] = 1, true; /* name[0] == 1: "none" */
    if (!strcmp(s, "required") && !t->legacy) return t->choice = CHOICE_REQUIRED, true;
    return api_check_fail(v, key, "'%s' must be \"none\", \"auto\"%s or {%s\"name\": ...}, got \"%.64s\"", key,
                          t->legacy ? "" : ", \"required\"",
                          t->legacy ? "" : "\"type\": \"function\", \"function\": ", s);
  }
  json_t *fn = c;
  if (!t->legacy) {
    json_t *type = json_is_object(c) ? json_object_get(c, "type") : NULL;
    fn = json_is_object(c) ? json_object_get(c, "function") : NULL;
    if (!json_is_string(type) || strcmp(json_string_value(type), "function") || !json_is_object(fn))
      return api_check_fail(v, key,
                            "'%s' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}",
                            key);
  }
  json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
  if (!json_is_string(name)) return api_check_fail(v, key, "'%s' must name a function: {\"name\": ...}", key);
  if (!has_name(t->tools, json_string_value(name)))
    return api_check_fail(v, key, "'%s' names the function \"%.64s\", which is not among the %s", key,
                          json_string_value(name), t->legacy ? "functions" : "tools");
  t->choice = CHOICE_NAMED;
  snprintf(t->name, sizeof t->name, "%s", json_string_value(name));
  return true;
}

bool oai_parse_tools(api_check *v, json_t *body, oai_params *o) {
  json_t *tools = api_check_field(body, "tools"), *functions = api_check_field(body, "functions");
  json_t *tc = api_check_field(body, "tool_choice"), *fc = api_check_field(body, "function_call");
  if (tools && functions) return api_check_fail(v, "functions", "give 'tools' or the legacy 'functions', not both");
  if (tc && fc) return api_check_fail(v, "function_call", "give 'tool_choice' or the legacy 'function_call', not both");
  bool parallel = true;
  if (!api_check_bool(v, body, "parallel_tool_calls", &parallel)) return false;
  if (!tools && !functions) {
    const char *key = tc ? "tool_choice" : "function_call";
    json_t *c = tc ? tc : fc;
    if (c && !(json_is_string(c) && !strcmp(json_string_value(c), "none")))
      return api_check_fail(v, key, "'%s' is only allowed when '%s' are given", key, tc ? "tools" : "functions");
    return true;
  }
  oai_tools *t = calloc(1, sizeof *t);
  if (!t) return api_check_fail(v, NULL, "out of memory");
  t->legacy = functions != NULL;
  t->parallel = parallel && !t->legacy; /* the legacy form has one call */
  if (!parse_list(v, t->legacy ? "functions" : "tools", t->legacy ? functions : tools, t->legacy, &t->tools) ||
      !parse_choice(v, t->legacy ? "function_call" : "tool_choice", t->legacy ? fc : tc, t)) {
    oai_tools_free(t);
    return false;
  }
  if (t->name[0] == 1) { /* "none": the model answers in text; its tools are not even shown */
    oai_tools_free(t);
    return true;
  }
  if (forced(t) && o->guide_kind != SERVD_GUIDE_NONE) {
    const char *key = t->legacy ? "function_call" : "tool_choice";
    oai_tools_free(t);
    return api_check_fail(v, key, "'%s' forces a call and '%s' constrains the output too: give one of them", key,
                          o->guide_param);
  }
  o->tools = t;
  return true;
}

bool oai_check_message_tools(api_check *v, const char *param, json_t *in, json_t *out) {
  const char *role = json_string_value(json_object_get(in, "role"));
  json_t *calls = api_check_field(in, "tool_calls");
  char p[96];
  if (calls) {
    snprintf(p, sizeof p, "%s.tool_calls", param);
    if (strcmp(role, "assistant")) return api_check_fail(v, p, "'%s' is only allowed in assistant messages", p);
    if (!json_is_array(calls) || json_array_size(calls) > 1024)
      return api_check_fail(v, p, "'%s' must be a list of tool calls", p);
    json_t *norm = json_array();
    for (size_t i = 0; i < json_array_size(calls); i++) {
      json_t *c = json_array_get(calls, i);
      json_t *f = json_is_object(c) ? json_object_get(c, "function") : NULL;
      json_t *id = json_is_object(c) ? json_object_get(c, "id") : NULL;
      json_t *name = json_is_object(f) ? json_object_get(f, "name") : NULL;
      json_t *args = json_is_object(f) ? json_object_get(f, "arguments") : NULL;
      if (!json_is_string(name) || (args && !json_is_string(args) && !json_is_object(args)) ||
          (id && !json_is_string(id))) {
        json_decref(norm);
        return api_check_fail(v, p,
                              "'%s'[%zu] must be {\"id\": string, \"type\": \"function\", \"function\": "
                              "{\"name\": string, \"arguments\": string}}",
                              p, i);
      }
      json_t *nc = json_pack("{s:s, s:{s:O, s:o}}", "type", "function", "function", "name", name, "arguments",
                             args ? json_incref(args) : json_string("{}"));
      if (id) json_object_set(nc, "id", id);
      json_array_append_new(norm, nc);
    }
    json_object_set_new(out, "tool_calls", norm);
  }
  json_t *tcid = api_check_field(in, "tool_call_id");
  if (tcid) {
    snprintf(p, sizeof p, "%s.tool_call_id", param);
    if (!json_is_string(tcid)) return api_check_fail(v, p, "'%s' must be a string", p);
    json_object_set(out, "tool_call_id", tcid);
  }
  return true;
}

/* ---- rendering and the forced call (prep worker) ------------------------------------------------ */

/* The tools as the forced call's grammar takes them: each function's parameters become a schema
 * resource of their own ("$id"), so that their local references ("#/$defs/Inner", as pydantic writes
 * them, or "#" for recursion) resolve against the parameters wherever the grammar nests them (under
 * the call's "arguments", within an anyOf of the allowed functions) instead of against the call's
 * root, where no "$defs" is. A schema that names itself keeps its own "$id". New reference. */
static json_t *forced_tools(json_t *tools) {
  json_t *copy = json_deep_copy(tools);
  size_t i;
  json_t *t;
  json_array_foreach(copy, i, t) {
    json_t *f = json_object_get(t, "function");
    json_t *params = json_object_get(f, "parameters");
    if (!json_is_object(params) || json_object_get(params, "$id")) continue;
    char id[96];
    snprintf(id, sizeof id, "urn:servd:tool:%s", json_string_value(json_object_get(f, "name")));
    json_object_set_new(params, "$id", json_string(id));
  }
  return copy;
}

int oai_render_call(const servd_model_ops *ops, servd_model *m, json_t *messages, json_t *tools, json_t *kwargs,
                    bool add_gen, json_t **res) {
  *res = NULL;
  bool has_kwargs = json_object_size(kwargs) > 0;
  int rc = 0;
  if (ops->tools_render) {
    json_t *opts = json_pack("{s:O?, s:O?}", "tools", tools, "chat_template_kwargs", kwargs);
    rc = opts ? ops->tools_render(m, messages, opts, add_gen, res) : servd_fail(SERVD_ENOMEM, "out of memory");
    json_decref(opts);
    if (rc == 0 && json_is_true(json_object_get(*res, "options"))) return 0;
    json_decref(*res);
    *res = NULL;
    if (rc != 0 && has_kwargs) return rc; /* the template's own error */
  }
  if (has_kwargs)
    return servd_fail(SERVD_EINVAL, "chat_template_kwargs: the model code of this package predates them "
                                    "(repack it with this servd's model code)");
  if (tools) return ops->tools_render(m, messages, tools, add_gen, res);
  char *text = NULL;
  rc = ops->apply_chat_template(m, messages, add_gen, &text);
  if (rc == 0) *res = json_pack("{s:s}", "prompt", text);
  free(text);
  return rc != 0 ? rc : *res ? 0 : servd_fail(SERVD_ENOMEM, "out of memory");
}

int oai_tools_prepare(oai_tools *t, const servd_model_ops *ops, servd_model *m, json_t *messages, json_t *kwargs,
                      bool add_gen, int n_gens, char **prompt, char **grammar, const char **param, json_t **res) {
  *prompt = *grammar = NULL;
  *res = NULL;
  *param = "messages";
  if (!ops->tools_render) return servd_fail(SERVD_EUNSUPPORTED, "this server has no tool calling");
  t->g = calloc((size_t)n_gens, sizeof *t->g);
  if (!t->g) return servd_fail(SERVD_ENOMEM, "tool calling: out of memory");
  t->n_gens = n_gens;
  int rc = oai_render_call(ops, m, messages, t->tools, kwargs, add_gen, res);
  if (rc) return rc;
  json_t *p = json_object_get(*res, "prompt");
  t->markers = json_incref(json_object_get(*res, "markers"));
  t->family = json_incref(json_object_get(*res, "family"));
  *prompt = json_is_string(p) ? strdup(json_string_value(p)) : NULL;
  if (!*prompt) return servd_fail(SERVD_EFORMAT, "tool calling: tool_render() gave no prompt");
  if (!forced(t)) return 0;
  *param = t->legacy ? "function_call" : "tool_choice";
  if (!ops->guide_compile) return servd_fail(SERVD_EUNSUPPORTED, "this server has no constrained decoding");
  json_t *spec = json_pack("{s:o, s:s, s:b, s:O}", "tools", forced_tools(t->tools), "choice",
                           t->choice == CHOICE_NAMED ? t->name : "required", "parallel", t->parallel, "family",
                           t->family ? t->family : json_null());
  char *text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
  json_decref(spec);
  if (!text) return servd_fail(SERVD_ENOMEM, "tool calling: out of memory");
  rc = ops->guide_compile(m, SERVD_GUIDE_TOOLS, text, grammar);
  free(text);
  /* What the grammar engine cannot enforce is in the tools' parameter schemas. */
  if (rc) *param = t->legacy ? "functions" : "tools";
  return rc;
}

/* ---- streaming ----------------------------------------------------------------------------------- */

size_t oai_tools_releasable(oai_tools *t, int gen, const char *text, size_t len, size_t *from) {
  tool_gen *g = &t->g[gen];
  *from = g->released;
  if (forced(t) || g->in_call) return g->released;
  size_t start = g->released, best = len, hold = 0;
  size_t i;
  json_t *mk;
  json_array_foreach(t->markers, i, mk) {
    const char *s = json_string_value(mk);
    size_t n = s ? strlen(s) : 0;
    if (!n) continue;
    const char *hit = memmem(text + start, len - start, s, n);
    if (hit && (size_t)(hit - text) < best) best = (size_t)(hit - text);
    /* The longest end of the text that could still grow into this marker. */
    for (size_t k = n - 1 < len - start ? n - 1 : len - start; k > hold; k--)
      if (!memcmp(text + len - k, s, k)) {
        hold = k;
        break;
      }
  }
  if (best < len) {
    g->in_call = true;
    g->released = best;
  } else {
    g->released = len - hold;
  }
  return g->released;
}

/* ---- the parsed calls ---------------------------------------------------------------------------- */

static void call_id(char *out, size_t cap) {
  uint64_t r[2] = {0, 0};
  if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) /* no entropy yet: unique is enough */
    r[0] = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)out, r[1] = (uint64_t)clock();
  snprintf(out, cap, "call_%016" PRIx64 "%08" PRIx64, r[0], r[1] & 0xffffffffu);
}

int oai_tools_parse(oai_tools *t, const servd_model_ops *ops, servd_model *m, int gen, const char *text, size_t len) {
  tool_gen *g = &t->g[gen];
  if (!ops->tools_parse) return servd_fail(SERVD_EUNSUPPORTED, "this server has no tool calling");
  char *s = strndup(text ? text : "", len);
  json_t *spec = json_pack("{s:O, s:b, s:O}", "tools", t->tools, "parallel", t->parallel, "family",
                           t->family ? t->family : json_null());
  json_t *res = NULL;
  int rc = s && spec ? ops->tools_parse(m, s, spec, &res) : servd_fail(SERVD_ENOMEM, "tool calling: out of memory");
  free(s);
  json_decref(spec);
  if (rc) return rc;
  json_t *calls = json_object_get(res, "calls"), *content = json_object_get(res, "content");
  if (json_is_string(content)) g->content = strdup(json_string_value(content));
  size_t i;
  json_t *c;
  json_array_foreach(calls, i, c) {
    json_t *name = json_object_get(c, "name"), *args = json_object_get(c, "arguments");
    if (!json_is_string(name) || !json_is_string(args)) continue;
    if (t->choice == CHOICE_NAMED && strcmp(json_string_value(name), t->name)) continue;
    char id[48];
    call_id(id, sizeof id);
    if (!g->calls) g->calls = json_array();
    json_array_append_new(g->calls, json_pack("{s:s, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function",
                                              "name", name, "arguments", args));
  }
  json_decref(res);
  /* A forced call's grammar allows nothing but calls: whatever text stands without one is a call
   * cut short (max_tokens), its markup no answer to show as content. */
  if (forced(t) && !g->calls) {
    free(g->content);
    g->content = NULL;
    g->withheld = true;
  }
  return 0;
}

bool oai_tools_withheld(const oai_tools *t, int gen) { return t && gen < t->n_gens && t->g[gen].withheld; }
json_t *oai_tools_calls(const oai_tools *t, int gen) { return t && gen < t->n_gens ? t->g[gen].calls : NULL; }
const char *oai_tools_content(const oai_tools *t, int gen) { return t && gen < t->n_gens ? t->g[gen].content : NULL; }
