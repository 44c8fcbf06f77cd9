/* /v1/responses bodies into chat completions bodies (api/responses.h): what each Responses field
 * becomes, and the 400s naming the Responses field. Expected bodies are written out by hand from the
 * two APIs' field definitions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>

#include "api/responses.h"

/* Parses text; on success compares the chat body with want (JSON text). */
static void expect_chat(const char *text, const char *want) {
  json_t *body = json_loads(text, 0, NULL), *w = json_loads(want, 0, NULL);
  assert_non_null(body);
  assert_non_null(w);
  resp_request q;
  api_param_error e;
  int rc = resp_params_parse(body, &q, &e);
  if (rc != 0) fail_msg("%s: %s (%s)", text, e.message, e.param);
  if (!json_equal(q.chat, w)) {
    char *got = json_dumps(q.chat, JSON_SORT_KEYS);
    fail_msg("%s\n got  %s\n want %s", text, got, want);
  }
  resp_request_free(&q);
  json_decref(body);
  json_decref(w);
}

static void expect_error(const char *text, const char *param, const char *needle) {
  json_t *body = json_loads(text, 0, NULL);
  assert_non_null(body);
  resp_request q;
  api_param_error e;
  assert_int_equal(resp_params_parse(body, &q, &e), -1);
  assert_int_equal(e.status, 400);
  if (strcmp(e.param, param) || !strstr(e.message, needle))
    fail_msg("%s: param '%s' message '%s' (want '%s', '%s')", text, e.param, e.message, param, needle);
  assert_null(q.chat);
  json_decref(body);
}

static void test_string_input(void **st) {
  (void)st;
  expect_chat("{\"model\":\"m\",\"input\":\"hi\",\"instructions\":\"be terse\",\"max_output_tokens\":7,"
              "\"temperature\":0,\"top_p\":0.5,\"stream\":true,\"store\":true,\"metadata\":{\"k\":\"v\"}}",
              "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be terse\"},"
              "{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":7,\"temperature\":0,\"top_p\":0.5,"
              "\"stream\":true}");
}

static void test_items_and_tool_round_trip(void **st) {
  (void)st;
  expect_chat(
      "{\"input\":[{\"role\":\"developer\",\"content\":\"d\"},"
      "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
      "{\"type\":\"input_text\",\"text\":\"b\"}]},"
      "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
      "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{\\\"x\\\":1}\"},"
      "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"42\"}],"
      "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"F\",\"parameters\":{\"type\":\"object\"},"
      "\"strict\":true}],\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}",
      "{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\",\"content\":\"ab\"},"
      "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
      "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
      "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"F\","
      "\"parameters\":{\"type\":\"object\"},\"strict\":true}}],"
      "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}");
}

static void test_text_format(void **st) {
  (void)st;
  expect_chat("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"text\"}}}",
              "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
  expect_chat("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_object\"}}}",
              "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\"}}");
  expect_chat("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":{},"
              "\"strict\":true}}}",
              "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
              "\"json_schema\":{\"name\":\"n\",\"schema\":{},\"strict\":true}}}");
}

static void test_errors_name_the_field(void **st) {
  (void)st;
  expect_error("{\"model\":\"m\"}", "input", "required");
  expect_error("{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id", "keeps no responses");
  expect_error("{\"input\":\"x\",\"reasoning\":{}}", "reasoning", "'reasoning'");
  expect_error("{\"input\":[]}", "input", "empty list");
  expect_error("{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input[0]", "role");
  expect_error("{\"input\":[{\"type\":\"image\"}]}", "input[0]", "input[0].type");
  expect_error("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}", "input[0].content",
               "only text");
  expect_error("{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}", "input[0]", "call_id");
  expect_error("{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens", "max_output_tokens");
  expect_error("{\"input\":\"x\",\"store\":\"no\"}", "store", "boolean");
  expect_error("{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0]", "function tool");
  expect_error("{\"input\":\"x\",\"tool_choice\":{\"type\":\"mcp\"}}", "tool_choice", "tool_choice");
  expect_error("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "text.format.type", "yaml");
  expect_error("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\"}}}",
               "text.format.schema", "schema");
  expect_error("{\"input\":\"x\",\"text\":{\"verbosity\":\"low\"}}", "text.verbosity", "not supported");
  expect_error("{\"input\":\"x\",\"instructions\":3}", "instructions", "string");
  /* Fields looked up as missing once reached a type check as NULL (a crash of the server). */
  expect_error("{\"input\":[{\"role\":\"user\"}]}", "input[0].content", "missing");
  expect_error("{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c1\"}]}", "input[0].output", "missing");
  expect_error("{\"input\":[{\"type\":\"message\",\"role\":\"assistant\",\"content\":null}]}", "input[0].content",
               "got null");
}

static void test_param_names(void **st) {
  (void)st;
  char out[64];
  const char *cases[][2] = {{"messages[3].content", "input"},
                            {"max_tokens", "max_output_tokens"},
                            {"response_format.json_schema", "text.format"},
                            {"tools[1].function.name", "tools[1].name"},
                            {"tools", "tools"},
                            {"temperature", "temperature"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    resp_param_name(cases[i][0], out, sizeof out);
    assert_string_equal(out, cases[i][1]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_string_input), cmocka_unit_test(test_items_and_tool_round_trip),
      cmocka_unit_test(test_text_format),  cmocka_unit_test(test_errors_name_the_field),
      cmocka_unit_test(test_param_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
