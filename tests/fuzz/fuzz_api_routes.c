/* libFuzzer: every route of the HTTP API, through the real router (daemon/api/router.c, routes.c)
 * and the real handlers, against the fake engine of the API tests (tests/daemon/fake_model_ops.h).
 *
 * Structure-aware: the input is a stream of choices, not a body. It picks a route, a model name,
 * headers and, for a route that takes a body, builds the JSON text from that route's field
 * declarations below (each field: name and type, objects and arrays with their own fields), each
 * field in one of the shapes a client can send: valid, missing, null, of the wrong type, huge (a
 * number past every range, a string of up to 300 KB), nested up to 3000 levels deep, sent twice,
 * or beside an unknown field. One input in sixteen is a raw body (the remaining bytes as they are).
 *
 * The transport is a stand-in for daemon/http/server.c (the servd_http_* functions below): a request
 * is handed to the router as the server hands it, on a libuv loop that runs until the response has
 * ended and the API holds no engine work, so every worker job, engine event and timer of the request
 * has run before the next input. Some inputs disconnect the client after a few loop turns (the
 * request's on_abort runs, as when a socket closes).
 *
 * Invariants: the handler answers exactly once (a hang is libFuzzer's -timeout), with a status of
 * 2xx or 4xx/5xx; an error is a JSON object with "error" (OpenAI's {"error": {...}} or KServe's
 * {"error": "..."}); a complete 2xx JSON answer parses; no engine request stays live. ASan and UBSan
 * report memory errors and leaks.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <uv.h>

#include "../daemon/fake_model_ops.h"
#include "api/api-impl.h"
#include "api/api.h"
#include "api/kserve_binary.h"
#include "http/buf.h"
#include "http/server.h"

#define CHECK(c) \
  do { \
    if (!(c)) { \
      fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #c); \
      abort(); \
    } \
  } while (0)

/* ---- the transport: servd_http_* as server.c provides them, over one in-memory request -------- */

typedef struct fz_conn {
  servd_http_req *req;
  servd_buf hdr, out;
  bool responded, chunked, ended;
  const char *ctype;
  int status;
} fz_conn;

static servd_http_callbacks CB;

const char *servd_http_header_get(const servd_http_req *r, const char *name) {
  for (int i = 0; i < r->n_headers; i++)
    if (strcasecmp(r->headers[i].name, name) == 0) return r->headers[i].value;
  return NULL;
}

void servd_http_set_header(servd_http_req *r, const char *name, const char *value) {
  fz_conn *c = r->conn_;
  CHECK(!c->responded); /* headers go before the response starts */
  servd_buf_printf(&c->hdr, "%s: %s\r\n", name, value);
}

/* The response ended or the client went away: as server.c's req_finish. The request is freed, so a
 * handler touching it afterwards is a use-after-free ASan reports. */
static void fz_finish(fz_conn *c, bool aborted) {
  servd_http_req *r = c->req;
  if (aborted) {
    void (*ab)(servd_http_req *) = r->on_abort;
    r->on_abort = NULL;
    if (ab) ab(r);
    r->status = 499;
  }
  c->status = r->status;
  if (CB.complete) CB.complete(CB.ud, r);
  servd_arena_destroy(r->arena);
  free(r);
  c->req = NULL;
  c->ended = true;
}

void servd_http_respond(servd_http_req *r, int status, const char *content_type, const char *body, size_t len) {
  fz_conn *c = r->conn_;
  CHECK(!c->responded);
  c->responded = true;
  r->status = status;
  c->ctype = content_type;
  servd_buf_append(&c->out, body, len);
  r->bytes_out = len;
  fz_finish(c, false);
}

void servd_http_stream_begin(servd_http_req *r, int status, const char *content_type) {
  fz_conn *c = r->conn_;
  CHECK(!c->responded);
  c->responded = c->chunked = true;
  r->status = status;
  c->ctype = content_type;
}

int servd_http_stream_write(servd_http_req *r, const char *data, size_t len) {
  fz_conn *c = r->conn_;
  CHECK(c->chunked && !c->ended);
  servd_buf_append(&c->out, data, len);
  r->bytes_out += len;
  return 0;
}

void servd_http_stream_end(servd_http_req *r) {
  fz_conn *c = r->conn_;
  CHECK(c->chunked && !c->ended);
  fz_finish(c, false);
}

const char *servd_http_reason(int status) { return status < 400 ? "OK" : "Error"; }
int servd_http_server_active_requests(const servd_http_server *s) { return s ? 1 : 0; }
int servd_http_server_connections(const servd_http_server *s) { return s ? 1 : 0; }
uint64_t servd_http_server_writes(const servd_http_server *s) { return s ? 1 : 0; }
void servd_http_server_batch_begin(servd_http_server *s) { (void)s; }
void servd_http_server_batch_end(servd_http_server *s) { (void)s; }

/* libuv's thread pool, in line: the API's worker jobs (templates, tokenization, predictions, loads)
 * run when queued, on the loop's thread, and their after-callbacks on the next turn of the harness's
 * loop, as libuv would call them: a thread handoff per job would make the fuzzer ten times slower
 * and adds nothing a request's shape can reach. Defined here, it takes the place of libuv's for the
 * API's objects built into this program. */
typedef struct fz_work {
  uv_work_t *w;
  uv_after_work_cb after;
} fz_work;
#define N_WORKS 1024
static fz_work works[N_WORKS];
static int n_works;

int uv_queue_work(uv_loop_t *loop, uv_work_t *w, uv_work_cb work, uv_after_work_cb after) {
  CHECK(n_works < N_WORKS);
  w->loop = loop;
  work(w);
  works[n_works++] = (fz_work){w, after};
  return 0;
}

