/* Ollama's /api/chat, /api/generate and /api/embed bodies into OpenAI bodies (api/ollama.h): what each
 * Ollama field and option becomes, and the 400s naming the Ollama field. Expected bodies are written
 * out by hand from the two APIs' field definitions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>

#include "api/ollama.h"

static void expect_body(const char *text, ollama_kind kind, oai_mode mode, const char *want) {
  json_t *body = json_loads(text, 0, NULL), *w = json_loads(want, 0, NULL);
  if (!body || !w) fail_msg("bad test JSON: %s / %s", text, want);
  ollama_request q;
  api_param_error e;
  if (ollama_params_parse(body, kind, &q, &e) != 0) fail_msg("%s: %s (%s)", text, e.message, e.param);
  assert_int_equal(q.mode, mode);
  if (!json_equal(q.body, w)) fail_msg("%s\n got  %s\n want %s", text, json_dumps(q.body, JSON_SORT_KEYS), want);
  ollama_request_free(&q);
  json_decref(body);
  json_decref(w);
}

static void expect_error(const char *text, ollama_kind kind, const char *param, const char *needle) {
  json_t *body = json_loads(text, 0, NULL);
  if (!body) fail_msg("bad test JSON: %s", text);
  ollama_request q;
  api_param_error e;
  assert_int_equal(ollama_params_parse(body, kind, &q, &e), -1);
  assert_int_equal(e.status, 400);
  if (strcmp(e.param, param) || !strstr(e.message, needle))
    fail_msg("%s: param '%s' message '%s' (want '%s', '%s')", text, e.param, e.message, param, needle);
  json_decref(body);
}

#define HI "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_chat(void **st) {
  (void)st;
  expect_body("{\"model\":\"m\"," HI ",\"options\":{\"num_predict\":5,\"temperature\":0.2,\"top_k\":3,\"top_p\":0.5,"
              "\"min_p\":0.1,\"seed\":4,\"stop\":[\"x\"],\"repeat_penalty\":1.1,\"num_ctx\":2048,\"num_thread\":8},"
              "\"keep_alive\":\"5m\",\"think\":false,\"tools\":[]}",
              OLLAMA_CHAT, OAI_CHAT,
              "{\"model\":\"m\",\"stream\":true," HI ",\"max_tokens\":5,\"temperature\":0.2,\"top_k\":3,\"top_p\":0.5,"
              "\"min_p\":0.1,\"seed\":4,\"stop\":[\"x\"],\"repetition_penalty\":1.1,"
              "\"chat_template_kwargs\":{\"enable_thinking\":false}}");
  /* think: the template's switch; an effort is also gpt-oss's reasoning_effort. */
  expect_body("{\"model\":\"m\"," HI ",\"think\":true}", OLLAMA_CHAT, OAI_CHAT,
              "{\"model\":\"m\",\"stream\":true," HI ",\"chat_template_kwargs\":{\"enable_thinking\":true}}");
  expect_body("{\"model\":\"m\"," HI ",\"think\":\"high\"}", OLLAMA_CHAT, OAI_CHAT,
              "{\"model\":\"m\",\"stream\":true," HI ",\"chat_template_kwargs\":{\"enable_thinking\":true,"
              "\"reasoning_effort\":\"high\"}}");
  expect_body("{\"model\":\"m\",\"stream\":false,\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
              "[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},{\"role\":\"tool\",\"content\":\"2\","
              "\"tool_name\":\"f\"}],\"format\":\"json\",\"options\":{\"num_predict\":-1}}",
              OLLAMA_CHAT, OAI_CHAT,
              "{\"model\":\"m\",\"stream\":false,\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
              "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},{\"role\":\"tool\","
              "\"content\":\"2\"}],\"response_format\":{\"type\":\"json_object\"}}");
  expect_body("{\"model\":\"m\"," HI ",\"format\":{\"type\":\"object\"}}", OLLAMA_CHAT, OAI_CHAT,
              "{\"model\":\"m\",\"stream\":true," HI ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
              "{\"name\":\"format\",\"schema\":{\"type\":\"object\"}}}}");
}

