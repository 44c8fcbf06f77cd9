/* The fake engine the API tests and the request fuzzer (tests/fuzz/fuzz_api_routes.c) run the real
 * route handlers against, substituted through servd_model_ops: a language model whose tokens are the
 * prompt's bytes and whose words are "w0 w1 ...", a generic model that doubles its one FP32 input
 * "x", the tool and constraint hooks of a package. Switches (atomics) make it busy, fail, slow or not
 * ready. fake_inline runs a request's events on the submitting thread instead of a thread of its own
 * (the fuzzer: one execution, no threads left over). Header-only, as test_http_util.h: every
 * definition is static to the program that includes it. */
#ifndef TEST_FAKE_MODEL_OPS_H
#define TEST_FAKE_MODEL_OPS_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/model_ops.h"
#include "servd/status.h"
#include "servd/tensor.h"

struct servd_model {
  char name[64];
  servd_model_kind kind;
};

struct servd_request {
  servd_event_cb cb;
  void *ud;
  int max_tokens, n_prompt, logprobs;
  bool embed;
  float first; /* embeddings: the prompt's first token, the vector's first value */
  atomic_bool cancel;
  atomic_int refs;
};

static atomic_int max_predict_running, fake_busy, fake_error, fake_delay_us, n_cancel, n_live, n_submit;
static atomic_int fake_max_queue; /* > 0: at most this many requests live at once, as --max-queue bounds them */
static atomic_bool fake_ready = true;
static bool fake_inline; /* events on the submitting thread, before submit returns */

static void fake_options_default(servd_model_options *o) { memset(o, 0, sizeof(*o)); }
static void fake_params_default(servd_gen_params *p) {
  memset(p, 0, sizeof(*p));
  p->top_p = 1;
  p->repetition_penalty = 1;
  p->logprobs = -1;
}

static servd_model *fake_new(const char *name, servd_model_kind k) {
  servd_model *m = calloc(1, sizeof(*m));
  snprintf(m->name, sizeof m->name, "%s", name);
  m->kind = k;
  return m;
}

static int fake_load(const servd_model_options *o, servd_model **out) {
  if (o->name && !strcmp(o->name, "broken")) return servd_fail(SERVD_EFORMAT, "broken.mpk: not a package");
  *out = fake_new(o->name ? o->name : "loaded", SERVD_MODEL_CAUSAL_LM);
  return 0;
}
static void fake_unload(servd_model *m, int d) {
  (void)d;
  free(m);
}
static const char *fake_name(const servd_model *m) { return m->name; }
static servd_model_kind fake_kind(const servd_model *m) { return m->kind; }
/* The generic model "gen" as a process-isolated model whose process died and restarts. */
static atomic_bool fake_gen_restarting = false;
static bool fake_is_ready(const servd_model *m) {
  return atomic_load(&fake_ready) && !(atomic_load(&fake_gen_restarting) && strcmp(m->name, "gen") == 0);
}
static bool fake_restarting(const servd_model *m, char *why, size_t cap) {
  bool down = atomic_load(&fake_gen_restarting) && strcmp(m->name, "gen") == 0;
  if (down && why)
    snprintf(why, cap, "the model's process (pid 7) was killed by signal 11 (SIGSEGV); restart 2 in 0.4 s");
  return down;
}
static int fake_quarantined(void) { return 3; }
static atomic_int fake_namespaces_free = 12; /* of 15: 3 quarantined */
static int fake_ns_free(void) { return atomic_load(&fake_namespaces_free); }
static json_t *fake_meta(const servd_model *m) {
  (void)m;
  return json_pack("{s:[{s:s, s:s, s:[i]}], s:[{s:s, s:s, s:[i]}]}", "inputs", "name", "x", "datatype", "FP32", "shape",
                   -1, "outputs", "name", "y", "datatype", "FP32", "shape", -1);
}
static int fake_tokenize(servd_model *m, const char *t, size_t n, bool sp, int32_t **ids, int *k) {
  (void)m;
  (void)sp;
  *ids = malloc((n ? n : 1) * sizeof(int32_t));
  for (size_t i = 0; i < n; i++) (*ids)[i] = (unsigned char)t[i];
  *k = (int)n;
  return 0;
}
static int fake_detokenize(servd_model *m, const int32_t *ids, int n, char **text) {
  (void)m;
  for (int i = 0; i < n; i++) /* as the tokenizer words it, stage prefixes included */
    if (ids[i] > 255)
      return servd_fail(SERVD_ERANGE, "tokenizer: decode: id %d at position %d is not in the vocabulary (size 256)",
                        ids[i], i);
  *text = malloc((size_t)n + 1);
  for (int i = 0; i < n; i++) (*text)[i] = (char)ids[i];
  (*text)[n] = '\0';
  return 0;
}
/* The messages' string contents, joined; other contents (parts, null) add nothing, as a template
 * that prints only strings. */
