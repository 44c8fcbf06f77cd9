/* The API routes over real HTTP against fake models (substituted through servd_model_ops): OpenAI
 * shapes, SSE framing, validation, errors, 429, engine failures, disconnects, KServe v2, auth,
 * metrics (checked with promtool when installed), tokenizer routes, repository load/unload. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <cmocka.h>
#include <jansson.h>

#include "api/api.h"
#include "api/route.h"
#include "servd/tensor.h"
#include "fake_model_ops.h"
#include "test_http_util.h"

/* ---- servers ---------------------------------------------------------------------------------- */

static tloop L;
typedef struct inst {
  servd_api *api;
  servd_http_server *http;
  int port;
  const char *key;
} inst;
static inst open_srv, auth_srv;
static char repo_dir[] = "/tmp/servd-test-repo-XXXXXX";
static FILE *devnull;

static void start_inst(void *arg) {
  inst *in = arg;
  servd_api_options o;
  servd_api_options_default(&o);
  o.ops = &fake_ops;
  o.api_key = in->key;
  o.log = devnull;
  const char *repo[] = {repo_dir};
  o.repository = repo;
  o.n_repository = 1;
  o.unload_timeout_ms = 1000;
  assert_int_equal(servd_api_create(&L.loop, &o, &in->api), 0);
  servd_api_add_model(in->api, fake_new("lm", SERVD_MODEL_CAUSAL_LM));
  servd_api_add_model(in->api, fake_new("gen", SERVD_MODEL_GENERIC));
  servd_http_limits lim;
  servd_http_limits_default(&lim);
  lim.max_body_bytes = 64 * 1024;
  servd_http_callbacks cb = servd_api_http_callbacks(in->api);
  assert_int_equal(servd_http_server_create(&L.loop, &lim, &cb, &in->http), 0);
  assert_int_equal(servd_http_server_listen(in->http, "127.0.0.1", 0), 0);
  servd_api_set_server(in->api, in->http);
  in->port = servd_http_server_port(in->http);
}

static void after_unload(void *ud) {
  inst *in = ud;
  servd_http_server_close(in->http, NULL, NULL);
  servd_api_close(in->api, NULL, NULL);
}

static void stop_inst(void *arg) {
  inst *in = arg;
  servd_api_unload_all(in->api, 0, after_unload, in);
}

static int setup(void **st) {
  (void)st;
  devnull = fopen("/dev/null", "w");
  if (!mkdtemp(repo_dir)) return -1;
  char p[256];
  snprintf(p, sizeof p, "%s/extra.mpk", repo_dir);
  FILE *f = fopen(p, "w");
  fputs("x", f);
  fclose(f);
  snprintf(p, sizeof p, "%s/broken.mpk", repo_dir);
  f = fopen(p, "w");
  fputs("x", f);
  fclose(f);
  tloop_start(&L);
  auth_srv.key = "sekret-key";
  tloop_run(&L, start_inst, &open_srv);
  tloop_run(&L, start_inst, &auth_srv);
  return 0;
}

static int teardown(void **st) {
  (void)st;
  tloop_run(&L, stop_inst, &open_srv);
  tloop_run(&L, stop_inst, &auth_srv);
  tloop_stop(&L);
  char p[256];
  snprintf(p, sizeof p, "%s/extra.mpk", repo_dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/broken.mpk", repo_dir);
  unlink(p);
  rmdir(repo_dir);
  fclose(devnull);
  return 0;
}

static json_t *post_json(int port, const char *path, const char *body, int *status, tc_resp *keep) {
  tc_resp r = tc_request(port, "POST", path, "Content-Type: application/json\r\n", body);
  *status = r.status;
  json_t *j = r.body ? json_loads(r.body, JSON_DECODE_ANY, NULL) : NULL;
  if (keep) *keep = r;
  else tc_resp_free(&r);
  return j;
}

static json_t *get_json(int port, const char *path, int *status) {
  tc_resp r = tc_request(port, "GET", path, NULL, NULL);
  *status = r.status;
  json_t *j = r.body ? json_loads(r.body, JSON_DECODE_ANY, NULL) : NULL;
  tc_resp_free(&r);
  return j;
}

static void set_draining(void *arg) { servd_api_set_draining(open_srv.api, *(bool *)arg); }

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_health_and_meta(void **st) {
  (void)st;
  int s;
  json_t *j = get_json(open_srv.port, "/v2/health/live", &s);
  assert_int_equal(s, 200);
  json_decref(j);
  j = get_json(open_srv.port, "/v2/health/ready", &s);
  assert_int_equal(s, 200);
  assert_true(json_is_true(json_object_get(j, "ready")));
  json_decref(j);
  atomic_store(&fake_ready, false); /* the engine reports being stuck */
  j = get_json(open_srv.port, "/v2/health/ready", &s);
  assert_int_equal(s, 503);
  json_decref(j);
  j = get_json(open_srv.port, "/v2/health/live", &s); /* a stuck engine fails liveness too: restart it */
  assert_int_equal(s, 503);
  assert_true(json_is_false(json_object_get(j, "live")));
  json_decref(j);
  bool on = true, off = false;
  tloop_run(&L, set_draining, &on); /* draining: not ready, but live until it exits */
  j = get_json(open_srv.port, "/v2/health/live", &s);
  assert_int_equal(s, 200);
  json_decref(j);
  tloop_run(&L, set_draining, &off);
  j = get_json(open_srv.port, "/v2/models/lm/ready", &s);
  assert_int_equal(s, 503);
  json_decref(j);
  atomic_store(&fake_ready, true);
  j = get_json(open_srv.port, "/v2", &s);
  assert_int_equal(s, 200);
  assert_string_equal(json_string_value(json_object_get(j, "name")), "servd");
  json_decref(j);
  j = get_json(open_srv.port, "/v2/models/gen", &s);
  assert_int_equal(s, 200);
  assert_string_equal(json_string_value(json_object_get(j, "name")), "gen");
  assert_true(json_is_array(json_object_get(j, "inputs")));
  json_decref(j);
  j = get_json(open_srv.port, "/v2/models/nope", &s);
  assert_int_equal(s, 404);
  assert_true(json_is_string(json_object_get(j, "error")));
  json_decref(j);
  j = get_json(open_srv.port, "/v1/models", &s);
  assert_int_equal(s, 200);
  assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
  assert_int_equal(json_array_size(json_object_get(j, "data")), 2);
  json_decref(j);
  j = get_json(open_srv.port, "/v1/models/lm", &s);
  assert_int_equal(s, 200);
  assert_string_equal(json_string_value(json_object_get(j, "id")), "lm");
  json_decref(j);
  j = get_json(open_srv.port, "/v1/models/none", &s);
  assert_int_equal(s, 404);
  json_decref(j);
  j = get_json(open_srv.port, "/v1/completions", &s);
  assert_int_equal(s, 405);
  json_decref(j);
}

static void test_completion(void **st) {
  (void)st;
  int s;
  json_t *j =
      post_json(open_srv.port, "/v1/completions", "{\"model\":\"lm\",\"prompt\":\"hi\",\"max_tokens\":3}", &s, NULL);
  assert_int_equal(s, 200);
  assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
  assert_memory_equal(json_string_value(json_object_get(j, "id")), "cmpl-", 5);
  json_t *c = json_array_get(json_object_get(j, "choices"), 0);
  assert_string_equal(json_string_value(json_object_get(c, "text")), "w0 w1 w2 ");
  assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
  json_t *u = json_object_get(j, "usage");
  assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 2);
  assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 3);
  assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 5);
  json_decref(j);
  /* n = 2: two choices. */
  j = post_json(open_srv.port, "/v1/chat/completions",
                "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":\"hey\"}],\"n\":2,\"max_tokens\":2}",
                &s, NULL);
  assert_int_equal(s, 200);
  assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
  json_t *ch = json_object_get(j, "choices");
  assert_int_equal(json_array_size(ch), 2);
  int seen = 0;
  for (size_t i = 0; i < 2; i++) {
    json_t *e = json_array_get(ch, i);
    seen |= 1 << json_integer_value(json_object_get(e, "index"));
    json_t *msg = json_object_get(e, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "w0 w1 ");
  }
  assert_int_equal(seen, 3);
  /* "hey" + ">" = 4 prompt tokens, counted once for both choices. */
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 4);
  json_decref(j);
}

