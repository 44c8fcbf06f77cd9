/* Request-body validation as a pure function (api/request_params.h): OpenAI-compatible parameters,
 * KServe v2 inference inputs, and error messages kept valid UTF-8. Expected values are written out
 * by hand from the OpenAI / Open Inference Protocol field definitions; UTF-8 validity is judged by
 * jansson, the library that later encodes the messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <cmocka.h>
#include <jansson.h>

#include "api/request_params.h"
#include "servd/tensor.h"

static api_param_limits limits(void) {
  api_param_limits l;
  memset(&l, 0, sizeof l);
  servd_gen_params_default(&l.defaults);
  l.max_n = 16;
  l.default_deadline_ms = 1234;
  return l;
}

static int parse(const char *json, oai_mode mode, servd_arena *a, oai_params *p, api_param_error *e) {
  api_param_limits l = limits();
  return oai_params_parse_text(json, strlen(json), mode, &l, a, p, e);
}

static bool utf8_ok(const char *s) {
  json_t *j = json_string(s);
  json_decref(j);
  return j != NULL;
}

static void test_completions_all_fields(void **st) {
  (void)st;
  servd_arena *a = servd_arena_create(4096);
  oai_params p;
  api_param_error e;
  const char *body =
      "{\"model\":\"lm\",\"prompt\":[\"a\",\"b\"],\"max_tokens\":16,\"temperature\":0.5,\"top_p\":0.25,"
      "\"top_k\":40,\"min_p\":0.125,\"repetition_penalty\":1.5,\"presence_penalty\":-2,\"frequency_penalty\":2,"
      "\"seed\":42,\"n\":2,\"best_of\":2,\"stop\":[\"\\n\",\"END\"],\"stop_token_ids\":[2,3],\"ignore_eos\":true,"
      "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"logprobs\":3,\"echo\":false,\"timeout\":2.5,"
      "\"user\":\"u1\",\"response_format\":{\"type\":\"text\"}}";
  assert_int_equal(parse(body, OAI_COMPLETIONS, a, &p, &e), 0);
  assert_int_equal(p.n_prompts, 2);
  assert_string_equal(p.prompts[0].text, "a");
  assert_string_equal(p.prompts[1].text, "b");
  assert_null(p.prompts[0].ids);
  assert_int_equal(p.n, 2);
  assert_int_equal(p.gp.max_tokens, 16);
  /* Binary fractions: exact in float. */
  assert_true(p.gp.temperature == 0.5f && p.gp.top_p == 0.25f && p.gp.min_p == 0.125f);
  assert_true(p.gp.repetition_penalty == 1.5f && p.gp.presence_penalty == -2.0f && p.gp.frequency_penalty == 2.0f);
  assert_int_equal(p.gp.top_k, 40);
  assert_true(p.gp.has_seed);
  assert_int_equal(p.gp.seed, 42);
  assert_int_equal(p.gp.n_stop, 2);
  assert_string_equal(p.gp.stop[0], "\n");
  assert_string_equal(p.gp.stop[1], "END");
  assert_int_equal(p.gp.n_stop_token_ids, 2);
  assert_int_equal(p.gp.stop_token_ids[0], 2);
  assert_int_equal(p.gp.stop_token_ids[1], 3);
  assert_true(p.gp.ignore_eos && p.stream && p.include_usage);
  assert_int_equal(p.logprobs, 3);
  assert_int_equal(p.gp.logprobs, 3);
  assert_int_equal(p.gp.deadline_ms, 2500);
  assert_true(p.add_special); /* completions: the tokenizer adds BOS */
  assert_null(p.messages);
  oai_params_free(&p);
  servd_arena_destroy(a);
}