/* Runs the after-callbacks queued so far (they may queue more); whether any ran. */
static bool works_after(void) {
  bool any = n_works > 0;
  while (n_works > 0) {
    fz_work j = works[0];
    memmove(works, works + 1, (size_t)--n_works * sizeof works[0]);
    if (j.after) j.after(j.w, 0);
  }
  return any;
}

/* ---- the choice stream ------------------------------------------------------------------------ */

typedef struct fz_in {
  const uint8_t *p;
  size_t n;
} fz_in;

static void servd_buf_putc_(servd_buf *b, char c) { servd_buf_append(b, &c, 1); }

static unsigned take(fz_in *in) {
  if (!in->n) return 0;
  in->n--;
  return *in->p++;
}
static unsigned take16(fz_in *in) { return take(in) | take(in) << 8; }
static unsigned pick(fz_in *in, unsigned n) { return n ? take(in) % n : 0; }

/* ---- field declarations ----------------------------------------------------------------------- */

typedef enum { J_BOOL, J_INT, J_NUM, J_STR, J_OBJ, J_ARR, J_RAW, J_ALT, J_TENSOR } fz_kind;

typedef struct fz_type fz_type;
typedef struct fz_field {
  const char *name;
  const fz_type *type;
} fz_field;
struct fz_type {
  fz_kind kind;
  const char *const *vals;    /* J_STR: the values a client sends (NULL: text from the input); J_RAW: JSON */
  const fz_field *fields;     /* J_OBJ */
  const fz_type *elem;        /* J_ARR */
  const fz_type *const *alts; /* J_ALT: one of these */
  int n;                      /* count of vals, fields or alts */
};

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define STR(v) \
  { J_STR, v, NULL, NULL, NULL, N(v) }
#define RAW(v) \
  { J_RAW, v, NULL, NULL, NULL, N(v) }
#define OBJ(f) \
  { J_OBJ, NULL, f, NULL, NULL, N(f) }
#define ARR(e) \
  { J_ARR, NULL, NULL, e, NULL, 0 }
#define ALT(a) \
  { J_ALT, NULL, NULL, NULL, a, N(a) }

#define KIND(k) \
  { k, NULL, NULL, NULL, NULL, 0 }
static const fz_type t_bool = KIND(J_BOOL), t_int = KIND(J_INT), t_num = KIND(J_NUM), t_text = KIND(J_STR),
                     t_tensor = KIND(J_TENSOR);
static const fz_type t_ints = ARR(&t_int), t_texts = ARR(&t_text), t_nums = ARR(&t_num);

static const char *const v_model[] = {"lm", "gen", "extra", "nope", "", "ce"};
static const fz_type t_model = STR(v_model);
static const char *const v_role[] = {"system", "user", "assistant", "tool", "developer", "function", "other"};
static const fz_type t_role = STR(v_role);
static const char *const v_part_type[] = {"text", "image_url", "input_text", "output_text", "input_audio", "refusal"};
static const fz_type t_part_type = STR(v_part_type);
static const char *const v_function[] = {"function", "custom", "web_search"};
static const fz_type t_fn_type = STR(v_function);
static const char *const v_schema[] = {
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}",
    "{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/I\"}},\"$defs\":{\"I\":{\"type\":\"string\"}}}",
    "{\"type\":\"string\",\"pattern\":\"\\\\w{1,1000}{1,1000}\"}",
    "{\"type\":\"array\",\"items\":{\"enum\":[1,\"RECURSE\",null]}}",
    "{\"$ref\":\"#/nowhere\"}",
    "{}",
    "{\"type\":\"NOLLG\"}",
    "true",
};
static const fz_type t_schema = RAW(v_schema);

static const fz_field f_part[] = {{"type", &t_part_type}, {"text", &t_text}};
static const fz_type t_part = OBJ(f_part), t_parts = ARR(&t_part);
static const fz_type *const a_content[] = {&t_text, &t_parts};
static const fz_type t_content = ALT(a_content);

static const fz_field f_call_fn[] = {{"name", &t_text}, {"arguments", &t_text}};
static const fz_type t_call_fn = OBJ(f_call_fn);
static const fz_field f_call[] = {{"id", &t_text}, {"type", &t_fn_type}, {"function", &t_call_fn}};
static const fz_type t_call = OBJ(f_call), t_calls = ARR(&t_call);

static const fz_field f_message[] = {
    {"role", &t_role}, {"content", &t_content}, {"name", &t_text}, {"tool_calls", &t_calls}, {"tool_call_id", &t_text}};
static const fz_type t_message = OBJ(f_message), t_messages = ARR(&t_message);

static const fz_field f_function[] = {
    {"name", &t_text}, {"description", &t_text}, {"parameters", &t_schema}, {"strict", &t_bool}};
static const fz_type t_function = OBJ(f_function);
/* Chat's {type, function: {...}} and the Responses API's flat {type, name, parameters}. */
static const fz_field f_tool[] = {
    {"type", &t_fn_type}, {"function", &t_function}, {"name", &t_text}, {"parameters", &t_schema}};
static const fz_type t_tool = OBJ(f_tool), t_tools = ARR(&t_tool);
static const char *const v_tool_choice[] = {"auto", "none", "required", "any"};
static const fz_type t_tool_choice_s = STR(v_tool_choice);
static const fz_field f_named_fn[] = {{"name", &t_text}};
static const fz_type t_named_fn = OBJ(f_named_fn);
static const fz_field f_named[] = {{"type", &t_fn_type}, {"function", &t_named_fn}, {"name", &t_text}};
static const fz_type t_named = OBJ(f_named);
static const fz_type *const a_tool_choice[] = {&t_tool_choice_s, &t_named};
static const fz_type t_tool_choice = ALT(a_tool_choice);

