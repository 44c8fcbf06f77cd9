/* OpenAI-compatible routes: /v1/completions, /v1/chat/completions (streaming as server-sent
 * events), /v1/models, and vLLM's /tokenize and /detokenize. */
#include "api/handlers.h"
#include "api/openai-impl.h"
#include "api/openai_tools.h"
#include "api/respond.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "servd/status.h"

/* ---- lifetime --------------------------------------------------------------------------------- */

static void gen_unlink(servd_api *a, gen *g) {
  if (g->prev) g->prev->next = g->next;
  else if (a->gens == g) a->gens = g->next;
  if (g->next) g->next->prev = g->prev;
  g->prev = g->next = NULL;
}

static void oai_free(oai *o) {
  servd_api *a = o->a;
  for (int i = 0; i < o->n_gens; i++) {
    gen *g = &o->gens[i];
    servd_buf_free(&g->text);
    json_decref(g->lp);
    for (api_event *e = g->ev_cache, *n; e; e = n) { /* normally handed back by the final event */
      n = e->next;
      free(e->text);
      free(e);
    }
    free(g->error);
  }
  free(o->gens);
  for (int i = 0; o->x && i < o->n_gens; i++) {
    free(o->x[i].echo);
    free(o->x[i].vec);
  }
  free(o->x);
  for (int i = 0; i < o->n_prompts; i++) free(o->prompts[i].ids);
  json_decref(o->messages);
  free(o->guide);
  oai_tools_free(o->tools);
  oai_reasoning_free(o->reasoning);
  json_decref(o->template_kwargs);
  free(o->detok_text);
  servd_buf_free(&o->sse);
  if (o->am) api_model_release_ref(a, o->am);
  if (o->sink && o->sink->ctx_free) o->sink->ctx_free(o->sink_ctx);
  servd_arena_destroy(o->arena);
  free(o);
}

/* Frees o once nothing refers to it any more. Returns true when freed. */
static bool oai_maybe_free(oai *o) {
  if (o->req || o->work_pending || o->n_done < o->n_submitted) return false;
  oai_free(o);
  return true;
}

static void on_abort(servd_http_req *r) {
  oai *o = r->ctx;
  o->req = NULL;
  for (int i = 0; i < o->n_submitted; i++)
    if (!o->gens[i].done && o->gens[i].r) o->a->ops->cancel(o->gens[i].r);
  oai_maybe_free(o);
}

/* Ends the HTTP side with a complete response; o stays until its engine work is over. */
static void oai_error(oai *o, int status, const char *type, const char *param, const char *code, const char *fmt,
                      const char *msg) {
  servd_http_req *r = o->req;
  o->req = NULL;
  char renamed[64];
  if (o->sink && param) {
    o->sink->param(param, renamed, sizeof renamed);
    param = renamed;
  }
  if (r) {
    r->on_abort = NULL;
    if (o->sink && o->sink->error) o->sink->error(r, status, msg);
    else api_oai_error(r, status, type, param, code, fmt, msg);
  }
}

/* An error before o exists: OpenAI's error object, or the sink's route's own shape. */
static void route_error(servd_http_req *r, const oai_sink *sink, int status, const char *type, const char *param,
                        const char *code, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void route_error(servd_http_req *r, const oai_sink *sink, int status, const char *type, const char *param,
                        const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  api_utf8_fix(msg);
  if (sink && sink->error) sink->error(r, status, msg);
  else api_oai_error(r, status, type, param, code, "%s", msg);
}

/* An engine code: the field at fault is named only when the client is at fault (4xx). */
static void oai_error_rc(oai *o, int rc, const char *param, const char *msg) {
  int st = api_status_for(rc);
  const char *type = st == 400 ? "invalid_request_error" : st == 429 ? "rate_limit_error" : "server_error";
  const char *code = st == 429            ? "rate_limit_exceeded"
                     : st == 503          ? "service_unavailable"
                     : rc == SERVD_EMODEL ? "model_error"
                                          : NULL;
  oai_error(o, st, type, st == 400 ? param : NULL, code, "%s", msg);
}

void oai_fail(oai *o, int status, const char *param, const char *code, const char *msg) {
  oai_error(o, status, status < 500 ? "invalid_request_error" : "server_error", param, code, "%s", msg);
}

/* The prompt's field of this request. */
static const char *prompt_field(const oai *o) {
  return o->messages ? "messages" : o->mode == OAI_EMBEDDINGS ? "input" : "prompt";
}

/* A JSON string of raw model output: invalid UTF-8 (a token cut mid-character at the end) becomes
 * U+FFFD instead of failing the response. */
static json_t *json_text(const char *s, size_t n) {
  json_t *t = json_stringn(s, n);
  if (t) return t;
  servd_buf b;
  servd_buf_init(&b);
  servd_buf_json_str(&b, s, n);
  t = b.oom ? NULL : json_loadb(b.data, b.len, JSON_DECODE_ANY, NULL);
  servd_buf_free(&b);
  return t ? t : json_string("");
}

json_t *oai_json_text(const char *s, size_t n) { return json_text(s, n); }

/* ---- JSON pieces ------------------------------------------------------------------------------ */

static double clamp_lp(float lp) { return isfinite(lp) ? lp : -9999.0; }

/* The text of one token (arena-free: caller frees). */
static char *token_text(oai *o, int32_t id) {
  char *s = NULL;
  if (o->a->ops->detokenize(o->am->m, &id, 1, &s) != 0 || !s) {
    free(s);
    return strdup("");
  }
  return s;
}

static json_t *bytes_of(const char *s) {
  json_t *b = json_array();
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) json_array_append_new(b, json_integer(*p));
  return b;
}

/* Chat: one entry of logprobs.content. */
static json_t *chat_lp_entry(oai *o, const api_event *ev) {
  char *t = token_text(o, ev->token);
  json_t *top = json_array();
  for (int i = 0; i < ev->n_top && i < o->logprobs; i++) {
    char *tt = token_text(o, ev->top[i].token);
    json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", json_text(tt ? tt : "", tt ? strlen(tt) : 0),
                                         "logprob", clamp_lp(ev->top[i].logprob), "bytes", bytes_of(tt ? tt : "")));
    free(tt);
  }
  json_t *e = json_pack("{s:o, s:f, s:o, s:o}", "token", json_text(t ? t : "", t ? strlen(t) : 0), "logprob",
                        clamp_lp(ev->logprob), "bytes", bytes_of(t ? t : ""), "top_logprobs", top);
  free(t);
  return e;
}

/* Completions: {tokens, token_logprobs, top_logprobs, text_offset} with one entry appended; returns
 * the length of the token's text. */