static int fake_template(servd_model *m, json_t *msgs, bool gen, char **text) {
  (void)m;
  size_t n = 2;
  for (size_t i = 0; i < json_array_size(msgs); i++)
    n += json_string_length(json_object_get(json_array_get(msgs, i), "content"));
  char *buf = malloc(n);
  if (!buf) return servd_fail(SERVD_ENOMEM, "template: out of memory");
  size_t k = 0;
  for (size_t i = 0; i < json_array_size(msgs); i++) {
    json_t *c = json_object_get(json_array_get(msgs, i), "content");
    memcpy(buf + k, json_string_value(c) ? json_string_value(c) : "", json_string_length(c));
    k += json_string_length(c);
  }
  if (gen) buf[k++] = '>';
  buf[k] = '\0';
  *text = buf;
  return 0;
}
static int fake_ctx(const servd_model *m) {
  (void)m;
  return 64;
}

static void req_unref(servd_request *r) {
  if (atomic_fetch_sub(&r->refs, 1) == 1) {
    atomic_fetch_sub(&n_live, 1);
    free(r);
  }
}

static void *fake_run(void *p) {
  servd_request *r = p;
  servd_event ev;
  char text[32];
  int produced = 0;
  if (r->embed) {
    float vec[2] = {r->first, (float)r->n_prompt};
    memset(&ev, 0, sizeof ev);
    ev.kind = SERVD_EVENT_DONE;
    ev.finish_reason = "stop";
    ev.prompt_tokens = r->n_prompt;
    ev.embedding = vec;
    ev.n_embedding = 2;
    r->cb(r->ud, &ev);
    req_unref(r);
    return NULL;
  }
  for (int i = 0; i < r->max_tokens; i++) {
    if (atomic_load(&fake_delay_us)) usleep((useconds_t)atomic_load(&fake_delay_us));
    if (atomic_load(&r->cancel)) break;
    if (atomic_load(&fake_error) && i == 1) {
      memset(&ev, 0, sizeof ev);
      ev.kind = SERVD_EVENT_ERROR;
      ev.error_code = SERVD_EMODEL; /* as the engine reports an exception in forward */
      ev.error_message = "RuntimeError: boom in forward";
      ev.error_type = "RuntimeError";
      r->cb(r->ud, &ev);
      req_unref(r);
      return NULL;
    }
    memset(&ev, 0, sizeof ev);
    snprintf(text, sizeof text, "w%d ", i);
    servd_top_logprob top[3] = {{'a', -0.5f}, {'b', -1.5f}, {'c', -2.5f}};
    ev.kind = SERVD_EVENT_TOKEN;
    ev.text = text;
    ev.text_len = strlen(text);
    ev.token = 'a';
    ev.logprob = -0.5f;
    if (r->logprobs >= 0) {
      ev.top = top;
      ev.n_top = r->logprobs < 3 ? r->logprobs : 3;
    }
    r->cb(r->ud, &ev);
    produced++;
  }
  memset(&ev, 0, sizeof ev);
  ev.kind = SERVD_EVENT_DONE;
  ev.finish_reason = atomic_load(&r->cancel) ? "cancelled" : "length";
  ev.prompt_tokens = r->n_prompt;
  ev.completion_tokens = produced;
  r->cb(r->ud, &ev);
  req_unref(r);
  return NULL;
}

