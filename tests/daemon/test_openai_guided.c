/* The constrained-decoding fields of OpenAI request bodies (api/openai_guided.c): each spelling gives
 * the engine's kind and the constraint's text, two constraints or a malformed one are a 400 naming
 * the field, and fields servd does not implement are 400s unless they ask for what servd does anyway. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>

#include "api/request_params.h"

static int parse(const char *json, oai_mode mode, servd_arena *a, oai_params *p, api_param_error *e) {
  api_param_limits l;
  memset(&l, 0, sizeof l);
  servd_gen_params_default(&l.defaults);
  l.max_n = 16;
  return oai_params_parse_text(json, strlen(json), mode, &l, a, p, e);
}

#define CHAT "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"

static void test_kinds(void **st) {
  (void)st;
  static const struct {
    const char *body;
    servd_guide_kind kind;
    const char *spec, *param;
  } cases[] = {
      {CHAT "\"response_format\":{\"type\":\"text\"}}", SERVD_GUIDE_NONE, NULL, NULL},
      {CHAT "\"response_format\":{\"type\":\"json_object\"}}", SERVD_GUIDE_JSON_OBJECT, "", "response_format"},
      {CHAT "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":true,"
            "\"schema\":{\"type\":\"integer\"}}}}",
       SERVD_GUIDE_JSON_SCHEMA, "{\"type\":\"integer\"}", "response_format"},
      {CHAT "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\"}}}", SERVD_GUIDE_JSON_OBJECT,
       "", "response_format"},
      {CHAT "\"guided_json\":{\"type\":\"string\"}}", SERVD_GUIDE_JSON_SCHEMA, "{\"type\":\"string\"}", "guided_json"},
      {CHAT "\"guided_json\":\"{\\\"type\\\": \\\"string\\\"}\"}", SERVD_GUIDE_JSON_SCHEMA, "{\"type\": \"string\"}",
       "guided_json"},
      {CHAT "\"guided_regex\":\"[0-9]+\"}", SERVD_GUIDE_REGEX, "[0-9]+", "guided_regex"},
      {CHAT "\"guided_choice\":[\"a\",\"b\"]}", SERVD_GUIDE_CHOICE, "[\"a\",\"b\"]", "guided_choice"},
      {CHAT "\"guided_grammar\":\"start: \\\"x\\\"\",\"guided_decoding_backend\":\"llguidance\"}", SERVD_GUIDE_GRAMMAR,
       "start: \"x\"", "guided_grammar"},
      {"{\"prompt\":\"x\",\"structured_outputs\":{\"choice\":[\"y\"]}}", SERVD_GUIDE_CHOICE, "[\"y\"]",
       "structured_outputs.choice"},
      {"{\"prompt\":\"x\",\"structured_outputs\":{\"json_object\":true}}", SERVD_GUIDE_JSON_OBJECT, "",
       "structured_outputs.json_object"},
  };
  servd_arena *a = servd_arena_create(4096);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    oai_params p;
    api_param_error e;
    if (parse(cases[i].body, strstr(cases[i].body, "messages") ? OAI_CHAT : OAI_COMPLETIONS, a, &p, &e) != 0)
      fail_msg("case %zu: %s", i, e.message);
    assert_int_equal(p.guide_kind, cases[i].kind);
    if (cases[i].spec) assert_string_equal(p.guide_spec, cases[i].spec);
    if (cases[i].param) assert_string_equal(p.guide_param, cases[i].param);
    oai_params_free(&p);
  }
  servd_arena_destroy(a);
}

static void test_refusals(void **st) {
  (void)st;
  static const struct {
    const char *body, *param, *message;
  } cases[] = {
      {CHAT "\"response_format\":{\"type\":\"xml\"}}", "response_format.type",
       "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"xml\""},
      {CHAT "\"response_format\":\"json\"}", "response_format", "'response_format' must be an object with a 'type'"},
      {CHAT "\"response_format\":{\"type\":\"json_schema\"}}", "response_format.json_schema",
       "'response_format.json_schema' must be an object"},
      {CHAT "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":[1]}}}",
       "response_format.json_schema.schema",
       "'response_format.json_schema.schema' must be a JSON Schema object, got an array"},
      {CHAT "\"guided_json\":\"not json\"}", "guided_json", "'guided_json' must be a JSON Schema"},
      {CHAT "\"guided_regex\":\"\"}", "guided_regex", "'guided_regex' must be a non-empty string"},
      {CHAT "\"guided_choice\":[\"a\",3]}", "guided_choice", "'guided_choice'[1] must be a non-empty string"},
      {CHAT "\"guided_regex\":\"a\",\"guided_choice\":[\"a\"]}", "guided_choice",
       "'guided_regex' and 'guided_choice' both constrain the output: give one of them"},
      {CHAT "\"response_format\":{\"type\":\"json_object\"},\"guided_regex\":\"a\"}", "guided_regex",
       "'response_format' and 'guided_regex' both constrain the output"},
      {CHAT "\"structured_outputs\":{\"structural_tag\":\"x\"}}", "structured_outputs",
       "'structured_outputs.structural_tag' is not supported"},
      {CHAT "\"guided_decoding_backend\":\"xgrammar\"}", "guided_decoding_backend",
       "'guided_decoding_backend' must be"},
      {CHAT "\"use_beam_search\":true}", "use_beam_search",
       "'use_beam_search' is not supported: servd does not implement beam search"},
      {CHAT "\"skip_special_tokens\":false}", "skip_special_tokens", "'skip_special_tokens' is not supported"},
      {CHAT "\"max_tokens\":2,\"min_tokens\":3}", "min_tokens", "'min_tokens' (3) must not exceed max_tokens (2)"},
      {CHAT "\"modalities\":[\"text\",\"audio\"]}", "modalities", "'modalities' is not supported"},
      {CHAT "\"echo\":true}", "echo", "'echo' is not supported"},
      {CHAT "\"add_generation_prompt\":1}", "add_generation_prompt", "'add_generation_prompt' must be a boolean"},
  };
  servd_arena *a = servd_arena_create(4096);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    oai_params p;
    api_param_error e;
    assert_int_equal(parse(cases[i].body, OAI_CHAT, a, &p, &e), -1);
    assert_int_equal(e.status, 400);
    if (strcmp(e.param, cases[i].param) || strncmp(e.message, cases[i].message, strlen(cases[i].message)))
      fail_msg("case %zu: got %s: '%s', want %s: '%s'", i, e.param, e.message, cases[i].param, cases[i].message);
  }
  servd_arena_destroy(a);
}

static void test_defaults_accepted(void **st) {
  (void)st;
  servd_arena *a = servd_arena_create(4096);
  oai_params p;
  api_param_error e;
  const char *body =
      CHAT "\"skip_special_tokens\":true,\"min_tokens\":0,\"store\":false,\"modalities\":[\"text\"],"
           "\"use_beam_search\":false,\"priority\":0,\"length_penalty\":1.0,\"add_generation_prompt\":false}";
  if (parse(body, OAI_CHAT, a, &p, &e) != 0) fail_msg("%s", e.message);
  assert_false(p.add_generation_prompt);
  assert_int_equal(p.guide_kind, SERVD_GUIDE_NONE);
  oai_params_free(&p);
  servd_arena_destroy(a);
}

/* A constraint nesting deeper than the grammar engine's compile can recurse (a 2000-deep schema
 * once overflowed the interpreter's recursion limit: a 500) is a 400 naming its field, in each of
 * the places a schema comes in; 64 levels are taken. */