static void test_logprobs(void **st) {
  (void)st;
  int s;
  json_t *j = post_json(open_srv.port, "/v1/completions",
                        "{\"model\":\"lm\",\"prompt\":\"hi\",\"max_tokens\":2,\"logprobs\":2}", &s, NULL);
  assert_int_equal(s, 200);
  json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
  assert_int_equal(json_array_size(json_object_get(lp, "tokens")), 2);
  assert_true(json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 0)) == -0.5);
  assert_int_equal(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 1)), 2);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 1)), 3);
  json_decref(j);
  j = post_json(open_srv.port, "/v1/chat/completions",
                "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2,"
                "\"logprobs\":true,\"top_logprobs\":3}",
                &s, NULL);
  assert_int_equal(s, 200);
  json_t *content =
      json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
  assert_int_equal(json_array_size(content), 2);
  json_t *e0 = json_array_get(content, 0);
  assert_string_equal(json_string_value(json_object_get(e0, "token")), "a");
  assert_int_equal(json_array_size(json_object_get(e0, "top_logprobs")), 3);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(e0, "bytes"), 0)), 'a');
  json_decref(j);
}

static void test_chat_stream(void **st) {
  (void)st;
  int s;
  tc_resp r;
  json_decref(post_json(open_srv.port, "/v1/chat/completions",
                        "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                        "\"hi\"}]}],\"max_tokens\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                        &s, &r));
  assert_int_equal(s, 200);
  assert_string_equal(tc_header(&r, "Content-Type"), "text/event-stream");
  /* Every event is "data: ...\n\n"; the last is [DONE]. */
  char content[256] = "";
  char *p = r.body;
  int events = 0, usage_seen = 0, role_seen = 0, finish_seen = 0, done_seen = 0;
  while (*p) {
    assert_memory_equal(p, "data: ", 6);
    char *end = strstr(p, "\n\n");
    assert_non_null(end);
    *end = '\0';
    const char *data = p + 6;
    events++;
    if (strcmp(data, "[DONE]") == 0) {
      done_seen = 1;
      assert_string_equal(end + 2, "");
      break;
    }
    json_t *j = json_loads(data, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
    assert_memory_equal(json_string_value(json_object_get(j, "id")), "chatcmpl-", 9);
    json_t *ch = json_object_get(j, "choices");
    if (json_array_size(ch) == 0) {
      usage_seen = 1;
      assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 2);
    } else {
      json_t *d = json_object_get(json_array_get(ch, 0), "delta");
      if (json_object_get(d, "role")) role_seen = 1;
      json_t *c = json_object_get(d, "content");
      if (json_is_string(c)) strcat(content, json_string_value(c));
      json_t *fr = json_object_get(json_array_get(ch, 0), "finish_reason");
      if (json_is_string(fr)) {
        finish_seen = 1;
        assert_string_equal(json_string_value(fr), "length");
      }
    }
    json_decref(j);
    p = end + 2;
  }
  assert_true(done_seen && usage_seen && role_seen && finish_seen);
  assert_string_equal(content, "w0 w1 ");
  assert_true(events >= 5);
  tc_resp_free(&r);
}

typedef struct bad_case {
  const char *path, *body;
  int status;
  const char *needle; /* in error.message, or error.param / error.code */
} bad_case;

static void test_validation(void **st) {
  (void)st;
  static const bad_case cases[] = {
      {"/v1/completions", "{", 400, "malformed JSON"},
      {"/v1/completions", "[1]", 400, "JSON object"},
      {"/v1/completions", "{\"model\":\"lm\"}", 400, "prompt"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"temperature\":-1}", 400, "temperature"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"temperature\":1e300}", 400, "temperature"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"top_p\":0}", 400, "top_p"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"max_tokens\":-5}", 400, "max_tokens"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"max_tokens\":\"9\"}", 400, "max_tokens"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"max_completion_tokens\":0}", 400,
       "max_completion_tokens"},
      {"/v1/chat/completions",
       "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":2,"
       "\"max_tokens\":\"many\"}",
       400, "max_tokens"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"n\":1000}", 400, "n"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"logprobs\":99}", 400, "logprobs"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"stop\":5}", 400, "stop"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"stream\":\"yes\"}", 400, "stream"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"seed\":1.5}", 400, "seed"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"top_k\":-7}", 400, "top_k"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"presence_penalty\":3}", 400, "presence_penalty"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400,
       "stream_options"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":[-1, 2]}", 400, "prompt"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"max_tokens\":100}", 400, "maximum context length"},
      {"/v1/completions", "{\"model\":\"nope\",\"prompt\":\"x\"}", 404, "model_not_found"},
      {"/v1/completions", "{\"model\":5,\"prompt\":\"x\"}", 400, "model"},
      {"/v1/completions", "{\"model\":\"gen\",\"prompt\":\"x\"}", 400, "not a language model"},
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"prompt\":\"y\"}", 400, "malformed JSON"},
      {"/v1/chat/completions", "{\"model\":\"lm\",\"messages\":[]}", 400, "messages"},
      {"/v1/chat/completions", "{\"model\":\"lm\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400,
       "messages[0]"},
      {"/v1/chat/completions", "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":7}]}", 400,
       "messages[0]"},
      {"/v1/chat/completions",
       "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400,
       "top_logprobs"},
      {"/v1/chat/completions", "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}",
       400, "logprobs"},
      {"/tokenize", "{\"model\":\"lm\",\"prompt\":{}}", 400, "prompt"},
      {"/detokenize", "{\"model\":\"lm\",\"tokens\":\"abc\"}", 400, "tokens"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int s;
    json_t *j = post_json(open_srv.port, cases[i].path, cases[i].body, &s, NULL);
    if (s != cases[i].status) fprintf(stderr, "case %zu (%s): status %d\n", i, cases[i].body, s);
    assert_int_equal(s, cases[i].status);
    json_t *e = json_object_get(j, "error");
    assert_true(json_is_object(e));
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(json_is_string(json_object_get(e, "type")));
    assert_non_null(json_object_get(e, "param"));
    assert_non_null(json_object_get(e, "code"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *param = json_string_value(json_object_get(e, "param"));
    const char *code = json_string_value(json_object_get(e, "code"));
    bool found = strstr(msg, cases[i].needle) || (param && strstr(param, cases[i].needle)) ||
                 (code && strstr(code, cases[i].needle));
    if (!found) fprintf(stderr, "case %zu: '%s' not in '%s'\n", i, cases[i].needle, msg);
    assert_true(found);
    json_decref(j);
  }
}

/* Names taken from the path or the body end up in error messages; bytes that are not UTF-8 (or a
 * character cut by the message's length) must not turn the 4xx answer into a 500. */
static void test_error_messages_not_utf8(void **st) {
  (void)st;
  int s;
  json_t *j = get_json(open_srv.port, "/v2/models/caf%e9/ready", &s);
  assert_int_equal(s, 404);
  const char *msg = json_string_value(json_object_get(j, "error"));
  assert_non_null(msg);
  assert_string_equal(msg, "model 'caf?' is not served here");
  json_decref(j);
  j = post_json(open_srv.port, "/v1/completions", "{\"model\":\"\\u00e9\\u00e9\",\"prompt\":\"x\"}", &s, NULL);
  assert_int_equal(s, 404);
  json_decref(j);
  /* A model name of 1000 two-byte characters: the message is cut at 1023 bytes, mid-character. */
  char body[4096];
  int n = snprintf(body, sizeof body, "{\"prompt\":\"x\",\"model\":\"a");
  for (int i = 0; i < 1000; i++) n += snprintf(body + n, sizeof body - (size_t)n, "\xc3\xa9");
  snprintf(body + n, sizeof body - (size_t)n, "\"}");
  j = post_json(open_srv.port, "/v1/completions", body, &s, NULL);
  assert_int_equal(s, 404);
  msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
  assert_non_null(msg);
  assert_true(strncmp(msg, "The model `a\xc3\xa9", 14) == 0);
  json_decref(j);
}

static void test_huge_body(void **st) {
  (void)st;
  size_t n = 200 * 1024;
  char *body = malloc(n + 64);
  strcpy(body, "{\"model\":\"lm\",\"prompt\":\"");
  memset(body + strlen(body), 'a', n);
  strcpy(body + 24 + n, "\"}");
  int s;
  json_t *j = post_json(open_srv.port, "/v1/completions", body, &s, NULL);
  assert_int_equal(s, 413);
  assert_true(json_is_string(json_object_get(json_object_get(j, "error"), "message")));
  json_decref(j);
  free(body);
}

static void test_busy_is_429(void **st) {
  (void)st;
  atomic_store(&fake_busy, 1);
  tc_resp r;
  int s;
  json_t *j =
      post_json(open_srv.port, "/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"max_tokens\":1}", &s, &r);
  int s_stream;
  json_t *js = post_json(open_srv.port, "/v1/chat/completions",
                         "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true}",
                         &s_stream, NULL);
  json_decref(js);
  atomic_store(&fake_busy, 0);
  assert_int_equal(s_stream, 429); /* a stream that cannot start is a plain 429 too */
  assert_int_equal(s, 429);
  assert_non_null(tc_header(&r, "Retry-After"));
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "rate_limit_exceeded");
  tc_resp_free(&r);
  json_decref(j);
  /* The server keeps serving. */
  j = post_json(open_srv.port, "/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"max_tokens\":1}", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
}

static void test_engine_error_is_500(void **st) {
  (void)st;
  atomic_store(&fake_error, 1);
  int s;
  json_t *j =
      post_json(open_srv.port, "/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"max_tokens\":4}", &s, NULL);
  atomic_store(&fake_error, 0);
  assert_int_equal(s, 500);
  assert_non_null(strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")), "boom"));
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "model_error");
  json_decref(j);
  j = post_json(open_srv.port, "/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"max_tokens\":2}", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
}

static void test_disconnect_cancels(void **st) {
  (void)st;
  int cancels = atomic_load(&n_cancel);
  atomic_store(&fake_delay_us, 20000);
  int fd = tc_connect(open_srv.port);
  const char *body = "{\"model\":\"lm\",\"prompt\":\"x\",\"max_tokens\":50,\"stream\":true}";
  char head[256];
  snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: %zu\r\n\r\n", strlen(body));
  tc_sends(fd, head);
  tc_sends(fd, body);
  char buf[512];
  /* Wait for the stream to start, then hang up. */
  assert_true(recv(fd, buf, sizeof buf, 0) > 0);
  close(fd);
  for (int i = 0; i < 5000 && (atomic_load(&n_cancel) == cancels || atomic_load(&n_live) != 0); i++) usleep(1000);
  atomic_store(&fake_delay_us, 0);
  assert_int_equal(atomic_load(&n_cancel), cancels + 1);
  assert_int_equal(atomic_load(&n_live), 0); /* the engine request was released */
}

static void test_kserve_infer(void **st) {
  (void)st;
  int s;
  json_t *j = post_json(open_srv.port, "/v2/models/gen/infer",
                        "{\"id\":\"r1\",\"inputs\":[{\"name\":\"x\",\"shape\":[2,2],\"datatype\":\"FP32\","
                        "\"data\":[[1,2],[3,4.5]]}]}",
                        &s, NULL);
  assert_int_equal(s, 200);
  assert_string_equal(json_string_value(json_object_get(j, "model_name")), "gen");
  assert_string_equal(json_string_value(json_object_get(j, "id")), "r1");
  json_t *o = json_array_get(json_object_get(j, "outputs"), 0);
  assert_string_equal(json_string_value(json_object_get(o, "name")), "y");
  assert_string_equal(json_string_value(json_object_get(o, "datatype")), "FP32");
  assert_int_equal(json_integer_value(json_array_get(json_object_get(o, "shape"), 1)), 2);
  json_t *d = json_object_get(o, "data");
  assert_int_equal(json_array_size(d), 4);
  double want[] = {2, 4, 6, 9};
  for (int i = 0; i < 4; i++) assert_true(json_number_value(json_array_get(d, (size_t)i)) == want[i]);
  json_decref(j);
  static const struct {
    const char *body;
    int status;
  } bad[] = {
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[2],\"datatype\":\"INT64\",\"data\":[1,2]}]}", 400},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[3],\"datatype\":\"FP32\",\"data\":[1,2]}]}", 400},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[-1],\"datatype\":\"FP32\",\"data\":[]}]}", 400},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\",\"data\":[1,\"a\"]}]}", 400},
      {"{\"inputs\":[]}", 400},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[[1,2,3],[4]]}]}", 400},
      {"{\"inputs\":", 400},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}],\"outputs\":[{\"name\":\"q\"}]"
       "}",
       400},
      {"{\"inputs\":[{\"name\":\"bad\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", 400},
      {"{\"inputs\":[{\"name\":\"odd\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", 400},
      {"{\"inputs\":[{\"name\":\"boom\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", 500},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    j = post_json(open_srv.port, "/v2/models/gen/infer", bad[i].body, &s, NULL);
    if (s != bad[i].status) fprintf(stderr, "infer case %zu: %d\n", i, s);
    assert_int_equal(s, bad[i].status);
    assert_true(json_is_string(json_object_get(j, "error")));
    if (s == 500) { /* the exception, structured */
      assert_string_equal(json_string_value(json_object_get(j, "type")), "model_error");
      json_t *e = json_object_get(j, "exception");
      assert_string_equal(json_string_value(json_object_get(e, "type")), "RuntimeError");
      assert_string_equal(json_string_value(json_object_get(e, "message")), "the model raised");
    }
    json_decref(j);
  }
  /* A model failure affects only that request. */
  j = post_json(open_srv.port, "/v2/models/gen/infer",
                "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
  j = post_json(open_srv.port, "/v2/models/lm/infer",
                "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", &s, NULL);
  assert_int_equal(s, 400);
  json_decref(j);
}