static int fake_submit(servd_model *m, const int32_t *prompt, int n, const servd_gen_params *p, servd_event_cb cb,
                       void *ud, servd_request **out) {
  (void)m;
  if (atomic_load(&fake_busy) || (atomic_load(&fake_max_queue) && atomic_load(&n_live) >= atomic_load(&fake_max_queue)))
    return servd_fail(SERVD_EBUSY, "queue full");
  for (int i = 0; i < n; i++) /* as the engine words it */
    if (prompt[i] >= 1000)
      return servd_fail(SERVD_EINVAL, "submit: prompt token %d at %d outside the vocabulary of 1000", prompt[i], i);
  servd_request *r = calloc(1, sizeof(*r));
  r->cb = cb;
  r->ud = ud;
  r->max_tokens = p->max_tokens > 0 ? p->max_tokens : 4;
  r->n_prompt = n;
  r->logprobs = p->logprobs;
  r->embed = p->embed || p->score;
  r->first = n > 0 ? (float)prompt[0] : 0;
  atomic_store(&r->refs, 2);
  atomic_fetch_add(&n_live, 1);
  atomic_fetch_add(&n_submit, 1);
  *out = r;
  if (fake_inline) {
    fake_run(r);
    return 0;
  }
  pthread_t t;
  pthread_create(&t, NULL, fake_run, r);
  pthread_detach(t);
  return 0;
}
static void fake_cancel(servd_request *r) {
  atomic_fetch_add(&n_cancel, 1);
  atomic_store(&r->cancel, true);
}
static void fake_release(servd_request *r) { req_unref(r); }

static int fake_predict(servd_model *m, const servd_named_tensor *in, int n_in, servd_named_tensor **out, int *n_out,
                        int64_t deadline, servd_model_error *err) {
  (void)m;
  (void)deadline;
  if (err) memset(err, 0, sizeof *err);
  if (n_in != 1 || in[0].tensor->dtype != SERVD_F32) return servd_fail(SERVD_EINVAL, "expected one FP32 input 'x'");
  static atomic_int running;
  int now = atomic_fetch_add(&running, 1) + 1;
  int prev = atomic_load(&max_predict_running);
  while (now > prev && !atomic_compare_exchange_weak(&max_predict_running, &prev, now)) {}
  if (atomic_load(&fake_delay_us)) usleep((useconds_t)atomic_load(&fake_delay_us));
  atomic_fetch_sub(&running, 1);
  /* As the engine reports Python exceptions: the code says whose fault it is (the text is not parsed). */
  if (strcmp(in[0].name, "boom") == 0) {
    snprintf(err->type, sizeof err->type, "RuntimeError");
    snprintf(err->message, sizeof err->message, "the model raised");
    return servd_fail(SERVD_EMODEL, "predict: RuntimeError: the model raised");
  }
  if (strcmp(in[0].name, "bad") == 0) return servd_fail(SERVD_EINVAL, "predict: ValueError: x must be 2-d");
  /* Bad input whose text looks like an exception: still the client's. */
  if (strcmp(in[0].name, "odd") == 0) return servd_fail(SERVD_EINVAL, "predict: OddError: x is odd");
  servd_tensor *x = in[0].tensor;
  servd_tensor *y = servd_tensor_new(SERVD_F32, x->ndim, x->shape);
  const float *px = servd_tensor_data(x);
  float *py = servd_tensor_data(y);
  for (int64_t i = 0; i < servd_tensor_numel(x); i++) py[i] = 2 * px[i];
  *out = calloc(1, sizeof(servd_named_tensor));
  snprintf((*out)[0].name, sizeof(*out)[0].name, "y");
  (*out)[0].tensor = y;
  *n_out = 1;
  return 0;
}
static void fake_stats(const servd_model *m, servd_model_stats *s) {
  memset(s, 0, sizeof(*s));
  s->kv_blocks_total = 100;
  s->kv_blocks_used = atomic_load(&n_live);
  s->isolated = strcmp(m->name, "gen") == 0;
  s->isolated_restarts = s->isolated ? 2 : 0;
  s->running = atomic_load(&n_live);
  s->n_interpreters = 2;
  s->interp_busy_seconds[0] = 1.5;
}