static size_t compl_lp_append(oai *o, json_t *lp, const api_event *ev, size_t offset) {
  char *t = token_text(o, ev->token);
  size_t len = t ? strlen(t) : 0;
  json_array_append_new(json_object_get(lp, "tokens"), json_text(t ? t : "", t ? strlen(t) : 0));
  json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(clamp_lp(ev->logprob)));
  json_t *top = json_object();
  for (int i = 0; i < ev->n_top && i < o->logprobs; i++) {
    char *tt = token_text(o, ev->top[i].token);
    json_object_set_new(top, tt ? tt : "", json_real(clamp_lp(ev->top[i].logprob)));
    free(tt);
  }
  json_array_append_new(json_object_get(lp, "top_logprobs"), top);
  json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
  free(t);
  return len;
}

static json_t *compl_lp_new(void) {
  return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

static json_t *usage_json(oai *o) {
  long long prompt = 0, completion = 0;
  for (int i = 0; i < o->n_prompts; i++) prompt += o->prompts[i].n_ids;
  for (int i = 0; i < o->n_gens; i++) completion += o->gens[i].completion_tokens;
  /* A prompt counts once, however many choices ran it: its best prefix-cache hit among them. */
  long long cached = 0;
  for (int i = 0; i < o->n_prompts; i++) {
    int best = 0;
    for (int k = i * o->n; k < (i + 1) * o->n && k < o->n_gens; k++)
      if (o->gens[k].cached_tokens > best) best = o->gens[k].cached_tokens;
    cached += best;
  }
  return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)prompt, "completion_tokens",
                   (json_int_t)completion, "total_tokens", (json_int_t)(prompt + completion), "prompt_tokens_details",
                   "cached_tokens", (json_int_t)cached);
}

/* ---- streaming -------------------------------------------------------------------------------- */

static void sse_head(oai *o, servd_buf *b) {
  bool chat = o->mode == OAI_CHAT;
  servd_buf_printf(b, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%" PRId64 ",\"model\":", o->id,
                   chat ? "chat.completion.chunk" : "text_completion", o->created);
  servd_buf_json_str(b, o->model_name, strlen(o->model_name));
}

/* One chunk for choice g: text delta (may be NULL), logprobs (may be NULL), finish reason (or NULL). */
static int sse_choice(oai *o, gen *g, const char *text, size_t len, json_t *lp, const char *finish) {
  servd_buf *b = &o->sse;
  servd_buf_clear(b);
  sse_head(o, b);
  servd_buf_printf(b, ",\"choices\":[{\"index\":%d,", g->index);
  if (o->mode == OAI_CHAT) {
    servd_buf_puts(b, "\"delta\":{");
    if (!g->role_sent) {
      servd_buf_puts(b, "\"role\":\"assistant\"");
      g->role_sent = true;
      if (text) servd_buf_puts(b, ",");
    }
    if (text) {
      servd_buf_puts(b, "\"content\":");
      servd_buf_json_str(b, text, len);
    }
    servd_buf_puts(b, "},");
  } else {
    servd_buf_puts(b, "\"text\":");
    servd_buf_json_str(b, text ? text : "", text ? len : 0);
    servd_buf_puts(b, ",");
  }
  servd_buf_puts(b, "\"logprobs\":");
  if (lp) {
    char *s = json_dumps(lp, JSON_COMPACT);
    servd_buf_puts(b, s ? s : "null");
    free(s);
  } else {
    servd_buf_puts(b, "null");
  }
  servd_buf_puts(b, ",\"finish_reason\":");
  if (finish) servd_buf_json_str(b, finish, strlen(finish));
  else servd_buf_puts(b, "null");
  if (finish && g->finish_detail[0]) {
    servd_buf_puts(b, ",\"servd_finish_detail\":");
    servd_buf_json_str(b, g->finish_detail, strlen(g->finish_detail));
  }
  servd_buf_puts(b, "}]}\n\n");
  if (b->oom) return -1;
  return servd_http_stream_write(o->req, b->data, b->len);
}

static int sse_raw(oai *o, const char *s, size_t n) { return servd_http_stream_write(o->req, s, n); }

int oai_stream_write(oai *o, const char *s, size_t n) { return o->req ? sse_raw(o, s, n) : -1; }

void oai_stream_close(oai *o) {
  servd_http_req *r = o->req;
  if (!r) return;
  o->req = NULL;
  r->on_abort = NULL;
  servd_http_stream_end(r);
}

void oai_respond(oai *o, json_t *body) {
  servd_http_req *r = o->req;
  if (!r) {
    json_decref(body);
    return;
  }
  o->req = NULL;
  r->on_abort = NULL;
  api_json(r, 200, body);
}

/* One chat chunk for choice g whose delta is the given object (stolen). */
static int sse_delta(oai *o, gen *g, json_t *delta) {
  servd_buf *b = &o->sse;
  servd_buf_clear(b);
  sse_head(o, b);
  char *d = json_dumps(delta, JSON_COMPACT);
  json_decref(delta);
  servd_buf_printf(b, ",\"choices\":[{\"index\":%d,\"delta\":%s,\"logprobs\":null,\"finish_reason\":null}]}\n\n",
                   g->index, d ? d : "{}");
  free(d);
  if (b->oom) return -1;
  return servd_http_stream_write(o->req, b->data, b->len);
}

/* The end of a streamed choice with tools: what text was held back and is no call after all, then
 * each call as OpenAI streams it: a first delta with its index, id, type, name and arguments "",
 * then the arguments in pieces. */
static int sse_tool_calls(oai *o, gen *g) {
  json_t *calls = oai_tools_calls(o->tools, g->index);
  if (!calls && oai_tools_withheld(o->tools, g->index)) return 0; /* a forced call cut short: no text */
  if (!calls) {
    size_t from;
    size_t to = oai_tools_releasable(o->tools, g->index, g->text.data, g->text.len, &from);
    to = g->text.len; /* the end: nothing more can start a call */
    if (to > from && sse_choice(o, g, g->text.data + from, to - from, NULL, NULL) != 0) return -1;
    return 0;
  }
  bool legacy = oai_tools_legacy(o->tools);
  size_t i;
  json_t *c;
  json_array_foreach(calls, i, c) {
    if (legacy && i > 0) break;
    json_t *fn = json_object_get(c, "function");
    json_t *first = json_pack("{s:O, s:s}", "name", json_object_get(fn, "name"), "arguments", "");
    json_t *d = legacy ? json_pack("{s:o}", "function_call", first)
                       : json_pack("{s:[{s:i, s:O, s:s, s:o}]}", "tool_calls", "index", (int)i, "id",
                                   json_object_get(c, "id"), "type", "function", "function", first);
    if (sse_delta(o, g, d) != 0) return -1;
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    size_t n = strlen(args), at = 0;
    while (at < n) { /* pieces of about a token's size, never inside a UTF-8 character */
      size_t k = n - at < 16 ? n - at : 16;
      while (at + k < n && ((unsigned char)args[at + k] & 0xC0) == 0x80) k++;
      json_t *piece = json_stringn(args + at, k);
      json_t *f = json_pack("{s:o}", "arguments", piece);
      d = legacy ? json_pack("{s:o}", "function_call", f)
                 : json_pack("{s:[{s:i, s:o}]}", "tool_calls", "index", (int)i, "function", f);
      if (sse_delta(o, g, d) != 0) return -1;
      at += k;
    }
  }
  return 0;
}