static const char *const v_rf_type[] = {"text", "json_object", "json_schema", "grammar", "regex"};
static const fz_type t_rf_type = STR(v_rf_type);
static const fz_field f_json_schema[] = {{"name", &t_text}, {"schema", &t_schema}, {"strict", &t_bool}};
static const fz_type t_json_schema = OBJ(f_json_schema);
static const fz_field f_response_format[] = {{"type", &t_rf_type}, {"json_schema", &t_json_schema}};
static const fz_type t_response_format = OBJ(f_response_format);
static const fz_field f_stream_options[] = {{"include_usage", &t_bool}};
static const fz_type t_stream_options = OBJ(f_stream_options);
static const char *const v_regex[] = {"[a-z]+", "\\w{1,1000}{1,1000}", "(", "RECURSE", "NOLLG"};
static const fz_type t_regex = STR(v_regex);
static const fz_field f_structured[] = {
    {"json", &t_schema}, {"regex", &t_regex}, {"choice", &t_texts}, {"grammar", &t_regex}};
static const fz_type t_structured = OBJ(f_structured);
static const fz_type *const a_stop[] = {&t_text, &t_texts};
static const fz_type t_stop = ALT(a_stop);
static const fz_field f_bias[] = {{"97", &t_num}, {"-1", &t_num}, {"99999999999", &t_num}, {"x", &t_num}};
static const fz_type t_bias = OBJ(f_bias);
static const fz_type t_intss = ARR(&t_ints);
static const fz_type *const a_prompt[] = {&t_text, &t_texts, &t_ints, &t_intss};
static const fz_type t_prompt = ALT(a_prompt);

/* What completions, chat and Responses share: sampling and limits. */
#define SAMPLING \
  {"model", &t_model}, {"max_tokens", &t_int}, {"max_completion_tokens", &t_int}, {"temperature", &t_num}, \
      {"top_p", &t_num}, {"top_k", &t_int}, {"min_p", &t_num}, {"n", &t_int}, {"seed", &t_int}, {"stream", &t_bool}, \
      {"stream_options", &t_stream_options}, {"stop", &t_stop}, {"presence_penalty", &t_num}, \
      {"frequency_penalty", &t_num}, {"repetition_penalty", &t_num}, {"logit_bias", &t_bias}, {"logprobs", &t_int}, \
      {"min_tokens", &t_int}, {"ignore_eos", &t_bool}, {"stop_token_ids", &t_ints}, {"user", &t_text}, \
      {"timeout", &t_num}, {"request_id", &t_text}, {"guided_json", &t_schema}, {"guided_regex", &t_regex}, \
      {"guided_choice", &t_texts}, {"structured_outputs", &t_structured}, {"response_format", &t_response_format}, \
      {"skip_special_tokens", &t_bool}, {"include_stop_str_in_output", &t_bool}, { \
    "priority", &t_int \
  }

static const fz_field f_completions[] = {SAMPLING,
                                         {"prompt", &t_prompt},
                                         {"echo", &t_bool},
                                         {"suffix", &t_text},
                                         {"best_of", &t_int},
                                         {"add_special_tokens", &t_bool}};
static const fz_field f_chat[] = {SAMPLING,
                                  {"messages", &t_messages},
                                  {"tools", &t_tools},
                                  {"tool_choice", &t_tool_choice},
                                  {"parallel_tool_calls", &t_bool},
                                  {"top_logprobs", &t_int},
                                  {"add_generation_prompt", &t_bool},
                                  {"continue_final_message", &t_bool},
                                  {"chat_template_kwargs", &t_stream_options}};

static const char *const v_item_type[] = {"message", "function_call", "function_call_output", "reasoning"};
static const fz_type t_item_type = STR(v_item_type);
static const fz_field f_item[] = {{"type", &t_item_type}, {"role", &t_role},   {"content", &t_content},
                                  {"call_id", &t_text},   {"output", &t_text}, {"name", &t_text},
                                  {"arguments", &t_text}, {"id", &t_text}};
static const fz_type t_item = OBJ(f_item), t_items = ARR(&t_item);
static const fz_type *const a_input[] = {&t_text, &t_items};
static const fz_type t_resp_input = ALT(a_input);
static const char *const v_text_fmt_type[] = {"text", "json_schema", "json_object"};
static const fz_type t_text_fmt_type = STR(v_text_fmt_type);
static const fz_field f_text_fmt[] = {
    {"type", &t_text_fmt_type}, {"name", &t_text}, {"schema", &t_schema}, {"strict", &t_bool}};
static const fz_type t_text_fmt = OBJ(f_text_fmt);
static const fz_field f_text_opt[] = {{"format", &t_text_fmt}};
static const fz_type t_text_opt = OBJ(f_text_opt);
static const fz_field f_responses[] = {{"model", &t_model},
                                       {"input", &t_resp_input},
                                       {"instructions", &t_text},
                                       {"max_output_tokens", &t_int},
                                       {"temperature", &t_num},
                                       {"top_p", &t_num},
                                       {"stream", &t_bool},
                                       {"tools", &t_tools},
                                       {"tool_choice", &t_tool_choice},
                                       {"text", &t_text_opt},
                                       {"store", &t_bool},
                                       {"previous_response_id", &t_text},
                                       {"metadata", &t_stream_options},
                                       {"parallel_tool_calls", &t_bool},
                                       {"seed", &t_int}};

