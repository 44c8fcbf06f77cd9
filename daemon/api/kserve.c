/* KServe v2 / Open Inference Protocol over HTTP: server and model metadata, readiness, and
 * inference with JSON tensors (generic packages, run on a worker thread). */
#include "api/api-impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "servd/status.h"
#include "servd/tensor.h"

#ifndef SERVD_VERSION_STRING
#define SERVD_VERSION_STRING "0.1.0"
#endif

void api_kserve_server_meta(servd_api *a, servd_http_req *r) {
  (void)a;
  api_json(r, 200, json_pack("{s:s, s:s, s:[s, s]}", "name", "servd", "version", SERVD_VERSION_STRING, "extensions",
                             "model_repository", "metrics"));
}

static bool model_usable(servd_api *a, servd_http_req *r, api_model *am) {
  if (am->state == M_UNAVAILABLE) {
    api_kserve_error(r, 404, "model '%s' is not loaded%s%s", am->name, am->error[0] ? ": " : "", am->error);
    return false;
  }
  if (am->state != M_READY || a->draining) {
    api_kserve_error(r, 503, "model '%s' is %s", am->name,
                     am->state == M_LOADING ? "loading" : a->draining ? "draining" : "unloading");
    return false;
  }
  return true;
}

void api_kserve_model_meta(servd_api *a, servd_http_req *r, api_model *am) {
  if (!model_usable(a, r, am)) return;
  json_t *m = a->ops->metadata(am->m);
  if (!json_is_object(m)) {
    json_decref(m);
    m = json_object();
  }
  json_object_set_new(m, "name", json_string(am->name));
  if (!json_object_get(m, "versions")) json_object_set_new(m, "versions", json_pack("[s]", "1"));
  if (!json_object_get(m, "platform")) json_object_set_new(m, "platform", json_string("servd"));
  if (!json_object_get(m, "inputs")) json_object_set_new(m, "inputs", json_array());
  if (!json_object_get(m, "outputs")) json_object_set_new(m, "outputs", json_array());
  api_json(r, 200, m);
}

void api_kserve_model_ready(servd_api *a, servd_http_req *r, api_model *am) {
  bool ready = api_model_ready(a, am) && !a->draining;
  api_json(r, ready ? 200 : 503, json_pack("{s:s, s:b}", "name", am->name, "ready", ready));
}

/* ---- tensors <-> JSON ------------------------------------------------------------------------- */

static const struct {
  const char *name;
  servd_dtype dt;
} dtypes[] = {{"FP32", SERVD_F32}, {"FP16", SERVD_F16}, {"BF16", SERVD_BF16}, {"INT32", SERVD_I32}};

static int dtype_of(const char *name, servd_dtype *out) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (strcmp(name, dtypes[i].name) == 0) {
      *out = dtypes[i].dt;
      return 0;
    }
  return -1;
}

static const char *dtype_name(servd_dtype dt) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (dtypes[i].dt == dt) return dtypes[i].name;
  return NULL;
}

/* Counts the scalars of a (possibly nested) data array; -1 when something else is in it. */
static long long count_leaves(json_t *j, int depth) {
  if (!json_is_array(j)) return json_is_number(j) ? 1 : -1;
  if (depth > SERVD_MAX_DIMS + 1) return -1;
  long long n = 0;
  for (size_t i = 0; i < json_array_size(j); i++) {
    long long k = count_leaves(json_array_get(j, i), depth + 1);
    if (k < 0) return -1;
    n += k;
  }
  return n;
}

typedef struct fill_ctx {
  servd_dtype dt;
  char *dst;
  long long i;
  const char *bad; /* first bad value's description */
} fill_ctx;

static void fill(fill_ctx *f, json_t *j) {
  if (json_is_array(j)) {
    for (size_t k = 0; k < json_array_size(j) && !f->bad; k++) fill(f, json_array_get(j, k));
    return;
  }
  double d = json_number_value(j);
  switch (f->dt) {
  case SERVD_F32: ((float *)f->dst)[f->i] = (float)d; break;
  case SERVD_F16: ((uint16_t *)f->dst)[f->i] = servd_f32_to_f16((float)d); break;
  case SERVD_BF16: ((uint16_t *)f->dst)[f->i] = servd_f32_to_bf16((float)d); break;
  case SERVD_I32:
    if (!json_is_integer(j) || json_integer_value(j) < INT32_MIN || json_integer_value(j) > INT32_MAX) {
      f->bad = "INT32 data must be integers in [-2147483648, 2147483647]";
      return;
    }
    ((int32_t *)f->dst)[f->i] = (int32_t)json_integer_value(j);
    break;
  default: f->bad = "unsupported datatype"; return;
  }
  f->i++;
}

