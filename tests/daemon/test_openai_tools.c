/* Tool calling on the OpenAI routes (api/openai_tools.c): the request fields and their 400s, and
 * the holding back of streamed text from where a call starts (over a fake model whose hook gives
 * the call markers). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "api/openai_tools.h"

static int parse(const char *json, servd_arena *a, oai_params *p, api_param_error *e) {
  api_param_limits l;
  memset(&l, 0, sizeof l);
  servd_gen_params_default(&l.defaults);
  l.max_n = 16;
  return oai_params_parse_text(json, strlen(json), OAI_CHAT, &l, a, p, e);
}

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
#define F(n) "{\"type\":\"function\",\"function\":{\"name\":\"" n "\",\"parameters\":{\"type\":\"object\"}}}"

static void test_accepted(void **st) {
  (void)st;
  static const struct {
    const char *body;
    bool tools; /* o->tools set: "none" leaves the tools out */
  } cases[] = {
      {"{" MSGS ",\"tools\":[" F("a") "," F("b") "]}", true},
      {"{" MSGS ",\"tools\":[" F("a") "],\"tool_choice\":\"required\",\"parallel_tool_calls\":false}", true},
      {"{" MSGS ",\"tools\":[" F("a") "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"a\"}}}", true},
      {"{" MSGS ",\"tools\":[" F("a") "],\"tool_choice\":\"none\"}", false},
      {"{" MSGS ",\"tool_choice\":\"none\"}", false},
      /* The Responses API's flat tool, as the openai client sends a dict it is handed. */
      {"{" MSGS ",\"tools\":[{\"type\":\"function\",\"name\":\"a\",\"parameters\":{\"type\":\"object\"}}]}", true},
      {"{" MSGS ",\"functions\":[{\"name\":\"f\"}],\"function_call\":{\"name\":\"f\"}}", true},
      {"{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":"
       "\"function\","
       "\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\","
       "\"content\":\"1\"}]}",
       false},
  };
  servd_arena *a = servd_arena_create(4096);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    oai_params p;
    api_param_error e;
    if (parse(cases[i].body, a, &p, &e) != 0) fail_msg("case %zu: %s", i, e.message);
    assert_int_equal(p.tools != NULL, cases[i].tools);
    oai_params_free(&p);
  }
  /* The history keeps its calls and the result's id for the template. */
  oai_params p;
  api_param_error e;
  assert_int_equal(parse(cases[7].body, a, &p, &e), 0);
  json_t *m0 = json_array_get(p.messages, 0), *m1 = json_array_get(p.messages, 1);
  assert_string_equal(json_string_value(json_object_get(
                          json_object_get(json_array_get(json_object_get(m0, "tool_calls"), 0), "function"), "name")),
                      "a");
  assert_string_equal(json_string_value(json_object_get(m1, "tool_call_id")), "call_1");
  oai_params_free(&p);
  servd_arena_destroy(a);
}