/* Anthropic's Messages API: content blocks, tools {name, input_schema}, tool_choice {type, name}. */
static const char *const v_blk_type[] = {"text", "tool_use", "tool_result", "image", "thinking", "document", "x"};
static const fz_type t_blk_type = STR(v_blk_type);
static const char *const v_tool_id[] = {"toolu_1", "toolu_2", ""};
static const fz_type t_tool_id = STR(v_tool_id);
static const fz_field f_blk_inner[] = {{"type", &t_blk_type}, {"text", &t_text}};
static const fz_type t_blk_inner = OBJ(f_blk_inner), t_blks_inner = ARR(&t_blk_inner);
static const fz_type *const a_result[] = {&t_text, &t_blks_inner};
static const fz_type t_result = ALT(a_result);
static const fz_field f_block[] = {{"type", &t_blk_type},  {"text", &t_text},     {"id", &t_tool_id},
                                   {"name", &t_text},      {"input", &t_schema},  {"tool_use_id", &t_tool_id},
                                   {"content", &t_result}, {"is_error", &t_bool}, {"thinking", &t_text}};
static const fz_type t_block = OBJ(f_block), t_blocks = ARR(&t_block);
static const fz_type *const a_anth_content[] = {&t_text, &t_blocks};
static const fz_type t_anth_content = ALT(a_anth_content);
static const fz_field f_anth_msg[] = {{"role", &t_role}, {"content", &t_anth_content}};
static const fz_type t_anth_msg = OBJ(f_anth_msg), t_anth_msgs = ARR(&t_anth_msg);
static const fz_field f_anth_tool[] = {
    {"type", &t_fn_type}, {"name", &t_text}, {"description", &t_text}, {"input_schema", &t_schema}};
static const fz_type t_anth_tool = OBJ(f_anth_tool), t_anth_tools = ARR(&t_anth_tool);
static const char *const v_anth_choice[] = {"auto", "any", "tool", "none", "required"};
static const fz_type t_anth_choice_type = STR(v_anth_choice);
static const fz_field f_anth_choice[] = {
    {"type", &t_anth_choice_type}, {"name", &t_text}, {"disable_parallel_tool_use", &t_bool}};
static const fz_type t_anth_choice = OBJ(f_anth_choice);
static const char *const v_thinking[] = {"enabled", "disabled", "adaptive", "x"};
static const fz_type t_thinking_type = STR(v_thinking);
static const fz_field f_thinking[] = {{"type", &t_thinking_type}, {"budget_tokens", &t_int}};
static const fz_type t_thinking = OBJ(f_thinking);
static const fz_field f_anth_meta[] = {{"user_id", &t_text}};
static const fz_type t_anth_meta = OBJ(f_anth_meta);
static const fz_type *const a_system[] = {&t_text, &t_blks_inner};
static const fz_type t_system = ALT(a_system);
static const fz_field f_messages[] = {
    {"model", &t_model},          {"max_tokens", &t_int},  {"messages", &t_anth_msgs}, {"system", &t_system},
    {"stop_sequences", &t_texts}, {"temperature", &t_num}, {"top_p", &t_num},          {"top_k", &t_int},
    {"metadata", &t_anth_meta},   {"stream", &t_bool},     {"tools", &t_anth_tools},   {"tool_choice", &t_anth_choice},
    {"thinking", &t_thinking},    {"ignore_eos", &t_bool}};
static const fz_field f_count_tokens[] = {{"model", &t_model},
                                          {"messages", &t_anth_msgs},
                                          {"system", &t_system},
                                          {"tools", &t_anth_tools},
                                          {"tool_choice", &t_anth_choice}};

/* Ollama's API: options by Ollama's names, format "json" or a schema. */
static const fz_field f_ollama_opts[] = {{"num_predict", &t_int}, {"temperature", &t_num},   {"top_k", &t_int},
                                         {"top_p", &t_num},       {"stop", &t_texts},        {"seed", &t_int},
                                         {"num_ctx", &t_int},     {"repeat_penalty", &t_num}};
static const fz_type t_ollama_opts = OBJ(f_ollama_opts);
static const char *const v_ollama_fmt[] = {"json", "", "yaml"};
static const fz_type t_ollama_fmt_s = STR(v_ollama_fmt);
static const fz_type *const a_ollama_fmt[] = {&t_ollama_fmt_s, &t_schema};
static const fz_type t_ollama_fmt = ALT(a_ollama_fmt);
static const fz_field f_ollama_msg[] = {
    {"role", &t_role}, {"content", &t_text}, {"images", &t_texts}, {"tool_calls", &t_calls}, {"tool_name", &t_text}};
static const fz_type t_ollama_msg = OBJ(f_ollama_msg), t_ollama_msgs = ARR(&t_ollama_msg);
static const fz_field f_ollama_chat[] = {
    {"model", &t_model}, {"messages", &t_ollama_msgs}, {"options", &t_ollama_opts}, {"format", &t_ollama_fmt},
    {"stream", &t_bool}, {"tools", &t_tools},          {"keep_alive", &t_text},     {"think", &t_bool}};
static const fz_field f_ollama_generate[] = {
    {"model", &t_model},         {"prompt", &t_text},       {"system", &t_text}, {"raw", &t_bool},
    {"options", &t_ollama_opts}, {"format", &t_ollama_fmt}, {"stream", &t_bool}, {"suffix", &t_text}};