/* Parses one input tensor; on failure writes a message and returns NULL. */
static servd_tensor *parse_input(json_t *in, size_t idx, char name[64], char *err, size_t cap) {
  json_t *jn = json_object_get(in, "name"), *js = json_object_get(in, "shape"), *jd = json_object_get(in, "datatype"),
         *data = json_object_get(in, "data");
  if (!json_is_object(in)) return snprintf(err, cap, "inputs[%zu] must be an object", idx), NULL;
  if (!json_is_string(jn) || json_string_length(jn) == 0 || json_string_length(jn) > 63)
    return snprintf(err, cap, "inputs[%zu].name must be a string of 1 to 63 bytes", idx), NULL;
  snprintf(name, 64, "%s", json_string_value(jn));
  if (!json_is_string(jd)) return snprintf(err, cap, "input '%s': 'datatype' must be a string", name), NULL;
  servd_dtype dt;
  if (dtype_of(json_string_value(jd), &dt) != 0)
    return snprintf(err, cap, "input '%s': datatype '%s' is not supported (supported: FP32, FP16, BF16, INT32)", name,
                    json_string_value(jd)),
           NULL;
  if (!json_is_array(js) || json_array_size(js) > SERVD_MAX_DIMS)
    return snprintf(err, cap, "input '%s': 'shape' must be a list of at most %d dimensions", name, SERVD_MAX_DIMS),
           NULL;
  int64_t shape[SERVD_MAX_DIMS];
  int ndim = (int)json_array_size(js);
  long long numel = 1;
  for (int i = 0; i < ndim; i++) {
    json_t *e = json_array_get(js, (size_t)i);
    if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > (1ll << 31))
      return snprintf(err, cap, "input '%s': shape[%d] must be a non-negative integer", name, i), NULL;
    shape[i] = json_integer_value(e);
    numel *= shape[i];
    if (numel > (1ll << 31)) return snprintf(err, cap, "input '%s': too many elements", name), NULL;
  }
  if (!json_is_array(data)) return snprintf(err, cap, "input '%s': 'data' must be a list", name), NULL;
  long long leaves = count_leaves(data, 0);
  if (leaves < 0) return snprintf(err, cap, "input '%s': 'data' must hold only numbers (flat or nested)", name), NULL;
  if (leaves != numel)
    return snprintf(err, cap, "input '%s': shape holds %lld elements but data has %lld", name, numel, leaves), NULL;
  servd_tensor *t = servd_tensor_new(dt, ndim, shape);
  if (!t) return snprintf(err, cap, "input '%s': %s", name, servd_last_error()), NULL;
  fill_ctx f = {dt, servd_tensor_data(t), 0, NULL};
  fill(&f, data);
  if (f.bad) {
    servd_tensor_release(t);
    return snprintf(err, cap, "input '%s': %s", name, f.bad), NULL;
  }
  return t;
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
  json_t *id, *wanted; /* own references, touched on the loop only */
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
  j->rc = j->a->ops->predict(j->am->m, j->in, j->n_in, &j->out, &j->n_out, j->deadline_ms, &j->merr);
  if (j->rc != 0) snprintf(j->err, sizeof j->err, "%s", servd_last_error());
}

static bool wanted(infer_job *j, const char *name) {
  if (!j->wanted) return true;
  for (size_t i = 0; i < json_array_size(j->wanted); i++) {
    json_t *n = json_object_get(json_array_get(j->wanted, i), "name");
    if (json_is_string(n) && strcmp(json_string_value(n), name) == 0) return true;
  }
  return false;
}

static void infer_start_waiting(servd_api *a, api_model *am);

