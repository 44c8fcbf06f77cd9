/* POST /v1/rerank, /rerank (Jina's and Cohere's shape, as vLLM and llama-server serve it) and
 * /v1/score (vLLM's): a cross-encoder scores text pairs. Each pair is an engine request of kind
 * score (servd_gen_params.score): the body is checked here, then runs as an embeddings request of
 * openai.c whose inputs are the pairs' first texts; the hooks tokenize the pairs ([CLS] a [SEP] b
 * [SEP], token types 0 then 1), keep each pair's score and answer in the route's shape. Every pair
 * of a request is queued at once (up to openai.c's window of 32), so they share the engine's steps. */
#include "api/handlers.h"
#include "api/openai-impl.h"
#include "api/params_check.h"
#include "api/respond.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

/* Pairs of one request at most: the embeddings route's input cap, which bounds its memory. */
#define PAIRS_MAX OAI_MAX_EMBEDDING_INPUTS

typedef enum pair_route { ROUTE_RERANK, ROUTE_SCORE } pair_route;

/* One request's pairs beside openai.c's state (its sink context). */
typedef struct pairs {
  pair_route route;
  json_t *second;    /* array of the pairs' second texts (strings; own reference) */
  const char *field; /* the second texts' field: "documents" or "text_2" */
  long long top_n;   /* rerank: results kept (0: all) */
  bool return_docs;  /* rerank: each result carries its document's text */
} pairs;

static void pairs_free(void *ctx) {
  pairs *p = ctx;
  if (!p) return;
  json_decref(p->second);
  free(p);
}

/* ---- the engine side: hooks of openai.c's embeddings machinery ------------------------------- */

/* On the prep worker: the model must be a one-label cross-encoder; then each pair is tokenized,
 * cut LongestFirst to truncate_prompt_tokens (-1: the model's context) or refused when too long. */
static void pairs_tokenize(oai *o) {
  const pairs *p = o->sink_ctx;
  const servd_model_ops *ops = o->a->ops;
  servd_model *m = o->am->m;
  servd_embedding_info info;
  o->err_rc = SERVD_EINVAL;
  o->err_param = "model";
  if (!ops->tokenize_pair || !ops->embedding_info || ops->embedding_info(m, &info) != 0) {
    snprintf(o->err, sizeof o->err, "model '%.200s' does not score text pairs: it is not a language model package",
             o->model_name);
    return;
  }
  if (info.n_labels < 1) {
    snprintf(o->err, sizeof o->err,
             "model '%.200s' is not a cross-encoder (%s): reranking and scoring need a sequence-classification "
             "package (BertForSequenceClassification)",
             o->model_name,
             info.bidirectional ? "an embedding model: it serves /v1/embeddings" : "a causal language model");
    return;
  }
  if (info.n_labels > 1) { /* vLLM too scores only one-label models ("pooled_data should be a scalar score") */
    snprintf(o->err, sizeof o->err,
             "model '%.200s' is a cross-encoder of %d labels: reranking and scoring need one label (one score "
             "per pair)",
             o->model_name, info.n_labels);
    return;
  }
  int ctx = ops->context_length(m), most = ctx > 1 ? ctx - 1 : 1; /* the engine keeps one position */
  int max_len = 0, k = o->truncate_prompt_tokens;                 /* 0: no cut */
  if (k < 0 || k > most) max_len = most;
  else if (k > 0) max_len = k;
  for (int i = 0; i < o->n_prompts; i++) {
    oai_prompt *q = &o->prompts[i];
    const char *b = json_string_value(json_array_get(p->second, (size_t)i));
    int rc = ops->tokenize_pair(m, q->text, strlen(q->text), b, strlen(b), max_len, &q->ids, &q->n_ids, &q->pair_split);
    if (rc == 0 && q->n_ids > most) {
      o->err_param = servd_arena_printf(o->arena, "%s[%d]", p->field, i);
      snprintf(o->err, sizeof o->err,
               "%s[%d]: the pair is %d tokens, more than this model takes (%d, its context length %d less one); "
               "shorten the texts or set 'truncate_prompt_tokens' to cut them",
               p->field, i, q->n_ids, most, ctx);
      return;
    }
    if (rc != 0) {
      o->err_rc = rc;
      o->err_param = rc == SERVD_EUNSUPPORTED ? "model" : servd_arena_printf(o->arena, "%s[%d]", p->field, i);
      snprintf(o->err, sizeof o->err, "%s[%d] cannot be tokenized with its pair: %s", p->field, i,
               api_user_cause(servd_last_error()));
      return;
    }
  }
  o->err_rc = 0;
  o->err_param = NULL;
  o->gp.score = true;
}

static bool pairs_check(oai *o) {
  (void)o; /* the model was checked with the tokenization */
  return true;
}

static json_t *usage_json(const oai *o, bool with_prompt) {
  long long n = 0;
  for (int i = 0; i < o->n_prompts; i++) n += o->prompts[i].n_ids;
  if (!with_prompt) return json_pack("{s:I}", "total_tokens", (json_int_t)n);
  return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)n, "total_tokens", (json_int_t)n,
                   "completion_tokens", (json_int_t)0);
}

