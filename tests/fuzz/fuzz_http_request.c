/* libFuzzer: servd's HTTP request handling without sockets.
 *
 * The input is one connection's byte stream. It goes through the request framer (http_parser with
 * servd's callbacks and limits) as the server feeds it: all unparsed bytes at once, one
 * request at a time. It is then fed again in pieces whose sizes come from the data, and must frame
 * the same way (requests, headers, bodies, whether it ends in an error) whatever the split, as TCP
 * may split it.
 * Each complete request's body goes to the validator of its route (/v1/completions,
 * /v1/chat/completions, /tokenize, /detokenize, /v2/models/NAME/infer), chosen by path alone so
 * that every method reaches it. Invariants: a framing error is 400, 413, 431, 501 or 505 with a
 * message; a refused body has a 4xx status and a non-empty, valid UTF-8 message (it goes into a
 * JSON response); accepted parameters are within their documented ranges.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/request_params.h"
#include "http/framer.h"
#include "servd/tensor.h"

#define CHECK(c) \
  do { \
    if (!(c)) { \
      fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #c); \
      abort(); \
    } \
  } while (0)

#define MAX_REQUESTS 256

/* What one pass saw, to compare the whole-buffer pass with the split one. */
typedef struct trace {
  int n;
  uint64_t req[MAX_REQUESTS]; /* hash of each request as the handler sees it */
  int final_status;           /* 0: ended wanting more bytes */
  char final_msg[160];
} trace;

static uint64_t mix(uint64_t h, const void *p, size_t n) {
  const unsigned char *u = p;
  for (size_t i = 0; i < n; i++) h = (h ^ u[i]) * 0x100000001b3ull;
  return (h ^ n) * 0x100000001b3ull;
}

static uint64_t mix_str(uint64_t h, const char *s) { return mix(h, s, strlen(s) + 1); }

static bool valid_message(const char *s) {
  if (!s[0]) return false;
  json_t *j = json_string(s); /* NULL when not valid UTF-8 */
  json_decref(j);
  return j != NULL;
}

static void check_error(const api_param_error *e) {
  CHECK(e->status >= 400 && e->status < 500);
  CHECK(valid_message(e->message));
  CHECK(!e->param[0] || valid_message(e->param));
}

static void check_oai(const oai_params *p, oai_mode mode, const api_param_limits *lim) {
  CHECK(p->n >= 1 && p->n <= lim->max_n);
  CHECK(p->n_prompts >= 1 && p->n_prompts <= 64 && p->prompts);
  CHECK((long long)p->n * p->n_prompts <= 256);
  CHECK(p->logprobs >= -1 && p->logprobs <= 20 && p->gp.logprobs == p->logprobs);
  const servd_gen_params *g = &p->gp;
  CHECK(g->max_tokens == lim->defaults.max_tokens || (g->max_tokens >= 1 && g->max_tokens <= (1 << 24)));
  CHECK(g->temperature >= 0 && g->temperature <= 2);
  CHECK(g->top_p > 0 && g->top_p <= 1);
  CHECK(g->min_p >= 0 && g->min_p <= 1);
  CHECK(g->repetition_penalty > 0 && g->repetition_penalty <= 10);
  CHECK(g->presence_penalty >= -2 && g->presence_penalty <= 2);
  CHECK(g->frequency_penalty >= -2 && g->frequency_penalty <= 2);
  CHECK(g->top_k >= -1 && g->top_k <= (1 << 20));
  CHECK(g->n_stop >= 0 && g->n_stop <= 16 && (g->n_stop == 0 || g->stop));
  for (int i = 0; i < g->n_stop; i++) CHECK(g->stop[i] && g->stop[i][0]);
  CHECK(g->n_stop_token_ids >= 0 && g->n_stop_token_ids <= 256);
  for (int i = 0; i < g->n_stop_token_ids; i++) CHECK(g->stop_token_ids[i] >= 0);
  CHECK(g->deadline_ms >= 0);
  for (int i = 0; i < p->n_prompts; i++) {
    const oai_prompt *q = &p->prompts[i];
    CHECK(q->n_ids >= 0 && (q->n_ids == 0) == (q->ids == NULL));
    for (int k = 0; k < q->n_ids; k++) CHECK(q->ids[k] >= 0);
    bool templated = p->messages != NULL; /* the prompt comes from the chat template later */
    bool empty_detok = mode == OAI_DETOKENIZE && q->n_ids == 0;
    if (!templated && !empty_detok) CHECK((q->text != NULL) != (q->n_ids > 0));
  }
  CHECK((mode == OAI_CHAT) <= (p->messages != NULL));
  CHECK((mode == OAI_EMBEDDINGS) == g->embed && g->dimensions >= 0);
  CHECK(!p->echo || mode == OAI_COMPLETIONS);
  CHECK(g->prompt_only <= p->echo && g->prompt_logprobs <= p->echo);
  for (int i = 0; mode == OAI_EMBEDDINGS && i < p->n_prompts; i++)
    CHECK(p->prompts[i].n_ids > 0 || (p->prompts[i].text && p->prompts[i].text[0]));
  for (size_t i = 0; p->messages && i < json_array_size(p->messages); i++) {
    json_t *m = json_array_get(p->messages, i);
    CHECK(json_is_string(json_object_get(m, "role")) && json_is_string(json_object_get(m, "content")));
  }
}

