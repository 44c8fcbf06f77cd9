/* GET /version: the servd version (vLLM's route), from the CMake project's VERSION. */
#include "api/api-impl.h"
#include "api/handlers.h"
#include "api/respond.h"

#ifndef SERVD_VERSION_STRING
#error "SERVD_VERSION_STRING comes from daemon/CMakeLists.txt"
#endif

void api_version(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)a;
  (void)args;
  api_json(r, 200, json_pack("{s:s}", "version", SERVD_VERSION_STRING));
}