static void test_defaults_and_token_ids(void **st) {
  (void)st;
  servd_arena *a = servd_arena_create(4096);
  oai_params p;
  api_param_error e;
  assert_int_equal(parse("{\"prompt\":\"x\"}", OAI_COMPLETIONS, a, &p, &e), 0);
  servd_gen_params d;
  servd_gen_params_default(&d);
  assert_int_equal(p.n, 1);
  assert_int_equal(p.logprobs, -1);
  assert_int_equal(p.gp.max_tokens, d.max_tokens);
  assert_true(p.gp.temperature == d.temperature && p.gp.top_p == d.top_p);
  assert_false(p.gp.has_seed);
  assert_int_equal(p.gp.deadline_ms, 1234); /* no timeout: the server's default */
  assert_false(p.stream);
  oai_params_free(&p);
  /* Token ids, one list per prompt; 4.0 is taken as the integer 4. */
  assert_int_equal(parse("{\"prompt\":[[1,2,3],[4,2147483647]],\"max_tokens\":4.0}", OAI_COMPLETIONS, a, &p, &e), 0);
  assert_int_equal(p.n_prompts, 2);
  assert_int_equal(p.prompts[0].n_ids, 3);
  assert_int_equal(p.prompts[0].ids[2], 3);
  assert_int_equal(p.prompts[1].n_ids, 2);
  assert_int_equal(p.prompts[1].ids[1], 2147483647);
  assert_null(p.prompts[0].text);
  assert_int_equal(p.gp.max_tokens, 4);
  oai_params_free(&p);
  /* /detokenize accepts an empty list. */
  assert_int_equal(parse("{\"tokens\":[]}", OAI_DETOKENIZE, a, &p, &e), 0);
  assert_int_equal(p.n_prompts, 1);
  assert_int_equal(p.prompts[0].n_ids, 0);
  oai_params_free(&p);
  servd_arena_destroy(a);
}

static void test_chat_messages(void **st) {
  (void)st;
  servd_arena *a = servd_arena_create(4096);
  oai_params p;
  api_param_error e;
  const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hey \"},{\"type\":\"text\","
                     "\"text\":\"there\"}],\"name\":\"bob\"},{\"role\":\"assistant\",\"content\":null}],"
                     "\"max_completion_tokens\":7,\"logprobs\":true,\"top_logprobs\":5}";
  assert_int_equal(parse(body, OAI_CHAT, a, &p, &e), 0);
  assert_int_equal(json_array_size(p.messages), 3);
  json_t *m1 = json_array_get(p.messages, 1);
  assert_string_equal(json_string_value(json_object_get(m1, "role")), "user");
  assert_string_equal(json_string_value(json_object_get(m1, "content")), "Hey there");
  assert_string_equal(json_string_value(json_object_get(m1, "name")), "bob");
  assert_string_equal(json_string_value(json_object_get(json_array_get(p.messages, 2), "content")), "");
  assert_int_equal(p.gp.max_tokens, 7);
  assert_int_equal(p.logprobs, 5);
  assert_false(p.add_special); /* the chat template writes the special tokens */
  assert_true(p.add_generation_prompt);
  assert_int_equal(p.n_prompts, 1);
  oai_params_free(&p);
  servd_arena_destroy(a);
}