static void check_kserve(const kserve_infer_params *p) {
  CHECK(p->n_in >= 1 && p->n_in <= 64 && p->in);
  for (int i = 0; i < p->n_in; i++) {
    const servd_tensor *t = p->in[i].tensor;
    CHECK(t && p->in[i].name[0]);
    for (int k = 0; k < i; k++) CHECK(strcmp(p->in[k].name, p->in[i].name) != 0);
    /* Every byte of the data is readable (ASan checks the bound). */
    size_t bytes = (size_t)servd_tensor_numel(t) * servd_dtype_block_bytes(t->dtype);
    const unsigned char *d = servd_tensor_data(t);
    unsigned x = 0;
    for (size_t k = 0; k < bytes; k++) x += d[k];
    (void)x;
  }
  CHECK(!p->id || json_is_string(p->id));
}

/* The route's validator, on a body: as the server would after routing on the path. */
static void handle_body(const servd_http_req *r, servd_arena *arena) {
  static const struct {
    const char *path;
    oai_mode mode;
  } oai_routes[] = {{"/v1/completions", OAI_COMPLETIONS},
                    {"/v1/chat/completions", OAI_CHAT},
                    {"/tokenize", OAI_TOKENIZE},
                    {"/detokenize", OAI_DETOKENIZE},
                    {"/v1/embeddings", OAI_EMBEDDINGS}};
  api_param_limits lim;
  memset(&lim, 0, sizeof lim);
  /* The engine's defaults (servd_gen_params_default) and the server's (servd_api_options_default). */
  lim.defaults.temperature = 1.0f;
  lim.defaults.top_p = 1.0f;
  lim.defaults.repetition_penalty = 1.0f;
  lim.defaults.logprobs = -1;
  lim.max_n = 16;
  api_param_error err;
  for (size_t i = 0; i < sizeof oai_routes / sizeof oai_routes[0]; i++) {
    if (strcmp(r->path, oai_routes[i].path) != 0) continue;
    oai_params p;
    if (oai_params_parse_text(r->body, r->body_len, oai_routes[i].mode, &lim, arena, &p, &err) == 0) {
      check_oai(&p, oai_routes[i].mode, &lim);
      oai_params_free(&p);
    } else {
      check_error(&err);
      CHECK(p.prompts == NULL && p.messages == NULL); /* nothing left to free */
    }
    return;
  }
  const char *tail = strncmp(r->path, "/v2/models/", 11) == 0 ? strrchr(r->path + 11, '/') : NULL;
  if (tail && strcmp(tail, "/infer") == 0) {
    kserve_infer_params p;
    if (kserve_infer_parse_text(r->body, r->body_len, &lim, &p, &err) == 0) {
      check_kserve(&p);
      kserve_infer_params_free(&p);
    } else {
      check_error(&err);
      CHECK(p.in == NULL && p.id == NULL && p.wanted == NULL);
    }
  }
}

static uint64_t request_hash(const servd_http_req *r, const servd_http_framer *f) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = mix_str(h, r->method);
  h = mix_str(h, r->target);
  h = mix_str(h, r->path);
  h = mix_str(h, r->query);
  int v[5] = {r->http_major, r->http_minor, f->keep_alive, f->head, f->expect_continue};
  h = mix(h, v, sizeof v);
  for (int i = 0; i < r->n_headers; i++) {
    h = mix_str(h, r->headers[i].name);
    h = mix_str(h, r->headers[i].value);
  }
  return mix(h, r->body, r->body_len);
}