static void stream_finish(oai *o) {
  if (o->include_usage) {
    servd_buf *b = &o->sse;
    servd_buf_clear(b);
    sse_head(o, b);
    json_t *u = usage_json(o);
    char *s = json_dumps(u, JSON_COMPACT);
    json_decref(u);
    servd_buf_printf(b, ",\"choices\":[],\"usage\":%s}\n\n", s ? s : "null");
    free(s);
    if (sse_raw(o, b->data, b->len) != 0) return; /* aborted: o->req is NULL now */
  }
  if (sse_raw(o, "data: [DONE]\n\n", 14) != 0) return;
  servd_http_req *r = o->req;
  o->req = NULL;
  r->on_abort = NULL;
  servd_http_stream_end(r);
}

/* ---- completion ------------------------------------------------------------------------------- */

static void respond_full(oai *o) {
  bool chat = o->mode == OAI_CHAT;
  for (int i = 0; i < o->n_gens; i++)
    if (o->gens[i].error) {
      /* Parameters were checked at submit: a failure while generating is the server's or the model's. */
      int code = o->gens[i].error_code;
      int st = code == SERVD_EBUSY ? 429 : code == SERVD_ETIMEDOUT ? 504 : code == SERVD_ECANCELED ? 503 : 500;
      oai_error(o, st, st == 429 ? "rate_limit_error" : "server_error", NULL,
                code == SERVD_EMODEL ? "model_error" : NULL, "%s", o->gens[i].error);
      return;
    }
  if (o->sink) {
    o->sink->respond(o);
    return;
  }
  if (o->embed) {
    o->embed->respond(o);
    return;
  }
  json_t *choices = json_array();
  for (int i = 0; i < o->n_gens; i++) {
    gen *g = &o->gens[i];
    json_t *text = json_text(g->text.data ? g->text.data : "", g->text.len);
    json_t *lp = g->lp ? json_incref(g->lp) : json_null();
    json_t *c;
    json_t *calls = chat ? oai_tools_calls(o->tools, i) : NULL;
    if (calls || (chat && oai_tools_withheld(o->tools, i))) { /* the text outside the calls, or null */
      const char *rest = oai_tools_content(o->tools, i);
      json_decref(text);
      text = rest ? json_text(rest, strlen(rest)) : json_null();
    }
    if (calls && oai_tools_legacy(o->tools))
      c = json_pack("{s:i, s:{s:s, s:o, s:O}, s:o, s:s}", "index", g->index, "message", "role", "assistant", "content",
                    text, "function_call", json_object_get(json_array_get(calls, 0), "function"), "logprobs", lp,
                    "finish_reason", g->finish);
    else if (calls)
      c = json_pack("{s:i, s:{s:s, s:o, s:O}, s:o, s:s}", "index", g->index, "message", "role", "assistant", "content",
                    text, "tool_calls", calls, "logprobs", lp, "finish_reason", g->finish);
    else if (chat)
      c = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", g->index, "message", "role", "assistant", "content", text,
                    "logprobs", lp, "finish_reason", g->finish);
    else
      c = json_pack("{s:i, s:o, s:o, s:s}", "index", g->index, "text", text, "logprobs", lp, "finish_reason",
                    g->finish);
    if (c && g->finish_detail[0]) json_object_set_new(c, "servd_finish_detail", json_string(g->finish_detail));
    size_t tn;
    const char *thought = chat ? oai_reasoning_text(o, i, &tn) : NULL;
    if (c && thought) json_object_set_new(json_object_get(c, "message"), "reasoning_content", json_text(thought, tn));
    json_array_append_new(choices, c);
  }
  json_t *resp =
      json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", o->id, "object", chat ? "chat.completion" : "text_completion",
                "created", (json_int_t)o->created, "model", o->model_name, "choices", choices, "usage", usage_json(o));
  servd_http_req *r = o->req;
  o->req = NULL;
  r->on_abort = NULL;
  api_json(r, 200, resp);
}

/* Engine text is raw bytes; JSON needs valid UTF-8, so the bytes go through the escaper first. */
static void append_text(gen *g, const char *s, size_t n) { servd_buf_append(&g->text, s, n); }

static void gen_complete(oai *o, gen *g);
static void embed_feed(oai *o);

/* ---- tool calls: the output parsed by the package's hook on a worker thread -------------------- */

typedef struct parse_work {
  uv_work_t w;
  oai *o;
  gen *g;
  int rc;
  char err[512];
} parse_work;

static void parse_run(uv_work_t *w) {
  parse_work *p = w->data;
  oai *o = p->o;
  gen *g = p->g;
  p->rc = oai_tools_parse(o->tools, o->a->ops, o->am->m, g->index, g->text.data, g->text.len);
  if (p->rc) snprintf(p->err, sizeof p->err, "the tool-call parser failed: %s", api_user_cause(servd_last_error()));
}

static void parse_after(uv_work_t *w, int status) {
  (void)status;
  parse_work *p = w->data;
  oai *o = p->o;
  gen *g = p->g;
  o->a->works--;
  if (p->rc) {
    g->error = strdup(p->err);
    g->error_code = SERVD_EMODEL;
    snprintf(g->finish, sizeof g->finish, "error");
  } else if (oai_tools_calls(o->tools, g->index) && strcmp(g->finish, "length")) {
    snprintf(g->finish, sizeof g->finish, "%s", oai_tools_legacy(o->tools) ? "function_call" : "tool_calls");
  }
  free(p);
  gen_complete(o, g);
}

/* 0: the parse is queued and completes the choice; else the caller completes it now. */
static int tools_parse_start(oai *o, gen *g) {
  parse_work *p = calloc(1, sizeof *p);
  if (!p) return -1;
  p->o = o;
  p->g = g;
  p->w.data = p;
  if (uv_queue_work(o->a->loop, &p->w, parse_run, parse_after) != 0) {
    free(p);
    return -1;
  }
  o->a->works++;
  return 0;
}

/* Echo: the choice starts with its prompt; with logprobs, the prompt's first token (no logprob: it
 * has no context) opens them. */
