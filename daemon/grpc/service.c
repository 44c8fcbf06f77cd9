/* The unary methods that need no model work: inference.GRPCInferenceService's liveness, readiness
 * and metadata. The method table is methods.c. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"

#ifndef SERVD_VERSION_STRING
#define SERVD_VERSION_STRING "0.1.0"
#endif

/* Unpacks the request, or answers INVALID_ARGUMENT and returns NULL. */
static ProtobufCMessage *unpack(grpc_call *c, const ProtobufCMessageDescriptor *d, const uint8_t *msg, size_t len) {
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, msg);
  if (!m) grpc_fail(c, GRPC_INVALID_ARGUMENT, "malformed %s message", d->name);
  return m;
}

void grpc_server_live(grpc_call *c, const uint8_t *msg, size_t len) {
  ProtobufCMessage *q = unpack(c, &inference__server_live_request__descriptor, msg, len);
  if (!q) return;
  protobuf_c_message_free_unpacked(q, NULL);
  Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
  r.live = 1;
  grpc_reply(c, &r.base);
}

void grpc_server_ready(grpc_call *c, const uint8_t *msg, size_t len) {
  ProtobufCMessage *q = unpack(c, &inference__server_ready_request__descriptor, msg, len);
  if (!q) return;
  protobuf_c_message_free_unpacked(q, NULL);
  Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
  r.ready = servd_api_server_ready(c->api);
  grpc_reply(c, &r.base);
}

void grpc_model_ready(grpc_call *c, const uint8_t *msg, size_t len) {
  Inference__ModelReadyRequest *q =
      (Inference__ModelReadyRequest *)unpack(c, &inference__model_ready_request__descriptor, msg, len);
  if (!q) return;
  char err[1024];
  int st = servd_api_model_status(c->api, q->name, q->version, err, sizeof err);
  protobuf_c_message_free_unpacked(&q->base, NULL);
  if (st == 404) {
    /* Triton answers an unknown model with an error, not with ready: false. */
    grpc_fail(c, GRPC_NOT_FOUND, "%s", err);
    return;
  }
  Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
  r.ready = st == 200;
  grpc_reply(c, &r.base);
}

void grpc_server_metadata(grpc_call *c, const uint8_t *msg, size_t len) {
  ProtobufCMessage *q = unpack(c, &inference__server_metadata_request__descriptor, msg, len);
  if (!q) return;
  protobuf_c_message_free_unpacked(q, NULL);
  static char *ext[] = {"model_repository", "metrics"};
  Inference__ServerMetadataResponse r = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
  r.name = "servd";
  r.version = SERVD_VERSION_STRING;
  r.n_extensions = 2;
  r.extensions = ext;
  grpc_reply(c, &r.base);
}

/* Tensor metadata from the JSON the HTTP route answers with. Strings borrowed from j. */
static int tensors_from_json(json_t *arr, Inference__ModelMetadataResponse__TensorMetadata ***out, size_t *n) {
  size_t k = json_array_size(arr);
  *n = 0;
  *out = NULL;
  if (k == 0) return 0;
  Inference__ModelMetadataResponse__TensorMetadata **v = calloc(k, sizeof *v + sizeof **v);
  if (!v) return -1;
  Inference__ModelMetadataResponse__TensorMetadata *items = (void *)(v + k);
  for (size_t i = 0; i < k; i++) {
    json_t *t = json_array_get(arr, i);
    Inference__ModelMetadataResponse__TensorMetadata init = INFERENCE__MODEL_METADATA_RESPONSE__TENSOR_METADATA__INIT;
    items[i] = init;
    const char *nm = json_string_value(json_object_get(t, "name"));
    const char *dt = json_string_value(json_object_get(t, "datatype"));
    if (nm) items[i].name = (char *)nm;
    if (dt) items[i].datatype = (char *)dt;
    json_t *sh = json_object_get(t, "shape");
    size_t nd = json_array_size(sh);
    if (nd) {
      items[i].shape = calloc(nd, sizeof(int64_t));
      if (!items[i].shape) nd = 0;
      for (size_t d = 0; d < nd; d++) items[i].shape[d] = json_integer_value(json_array_get(sh, d));
    }
    items[i].n_shape = nd;
    v[i] = &items[i];
  }
  *out = v;
  *n = k;
  return 0;
}

static void tensors_free(Inference__ModelMetadataResponse__TensorMetadata **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]->shape);
  free(v);
}

void grpc_model_metadata(grpc_call *c, const uint8_t *msg, size_t len) {
  Inference__ModelMetadataRequest *q =
      (Inference__ModelMetadataRequest *)unpack(c, &inference__model_metadata_request__descriptor, msg, len);
  if (!q) return;
  char err[1024];
  int st = 0;
  json_t *m = servd_api_model_metadata(c->api, q->name, q->version, &st, err, sizeof err);
  protobuf_c_message_free_unpacked(&q->base, NULL);
  if (!m) {
    grpc_fail(c, grpc_code_for_status(st), "%s", err);
    return;
  }
  Inference__ModelMetadataResponse r = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
  r.name = (char *)json_string_value(json_object_get(m, "name"));
  const char *platform = json_string_value(json_object_get(m, "platform"));
  r.platform = (char *)(platform ? platform : "servd");
  static char *versions[] = {"1"};
  r.versions = versions;
  r.n_versions = 1;
  if (tensors_from_json(json_object_get(m, "inputs"), &r.inputs, &r.n_inputs) != 0 ||
      tensors_from_json(json_object_get(m, "outputs"), &r.outputs, &r.n_outputs) != 0) {
    tensors_free(r.inputs, r.n_inputs);
    json_decref(m);
    grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  grpc_reply(c, &r.base);
  tensors_free(r.inputs, r.n_inputs);
  tensors_free(r.outputs, r.n_outputs);
  json_decref(m);
}