static void test_generate_embed(void **st) {
  (void)st;
  expect_body("{\"model\":\"m\",\"prompt\":\"p\",\"system\":\"s\",\"stream\":false}", OLLAMA_GENERATE, OAI_CHAT,
              "{\"model\":\"m\",\"stream\":false,\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":"
              "\"user\",\"content\":\"p\"}]}");
  expect_body("{\"model\":\"m\",\"prompt\":\"p\",\"raw\":true}", OLLAMA_GENERATE, OAI_COMPLETIONS,
              "{\"model\":\"m\",\"stream\":true,\"prompt\":\"p\"}");
  expect_body("{\"model\":\"m\",\"input\":[\"a\",\"b\"],\"truncate\":true,\"dimensions\":8}", OLLAMA_EMBED,
              OAI_EMBEDDINGS, "{\"model\":\"m\",\"input\":[\"a\",\"b\"],\"dimensions\":8}");
}

static void test_bad(void **st) {
  (void)st;
  expect_error("[]", OLLAMA_CHAT, "", "JSON object");
  expect_error("{" HI "}", OLLAMA_CHAT, "model", "'model' is required");
  expect_error("{\"model\":7," HI "}", OLLAMA_CHAT, "model", "'model' is required");
  expect_error("{\"model\":\"m\"}", OLLAMA_CHAT, "messages", "'messages' is required");
  expect_error("{\"model\":\"m\",\"messages\":{}}", OLLAMA_CHAT, "messages", "list");
  expect_error("{\"model\":\"m\",\"messages\":[1]}", OLLAMA_CHAT, "messages[0]", "object");
  expect_error("{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", OLLAMA_CHAT, "messages[0]", "role");
  expect_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[]}]}", OLLAMA_CHAT, "messages[0]",
               "string");
  expect_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"aGk=\"]}]}",
               OLLAMA_CHAT, "messages[0]", "images are not supported");
  expect_error("{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{}}]}]}",
               OLLAMA_CHAT, "messages[0]", "tool_calls");
  expect_error("{\"model\":\"m\"," HI ",\"options\":[]}", OLLAMA_CHAT, "options", "object");
  expect_error("{\"model\":\"m\"," HI ",\"options\":{\"num_predict\":0}}", OLLAMA_CHAT, "options.num_predict", ">= 1");
  expect_error("{\"model\":\"m\"," HI ",\"options\":{\"num_ctx\":\"big\"}}", OLLAMA_CHAT, "options.num_ctx", ">= 1");
  expect_error("{\"model\":\"m\"," HI ",\"options\":{\"warp\":1}}", OLLAMA_CHAT, "options.warp", "not an option");
  expect_error("{\"model\":\"m\"," HI ",\"format\":3}", OLLAMA_CHAT, "format", "JSON schema");
  expect_error("{\"model\":\"m\"," HI ",\"stream\":\"yes\"}", OLLAMA_CHAT, "stream", "boolean");
  expect_error("{\"model\":\"m\"," HI ",\"keep_alive\":[]}", OLLAMA_CHAT, "keep_alive", "duration");
  expect_error("{\"model\":\"m\"," HI ",\"think\":3}", OLLAMA_CHAT, "think", "boolean");
  expect_error("{\"model\":\"m\"," HI ",\"unknown\":3}", OLLAMA_CHAT, "unknown", "not a field");
  expect_error("{\"model\":\"m\",\"prompt\":5}", OLLAMA_GENERATE, "prompt", "string");
  expect_error("{\"model\":\"m\",\"prompt\":\"p\",\"suffix\":\"s\"}", OLLAMA_GENERATE, "suffix", "not supported");
  expect_error("{\"model\":\"m\",\"prompt\":\"p\",\"images\":[\"x\"]}", OLLAMA_GENERATE, "images", "not supported");
  expect_error("{\"model\":\"m\"}", OLLAMA_EMBED, "input", "'input' is required");
  expect_error("{\"model\":\"m\",\"input\":\"x\",\"truncate\":1}", OLLAMA_EMBED, "truncate", "boolean");
  char out[48];
  ollama_param_name("max_tokens", out, sizeof out);
  assert_string_equal(out, "options.num_predict");
  ollama_param_name("response_format", out, sizeof out);
  assert_string_equal(out, "format");
  ollama_param_name("temperature", out, sizeof out);
  assert_string_equal(out, "options.temperature");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_chat), cmocka_unit_test(test_generate_embed),
                                     cmocka_unit_test(test_bad)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
