/* GET /v2/models/{m}/config: Triton's model configuration extension as far as servd has a
 * configuration. The model's name, platform and tensors (from the package metadata, as GET
 * /v2/models/{m} gives them) in the shape of Triton's ModelConfig in JSON: data types as
 * "TYPE_FP32", shapes as "dims", max_batch_size 0 (servd's shapes include any batch dimension).
 * The same fields as the gRPC ModelConfig (daemon/grpc/model_config.c). */
#include "api/api-impl.h"
#include "api/frontend-impl.h"
#include "api/handlers.h"
#include "api/respond.h"

#include <stdio.h>
#include <string.h>

/* Triton's name of a KServe datatype: "TYPE_" + the datatype, but BYTES is TYPE_STRING. */
static json_t *config_type(json_t *datatype) {
  const char *d = json_string_value(datatype);
  if (!d || !d[0]) return json_string("TYPE_INVALID");
  if (strcmp(d, "BYTES") == 0) return json_string("TYPE_STRING");
  char t[40];
  snprintf(t, sizeof t, "TYPE_%.32s", d);
  return json_string(t);
}

static json_t *config_tensors(json_t *meta) {
  json_t *out = json_array();
  for (size_t i = 0; i < json_array_size(meta); i++) {
    json_t *t = json_array_get(meta, i), *shape = json_object_get(t, "shape");
    const char *name = json_string_value(json_object_get(t, "name"));
    json_array_append_new(out, json_pack("{s:s, s:o, s:o}", "name", name ? name : "", "data_type",
                                         config_type(json_object_get(t, "datatype")), "dims",
                                         json_is_array(shape) ? json_incref(shape) : json_array()));
  }
  return out;
}

void api_kserve_model_config(servd_api *a, servd_http_req *r, const api_route_args *args) {
  api_model *am = args->am;
  if (!api_kserve_usable(a, r, am)) return;
  json_t *m = api_kserve_metadata(a, am);
  const char *platform = json_string_value(json_object_get(m, "platform"));
  json_t *c = json_pack("{s:s, s:s, s:s, s:i, s:o, s:o}", "name", am->name, "platform", platform ? platform : "servd",
                        "backend", "servd", "max_batch_size", 0, "input", config_tensors(json_object_get(m, "inputs")),
                        "output", config_tensors(json_object_get(m, "outputs")));
  json_decref(m);
  if (!c) api_kserve_error(r, 500, "out of memory");
  else api_json(r, 200, c);
}
