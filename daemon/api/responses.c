/* POST /v1/responses: the request runs as the equivalent chat completions request (its body built by
 * responses_params.c); this file is that request's sink, writing OpenAI's response object and, when
 * streaming, its typed events (event: lines, each with a sequence_number). */
#include "api/handlers.h"
#include "api/openai-impl.h"
#include "api/openai_tools.h"
#include "api/respond.h"
#include "api/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The sink's state: what the stream has said so far. */
typedef struct resp {
  json_t *echo;   /* request fields repeated in the response object (own) */
  json_t *output; /* streaming: the output items done (own) */
  int seq;        /* the next event's sequence_number */
  int n_items;    /* output items started */
  int msg_index;  /* output_index of the open message, -1: none */
  int rs_index;   /* output_index of the open reasoning item, -1: none */
  bool failed;    /* response.failed was sent */
  servd_buf text; /* streaming: the open message's text */
} resp;

static void resp_free(void *ctx) {
  resp *x = ctx;
  if (!x) return;
  json_decref(x->echo);
  json_decref(x->output);
  servd_buf_free(&x->text);
  free(x);
}

/* ---- the response object ---------------------------------------------------------------------- */

static json_t *usage_json(const oai *o) {
  long long in = o->n_prompts ? o->prompts[0].n_ids : 0, out = o->n_gens ? o->gens[0].completion_tokens : 0;
  long long cached = o->n_gens ? o->gens[0].cached_tokens : 0;
  return json_pack("{s:I, s:I, s:I, s:{s:I}, s:{s:i}}", "input_tokens", (json_int_t)in, "output_tokens",
                   (json_int_t)out, "total_tokens", (json_int_t)(in + out), "input_tokens_details", "cached_tokens",
                   (json_int_t)cached, "output_tokens_details", "reasoning_tokens", oai_reasoning_tokens(o, 0));
}

static bool cut_short(const oai *o) { return o->n_gens && !strcmp(o->gens[0].finish, "length"); }

/* status: in_progress, completed, incomplete or failed; output stolen; error (stolen) or NULL. */
static json_t *response_json(oai *o, resp *x, const char *status, json_t *output, json_t *error) {
  bool done = strcmp(status, "in_progress");
  json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o, s:o, s:o}", "id", o->id, "object", "response",
                        "created_at", (json_int_t)o->created, "status", status, "model", o->model_name, "output",
                        output, "error", error ? error : json_null(), "incomplete_details",
                        !strcmp(status, "incomplete") ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null(),
                        "usage", done && !error ? usage_json(o) : json_null());
  if (r) json_object_update(r, x->echo);
  return r;
}

static void msg_id(const oai *o, char *out, size_t cap) { snprintf(out, cap, "msg_%s", o->id + 5); }
static void rs_id(const oai *o, char *out, size_t cap) { snprintf(out, cap, "rs_%s", o->id + 5); }

/* The thought of a reasoning model as a reasoning item: its text as one reasoning_text part. */
static json_t *reasoning_item(const oai *o, const char *status) {
  char id[64];
  rs_id(o, id, sizeof id);
  size_t n;
  const char *t = oai_reasoning_text(o, 0, &n);
  json_t *content = strcmp(status, "in_progress")
                        ? json_pack("[{s:s, s:o}]", "type", "reasoning_text", "text", oai_json_text(t ? t : "", n))
                        : json_array();
  return json_pack("{s:s, s:s, s:[], s:o, s:s}", "type", "reasoning", "id", id, "summary", "content", content, "status",
                   status);
}
static void fc_id(const oai *o, int i, char *out, size_t cap) { snprintf(out, cap, "fc_%s_%d", o->id + 5, i); }

static json_t *message_item(const oai *o, const char *status, json_t *text) {
  char id[64];
  msg_id(o, id, sizeof id);
  json_t *content =
      text ? json_pack("[{s:s, s:o, s:[]}]", "type", "output_text", "text", text, "annotations") : json_array();
  return json_pack("{s:s, s:s, s:s, s:s, s:o}", "type", "message", "id", id, "status", status, "role", "assistant",
                   "content", content);
}

/* A chat tool call {id, function: {name, arguments}} as a function_call item. */
static json_t *call_item(const oai *o, int i, json_t *call, const char *status, bool with_args) {
  char id[64];
  fc_id(o, i, id, sizeof id);
  json_t *fn = json_object_get(call, "function");
  return json_pack("{s:s, s:s, s:O, s:O, s:o, s:s}", "type", "function_call", "id", id, "call_id",
                   json_object_get(call, "id"), "name", json_object_get(fn, "name"), "arguments",
                   with_args ? json_incref(json_object_get(fn, "arguments")) : json_string(""), "status", status);
}

