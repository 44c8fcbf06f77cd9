/* Validation of KServe v2 / Open Inference Protocol inference requests (JSON tensors), apart from
 * the server: the request's fields and its input tensors, built in the engine's dtypes. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/request_params.h"
#include "servd/status.h"
#include "servd/tensor.h"

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

static int fail(api_param_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(api_param_error *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->message, sizeof err->message, fmt, ap);
  va_end(ap);
  api_utf8_fix(err->message); /* a long datatype may have been cut mid-character */
  if (!err->message[0]) snprintf(err->message, sizeof err->message, "invalid inference request");
  err->status = 400;
  return -1;
}

int kserve_infer_parse(json_t *body, const api_param_limits *lim, kserve_infer_params *out, api_param_error *err) {
  memset(out, 0, sizeof(*out));
  memset(err, 0, sizeof(*err));
  char msg[1024] = "";
  if (!json_is_object(body)) return fail(err, "the request body must be a JSON object");
  json_t *inputs = json_object_get(body, "inputs");
  json_t *outputs = json_object_get(body, "outputs");
  json_t *id = json_object_get(body, "id");
  json_t *params = json_object_get(body, "parameters");
  if (!json_is_array(inputs) || json_array_size(inputs) == 0 || json_array_size(inputs) > 64)
    return fail(err, "'inputs' must be a list of 1 to 64 tensors");
  if (id && !json_is_string(id)) return fail(err, "'id' must be a string");
  if (outputs && (!json_is_array(outputs) || json_array_size(outputs) > 64))
    return fail(err, "'outputs' must be a list of {\"name\": ...}");
  for (size_t i = 0; outputs && i < json_array_size(outputs); i++)
    if (!json_is_string(json_object_get(json_array_get(outputs, i), "name")))
      return fail(err, "outputs[%zu].name must be a string", i);
  out->deadline_ms = lim->default_deadline_ms;
  if (params) {
    json_t *to = json_object_get(params, "timeout");
    if (!json_is_object(params) ||
        (to && (!json_is_number(to) || json_number_value(to) <= 0 || json_number_value(to) > 86400)))
      return fail(err, "'parameters' must be an object; parameters.timeout a number of seconds in (0, 86400]");
    if (to) out->deadline_ms = (int64_t)(json_number_value(to) * 1000.0);
  }
  int n_in = (int)json_array_size(inputs);
  out->in = calloc((size_t)n_in, sizeof(*out->in));
  if (!out->in) return fail(err, "out of memory");
  for (int i = 0; i < n_in; i++) {
    out->in[i].tensor = parse_input(json_array_get(inputs, (size_t)i), (size_t)i, out->in[i].name, msg, sizeof msg);
    if (!out->in[i].tensor) goto fail;
    out->n_in = i + 1;
    for (int k = 0; k < i; k++)
      if (strcmp(out->in[k].name, out->in[i].name) == 0) {
        snprintf(msg, sizeof msg, "input '%s' is given twice", out->in[i].name);
        goto fail;
      }
  }
  out->id = json_incref(id);
  out->wanted = json_incref(outputs);
  return 0;
fail:
  kserve_infer_params_free(out);
  return fail(err, "%s", msg);
}

int kserve_infer_parse_text(const char *text, size_t len, const api_param_limits *lim, kserve_infer_params *out,
                            api_param_error *err) {
  memset(out, 0, sizeof(*out));
  json_t *body = NULL;
  if (api_body_parse(text, len, &body, err) != 0) return -1;
  int rc = kserve_infer_parse(body, lim, out, err);
  json_decref(body);
  return rc;
}

void kserve_infer_params_free(kserve_infer_params *p) {
  if (!p) return;
  for (int i = 0; p->in && i < p->n_in; i++) servd_tensor_release(p->in[i].tensor);
  free(p->in);
  json_decref(p->id);
  json_decref(p->wanted);
  memset(p, 0, sizeof(*p));
}