static void echo_begin(oai *o, gen *g) {
  oai_choice_x *x = &o->x[g->index];
  const oai_prompt *p = &o->prompts[g->index / o->n];
  size_t n = x->echo ? strlen(x->echo) : 0;
  if (!o->stream) append_text(g, x->echo ? x->echo : "", n);
  g->text_offset = n;
  if (o->logprobs < 0) return;
  g->lp = compl_lp_new();
  char *t = token_text(o, p->ids[0]);
  json_array_append_new(json_object_get(g->lp, "tokens"), json_text(t ? t : "", t ? strlen(t) : 0));
  json_array_append_new(json_object_get(g->lp, "token_logprobs"), json_null());
  json_array_append_new(json_object_get(g->lp, "top_logprobs"), json_null());
  json_array_append_new(json_object_get(g->lp, "text_offset"), json_integer(0));
  x->prompt_off = t ? strlen(t) : 0;
  free(t);
}

/* Streaming with echo: the prompt goes out as the choice's first chunk, with its logprobs, before
 * the first generated token (vLLM's order). */
static void echo_flush(oai *o, gen *g) {
  oai_choice_x *x = o->x ? &o->x[g->index] : NULL;
  if (!o->echo || !o->stream || !x || x->echo_sent || !o->req) return;
  x->echo_sent = true;
  sse_choice(o, g, x->echo ? x->echo : "", x->echo ? strlen(x->echo) : 0, g->lp, NULL);
  json_decref(g->lp);
  g->lp = NULL;
}

void api_oai_event(servd_api *a, api_event *ev) {
  gen *g = ev->g;
  oai *o = g->owner;
  api_model *am = g->am;
  if (ev->kind == SERVD_EVENT_PROMPT_TOKEN) { /* echo with logprobs: a prompt token's */
    if (g->lp && o->x) o->x[g->index].prompt_off += compl_lp_append(o, g->lp, ev, o->x[g->index].prompt_off);
    return;
  }
  if (ev->kind == SERVD_EVENT_TOKEN) {
    if (o->sink && o->sink->token) o->sink->token(o, g, ev);
    echo_flush(o, g);
    bool first = !g->t_first;
    double secs = (double)(ev->t_ns - (first ? o->t_start : g->t_last)) / 1e9;
    if (first) g->t_first = ev->t_ns;
    api_hist_observe(first ? &am->ttft : &am->itl, secs);
    api_vllm_token(am, first, secs);
    g->t_last = ev->t_ns;
    if (!o->req) return;
    if (o->reasoning) oai_reasoning_token(o, g, ev); /* the thought goes out; ev keeps the answer */
    /* token -1: text held back by the engine (stop strings, UTF-8) and released at the end. */
    bool want_lp = o->logprobs >= 0 && ev->token >= 0;
    if (o->stream) {
      if (ev->text_len == 0 && !want_lp) return;
      json_t *lp = NULL;
      if (want_lp) {
        if (o->mode == OAI_CHAT) {
          lp = json_pack("{s:[o]}", "content", chat_lp_entry(o, ev));
        } else {
          lp = compl_lp_new();
          compl_lp_append(o, lp, ev, g->text_offset);
        }
      }
      g->text_offset += ev->text_len;
      if (o->tools) { /* text from where a call starts is held for the parser at the end */
        if (ev->text_len) append_text(g, ev->text, ev->text_len);
        size_t from, to = oai_tools_releasable(o->tools, g->index, g->text.data, g->text.len, &from);
        if (o->sink) {
          if (to > from) o->sink->stream_text(o, g, g->text.data + from, to - from);
        } else if (to > from || lp) sse_choice(o, g, g->text.data ? g->text.data + from : "", to - from, lp, NULL);
        json_decref(lp);
        return;
      }
      if (!o->sink) sse_choice(o, g, ev->text ? ev->text : "", ev->text_len, lp, NULL);
      else if (ev->text_len) o->sink->stream_text(o, g, ev->text, ev->text_len);
      json_decref(lp);
      return;
    }
    if (want_lp) {
      if (!g->lp) g->lp = o->mode == OAI_CHAT ? json_pack("{s:[]}", "content") : compl_lp_new();
      if (o->mode == OAI_CHAT) json_array_append_new(json_object_get(g->lp, "content"), chat_lp_entry(o, ev));
      else compl_lp_append(o, g->lp, ev, g->text_offset);
    }
    g->text_offset += ev->text_len;
    if (ev->text_len) append_text(g, ev->text, ev->text_len);
    return;
  }

  /* Final event. */
  size_t held_len = 0;
  const char *held = o->reasoning ? oai_reasoning_end(o, g, ev, &held_len) : NULL;
  if (held) {
    /* Answer text held back in case it began the thought: out as the last token's text, the way the
     * engine releases text it held for a stop string. No time passed. */
    api_event last;
    memset(&last, 0, sizeof last);
    last.kind = SERVD_EVENT_TOKEN;
    last.g = g;
    last.token = -1;
    last.t_ns = g->t_last ? g->t_last : ev->t_ns;
    last.text = (char *)held;
    last.text_len = last.text_cap = held_len;
    api_oai_event(a, &last);
  }
  if (ev->kind == SERVD_EVENT_ERROR) {
    g->error = strdup(ev->error[0] ? ev->error : "the model failed");
    g->error_code = ev->error_code;
    snprintf(g->finish, sizeof g->finish, "error");
  } else {
    const char *why = ev->finish[0] ? ev->finish : "stop";
    const char *oai_why = api_oai_finish_reason(why);
    snprintf(g->finish, sizeof g->finish, "%s", oai_why);
    snprintf(g->finish_detail, sizeof g->finish_detail, "%s", strcmp(why, oai_why) ? why : "");
  }
  if (ev->completion_tokens > 0) g->completion_tokens = ev->completion_tokens;
  if (ev->prompt_tokens > 0) g->prompt_tokens = ev->prompt_tokens;
  if (ev->cached_tokens > 0) g->cached_tokens = ev->cached_tokens;
  api_hist_observe(&am->e2e, (double)(ev->t_ns - o->t_start) / 1e9);
  api_vllm_finished(a, am, ev, (double)(ev->t_ns - o->t_start) / 1e9, o->gp.max_tokens);
  api_trace_finished(a, am, &o->trace, ev, o->t_start, g->t_submit, g->t_first, o->gp.max_tokens);
  if (g->r) a->ops->release(g->r);
  g->r = NULL;
  gen_unlink(a, g);
  if (o->tools && !g->error && o->req && tools_parse_start(o, g) == 0) return; /* gen_complete follows */
  gen_complete(o, g);
}

