/* Ollama's API: /api/chat, /api/generate and /api/embed run as the equivalent OpenAI request (their
 * bodies built by ollama_params.c); this file is those requests' sink, writing Ollama's objects and
 * its NDJSON stream (one JSON object a line, the last with "done": true and the timings), and the
 * handlers of /api/tags, /api/show, /api/ps and /api/version, which read the served models. */
#include "api/handlers.h"
#include "api/ollama.h"
#include "api/openai-impl.h"
#include "api/openai_tools.h"
#include "api/respond.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The Ollama version whose API this follows: clients such as Open WebUI check it for features. */
#define OLLAMA_API_VERSION "0.12.0"

typedef struct oll {
  ollama_kind kind;
  bool failed; /* streaming: an error line was sent */
  char *model; /* the model's name as the request gave it (echoed) */
} oll;

static void oll_free(void *ctx) {
  oll *x = ctx;
  if (!x) return;
  free(x->model);
  free(x);
}

static void oll_error(servd_http_req *r, int status, const char *msg) { api_kserve_error(r, status, "%s", msg); }

/* Now, as Ollama writes created_at (RFC 3339, UTC). */
static json_t *now_json(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char buf[64], out[80];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, sizeof out, "%s.%09ldZ", buf, ts.tv_nsec);
  return json_string(out);
}

/* {model, created_at} of every object. */
static json_t *head(const char *model) { return json_pack("{s:s, s:o}", "model", model, "created_at", now_json()); }

/* The final object's fields: done, done_reason and the timings (ns). */
static void done_fields(oai *o, json_t *j) {
  gen *g = o->n_gens ? &o->gens[0] : NULL;
  uint64_t now = api_now_ns();
  int64_t prompt_ns = g && g->t_first > o->t_start ? (int64_t)(g->t_first - o->t_start) : 0;
  int64_t eval_ns = g && g->t_last > g->t_first ? (int64_t)(g->t_last - g->t_first) : 0;
  json_object_set_new(j, "done", json_true());
  json_object_set_new(j, "done_reason", json_string(g && !strcmp(g->finish, "length") ? "length" : "stop"));
  json_object_set_new(j, "total_duration", json_integer((json_int_t)(now - o->t_start)));
  json_object_set_new(j, "load_duration", json_integer(0));
  json_object_set_new(j, "prompt_eval_count", json_integer(o->n_prompts ? o->prompts[0].n_ids : 0));
  json_object_set_new(j, "prompt_eval_duration", json_integer(prompt_ns));
  json_object_set_new(j, "eval_count", json_integer(g ? g->completion_tokens : 0));
  json_object_set_new(j, "eval_duration", json_integer(eval_ns));
}

/* Chat calls [{id, function: {name, arguments (a JSON string)}}] as Ollama's [{function: {name,
 * arguments (an object)}}]; arguments that are no JSON object become {}. */