static void test_refusals(void **st) {
  (void)st;
  static const struct {
    const char *body, *param, *message;
  } cases[] = {
      {"{" MSGS ",\"tools\":{}}", "tools", "'tools' must be a list of tools"},
      {"{" MSGS ",\"tools\":[]}", "tools", "'tools' must not be empty"},
      {"{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{}}]}", "tools[0].function.name",
       "'tools[0].function.name' is required"},
      /* A missing function once reached a type check as NULL (a crash of the server). */
      {"{" MSGS ",\"tools\":[{\"type\":\"function\"}]}", "tools[0].function",
       "'tools[0].function' must be an object with a 'name', got nothing"},
      {"{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":null}]}", "tools[0].function",
       "'tools[0].function' must be an object with a 'name', got null"},
      {"{" MSGS ",\"tools\":[{\"type\":\"function\",\"name\":7}]}", "tools[0].name", "'tools[0].name' is required"},
      {"{" MSGS ",\"tools\":[" F("a b") "]}", "tools[0].function.name", "'tools[0].function.name' must be 1 to 64"},
      {"{" MSGS ",\"tools\":[" F("a") "," F("a") "]}", "tools[1].function",
       "'tools[1].function.name': \"a\" is defined twice"},
      {"{" MSGS ",\"tools\":[{\"type\":\"code\"}]}", "tools[0]", "'tools[0]' must be {\"type\": \"function\""},
      {"{" MSGS ",\"tools\":[" F("a") "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"z\"}}}",
       "tool_choice", "'tool_choice' names the function \"z\", which is not among the tools"},
      {"{" MSGS ",\"tools\":[" F("a") "],\"tool_choice\":\"always\"}", "tool_choice", "'tool_choice' must be"},
      {"{" MSGS ",\"tool_choice\":\"auto\"}", "tool_choice", "'tool_choice' is only allowed when 'tools' are given"},
      {"{" MSGS ",\"tools\":[" F("a") "],\"parallel_tool_calls\":1}", "parallel_tool_calls",
       "'parallel_tool_calls' must be a boolean"},
      {"{" MSGS ",\"tools\":[" F("a") "],\"tool_choice\":\"required\",\"guided_regex\":\"a\"}", "tool_choice",
       "'tool_choice' forces a call and 'guided_regex' constrains the output too"},
      {"{" MSGS ",\"tools\":[" F("a") "],\"functions\":[{\"name\":\"a\"}]}", "functions", "give 'tools' or the legacy"},
      {"{" MSGS ",\"functions\":[{\"name\":\"f\"}],\"function_call\":\"required\"}", "function_call",
       "'function_call' must be"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", "messages[0].tool_calls",
       "'messages[0].tool_calls' is only allowed in assistant messages"},
      {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":1}}]}]}",
       "messages[0].tool_calls", "'messages[0].tool_calls'[0] must be"},
      {"{\"messages\":[{\"role\":\"tool\",\"content\":\"1\",\"tool_call_id\":7}]}", "messages[0].tool_call_id",
       "'messages[0].tool_call_id' must be a string"},
  };
  servd_arena *a = servd_arena_create(4096);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    oai_params p;
    api_param_error e;
    assert_int_equal(parse(cases[i].body, a, &p, &e), -1);
    assert_int_equal(e.status, 400);
    if (strcmp(e.param, cases[i].param) || strncmp(e.message, cases[i].message, strlen(cases[i].message)))
      fail_msg("case %zu: got %s: '%s', want %s: '%s'", i, e.param, e.message, cases[i].param, cases[i].message);
  }
  /* The bound on the tools' count. */
  json_t *body = json_pack("{s:[{s:s, s:s}], s:[]}", "messages", "role", "user", "content", "x", "tools");
  for (int i = 0; i < 1000; i++) {
    char name[16];
    snprintf(name, sizeof name, "f%d", i);
    json_array_append_new(json_object_get(body, "tools"),
                          json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name));
  }
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  oai_params p;
  api_param_error e;
  assert_int_equal(parse(text, a, &p, &e), -1);
  assert_string_equal(e.param, "tools");
  assert_non_null(strstr(e.message, "at most 128"));
  free(text);
  servd_arena_destroy(a);
}

static int fake_render(servd_model *m, json_t *messages, json_t *tools, bool add_gen, json_t **out) {
  (void)m, (void)messages, (void)tools, (void)add_gen;
  *out = json_pack("{s:s, s:[s, s], s:s}", "prompt", "P", "markers", "<tool_call>", "[TOOL_CALLS]", "family", "hermes");
  return 0;
}

static void test_stream_holdback(void **st) {
  (void)st;
  servd_model_ops ops;
  memset(&ops, 0, sizeof ops);
  ops.tools_render = fake_render;
  servd_arena *a = servd_arena_create(4096);
  oai_params p;
  api_param_error e;
  assert_int_equal(parse("{" MSGS ",\"tools\":[" F("a") "]}", a, &p, &e), 0);
  char *prompt = NULL, *grammar = NULL;
  const char *param = NULL;
  json_t *res = NULL;
  assert_int_equal(oai_tools_prepare(p.tools, &ops, NULL, p.messages, NULL, true, 1, &prompt, &grammar, &param, &res),
                   0);
  json_decref(res);
  assert_string_equal(prompt, "P");
  assert_null(grammar); /* auto: nothing forced */
  free(prompt);
  const char *text = "Sure. <tool_call>\n{\"name\": \"a\"}";
  size_t from, to;
  to = oai_tools_releasable(p.tools, 0, text, 6, &from); /* "Sure. " */
  assert_int_equal(from, 0);
  assert_int_equal(to, 6);
  to = oai_tools_releasable(p.tools, 0, text, 9, &from); /* "<to" may start a call: held */
  assert_int_equal(from, 6);
  assert_int_equal(to, 6);
  to = oai_tools_releasable(p.tools, 0, text, strlen(text), &from); /* the call started: the rest is held */
  assert_int_equal(to, 6);
  to = oai_tools_releasable(p.tools, 0, text, strlen(text), &from);
  assert_int_equal(from, 6);
  assert_int_equal(to, 6);
  oai_params_free(&p);
  servd_arena_destroy(a);
}

