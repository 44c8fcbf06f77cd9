/* SSE framing and OpenAI chunk parsing, against hand-written streams in the shapes that vLLM,
 * llama.cpp's server and the OpenAI API send. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench.h"

typedef struct events {
  char data[8][128];
  int n;
} events;

static int collect(void *ctx, const char *data, size_t len) {
  events *e = ctx;
  assert_true(e->n < 8);
  assert_int_equal(strlen(data), len);
  snprintf(e->data[e->n++], sizeof e->data[0], "%s", data);
  return 0;
}

/* Feeds the stream split at every possible point; each split must give the same events. */
static void feed_all_splits(const char *stream, const events *want) {
  size_t n = strlen(stream);
  for (size_t cut = 0; cut <= n; cut++) {
    bench_sse s;
    bench_sse_init(&s, 1024);
    events got = {0};
    assert_int_equal(bench_sse_feed(&s, stream, cut, collect, &got), 0);
    assert_int_equal(bench_sse_feed(&s, stream + cut, n - cut, collect, &got), 0);
    assert_int_equal(got.n, want->n);
    for (int i = 0; i < want->n; i++) assert_string_equal(got.data[i], want->data[i]);
    bench_sse_free(&s);
  }
}

static void test_lf_and_done(void **state) {
  (void)state;
  events want = {{"{\"a\":1}", "[DONE]"}, 2};
  feed_all_splits("data: {\"a\":1}\n\ndata: [DONE]\n\n", &want);
}

static void test_crlf_comments_and_fields(void **state) {
  (void)state;
  /* llama.cpp and proxies may use CRLF; ": ping" comments and event:/id: fields are ignored */
  events want = {{"x", "y"}, 2};
  feed_all_splits(": ping\r\n\r\nevent: message\r\nid: 7\r\ndata: x\r\n\r\ndata:y\r\n\r\n", &want);
}

static void test_multiline_data_and_bare_cr(void **state) {
  (void)state;
  events want = {{"one\ntwo", ""}, 2};
  feed_all_splits("data: one\rdata: two\r\rdata\n\n", &want);
}

static void test_line_too_long(void **state) {
  (void)state;
  bench_sse s;
  bench_sse_init(&s, 16);
  events got = {0};
  assert_int_equal(bench_sse_feed(&s, "data: 0123456789abcdefghij\n\n", 28, collect, &got), -1);
  assert_int_equal(got.n, 0);
  bench_sse_free(&s);
  bench_sse_free(NULL);
}

static void test_chunk_completions(void **state) {
  (void)state;
  const char *d = "{\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\" hello\",\"finish_reason\":null}]}";
  bench_chunk c;
  json_t *doc;
  assert_int_equal(bench_chunk_parse(d, strlen(d), BENCH_API_COMPLETIONS, &c, &doc), 0);
  assert_int_equal(c.text_len, 6);
  assert_memory_equal(c.text, " hello", 6);
  assert_false(c.is_error);
  assert_int_equal(c.usage_completion_tokens, -1);
  json_decref(doc);
}

/* A model may emit a NUL byte; servers send it as the valid JSON escape \u0000. It is one token. */
static void test_chunk_nul_text(void **state) {
  (void)state;
  const char *d = "{\"choices\":[{\"index\":0,\"text\":\"a\\u0000b\"}]}";
  bench_chunk c;
  json_t *doc;
  assert_int_equal(bench_chunk_parse(d, strlen(d), BENCH_API_COMPLETIONS, &c, &doc), 0);
  assert_int_equal(c.text_len, 3);
  assert_memory_equal(c.text, "a\0b", 3);
  json_decref(doc);
}

static void test_chunk_chat_role_usage_error(void **state) {
  (void)state;
  bench_chunk c;
  json_t *doc;
  const char *role = "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}";
  assert_int_equal(bench_chunk_parse(role, strlen(role), BENCH_API_CHAT, &c, &doc), 0);
  assert_int_equal(c.text_len, 0);
  json_decref(doc);

  const char *content = "{\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}";
  assert_int_equal(bench_chunk_parse(content, strlen(content), BENCH_API_CHAT, &c, &doc), 0);
  assert_int_equal(c.text_len, 2);
  json_decref(doc);

  const char *usage = "{\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":17}}";
  assert_int_equal(bench_chunk_parse(usage, strlen(usage), BENCH_API_CHAT, &c, &doc), 0);
  assert_int_equal(c.usage_completion_tokens, 17);
  assert_int_equal(c.text_len, 0);
  json_decref(doc);

  const char *err = "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}";
  assert_int_equal(bench_chunk_parse(err, strlen(err), BENCH_API_CHAT, &c, &doc), 0);
  assert_true(c.is_error);
  assert_non_null(strstr(c.errmsg, "boom"));
  json_decref(doc);

  assert_int_equal(bench_chunk_parse("{nope", 5, BENCH_API_CHAT, &c, &doc), -1);
  assert_null(doc);
  assert_int_equal(bench_chunk_parse("[1]", 3, BENCH_API_CHAT, &c, &doc), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lf_and_done),
      cmocka_unit_test(test_crlf_comments_and_fields),
      cmocka_unit_test(test_multiline_data_and_bare_cr),
      cmocka_unit_test(test_line_too_long),
      cmocka_unit_test(test_chunk_completions),
      cmocka_unit_test(test_chunk_nul_text),
      cmocka_unit_test(test_chunk_chat_role_usage_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