static const fz_type *const a_embed_input_o[] = {&t_text, &t_texts};
static const fz_type t_embed_input_o = ALT(a_embed_input_o);
static const fz_field f_ollama_embed[] = {{"model", &t_model}, {"input", &t_embed_input_o}, {"truncate", &t_bool}};
static const fz_field f_ollama_show[] = {{"model", &t_model}, {"name", &t_model}};

static const char *const v_encoding[] = {"float", "base64", "int8"};
static const fz_type t_encoding = STR(v_encoding);
static const fz_type *const a_embed_input[] = {&t_text, &t_texts, &t_ints, &t_intss};
static const fz_type t_embed_input = ALT(a_embed_input);
static const fz_field f_embeddings[] = {
    {"model", &t_model},    {"input", &t_embed_input}, {"encoding_format", &t_encoding},
    {"dimensions", &t_int}, {"user", &t_text},         {"truncate_prompt_tokens", &t_int}};

/* Cross-encoders: rerank (Jina/Cohere) and score (vLLM). */
static const fz_field f_doc[] = {{"text", &t_text}};
static const fz_type t_doc_obj = OBJ(f_doc);
static const fz_type *const a_doc[] = {&t_text, &t_doc_obj, &t_int};
static const fz_type t_doc = ALT(a_doc), t_docs = ARR(&t_doc);
static const fz_field f_rerank[] = {{"model", &t_model},           {"query", &t_text},
                                    {"documents", &t_docs},        {"top_n", &t_int},
                                    {"return_documents", &t_bool}, {"truncate_prompt_tokens", &t_int}};
static const fz_type *const a_score_text[] = {&t_text, &t_texts};
static const fz_type t_score_text = ALT(a_score_text);
static const fz_field f_score[] = {
    {"model", &t_model}, {"text_1", &t_score_text}, {"text_2", &t_score_text}, {"truncate_prompt_tokens", &t_int}};

static const fz_field f_tokenize[] = {{"model", &t_model},
                                      {"prompt", &t_text},
                                      {"messages", &t_messages},
                                      {"add_special_tokens", &t_bool},
                                      {"add_generation_prompt", &t_bool},
                                      {"return_token_strs", &t_bool}};
static const fz_field f_detokenize[] = {{"model", &t_model}, {"tokens", &t_ints}};
static const fz_field f_load_lora[] = {{"lora_name", &t_model}, {"lora_path", &t_text}, {"base_model_name", &t_model}};
static const fz_field f_unload_lora[] = {{"lora_name", &t_model}};

static const char *const v_datatype[] = {"FP32", "INT32", "FP16",  "BF16",  "BYTES",
                                         "BOOL", "FP64",  "INT64", "UINT8", "x"};
static const fz_type t_datatype = STR(v_datatype);
static const char *const v_tensor_name[] = {"x", "boom", "bad", "odd", "y", ""};
static const fz_type t_tensor_name = STR(v_tensor_name);
static const fz_field f_tparams[] = {{"binary_data_size", &t_int}, {"binary_data", &t_bool}};
static const fz_type t_tparams = OBJ(f_tparams);
static const fz_type *const a_data[] = {&t_nums, &t_texts, &t_intss};
static const fz_type t_data = ALT(a_data);
static const fz_field f_input[] = {{"name", &t_tensor_name},
                                   {"datatype", &t_datatype},
                                   {"shape", &t_ints},
                                   {"data", &t_data},
                                   {"parameters", &t_tparams}};
static const fz_type t_input_obj = OBJ(f_input);
/* A consistent tensor (shape and data agree) or one built field by field. */
static const fz_type *const a_input_any[] = {&t_tensor, &t_tensor, &t_input_obj};
static const fz_type t_input_any = ALT(a_input_any), t_inputs = ARR(&t_input_any);
static const fz_field f_output[] = {{"name", &t_tensor_name}, {"parameters", &t_tparams}};
static const fz_type t_output = OBJ(f_output), t_outputs = ARR(&t_output);
static const fz_field f_rparams[] = {{"timeout", &t_num}, {"binary_data_output", &t_bool}};
static const fz_type t_rparams = OBJ(f_rparams);
static const fz_field f_infer[] = {
    {"id", &t_text}, {"inputs", &t_inputs}, {"outputs", &t_outputs}, {"parameters", &t_rparams}};
static const fz_field f_repo_index[] = {{"ready", &t_bool}};
static const fz_field f_repo_load[] = {{"parameters", &t_rparams}};

/* ---- routes ----------------------------------------------------------------------------------- */

typedef struct fz_route {
  const char *method, *path; /* "{m}": a model name; "{v}": a version */
  const fz_field *body;      /* NULL: no body (a few inputs send one anyway) */
  int n_body;
} fz_route;

