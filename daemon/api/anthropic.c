/* POST /v1/messages and /v1/messages/count_tokens: the request runs as the equivalent chat
 * completions (or /tokenize) request, its body built by anthropic_params.c; this file is that
 * request's sink, writing Anthropic's message object, its stream events (message_start, ping,
 * content_block_start/delta/stop, message_delta, message_stop) and its error shape, before the
 * response starts and mid-stream. */
#include "api/anthropic.h"
#include "api/handlers.h"
#include "api/openai-impl.h"
#include "api/openai_tools.h"
#include "api/respond.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

/* Token ids a stop sequence can span and still be named (stop_sequence). */
#define TAIL 64

/* The sink's state. */
typedef struct anth {
  json_t *stop;       /* stop_sequences (own) or NULL */
  int32_t tail[TAIL]; /* the last generated token ids, a ring */
  int n_tail;         /* tokens seen (the ring holds the last TAIL of them) */
  int index;          /* streaming: the next content block's index */
  bool text_open;     /* streaming: a text block is open */
  bool thinking_open; /* streaming: a thinking block is open (the thought comes before any text) */
  bool failed;        /* streaming: an error event was sent */
} anth;

static void anth_free(void *ctx) {
  anth *x = ctx;
  if (!x) return;
  json_decref(x->stop);
  free(x);
}

static void anth_error(servd_http_req *r, int status, const char *msg) { api_anthropic_error(r, status, "%s", msg); }

static void on_token(oai *o, gen *g, const api_event *ev) {
  (void)g;
  anth *x = o->sink_ctx;
  if (ev->token >= 0) x->tail[x->n_tail++ % TAIL] = ev->token;
}

/* The stop sequence that ended the text, or NULL (end of sequence, length, a call). The engine drops
 * a stop string and says "stop" as for the end of the sequence: the last tokens' text tells them
 * apart (an end-of-sequence token decodes to no stop string). Borrowed from x->stop. */
static const char *matched_stop(oai *o, anth *x) {
  gen *g = &o->gens[0];
  if (!x->stop || strcmp(g->finish, "stop") || x->n_tail == 0) return NULL;
  int n = x->n_tail < TAIL ? x->n_tail : TAIL, ids[TAIL];
  for (int i = 0; i < n; i++) ids[i] = x->tail[(x->n_tail - n + i) % TAIL];
  char *text = NULL;
  if (o->a->ops->detokenize(o->am->m, (const int32_t *)ids, n, &text) != 0 || !text) {
    free(text);
    return NULL;
  }
  const char *best = NULL, *at = NULL;
  size_t i;
  json_t *s;
  json_array_foreach(x->stop, i, s) {
    const char *hit = json_string_length(s) ? strstr(text, json_string_value(s)) : NULL;
    if (hit && (!at || hit < at)) at = hit, best = json_string_value(s);
  }
  free(text);
  return best;
}

static const char *stop_reason(oai *o, json_t *calls, const char *stop) {
  if (json_array_size(calls)) return "tool_use";
  if (!strcmp(o->gens[0].finish, "length")) return "max_tokens";
  return stop ? "stop_sequence" : "end_turn";
}

/* Anthropic's input_tokens leave out what was read from the cache: the prompt is their sum. */
static json_t *usage_json(const oai *o) {
  long long in = o->n_prompts ? o->prompts[0].n_ids : 0, out = o->n_gens ? o->gens[0].completion_tokens : 0;
  long long cached = o->n_gens ? o->gens[0].cached_tokens : 0;
  return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", (json_int_t)(in - cached), "cache_creation_input_tokens",
                   (json_int_t)0, "cache_read_input_tokens", (json_int_t)cached, "output_tokens", (json_int_t)out);
}

/* A chat call {id: "call_...", function: {name, arguments}} as a tool_use block; input {} when the
 * arguments are no JSON object (a model writing its own calls can get them wrong). */
static json_t *tool_use_block(json_t *call, bool with_input) {
  json_t *fn = json_object_get(call, "function");
  const char *id = json_string_value(json_object_get(call, "id"));
  char tid[64];
  snprintf(tid, sizeof tid, "toolu_%s", id && !strncmp(id, "call_", 5) ? id + 5 : id ? id : "");
  json_t *input = NULL;
  if (with_input) {
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    input = args ? json_loads(args, 0, NULL) : NULL;
    if (!json_is_object(input)) json_decref(input), input = NULL;
  }
  return json_pack("{s:s, s:s, s:O, s:o}", "type", "tool_use", "id", tid, "name", json_object_get(fn, "name"), "input",
                   input ? input : json_object());
}

static json_t *message_json(oai *o, json_t *content, const char *stop_reason, const char *stop_seq, json_t *usage) {
  return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "id", o->id, "type", "message", "role", "assistant",
                   "model", o->model_name, "content", content, "stop_reason",
                   stop_reason ? json_string(stop_reason) : json_null(), "stop_sequence",
                   stop_seq ? json_string(stop_seq) : json_null(), "usage", usage);
}

