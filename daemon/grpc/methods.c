/* The gRPC method table: every method's path, whether it needs the API key, its handler. The server
 * (server.c) is created here with this table, so calls go one way: methods.c names the handlers and
 * the server, the handlers answer through server.c, and server.c names no handler. ModelInfer is
 * infer.c (llm_infer.c for language models, and ModelStreamInfer), ModelStatistics statistics.c,
 * the repository methods repository.c, grpc.health.v1 health.c, the rest service.c. */
#include "grpc/grpc-impl.h"

void grpc_server_live(grpc_call *c, const uint8_t *msg, size_t len);        /* service.c */
void grpc_server_ready(grpc_call *c, const uint8_t *msg, size_t len);       /* service.c */
void grpc_model_ready(grpc_call *c, const uint8_t *msg, size_t len);        /* service.c */
void grpc_server_metadata(grpc_call *c, const uint8_t *msg, size_t len);    /* service.c */
void grpc_model_metadata(grpc_call *c, const uint8_t *msg, size_t len);     /* service.c */
void grpc_model_infer(grpc_call *c, const uint8_t *msg, size_t len);        /* infer.c */
void grpc_model_config(grpc_call *c, const uint8_t *msg, size_t len);       /* model_config.c */
void grpc_model_stream_infer(grpc_call *c, const uint8_t *msg, size_t len); /* llm_infer.c */
void grpc_model_statistics(grpc_call *c, const uint8_t *msg, size_t len);   /* statistics.c */
void grpc_repository_index(grpc_call *c, const uint8_t *msg, size_t len);   /* repository.c */
void grpc_repository_load(grpc_call *c, const uint8_t *msg, size_t len);    /* repository.c */
void grpc_repository_unload(grpc_call *c, const uint8_t *msg, size_t len);  /* repository.c */
void grpc_health_check(grpc_call *c, const uint8_t *msg, size_t len);       /* health.c */
void grpc_health_watch(grpc_call *c, const uint8_t *msg, size_t len);       /* health.c */

#define SVC "/inference.GRPCInferenceService/"
static const grpc_method methods[] = {
    /* Probes answer without the API key, as the HTTP health probes do. */
    {SVC "ServerLive", true, grpc_server_live, false},
    {SVC "ServerReady", true, grpc_server_ready, false},
    {"/grpc.health.v1.Health/Check", true, grpc_health_check, false},
    {"/grpc.health.v1.Health/Watch", true, grpc_health_watch, false},
    {SVC "ModelReady", false, grpc_model_ready, false},
    {SVC "ServerMetadata", false, grpc_server_metadata, false},
    {SVC "ModelMetadata", false, grpc_model_metadata, false},
    {SVC "ModelInfer", false, grpc_model_infer, false},
    {SVC "ModelConfig", false, grpc_model_config, false},
    {SVC "ModelStreamInfer", false, grpc_model_stream_infer, true},
    {SVC "ModelStatistics", false, grpc_model_statistics, false},
    {SVC "RepositoryIndex", false, grpc_repository_index, false},
    {SVC "RepositoryModelLoad", false, grpc_repository_load, false},
    {SVC "RepositoryModelUnload", false, grpc_repository_unload, false},
};

int servd_grpc_server_create(uv_loop_t *loop, servd_api *api, const servd_grpc_limits *limits,
                             servd_grpc_server **out) {
  return grpc_server_create(loop, api, limits, methods, sizeof methods / sizeof methods[0], out);
}