#define BODY(f) f, N(f)
static const fz_route routes[] = {
    {"POST", "/v1/completions", BODY(f_completions)},
    {"POST", "/v1/chat/completions", BODY(f_chat)},
    {"POST", "/v1/responses", BODY(f_responses)},
    {"POST", "/v1/messages", BODY(f_messages)},
    {"POST", "/v1/messages/count_tokens", BODY(f_count_tokens)},
    {"POST", "/api/chat", BODY(f_ollama_chat)},
    {"POST", "/api/generate", BODY(f_ollama_generate)},
    {"POST", "/api/embed", BODY(f_ollama_embed)},
    {"POST", "/api/show", BODY(f_ollama_show)},
    {"GET", "/api/tags", NULL, 0},
    {"GET", "/api/ps", NULL, 0},
    {"GET", "/api/version", NULL, 0},
    {"POST", "/v1/embeddings", BODY(f_embeddings)},
    {"GET", "/v1/models", NULL, 0},
    {"GET", "/v1/models/{m}", NULL, 0},
    {"POST", "/tokenize", BODY(f_tokenize)},
    {"POST", "/detokenize", BODY(f_detokenize)},
    {"POST", "/v1/load_lora_adapter", BODY(f_load_lora)},
    {"POST", "/v1/unload_lora_adapter", BODY(f_unload_lora)},
    {"POST", "/v2/models/{m}/infer", BODY(f_infer)},
    {"POST", "/v2/models/{m}/versions/{v}/infer", BODY(f_infer)},
    {"GET", "/v2/models/{m}", NULL, 0},
    {"GET", "/v2/models/{m}/versions/{v}", NULL, 0},
    {"GET", "/v2/models/{m}/ready", NULL, 0},
    {"GET", "/v2/models/{m}/config", NULL, 0},
    {"GET", "/v2/models/{m}/stats", NULL, 0},
    {"GET", "/v2/models/stats", NULL, 0},
    {"GET", "/v2", NULL, 0},
    {"POST", "/v2/repository/index", BODY(f_repo_index)},
    {"POST", "/v2/repository/models/{m}/load", BODY(f_repo_load)},
    {"POST", "/v2/repository/models/{m}/unload", BODY(f_repo_load)},
    {"GET", "/health", NULL, 0},
    {"GET", "/v2/health/live", NULL, 0},
    {"GET", "/v2/health/ready", NULL, 0},
    {"GET", "/metrics", NULL, 0},
    {"GET", "/version", NULL, 0},
    {"POST", "/sleep", NULL, 0},
    {"POST", "/wake_up", NULL, 0},
    {"GET", "/is_sleeping", NULL, 0},
    {"HEAD", "/health", NULL, 0},
    {"DELETE", "/v1/completions", NULL, 0},
    {"GET", "/v1/chat/completions", NULL, 0},
    {"GET", "/nowhere", NULL, 0},
    /* Appended, so that the seeds of tests/fuzz/corpus/api_routes keep their routes: each picks a
     * route by its first byte (its index here). */
    {"POST", "/v1/rerank", BODY(f_rerank)},
    {"POST", "/rerank", BODY(f_rerank)},
    {"POST", "/v1/score", BODY(f_score)},
    {"POST", "/v2/rerank", BODY(f_rerank)},
};

/* ---- JSON text from the declarations ---------------------------------------------------------- */

#define MAX_BODY (4u << 20)

static void gen_value(fz_in *in, servd_buf *b, const fz_type *t, int depth);

static void gen_text(fz_in *in, servd_buf *b) {
  static const char *const words[] = {"hi", "RECURSE",     "NOLLG",    "\\u0000", "\\ud800",        "\\\"",
                                      "w",  "<tool_call>", "\xc3\xa9", "\xff",    "{\\\"a\\\": 1}", "%s%n"};
  unsigned n = pick(in, 5);
  servd_buf_putc_(b, '"');
  for (unsigned i = 0; i < n; i++) servd_buf_puts(b, words[pick(in, N(words))]);
  servd_buf_putc_(b, '"');
}

static void gen_huge(fz_in *in, servd_buf *b) {
  static const char *const nums[] = {"1e308",
                                     "-1e308",
                                     "1e999",
                                     "9223372036854775807",
                                     "9223372036854775808",
                                     "-9223372036854775809",
                                     "2147483648",
                                     "-2147483649",
                                     "4294967296",
                                     "-0",
                                     "0.0000001",
                                     "1e-400",
                                     "123456789012345678901234567890"};
  if (take(in) & 1) {
    servd_buf_puts(b, nums[pick(in, N(nums))]);
    return;
  }
  size_t n = (size_t)take16(in) >> (pick(in, 4) == 0 ? 0 : 6); /* mostly under 1 KB, up to 64 KB */
  if ((take(in) & 15) == 0) n <<= 2;                           /* up to 256 KB */
  if (b->len + n > MAX_BODY) n = 0;
  servd_buf_putc_(b, '"');
  if (servd_buf_reserve(b, n + 1) == 0) {
    memset(b->data + b->len, take(in) & 1 ? 'a' : '\\', n); /* backslashes: an odd count escapes the quote */
    b->len += n;
  }
  servd_buf_putc_(b, '"');
}

/* n copies of s. */
static void repeat(servd_buf *b, const char *s, unsigned n) {
  size_t k = strlen(s);
  if (servd_buf_reserve(b, k * n + 1) != 0) return;
  for (unsigned i = 0; i < n; i++) memcpy(b->data + b->len + i * k, s, k);
  b->len += k * n;
  b->data[b->len] = '\0';
}

static void gen_deep(fz_in *in, servd_buf *b) {
  unsigned depth = 1 + take16(in) % 3000;
  bool obj = take(in) & 1;
  repeat(b, obj ? "{\"a\":" : "[", depth);
  servd_buf_puts(b, "1");
  repeat(b, obj ? "}" : "]", depth);
}

/* A value of another JSON type than t's. */
static void gen_wrong(fz_in *in, servd_buf *b, const fz_type *t) {
  static const char *const any[] = {"true", "0", "-1", "1.5", "\"s\"", "{}", "[]", "[null]", "{\"\":null}", "\"\""};
  const char *v;
  do v = any[pick(in, N(any))];
  while (in->n && ((t->kind == J_BOOL && v[0] == 't') || (t->kind == J_STR && v[0] == '"') ||
                   (t->kind == J_OBJ && v[0] == '{') || (t->kind == J_ARR && v[0] == '[') ||
                   ((t->kind == J_INT || t->kind == J_NUM) && (v[0] == '-' || v[0] == '0' || v[0] == '1'))));
  servd_buf_puts(b, v);
}

