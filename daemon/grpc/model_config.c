/* ModelConfig: Triton's model configuration as far as servd has one: the model's name, platform
 * and tensors (from the package metadata, as ModelMetadata), max_batch_size 0 (servd's shapes
 * include any batch dimension). Enough for tritonclient's get_model_config and tools that read
 * the tensors from it. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"

static const struct {
  const char *name;
  Inference__DataType t;
} types[] = {{"BOOL", INFERENCE__DATA_TYPE__TYPE_BOOL},     {"UINT8", INFERENCE__DATA_TYPE__TYPE_UINT8},
             {"UINT16", INFERENCE__DATA_TYPE__TYPE_UINT16}, {"UINT32", INFERENCE__DATA_TYPE__TYPE_UINT32},
             {"UINT64", INFERENCE__DATA_TYPE__TYPE_UINT64}, {"INT8", INFERENCE__DATA_TYPE__TYPE_INT8},
             {"INT16", INFERENCE__DATA_TYPE__TYPE_INT16},   {"INT32", INFERENCE__DATA_TYPE__TYPE_INT32},
             {"INT64", INFERENCE__DATA_TYPE__TYPE_INT64},   {"FP16", INFERENCE__DATA_TYPE__TYPE_FP16},
             {"FP32", INFERENCE__DATA_TYPE__TYPE_FP32},     {"FP64", INFERENCE__DATA_TYPE__TYPE_FP64},
             {"BYTES", INFERENCE__DATA_TYPE__TYPE_STRING},  {"BF16", INFERENCE__DATA_TYPE__TYPE_BF16}};

static Inference__DataType type_of(const char *name) {
  for (size_t i = 0; name && i < sizeof types / sizeof types[0]; i++)
    if (strcmp(types[i].name, name) == 0) return types[i].t;
  return INFERENCE__DATA_TYPE__TYPE_INVALID;
}

/* dims of a metadata tensor (malloc'd; NULL when it has none). */
static int64_t *dims_of(json_t *t, size_t *n) {
  json_t *sh = json_object_get(t, "shape");
  *n = json_array_size(sh);
  int64_t *d = *n ? calloc(*n, sizeof *d) : NULL;
  if (!d) *n = 0;
  for (size_t i = 0; i < *n; i++) d[i] = json_integer_value(json_array_get(sh, i));
  return d;
}

/* The fields that ModelInput and ModelOutput share, from a metadata tensor (name borrowed from t,
 * dims malloc'd; a missing name keeps the default). */
static void tensor_of(json_t *t, char **name, Inference__DataType *data_type, int64_t **dims, size_t *n_dims) {
  const char *nm = json_string_value(json_object_get(t, "name"));
  if (nm) *name = (char *)nm;
  *data_type = type_of(json_string_value(json_object_get(t, "datatype")));
  *dims = dims_of(t, n_dims);
}

void grpc_model_config(grpc_call *c, const uint8_t *msg, size_t len) {
  Inference__ModelConfigRequest *q = inference__model_config_request__unpack(NULL, len, msg);
  if (!q) {
    grpc_fail(c, GRPC_INVALID_ARGUMENT, "malformed inference.ModelConfigRequest message");
    return;
  }
  char err[1024];
  int st = 0;
  json_t *m = servd_api_model_metadata(c->api, q->name, q->version, &st, err, sizeof err);
  inference__model_config_request__free_unpacked(q, NULL);
  if (!m) {
    grpc_fail(c, grpc_code_for_status(st), "%s", err);
    return;
  }
  json_t *ins = json_object_get(m, "inputs"), *outs = json_object_get(m, "outputs");
  size_t ni = json_array_size(ins), no = json_array_size(outs);
  Inference__ModelInput *iv = calloc(ni + 1, sizeof *iv), **ip = calloc(ni + 1, sizeof *ip);
  Inference__ModelOutput *ov = calloc(no + 1, sizeof *ov), **op = calloc(no + 1, sizeof *op);
  Inference__ModelConfig cfg = INFERENCE__MODEL_CONFIG__INIT;
  Inference__ModelConfigResponse r = INFERENCE__MODEL_CONFIG_RESPONSE__INIT;
  if (!iv || !ip || !ov || !op) {
    grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < ni; i++) {
    Inference__ModelInput init = INFERENCE__MODEL_INPUT__INIT;
    iv[i] = init;
    tensor_of(json_array_get(ins, i), &iv[i].name, &iv[i].data_type, &iv[i].dims, &iv[i].n_dims);
    ip[i] = &iv[i];
  }
  for (size_t i = 0; i < no; i++) {
    Inference__ModelOutput init = INFERENCE__MODEL_OUTPUT__INIT;
    ov[i] = init;
    tensor_of(json_array_get(outs, i), &ov[i].name, &ov[i].data_type, &ov[i].dims, &ov[i].n_dims);
    op[i] = &ov[i];
  }
  cfg.name = (char *)json_string_value(json_object_get(m, "name"));
  const char *platform = json_string_value(json_object_get(m, "platform"));
  cfg.platform = (char *)(platform ? platform : "servd");
  cfg.backend = "servd";
  cfg.n_input = ni;
  cfg.input = ip;
  cfg.n_output = no;
  cfg.output = op;
  r.config = &cfg;
  grpc_reply(c, &r.base);
done:
  for (size_t i = 0; iv && i < ni; i++) free(iv[i].dims);
  for (size_t i = 0; ov && i < no; i++) free(ov[i].dims);
  free(iv);
  free(ip);
  free(ov);
  free(op);
  json_decref(m);
}