/* A choice's last words: the final chunk when streaming, and the response once all are done. */
static void gen_complete(oai *o, gen *g) {
  if (!g->error) echo_flush(o, g);
  if (o->req && o->stream && o->sink) {
    if (!g->error && o->tools && !oai_tools_calls(o->tools, g->index) &&
        !oai_tools_withheld(o->tools, g->index)) { /* held back, and no call after all */
      size_t from;
      oai_tools_releasable(o->tools, g->index, g->text.data, g->text.len, &from);
      if (g->text.len > from) o->sink->stream_text(o, g, g->text.data + from, g->text.len - from);
    }
    if (o->req) o->sink->stream_end(o, g);
  } else if (o->req && o->stream && !g->error && o->tools) {
    sse_tool_calls(o, g); /* a failed write clears o->req */
  }
  if (o->req && o->stream && !o->sink) {
    if (g->error) {
      servd_buf *b = &o->sse;
      servd_buf_clear(b);
      servd_buf_puts(b, "data: {\"error\":{\"message\":");
      servd_buf_json_str(b, g->error, strlen(g->error));
      servd_buf_puts(b, g->error_code == SERVD_EMODEL
                            ? ",\"type\":\"server_error\",\"param\":null,\"code\":\"model_error\"}}\n\n"
                            : ",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n");
      sse_raw(o, b->data, b->len);
    } else {
      sse_choice(o, g, o->mode == OAI_CHAT ? NULL : "", 0, NULL, g->finish);
    }
  }
  g->done = true;
  o->n_done++;
  if (o->mode == OAI_EMBEDDINGS) embed_feed(o);
  if (o->n_done == o->n_submitted && !o->work_pending && o->req) {
    if (o->stream && o->sink) o->sink->stream_finish(o);
    else if (o->stream) stream_finish(o);
    else respond_full(o);
  }
  oai_maybe_free(o);
}

/* ---- preparing prompts on a worker thread ----------------------------------------------------- */

/* A constraint that does not compile. The grammar engine compiles nothing but what the request
 * gave, so whatever it raised (a RecursionError on a deep schema as much as a ValueError) is the
 * request's 400 naming the field, not the model's 500. A grammar engine that is not installed is
 * the server's 501 saying how to install it (models/llama/guided.py words that "... which is not
 * installed (scripts/install-python-deps.sh)"). */
static void guide_failed(oai *o, int rc, const char *param) {
  const char *cause = api_user_cause(servd_last_error());
  o->err_param = param;
  if (strstr(cause, "which is not installed")) {
    o->err_rc = SERVD_EUNSUPPORTED;
    o->err_status = 501;
    snprintf(o->err, sizeof o->err,
             "'%s' needs the grammar engine of constrained decoding (the llguidance Python package), which this "
             "server does not have: install it with scripts/install-python-deps.sh and restart servd",
             param);
    return;
  }
  o->err_rc = rc == SERVD_EMODEL ? SERVD_EINVAL : rc;
  snprintf(o->err, sizeof o->err, "'%s' cannot be enforced: %s", param, cause);
}

static void prep_work(uv_work_t *w) {
  oai *o = w->data;
  servd_api *a = o->a;
  servd_model *m = o->am->m;
  int rc = 0;
  if (o->mode == OAI_DETOKENIZE) {
    oai_prompt *p = &o->prompts[0];
    if (p->n_ids == 0) {
      o->detok_text = strdup("");
    } else if ((rc = a->ops->detokenize(m, p->ids, p->n_ids, &o->detok_text)) != 0) {
      o->err_rc = rc;
      o->err_param = "tokens";
      snprintf(o->err, sizeof o->err, "the token ids cannot be decoded: %s", api_user_cause(servd_last_error()));
    }
    return;
  }
  if (o->guide_kind != SERVD_GUIDE_NONE) { /* an invalid constraint is the client's 400, before any work */
    rc = a->ops->guide_compile ? a->ops->guide_compile(m, o->guide_kind, o->guide_spec, &o->guide)
                               : servd_fail(SERVD_EUNSUPPORTED, "this server has no constrained decoding");
    if (rc != 0) {
      guide_failed(o, rc, o->guide_param);
      return;
    }
    o->gp.guide = o->guide;
  }
  if (o->messages) {
    char *text = NULL, *grammar = NULL;
    const char *param = "messages";
    rc = oai_chat_render(o, &text, &grammar, &param); /* with tools and chat_template_kwargs */
    if (grammar) { /* a forced call (never with another constraint); auto keeps the request's own */
      o->guide = grammar;
      o->gp.guide = grammar;
    }
    if (rc != 0 && param && strcmp(param, "messages")) {
      guide_failed(o, rc, param);
      free(text);
      return;
    }
    if (rc != 0) {
      o->err_rc = rc;
      o->err_param = "messages";
      snprintf(o->err, sizeof o->err, "the model's chat template cannot render these messages: %s",
               api_user_cause(servd_last_error()));
      free(text);
      return;
    }
    o->prompts[0].text = NULL;
    rc = a->ops->tokenize(m, text, strlen(text), o->add_special, &o->prompts[0].ids, &o->prompts[0].n_ids);
    free(text);
    if (rc != 0) {
      o->err_rc = rc;
      o->err_param = "messages";
      snprintf(o->err, sizeof o->err, "the rendered messages cannot be tokenized: %s",
               api_user_cause(servd_last_error()));
    }
    return;
  }
  if (o->embed && o->embed->tokenize) {
    o->embed->tokenize(o);
    return;
  }
  for (int i = 0; i < o->n_prompts; i++) {
    oai_prompt *p = &o->prompts[i];
    if (!p->text && o->echo) { /* echoed as text: the ids' decoding */
      char *t = NULL;
      if (a->ops->detokenize(m, p->ids, p->n_ids, &t) == 0 && t) p->text = servd_arena_strdup(o->arena, t);
      free(t);
      if (!p->text) {
        o->err_rc = SERVD_EINVAL;
        o->err_param = "prompt";
        snprintf(o->err, sizeof o->err, "prompt %d cannot be decoded for echo: %s", i,
                 api_user_cause(servd_last_error()));
        return;
      }
      continue;
    }
    if (!p->text) continue;
    rc = a->ops->tokenize(m, p->text, strlen(p->text), o->add_special, &p->ids, &p->n_ids);
    if (rc != 0) {
      o->err_rc = rc;
      o->err_param = "prompt";
      if (o->n_prompts > 1)
        snprintf(o->err, sizeof o->err, "prompt %d cannot be tokenized: %s", i, api_user_cause(servd_last_error()));
      else snprintf(o->err, sizeof o->err, "the prompt cannot be tokenized: %s", api_user_cause(servd_last_error()));
      return;
    }
  }
  if (o->embed && o->embed->tokenized) o->embed->tokenized(o);
}