static void test_errors(void **st) {
  (void)st;
  static const struct {
    oai_mode mode;
    const char *body, *param, *message;
  } cases[] = {
      {OAI_COMPLETIONS, "{", "", "malformed JSON in the request body: "},
      {OAI_COMPLETIONS, "[1]", "", "the request body must be a JSON object"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"prompt\":\"y\"}", "", "malformed JSON in the request body: "},
      {OAI_COMPLETIONS, "{}", "prompt", "'prompt' is required: a string, a list of strings, or token ids"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", "temperature",
       "'temperature' must be a number, got a string"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"top_p\":0}", "top_p", "'top_p' must be in (0, 1], got 0"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"n\":17}", "n", "'n' must be in [1, 16], got 17"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens",
       "'max_tokens' must be in [1, 16777216], got 0"},
      {OAI_COMPLETIONS, "{\"prompt\":[1,-2]}", "prompt", "'prompt'[1] must be a non-negative token id"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"\"]}", "stop",
       "'stop' entries must be non-empty strings of at most 1024 bytes"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs",
       "'logprobs' must be an integer in [0, 20] for completions"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stream_options\":{}}", "stream_options",
       "'stream_options' is only allowed when 'stream' is true"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"suffix\":\"y\"}", "suffix",
       "'suffix' is not supported: insertion is not supported"},
      {OAI_COMPLETIONS,
       "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\","
       "\"n\",\"o\",\"p\",\"q\"],\"n\":16}",
       "n", "n times the number of prompts must be at most 256"},
      {OAI_CHAT, "{\"messages\":[]}", "messages",
       "'messages' must be a non-empty list of {role, content}, got an empty list"},
      {OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"wizard\"}]}", "messages[1]",
       "'messages[1].role' must be one of system, user, assistant, tool, developer"},
      {OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "top_logprobs",
       "'top_logprobs' requires 'logprobs': true"},
      {OAI_TOKENIZE, "{\"prompt\":[\"a\",\"b\"]}", "prompt", "/tokenize takes one prompt"},
      {OAI_DETOKENIZE, "{\"tokens\":\"1 2\"}", "tokens", "'tokens' must be a list of token ids"},
  };
  servd_arena *a = servd_arena_create(4096);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    oai_params p;
    api_param_error e;
    assert_int_equal(parse(cases[i].body, cases[i].mode, a, &p, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, cases[i].param);
    if (strncmp(e.message, cases[i].message, strlen(cases[i].message)) != 0 ||
        (cases[i].message[strlen(cases[i].message) - 1] != ' ' && strcmp(e.message, cases[i].message) != 0))
      fail_msg("case %zu: got '%s', want '%s'", i, e.message, cases[i].message);
    assert_null(p.prompts);
    assert_null(p.messages);
  }
  servd_arena_destroy(a);
}

static int infer(const char *json, kserve_infer_params *p, api_param_error *e) {
  api_param_limits l = limits();
  return kserve_infer_parse_text(json, strlen(json), &l, p, e);
}

/* A binary input whose shape takes 8 GiB in a request of a few bytes: refused for the bytes it lacks
 * before anything is allocated (fuzz_api_routes found the 8 GiB allocation). The address space is
 * capped below 8 GiB meanwhile, so allocating first would fail with another message. */
static void test_kserve_binary_shape_before_allocation(void **st) {
  (void)st;
  const char *json = "{\"inputs\":[{\"name\":\"x\",\"shape\":[2147483648],\"datatype\":\"FP32\","
                     "\"parameters\":{\"binary_data_size\":8589934592}}]}";
  char body[256], hl[24];
  size_t n = strlen(json);
  memcpy(body, json, n);
  memcpy(body + n, "\0\0\0\0", 4);
  snprintf(hl, sizeof hl, "%zu", n);
  struct rlimit old, cap;
  assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
  cap = old;
  cap.rlim_cur = (rlim_t)4 << 30; /* under the 8 GiB asked; above what the test itself uses */
  if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < cap.rlim_cur) cap.rlim_cur = old.rlim_cur;
#ifdef __SANITIZE_ADDRESS__
  bool capped = false; /* ASan maps its shadow as it goes: a cap would fail it, not the allocation */
#else
  bool capped = setrlimit(RLIMIT_AS, &cap) == 0;
#endif
  api_param_limits l = limits();
  kserve_infer_params p;
  api_param_error e;
  int rc = kserve_infer_parse_framed(body, n + 4, hl, &l, &p, &e);
  if (capped) setrlimit(RLIMIT_AS, &old);
  assert_int_equal(rc, -1);
  assert_int_equal(e.status, 400);
  assert_string_equal(e.message, "input 'x': parameters.binary_data_size is 8589934592 but only 4 bytes of binary "
                                 "data remain after the JSON header (Inference-Header-Content-Length) and the inputs "
                                 "before it");
}