static void respond(oai *o) {
  resp *x = o->sink_ctx;
  gen *g = &o->gens[0];
  json_t *calls = o->tools ? oai_tools_calls(o->tools, 0) : NULL;
  bool parsed = calls || oai_tools_withheld(o->tools, 0); /* the parse says what the text is */
  const char *text = parsed ? oai_tools_content(o->tools, 0) : g->text.data;
  size_t n = parsed ? (text ? strlen(text) : 0) : g->text.len;
  const char *status = cut_short(o) ? "incomplete" : "completed";
  json_t *output = json_array();
  size_t tn;
  if (oai_reasoning_text(o, 0, &tn)) json_array_append_new(output, reasoning_item(o, "completed"));
  if (!calls || n > 0) json_array_append_new(output, message_item(o, status, oai_json_text(text ? text : "", n)));
  for (size_t i = 0; i < json_array_size(calls); i++)
    json_array_append_new(output, call_item(o, (int)i, json_array_get(calls, i), "completed", true));
  oai_respond(o, response_json(o, x, status, output, NULL));
}

/* ---- streaming -------------------------------------------------------------------------------- */

/* One event: its fields (stolen) with type and sequence_number added. -1: the client is gone. */
static int event(oai *o, const char *type, json_t *fields) {
  resp *x = o->sink_ctx;
  if (!fields) return -1;
  json_object_set_new(fields, "type", json_string(type));
  json_object_set_new(fields, "sequence_number", json_integer(x->seq++));
  char *s = json_dumps(fields, JSON_COMPACT);
  json_decref(fields);
  servd_buf *b = &o->sse;
  servd_buf_clear(b);
  servd_buf_printf(b, "event: %s\ndata: %s\n\n", type, s ? s : "{}");
  free(s);
  return b->oom ? -1 : oai_stream_write(o, b->data, b->len);
}

static void stream_begin(oai *o) {
  resp *x = o->sink_ctx;
  if (event(o, "response.created",
            json_pack("{s:o}", "response", response_json(o, x, "in_progress", json_array(), NULL))) == 0)
    event(o, "response.in_progress",
          json_pack("{s:o}", "response", response_json(o, x, "in_progress", json_array(), NULL)));
}

static json_t *text_part(const char *s, size_t n) {
  return json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", oai_json_text(s, n), "annotations");
}

/* The thought: a reasoning item open from its first piece until the answer or the end. */
static void stream_reasoning(oai *o, gen *g, const char *s, size_t n) {
  (void)g;
  resp *x = o->sink_ctx;
  char id[64];
  rs_id(o, id, sizeof id);
  if (x->rs_index < 0) {
    x->rs_index = x->n_items++;
    if (event(o, "response.output_item.added",
              json_pack("{s:i, s:o}", "output_index", x->rs_index, "item", reasoning_item(o, "in_progress"))) != 0)
      return;
  }
  event(o, "response.reasoning_text.delta",
        json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", x->rs_index, "content_index", 0, "delta",
                  oai_json_text(s, n)));
}

static int reasoning_close(oai *o, resp *x) {
  if (x->rs_index < 0) return 0;
  char id[64];
  rs_id(o, id, sizeof id);
  int at = x->rs_index;
  x->rs_index = -1;
  size_t n;
  const char *t = oai_reasoning_text(o, 0, &n);
  if (event(o, "response.reasoning_text.done",
            json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", at, "content_index", 0, "text",
                      oai_json_text(t ? t : "", n))) != 0)
    return -1;
  json_t *item = reasoning_item(o, "completed");
  json_array_append(x->output, item);
  return event(o, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", at, "item", item));
}

static int message_open(oai *o, resp *x) {
  if (reasoning_close(o, x) != 0) return -1;
  x->msg_index = x->n_items++;
  char id[64];
  msg_id(o, id, sizeof id);
  if (event(o, "response.output_item.added",
            json_pack("{s:i, s:o}", "output_index", x->msg_index, "item", message_item(o, "in_progress", NULL))) != 0)
    return -1;
  return event(o, "response.content_part.added",
               json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", x->msg_index, "content_index", 0,
                         "part", text_part("", 0)));
}

/* A delta is written directly: it is the one event per token. */
static void stream_text(oai *o, gen *g, const char *s, size_t n) {
  (void)g;
  resp *x = o->sink_ctx;
  if (x->msg_index < 0 && message_open(o, x) != 0) return;
  servd_buf_append(&x->text, s, n);
  servd_buf *b = &o->sse;
  servd_buf_clear(b);
  servd_buf_printf(b,
                   "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\","
                   "\"sequence_number\":%d,\"item_id\":\"msg_%s\",\"output_index\":%d,\"content_index\":0,"
                   "\"delta\":",
                   x->seq++, o->id + 5, x->msg_index);
  servd_buf_json_str(b, s, n);
  servd_buf_puts(b, ",\"logprobs\":[]}\n\n");
  if (!b->oom) oai_stream_write(o, b->data, b->len);
}