static void respond(oai *o) {
  anth *x = o->sink_ctx;
  gen *g = &o->gens[0];
  json_t *calls = o->tools ? oai_tools_calls(o->tools, 0) : NULL;
  bool parsed = calls || oai_tools_withheld(o->tools, 0); /* the parse says what the text is */
  const char *text = parsed ? oai_tools_content(o->tools, 0) : g->text.data;
  size_t n = parsed ? (text ? strlen(text) : 0) : g->text.len;
  json_t *content = json_array();
  size_t tn;
  const char *thought = oai_reasoning_text(o, 0, &tn); /* a thinking block first, as Anthropic's */
  if (thought)
    json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                             oai_json_text(thought, tn), "signature", ""));
  if (n > 0 || (!calls && !oai_tools_withheld(o->tools, 0) && !thought))
    json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text", oai_json_text(text ? text : "", n)));
  for (size_t i = 0; i < json_array_size(calls); i++)
    json_array_append_new(content, tool_use_block(json_array_get(calls, i), true));
  const char *stop = calls ? NULL : matched_stop(o, x);
  oai_respond(o, message_json(o, content, stop_reason(o, calls, stop), stop, usage_json(o)));
}

/* ---- streaming -------------------------------------------------------------------------------- */

/* One event: its data (stolen) with type set. -1: the client is gone. */
static int event(oai *o, const char *type, json_t *data) {
  if (!data) return -1;
  json_object_set_new(data, "type", json_string(type));
  char *s = json_dumps(data, JSON_COMPACT);
  json_decref(data);
  servd_buf *b = &o->sse;
  servd_buf_clear(b);
  servd_buf_printf(b, "event: %s\ndata: %s\n\n", type, s ? s : "{}");
  free(s);
  return b->oom ? -1 : oai_stream_write(o, b->data, b->len);
}

static void stream_begin(oai *o) {
  long long in = o->n_prompts ? o->prompts[0].n_ids : 0; /* the cache's part is known at the end */
  json_t *usage = json_pack("{s:I, s:i, s:i, s:i}", "input_tokens", (json_int_t)in, "cache_creation_input_tokens", 0,
                            "cache_read_input_tokens", 0, "output_tokens", 0);
  if (event(o, "message_start", json_pack("{s:o}", "message", message_json(o, json_array(), NULL, NULL, usage))) == 0)
    event(o, "ping", json_object());
}

static int block_start(oai *o, anth *x, json_t *block) {
  return event(o, "content_block_start", json_pack("{s:i, s:o}", "index", x->index, "content_block", block));
}

static int block_stop(oai *o, anth *x) {
  return event(o, "content_block_stop", json_pack("{s:i}", "index", x->index++));
}

/* One delta of an open block: {"type": type, key: s}. Written directly: it is the one event per token. */
static void block_delta(oai *o, anth *x, const char *type, const char *key, const char *s, size_t n) {
  servd_buf *b = &o->sse;
  servd_buf_clear(b);
  servd_buf_printf(b,
                   "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":%d,"
                   "\"delta\":{\"type\":\"%s\",\"%s\":",
                   x->index, type, key);
  servd_buf_json_str(b, s, n);
  servd_buf_puts(b, "}}\n\n");
  if (!b->oom) oai_stream_write(o, b->data, b->len);
}

