/* POST /v1/embeddings: each input is an engine request that computes its prompt and returns the
 * pooled, normalized final hidden state (servd_gen_params.embed); the request parses, tokenizes
 * and submits through the completions machinery of openai.c (mode OAI_EMBEDDINGS) and answers
 * here in OpenAI's shape. */
#include "api/handlers.h"
#include "api/openai-impl.h"
#include "api/respond.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

/* The engine callback of an embedding: keeps the vector, then api_engine_cb. */
static void embedding_cb(void *ud, const servd_event *ev) {
  gen *g = ud;
  oai *o = g->owner;
  if (ev->kind == SERVD_EVENT_DONE && ev->embedding && ev->n_embedding > 0 && o->x) {
    oai_choice_x *x = &o->x[g->index];
    /* The loop reads it after the final event, which api_engine_cb publishes after this store. */
    x->vec = malloc(sizeof(float) * (size_t)ev->n_embedding);
    if (x->vec) {
      memcpy(x->vec, ev->embedding, sizeof(float) * (size_t)ev->n_embedding);
      x->n_vec = ev->n_embedding;
    }
  }
  api_engine_cb(ud, ev);
}

static bool embeddings_check(oai *o) {
  servd_embedding_info info;
  const servd_model_ops *ops = o->a->ops;
  if (!ops->embedding_info || ops->embedding_info(o->am->m, &info) != 0) {
    oai_fail(o, 400, "model", NULL, "this model does not compute embeddings");
    return false;
  }
  if (info.n_labels > 0) {
    char msg[320];
    snprintf(msg, sizeof msg,
             "model '%.200s' is a cross-encoder: it scores text pairs (/v1/rerank, /v1/score), not embeddings",
             o->model_name);
    oai_fail(o, 400, "model", NULL, msg);
    return false;
  }
  if (o->gp.dimensions > 0 && !info.truncatable) {
    oai_fail(o, 400, "dimensions", NULL,
             "'dimensions' is not supported by this model: its package does not say it was trained for truncated "
             "embeddings (config matryoshka_dimensions)");
    return false;
  }
  if (o->gp.dimensions > info.dim) {
    char msg[160];
    snprintf(msg, sizeof msg, "'dimensions' must be at most the model's %d", info.dim);
    oai_fail(o, 400, "dimensions", NULL, msg);
    return false;
  }
  return true;
}

/* Standard base64 of n bytes. */
static json_t *base64_of(const unsigned char *p, size_t n) {
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t len = 4 * ((n + 2) / 3);
  char *s = malloc(len + 1), *w = s;
  if (!s) return NULL;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    *w++ = tab[v >> 18 & 63];
    *w++ = tab[v >> 12 & 63];
    *w++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
    *w++ = i + 2 < n ? tab[v & 63] : '=';
  }
  *w = '\0';
  json_t *j = json_stringn(s, len);
  free(s);
  return j;
}

/* A vector as OpenAI sends it: a list of floats, or base64 of little-endian f32 (numpy's
 * frombuffer(dtype="<f4"), as the official client decodes it). */
static json_t *vector_json(const float *v, int n, bool base64) {
  if (base64) {
    unsigned char *b = malloc(4 * (size_t)n);
    if (!b) return NULL;
    for (int i = 0; i < n; i++) {
      uint32_t u;
      memcpy(&u, &v[i], 4);
      for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)(u >> (8 * k));
    }
    json_t *j = base64_of(b, 4 * (size_t)n);
    free(b);
    return j;
  }
  json_t *a = json_array();
  for (int i = 0; a && i < n; i++) json_array_append_new(a, json_real(v[i]));
  return a;
}

static void embeddings_respond(oai *o) {
  json_t *data = json_array();
  long long prompt = 0;
  for (int i = 0; i < o->n_prompts; i++) prompt += o->prompts[i].n_ids;
  for (int i = 0; i < o->n_gens; i++) {
    oai_choice_x *x = &o->x[i];
    json_t *vec = x->vec ? vector_json(x->vec, x->n_vec, o->base64) : NULL;
    if (!vec) {
      json_decref(data);
      oai_fail(o, 500, NULL, NULL, x->vec ? "out of memory" : "the model returned no embedding");
      return;
    }
    json_array_append_new(data, json_pack("{s:s, s:i, s:o}", "object", "embedding", "index", i, "embedding", vec));
  }
  oai_respond(o, json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model", o->model_name,
                           "usage", "prompt_tokens", (json_int_t)prompt, "total_tokens", (json_int_t)prompt));
}

/* truncate_prompt_tokens (vLLM's): an input longer than k tokens (-1: the model's context, less the
 * one position the engine keeps) keeps its first tokens and the template's closing ones ([SEP]), as
 * Hugging Face truncates a single text on the right. The template's parts are found by tokenizing
 * "a" with and without them. Token-id inputs keep their last k ids, as vLLM does. */
static void embeddings_tokenized(oai *o) {
  if (!o->truncate_prompt_tokens) return;
  const servd_model_ops *ops = o->a->ops;
  servd_model *m = o->am->m;
  int ctx = ops->context_length(m), k = o->truncate_prompt_tokens;
  if (k < 0 || (ctx > 0 && k > ctx - 1)) k = ctx > 1 ? ctx - 1 : 1;
  int32_t *bare = NULL, *full = NULL;
  int nb = 0, nf = 0, suffix = 0;
  if (ops->tokenize(m, "a", 1, false, &bare, &nb) == 0 && ops->tokenize(m, "a", 1, true, &full, &nf) == 0 && nb > 0 &&
      nf >= nb)
    for (int at = 0; at + nb <= nf; at++)
      if (!memcmp(full + at, bare, sizeof(int32_t) * (size_t)nb)) {
        suffix = nf - at - nb;
        break;
      }
  free(bare);
  free(full);
  for (int i = 0; i < o->n_prompts; i++) {
    oai_prompt *p = &o->prompts[i];
    if (p->n_ids <= k) continue;
    if (!p->text) { /* ids as given: the last k */
      memmove(p->ids, p->ids + p->n_ids - k, sizeof(int32_t) * (size_t)k);
    } else if (o->add_special && suffix > 0 && suffix < k) {
      memmove(p->ids + k - suffix, p->ids + p->n_ids - suffix, sizeof(int32_t) * (size_t)suffix);
    }
    p->n_ids = k;
  }
}

const oai_embed_hooks oai_embedding_hooks = {embeddings_check, embedding_cb, embeddings_respond, embeddings_tokenized,
                                             NULL};

void api_oai_embeddings(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  oai_embeddings_serve(a, r, &oai_embedding_hooks);
}