static void test_kserve_inputs(void **st) {
  (void)st;
  kserve_infer_params p;
  api_param_error e;
  const char *body =
      "{\"id\":\"r1\",\"inputs\":[{\"name\":\"x\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[[1,2],[3,4.5]]},"
      "{\"name\":\"i\",\"shape\":[3],\"datatype\":\"INT32\",\"data\":[1,-2,2147483647]},"
      "{\"name\":\"h\",\"shape\":[1,2],\"datatype\":\"FP16\",\"data\":[0.5,-2]},"
      "{\"name\":\"b\",\"shape\":[],\"datatype\":\"BF16\",\"data\":[3]}],"
      "\"outputs\":[{\"name\":\"y\"}],\"parameters\":{\"timeout\":5}}";
  assert_int_equal(infer(body, &p, &e), 0);
  assert_int_equal(p.n_in, 4);
  assert_string_equal(p.in[0].name, "x");
  const servd_tensor *x = p.in[0].tensor;
  assert_int_equal(x->dtype, SERVD_F32);
  assert_int_equal(x->ndim, 2);
  const float *xf = servd_tensor_data(x);
  assert_true(xf[0] == 1.0f && xf[1] == 2.0f && xf[2] == 3.0f && xf[3] == 4.5f);
  const int32_t *xi = servd_tensor_data(p.in[1].tensor);
  assert_true(xi[0] == 1 && xi[1] == -2 && xi[2] == 2147483647);
  /* IEEE half 0.5 = 0x3800, -2 = 0xC000; bfloat16 3 = 0x4040 (the top half of float 0x40400000). */
  const uint16_t *xh = servd_tensor_data(p.in[2].tensor);
  assert_int_equal(xh[0], 0x3800);
  assert_int_equal(xh[1], 0xC000);
  assert_int_equal(p.in[3].tensor->ndim, 0);
  assert_int_equal(*(const uint16_t *)servd_tensor_data(p.in[3].tensor), 0x4040);
  assert_string_equal(json_string_value(p.id), "r1");
  assert_int_equal(json_array_size(p.wanted), 1);
  assert_int_equal(p.deadline_ms, 5000);
  kserve_infer_params_free(&p);

  assert_int_equal(infer("{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[1]}]}", &p, &e),
                   0);
  assert_int_equal(p.deadline_ms, 1234);
  assert_null(p.id);
  assert_null(p.wanted);
  kserve_infer_params_free(&p);
}

static void test_kserve_errors(void **st) {
  (void)st;
  static const struct {
    const char *body, *message;
  } cases[] = {
      {"[]", "the request body must be a JSON object"},
      {"{\"inputs\":[]}", "'inputs' must be a list of 1 to 64 tensors"},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"FP32\",\"data\":[1,2]}]}",
       "input 'x': shape holds 6 elements but data has 2"},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[1.5]}]}",
       "input 'x': INT32 data must be integers in [-2147483648, 2147483647]"},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[1]},"
       "{\"name\":\"x\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[2]}]}",
       "input 'x' is given twice"},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"Q4\",\"data\":[1]}]}",
       "input 'x': datatype 'Q4' is not supported (supported: FP32, FP16, BF16, INT32)"},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}],\"parameters\":{\"timeout\":0}"
       "}",
       "'parameters.timeout' must be in (0, 86400], got 0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kserve_infer_params p;
    api_param_error e;
    assert_int_equal(infer(cases[i].body, &p, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.message, cases[i].message);
    assert_null(p.in);
  }
  /* A shape whose byte size overflows (a zero dimension keeps the element count at 0). */
  kserve_infer_params p;
  api_param_error e;
  assert_int_equal(infer("{\"inputs\":[{\"name\":\"x\",\"shape\":[0,2147483648,2147483648,2147483648],"
                         "\"datatype\":\"FP32\",\"data\":[]}]}",
                         &p, &e),
                   -1);
  assert_int_equal(e.status, 400);
  assert_non_null(strstr(e.message, "overflows"));
}

