/* KServe v2 / Open Inference Protocol over HTTP: server and model metadata, readiness, and
 * inference with JSON or binary tensors (kserve_binary.h; generic packages, run on a worker thread). */
#include "api/api-impl.h"
#include "api/frontend-impl.h"
#include "api/handlers.h"
#include "api/kserve_binary.h"
#include "api/request_params.h"
#include "api/respond.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "servd/status.h"
#include "servd/tensor.h"

#ifndef SERVD_VERSION_STRING
#define SERVD_VERSION_STRING "0.1.0"
#endif

void api_kserve_server_meta(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)a;
  (void)args;
  api_json(r, 200,
           json_pack("{s:s, s:s, s:[s, s, s, s, s]}", "name", "servd", "version", SERVD_VERSION_STRING, "extensions",
                     "model_repository", "metrics", "binary_tensor_data", "statistics", "model_configuration"));
}

int api_model_usable(servd_api *a, api_model *am, char *msg, size_t cap) {
  int slept = api_sleep_gate(a, am, NULL, msg, cap);
  if (slept) return slept;
  if (am->state == M_UNAVAILABLE) {
    snprintf(msg, cap, "model '%s' is not loaded%s%s", am->name, am->error[0] ? ": " : "", am->error);
    return 404;
  }
  if (am->state != M_READY || a->draining) {
    snprintf(msg, cap, "model '%s' is %s", am->name,
             am->state == M_LOADING ? "loading"
             : a->draining          ? "draining"
                                    : "unloading");
    return 503;
  }
  return 200;
}

bool api_kserve_usable(servd_api *a, servd_http_req *r, api_model *am) {
  char msg[2048]; /* room for a whole error[]; api_kserve_error cuts the message as before */
  const int st = api_model_usable(a, am, msg, sizeof msg);
  if (st != 200) api_kserve_error(r, st, "%s", msg);
  return st == 200;
}

json_t *api_kserve_metadata(servd_api *a, api_model *am) {
  json_t *m = a->ops->metadata(am->m);
  if (!json_is_object(m)) {
    json_decref(m);
    m = json_object();
  }
  json_object_set_new(m, "name", json_string(am->name));
  if (!json_object_get(m, "versions")) json_object_set_new(m, "versions", json_pack("[s]", API_MODEL_VERSION));
  if (!json_object_get(m, "platform")) json_object_set_new(m, "platform", json_string("servd"));
  return m;
}

void api_kserve_model_meta(servd_api *a, servd_http_req *r, const api_route_args *args) {
  api_model *am = args->am;
  if (!api_kserve_usable(a, r, am)) return;
  json_t *m = api_kserve_metadata(a, am);
  if (!json_object_get(m, "inputs")) json_object_set_new(m, "inputs", json_array());
  if (!json_object_get(m, "outputs")) json_object_set_new(m, "outputs", json_array());
  api_json(r, 200, m);
}

void api_kserve_model_ready(servd_api *a, servd_http_req *r, const api_route_args *args) {
  api_model *am = args->am;
  bool ready = api_model_ready(a, am) && !a->draining;
  api_json(r, ready ? 200 : 503, json_pack("{s:s, s:b}", "name", am->name, "ready", ready));
}

/* ---- tensors <-> JSON ------------------------------------------------------------------------- */

static const struct {
  const char *name;
  servd_dtype dt;
} dtypes[] = {{"FP32", SERVD_F32}, {"FP16", SERVD_F16}, {"BF16", SERVD_BF16}, {"INT32", SERVD_I32}};

static const char *dtype_name(servd_dtype dt) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].dt == dt) return dtypes[i].name;
  return NULL;
}

static void put_value(servd_buf *b, servd_dtype dt, const char *p) {
  double v;
  switch (dt) {
  case SERVD_I32: servd_buf_printf(b, "%d", *(const int32_t *)p); return;
  case SERVD_F32: v = *(const float *)p; break;
  case SERVD_F16: v = servd_f16_to_f32(*(const uint16_t *)p); break;
  case SERVD_BF16: v = servd_bf16_to_f32(*(const uint16_t *)p); break;
  default: servd_buf_puts(b, "null"); return;
  }
  if (!isfinite(v)) servd_buf_puts(b, "null"); /* JSON has no NaN or infinity */
  else servd_buf_printf(b, "%.9g", v);
}

