/* Health probes: liveness and readiness (every model loaded and making progress, not draining). */
#include "api/api-impl.h"
#include "api/handlers.h"
#include "api/respond.h"

void api_health_live(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)a;
  (void)args;
  api_json(r, 200, json_pack("{s:b}", "live", 1));
}

void api_health_ready(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  bool ready = api_all_ready(a);
  api_json(r, ready ? 200 : 503, json_pack("{s:b}", "ready", ready));
}