/* One connection: bytes arrive in pieces of the given sizes (cycled; {0}: all at once). */
static void run(const uint8_t *data, size_t size, const uint8_t *cuts, size_t n_cuts, bool validate, trace *t) {
  servd_http_framer f;
  servd_arena *arena = servd_arena_create(8192);
  servd_buf pending;
  servd_buf_init(&pending);
  memset(t, 0, sizeof(*t));
  servd_http_limits lim;
  servd_http_limits_default(&lim);
  /* Smaller than the defaults (as servd's options allow) so that inputs of fuzzing size reach every
   * limit, a chunked body's too. */
  lim.max_header_bytes = 4096;
  lim.max_body_bytes = 32768;
  CHECK(arena && servd_http_framer_init(&f, &lim) == 0);
  size_t off = 0, k = 0;
  bool failed = false;
  while (off < size && !failed) {
    size_t piece = n_cuts ? (size_t)cuts[k++ % n_cuts] % 64 + 1 : size;
    if (piece > size - off) piece = size - off;
    servd_buf_append(&pending, data + off, piece);
    CHECK(!pending.oom);
    off += piece;
    while (pending.len > 0) {
      size_t used = 0;
      int status = 0;
      char msg[160];
      servd_frame_result fr = servd_http_framer_feed(&f, pending.data, pending.len, &used, &status, msg, sizeof msg);
      CHECK(used <= pending.len);
      if (fr == SERVD_FRAME_ERROR) {
        CHECK(status == 400 || status == 413 || status == 431 || status == 501 || status == 505);
        CHECK(msg[0]);
        /* The target the error body is chosen by: NUL-terminated, within the request line. */
        const char *target = servd_http_framer_target(&f);
        CHECK(target && strlen(target) <= f.url_len);
        t->final_status = status;
        snprintf(t->final_msg, sizeof t->final_msg, "%s", msg);
        failed = true;
        break;
      }
      servd_buf_consume(&pending, used);
      if (fr == SERVD_FRAME_MORE) {
        CHECK(pending.len == 0); /* http_parser takes every byte it is given until it stops */
        break;
      }
      servd_http_req r;
      memset(&r, 0, sizeof r);
      bool ok = servd_http_framer_request(&f, arena, &r);
      CHECK(r.method && r.target && r.path && r.query && r.body);
      CHECK(r.body[r.body_len] == '\0' && r.n_headers >= 0 && r.n_headers <= f.lim.max_headers);
      CHECK(r.body_len <= f.lim.max_body_bytes);
      if (t->n < MAX_REQUESTS) t->req[t->n] = request_hash(&r, &f) ^ (uint64_t)ok;
      t->n++;
      if (ok && validate) handle_body(&r, arena);
      servd_arena_reset(arena);
      servd_http_framer_release_body(&f);
    }
  }
  servd_buf_free(&pending);
  servd_http_framer_free(&f);
  servd_arena_destroy(arena);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  json_object_seed(1); /* hash order the same in every run, so a crash reproduces */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  trace whole, split;
  run(data, size, NULL, 0, true, &whole);
  /* Piece sizes from the last bytes, so they vary with the input but leave its start alone. */
  size_t n_cuts = size < 8 ? size : 8;
  run(data, size, data + size - n_cuts, n_cuts, false, &split);
  /* A request that is malformed and over a limit may be refused for either: the parser reports the
   * bytes it has scanned to the callbacks (which check the limits) only at a token's end or at the
   * end of what it was given, so where the stream was split decides which problem is seen first. */
  bool same = whole.n == split.n && (whole.final_status == 0) == (split.final_status == 0) &&
              (whole.final_status == split.final_status ? strcmp(whole.final_msg, split.final_msg) == 0
                                                        : whole.final_status == 400 || split.final_status == 400);
  for (int i = 0; same && i < whole.n && i < MAX_REQUESTS; i++) same = whole.req[i] == split.req[i];
  if (!same)
    fprintf(stderr, "whole: %d requests, then %d '%s'; split: %d requests, then %d '%s'\n", whole.n, whole.final_status,
            whole.final_msg, split.n, split.final_status, split.final_msg);
  CHECK(same);
  return 0;
}