static char *nested(int depth, const char *leaf) {
  size_t cap = (size_t)depth * 32 + 64;
  char *s = malloc(cap), *w = s;
  for (int i = 0; i < depth; i++) w += sprintf(w, "{\"type\":\"array\",\"items\":");
  w += sprintf(w, "%s", leaf);
  for (int i = 0; i < depth; i++) *w++ = '}';
  *w = '\0';
  return s;
}

static void test_depth(void **st) {
  (void)st;
  static const struct {
    const char *fmt, *param;
  } places[] = {
      {CHAT "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"d\",\"schema\":%s}}}",
       "response_format"},
      {CHAT "\"guided_json\":%s}", "guided_json"},
      {CHAT "\"structured_outputs\":{\"json\":%s}}", "structured_outputs.json"},
      {CHAT "\"tool_choice\":\"required\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
            "\"parameters\":%s}}]}",
       "tools[0].function.parameters"},
  };
  servd_arena *a = servd_arena_create(4096);
  for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) {
    /* depth levels of {"type":"array","items": ...} around {"type":"integer"}: depth + 1 objects */
    for (int depth = 63; depth <= 2000; depth += 2000 - 63) {
      char *schema = nested(depth, "{\"type\":\"integer\"}");
      char *body = malloc(strlen(schema) + 256);
      sprintf(body, places[i].fmt, schema);
      oai_params p;
      api_param_error e;
      int rc = parse(body, OAI_CHAT, a, &p, &e);
      if (depth == 63) {
        if (rc != 0) fail_msg("place %zu: 64 levels refused: %s: %s", i, e.param, e.message);
        oai_params_free(&p);
      } else {
        assert_int_equal(rc, -1);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, places[i].param);
        assert_non_null(strstr(e.message, "nests deeper than 64 levels"));
      }
      free(body);
      free(schema);
    }
  }
  /* The same as JSON text in a string. */
  char *schema = nested(2000, "{}");
  json_t *body = json_pack("{s:[{s:s, s:s}], s:s}", "messages", "role", "user", "content", "x", "guided_json", schema);
  char *text = json_dumps(body, JSON_COMPACT);
  oai_params p;
  api_param_error e;
  assert_int_equal(parse(text, OAI_CHAT, a, &p, &e), -1);
  assert_string_equal(e.param, "guided_json");
  assert_non_null(strstr(e.message, "nests deeper than 64 levels"));
  free(text);
  json_decref(body);
  free(schema);
  servd_arena_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kinds),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_defaults_accepted),
      cmocka_unit_test(test_depth),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
