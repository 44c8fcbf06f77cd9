/* /v1/messages bodies into chat completions bodies (api/anthropic.h): what each Messages field
 * becomes, and the 400s naming the Anthropic field. Expected bodies are written out by hand from the
 * two APIs' field definitions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>

#include "api/anthropic.h"

/* Parses text; on success compares the chat body with want (JSON text). */
static void expect_chat_of(const char *text, bool count, const char *want) {
  json_t *body = json_loads(text, 0, NULL), *w = json_loads(want, 0, NULL);
  if (!body || !w) fail_msg("bad test JSON: %s / %s", text, want);
  anth_request q;
  api_param_error e;
  int rc = anth_params_parse(body, count, &q, &e);
  if (rc != 0) fail_msg("%s: %s (%s)", text, e.message, e.param);
  if (!json_equal(q.chat, w)) {
    char *got = json_dumps(q.chat, JSON_SORT_KEYS);
    fail_msg("%s\n got  %s\n want %s", text, got, want);
  }
  anth_request_free(&q);
  json_decref(body);
  json_decref(w);
}

static void expect_chat(const char *text, const char *want) { expect_chat_of(text, false, want); }

static void expect_error(const char *text, const char *param, const char *needle) {
  json_t *body = json_loads(text, 0, NULL);
  if (!body) fail_msg("bad test JSON: %s", text);
  anth_request q;
  api_param_error e;
  assert_int_equal(anth_params_parse(body, false, &q, &e), -1);
  assert_int_equal(e.status, 400);
  if (strcmp(e.param, param) || !strstr(e.message, needle))
    fail_msg("%s: param '%s' message '%s' (want '%s', '%s')", text, e.param, e.message, param, needle);
  assert_null(q.chat);
  json_decref(body);
}

#define M "\"model\":\"m\",\"max_tokens\":9,"
#define HI "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_plain(void **st) {
  (void)st;
  expect_chat("{" M "\"system\":\"be terse\"," HI ",\"temperature\":0.5,\"top_p\":0.9,\"top_k\":5,"
              "\"stop_sequences\":[\"END\",\"\\n\\n\"],\"stream\":true,\"metadata\":{\"user_id\":\"u1\"},"
              "\"service_tier\":\"auto\"}",
              "{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"system\",\"content\":\"be terse\"},"
              "{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":0.5,\"top_p\":0.9,\"top_k\":5,"
              "\"stop\":[\"END\",\"\\n\\n\"],\"stream\":true}");
  /* system as text blocks (cache_control ignored), content as text blocks. */
  expect_chat("{" M "\"system\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\","
              "\"cache_control\":{\"type\":\"ephemeral\"}}],"
              "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"},"
              "{\"type\":\"text\",\"text\":\"y\"}]},{\"role\":\"assistant\",\"content\":\"ok\"},"
              "{\"role\":\"user\",\"content\":\"z\"}]}",
              "{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"system\",\"content\":\"a\\nb\"},"
              "{\"role\":\"user\",\"content\":\"xy\"},{\"role\":\"assistant\",\"content\":\"ok\"},"
              "{\"role\":\"user\",\"content\":\"z\"}]}");
  /* output_config.format is structured outputs; effort and cache_control are accepted. */
  expect_chat("{" M HI ",\"output_config\":{\"effort\":\"low\",\"format\":{\"type\":\"json_schema\","
              "\"schema\":{\"type\":\"object\"}}},\"cache_control\":{\"type\":\"ephemeral\"}}",
              "{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
              "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"output\","
              "\"schema\":{\"type\":\"object\"}}}}");
  /* thinking is the template's switch (enable_thinking), on or off; absent, the template decides. */
  expect_chat("{\"model\":\"m\",\"max_tokens\":2000," HI ",\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024}}",
              "{\"model\":\"m\",\"max_tokens\":2000,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
              "\"chat_template_kwargs\":{\"enable_thinking\":true}}");
  expect_chat("{" M HI ",\"thinking\":{\"type\":\"disabled\"}}",
              "{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
              "\"chat_template_kwargs\":{\"enable_thinking\":false}}");
  /* An empty system is no message; servd's sampling extensions pass through. */
  expect_chat("{" M "\"system\":\"\"," HI ",\"seed\":3,\"ignore_eos\":true}",
              "{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"seed\":3,"
              "\"ignore_eos\":true}");
}