typedef struct ranked {
  int index;
  float score;
} ranked;

/* Higher score first; equal scores keep the documents' order. */
static int by_score(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  return x->index - y->index;
}

static void pairs_respond(oai *o) {
  const pairs *p = o->sink_ctx;
  int n = o->n_gens;
  for (int i = 0; i < n; i++)
    if (!o->x || !o->x[i].vec || o->x[i].n_vec < 1 || !isfinite(o->x[i].vec[0])) { /* JSON has no NaN */
      oai_fail(o, 500, NULL, NULL,
               o->x && o->x[i].vec ? "the model's score is not a number" : "the model returned no score");
      return;
    }
  if (p->route == ROUTE_SCORE) {
    json_t *data = json_array();
    for (int i = 0; i < n; i++)
      json_array_append_new(
          data, json_pack("{s:i, s:s, s:f}", "index", i, "object", "score", "score", (double)o->x[i].vec[0]));
    oai_respond(o,
                json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", o->id, "object", "list", "created",
                          (json_int_t)o->created, "model", o->model_name, "data", data, "usage", usage_json(o, true)));
    return;
  }
  ranked *r = malloc(sizeof *r * (size_t)n);
  if (!r) {
    oai_fail(o, 500, NULL, NULL, "out of memory");
    return;
  }
  for (int i = 0; i < n; i++) r[i] = (ranked){i, o->x[i].vec[0]};
  qsort(r, (size_t)n, sizeof *r, by_score);
  int keep = p->top_n > 0 && p->top_n < n ? (int)p->top_n : n;
  json_t *results = json_array();
  for (int k = 0; k < keep; k++) {
    json_t *e = json_pack("{s:i, s:f}", "index", r[k].index, "relevance_score", (double)r[k].score);
    if (p->return_docs)
      json_object_set_new(e, "document", json_pack("{s:O}", "text", json_array_get(p->second, (size_t)r[k].index)));
    json_array_append_new(results, e);
  }
  free(r);
  oai_respond(o, json_pack("{s:s, s:s, s:o, s:o}", "id", o->id, "model", o->model_name, "usage", usage_json(o, false),
                           "results", results));
}

/* The engine callback of a pair: keeps its score (the final event's values), then api_engine_cb. */
static void pair_cb(void *ud, const servd_event *ev) { oai_embedding_hooks.engine_cb(ud, ev); }

static const oai_embed_hooks pair_hooks = {pairs_check, pair_cb, pairs_respond, NULL, pairs_tokenize};

/* The route's names for the fields of the embeddings request it runs as. */
static void rerank_param(const char *param, char *out, size_t cap) {
  snprintf(out, cap, "%s", !strcmp(param, "input") ? "query" : param);
}
static void score_param(const char *param, char *out, size_t cap) {
  snprintf(out, cap, "%s", !strcmp(param, "input") ? "text_1" : param);
}

static const oai_sink rerank_sink = {
    .id_prefix = "rerank-", .respond = pairs_respond, .param = rerank_param, .ctx_free = pairs_free};
static const oai_sink score_sink = {
    .id_prefix = "score-", .respond = pairs_respond, .param = score_param, .ctx_free = pairs_free};

/* ---- the request: checked here, run as embeddings --------------------------------------------- */

static void bad(servd_http_req *r, const char *param, const char *fmt, const char *detail) {
  api_oai_error(r, 400, "invalid_request_error", param, NULL, fmt, detail);
}

/* What a text field may hold. */
typedef enum text_shape {
  TEXT_ONE,      /* a string (rerank's query) */
  TEXT_ONE_LIST, /* a string or a list of strings (score's text_1, text_2) */
  TEXT_DOCS,     /* a list of strings or {"text": string} objects (rerank's documents) */
} text_shape;

static const char *const shape_names[] = {"a string", "a string or a list of strings",
                                          "a list of strings or {\"text\": string} objects"};

/* A text field of the request as a new array of its strings (a list: 1 to PAIRS_MAX of them);
 * NULL after answering a 400 that names the field or the element at fault. */
