/* Validation of KServe v2 / Open Inference Protocol inference requests (JSON tensors, and raw ones
 * of the binary tensor data extension: kserve_binary.h), apart from the server: the request's fields
 * and its input tensors, built in the engine's dtypes. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/kserve_binary.h"
#include "api/params_check.h"
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

/* Appends "[i]" to a field path such as "inputs[0].data". */
static void path_index(char *path, size_t cap, size_t i) {
  size_t n = strlen(path);
  if (n < cap) snprintf(path + n, cap - n, "[%zu]", i);
}

/* Whether j is nested exactly as shape[d..]: a list of shape[d] entries at each depth, numbers at
 * depth ndim. On failure writes what is wrong at which path into msg. */
static bool nested_ok(json_t *j, const int64_t *shape, int ndim, int d, char *path, size_t pcap, char *msg,
                      size_t cap) {
  if (d == ndim) {
    if (json_is_number(j)) return true;
    snprintf(msg, cap, "%s must be a number, got %s", path, api_json_type(j));
    return false;
  }
  if (!json_is_array(j)) {
    snprintf(msg, cap, "%s must be a list of %lld entries (shape[%d]), got %s", path, (long long)shape[d], d,
             api_json_type(j));
    return false;
  }
  if ((int64_t)json_array_size(j) != shape[d]) {
    snprintf(msg, cap, "%s has %zu entries but shape[%d] is %lld: nested data must match the shape exactly", path,
             json_array_size(j), d, (long long)shape[d]);
    return false;
  }
  size_t len = strlen(path);
  for (size_t i = 0; i < json_array_size(j); i++) {
    path_index(path, pcap, i);
    bool ok = nested_ok(json_array_get(j, i), shape, ndim, d + 1, path, pcap, msg, cap);
    path[len] = '\0';
    if (!ok) return false;
  }
  return true;
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

/* The input's bytes from the binary tail (parameters.binary_data_size) as a tensor of dt and shape,
 * allocated only once the bytes are known to be there: a request of a few bytes naming shape
 * [2147483648] must not make servd allocate 8 GiB (found by tests/fuzz/fuzz_api_routes.c). */
static servd_tensor *take_binary(api_check *c, const char *f, const char *name, json_t *size, kserve_tail *tail,
                                 servd_dtype dt, int ndim, const int64_t *shape, long long numel) {
  long long n;
  size_t want = (size_t)numel * servd_dtype_block_bytes(dt);
  if (!api_check_as_int(size, &n) || n < 0)
    return api_check_fail(c, f, "input '%s': parameters.binary_data_size must be a non-negative integer", name), NULL;
  if (!tail)
    return api_check_fail(c, f,
                          "input '%s' has parameters.binary_data_size but the request has no " KSERVE_HEADER_LENGTH
                          " header: the length of the JSON header is needed to find the binary data",
                          name),
           NULL;
  if ((size_t)n != want)
    return api_check_fail(c, f,
                          "input '%s': parameters.binary_data_size is %lld but its shape and datatype take %zu bytes",
                          name, n, want),
           NULL;
  if (want > tail->len - tail->used)
    return api_check_fail(c, f,
                          "input '%s': parameters.binary_data_size is %lld but only %zu bytes of binary data remain "
                          "after the JSON header (" KSERVE_HEADER_LENGTH ") and the inputs before it",
                          name, n, tail->len - tail->used),
           NULL;
  servd_tensor *t = servd_tensor_new(dt, ndim, shape);
  if (!t) return api_check_fail(c, f, "input '%s': %s", name, servd_last_error()), NULL;
  memcpy(servd_tensor_data(t), tail->p + tail->used, want);
  tail->used += want;
  return t;
}

/* Parses one input tensor (its data from tail when binary); on failure records the error in c and
 * returns NULL. */
static servd_tensor *parse_input(api_check *c, json_t *in, size_t idx, char name[64], kserve_tail *tail) {
  char f[48]; /* the field at fault */
  snprintf(f, sizeof f, "inputs[%zu]", idx);
  if (!json_is_object(in))
    return api_check_fail(c, f, "inputs[%zu] must be an object, got %s", idx, api_json_type(in)), NULL;
  json_t *jn = json_object_get(in, "name"), *js = json_object_get(in, "shape"), *jd = json_object_get(in, "datatype"),
         *data = json_object_get(in, "data");
  snprintf(f, sizeof f, "inputs[%zu].name", idx);
  if (!json_is_string(jn) || json_string_length(jn) == 0 || json_string_length(jn) > 63)
    return api_check_fail(c, f, "inputs[%zu].name must be a string of 1 to 63 bytes", idx), NULL;
  snprintf(name, 64, "%s", json_string_value(jn));
  snprintf(f, sizeof f, "inputs[%zu].datatype", idx);
  if (!json_is_string(jd)) return api_check_fail(c, f, "input '%s': 'datatype' must be a string", name), NULL;
  servd_dtype dt;
  if (dtype_of(json_string_value(jd), &dt) != 0)
    return api_check_fail(c, f, "input '%s': datatype '%s' is not supported (supported: FP32, FP16, BF16, INT32)", name,
                          json_string_value(jd)),
           NULL;
  snprintf(f, sizeof f, "inputs[%zu].shape", idx);
  if (!json_is_array(js) || json_array_size(js) > SERVD_MAX_DIMS)
    return api_check_fail(c, f, "input '%s': 'shape' must be a list of at most %d dimensions", name, SERVD_MAX_DIMS),
           NULL;
  int64_t shape[SERVD_MAX_DIMS];
  int ndim = (int)json_array_size(js);
  long long numel = 1;
  for (int i = 0; i < ndim; i++) {
    json_t *e = json_array_get(js, (size_t)i);
    if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > (1ll << 31))
      return api_check_fail(c, f, "input '%s': shape[%d] must be a non-negative integer", name, i), NULL;
    shape[i] = json_integer_value(e);
    numel *= shape[i];
    if (numel > (1ll << 31)) return api_check_fail(c, f, "input '%s': too many elements", name), NULL;
  }
  json_t *ip = json_object_get(in, "parameters");
  json_t *bsize = json_object_get(ip, "binary_data_size");
  snprintf(f, sizeof f, "inputs[%zu].parameters", idx);
  if (ip && !json_is_object(ip))
    return api_check_fail(c, f, "input '%s': 'parameters' must be an object, got %s", name, api_json_type(ip)), NULL;
  if (bsize) {
    snprintf(f, sizeof f, "inputs[%zu].parameters.binary_data_size", idx);
    if (data)
      return api_check_fail(c, f, "input '%s' has both 'data' and parameters.binary_data_size: send one", name), NULL;
    return take_binary(c, f, name, bsize, tail, dt, ndim, shape, numel);
  }
  snprintf(f, sizeof f, "inputs[%zu].data", idx);
  if (!json_is_array(data)) return api_check_fail(c, f, "input '%s': 'data' must be a list", name), NULL;
  /* Flat (row-major, numbers only) or nested exactly as the shape: a ragged list whose element count
   * happens to match is not a tensor of that shape. */
  bool flat = true;
  for (size_t i = 0; i < json_array_size(data) && flat; i++) flat = json_is_number(json_array_get(data, i));
  if (flat && (long long)json_array_size(data) != numel)
    return api_check_fail(c, f, "input '%s': shape holds %lld elements but data has %zu", name, numel,
                          json_array_size(data)),
           NULL;
  if (!flat) {
    char path[160] = "data", msg[512];
    if (!nested_ok(data, shape, ndim, 0, path, sizeof path, msg, sizeof msg))
      return api_check_fail(c, f, "input '%s': %s", name, msg), NULL;
  }
  servd_tensor *t = servd_tensor_new(dt, ndim, shape);
  if (!t) return api_check_fail(c, f, "input '%s': %s", name, servd_last_error()), NULL;
  fill_ctx fc = {dt, servd_tensor_data(t), 0, NULL};
  fill(&fc, data);
  if (fc.bad) {
    servd_tensor_release(t);
    return api_check_fail(c, f, "input '%s': %s", name, fc.bad), NULL;
  }
  return t;
}