/* Tool calling as a package's hooks do it: the fake model's words are never a call, so the parse
 * gives them back as content (as tools.py does with a call cut short); a forced call's grammar. */
static int fake_tools_render(servd_model *m, json_t *msgs, json_t *tools, bool gen, json_t **out) {
  (void)m, (void)msgs, (void)tools, (void)gen;
  *out = json_pack("{s:s, s:[s], s:s}", "prompt", "P", "markers", "<tool_call>", "family", "hermes");
  return 0;
}
static int fake_tools_parse(servd_model *m, const char *text, json_t *spec, json_t **out) {
  (void)m, (void)spec;
  *out = json_pack("{s:s, s:[]}", "content", text, "calls");
  return 0;
}
static int fake_guide_compile(servd_model *m, servd_guide_kind kind, const char *spec, char **grammar) {
  (void)m, (void)kind;
  /* As the engine reports what guided.py raised (an exception other than ValueError is EMODEL). */
  if (strstr(spec, "RECURSE"))
    return servd_fail(SERVD_EMODEL, "guided decoding: RecursionError: maximum recursion depth exceeded");
  if (strstr(spec, "NOLLG"))
    return servd_fail(SERVD_EMODEL, "guided decoding: RuntimeError: guided decoding needs the llguidance package, "
                                    "which is not installed (scripts/install-python-deps.sh): No module named "
                                    "'llguidance'");
  *grammar = strdup("G");
  return 0;
}

/* "ce" is a one-label cross-encoder (its scores are the embedding's first value), the others embed. */
static int fake_embedding_info(const servd_model *m, servd_embedding_info *out) {
  memset(out, 0, sizeof *out);
  out->dim = 2;
  out->n_labels = strcmp(m->name, "ce") ? 0 : 1;
  out->bidirectional = out->n_labels > 0;
  return 0;
}
/* A pair as [CLS]=1 a [SEP]=2 b [SEP]=2 of the texts' bytes, cut LongestFirst to max_len (> 0). */
static int fake_tokenize_pair(servd_model *m, const char *a, size_t alen, const char *b, size_t blen, int max_len,
                              int32_t **ids, int *n, int *split) {
  (void)m;
  if (max_len > 0 && max_len < 4) return servd_fail(SERVD_ERANGE, "tokenizer: encode_pair: max_len %d", max_len);
  while (max_len > 0 && alen + blen + 3 > (size_t)max_len) *(alen > blen ? &alen : &blen) -= 1;
  int32_t *o = malloc(sizeof(int32_t) * (alen + blen + 3));
  if (!o) return servd_fail(SERVD_ENOMEM, "out of memory");
  int k = 0;
  o[k++] = 1;
  for (size_t i = 0; i < alen; i++) o[k++] = (unsigned char)a[i];
  o[k++] = 2;
  *split = k;
  for (size_t i = 0; i < blen; i++) o[k++] = (unsigned char)b[i];
  o[k++] = 2;
  *ids = o;
  *n = k;
  return 0;
}

static const servd_model_ops fake_ops = {
    .options_default = fake_options_default,
    .gen_params_default = fake_params_default,
    .load = fake_load,
    .unload = fake_unload,
    .name = fake_name,
    .kind = fake_kind,
    .ready = fake_is_ready,
    .metadata = fake_meta,
    .tokenize = fake_tokenize,
    .detokenize = fake_detokenize,
    .apply_chat_template = fake_template,
    .context_length = fake_ctx,
    .submit = fake_submit,
    .cancel = fake_cancel,
    .release = fake_release,
    .predict = fake_predict,
    .get_stats = fake_stats,
    .restarting = fake_restarting,
    .quarantined_interpreters = fake_quarantined,
    .tools_render = fake_tools_render,
    .tools_parse = fake_tools_parse,
    .guide_compile = fake_guide_compile,
    .embedding_info = fake_embedding_info,
    .tokenize_pair = fake_tokenize_pair,
    .interpreter_namespaces_free = fake_ns_free,
};

#endif