static json_t *calls_json(json_t *calls) {
  json_t *out = json_array();
  size_t i;
  json_t *c;
  json_array_foreach(calls, i, c) {
    json_t *fn = json_object_get(c, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    json_t *obj = args ? json_loads(args, 0, NULL) : NULL;
    if (!json_is_object(obj)) json_decref(obj), obj = json_object();
    json_array_append_new(
        out, json_pack("{s:{s:O, s:o}}", "function", "name", json_object_get(fn, "name"), "arguments", obj));
  }
  return out;
}

static json_t *message(const char *text, size_t n, json_t *calls) {
  json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", oai_json_text(text ? text : "", n));
  if (m && calls) json_object_set_new(m, "tool_calls", calls);
  return m;
}

static void respond(oai *o) {
  oll *x = o->sink_ctx;
  json_t *j = head(x->model);
  if (x->kind == OLLAMA_EMBED) {
    json_t *embs = json_array();
    for (int i = 0; i < o->n_gens; i++) {
      json_t *v = json_array();
      for (int k = 0; o->x && k < o->x[i].n_vec; k++) json_array_append_new(v, json_real(o->x[i].vec[k]));
      json_array_append_new(embs, v);
    }
    long long n = 0;
    for (int i = 0; i < o->n_prompts; i++) n += o->prompts[i].n_ids;
    json_object_del(j, "created_at");
    json_object_set_new(j, "embeddings", embs);
    json_object_set_new(j, "total_duration", json_integer((json_int_t)(api_now_ns() - o->t_start)));
    json_object_set_new(j, "load_duration", json_integer(0));
    json_object_set_new(j, "prompt_eval_count", json_integer(n));
    oai_respond(o, j);
    return;
  }
  gen *g = &o->gens[0];
  json_t *calls = o->tools ? oai_tools_calls(o->tools, 0) : NULL;
  bool parsed = calls || oai_tools_withheld(o->tools, 0);
  const char *text = parsed ? oai_tools_content(o->tools, 0) : g->text.data;
  size_t n = parsed ? (text ? strlen(text) : 0) : g->text.len;
  if (x->kind == OLLAMA_CHAT) json_object_set_new(j, "message", message(text, n, calls ? calls_json(calls) : NULL));
  else json_object_set_new(j, "response", oai_json_text(text ? text : "", n));
  size_t tn;
  const char *thought = oai_reasoning_text(o, 0, &tn); /* message.thinking, generate's thinking */
  if (thought)
    json_object_set_new(x->kind == OLLAMA_CHAT ? json_object_get(j, "message") : j, "thinking",
                        oai_json_text(thought, tn));
  done_fields(o, j);
  oai_respond(o, j);
}

/* ---- streaming: NDJSON -------------------------------------------------------------------------- */

static int line(oai *o, json_t *j) {
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (!s) return -1;
  servd_buf *b = &o->sse;
  servd_buf_clear(b);
  servd_buf_puts(b, s);
  servd_buf_puts(b, "\n");
  free(s);
  return b->oom ? -1 : oai_stream_write(o, b->data, b->len);
}

static void stream_begin(oai *o) { (void)o; }

static void stream_text(oai *o, gen *g, const char *s, size_t n) {
  (void)g;
  oll *x = o->sink_ctx;
  json_t *j = head(x->model);
  if (x->kind == OLLAMA_CHAT) json_object_set_new(j, "message", message(s, n, NULL));
  else json_object_set_new(j, "response", oai_json_text(s, n));
  json_object_set_new(j, "done", json_false());
  line(o, j);
}

/* The thought streams as the answer does, in "thinking" beside an empty content or response. */
static void stream_thinking(oai *o, gen *g, const char *s, size_t n) {
  (void)g;
  oll *x = o->sink_ctx;
  json_t *j = head(x->model);
  if (x->kind == OLLAMA_CHAT) {
    json_t *m = message("", 0, NULL);
    json_object_set_new(m, "thinking", oai_json_text(s, n));
    json_object_set_new(j, "message", m);
  } else {
    json_object_set_new(j, "response", json_string(""));
    json_object_set_new(j, "thinking", oai_json_text(s, n));
  }
  json_object_set_new(j, "done", json_false());
  line(o, j);
}

static void stream_end(oai *o, gen *g) {
  oll *x = o->sink_ctx;
  if (g->error) {
    x->failed = true;
    line(o, json_pack("{s:s}", "error", g->error));
    return;
  }
  json_t *calls = o->tools ? oai_tools_calls(o->tools, g->index) : NULL;
  if (calls) { /* as Ollama streams them: one object with the calls, before the final one */
    json_t *j = head(x->model);
    json_object_set_new(j, "message", message("", 0, calls_json(calls)));
    json_object_set_new(j, "done", json_false());
    line(o, j);
  }
}

static void stream_finish(oai *o) {
  oll *x = o->sink_ctx;
  if (!x->failed) {
    json_t *j = head(x->model);
    if (x->kind == OLLAMA_CHAT) json_object_set_new(j, "message", message("", 0, NULL));
    else json_object_set_new(j, "response", json_string(""));
    done_fields(o, j);
    if (line(o, j) != 0) return;
  }
  oai_stream_close(o);
}

static const oai_sink ollama_sink = {
    .id_prefix = "ollama-",
    .stream_begin = stream_begin,
    .stream_text = stream_text,
    .stream_end = stream_end,
    .stream_finish = stream_finish,
    .respond = respond,
    .param = ollama_param_name,
    .ctx_free = oll_free,
    .error = oll_error,
    .content_type = "application/x-ndjson",
    .stream_reasoning = stream_thinking,
};

/* ---- the generating routes ---------------------------------------------------------------------- */

/* The served model a name means: itself, or without Ollama's default tag ":latest". NULL: none. */
static api_model *find_model(servd_api *a, const char *name, char *served, size_t cap) {
  snprintf(served, cap, "%s", name);
  api_model *am = api_model_resolve(a, served, NULL); /* an adapter: the OpenAI machinery resolves it again */
  size_t n = strlen(served);
  if (!am && n > 7 && !strcmp(served + n - 7, ":latest")) {
    served[n - 7] = '\0';
    am = api_model_resolve(a, served, NULL);
  }
  return am;
}

static void serve(servd_api *a, servd_http_req *r, ollama_kind kind) {
  json_t *body = NULL;
  api_param_error perr;
  if (api_body_parse(r->body, r->body_len, &body, &perr) != 0) {
    api_kserve_error(r, perr.status, "%s", perr.message);
    return;
  }
  ollama_request q;
  if (ollama_params_parse(body, kind, &q, &perr) != 0) {
    json_decref(body);
    api_kserve_error(r, perr.status, "%s", perr.message);
    return;
  }
  char served[256];
  api_model *am = find_model(a, q.model, served, sizeof served);
  if (!am) {
    api_kserve_error(r, 404, "model '%s' not found", q.model);
    goto out;
  }
  if (am->state != M_READY) { /* loading, unloading or failed: no model to ask (am->m may be NULL) */
    api_kserve_error(r, 503, "model '%s' is not available (loading, unloading or failed)", q.model);
    goto out;
  }
  r->model = am->name;
  json_object_set_new(q.body, "model", json_string(served));
  int ctx = a->ops->kind(am->m) == SERVD_MODEL_CAUSAL_LM ? a->ops->context_length(am->m) : 0;
  if (q.num_ctx > 0 && ctx > 0 && q.num_ctx > ctx) {
    api_kserve_error(r, 400, "'options.num_ctx' is %lld, more than the model's context length %d", q.num_ctx, ctx);
    goto out;
  }
  if (q.empty) { /* Ollama's "load the model": servd's models are loaded */
    json_t *j = head(q.model);
    if (kind == OLLAMA_CHAT) json_object_set_new(j, "message", message("", 0, NULL));
    else json_object_set_new(j, "response", json_string(""));
    json_object_set_new(j, "done", json_true());
    json_object_set_new(j, "done_reason", json_string("load"));
    api_json(r, 200, j);
    goto out;
  }
  oll *x = calloc(1, sizeof *x);
  char *model = strdup(q.model);
  if (!x || !model) {
    free(x);
    free(model);
    api_kserve_error(r, 500, "out of memory");
    goto out;
  }
  x->kind = kind;
  x->model = model;
  json_t *oai_body = json_incref(q.body);
  oai_mode mode = q.mode;
  ollama_request_free(&q);
  json_decref(body);
  oai_sink_serve(a, r, oai_body, mode, &ollama_sink, x, /* takes the body and x */
                 mode == OAI_EMBEDDINGS ? &oai_embedding_hooks : NULL);
  return;
out:
  ollama_request_free(&q);
  json_decref(body);
}

void api_ollama_chat(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  serve(a, r, OLLAMA_CHAT);
}
void api_ollama_generate(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  serve(a, r, OLLAMA_GENERATE);
}
void api_ollama_embed(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  serve(a, r, OLLAMA_EMBED);
}

/* ---- the model routes --------------------------------------------------------------------------- */

static json_t *time_json(int64_t unix_s) {
  time_t t = (time_t)unix_s;
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[64];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return json_string(buf);
}

static json_t *details_json(void) {
  return json_pack("{s:s, s:s, s:s, s:n, s:s, s:s}", "parent_model", "", "format", "servd", "family", "", "families",
                   "parameter_size", "", "quantization_level", "");
}

/* A served model's name as Ollama lists it: with the tag ":latest" when it has none. */
static json_t *tagged(const char *name) {
  char buf[300];
  snprintf(buf, sizeof buf, strchr(name, ':') ? "%s" : "%s:latest", name);
  return json_string(buf);
}

void api_ollama_tags(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  json_t *models = json_array();
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state != M_READY) continue;
    json_t *name = tagged(am->name);
    json_array_append_new(models,
                          json_pack("{s:O, s:o, s:o, s:i, s:s, s:o}", "name", name, "model", name, "modified_at",
                                    time_json(am->created), "size", 0, "digest", "", "details", details_json()));
  }
  api_json(r, 200, json_pack("{s:o}", "models", models));
}