/* Whether j, when present, is a boolean; records the error otherwise. */
static bool opt_bool(api_check *c, json_t *params, const char *key, const char *field, bool *out) {
  json_t *j = json_object_get(params, key);
  if (!j) return true;
  if (!json_is_boolean(j)) return api_check_fail(c, field, "%s must be a boolean, got %s", field, api_json_type(j));
  *out = json_is_true(j);
  return true;
}

static int parse(json_t *body, kserve_tail *tail, const api_param_limits *lim, kserve_infer_params *out,
                 api_param_error *err) {
  memset(out, 0, sizeof(*out));
  memset(err, 0, sizeof(*err));
  api_check c = {err, NULL, "", false};
  if (!json_is_object(body)) return api_check_fail(&c, NULL, "the request body must be a JSON object"), -1;
  json_t *inputs = json_object_get(body, "inputs");
  json_t *outputs = json_object_get(body, "outputs");
  json_t *id = json_object_get(body, "id");
  json_t *params = json_object_get(body, "parameters");
  if (!json_is_array(inputs) || json_array_size(inputs) == 0 || json_array_size(inputs) > 64)
    return api_check_fail(&c, "inputs", "'inputs' must be a list of 1 to 64 tensors"), -1;
  if (id && !json_is_string(id))
    return api_check_fail(&c, "id", "'id' must be a string, got %s", api_json_type(id)), -1;
  if (outputs && (!json_is_array(outputs) || json_array_size(outputs) > 64))
    return api_check_fail(&c, "outputs", "'outputs' must be a list of at most 64 {\"name\": ...}"), -1;
  for (size_t i = 0; outputs && i < json_array_size(outputs); i++) {
    json_t *o = json_array_get(outputs, i), *op = json_object_get(o, "parameters");
    char f[64];
    snprintf(f, sizeof f, "outputs[%zu].name", i);
    if (!json_is_string(json_object_get(o, "name")))
      return api_check_fail(&c, f, "outputs[%zu].name must be a string", i), -1;
    snprintf(f, sizeof f, "outputs[%zu].parameters", i);
    if (op && !json_is_object(op)) return api_check_fail(&c, f, "%s must be an object", f), -1;
    snprintf(f, sizeof f, "outputs[%zu].parameters.binary_data", i);
    bool b;
    if (!opt_bool(&c, op, "binary_data", f, &b)) return -1;
    snprintf(f, sizeof f, "outputs[%zu].parameters.classification", i);
    if (json_object_get(op, "classification"))
      return api_check_fail(&c, f, "%s is not supported: outputs are returned as tensors", f), -1;
  }
  out->deadline_ms = lim->default_deadline_ms;
  if (params) {
    if (!json_is_object(params))
      return api_check_fail(&c, "parameters", "'parameters' must be an object, got %s", api_json_type(params)), -1;
    /* The same 'timeout' as the OpenAI routes': one definition of what a request may ask. */
    servd_gen_params gp;
    memset(&gp, 0, sizeof gp);
    if (api_params_adopt(params, API_ADOPT_DEADLINE | API_ADOPT_PRIORITY, "parameters.", lim, NULL, &gp, err) != 0)
      return -1;
    out->deadline_ms = gp.deadline_ms;
    out->priority = gp.priority;
    if (!opt_bool(&c, params, "binary_data_output", "parameters.binary_data_output", &out->binary_out)) return -1;
  }
  int n_in = (int)json_array_size(inputs);
  out->in = calloc((size_t)n_in, sizeof(*out->in));
  if (!out->in) return api_check_fail(&c, NULL, "out of memory"), -1;
  for (int i = 0; i < n_in; i++) {
    out->in[i].tensor = parse_input(&c, json_array_get(inputs, (size_t)i), (size_t)i, out->in[i].name, tail);
    if (!out->in[i].tensor) goto fail;
    out->n_in = i + 1;
    for (int k = 0; k < i; k++)
      if (strcmp(out->in[k].name, out->in[i].name) == 0) {
        char f[48];
        snprintf(f, sizeof f, "inputs[%d].name", i);
        api_check_fail(&c, f, "input '%s' is given twice", out->in[i].name);
        goto fail;
      }
  }
  if (tail && tail->used != tail->len) {
    api_check_fail(&c, NULL,
                   "the body has %zu bytes of binary data after the JSON header (" KSERVE_HEADER_LENGTH
                   ") but the inputs' parameters.binary_data_size add up to %zu",
                   tail->len, tail->used);
    goto fail;
  }
  out->id = json_incref(id);
  out->wanted = json_incref(outputs);
  return 0;
fail:
  kserve_infer_params_free(out);
  return -1;
}