static void *infer_thread(void *p) {
  int *status = p;
  int s;
  json_decref(post_json(open_srv.port, "/v2/models/gen/infer",
                        "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", &s, NULL));
  *status = s;
  return NULL;
}

/* More concurrent predictions than interpreters: they wait their turn (at most one per interpreter
 * runs) and all succeed. */
static void test_kserve_concurrency(void **st) {
  (void)st;
  atomic_store(&fake_delay_us, 20000);
  atomic_store(&max_predict_running, 0);
  pthread_t t[8];
  int status[8];
  for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, infer_thread, &status[i]);
  for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  atomic_store(&fake_delay_us, 0);
  for (int i = 0; i < 8; i++) assert_int_equal(status[i], 200);
  assert_true(atomic_load(&max_predict_running) <= 2); /* the fake reports 2 interpreters */
}

static void test_auth(void **st) {
  (void)st;
  int p = auth_srv.port;
  tc_resp r = tc_request(p, "GET", "/v1/models", NULL, NULL);
  assert_int_equal(r.status, 401);
  json_t *j = json_loads(r.body, 0, NULL);
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "invalid_api_key");
  json_decref(j);
  tc_resp_free(&r);
  r = tc_request(p, "GET", "/v1/models", "Authorization: Bearer sekret-kez\r\n", NULL);
  assert_int_equal(r.status, 401);
  tc_resp_free(&r);
  r = tc_request(p, "GET", "/v1/models", "Authorization: Bearer sekret-key-longer\r\n", NULL);
  assert_int_equal(r.status, 401);
  tc_resp_free(&r);
  r = tc_request(p, "GET", "/v1/models", "Authorization: Bearer sekret-key\r\n", NULL);
  assert_int_equal(r.status, 200);
  tc_resp_free(&r);
  r = tc_request(p, "GET", "/v2/models/gen", NULL, NULL);
  assert_int_equal(r.status, 401);
  j = json_loads(r.body, 0, NULL);
  assert_true(json_is_string(json_object_get(j, "error")));
  json_decref(j);
  tc_resp_free(&r);
  r = tc_request(p, "GET", "/v2/health/ready", NULL, NULL);
  assert_int_equal(r.status, 200);
  tc_resp_free(&r);
  r = tc_request(p, "GET", "/v2/health/live", NULL, NULL);
  assert_int_equal(r.status, 200);
  tc_resp_free(&r);
  assert_true(servd_api_key_equal("abc", 3, "abc", 3));
  assert_false(servd_api_key_equal("abd", 3, "abc", 3));
  assert_false(servd_api_key_equal("ab", 2, "abc", 3));
  assert_false(servd_api_key_equal("", 0, "abc", 3));
}