static int message_close(oai *o, resp *x, const char *status) {
  char id[64];
  msg_id(o, id, sizeof id);
  const char *t = x->text.data ? x->text.data : "";
  int at = x->msg_index;
  x->msg_index = -1;
  if (event(o, "response.output_text.done",
            json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", id, "output_index", at, "content_index", 0, "text",
                      oai_json_text(t, x->text.len), "logprobs")) != 0 ||
      event(o, "response.content_part.done",
            json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", at, "content_index", 0, "part",
                      text_part(t, x->text.len))) != 0)
    return -1;
  json_t *item = message_item(o, status, oai_json_text(t, x->text.len));
  json_array_append(x->output, item);
  return event(o, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", at, "item", item));
}

static int call_stream(oai *o, resp *x, int i, json_t *call) {
  int at = x->n_items++;
  char id[64];
  fc_id(o, i, id, sizeof id);
  const char *args = json_string_value(json_object_get(json_object_get(call, "function"), "arguments"));
  if (event(o, "response.output_item.added",
            json_pack("{s:i, s:o}", "output_index", at, "item", call_item(o, i, call, "in_progress", false))) != 0 ||
      event(o, "response.function_call_arguments.delta",
            json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", at, "delta", args ? args : "")) != 0 ||
      event(o, "response.function_call_arguments.done",
            json_pack("{s:s, s:i, s:s}", "item_id", id, "output_index", at, "arguments", args ? args : "")) != 0)
    return -1;
  json_t *item = call_item(o, i, call, "completed", true);
  json_array_append(x->output, item);
  return event(o, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", at, "item", item));
}

static void stream_end(oai *o, gen *g) {
  resp *x = o->sink_ctx;
  if (g->error) {
    x->failed = true;
    json_t *err = json_pack("{s:s, s:s}", "code", "server_error", "message", g->error);
    event(o, "response.failed",
          json_pack("{s:o}", "response", response_json(o, x, "failed", json_incref(x->output), err)));
    return;
  }
  json_t *calls = o->tools ? oai_tools_calls(o->tools, g->index) : NULL;
  if (reasoning_close(o, x) != 0) return;
  if (!calls && x->msg_index < 0 && message_open(o, x) != 0) return; /* an empty answer is still a message */
  if (x->msg_index >= 0 && message_close(o, x, cut_short(o) ? "incomplete" : "completed") != 0) return;
  for (size_t i = 0; i < json_array_size(calls); i++)
    if (call_stream(o, x, (int)i, json_array_get(calls, i)) != 0) return;
}

static void stream_finish(oai *o) {
  resp *x = o->sink_ctx;
  if (!x->failed) {
    const char *status = cut_short(o) ? "incomplete" : "completed";
    char type[32];
    snprintf(type, sizeof type, "response.%s", status);
    if (event(o, type, json_pack("{s:o}", "response", response_json(o, x, status, json_incref(x->output), NULL))) != 0)
      return;
  }
  oai_stream_close(o);
}

static const oai_sink responses_sink = {
    .id_prefix = "resp_",
    .stream_begin = stream_begin,
    .stream_text = stream_text,
    .stream_end = stream_end,
    .stream_finish = stream_finish,
    .respond = respond,
    .param = resp_param_name,
    .ctx_free = resp_free,
    .stream_reasoning = stream_reasoning,
};

void api_oai_responses(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  json_t *body = NULL;
  api_param_error perr;
  if (api_body_parse(r->body, r->body_len, &body, &perr) != 0) {
    api_oai_error(r, perr.status, "invalid_request_error", NULL, NULL, "%s", perr.message);
    return;
  }
  resp_request q;
  int rc = resp_params_parse(body, &q, &perr);
  json_decref(body);
  if (rc != 0) {
    api_oai_error(r, perr.status, "invalid_request_error", perr.param[0] ? perr.param : NULL, NULL, "%s", perr.message);
    return;
  }
  resp *x = calloc(1, sizeof *x);
  json_t *output = json_array();
  if (!x || !output) {
    free(x);
    json_decref(output);
    resp_request_free(&q);
    api_oai_error(r, 500, "server_error", NULL, NULL, "out of memory");
    return;
  }
  x->echo = q.echo;
  x->output = output;
  x->msg_index = -1;
  x->rs_index = -1;
  servd_buf_init(&x->text);
  oai_chat_serve(a, r, q.chat, &responses_sink, x); /* takes the chat body and x */
}