/* A tensor whose shape and data agree: 1-3 dimensions of 0-4, data flat or nested. */
static void gen_tensor(fz_in *in, servd_buf *b) {
  static const char *const names[] = {"x", "x", "boom", "bad", "odd"};
  static const char *const dts[] = {"FP32", "FP32", "INT32", "FP16", "BF16", "BYTES", "BOOL", "INT64"};
  int nd = 1 + (int)pick(in, 3), dims[3], numel = 1;
  const char *dt = dts[pick(in, N(dts))];
  for (int d = 0; d < nd; d++) numel *= dims[d] = (int)pick(in, 5);
  servd_buf_printf(b, "{\"name\":\"%s\",\"datatype\":\"%s\",\"shape\":[", names[pick(in, N(names))], dt);
  for (int d = 0; d < nd; d++) servd_buf_printf(b, "%s%d", d ? "," : "", dims[d]);
  servd_buf_puts(b, "],\"data\":[");
  for (int i = 0; i < numel; i++) {
    if (i) servd_buf_putc_(b, ',');
    if (!strcmp(dt, "BYTES")) servd_buf_puts(b, "\"ab\"");
    else if (!strcmp(dt, "BOOL")) servd_buf_puts(b, take(in) & 1 ? "true" : "false");
    else servd_buf_printf(b, "%d", (int)take(in) - 128);
  }
  servd_buf_puts(b, "]}");
}

static void gen_object(fz_in *in, servd_buf *b, const fz_field *f, int n, int depth) {
  servd_buf_putc_(b, '{');
  bool first = true;
  for (int i = 0; i < n; i++) {
    /* Mostly valid, so that the fields after a bad one are reached as often as the bad one. */
    unsigned op = take(in) % 32;
    if (op >= 14) op = op < 20 ? 4 : 0;
    if (op >= 4 && op < 8) continue; /* missing */
    int times = op == 13 ? 2 : 1;    /* duplicated */
    for (int k = 0; k < times; k++) {
      if (!first) servd_buf_putc_(b, ',');
      first = false;
      servd_buf_json_str(b, f[i].name, strlen(f[i].name));
      servd_buf_putc_(b, ':');
      if (op == 8) servd_buf_puts(b, "null");
      else if (op == 9) gen_wrong(in, b, f[i].type);
      else if (op == 10) gen_huge(in, b);
      else if (op == 11) gen_deep(in, b);
      else gen_value(in, b, f[i].type, depth + 1);
    }
    if (op == 12) servd_buf_printf(b, ",\"x_unknown_%d\":%s", i, take(in) & 1 ? "[1,{}]" : "\"extra\"");
  }
  servd_buf_putc_(b, '}');
}

static void gen_value(fz_in *in, servd_buf *b, const fz_type *t, int depth) {
  static const char *const ints[] = {"0", "1", "2", "3", "4", "16", "-1", "64", "100000", "2147483647", "5"};
  static const char *const nums[] = {"0", "0.5", "1", "1.0", "2", "-2", "0.9", "100", "1e-9", "-0.5"};
  if (depth > 12 || b->len > MAX_BODY) { /* keep declared recursion bounded */
    servd_buf_puts(b, "null");
    return;
  }
  switch (t->kind) {
  case J_BOOL: servd_buf_puts(b, take(in) & 1 ? "true" : "false"); break;
  case J_INT: servd_buf_puts(b, ints[pick(in, N(ints))]); break;
  case J_NUM: servd_buf_puts(b, nums[pick(in, N(nums))]); break;
  case J_STR:
    if (t->vals && (take(in) & 7)) {
      const char *v = t->vals[pick(in, (unsigned)t->n)];
      servd_buf_json_str(b, v, strlen(v));
    } else gen_text(in, b);
    break;
  case J_RAW: servd_buf_puts(b, t->vals[pick(in, (unsigned)t->n)]); break;
  case J_OBJ: gen_object(in, b, t->fields, t->n, depth); break;
  case J_ARR: {
    unsigned n = pick(in, 16);
    if (n >= 4) n = n == 15 ? 1 + take(in) * 3 : n & 3; /* up to 766: past the queue windows and input limits */
    servd_buf_putc_(b, '[');
    for (unsigned i = 0; i < n && b->len < MAX_BODY; i++) {
      if (i) servd_buf_putc_(b, ',');
      unsigned op = take(in) % 16;
      if (op == 8) servd_buf_puts(b, "null");
      else if (op == 9) gen_wrong(in, b, t->elem);
      else gen_value(in, b, t->elem, depth + 1);
    }
    servd_buf_putc_(b, ']');
    break;
  }
  case J_ALT: gen_value(in, b, t->alts[pick(in, (unsigned)t->n)], depth); break;
  case J_TENSOR: gen_tensor(in, b); break;
  }
}

/* ---- the server under test -------------------------------------------------------------------- */

static uv_loop_t loop;
static servd_api *api;
static char repo_dir[] = "/tmp/servd-fuzz-repo-XXXXXX";

static void touch(const char *name) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", repo_dir, name);
  FILE *f = fopen(p, "w");
  if (f) fclose(f);
}