static void test_tokenize(void **st) {
  (void)st;
  int s;
  json_t *j = post_json(open_srv.port, "/tokenize", "{\"model\":\"lm\",\"prompt\":\"abc\"}", &s, NULL);
  assert_int_equal(s, 200);
  assert_int_equal(json_integer_value(json_object_get(j, "count")), 3);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(j, "tokens"), 2)), 'c');
  assert_int_equal(json_integer_value(json_object_get(j, "max_model_len")), 64);
  json_decref(j);
  j = post_json(open_srv.port, "/detokenize", "{\"model\":\"lm\",\"tokens\":[104,105]}", &s, NULL);
  assert_int_equal(s, 200);
  assert_string_equal(json_string_value(json_object_get(j, "prompt")), "hi");
  json_decref(j);
}

static void test_repository(void **st) {
  (void)st;
  int s;
  json_t *j = post_json(open_srv.port, "/v2/repository/models/extra/load", "", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
  j = get_json(open_srv.port, "/v2/models/extra/ready", &s);
  assert_int_equal(s, 200);
  json_decref(j);
  j = post_json(open_srv.port, "/v1/completions", "{\"model\":\"extra\",\"prompt\":\"x\",\"max_tokens\":1}", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
  j = post_json(open_srv.port, "/v2/repository/index", "", &s, NULL);
  assert_int_equal(s, 200);
  assert_true(json_array_size(j) >= 3);
  json_decref(j);
  j = post_json(open_srv.port, "/v2/repository/models/extra/unload", "", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
  j = get_json(open_srv.port, "/v2/models/extra/ready", &s);
  assert_int_equal(s, 503);
  json_decref(j);
  j = post_json(open_srv.port, "/v1/completions", "{\"model\":\"extra\",\"prompt\":\"x\"}", &s, NULL);
  assert_int_equal(s, 404);
  json_decref(j);
  j = post_json(open_srv.port, "/v2/repository/models/nothere/load", "", &s, NULL);
  assert_int_equal(s, 404);
  json_decref(j);
  j = post_json(open_srv.port, "/v2/repository/models/extra/load", "", &s, NULL);
  assert_int_equal(s, 200); /* and back again */
  json_decref(j);
}

static const char *index_state(const char *name, const char **reason) {
  int s;
  static char state[32], why[256];
  json_t *j = post_json(open_srv.port, "/v2/repository/index", "", &s, NULL);
  assert_int_equal(s, 200);
  state[0] = why[0] = '\0';
  for (size_t i = 0; i < json_array_size(j); i++) {
    json_t *e = json_array_get(j, i);
    if (strcmp(json_string_value(json_object_get(e, "name")), name)) continue;
    snprintf(state, sizeof state, "%s", json_string_value(json_object_get(e, "state")));
    const char *r = json_string_value(json_object_get(e, "reason"));
    snprintf(why, sizeof why, "%s", r ? r : "");
  }
  json_decref(j);
  if (reason) *reason = why;
  return state;
}

/* Unloading a model whose load failed unloads it: FAILED once stayed FAILED after a 200. */
static void test_unload_failed_model(void **st) {
  (void)st;
  int s;
  json_t *j = post_json(open_srv.port, "/v2/repository/models/broken/load", "", &s, NULL);
  assert_int_equal(s, 400);
  json_decref(j);
  const char *why;
  assert_string_equal(index_state("broken", &why), "FAILED");
  assert_non_null(strstr(why, "not a package"));
  /* Ollama's generating routes name it while it is FAILED (it has no model): a 503, never a call into
   * a model that is not there (a NULL model once reached the model's ops). */
  static const char *const oll[] = {"/api/chat", "/api/generate", "/api/embed"};
  static const char *const oll_body[] = {"{\"model\":\"broken\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                                         "{\"model\":\"broken\",\"prompt\":\"x\"}",
                                         "{\"model\":\"broken\",\"input\":\"x\"}"};
  for (int k = 0; k < 3; k++) {
    j = post_json(open_srv.port, oll[k], oll_body[k], &s, NULL);
    assert_int_equal(s, 503);
    json_decref(j);
  }
  j = post_json(open_srv.port, "/v2/repository/models/broken/unload", "", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
  assert_string_equal(index_state("broken", &why), "UNAVAILABLE");
  assert_string_equal(why, "model 'broken' is unloaded");
  j = get_json(open_srv.port, "/v2/models/broken/ready", &s);
  assert_int_not_equal(s, 200);
  json_decref(j);
}

/* Quarantined interpreters holding the last namespace: metrics show what is left; both probes fail,
 * naming the model and the cause, only while a model that needs a namespace is not loaded. */
static void test_namespaces_starved(void **st) {
  (void)st;
  int s;
  tc_resp r = tc_request(open_srv.port, "GET", "/metrics", NULL, NULL);
  assert_non_null(strstr(r.body, "\nservd_interpreter_namespaces_free 12\n"));
  assert_non_null(strstr(r.body, "\nservd_interpreter_namespaces 15\n"));
  tc_resp_free(&r);
  atomic_store(&fake_namespaces_free, 0);
  json_t *j = get_json(open_srv.port, "/v2/health/ready", &s); /* every model loaded: nothing waits */
  assert_int_equal(s, 200);
  json_decref(j);
  j = post_json(open_srv.port, "/v2/repository/models/broken/load", "", &s, NULL);
  assert_int_equal(s, 400);
  json_decref(j);
  const char *paths[] = {"/v2/health/ready", "/health", "/v2/health/live"};
  const char *keys[] = {"ready", "live", "live"};
  for (int i = 0; i < 3; i++) {
    j = get_json(open_srv.port, paths[i], &s);
    assert_int_equal(s, 503);
    assert_true(json_is_false(json_object_get(j, keys[i])));
    assert_string_equal(json_string_value(json_object_get(j, "reason")),
                        "model 'broken' cannot load: no interpreter namespace is left (3 of the process's 15 are "
                        "held by quarantined interpreters of abandoned loads until servd restarts)");
    json_decref(j);
  }
  atomic_store(&fake_namespaces_free, 1); /* one came back: the load may be tried again */
  j = get_json(open_srv.port, "/v2/health/ready", &s);
  assert_int_equal(s, 200);
  json_decref(j);
  atomic_store(&fake_namespaces_free, 0);
  j = post_json(open_srv.port, "/v2/repository/models/broken/unload", "", &s, NULL); /* forgets the failure */
  assert_int_equal(s, 200);
  json_decref(j);
  j = get_json(open_srv.port, "/health", &s);
  assert_int_equal(s, 200);
  json_decref(j);
  atomic_store(&fake_namespaces_free, 12);
}

/* A process-isolated model restarting after a crash is not ready itself, but the server stays ready
 * and live (a crash loop must not take the pod out of service); the index says why. */
static void test_restarting_model(void **st) {
  (void)st;
  int s;
  atomic_store(&fake_gen_restarting, true);
  json_t *j = get_json(open_srv.port, "/v2/health/ready", &s);
  assert_int_equal(s, 200);
  json_decref(j);
  j = get_json(open_srv.port, "/v2/health/live", &s);
  assert_int_equal(s, 200);
  json_decref(j);
  j = get_json(open_srv.port, "/v2/models/gen/ready", &s);
  assert_int_equal(s, 503);
  json_decref(j);
  j = post_json(open_srv.port, "/v2/repository/index", "", &s, NULL);
  assert_int_equal(s, 200);
  bool seen = false;
  for (size_t i = 0; i < json_array_size(j); i++) {
    json_t *e = json_array_get(j, i);
    if (strcmp(json_string_value(json_object_get(e, "name")), "gen") != 0) continue;
    seen = true;
    assert_string_equal(json_string_value(json_object_get(e, "state")), "UNAVAILABLE");
    assert_non_null(strstr(json_string_value(json_object_get(e, "reason")), "SIGSEGV"));
  }
  assert_true(seen);
  json_decref(j);
  tc_resp r = tc_request(open_srv.port, "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "servd_isolated_model_restarts_total{model=\"gen\"} 2\n"));
  assert_null(strstr(r.body, "servd_isolated_model_restarts_total{model=\"lm\"}"));
  assert_non_null(strstr(r.body, "\nservd_engine_quarantined_interpreters 3\n"));
  tc_resp_free(&r);
  /* Stuck, not restarting: the server is not ready again. */
  atomic_store(&fake_gen_restarting, false);
  atomic_store(&fake_ready, false);
  j = get_json(open_srv.port, "/v2/health/ready", &s);
  assert_int_equal(s, 503);
  json_decref(j);
  atomic_store(&fake_ready, true);
}

static void test_metrics(void **st) {
  (void)st;
  tc_resp r = tc_request(open_srv.port, "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "servd_http_requests_total{route=\"/v1/completions\",status=\"200\"}"));
  assert_non_null(strstr(r.body, "servd_http_requests_total{route=\"/v1/completions\",status=\"400\"}"));
  assert_non_null(strstr(r.body, "servd_time_to_first_token_seconds_bucket{model=\"lm\",le=\"+Inf\"}"));
  assert_non_null(strstr(r.body, "servd_kv_cache_usage_ratio{model=\"lm\"}"));
  assert_non_null(strstr(r.body, "servd_interpreter_busy_seconds_total{model=\"gen\",interpreter=\"1\"}"));
  if (access("/usr/bin/promtool", X_OK) == 0) {
    char path[] = "/tmp/servd-metrics-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, r.body, r.body_len), (ssize_t)r.body_len);
    close(fd);
    char cmd[512];
    /* vLLM's names hold ':' (Prometheus' recording-rule style), which promtool's lint refuses; the
     * format itself is checked under the same names spelled with '_'. */
    snprintf(cmd, sizeof cmd, "sed 's/vllm:/vllm_/' %s | promtool check metrics", path);
    int rc = system(cmd);
    unlink(path);
    assert_int_equal(rc, 0);
  } else {
    fprintf(stderr, "promtool not installed: the exposition format was not checked by it\n");
  }
  tc_resp_free(&r);
}

/* vLLM's families for the language model, with its label, and none for the generic one (which has
 * servd_inference_* instead). Runs after test_completion and test_kserve_infer. */
static void test_metrics_vllm(void **st) {
  (void)st;
  int s;
  json_t *j =
      post_json(open_srv.port, "/v1/completions", "{\"model\":\"lm\",\"prompt\":\"hi\",\"max_tokens\":3}", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
  tc_resp r = tc_request(open_srv.port, "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  static const char *const want[] = {
      "vllm:num_requests_running{model_name=\"lm\"} ",
      "vllm:num_requests_waiting{model_name=\"lm\"} 0\n",
      "vllm:kv_cache_usage_perc{model_name=\"lm\"} 0.0",
      "vllm:prefix_cache_queries_total{model_name=\"lm\"} ",
      "vllm:request_success_total{model_name=\"lm\",finished_reason=\"stop\"} 0\n",
      "vllm:request_success_total{model_name=\"lm\",finished_reason=\"abort\"} ",
      "vllm:time_to_first_token_seconds_bucket{model_name=\"lm\",le=\"2560\"} ",
      "vllm:inter_token_latency_seconds_bucket{model_name=\"lm\",le=\"0.01\"} ",
      "vllm:time_per_output_token_seconds_count{model_name=\"lm\"} ",
      "vllm:e2e_request_latency_seconds_bucket{model_name=\"lm\",le=\"7680\"} ",
      "vllm:request_queue_time_seconds_count{model_name=\"lm\"} ",
      "vllm:request_prefill_time_seconds_sum{model_name=\"lm\"} ",
      "vllm:request_decode_time_seconds_bucket{model_name=\"lm\",le=\"+Inf\"} ",
      /* 1-2-5 buckets up to the context length (64 here), as vLLM's build_1_2_5_buckets */
      "vllm:request_prompt_tokens_bucket{model_name=\"lm\",le=\"50\"} ",
      "vllm:request_generation_tokens_bucket{model_name=\"lm\",le=\"5\"} ",
      "servd_inference_requests_total{model=\"gen\",outcome=\"success\"} ",
      "servd_inference_latency_seconds_bucket{model=\"gen\",le=\"+Inf\"} ",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!strstr(r.body, want[i])) fail_msg("missing from /metrics: %s", want[i]);
  assert_null(strstr(r.body, "vllm:request_prompt_tokens_bucket{model_name=\"lm\",le=\"100\"}"));
  assert_null(strstr(r.body, "model_name=\"gen\""));
  assert_null(strstr(r.body, "servd_inference_requests_total{model=\"lm\""));
  /* The fake engine ends every request by length: counted, and its tokens observed. */
  const char *p = strstr(r.body, "vllm:request_success_total{model_name=\"lm\",finished_reason=\"length\"} ");
  assert_non_null(p);
  assert_true(atoi(strchr(p, '}') + 2) >= 1);
  p = strstr(r.body, "vllm:request_generation_tokens_sum{model_name=\"lm\"} ");
  assert_non_null(p);
  assert_true(atof(strchr(p, '}') + 2) >= 3);
  p = strstr(r.body, "servd_inference_requests_total{model=\"gen\",outcome=\"success\"} ");
  assert_true(atoi(strchr(p, '}') + 2) >= 1);
  tc_resp_free(&r);
}

/* X-Request-Id: the client's when usable, else a new 128-bit hex id, on every answer. */
static bool hex32(const char *v) {
  if (!v || strlen(v) != 32) return false;
  for (int i = 0; i < 32; i++)
    if (!strchr("0123456789abcdef", v[i])) return false;
  return true;
}

/* vLLM's sleep mode over the fake engine: level 2 unloads (a request then gets 503 with Retry-After
 * and starts the reload), level 1 wakes on the next request, the refusals name what is wrong, and
 * the routes need the API key. */
static int sleep_level_of(const char *model) {
  int s;
  json_t *j = get_json(open_srv.port, "/is_sleeping", &s);
  assert_int_equal(s, 200);
  int level = (int)json_integer_value(json_object_get(json_object_get(json_object_get(j, "models"), model), "level"));
  json_decref(j);
  return level;
}

static void test_sleep_routes(void **st) {
  (void)st;
  int s;
  json_t *j = post_json(open_srv.port, "/v2/repository/models/extra/load", "", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
  j = post_json(open_srv.port, "/sleep?level=2&model=extra", "", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
  assert_int_equal(sleep_level_of("extra"), 2);
  tc_resp r;
  j = post_json(open_srv.port, "/v1/completions", "{\"model\":\"extra\",\"prompt\":\"x\",\"max_tokens\":1}", &s, &r);
  assert_int_equal(s, 503);
  assert_non_null(strstr(r.headers, "Retry-After: 2"));
  tc_resp_free(&r);
  json_decref(j);
  for (int i = 0; i < 500 && s != 200; i++) {
    usleep(10000);
    json_decref(post_json(open_srv.port, "/v1/completions", "{\"model\":\"extra\",\"prompt\":\"x\",\"max_tokens\":1}",
                          &s, NULL));
  }
  assert_int_equal(s, 200);
  assert_int_equal(sleep_level_of("extra"), 0);

  j = post_json(open_srv.port, "/sleep", "", &s, NULL); /* level 1, every language model */
  assert_int_equal(s, 200);
  json_decref(j);
  assert_int_equal(sleep_level_of("lm"), 1);
  assert_int_equal(sleep_level_of("gen"), 0);
  j = post_json(open_srv.port, "/v1/completions", "{\"model\":\"lm\",\"prompt\":\"x\",\"max_tokens\":1}", &s, NULL);
  assert_int_equal(s, 200); /* level 1 wakes at once */
  json_decref(j);
  assert_int_equal(sleep_level_of("lm"), 0);

  j = post_json(open_srv.port, "/sleep?level=3", "", &s, NULL);
  assert_int_equal(s, 400);
  json_decref(j);
  j = post_json(open_srv.port, "/sleep?model=nothere", "", &s, NULL);
  assert_int_equal(s, 404);
  json_decref(j);
  j = post_json(open_srv.port, "/sleep?level=1&model=gen", "", &s, NULL);
  assert_int_equal(s, 400); /* no KV cache to free */
  json_decref(j);
  j = post_json(open_srv.port, "/wake_up", "", &s, NULL);
  assert_int_equal(s, 200);
  json_decref(j);
  for (int i = 0; i < 3; i++) {
    static const char *const paths[] = {"/sleep", "/wake_up", "/is_sleeping"};
    tc_resp a = tc_request(auth_srv.port, i == 2 ? "GET" : "POST", paths[i], NULL, NULL);
    assert_int_equal(a.status, 401);
    tc_resp_free(&a);
  }
}

static void test_request_id(void **st) {
  (void)st;
  tc_resp r = tc_request(open_srv.port, "GET", "/v2/health/live", "X-Request-Id: trace-42/a.b\r\n", NULL);
  assert_int_equal(r.status, 200);
  assert_string_equal(tc_header(&r, "X-Request-Id"), "trace-42/a.b");
  tc_resp_free(&r);
  /* Generated when absent, new each time; also on the router's own answers (404, 401). */
  r = tc_request(open_srv.port, "GET", "/nowhere", NULL, NULL);
  assert_int_equal(r.status, 404);
  assert_true(hex32(tc_header(&r, "X-Request-Id")));
  char first[40];
  snprintf(first, sizeof first, "%s", tc_header(&r, "X-Request-Id"));
  tc_resp_free(&r);
  r = tc_request(auth_srv.port, "GET", "/v1/models", NULL, NULL);
  assert_int_equal(r.status, 401);
  assert_true(hex32(tc_header(&r, "X-Request-Id")));
  assert_string_not_equal(tc_header(&r, "X-Request-Id"), first);
  tc_resp_free(&r);
  /* Unusable ids are replaced: too long, a space inside (it would split log fields), non-ASCII. */
  char hdr[300], id129[130];
  memset(id129, 'x', 129);
  id129[129] = '\0';
  const char *bad[] = {id129, "two words", "caf\xc3\xa9"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", bad[i]);
    r = tc_request(open_srv.port, "GET", "/v2/health/live", hdr, NULL);
    assert_true(hex32(tc_header(&r, "X-Request-Id")));
    tc_resp_free(&r);
  }
  id129[128] = '\0'; /* 128 is the limit, inclusive */
  snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", id129);
  r = tc_request(open_srv.port, "GET", "/v2/health/live", hdr, NULL);
  assert_string_equal(tc_header(&r, "X-Request-Id"), id129);
  tc_resp_free(&r);
  /* vLLM's body field request_id, and KServe's id, name the request when no header does. */
  const char *body = "{\"model\":\"lm\",\"prompt\":\"hi\",\"max_tokens\":2,\"request_id\":\"body-7\"}";
  r = tc_request(open_srv.port, "POST", "/v1/completions", "Content-Type: application/json\r\n", body);
  assert_int_equal(r.status, 200);
  assert_string_equal(tc_header(&r, "X-Request-Id"), "body-7");
  tc_resp_free(&r);
  r = tc_request(open_srv.port, "POST", "/v1/completions", "Content-Type: application/json\r\nX-Request-Id: hdr-7\r\n",
                 body);
  assert_string_equal(tc_header(&r, "X-Request-Id"), "hdr-7");
  tc_resp_free(&r);
  r = tc_request(open_srv.port, "POST", "/v1/chat/completions", "Content-Type: application/json\r\n",
                 "{\"model\":\"lm\",\"stream\":true,\"max_tokens\":2,\"request_id\":\"s-1\","
                 "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
  assert_int_equal(r.status, 200);
  assert_string_equal(tc_header(&r, "X-Request-Id"), "s-1");
  tc_resp_free(&r);
  r = tc_request(open_srv.port, "POST", "/v2/models/gen/infer", "Content-Type: application/json\r\n",
                 "{\"id\":\"k-1\",\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}");
  assert_int_equal(r.status, 200);
  assert_string_equal(tc_header(&r, "X-Request-Id"), "k-1");
  tc_resp_free(&r);
}

/* max_completion_tokens bounds a completion as max_tokens does (it was ignored on /v1/completions). */
static void test_max_completion_tokens(void **st) {
  (void)st;
  int s;
  json_t *j = post_json(open_srv.port, "/v1/completions",
                        "{\"model\":\"lm\",\"prompt\":\"hi\",\"max_completion_tokens\":2}", &s, NULL);
  assert_int_equal(s, 200);
  json_t *c = json_array_get(json_object_get(j, "choices"), 0);
  assert_string_equal(json_string_value(json_object_get(c, "text")), "w0 w1 ");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 2);
  json_decref(j);
}

/* A forced tool call cut by max_tokens has no call: its text (a call's beginning) is no content
 * either, streamed or not (it once came back as message.content, raw markup and all). With
 * tool_choice auto the same words are the answer. */
static void test_forced_call_cut_short(void **st) {
  (void)st;
#define TOOLS_BODY(choice, stream) \
  "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2,\"stream\":" stream \
  ",\"tool_choice\":" choice ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}"
  int s;
  json_t *j = post_json(open_srv.port, "/v1/chat/completions", TOOLS_BODY("\"required\"", "false"), &s, NULL);
  assert_int_equal(s, 200);
  json_t *c = json_array_get(json_object_get(j, "choices"), 0);
  assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
  json_t *msg = json_object_get(c, "message");
  assert_true(json_is_null(json_object_get(msg, "content")));
  assert_null(json_object_get(msg, "tool_calls"));
  json_decref(j);
  j = post_json(open_srv.port, "/v1/chat/completions", TOOLS_BODY("\"auto\"", "false"), &s, NULL);
  assert_int_equal(s, 200);
  c = json_array_get(json_object_get(j, "choices"), 0);
  assert_string_equal(json_string_value(json_object_get(json_object_get(c, "message"), "content")), "w0 w1 ");
  json_decref(j);
  tc_resp r = tc_request(open_srv.port, "POST", "/v1/chat/completions", "Content-Type: application/json\r\n",
                         TOOLS_BODY("{\"type\":\"function\",\"function\":{\"name\":\"f\"}}", "true"));
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "\"finish_reason\":\"length\""));
  assert_non_null(strstr(r.body, "data: [DONE]"));
  if (strstr(r.body, "w0") || strstr(r.body, "tool_calls")) fail_msg("a cut forced call streamed: %s", r.body);
  tc_resp_free(&r);
  /* The Responses API over the same: an empty, incomplete message. */
  j = post_json(open_srv.port, "/v1/responses",
                "{\"model\":\"lm\",\"input\":\"x\",\"max_output_tokens\":2,\"tool_choice\":\"required\",\"tools\":["
                "{\"type\":\"function\",\"name\":\"f\"}]}",
                &s, NULL);
  assert_int_equal(s, 200);
  assert_string_equal(json_string_value(json_object_get(j, "status")), "incomplete");
  json_t *out = json_object_get(j, "output");
  assert_int_equal(json_array_size(out), 1);
  json_t *part = json_array_get(json_object_get(json_array_get(out, 0), "content"), 0);
  assert_string_equal(json_string_value(json_object_get(part, "text")), "");
  json_decref(j);
#undef TOOLS_BODY
}

/* A constraint the grammar engine cannot compile, whatever it raised, is the request's 400 naming the
 * field (a RecursionError once answered 500); a grammar engine not installed is a 501 that says how
 * to install it (it was a 500). */
static void test_constraint_compile_errors(void **st) {
  (void)st;
  int s;
  json_t *j = post_json(open_srv.port, "/v1/chat/completions",
                        "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                        "\"guided_regex\":\"RECURSE\"}",
                        &s, NULL);
  assert_int_equal(s, 400);
  json_t *e = json_object_get(j, "error");
  assert_string_equal(json_string_value(json_object_get(e, "param")), "guided_regex");
  assert_string_equal(json_string_value(json_object_get(e, "message")),
                      "'guided_regex' cannot be enforced: guided decoding: RecursionError: maximum recursion depth "
                      "exceeded");
  json_decref(j);
  j = post_json(open_srv.port, "/v1/chat/completions",
                "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"NOLLG\",\"schema\":"
                "{\"title\":\"NOLLG\"}}}}",
                &s, NULL);
  assert_int_equal(s, 501);
  e = json_object_get(j, "error");
  assert_string_equal(json_string_value(json_object_get(e, "param")), "response_format");
  assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "scripts/install-python-deps.sh"));
  json_decref(j);
  /* A forced tool call's grammar likewise. */
  j = post_json(open_srv.port, "/v1/chat/completions",
                "{\"model\":\"lm\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":"
                "\"required\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"RECURSE\"}}]}",
                &s, NULL);
  assert_int_equal(s, 400);
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "param")), "tools");
  json_decref(j);
}