/* A datatype of 600 two-byte characters makes the message longer than its buffer: the cut must not
 * leave half a character, or the JSON error response could not be encoded. */
static void test_long_messages_stay_utf8(void **st) {
  (void)st;
  /* Names of one and two bytes: the cut falls between characters for one and inside one for the
   * other. */
  static const char *names[] = {"x", "xy"};
  for (int k = 0; k < 2; k++) {
    char body[2048];
    int n = snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"%s\",\"shape\":[1],\"datatype\":\"", names[k]);
    for (int i = 0; i < 600; i++) n += snprintf(body + n, sizeof body - (size_t)n, "\xc3\xa9");
    snprintf(body + n, sizeof body - (size_t)n, "\",\"data\":[1]}]}");
    kserve_infer_params p;
    api_param_error e;
    assert_int_equal(infer(body, &p, &e), -1);
    assert_int_equal(e.status, 400);
    assert_true(strlen(e.message) >= 700);
    assert_true(utf8_ok(e.message));
  }
}

static void test_utf8_fix(void **st) {
  (void)st;
  static const struct {
    const char *in, *out;
  } cases[] = {
      {"plain", "plain"},
      {"caf\xc3\xa9", "caf\xc3\xa9"},
      {"ab\xc3", "ab"},                           /* cut after the lead byte */
      {"x\xf0\x9f\x98", "x"},                     /* cut inside a 4-byte character */
      {"\xf0\x9f\x98\x80!", "\xf0\x9f\x98\x80!"}, /* U+1F600 */
      {"a\xffz", "a?z"},
      {"\xc0\xafz", "??z"},         /* overlong '/' */
      {"\xed\xa0\x80z", "???z"},    /* UTF-16 surrogate U+D800 */
      {"\xf4\x90\x80\x80", "????"}, /* above U+10FFFF */
      {"\x80x", "?x"},              /* stray continuation byte */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char buf[32];
    snprintf(buf, sizeof buf, "%s", cases[i].in);
    api_utf8_fix(buf);
    assert_string_equal(buf, cases[i].out);
    assert_true(utf8_ok(buf));
  }
}

/* max_tokens and max_completion_tokens: both checked on both routes, the newer name wins. */
static void test_max_tokens_names(void **st) {
  (void)st;
  servd_arena *a = servd_arena_create(4096);
  oai_params p;
  api_param_error e;
  assert_int_equal(parse("{\"prompt\":\"x\",\"max_completion_tokens\":2}", OAI_COMPLETIONS, a, &p, &e), 0);
  assert_int_equal(p.gp.max_tokens, 2);
  oai_params_free(&p);
  assert_int_equal(parse("{\"prompt\":\"x\",\"max_tokens\":9,\"max_completion_tokens\":3}", OAI_COMPLETIONS, a, &p, &e),
                   0);
  assert_int_equal(p.gp.max_tokens, 3);
  oai_params_free(&p);
  assert_int_equal(
      parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":5}", OAI_CHAT, a, &p, &e), 0);
  assert_int_equal(p.gp.max_tokens, 5);
  oai_params_free(&p);
  static const struct {
    oai_mode mode;
    const char *body, *param;
  } bad[] = {
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_completion_tokens\":0}", "max_completion_tokens"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_completion_tokens\":\"2\"}", "max_completion_tokens"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":2,\"max_completion_tokens\":-1}", "max_completion_tokens"},
      {OAI_CHAT,
       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":5,\"max_tokens\":\"x\"}",
       "max_tokens"},
      {OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":1.5}",
       "max_completion_tokens"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(parse(bad[i].body, bad[i].mode, a, &p, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, bad[i].param);
    assert_non_null(strstr(e.message, bad[i].param));
  }
  servd_arena_destroy(a);
}