void api_ollama_ps(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  json_t *models = json_array();
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state != M_READY) continue;
    json_t *name = tagged(am->name);
    int ctx = a->ops->kind(am->m) == SERVD_MODEL_CAUSAL_LM ? a->ops->context_length(am->m) : 0;
    /* Loaded until unloaded: expires_at is far away, as Ollama says for keep_alive -1. */
    json_array_append_new(models, json_pack("{s:O, s:o, s:i, s:s, s:o, s:s, s:i, s:i}", "name", name, "model", name,
                                            "size", 0, "digest", "", "details", details_json(), "expires_at",
                                            "2318-01-01T00:00:00Z", "size_vram", 0, "context_length", ctx));
  }
  api_json(r, 200, json_pack("{s:o}", "models", models));
}

void api_ollama_show(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  json_t *body = NULL;
  api_param_error perr;
  if (api_body_parse(r->body, r->body_len, &body, &perr) != 0) {
    api_kserve_error(r, perr.status, "%s", perr.message);
    return;
  }
  json_t *jm = json_object_get(body, "model");
  if (!jm) jm = json_object_get(body, "name"); /* the older clients' field */
  if (!json_is_string(jm)) {
    json_decref(body);
    api_kserve_error(r, 400, "'model' is required: a model's name");
    return;
  }
  char served[256];
  api_model *am = find_model(a, json_string_value(jm), served, sizeof served);
  if (!am || am->state != M_READY) {
    api_kserve_error(r, 404, "model '%s' not found", json_string_value(jm));
    json_decref(body);
    return;
  }
  json_decref(body);
  r->model = am->name;
  json_t *caps = json_array(), *info = json_object();
  if (a->ops->kind(am->m) == SERVD_MODEL_CAUSAL_LM) {
    json_array_append_new(caps, json_string("completion"));
    if (a->ops->tools_render) json_array_append_new(caps, json_string("tools"));
    servd_embedding_info ei;
    if (a->ops->embedding_info && a->ops->embedding_info(am->m, &ei) == 0) {
      json_array_append_new(caps, json_string("embedding"));
      json_object_set_new(info, "servd.embedding_length", json_integer(ei.dim));
    }
    json_object_set_new(info, "servd.context_length", json_integer(a->ops->context_length(am->m)));
  }
  json_object_set_new(info, "general.architecture", json_string("servd"));
  api_json(r, 200,
           json_pack("{s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "modelfile", "", "parameters", "", "template", "",
                     "details", details_json(), "model_info", info, "capabilities", caps, "modified_at",
                     time_json(am->created)));
}

void api_ollama_version(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)a;
  (void)args;
  api_json(r, 200, json_pack("{s:s}", "version", OLLAMA_API_VERSION));
}