/* The forced call's grammar nests each function's parameters under the call's "arguments" (and an
 * anyOf of the functions): a local reference such as pydantic's "#/$defs/Inner" once resolved
 * against the grammar's root and failed ("Pointer '/$defs/Inner' does not exist"). Each function's
 * parameters go to the grammar as a schema resource of their own, the template sees them as sent. */
static char *compiled_spec;
static json_t *rendered_tools;

static int fake_render_keep(servd_model *m, json_t *messages, json_t *tools, bool add_gen, json_t **out) {
  if (json_is_array(tools)) rendered_tools = json_deep_copy(tools); /* not the options object first tried */
  return fake_render(m, messages, tools, add_gen, out);
}

static int fake_compile(servd_model *m, servd_guide_kind kind, const char *spec, char **grammar) {
  (void)m;
  assert_int_equal(kind, SERVD_GUIDE_TOOLS);
  compiled_spec = strdup(spec);
  *grammar = strdup("G");
  return 0;
}

static void test_forced_call_local_refs(void **st) {
  (void)st;
  servd_model_ops ops;
  memset(&ops, 0, sizeof ops);
  ops.tools_render = fake_render_keep;
  ops.guide_compile = fake_compile;
  servd_arena *a = servd_arena_create(4096);
  oai_params p;
  api_param_error e;
  const char *body =
      "{" MSGS ",\"tool_choice\":\"required\",\"tools\":["
      "{\"type\":\"function\",\"function\":{\"name\":\"outer\",\"parameters\":{\"$defs\":{\"Inner\":{\"type\":"
      "\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}},\"type\":\"object\",\"properties\":{\"inner\":"
      "{\"$ref\":\"#/$defs/Inner\"}}}}},"
      "{\"type\":\"function\",\"function\":{\"name\":\"own\",\"parameters\":{\"$id\":\"https://example.com/own\","
      "\"type\":\"object\"}}}]}";
  assert_int_equal(parse(body, a, &p, &e), 0);
  char *prompt = NULL, *grammar = NULL;
  const char *param = NULL;
  json_t *res = NULL;
  assert_int_equal(oai_tools_prepare(p.tools, &ops, NULL, p.messages, NULL, true, 1, &prompt, &grammar, &param, &res),
                   0);
  json_decref(res);
  assert_string_equal(grammar, "G");
  json_t *spec = json_loads(compiled_spec, 0, NULL);
  json_t *want = json_loads(
      "{\"choice\":\"required\",\"parallel\":true,\"family\":\"hermes\",\"tools\":["
      "{\"type\":\"function\",\"function\":{\"name\":\"outer\",\"parameters\":{\"$id\":\"urn:servd:tool:outer\","
      "\"$defs\":{\"Inner\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}},\"type\":"
      "\"object\",\"properties\":{\"inner\":{\"$ref\":\"#/$defs/Inner\"}}}}},"
      "{\"type\":\"function\",\"function\":{\"name\":\"own\",\"parameters\":{\"$id\":\"https://example.com/own\","
      "\"type\":\"object\"}}}]}",
      0, NULL);
  assert_non_null(want);
  if (!json_equal(spec, want)) fail_msg("the forced call's spec: %s", compiled_spec);
  /* The template renders the tools as the client sent them. */
  assert_null(json_object_get(
      json_object_get(json_object_get(json_array_get(rendered_tools, 0), "function"), "parameters"), "$id"));
  json_decref(spec);
  json_decref(want);
  json_decref(rendered_tools);
  free(compiled_spec);
  free(prompt);
  free(grammar);
  oai_params_free(&p);
  servd_arena_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accepted),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_stream_holdback),
      cmocka_unit_test(test_forced_call_local_refs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