/* Embeddings: the most inputs of one request queued in the engine at once. Each input is an engine
 * request and takes a queue slot; queued all at once, 270 of them overflowed --max-queue 256 on an
 * idle server (a 429 after the first inputs had been computed) and starved other requests. */
#define EMBED_WINDOW 32

/* Queues choice i. 0, or the engine's code (nothing queued). */
static int submit_gen(oai *o, int i) {
  servd_api *a = o->a;
  api_model *am = o->am;
  gen *g = &o->gens[i];
  g->api = a;
  g->owner = o;
  g->am = am;
  g->index = i;
  g->t_submit = api_now_ns();
  oai_prompt *p = &o->prompts[i / o->n];
  servd_gen_params gp = o->gp;
  if (gp.has_seed) gp.seed += (uint64_t)i; /* n samples from one seed must differ, reproducibly */
  gp.pair_split = p->pair_split;
  if (o->echo) echo_begin(o, g);
  int rc = a->ops->submit(am->m, p->ids, p->n_ids, &gp, o->embed ? o->embed->engine_cb : api_engine_cb, g, &g->r);
  if (rc != 0) return rc;
  g->next = a->gens;
  if (a->gens) a->gens->prev = g;
  a->gens = g;
  o->n_submitted++;
  return 0;
}

/* A submit failed: the choices already queued are cancelled (o lives until their final events) and
 * the client gets the error. */
static void submit_failed(oai *o, int rc) {
  servd_api *a = o->a;
  char msg[768];
  if (rc == SERVD_EBUSY && strstr(servd_last_error(), "LoRA adapter")) /* every resident adapter slot is held */
    snprintf(msg, sizeof msg, "the server is at capacity for model '%s': %s", o->model_name,
             api_user_cause(servd_last_error()));
  else if (rc == SERVD_EBUSY)
    snprintf(msg, sizeof msg, "the server is at capacity for model '%s': queue full; retry later", o->am->name);
  else if (rc == SERVD_ECANCELED) snprintf(msg, sizeof msg, "The model `%s` is unloading; retry later.", o->am->name);
  else if (api_status_for(rc) == 400) /* what the API cannot check itself: token ids beyond the vocabulary */
    snprintf(msg, sizeof msg, "the model cannot take this %s: %s", prompt_field(o), api_user_cause(servd_last_error()));
  else snprintf(msg, sizeof msg, "the generation could not start: %s", api_user_cause(servd_last_error()));
  for (int k = 0; k < o->n_submitted; k++)
    if (!o->gens[k].done && o->gens[k].r) a->ops->cancel(o->gens[k].r);
  oai_error_rc(o, rc, prompt_field(o), msg);
}

static void embed_retry(uv_timer_t *t);
static void on_embed_timer_closed(uv_handle_t *h) { free(h); }

/* Embeddings: queues the next inputs while fewer than EMBED_WINDOW run. A full queue (other
 * requests took the slots) waits for this request's next input to finish or, with none running,
 * retries on a timer; o->work_pending keeps the response (and o) until then. */
static void embed_feed(oai *o) {
  while (o->req && o->n_submitted < o->n_gens && o->n_submitted - o->n_done < EMBED_WINDOW) {
    int rc = submit_gen(o, o->n_submitted);
    if (rc == SERVD_EBUSY && o->n_submitted > o->n_done) return;
    if (rc == SERVD_EBUSY) {
      uv_timer_t *t = malloc(sizeof *t);
      if (t && uv_timer_init(o->a->loop, t) == 0) {
        t->data = o;
        o->work_pending = true;
        uv_timer_start(t, embed_retry, 5, 0);
        return;
      }
      free(t);
    }
    if (rc != 0) {
      submit_failed(o, rc);
      return;
    }
  }
}

static void embed_retry(uv_timer_t *t) {
  oai *o = t->data;
  uv_close((uv_handle_t *)t, on_embed_timer_closed);
  o->work_pending = false;
  embed_feed(o);
  oai_maybe_free(o);
}

static void start_generation(oai *o) {
  servd_api *a = o->a;
  api_model *am = o->am;
  if (am->state != M_READY || a->draining) {
    oai_error(o, 503, "server_error", NULL, "service_unavailable", "%s",
              "the model is not available (loading, unloading or "
              "the server is draining)");
    return;
  }
  if (o->embed && !o->embed->check(o)) return;
  int ctx = a->ops->context_length(am->m);
  for (int i = 0; i < o->n_prompts; i++) {
    int np = o->prompts[i].n_ids;
    long long need = (long long)np + (o->gp.max_tokens > 0 ? o->gp.max_tokens : 1);
    if (o->mode == OAI_EMBEDDINGS || o->gp.prompt_only) need = np + 1; /* nothing generated */
    if (np == 0) {
      oai_error(o, 400, "invalid_request_error", prompt_field(o), NULL, "%s", "the prompt is empty after tokenization");
      return;
    }
    if (ctx > 0 && np >= ctx) { /* the prompt alone leaves no room for one token: vLLM's wording */
      char msg[512];
      snprintf(msg, sizeof msg,
               "This model's maximum context length is %d tokens. However, your %s resulted in "
               "%d tokens. Please reduce the length of the %s.",
               ctx, prompt_field(o), np, prompt_field(o));
      oai_error(o, 400, "invalid_request_error", prompt_field(o), "context_length_exceeded", "%s", msg);
      return;
    }
    if (ctx > 0 && need > ctx) {
      char msg[512];
      snprintf(msg, sizeof msg,
               "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in the "
               "prompt, %d for the completion). Please reduce the prompt or max_tokens.",
               ctx, need, np, o->gp.max_tokens > 0 ? o->gp.max_tokens : 1);
      oai_error(o, 400, "invalid_request_error", "max_tokens", "context_length_exceeded", "%s", msg);
      return;
    }
  }
  o->n_gens = o->n_prompts * o->n;
  o->gens = calloc((size_t)o->n_gens, sizeof(gen));
  o->x = calloc((size_t)o->n_gens, sizeof(oai_choice_x));
  for (int i = 0; o->x && o->echo && i < o->n_gens; i++) {
    const char *t = o->prompts[i / o->n].text;
    if (!(o->x[i].echo = strdup(t ? t : ""))) {
      free(o->x);
      o->x = NULL;
    }
  }
  if (!o->gens || !o->x) {
    oai_error(o, 500, "server_error", NULL, NULL, "%s", "out of memory");
    return;
  }
  /* Everything is queued before the response starts, so a full queue is still a plain 429. Events
   * cannot overtake: they reach this request through the loop, after this function returns.
   * Embeddings queue a window of their inputs; each one done lets the next in (embed_feed). */
  int first = o->mode == OAI_EMBEDDINGS && o->n_gens > EMBED_WINDOW ? EMBED_WINDOW : o->n_gens;
  for (int i = 0; i < first; i++) {
    int rc = submit_gen(o, i);
    /* A full queue after the first input: the request is admitted, the rest follow as inputs finish. */
    if (rc == SERVD_EBUSY && o->mode == OAI_EMBEDDINGS && i > 0) break;
    if (rc != 0) {
      submit_failed(o, rc);
      return;
    }
  }
  if (o->stream)
    servd_http_stream_begin(o->req, 200,
                            o->sink && o->sink->content_type ? o->sink->content_type : "text/event-stream");
  if (o->stream && o->sink) {
    o->sink->stream_begin(o);
  } else if (o->stream && o->mode == OAI_CHAT) {
    /* The first chunk of each choice carries the role, as OpenAI's does. */
    for (int i = 0; i < o->n_gens && o->req; i++) {
      gen *g = &o->gens[i];
      servd_buf *b = &o->sse;
      servd_buf_clear(b);
      sse_head(o, b);
      servd_buf_printf(b,
                       ",\"choices\":[{\"index\":%d,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                       "\"logprobs\":null,\"finish_reason\":null}]}\n\n",
                       g->index);
      g->role_sent = true;
      if (sse_raw(o, b->data, b->len) != 0) return;
    }
  }
}