/* Every documented field is checked, on every route that takes it, and the error names it. */
static void test_every_field_named(void **st) {
  (void)st;
  static const struct {
    oai_mode mode;
    const char *body, *param;
  } bad[] = {
      /* The engine takes at most 64 stop token ids: more must be the client's 400, not a submit failure. */
      {OAI_COMPLETIONS,
       "{\"prompt\":\"x\",\"stop_token_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,"
       "22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,"
       "53,54,55,56,57,58,59,60,61,62,63,64,65]}",
       "stop_token_ids"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stop_token_ids\":[1,-1]}", "stop_token_ids"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"ignore_eos\":1}", "ignore_eos"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"min_p\":1.5}", "min_p"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"repetition_penalty\":0}", "repetition_penalty"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"frequency_penalty\":-3}", "frequency_penalty"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"timeout\":0}", "timeout"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"timeout\":90000}", "timeout"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"user\":5}", "user"},
      {OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
       "stream_options.include_usage"},
      {OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":\"7\"}", "seed"},
      {OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_k\":1.5}", "top_k"},
      {OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",7]}", "stop"},
      {OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":21,\"logprobs\":true}",
       "top_logprobs"},
      {OAI_TOKENIZE, "{\"prompt\":\"x\",\"add_generation_prompt\":5}", "add_generation_prompt"},
      {OAI_TOKENIZE, "{\"prompt\":\"x\",\"add_special_tokens\":\"no\"}", "add_special_tokens"},
  };
  servd_arena *a = servd_arena_create(4096);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    oai_params p;
    api_param_error e;
    if (parse(bad[i].body, bad[i].mode, a, &p, &e) != -1) fail_msg("case %zu accepted: %s", i, bad[i].body);
    assert_int_equal(e.status, 400);
    if (strcmp(e.param, bad[i].param) != 0) fail_msg("case %zu: param '%s', want '%s'", i, e.param, bad[i].param);
    assert_non_null(strstr(e.message, bad[i].param));
  }
  servd_arena_destroy(a);
}

/* Nested data must be rectangular and match the shape; flat data must hold exactly the elements. */
static void test_kserve_nested_data(void **st) {
  (void)st;
  static const struct {
    const char *shape, *data;
    bool ok;
  } cases[] = {
      {"[2,2]", "[[1,2],[3,4]]", true},     {"[2,2]", "[1,2,3,4]", true},
      {"[2,0]", "[[],[]]", true},           {"[2,0]", "[]", true},
      {"[1,2,2]", "[[[1,2],[3,4]]]", true}, {"[2,2]", "[[1,2,3],[4]]", false}, /* ragged, 4 elements */
      {"[2,2]", "[[1],[2,3,4]]", false},    {"[2]", "[[1],[2]]", false},       /* deeper than the shape */
      {"[2,2,1]", "[[1,2],[3,4]]", false},                                     /* shallower than the shape */
      {"[4]", "[[1,2],[3,4]]", false},      {"[2,2]", "[[1,2],3,4]", false},   /* mixed */
      {"[3,1]", "[[1],[2]]", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char body[512];
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"x\",\"shape\":%s,\"datatype\":\"FP32\",\"data\":%s}]}",
             cases[i].shape, cases[i].data);
    kserve_infer_params p;
    api_param_error e;
    int rc = infer(body, &p, &e);
    if ((rc == 0) != cases[i].ok)
      fail_msg("case %zu (shape %s, data %s): rc %d %s", i, cases[i].shape, cases[i].data, rc, e.message);
    if (rc == 0) {
      kserve_infer_params_free(&p);
      continue;
    }
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "inputs[0].data");
    assert_non_null(strstr(e.message, "input 'x'"));
  }
  /* Nested values land in row-major order. */
  kserve_infer_params p;
  api_param_error e;
  assert_int_equal(infer("{\"inputs\":[{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"INT32\","
                         "\"data\":[[1,2,3],[4,5,6]]}]}",
                         &p, &e),
                   0);
  const int32_t *v = servd_tensor_data(p.in[0].tensor);
  for (int i = 0; i < 6; i++) assert_int_equal(v[i], i + 1);
  kserve_infer_params_free(&p);
}