/* One embeddings request of 300 inputs (within the documented 512) against a queue of 256: each
 * input is an engine request, and queued all at once they once overflowed it (a 429 on an idle
 * server after the first 256 had been queued, and computed). Its inputs go in a window: all are
 * answered, in order, each submitted once. A queue of 3 makes the window wait for room (and, with
 * none of its own inputs running, retry); a queue that takes none is a 429 with nothing queued. */
static json_t *post_embeddings(const char *body, int *status) { /* on auth_srv: open_srv's metrics stay as they are */
  tc_resp r = tc_request(auth_srv.port, "POST", "/v1/embeddings",
                         "Authorization: Bearer sekret-key\r\nContent-Type: application/json\r\n", body);
  *status = r.status;
  json_t *j = r.body ? json_loads(r.body, 0, NULL) : NULL;
  tc_resp_free(&r);
  return j;
}

static void test_embeddings_queue(void **st) {
  (void)st;
  json_t *inputs = json_array();
  for (int i = 0; i < 300; i++) {
    char t[8] = {(char)('A' + i % 26), (char)('a' + i / 26), 0};
    json_array_append_new(inputs, json_string(t));
  }
  json_t *req = json_pack("{s:s, s:o}", "model", "lm", "input", inputs);
  char *body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  static const int queues[] = {256, 3};
  for (size_t q = 0; q < 2; q++) {
    atomic_store(&fake_max_queue, queues[q]);
    int before = atomic_load(&n_submit), s;
    json_t *j = post_embeddings(body, &s);
    if (s != 200) fail_msg("queue %d: status %d", queues[q], s);
    json_t *data = json_object_get(j, "data");
    assert_int_equal(json_array_size(data), 300);
    for (int i = 0; i < 300; i++) {
      json_t *d = json_array_get(data, (size_t)i);
      assert_int_equal(json_integer_value(json_object_get(d, "index")), i);
      json_t *v = json_object_get(d, "embedding");
      assert_true(json_real_value(json_array_get(v, 0)) == (double)('A' + i % 26)); /* its own input's */
      assert_true(json_real_value(json_array_get(v, 1)) == 2.0);
    }
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 600);
    assert_int_equal(atomic_load(&n_submit) - before, 300);
    json_decref(j);
  }
  atomic_store(&fake_max_queue, 0);
  atomic_store(&fake_busy, 1);
  int before = atomic_load(&n_submit), s;
  json_t *j = post_embeddings(body, &s);
  atomic_store(&fake_busy, 0);
  assert_int_equal(s, 429);
  assert_int_equal(atomic_load(&n_submit), before);
  json_decref(j);
  free(body);
  for (int i = 0; i < 5000 && atomic_load(&n_live) != 0; i++) usleep(1000);
  assert_int_equal(atomic_load(&n_live), 0);
}