static json_t *texts_of(servd_http_req *r, json_t *body, const char *key, text_shape shape, bool empty_ok) {
  json_t *v = json_object_get(body, key);
  char param[48];
  if (!v || json_is_null(v)) {
    bad(r, key, "'%s' is required", key);
    return NULL;
  }
  if (json_is_string(v) && shape != TEXT_DOCS) {
    if (!empty_ok && !json_string_length(v)) {
      bad(r, key, "'%s' must not be empty", key);
      return NULL;
    }
    return json_pack("[O]", v);
  }
  if (!json_is_array(v) || shape == TEXT_ONE) {
    api_oai_error(r, 400, "invalid_request_error", key, NULL, "'%s' must be %s, got %s", key, shape_names[shape],
                  api_json_type(v));
    return NULL;
  }
  size_t n = json_array_size(v);
  if (n == 0) {
    bad(r, key, "'%s' must not be an empty list", key);
    return NULL;
  }
  if (n > PAIRS_MAX) {
    api_oai_error(r, 400, "invalid_request_error", key, NULL, "'%s' holds %zu texts: at most %d per request", key, n,
                  PAIRS_MAX);
    return NULL;
  }
  json_t *out = json_array();
  for (size_t i = 0; out && i < n; i++) {
    json_t *e = json_array_get(v, i), *t = e;
    if (shape == TEXT_DOCS && json_is_object(e)) t = json_object_get(e, "text");
    snprintf(param, sizeof param, "%s[%zu]", key, i);
    if (!json_is_string(t)) {
      api_oai_error(r, 400, "invalid_request_error", param, NULL, "'%s' must be %s, got %s", param,
                    shape == TEXT_DOCS ? "a string or a {\"text\": string} object" : "a string",
                    t ? api_json_type(t) : "an object without \"text\"");
      json_decref(out);
      return NULL;
    }
    if (!empty_ok && !json_string_length(t)) {
      bad(r, param, "'%s' must not be empty", param);
      json_decref(out);
      return NULL;
    }
    json_array_append(out, t);
  }
  if (!out) api_oai_error(r, 500, "server_error", NULL, NULL, "%s", "out of memory");
  return out;
}

/* The embeddings body the pairs run as: model, the first texts as input, and the fields both share. */
static json_t *inner_body(json_t *body, json_t *first) {
  json_t *in = json_pack("{s:O}", "input", first);
  static const char *const kept[] = {"model", "truncate_prompt_tokens", "priority", "user", "request_id"};
  for (size_t i = 0; in && i < sizeof kept / sizeof *kept; i++) {
    json_t *v = json_object_get(body, kept[i]);
    if (v) json_object_set(in, kept[i], v);
  }
  return in;
}

static void serve_pairs(servd_api *a, servd_http_req *r, pair_route route) {
  json_t *body = NULL, *first = NULL, *second = NULL, *in = NULL;
  api_param_error perr;
  if (api_body_parse(r->body, r->body_len, &body, &perr) != 0) {
    api_oai_error(r, perr.status, "invalid_request_error", NULL, NULL, "%s", perr.message);
    return;
  }
  pairs *p = calloc(1, sizeof *p);
  if (!p) {
    api_oai_error(r, 500, "server_error", NULL, NULL, "%s", "out of memory");
    goto done;
  }
  p->route = route;
  if (route == ROUTE_RERANK) {
    p->field = "documents";
    json_t *q = texts_of(r, body, "query", TEXT_ONE, false);
    if (!q) goto done;
    if (!(second = texts_of(r, body, "documents", TEXT_DOCS, true))) {
      json_decref(q);
      goto done;
    }
    first = json_array();
    for (size_t i = 0; i < json_array_size(second); i++) json_array_append(first, json_array_get(q, 0));
    json_decref(q);
    json_t *t = json_object_get(body, "top_n");
    if (t && !json_is_null(t) && (!json_is_integer(t) || json_integer_value(t) < 0)) {
      bad(r, "top_n", "'%s' must be an integer >= 0 (0: every document)", "top_n");
      goto done;
    }
    p->top_n = t && json_is_integer(t) ? json_integer_value(t) : 0;
    json_t *d = json_object_get(body, "return_documents");
    if (d && !json_is_null(d) && !json_is_boolean(d)) {
      bad(r, "return_documents", "'%s' must be true or false", "return_documents");
      goto done;
    }
    p->return_docs = !json_is_false(d);
  } else {
    p->field = "text_2";
    if (!(first = texts_of(r, body, "text_1", TEXT_ONE_LIST, false)) ||
        !(second = texts_of(r, body, "text_2", TEXT_ONE_LIST, true)))
      goto done;
    size_t n1 = json_array_size(first), n2 = json_array_size(second);
    if (n1 == 1 && n2 > 1) { /* 1 to N: text_1 pairs with every text_2 */
      json_t *one = json_incref(json_array_get(first, 0));
      for (size_t i = 1; i < n2; i++) json_array_append(first, one);
      json_decref(one);
    } else if (n1 != n2) {
      char msg[160];
      snprintf(msg, sizeof msg, "%zu texts for %zu: the lengths must be 1:1, 1:N or N:N", n1, n2);
      bad(r, "text_2", "'text_1' and 'text_2' pair up one to one or one to many: %s", msg);
      goto done;
    }
  }
  if (!(in = inner_body(body, first))) {
    api_oai_error(r, 500, "server_error", NULL, NULL, "%s", "out of memory");
    goto done;
  }
  p->second = second;
  second = NULL;
  oai_sink_serve(a, r, in, OAI_EMBEDDINGS, route == ROUTE_RERANK ? &rerank_sink : &score_sink, p, &pair_hooks);
  p = NULL; /* the call took the body and p */
done:
  pairs_free(p);
  json_decref(first);
  json_decref(second);
  json_decref(body);
}

void api_oai_rerank(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  serve_pairs(a, r, ROUTE_RERANK);
}

void api_oai_score(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  serve_pairs(a, r, ROUTE_SCORE);
}