/* vLLM's priority: an integer on both OpenAI routes and in KServe's parameters; 0 when absent. */
static void test_priority(void **st) {
  (void)st;
  servd_arena *a = servd_arena_create(4096);
  oai_params p;
  api_param_error e;
  assert_int_equal(parse("{\"prompt\":\"x\"}", OAI_COMPLETIONS, a, &p, &e), 0);
  assert_int_equal(p.gp.priority, 0);
  oai_params_free(&p);
  assert_int_equal(parse("{\"prompt\":\"x\",\"priority\":-3}", OAI_COMPLETIONS, a, &p, &e), 0);
  assert_int_equal(p.gp.priority, -3);
  oai_params_free(&p);
  assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"priority\":7}", OAI_CHAT, a, &p, &e),
                   0);
  assert_int_equal(p.gp.priority, 7);
  oai_params_free(&p);
  static const char *const bad[] = {"{\"prompt\":\"x\",\"priority\":\"1\"}", "{\"prompt\":\"x\",\"priority\":1.5}",
                                    "{\"prompt\":\"x\",\"priority\":3000000000}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(parse(bad[i], OAI_COMPLETIONS, a, &p, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "priority");
  }
  servd_arena_destroy(a);
  kserve_infer_params k;
  const char *in = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"INT32\",\"data\":[1]}]";
  char body[256];
  snprintf(body, sizeof body, "%s,\"parameters\":{\"priority\":2}}", in);
  assert_int_equal(infer(body, &k, &e), 0);
  assert_int_equal(k.priority, 2);
  kserve_infer_params_free(&k);
  snprintf(body, sizeof body, "%s,\"parameters\":{\"priority\":true}}", in);
  assert_int_equal(infer(body, &k, &e), -1);
  assert_string_equal(e.param, "parameters.priority");
}

/* POST /v1/embeddings (OpenAI's embeddings reference): input as a string, strings, ids or id lists,
 * encoding_format float|base64, dimensions >= 1. */