/* Failures the API can only learn from the engine read as answers to the client: no engine stage
 * prefix, and the field at fault named. */
static void test_engine_refusals_name_the_field(void **st) {
  (void)st;
  static const struct {
    const char *path, *body, *param, *needle;
  } cases[] = {
      {"/v1/completions", "{\"model\":\"lm\",\"prompt\":[5000],\"max_tokens\":1}", "prompt", "5000"},
      {"/detokenize", "{\"model\":\"lm\",\"tokens\":[104,300]}", "tokens", "300"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int s;
    json_t *j = post_json(open_srv.port, cases[i].path, cases[i].body, &s, NULL);
    assert_int_equal(s, 400);
    json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    assert_non_null(msg);
    if (strstr(msg, "submit:") || strstr(msg, "tokenizer:") || strstr(msg, "detokenize:") || strstr(msg, "decode:"))
      fail_msg("case %zu: internal prefix in '%s'", i, msg);
    assert_non_null(strstr(msg, cases[i].needle));
    assert_string_equal(json_string_value(json_object_get(e, "param")), cases[i].param);
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    json_decref(j);
  }
}

/* Every model has the one version "1": another version is a 404, on every versioned route. */
static void test_versions(void **st) {
  (void)st;
  const char *body = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}";
  int s;
  json_t *j = post_json(open_srv.port, "/v2/models/gen/versions/1/infer", body, &s, NULL);
  assert_int_equal(s, 200);
  assert_string_equal(json_string_value(json_object_get(j, "model_version")), "1");
  json_decref(j);
  j = post_json(open_srv.port, "/v2/models/gen/versions/2/infer", body, &s, NULL);
  assert_int_equal(s, 404);
  assert_non_null(strstr(json_string_value(json_object_get(j, "error")), "version '2'"));
  json_decref(j);
  j = get_json(open_srv.port, "/v2/models/gen/versions/2", &s);
  assert_int_equal(s, 404);
  json_decref(j);
  j = get_json(open_srv.port, "/v2/models/gen/versions/2/ready", &s);
  assert_int_equal(s, 404);
  json_decref(j);
  j = get_json(open_srv.port, "/v2/models/gen/versions/1/ready", &s);
  assert_int_equal(s, 200);
  json_decref(j);
  j = get_json(open_srv.port, "/v2/models/gen/versions/1", &s);
  assert_int_equal(s, 200);
  json_decref(j);
  j = get_json(open_srv.port, "/v2/models/nope/versions/1", &s); /* an unknown model stays unknown */
  assert_int_equal(s, 404);
  assert_non_null(strstr(json_string_value(json_object_get(j, "error")), "not served"));
  json_decref(j);
}