static void respond_tokens(oai *o) {
  servd_api *a = o->a;
  if (o->sink) {
    o->sink->respond(o);
    return;
  }
  if (o->mode == OAI_DETOKENIZE) {
    json_t *t = json_text(o->detok_text ? o->detok_text : "", o->detok_text ? strlen(o->detok_text) : 0);
    servd_http_req *r = o->req;
    o->req = NULL;
    r->on_abort = NULL;
    api_json(r, 200, json_pack("{s:o}", "prompt", t));
    return;
  }
  oai_prompt *p = &o->prompts[0];
  json_t *ids = json_array();
  for (int i = 0; i < p->n_ids; i++) json_array_append_new(ids, json_integer(p->ids[i]));
  servd_http_req *r = o->req;
  o->req = NULL;
  r->on_abort = NULL;
  api_json(r, 200,
           json_pack("{s:i, s:i, s:o}", "count", p->n_ids, "max_model_len", a->ops->context_length(o->am->m), "tokens",
                     ids));
}

static void prep_after(uv_work_t *w, int status) {
  (void)status;
  oai *o = w->data;
  free(w);
  o->a->works--;
  o->work_pending = false;
  if (!o->req) {
    oai_maybe_free(o);
    return;
  }
  if (o->err_status) oai_error(o, o->err_status, "server_error", o->err_param, "not_implemented", "%s", o->err);
  else if (o->err_rc) oai_error_rc(o, o->err_rc, o->err_param, o->err);
  else if (o->mode == OAI_TOKENIZE || o->mode == OAI_DETOKENIZE) respond_tokens(o);
  else start_generation(o);
  oai_maybe_free(o);
}

/* ---- entry points ----------------------------------------------------------------------------- */

static void make_id(servd_api *a, const char *prefix, char *out, size_t cap) {
  uint64_t x = api_now_ns() ^ ((uint64_t)++a->id_seq * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(uintptr_t)a << 7);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  snprintf(out, cap, "%s%016" PRIx64 "%08" PRIx64, prefix, x, a->id_seq);
}

/* Resolves 'model'; responds (and returns NULL) when it is missing, unknown or not serving. */
static api_model *resolve_model(servd_api *a, servd_http_req *r, json_t *body, bool need_lm, const oai_sink *sink,
                                const char **lora) {
  json_t *jm = json_object_get(body, "model");
  api_model *am = NULL;
  if (!jm || json_is_null(jm)) {
    int n = 0;
    for (api_model *x = a->models; x; x = x->next) {
      if (x->state != M_UNAVAILABLE || x->sleep_level) { /* a sleeper is served: the request wakes it */
        am = x;
        n++;
      }
    }
    if (n != 1) {
      route_error(r, sink, 400, "invalid_request_error", "model", NULL,
                  "'model' is required when the server serves %d models", n);
      return NULL;
    }
  } else if (!json_is_string(jm)) {
    route_error(r, sink, 400, "invalid_request_error", "model", NULL, "'model' must be a string");
    return NULL;
  } else {
    am = api_model_resolve(a, json_string_value(jm), lora);
    if (!am) {
      route_error(r, sink, 404, "invalid_request_error", "model", "model_not_found", "The model `%s` does not exist.",
                  json_string_value(jm));
      return NULL;
    }
  }
  r->model = am->name;
  char why[256];
  if (api_sleep_gate(a, am, r, why, sizeof why)) {
    route_error(r, sink, 503, "server_error", NULL, "service_unavailable", "%s", why);
    return NULL;
  }
  if (am->state == M_UNAVAILABLE) {
    route_error(r, sink, 404, "invalid_request_error", "model", "model_not_found", "The model `%s` is not loaded.",
                am->name);
    return NULL;
  }
  if (am->state != M_READY || a->draining) {
    route_error(r, sink, 503, "server_error", NULL, "service_unavailable", "The model `%s` is %s; retry later.",
                am->name,
                am->state == M_LOADING ? "loading"
                : a->draining          ? "draining"
                                       : "unloading");
    return NULL;
  }
  if (need_lm && a->ops->kind(am->m) != SERVD_MODEL_CAUSAL_LM) {
    route_error(r, sink, 400, "invalid_request_error", "model", NULL,
                "The model `%s` is not a language model; call /v2/models/%s/infer", am->name, am->name);
    return NULL;
  }
  return am;
}