/* Appends the elements of t in row-major order (any strides). */
static void put_data(servd_buf *b, const servd_tensor *t) {
  int64_t n = servd_tensor_numel(t);
  size_t es = servd_dtype_block_bytes(t->dtype);
  const char *base = servd_tensor_data(t);
  int64_t idx[SERVD_MAX_DIMS] = {0};
  servd_buf_puts(b, "[");
  for (int64_t k = 0; k < n; k++) {
    size_t off = 0;
    for (int d = 0; d < t->ndim; d++) off += (size_t)(idx[d] * (d == t->ndim - 1 ? (int64_t)es : t->strides[d]));
    if (k) servd_buf_puts(b, ",");
    put_value(b, t->dtype, base + off);
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (++idx[d] < t->shape[d]) break;
      idx[d] = 0;
    }
  }
  servd_buf_puts(b, "]");
}

/* ---- infer ------------------------------------------------------------------------------------ */

typedef struct infer_job {
  uv_work_t w;
  struct infer_job *next; /* in the model's wait list */
  servd_api *a;
  api_model *am;
  servd_http_req *req;
  servd_named_tensor *in;
  int n_in;
  servd_named_tensor *out;
  int n_out;
  int64_t deadline_ms;
  int rc;
  char err[1024];
  servd_model_error merr; /* the exception behind SERVD_EMODEL / SERVD_EINVAL */
  json_t *id, *wanted;    /* own references, touched on the loop only */
  api_predict_cb cb;      /* other front ends (gRPC): called instead of answering req */
  void *cb_ud;
  uint64_t t_accept;   /* api_now_ns() when accepted (servd_inference_latency_seconds) */
  api_kserve_times tm; /* start and done written by the worker, read on the loop after it */
  bool binary_out;     /* parameters.binary_data_output */
} infer_job;

static void infer_free(infer_job *j) {
  for (int i = 0; i < j->n_in; i++) servd_tensor_release(j->in[i].tensor);
  free(j->in);
  for (int i = 0; i < j->n_out; i++) servd_tensor_release(j->out[i].tensor);
  free(j->out);
  json_decref(j->id);
  json_decref(j->wanted);
  if (j->am) api_model_release_ref(j->a, j->am);
  free(j);
}

static void infer_abort(servd_http_req *r) {
  infer_job *j = r->ctx;
  j->req = NULL; /* the prediction cannot be stopped; its result is dropped */
}

static void infer_work(uv_work_t *w) {
  infer_job *j = w->data;
  j->tm.start = api_now_ns();
  j->rc = j->a->ops->predict(j->am->m, j->in, j->n_in, &j->out, &j->n_out, j->deadline_ms, &j->merr);
  if (j->rc != 0) snprintf(j->err, sizeof j->err, "%s", servd_last_error());
  j->tm.done = api_now_ns();
}

static bool wanted(infer_job *j, const char *name) {
  if (!j->wanted) return true;
  for (size_t i = 0; i < json_array_size(j->wanted); i++) {
    json_t *n = json_object_get(json_array_get(j->wanted, i), "name");
    if (json_is_string(n) && strcmp(json_string_value(n), name) == 0) return true;
  }
  return false;
}

/* Whether output name goes back as raw bytes: its own parameters.binary_data, else the request's
 * parameters.binary_data_output. */
static bool out_binary(infer_job *j, const char *name) {
  for (size_t i = 0; j->wanted && i < json_array_size(j->wanted); i++) {
    json_t *o = json_array_get(j->wanted, i), *n = json_object_get(o, "name");
    json_t *b = json_object_get(json_object_get(o, "parameters"), "binary_data");
    if (json_is_string(n) && strcmp(json_string_value(n), name) == 0 && json_is_boolean(b)) return json_is_true(b);
  }
  return j->binary_out;
}