static void server_init(void) {
  fake_inline = true;
  setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1", 1); /* the LoRA routes answer past their switch */
  CHECK(uv_loop_init(&loop) == 0);
  CHECK(mkdtemp(repo_dir));
  touch("extra.mpk");
  touch("broken.mpk");
  static const char *repo[1];
  repo[0] = repo_dir;
  servd_api_options o;
  servd_api_options_default(&o);
  o.ops = &fake_ops;
  o.log = fopen("/dev/null", "w");
  o.repository = repo;
  o.n_repository = 1;
  o.unload_timeout_ms = 50;
  o.max_n = 4;
  CHECK(servd_api_create(&loop, &o, &api) == 0);
  servd_api_add_model(api, fake_new("lm", SERVD_MODEL_CAUSAL_LM));
  servd_api_add_model(api, fake_new("gen", SERVD_MODEL_GENERIC));
  servd_api_add_model(api, fake_new("ce", SERVD_MODEL_CAUSAL_LM)); /* a cross-encoder (fake_embedding_info) */
  CB = servd_api_http_callbacks(api);
}

static bool valid_error(const servd_buf *out) {
  json_t *j = json_loadb(out->data, out->len, 0, NULL);
  /* A readiness probe answers 503 {"ready": false, ...}: a state, not an error. */
  bool ok = json_is_object(j) && (json_is_string(json_object_get(j, "error")) ||
                                  json_is_string(json_object_get(json_object_get(j, "error"), "message")) ||
                                  json_is_false(json_object_get(j, "ready")));
  json_decref(j);
  return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!api) server_init();
  fz_in in = {data, size};
  const fz_route *rt = &routes[pick(&in, N(routes))];
  unsigned flags = take(&in);

  /* The path, with its captures. */
  static const char *const names[] = {"lm", "gen", "extra", "broken", "nope", "stats", "..", "a%2Fb"};
  bool unload = strstr(rt->path, "unload") != NULL; /* lm and gen stay: the other routes need them */
  static const char *const versions[] = {"1", "1", "2", "", "01"};
  servd_buf path = {0};
  for (const char *p = rt->path; *p; p++) {
    if (!strncmp(p, "{m}", 3)) {
      servd_buf_puts(&path, names[(unload ? 2 : 0) + pick(&in, N(names) - (unload ? 2 : 0))]);
      p += 2;
    } else if (!strncmp(p, "{v}", 3)) {
      servd_buf_puts(&path, versions[pick(&in, N(versions))]);
      p += 2;
    } else servd_buf_putc_(&path, *p);
  }

  /* The body: from the declarations, or raw (1 in 16), or none. */
  servd_buf body = {0};
  if ((flags & 15) == 0) servd_buf_append(&body, (const char *)in.p, in.n), in.n = 0;
  else if (rt->body) gen_object(&in, &body, rt->body, rt->n_body, 0);
  else if ((flags & 15) == 1) servd_buf_puts(&body, "{}");

  /* Headers: a request id, the binary extension's JSON length. */
  servd_http_header hdrs[3];
  int nh = 0;
  char len_s[24];
  if (flags & 16) hdrs[nh++] = (servd_http_header){"x-request-id", (flags & 32) ? "req-1" : ""};
  if (flags & 64) {
    snprintf(len_s, sizeof len_s, "%u", (flags & 32) ? take16(&in) : (unsigned)body.len / 2);
    hdrs[nh++] = (servd_http_header){KSERVE_HEADER_LENGTH, len_s};
  }
  hdrs[nh++] = (servd_http_header){"content-type", "application/json"};
  unsigned abort_after = (flags & 128) ? 1 + pick(&in, 4) : 0;

  fz_conn c = {0};
  servd_http_req *r = calloc(1, sizeof *r);
  CHECK(r);
  r->arena = servd_arena_create(4096);
  r->method = rt->method;
  r->target = servd_arena_strndup(r->arena, path.data ? path.data : "", path.len);
  r->path = r->target;
  r->query = "";
  r->body = servd_arena_strndup(r->arena, body.data ? body.data : "", body.len);
  r->body_len = body.len;
  r->headers = hdrs;
  r->n_headers = nh;
  r->http_major = r->http_minor = 1;
  snprintf(r->remote, sizeof r->remote, "127.0.0.1");
  r->start_ns = uv_hrtime();
  r->conn_ = &c;
  c.req = r;

  CB.handle(CB.ud, r);
  for (unsigned turn = 0; !c.ended || n_works > 0 || servd_api_inflight(api) > 0 || api->works > 0; turn++) {
    if (!c.ended && abort_after && turn == abort_after) fz_finish(&c, true); /* the client went away */
    else if (!works_after()) uv_run(&loop, UV_RUN_ONCE);
  }
  uv_run(&loop, UV_RUN_NOWAIT); /* closes of timers the request started */

  bool ok = c.responded || c.status == 499;
  if (ok && c.status != 499) {
    ok = (c.status >= 200 && c.status < 300) || (c.status >= 400 && c.status < 600);
    if (c.status >= 400) ok = ok && valid_error(&c.out);
    else if (!c.chunked && c.out.len && c.ctype &&
             strstr(c.ctype, "json")) { /* Triton: load and unload answer no body */
      json_t *j = json_loadb(c.out.data, c.out.len, 0, NULL);
      ok = j != NULL;
      json_decref(j);
    }
  }
  if (!ok || getenv("FUZZ_API_PRINT"))
    fprintf(stderr, "%s %s [%.*s] -> %d %s [%.*s]\n", rt->method, path.data, (int)(body.len < 3000 ? body.len : 3000),
            body.data ? body.data : "", c.status, c.ctype ? c.ctype : "-", (int)(c.out.len < 600 ? c.out.len : 600),
            c.out.data ? c.out.data : "");
  CHECK(ok); /* the answer is printed above */
  CHECK(atomic_load(&n_live) == 0);
  servd_buf_free(&c.hdr);
  servd_buf_free(&c.out);
  servd_buf_free(&body);
  servd_buf_free(&path);
  return 0;
}