/* The thought: one thinking block (its signature empty: servd signs nothing), before the text. */
static void stream_thinking(oai *o, gen *g, const char *s, size_t n) {
  (void)g;
  anth *x = o->sink_ctx;
  if (x->text_open) return; /* the splitter gives no thought after the answer */
  if (!x->thinking_open) {
    if (block_start(o, x, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")) != 0)
      return;
    x->thinking_open = true;
  }
  block_delta(o, x, "thinking_delta", "thinking", s, n);
}

static int thinking_close(oai *o, anth *x) {
  if (!x->thinking_open) return 0;
  x->thinking_open = false;
  return block_stop(o, x);
}

static void stream_text(oai *o, gen *g, const char *s, size_t n) {
  (void)g;
  anth *x = o->sink_ctx;
  if (thinking_close(o, x) != 0) return;
  if (!x->text_open) {
    if (block_start(o, x, json_pack("{s:s, s:s}", "type", "text", "text", "")) != 0) return;
    x->text_open = true;
  }
  block_delta(o, x, "text_delta", "text", s, n);
}

/* A call: its block with input {}, then its input's JSON in pieces (input_json_delta), then stop. */
static int call_stream(oai *o, anth *x, json_t *call) {
  json_t *full = tool_use_block(call, true);
  char *json = json_dumps(json_object_get(full, "input"), JSON_COMPACT);
  json_decref(full);
  int rc = block_start(o, x, tool_use_block(call, false));
  size_t n = json ? strlen(json) : 0, at = 0;
  while (rc == 0 && at < n) { /* pieces of about a token's size, never inside a UTF-8 character */
    size_t k = n - at < 16 ? n - at : 16;
    while (at + k < n && ((unsigned char)json[at + k] & 0xC0) == 0x80) k++;
    json_t *delta = json_pack("{s:s, s:s%}", "type", "input_json_delta", "partial_json", json + at, k);
    rc = event(o, "content_block_delta", json_pack("{s:i, s:o}", "index", x->index, "delta", delta));
    at += k;
  }
  free(json);
  return rc == 0 ? block_stop(o, x) : rc;
}

static void stream_end(oai *o, gen *g) {
  anth *x = o->sink_ctx;
  if (g->error) {
    x->failed = true;
    int st = g->error_code == SERVD_EBUSY || g->error_code == SERVD_ECANCELED ? 503 : 500;
    event(o, "error", json_pack("{s:{s:s, s:s}}", "error", "type", api_anthropic_error_type(st), "message", g->error));
    return;
  }
  json_t *calls = o->tools ? oai_tools_calls(o->tools, g->index) : NULL;
  size_t tn;
  bool thought = oai_reasoning_text(o, g->index, &tn) != NULL;
  if (thinking_close(o, x) != 0) return;
  if (!calls && !x->text_open && !oai_tools_withheld(o->tools, g->index) &&
      !thought) { /* an empty answer is still a block */
    if (block_start(o, x, json_pack("{s:s, s:s}", "type", "text", "text", "")) != 0) return;
    x->text_open = true;
  }
  if (x->text_open) {
    x->text_open = false;
    if (block_stop(o, x) != 0) return;
  }
  for (size_t i = 0; i < json_array_size(calls); i++)
    if (call_stream(o, x, json_array_get(calls, i)) != 0) return;
}

static void stream_finish(oai *o) {
  anth *x = o->sink_ctx;
  if (!x->failed) {
    json_t *calls = o->tools ? oai_tools_calls(o->tools, 0) : NULL;
    const char *stop = calls ? NULL : matched_stop(o, x);
    if (event(o, "message_delta",
              json_pack("{s:{s:s, s:o}, s:o}", "delta", "stop_reason", stop_reason(o, calls, stop), "stop_sequence",
                        stop ? json_string(stop) : json_null(), "usage", usage_json(o))) != 0 ||
        event(o, "message_stop", json_object()) != 0)
      return;
  }
  oai_stream_close(o);
}

static const oai_sink messages_sink = {
    .id_prefix = "msg_",
    .stream_begin = stream_begin,
    .stream_text = stream_text,
    .stream_end = stream_end,
    .stream_finish = stream_finish,
    .respond = respond,
    .param = anth_param_name,
    .ctx_free = anth_free,
    .error = anth_error,
    .token = on_token,
    .stream_reasoning = stream_thinking,
};

/* Parses the body; answers the 400 itself (NULL). */
static json_t *parse_body(servd_http_req *r, bool count, anth_request *q) {
  json_t *body = NULL;
  api_param_error perr;
  if (api_body_parse(r->body, r->body_len, &body, &perr) != 0) {
    api_anthropic_error(r, perr.status, "%s", perr.message);
    return NULL;
  }
  int rc = anth_params_parse(body, count, q, &perr);
  json_decref(body);
  if (rc != 0) {
    api_anthropic_error(r, perr.status, "%s", perr.message);
    return NULL;
  }
  return q->chat;
}

void api_anthropic_messages(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args; /* anthropic-version is accepted whatever it says: one version of the API is served */
  anth_request q;
  if (!parse_body(r, false, &q)) return;
  anth *x = calloc(1, sizeof *x);
  if (!x) {
    anth_request_free(&q);
    api_anthropic_error(r, 500, "out of memory");
    return;
  }
  x->stop = q.stop;
  q.stop = NULL;
  json_t *chat = q.chat;
  q.chat = NULL;
  anth_request_free(&q);
  oai_chat_serve(a, r, chat, &messages_sink, x); /* takes the chat body and x */
}

/* ---- count_tokens: the /tokenize machinery, answered as {"input_tokens": N} --------------------- */

static void count_respond(oai *o) {
  oai_respond(o, json_pack("{s:i}", "input_tokens", o->n_prompts ? o->prompts[0].n_ids : 0));
}

static void count_free(void *ctx) { (void)ctx; }

static const oai_sink count_sink = {
    .id_prefix = "msg_",
    .respond = count_respond,
    .param = anth_param_name,
    .ctx_free = count_free,
    .error = anth_error,
};

void api_anthropic_count_tokens(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  anth_request q;
  if (!parse_body(r, true, &q)) return;
  json_t *body = q.chat;
  q.chat = NULL;
  anth_request_free(&q);
  oai_sink_serve(a, r, body, OAI_TOKENIZE, &count_sink, NULL, NULL);
}