static void test_tools_round_trip(void **st) {
  (void)st;
  expect_chat(
      "{" M "\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"s\"},"
      "{\"type\":\"text\",\"text\":\"Let me look.\"},"
      "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}},"
      "{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"get_time\",\"input\":{}}]},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"21C\"},"
      "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\",\"is_error\":true,"
      "\"content\":[{\"type\":\"text\",\"text\":\"no clock\"}]},{\"type\":\"text\",\"text\":\"thanks\"}]}],"
      "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather now\",\"input_schema\":{\"type\":\"object\","
      "\"properties\":{\"city\":{\"type\":\"string\"}}}},{\"type\":\"custom\",\"name\":\"get_time\","
      "\"input_schema\":{\"type\":\"object\"}}],"
      "\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_weather\",\"disable_parallel_tool_use\":true}}",
      "{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
      "{\"role\":\"assistant\",\"content\":\"Let me look.\",\"tool_calls\":["
      "{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
      "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},"
      "{\"id\":\"toolu_2\",\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":\"{}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"21C\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"toolu_2\",\"content\":\"no clock\"},"
      "{\"role\":\"user\",\"content\":\"thanks\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather now\","
      "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}},"
      "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\"}}}],"
      "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
      "\"parallel_tool_calls\":false}");
  const char *tools = "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]";
  const char *f =
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]";
  char in[512], want[512];
  const char *choices[][2] = {{"auto", "\"auto\""}, {"any", "\"required\""}, {"none", "\"none\""}};
  for (int i = 0; i < 3; i++) {
    snprintf(in, sizeof in, "{" M HI ",%s,\"tool_choice\":{\"type\":\"%s\"}}", tools, choices[i][0]);
    snprintf(want, sizeof want,
             "{\"model\":\"m\",\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s,"
             "\"tool_choice\":%s}",
             f, choices[i][1]);
    expect_chat(in, want);
  }
}

static void test_count_tokens(void **st) {
  (void)st;
  /* The /tokenize body: model, the messages and the tools; tool_choice none hides the tools. */
  expect_chat_of("{\"model\":\"m\",\"system\":\"s\"," HI
                 ",\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],"
                 "\"tool_choice\":{\"type\":\"any\"}}",
                 true,
                 "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\","
                 "\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                 "\"parameters\":{\"type\":\"object\"}}}]}");
  expect_chat_of("{\"model\":\"m\"," HI ",\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
                 "\"tool_choice\":{\"type\":\"none\"}}",
                 true, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
  json_t *body = json_loads("{\"model\":\"m\"," HI ",\"max_tokens\":5}", 0, NULL);
  anth_request q;
  api_param_error e;
  assert_int_equal(anth_params_parse(body, true, &q, &e), -1);
  assert_string_equal(e.param, "max_tokens");
  json_decref(body);
}

static void test_required_and_types(void **st) {
  (void)st;
  expect_error("[1]", "", "must be a JSON object");
  expect_error("{\"max_tokens\":9," HI "}", "model", "'model' is required");
  expect_error("{\"model\":5,\"max_tokens\":9," HI "}", "model", "'model' is required");
  expect_error("{\"model\":\"m\"," HI "}", "max_tokens", "'max_tokens' is required");
  expect_error("{\"model\":\"m\",\"max_tokens\":\"9\"," HI "}", "max_tokens", "max_tokens");
  expect_error("{\"model\":\"m\",\"max_tokens\":0," HI "}", "max_tokens", "max_tokens");
  expect_error("{\"model\":\"m\",\"max_tokens\":9}", "messages", "'messages' is required");
  expect_error("{" M "\"messages\":[]}", "messages", "an empty list");
  expect_error("{" M "\"messages\":{}}", "messages", "non-empty list");
  expect_error("{" M "\"messages\":[3]}", "messages[0]", "must be an object");
  expect_error("{" M "\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "messages[0]", "\"user\" or");
  expect_error("{" M "\"messages\":[{\"role\":\"user\"}]}", "messages[0]", "content' is required");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":7}]}", "messages[0]", "content' is required");
  expect_error("{" M "\"system\":5," HI "}", "system", "'system' must be a string or a list of text blocks");
  expect_error("{" M "\"system\":[{\"type\":\"image\"}]," HI "}", "system[0]", "image content is not supported");
  expect_error("{" M HI ",\"temperature\":1.5}", "temperature", "temperature");
  expect_error("{" M HI ",\"temperature\":\"hot\"}", "temperature", "temperature");
  expect_error("{" M HI ",\"stop_sequences\":\"END\"}", "stop_sequences", "list of strings");
  expect_error("{" M HI ",\"stop_sequences\":[1]}", "stop_sequences", "must be a string");
  expect_error("{" M HI ",\"metadata\":[]}", "metadata", "object");
  expect_error("{" M HI ",\"metadata\":{\"user_id\":5}}", "metadata.user_id", "string");
  expect_error("{" M HI ",\"stream\":1,\"unknown_field\":2}", "unknown_field", "not a field");
  expect_error("{" M HI ",\"thinking\":{\"type\":\"maybe\"}}", "thinking", "enabled");
  expect_error("{" M HI ",\"output_config\":{\"format\":{\"type\":\"regex\"}}}", "output_config.format", "json_schema");
  expect_error("{" M HI ",\"output_config\":{\"verbosity\":1}}", "output_config", "not supported");
  expect_error("{" M HI ",\"thinking\":{\"type\":\"enabled\"}}", "thinking.budget_tokens", "required");
  expect_error("{" M HI ",\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":100}}", "thinking.budget_tokens",
               "budget_tokens");
  expect_error("{\"model\":\"m\",\"max_tokens\":2000," HI
               ",\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":4000}}",
               "thinking.budget_tokens", "less than 'max_tokens'");
}