static void test_embeddings(void **st) {
  (void)st;
  servd_arena *a = servd_arena_create(4096);
  oai_params p;
  api_param_error e;
  assert_int_equal(
      parse("{\"input\":[[4],[5,6,7]],\"encoding_format\":\"base64\",\"dimensions\":8}", OAI_EMBEDDINGS, a, &p, &e), 0);
  assert_int_equal(p.n_prompts, 2);
  assert_int_equal(p.prompts[0].n_ids, 1);
  assert_int_equal(p.prompts[0].ids[0], 4);
  assert_int_equal(p.prompts[1].n_ids, 3);
  assert_int_equal(p.prompts[1].ids[2], 7);
  assert_true(p.gp.embed && p.base64 && p.add_special);
  assert_int_equal(p.gp.dimensions, 8);
  oai_params_free(&p);
  assert_int_equal(parse("{\"input\":[1,2]}", OAI_EMBEDDINGS, a, &p, &e), 0);
  assert_true(p.n_prompts == 1 && p.prompts[0].n_ids == 2 && !p.base64 && p.gp.dimensions == 0);
  oai_params_free(&p);
  assert_int_equal(parse("{\"input\":[\"a\",\"b\"]}", OAI_EMBEDDINGS, a, &p, &e), 0);
  assert_true(p.n_prompts == 2 && !strcmp(p.prompts[0].text, "a") && !strcmp(p.prompts[1].text, "b"));
  oai_params_free(&p);
  /* A mix of strings and token-id lists is none of OpenAI's shapes (it was once taken). */
  assert_int_equal(parse("{\"input\":[\"a\",[5,6,7]]}", OAI_EMBEDDINGS, a, &p, &e), -1);
  assert_int_equal(e.status, 400);
  assert_string_equal(e.param, "input");
  assert_string_equal(e.message, "'input' must be a list of strings or a list of lists of token ids, not a mix: "
                                 "'input'[0] is a string, 'input'[1] an array");
  assert_int_equal(parse("{\"input\":[[5],\"a\"]}", OAI_EMBEDDINGS, a, &p, &e), -1);
  assert_string_equal(e.param, "input");
  assert_int_equal(parse("{\"prompt\":[\"a\",[5]]}", OAI_COMPLETIONS, a, &p, &e), -1);
  assert_string_equal(e.param, "prompt");
  static const struct {
    const char *body, *param;
  } bad[] = {{"{}", "input"},
             {"{\"input\":[]}", "input"},
             {"{\"input\":\"\"}", "input"},
             {"{\"input\":[\"a\",\"\"]}", "input"},
             {"{\"input\":[[1],[-2]]}", "input"},
             {"{\"input\":{}}", "input"},
             {"{\"input\":\"a\",\"encoding_format\":\"int8\"}", "encoding_format"},
             {"{\"input\":\"a\",\"dimensions\":0}", "dimensions"},
             {"{\"input\":\"a\",\"dimensions\":\"8\"}", "dimensions"},
             {"{\"input\":\"a\",\"user\":1}", "user"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(parse(bad[i].body, OAI_EMBEDDINGS, a, &p, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, bad[i].param);
  }
  servd_arena_destroy(a);
}

/* Completions echo (OpenAI): with logprobs the prompt's own; with max_tokens 0 the prompt alone. */
static void test_echo(void **st) {
  (void)st;
  servd_arena *a = servd_arena_create(4096);
  oai_params p;
  api_param_error e;
  assert_int_equal(
      parse("{\"prompt\":\"x\",\"echo\":true,\"max_tokens\":0,\"logprobs\":1}", OAI_COMPLETIONS, a, &p, &e), 0);
  assert_true(p.echo && p.gp.prompt_logprobs && p.gp.prompt_only);
  assert_int_equal(p.gp.logprobs, 1);
  oai_params_free(&p);
  assert_int_equal(parse("{\"prompt\":\"x\",\"echo\":true,\"max_tokens\":3}", OAI_COMPLETIONS, a, &p, &e), 0);
  assert_true(p.echo && !p.gp.prompt_logprobs && !p.gp.prompt_only);
  assert_int_equal(p.gp.max_tokens, 3);
  oai_params_free(&p);
  /* max_tokens 0 is only the prompt's echo; echo stays a boolean. */
  assert_int_equal(parse("{\"prompt\":\"x\",\"max_tokens\":0}", OAI_COMPLETIONS, a, &p, &e), -1);
  assert_string_equal(e.param, "max_tokens");
  assert_int_equal(parse("{\"prompt\":\"x\",\"echo\":1}", OAI_COMPLETIONS, a, &p, &e), -1);
  assert_string_equal(e.param, "echo");
  servd_arena_destroy(a);
}

int main(void) {
  json_object_seed(1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_completions_all_fields),
      cmocka_unit_test(test_defaults_and_token_ids),
      cmocka_unit_test(test_chat_messages),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_kserve_inputs),
      cmocka_unit_test(test_kserve_binary_shape_before_allocation),
      cmocka_unit_test(test_kserve_errors),
      cmocka_unit_test(test_long_messages_stay_utf8),
      cmocka_unit_test(test_utf8_fix),
      cmocka_unit_test(test_max_tokens_names),
      cmocka_unit_test(test_every_field_named),
      cmocka_unit_test(test_kserve_nested_data),
      cmocka_unit_test(test_priority),
      cmocka_unit_test(test_embeddings),
      cmocka_unit_test(test_echo),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