static void infer_start_waiting(servd_api *a, api_model *am);

/* Hands a prediction's outcome to the front end that asked (the outputs with it). */
static void predict_deliver(infer_job *j) {
  char msg[1200] = "";
  int status = 200;
  if (j->rc != 0) {
    status = j->rc == SERVD_EMODEL ? 500 : api_status_for(j->rc);
    if (j->rc == SERVD_EMODEL && j->merr.type[0])
      snprintf(msg, sizeof msg, "model '%s' failed: %s: %s", j->am->name, j->merr.type, j->merr.message);
    else
      snprintf(msg, sizeof msg, "model '%s' failed: %s", j->am->name,
               j->err[0] ? api_user_cause(j->err) : servd_strerror(j->rc));
  }
  api_predict_cb cb = j->cb;
  j->cb = NULL;
  servd_named_tensor *out = j->rc == 0 ? j->out : NULL;
  int n_out = j->rc == 0 ? j->n_out : 0;
  if (out) {
    j->out = NULL;
    j->n_out = 0;
  }
  cb(j->cb_ud, status, msg, out, n_out);
}

static void infer_after(uv_work_t *w, int status) {
  (void)status;
  infer_job *j = w->data;
  servd_api *a = j->a;
  a->works--;
  j->am->predict_running--;
  api_infer_done(j->am, j->rc == 0, (double)(api_now_ns() - j->t_accept) / 1e9);
  infer_start_waiting(a, j->am);
  bool answered = false, ok = false;
  if (j->cb) {
    ok = j->rc == 0;
    predict_deliver(j);
    answered = true;
    goto done;
  }
  servd_http_req *r = j->req;
  if (!r) goto done;
  answered = true;
  r->on_abort = NULL;
  if (j->rc != 0) {
    /* The engine tells bad input (SERVD_EINVAL: 400) from a failure of the model's code
     * (SERVD_EMODEL: 500, with the exception's type and message as fields of their own). */
    char msg[1200];
    snprintf(msg, sizeof msg, "model '%s' failed: %s", j->am->name,
             j->err[0] ? api_user_cause(j->err) : servd_strerror(j->rc));
    if (j->rc == SERVD_EMODEL) {
      api_json(r, 500,
               json_pack("{s:s, s:s, s:{s:s, s:s}}", "error", msg, "type", "model_error", "exception", "type",
                         j->merr.type, "message", j->merr.message));
    } else {
      api_kserve_error(r, api_status_for(j->rc), "%s", msg);
    }
    goto done;
  }
  for (size_t i = 0; j->wanted && i < json_array_size(j->wanted); i++) {
    const char *n = json_string_value(json_object_get(json_array_get(j->wanted, i), "name"));
    bool found = false;
    for (int k = 0; k < j->n_out; k++) found |= n && strcmp(j->out[k].name, n) == 0;
    if (!found) {
      api_kserve_error(r, 400, "requested output '%s' is not produced by model '%s'", n ? n : "", j->am->name);
      goto done;
    }
  }
  servd_buf b, raw; /* the JSON header, the binary outputs' bytes */
  servd_buf_init(&b);
  servd_buf_init(&raw);
  servd_buf_puts(&b, "{\"model_name\":");
  servd_buf_json_str(&b, j->am->name, strlen(j->am->name));
  servd_buf_puts(&b, ",\"model_version\":\"" API_MODEL_VERSION "\"");
  if (j->id) {
    servd_buf_puts(&b, ",\"id\":");
    servd_buf_json_str(&b, json_string_value(j->id), json_string_length(j->id));
  }
  servd_buf_puts(&b, ",\"outputs\":[");
  bool first = true;
  for (int k = 0; k < j->n_out; k++) {
    servd_tensor *t = j->out[k].tensor;
    if (!wanted(j, j->out[k].name)) continue;
    const char *dn = t ? dtype_name(t->dtype) : NULL;
    if (!dn || t->device >= 0) {
      servd_buf_free(&b);
      servd_buf_free(&raw);
      api_kserve_error(r, 500, "model '%s' returned output '%s' of a type the JSON protocol cannot carry", j->am->name,
                       j->out[k].name);
      goto done;
    }
    if (!first) servd_buf_puts(&b, ",");
    first = false;
    servd_buf_puts(&b, "{\"name\":");
    servd_buf_json_str(&b, j->out[k].name, strnlen(j->out[k].name, sizeof j->out[k].name));
    servd_buf_printf(&b, ",\"datatype\":\"%s\",\"shape\":[", dn);
    for (int d = 0; d < t->ndim; d++) servd_buf_printf(&b, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    if (out_binary(j, j->out[k].name)) {
      servd_buf_printf(&b, "],\"parameters\":{\"binary_data_size\":%zu}}", kserve_binary_put(&raw, t));
      continue;
    }
    servd_buf_puts(&b, "],\"data\":");
    put_data(&b, t);
    servd_buf_puts(&b, "}");
  }
  servd_buf_puts(&b, "]}");
  if (b.oom || raw.oom) {
    api_kserve_error(r, 500, "out of memory");
  } else if (raw.len) {
    char hl[32];
    snprintf(hl, sizeof hl, "%zu", b.len);
    servd_http_set_header(r, KSERVE_HEADER_LENGTH, hl);
    servd_buf_append(&b, raw.data, raw.len);
    if (b.oom) api_kserve_error(r, 500, "out of memory");
    else servd_http_respond(r, 200, "application/octet-stream", b.data, b.len);
    ok = !b.oom;
  } else {
    servd_http_respond(r, 200, "application/json", b.data, b.len);
    ok = true;
  }
  servd_buf_free(&b);
  servd_buf_free(&raw);
done:
  if (answered) {
    j->tm.answered = api_now_ns();
    api_kserve_stats_add(j->am, ok, &j->tm);
  }
  infer_free(j);
}

static int predict_slots(servd_api *a, api_model *am) {
  servd_model_stats st;
  memset(&st, 0, sizeof st);
  a->ops->get_stats(am->m, &st);
  return st.n_interpreters > 0 ? st.n_interpreters : 1;
}

static int infer_queue(servd_api *a, infer_job *j) {
  if (uv_queue_work(a->loop, &j->w, infer_work, infer_after) != 0) return -1;
  a->works++;
  j->am->predict_running++;
  return 0;
}

/* Starts the next waiting prediction of am, dropping those whose client has gone. */
static void infer_start_waiting(servd_api *a, api_model *am) {
  while (am->wait_head && am->predict_running < predict_slots(a, am)) {
    infer_job *j = am->wait_head;
    am->wait_head = j->next;
    if (!am->wait_head) am->wait_tail = NULL;
    am->predict_waiting--;
    j->next = NULL;
    if (!j->req && !j->cb) {
      infer_free(j);
      continue;
    }
    if (infer_queue(a, j) != 0) {
      if (j->cb) {
        j->rc = SERVD_ENOMEM;
        snprintf(j->err, sizeof j->err, "cannot queue work");
        predict_deliver(j);
      } else {
        j->req->on_abort = NULL;
        api_kserve_error(j->req, 500, "cannot queue work");
      }
      infer_free(j);
    }
  }
}

void api_kserve_infer(servd_api *a, servd_http_req *r, const api_route_args *args) {
  api_model *am = args->am;
  if (!api_kserve_usable(a, r, am)) return;
  if (a->ops->kind(am->m) != SERVD_MODEL_GENERIC) {
    api_kserve_error(r, 400, "model '%s' is a language model; use /v1/completions or /v1/chat/completions", am->name);
    return;
  }
  api_param_limits lim;
  memset(&lim, 0, sizeof lim);
  lim.default_deadline_ms = a->o.default_deadline_ms;
  kserve_infer_params p;
  api_param_error perr;
  uint64_t t_parse = api_now_ns();
  if (kserve_infer_parse_framed(r->body, r->body_len, servd_http_header_get(r, KSERVE_HEADER_LENGTH), &lim, &p,
                                &perr) != 0) {
    api_kserve_error(r, perr.status, "%s", perr.message);
    return;
  }
  infer_job *j = calloc(1, sizeof(*j));
  if (!j) {
    kserve_infer_params_free(&p);
    api_kserve_error(r, 400, "out of memory");
    return;
  }
  /* j owns what p held from here on. */
  j->a = a;
  j->t_accept = api_now_ns();
  j->tm.accept = j->t_accept;
  j->tm.parse_ns = j->t_accept - t_parse;
  j->binary_out = p.binary_out;
  j->in = p.in;
  j->n_in = p.n_in;
  j->id = p.id;
  /* KServe's request id, when the client sent no X-Request-Id header. */
  if (json_is_string(p.id) && !servd_http_header_get(r, "x-request-id")) api_request_id_set(r, json_string_value(p.id));
  j->wanted = p.wanted;
  j->deadline_ms = p.deadline_ms;
  j->am = am;
  am->inflight++;
  a->inflight++;
  j->req = r;
  j->w.data = j;
  r->ctx = j;
  r->on_abort = infer_abort;
  if (am->predict_running < predict_slots(a, am)) {
    if (infer_queue(a, j) != 0) {
      r->on_abort = NULL;
      api_kserve_error(r, 500, "cannot queue work");
      infer_free(j);
    }
    return;
  }
  int max_wait = am->opts.max_queue > 0 ? am->opts.max_queue : 256;
  if (am->predict_waiting >= max_wait) {
    r->on_abort = NULL;
    api_kserve_error(r, 429, "model '%s' is at capacity: %d requests waiting; retry later", am->name,
                     am->predict_waiting);
    infer_free(j);
    return;
  }
  if (am->wait_tail) am->wait_tail->next = j;
  else am->wait_head = j;
  am->wait_tail = j;
  am->predict_waiting++;
}

/* The queue of api_kserve_infer for other front ends: the same slots and the same bounded FIFO,
 * so HTTP and gRPC predictions of one model wait in one line. */
int api_kserve_predict(servd_api *a, api_model *am, servd_named_tensor *in, int n_in, int64_t deadline_ms,
                       api_predict_cb cb, void *ud, struct infer_job **out, char *msg, size_t cap) {
  *out = NULL;
  infer_job *j = calloc(1, sizeof(*j));
  if (!j) {
    for (int i = 0; i < n_in; i++) servd_tensor_release(in[i].tensor);
    free(in);
    snprintf(msg, cap, "out of memory");
    return 500;
  }
  j->a = a;
  j->t_accept = api_now_ns();
  j->tm.accept = j->t_accept;
  j->in = in;
  j->n_in = n_in;
  j->deadline_ms = deadline_ms;
  j->am = am;
  am->inflight++;
  a->inflight++;
  j->cb = cb;
  j->cb_ud = ud;
  j->w.data = j;
  if (am->predict_running < predict_slots(a, am)) {
    if (infer_queue(a, j) != 0) {
      snprintf(msg, cap, "cannot queue work");
      infer_free(j);
      return 500;
    }
    *out = j;
    return 0;
  }
  int max_wait = am->opts.max_queue > 0 ? am->opts.max_queue : 256;
  if (am->predict_waiting >= max_wait) {
    snprintf(msg, cap, "model '%s' is at capacity: %d requests waiting; retry later", am->name, am->predict_waiting);
    infer_free(j);
    return 429;
  }
  if (am->wait_tail) am->wait_tail->next = j;
  else am->wait_head = j;
  am->wait_tail = j;
  am->predict_waiting++;
  *out = j;
  return 0;
}

void api_kserve_predict_abandon(struct infer_job *j) {
  if (j) j->cb = NULL; /* as infer_abort: the prediction cannot be stopped; its result is dropped */
}