static void infer_after(uv_work_t *w, int status) {
  (void)status;
  infer_job *j = w->data;
  servd_api *a = j->a;
  a->works--;
  j->am->predict_running--;
  infer_start_waiting(a, j->am);
  servd_http_req *r = j->req;
  if (!r) goto done;
  r->on_abort = NULL;
  if (j->rc != 0) {
    /* The engine tells bad input (SERVD_EINVAL: 400) from a failure of the model's code
     * (SERVD_EMODEL: 500, with the exception's type and message as fields of their own). */
    char msg[1200];
    snprintf(msg, sizeof msg, "model '%s' failed: %s", j->am->name, j->err[0] ? j->err : servd_strerror(j->rc));
    if (j->rc == SERVD_EMODEL) {
      api_json(r, 500, json_pack("{s:s, s:s, s:{s:s, s:s}}", "error", msg, "type", "model_error", "exception",
                                 "type", j->merr.type, "message", j->merr.message));
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
  servd_buf b;
  servd_buf_init(&b);
  servd_buf_puts(&b, "{\"model_name\":");
  servd_buf_json_str(&b, j->am->name, strlen(j->am->name));
  servd_buf_puts(&b, ",\"model_version\":\"1\"");
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
      api_kserve_error(r, 500, "model '%s' returned output '%s' of a type the JSON protocol cannot carry",
                       j->am->name, j->out[k].name);
      goto done;
    }
    if (!first) servd_buf_puts(&b, ",");
    first = false;
    servd_buf_puts(&b, "{\"name\":");
    servd_buf_json_str(&b, j->out[k].name, strnlen(j->out[k].name, sizeof j->out[k].name));
    servd_buf_printf(&b, ",\"datatype\":\"%s\",\"shape\":[", dn);
    for (int d = 0; d < t->ndim; d++) servd_buf_printf(&b, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    servd_buf_puts(&b, "],\"data\":");
    put_data(&b, t);
    servd_buf_puts(&b, "}");
  }
  servd_buf_puts(&b, "]}");
  if (b.oom) api_kserve_error(r, 500, "out of memory");
  else servd_http_respond(r, 200, "application/json", b.data, b.len);
  servd_buf_free(&b);
done:
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
    if (!j->req) {
      infer_free(j);
      continue;
    }
    if (infer_queue(a, j) != 0) {
      j->req->on_abort = NULL;
      api_kserve_error(j->req, 500, "cannot queue work");
      infer_free(j);
    }
  }
}

void api_kserve_infer(servd_api *a, servd_http_req *r, api_model *am) {
  if (!model_usable(a, r, am)) return;
  if (a->ops->kind(am->m) != SERVD_MODEL_GENERIC) {
    api_kserve_error(r, 400, "model '%s' is a language model; use /v1/completions or /v1/chat/completions", am->name);
    return;
  }
  json_error_t jerr;
  json_t *body = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, &jerr);
  if (!body) {
    api_kserve_error(r, 400, "malformed JSON in the request body: %s (line %d, column %d)", jerr.text, jerr.line,
                     jerr.column);
    return;
  }
  infer_job *j = calloc(1, sizeof(*j));
  json_t *inputs = json_object_get(body, "inputs");
  json_t *outputs = json_object_get(body, "outputs");
  json_t *id = json_object_get(body, "id");
  json_t *params = json_object_get(body, "parameters");
  char err[1024] = "";
  if (!j) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  j->a = a;
  if (!json_is_object(body)) {
    snprintf(err, sizeof err, "the request body must be a JSON object");
    goto fail;
  }
  if (!json_is_array(inputs) || json_array_size(inputs) == 0 || json_array_size(inputs) > 64) {
    snprintf(err, sizeof err, "'inputs' must be a list of 1 to 64 tensors");
    goto fail;
  }
  if (id && !json_is_string(id)) {
    snprintf(err, sizeof err, "'id' must be a string");
    goto fail;
  }
  if (outputs && (!json_is_array(outputs) || json_array_size(outputs) > 64)) {
    snprintf(err, sizeof err, "'outputs' must be a list of {\"name\": ...}");
    goto fail;
  }
  for (size_t i = 0; outputs && i < json_array_size(outputs); i++)
    if (!json_is_string(json_object_get(json_array_get(outputs, i), "name"))) {
      snprintf(err, sizeof err, "outputs[%zu].name must be a string", i);
      goto fail;
    }
  j->deadline_ms = a->o.default_deadline_ms;
  if (params) {
    json_t *to = json_object_get(params, "timeout");
    if (!json_is_object(params) || (to && (!json_is_number(to) || json_number_value(to) <= 0 ||
                                           json_number_value(to) > 86400))) {
      snprintf(err, sizeof err, "'parameters' must be an object; parameters.timeout a number of seconds in (0, 86400]");
      goto fail;
    }
    if (to) j->deadline_ms = (int64_t)(json_number_value(to) * 1000.0);
  }
  j->n_in = (int)json_array_size(inputs);
  j->in = calloc((size_t)j->n_in, sizeof(*j->in));
  if (!j->in) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  for (int i = 0; i < j->n_in; i++) {
    j->in[i].tensor = parse_input(json_array_get(inputs, (size_t)i), (size_t)i, j->in[i].name, err, sizeof err);
    if (!j->in[i].tensor) goto fail;
    for (int k = 0; k < i; k++)
      if (strcmp(j->in[k].name, j->in[i].name) == 0) {
        snprintf(err, sizeof err, "input '%s' is given twice", j->in[i].name);
        goto fail;
      }
  }
  j->id = json_incref(id);
  j->wanted = json_incref(outputs);
  json_decref(body);
  body = NULL;
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
  return;
fail:
  json_decref(body);
  if (j) infer_free(j);
  api_kserve_error(r, 400, "%s", err);
}
