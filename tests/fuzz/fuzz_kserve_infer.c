/* libFuzzer: the KServe v2 inference body parser (kserve_infer_parse_text), the code that turns a
 * request body into input tensors and parameters.
 *
 * The input is the body as it arrives (any bytes). Invariants: a refused body has a 4xx status and a
 * non-empty, valid UTF-8 message; an accepted one yields 1 to 64 inputs with distinct names, each a
 * tensor whose datatype, shape and every element agree with an independent reading of the same JSON
 * (jansson, flattened in row-major order, converted as the dtype rounds), and a deadline that is the
 * default or a timeout within (0, 86400] s.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/request_params.h"
#include "servd/tensor.h"

#define CHECK(c) \
  do { \
    if (!(c)) { \
      fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #c); \
      abort(); \
    } \
  } while (0)

#define DEFAULT_DEADLINE_MS 30000

static bool valid_message(const char *s) {
  if (!s[0]) return false;
  json_t *j = json_string(s); /* NULL when not valid UTF-8 */
  json_decref(j);
  return j != NULL;
}

/* The elements of data in row-major order (nested or flat), appended to vals. */
static void flatten(json_t *j, double *vals, json_int_t *ints, bool *is_int, long long *n, long long cap) {
  if (json_is_array(j)) {
    for (size_t k = 0; k < json_array_size(j); k++) flatten(json_array_get(j, k), vals, ints, is_int, n, cap);
    return;
  }
  CHECK(json_is_number(j) && *n < cap);
  vals[*n] = json_number_value(j);
  is_int[*n] = json_is_integer(j);
  ints[*n] = json_is_integer(j) ? json_integer_value(j) : 0;
  (*n)++;
}

static bool same_bits_or_nan(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0; }

/* One accepted input against the request's JSON for it. */
static void check_input(const servd_named_tensor *nt, json_t *in) {
  const servd_tensor *t = nt->tensor;
  CHECK(t && nt->name[0]);
  CHECK(strcmp(nt->name, json_string_value(json_object_get(in, "name"))) == 0);
  const char *dt = json_string_value(json_object_get(in, "datatype"));
  CHECK(dt);
  servd_dtype want = strcmp(dt, "FP32") == 0   ? SERVD_F32
                     : strcmp(dt, "FP16") == 0 ? SERVD_F16
                     : strcmp(dt, "BF16") == 0 ? SERVD_BF16
                                               : SERVD_I32;
  CHECK(strcmp(dt, "INT32") == 0 || want != SERVD_I32);
  CHECK(t->dtype == want);
  json_t *shape = json_object_get(in, "shape");
  CHECK((int)json_array_size(shape) == t->ndim);
  long long numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    CHECK(t->shape[d] == json_integer_value(json_array_get(shape, (size_t)d)));
    numel *= t->shape[d];
  }
  CHECK(servd_tensor_numel(t) == numel);
  long long cap = numel + 1, n = 0;
  double *vals = malloc((size_t)cap * sizeof *vals);
  json_int_t *ints = malloc((size_t)cap * sizeof *ints);
  bool *is_int = malloc((size_t)cap * sizeof *is_int);
  CHECK(vals && ints && is_int);
  flatten(json_object_get(in, "data"), vals, ints, is_int, &n, cap);
  CHECK(n == numel);
  const void *d = servd_tensor_data(t);
  for (long long i = 0; i < numel; i++) {
    switch (t->dtype) {
    case SERVD_F32: CHECK(same_bits_or_nan(((const float *)d)[i], (float)vals[i])); break;
    case SERVD_F16: CHECK(((const uint16_t *)d)[i] == servd_f32_to_f16((float)vals[i])); break;
    case SERVD_BF16: CHECK(((const uint16_t *)d)[i] == servd_f32_to_bf16((float)vals[i])); break;
    default:
      CHECK(is_int[i] && ints[i] >= INT32_MIN && ints[i] <= INT32_MAX);
      CHECK(((const int32_t *)d)[i] == (int32_t)ints[i]);
    }
  }
  free(vals);
  free(ints);
  free(is_int);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  api_param_limits lim;
  memset(&lim, 0, sizeof lim);
  lim.max_n = 16;
  lim.default_deadline_ms = DEFAULT_DEADLINE_MS;
  kserve_infer_params p;
  api_param_error err;
  if (kserve_infer_parse_text((const char *)data, size, &lim, &p, &err) != 0) {
    CHECK(err.status >= 400 && err.status < 500);
    CHECK(valid_message(err.message));
    CHECK(!err.param[0] || valid_message(err.param));
    CHECK(p.in == NULL && p.n_in == 0 && p.id == NULL && p.wanted == NULL); /* nothing left to free */
    return 0;
  }
  /* Accepted: the body is a JSON object; read it again to compare. */
  json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
  CHECK(json_is_object(body));
  json_t *inputs = json_object_get(body, "inputs");
  CHECK(p.n_in >= 1 && p.n_in <= 64 && p.in && (size_t)p.n_in == json_array_size(inputs));
  for (int i = 0; i < p.n_in; i++) {
    for (int k = 0; k < i; k++) CHECK(strcmp(p.in[k].name, p.in[i].name) != 0);
    check_input(&p.in[i], json_array_get(inputs, (size_t)i));
  }
  CHECK(!p.id || json_is_string(p.id));
  CHECK(!p.wanted || json_array_size(p.wanted) <= 64);
  CHECK(p.deadline_ms == DEFAULT_DEADLINE_MS || (p.deadline_ms > 0 && p.deadline_ms <= 86400ll * 1000));
  json_decref(body);
  kserve_infer_params_free(&p);
  return 0;
}