/* Serves body (stolen) for mode; sink (NULL: the mode's own output) takes sink_ctx. */
/* Chat completions' own streamed thought: a chunk whose delta is {"reasoning_content": s}. */
static void reasoning_chunk(oai *o, gen *g, const char *s, size_t n) {
  servd_buf *b = &o->sse;
  servd_buf_clear(b);
  servd_buf_printf(b, "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":", o->id,
                   (long long)o->created);
  servd_buf_json_str(b, o->model_name, strlen(o->model_name));
  servd_buf_printf(b, ",\"choices\":[{\"index\":%d,\"delta\":{\"reasoning_content\":", g->index);
  servd_buf_json_str(b, s, n);
  servd_buf_puts(b, "},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
  if (!b->oom) oai_stream_write(o, b->data, b->len);
}

static void serve(servd_api *a, servd_http_req *r, json_t *body, oai_mode mode, const oai_sink *sink, void *sink_ctx,
                  const oai_embed_hooks *embed) {
  api_param_error perr;
  json_t *rid = json_object_get(body, "request_id"); /* vLLM's body field; the header wins, as in vLLM */
  if (json_is_string(rid) && !servd_http_header_get(r, "x-request-id")) api_request_id_set(r, json_string_value(rid));
  const char *lora = NULL;
  api_model *am = resolve_model(a, r, body, true, sink, &lora);
  if (!am) {
    json_decref(body);
    if (sink && sink->ctx_free) sink->ctx_free(sink_ctx);
    return;
  }
  oai *o = calloc(1, sizeof(*o));
  servd_arena *arena = servd_arena_create(4096);
  uv_work_t *w = malloc(sizeof(*w));
  if (!o || !arena || !w) {
    free(o);
    free(w);
    servd_arena_destroy(arena);
    json_decref(body);
    route_error(r, sink, 500, "server_error", NULL, NULL, "out of memory");
    if (sink && sink->ctx_free) sink->ctx_free(sink_ctx);
    return;
  }
  o->a = a;
  o->sink = sink;
  o->sink_ctx = sink_ctx;
  o->reasoning_chunk = reasoning_chunk;
  o->embed = mode == OAI_EMBEDDINGS ? embed : NULL;
  o->mode = mode;
  o->arena = arena;
  o->t_start = r->start_ns;
  if (a->tracer) api_trace_ctx_init(&o->trace, servd_http_header_get(r, "traceparent"), r->request_id);
  o->created = (int64_t)time(NULL);
  o->model_name = servd_arena_strdup(arena, lora ? lora : am->name); /* an adapter answers by its name */
  make_id(a,
          sink                     ? sink->id_prefix
          : mode == OAI_CHAT       ? "chatcmpl-"
          : mode == OAI_EMBEDDINGS ? "embd-"
                                   : "cmpl-",
          o->id, sizeof o->id);
  api_param_limits lim;
  memset(&lim, 0, sizeof lim);
  if (a->ops->model_gen_params_default) a->ops->model_gen_params_default(am->m, &lim.defaults);
  else a->ops->gen_params_default(&lim.defaults);
  if (a->ops->vocab_size) lim.n_vocab = a->ops->vocab_size(am->m);
  lim.max_n = a->o.max_n;
  lim.default_deadline_ms = a->o.default_deadline_ms;
  oai_params p;
  int prc = oai_params_parse(body, mode, &lim, arena, &p, &perr);
  json_decref(body);
  if (prc != 0) {
    if (sink && perr.param[0]) {
      char renamed[sizeof perr.param];
      sink->param(perr.param, renamed, sizeof renamed);
      snprintf(perr.param, sizeof perr.param, "%s", renamed);
    }
    route_error(r, sink, perr.status, "invalid_request_error", perr.param[0] ? perr.param : NULL, NULL, "%s",
                perr.message);
    free(w);
    oai_free(o);
    return;
  }
  /* o owns what p held from here on. */
  o->stream = p.stream;
  o->include_usage = p.include_usage;
  o->add_special = p.add_special;
  o->add_generation_prompt = p.add_generation_prompt;
  o->n = p.n;
  o->n_prompts = p.n_prompts;
  o->prompts = p.prompts;
  o->messages = p.messages;
  o->gp = p.gp;
  o->gp.lora = lora ? o->model_name : NULL;
  o->logprobs = p.logprobs;
  o->guide_kind = p.guide_kind;
  o->guide_spec = p.guide_spec;
  o->guide_param = p.guide_param;
  o->tools = p.tools;
  o->template_kwargs = p.template_kwargs;
  o->echo = p.echo;
  o->base64 = p.base64;
  o->truncate_prompt_tokens = p.truncate_prompt_tokens;
  o->am = am;
  am->inflight++;
  a->inflight++;
  o->req = r;
  r->ctx = o;
  r->on_abort = on_abort;
  w->data = o;
  o->work_pending = true;
  if (uv_queue_work(a->loop, w, prep_work, prep_after) != 0) {
    free(w);
    o->work_pending = false;
    oai_error(o, 500, "server_error", NULL, NULL, "%s", "cannot queue work");
    oai_maybe_free(o);
    return;
  }
  a->works++;
}

static void handle_embed(servd_api *a, servd_http_req *r, oai_mode mode, const oai_embed_hooks *embed) {
  json_t *body = NULL;
  api_param_error perr;
  if (api_body_parse(r->body, r->body_len, &body, &perr) != 0) {
    api_oai_error(r, perr.status, "invalid_request_error", NULL, NULL, "%s", perr.message);
    return;
  }
  serve(a, r, body, mode, NULL, NULL, embed);
}

static void handle(servd_api *a, servd_http_req *r, oai_mode mode) { handle_embed(a, r, mode, NULL); }

void oai_chat_serve(servd_api *a, servd_http_req *r, json_t *body, const oai_sink *sink, void *sink_ctx) {
  serve(a, r, body, OAI_CHAT, sink, sink_ctx, NULL);
}

void oai_sink_serve(servd_api *a, servd_http_req *r, json_t *body, oai_mode mode, const oai_sink *sink, void *sink_ctx,
                    const oai_embed_hooks *embed) {
  serve(a, r, body, mode, sink, sink_ctx, embed);
}

void api_oai_completions(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  handle(a, r, OAI_COMPLETIONS);
}
void api_oai_chat_completions(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  handle(a, r, OAI_CHAT);
}
void oai_embeddings_serve(servd_api *a, servd_http_req *r, const oai_embed_hooks *embed) {
  handle_embed(a, r, OAI_EMBEDDINGS, embed);
}

void api_oai_tokenize(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  handle(a, r, OAI_TOKENIZE);
}
void api_oai_detokenize(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  handle(a, r, OAI_DETOKENIZE);
}

static json_t *model_entry(servd_api *a, api_model *am) {
  json_t *e = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", am->name, "object", "model", "created",
                        (json_int_t)am->created, "owned_by", "servd", "root", am->name);
  if (a->ops->kind(am->m) == SERVD_MODEL_CAUSAL_LM)
    json_object_set_new(e, "max_model_len", json_integer(a->ops->context_length(am->m)));
  return e;
}

void api_oai_models(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  json_t *data = json_array();
  for (api_model *am = a->models; am; am = am->next)
    if (am->state == M_READY) {
      json_array_append_new(data, model_entry(a, am));
      api_lora_model_entries(a, am, data);
    }
  api_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

void api_oai_model(servd_api *a, servd_http_req *r, const api_route_args *args) {
  const char *name = args->model, *lora = NULL;
  api_model *am = api_model_resolve(a, name, &lora);
  r->model = am ? am->name : NULL;
  json_t *e = !am || am->state != M_READY ? NULL : lora ? api_lora_model_entry(a, am, lora) : model_entry(a, am);
  if (!e) {
    api_oai_error(r, 404, "invalid_request_error", "model", "model_not_found", "The model `%s` does not exist.", name);
    return;
  }
  api_json(r, 200, e);
}