/* 405 carries Allow with every method the path takes; 404 for paths no row has. */
static void test_router_statuses(void **st) {
  (void)st;
  static const struct {
    const char *method, *path;
    int status;
    const char *allow;
  } cases[] = {
      {"POST", "/v2/health/live", 405, "GET, HEAD"},
      {"GET", "/v1/chat/completions", 405, "POST"},
      {"DELETE", "/v2/repository/index", 405, "GET, POST"},
      {"GET", "/v2/models/gen/infer", 405, "POST"},
      {"GET", "/v2/models/gen/versions/1/infer", 405, "POST"},
      {"GET", "/v2/health/ready", 200, NULL},
      {"GET", "/v2/", 200, NULL},
      {"GET", "/v1/nothing", 404, NULL},
      {"GET", "/v2/models/gen/explode", 404, NULL},
      {"GET", "/v2/models//ready", 404, NULL},
      {"GET", "/v1/models/", 404, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tc_resp r = tc_request(open_srv.port, cases[i].method, cases[i].path, NULL, NULL);
    if (r.status != cases[i].status) fail_msg("%s %s: %d", cases[i].method, cases[i].path, r.status);
    if (cases[i].allow) assert_string_equal(tc_header(&r, "Allow"), cases[i].allow);
    tc_resp_free(&r);
  }
  /* Without the key, only the public rows answer. */
  tc_resp r = tc_request(auth_srv.port, "GET", "/v1/nothing", NULL, NULL);
  assert_int_equal(r.status, 401);
  tc_resp_free(&r);
  r = tc_request(auth_srv.port, "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 401);
  tc_resp_free(&r);
  r = tc_request(auth_srv.port, "POST", "/health", NULL, "");
  assert_int_equal(r.status, 405);
  tc_resp_free(&r);
}

/* The table itself: every row complete, patterns well formed, no row shadowed by an earlier one. */
static void test_route_table(void **st) {
  (void)st;
  assert_true(api_n_routes > 0);
  for (size_t i = 0; i < api_n_routes; i++) {
    const api_route *row = &api_routes[i];
    assert_non_null(row->handler);
    assert_non_null(row->label);
    assert_true(row->methods != 0);
    assert_true(row->pattern[0] == '/');
    if (strstr(row->pattern, "{model}") && !strstr(row->pattern, "/repository/") &&
        strncmp(row->pattern, "/v1/", 4) != 0)
      assert_true(row->flags & API_ROUTE_MODEL);
    for (size_t k = 0; k < i; k++)
      if (strcmp(api_routes[k].pattern, row->pattern) == 0) assert_int_equal(api_routes[k].methods & row->methods, 0);
  }
  api_route_span m, v;
  assert_true(
      api_route_match("/v2/models/{model}/versions/{version}/infer", "/v2/models/abc/versions/7/infer", &m, &v));
  assert_int_equal(m.n, 3);
  assert_memory_equal(m.p, "abc", 3);
  assert_int_equal(v.n, 1);
  assert_memory_equal(v.p, "7", 1);
  assert_false(api_route_match("/v2/models/{model}/infer", "/v2/models//infer", &m, &v));
  assert_false(api_route_match("/v2/models/{model}/infer", "/v2/models/a/b/infer", &m, &v));
  assert_false(api_route_match("/v2/models/{model}", "/v2/models/a/", &m, &v));
  assert_false(api_route_match("/v1/models", "/v1/models/x", &m, &v));
  assert_true(api_route_match("/metrics", "/metrics", &m, &v));
  assert_int_equal(m.n, 0);
  assert_int_equal(api_route_method_bit("PUT"), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_health_and_meta),
      cmocka_unit_test(test_completion),
      cmocka_unit_test(test_logprobs),
      cmocka_unit_test(test_chat_stream),
      cmocka_unit_test(test_validation),
      cmocka_unit_test(test_huge_body),
      cmocka_unit_test(test_error_messages_not_utf8),
      cmocka_unit_test(test_busy_is_429),
      cmocka_unit_test(test_engine_error_is_500),
      cmocka_unit_test(test_disconnect_cancels),
      cmocka_unit_test(test_kserve_infer),
      cmocka_unit_test(test_kserve_concurrency),
      cmocka_unit_test(test_auth),
      cmocka_unit_test(test_tokenize),
      cmocka_unit_test(test_repository),
      cmocka_unit_test(test_namespaces_starved),
      cmocka_unit_test(test_unload_failed_model),
      cmocka_unit_test(test_metrics),
      cmocka_unit_test(test_restarting_model),
      cmocka_unit_test(test_max_completion_tokens),
      cmocka_unit_test(test_forced_call_cut_short),
      cmocka_unit_test(test_embeddings_queue),
      cmocka_unit_test(test_constraint_compile_errors),
      cmocka_unit_test(test_engine_refusals_name_the_field),
      cmocka_unit_test(test_versions),
      cmocka_unit_test(test_router_statuses),
      cmocka_unit_test(test_route_table),
      cmocka_unit_test(test_metrics_vllm),
      cmocka_unit_test(test_request_id),
      cmocka_unit_test(test_sleep_routes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