int kserve_infer_parse(json_t *body, const api_param_limits *lim, kserve_infer_params *out, api_param_error *err) {
  return parse(body, NULL, lim, out, err);
}

int kserve_infer_parse_framed(const char *text, size_t len, const char *header_length, const api_param_limits *lim,
                              kserve_infer_params *out, api_param_error *err) {
  memset(out, 0, sizeof(*out));
  memset(err, 0, sizeof(*err));
  size_t json_len;
  if (kserve_binary_split(header_length, len, &json_len, err->message, sizeof err->message) != 0) {
    err->status = 400;
    return -1;
  }
  json_t *body = NULL;
  if (api_body_parse(text, json_len, &body, err) != 0) {
    if (header_length) { /* the header's length is the likelier culprit than the client's JSON */
      char cause[sizeof err->message];
      snprintf(cause, sizeof cause, "%s", err->message);
      snprintf(err->message, sizeof err->message,
               "the first %zu bytes (" KSERVE_HEADER_LENGTH ") are no JSON header: %.600s", json_len, cause);
      api_utf8_fix(err->message);
    }
    return -1;
  }
  kserve_tail tail = {text + json_len, len - json_len, 0};
  int rc = parse(body, header_length ? &tail : NULL, lim, out, err);
  json_decref(body);
  return rc;
}

int kserve_infer_parse_text(const char *text, size_t len, const api_param_limits *lim, kserve_infer_params *out,
                            api_param_error *err) {
  return kserve_infer_parse_framed(text, len, NULL, lim, out, err);
}

void kserve_infer_params_free(kserve_infer_params *p) {
  if (!p) return;
  for (int i = 0; p->in && i < p->n_in; i++) servd_tensor_release(p->in[i].tensor);
  free(p->in);
  json_decref(p->id);
  json_decref(p->wanted);
  memset(p, 0, sizeof(*p));
}