static void test_blocks(void **st) {
  (void)st;
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":"
               "\"base64\",\"media_type\":\"image/png\",\"data\":\"AAAA\"}}]}]}",
               "messages[0].content[0]", "image content is not supported");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"document\"}]}]}",
               "messages[0].content[0]", "document content is not supported");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video\"}]}]}", "messages[0].content[0]",
               "not a content block type");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", "messages[0].content[0]",
               "string 'type'");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}", "messages[0].content[0]",
               "string 'type'");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "messages[0].content[0]",
               "text' is required");
  /* tool_result without a matching tool_use, or after a message without any. */
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":"
               "\"toolu_9\",\"content\":\"x\"}]}]}",
               "messages[0].content[0]", "matches no tool_use");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":["
               "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{}}]},"
               "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\"}]}]}",
               "messages[2].content[0]", "\"toolu_2\" matches no tool_use");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":["
               "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{}}]},"
               "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}",
               "messages[2].content[0]", "tool_use_id' is required");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":["
               "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{}}]},"
               "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
               "\"content\":[{\"type\":\"image\"}]}]}]}",
               "messages[2].content[0].content[0]", "image content is not supported");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":["
               "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":\"{}\"}]},"
               "{\"role\":\"user\",\"content\":\"r\"}]}",
               "messages[1].content[0]", "input' is required: an object");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":"
               "\"f\",\"input\":{}}]}]}",
               "messages[0].content[0]", "belongs in an assistant message");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":["
               "{\"type\":\"tool_result\",\"tool_use_id\":\"a\"}]},{\"role\":\"user\",\"content\":\"r\"}]}",
               "messages[1].content[0]", "belongs in a user message");
  expect_error("{" M "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\"}]}",
               "messages[1]", "prefill");
}

static void test_tools_bad(void **st) {
  (void)st;
  expect_error("{" M HI ",\"tools\":{}}", "tools", "list of tools");
  expect_error("{" M HI ",\"tools\":[1]}", "tools[0]", "must be an object");
  expect_error("{" M HI ",\"tools\":[{\"input_schema\":{}}]}", "tools[0]", "name' is required");
  expect_error("{" M HI ",\"tools\":[{\"name\":\"f\"}]}", "tools[0]", "input_schema' is required");
  expect_error("{" M HI ",\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}]}", "tools[0]",
               "no server tools");
  expect_error("{" M HI ",\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":\"any\"}", "tool_choice",
               "must be an object");
  expect_error("{" M HI ",\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"all\"}}",
               "tool_choice", "auto, any, tool or none");
  expect_error("{" M HI ",\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\"}}",
               "tool_choice", "name' is required");
  expect_error("{" M HI ",\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"auto\","
               "\"disable_parallel_tool_use\":\"yes\"}}",
               "tool_choice", "boolean");
}

static void test_param_names(void **st) {
  (void)st;
  char out[64];
  const char *cases[][2] = {{"messages[3].content", "messages"},
                            {"stop", "stop_sequences"},
                            {"tools[1].function.parameters", "tools[1].input_schema"},
                            {"tools[1].function.name", "tools[1].name"},
                            {"tools[12].function", "tools[12]"},
                            {"max_tokens", "max_tokens"},
                            {"top_k", "top_k"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    anth_param_name(cases[i][0], out, sizeof out);
    assert_string_equal(out, cases[i][1]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plain),        cmocka_unit_test(test_tools_round_trip),
      cmocka_unit_test(test_count_tokens), cmocka_unit_test(test_required_and_types),
      cmocka_unit_test(test_blocks),       cmocka_unit_test(test_tools_bad),
      cmocka_unit_test(test_param_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
