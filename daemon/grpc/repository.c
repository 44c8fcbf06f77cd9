/* Triton's model repository extension over gRPC: RepositoryIndex, RepositoryModelLoad and
 * RepositoryModelUnload, through the same calls as POST /v2/repository/... (api/models.c). A load
 * or unload answers when it has finished; a client that goes away first leaves it running. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/grpc-impl.h"

void grpc_repository_index(grpc_call *c, const uint8_t *msg, size_t len) {
  Inference__RepositoryIndexRequest *q = inference__repository_index_request__unpack(NULL, len, msg);
  if (!q) {
    grpc_fail(c, GRPC_INVALID_ARGUMENT, "malformed inference.RepositoryIndexRequest message");
    return;
  }
  bool ready_only = q->ready;
  inference__repository_index_request__free_unpacked(q, NULL);
  json_t *arr = servd_api_repository_index(c->api);
  size_t n = json_array_size(arr);
  Inference__RepositoryIndexResponse__ModelIndex **models = n ? calloc(n, sizeof *models + sizeof **models) : NULL;
  if (n && !models) {
    json_decref(arr);
    grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  Inference__RepositoryIndexResponse__ModelIndex *items = (void *)(models + n);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(arr, i);
    const char *state = json_string_value(json_object_get(e, "state"));
    if (ready_only && !(state && strcmp(state, "READY") == 0)) continue;
    Inference__RepositoryIndexResponse__ModelIndex init = INFERENCE__REPOSITORY_INDEX_RESPONSE__MODEL_INDEX__INIT;
    items[k] = init;
    const char *name = json_string_value(json_object_get(e, "name"));
    const char *version = json_string_value(json_object_get(e, "version"));
    const char *reason = json_string_value(json_object_get(e, "reason"));
    if (name) items[k].name = (char *)name;
    if (version) items[k].version = (char *)version;
    if (state) items[k].state = (char *)state;
    if (reason) items[k].reason = (char *)reason;
    models[k] = &items[k];
    k++;
  }
  Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
  r.n_models = k;
  r.models = models;
  grpc_reply(c, &r.base);
  free(models);
  json_decref(arr);
}

static void on_cancel(grpc_call *c) { servd_api_repository_forget(c->api, c); }

static void on_outcome(void *ud, int status, const char *message) {
  grpc_call *c = ud;
  c->on_cancel = NULL;
  if (status != 200) {
    grpc_fail(c, grpc_code_for_status(status), "%s", message);
    return;
  }
  /* Both responses are empty messages. */
  Inference__RepositoryModelLoadResponse r = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
  grpc_reply(c, &r.base);
}

/* load: true for RepositoryModelLoad. The two requests have the same fields. */
static void load_or_unload(grpc_call *c, const uint8_t *msg, size_t len, bool load) {
  const ProtobufCMessageDescriptor *d = load ? &inference__repository_model_load_request__descriptor
                                             : &inference__repository_model_unload_request__descriptor;
  Inference__RepositoryModelLoadRequest *q = (void *)protobuf_c_message_unpack(d, NULL, len, msg);
  if (!q) {
    grpc_fail(c, GRPC_INVALID_ARGUMENT, "malformed %s message", d->name);
    return;
  }
  for (size_t i = 0; i < q->n_parameters; i++) {
    /* unload_dependents (tritonclient sends it) means nothing here: no model depends on another.
     * Triton's load parameters (a config override, model files) have no servd equivalent. */
    if (!load && strcmp(q->parameters[i]->key, "unload_dependents") == 0) continue;
    grpc_fail(c, GRPC_INVALID_ARGUMENT, "%s parameter '%s' is not supported: servd %s the package as it is",
              load ? "load" : "unload", q->parameters[i]->key, load ? "loads" : "unloads");
    protobuf_c_message_free_unpacked(&q->base, NULL);
    return;
  }
  char *name = strdup(q->model_name);
  protobuf_c_message_free_unpacked(&q->base, NULL);
  if (!name) {
    grpc_fail(c, GRPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  c->on_cancel = on_cancel; /* on_outcome may run now, and clears it */
  if (load) servd_api_repository_load(c->api, name, on_outcome, c);
  else servd_api_repository_unload(c->api, name, on_outcome, c);
  free(name);
}

void grpc_repository_load(grpc_call *c, const uint8_t *msg, size_t len) { load_or_unload(c, msg, len, true); }
void grpc_repository_unload(grpc_call *c, const uint8_t *msg, size_t len) { load_or_unload(c, msg, len, false); }
