/* Health probes: liveness and readiness (every model loaded and making progress, not draining). */
#include "api/api-impl.h"
#include "api/handlers.h"
#include "api/respond.h"

/* Live: the loop answers and no loaded model's engine is stuck. A stuck engine (work pending, no
 * step finished for the step timeout plus 30 s, 60 s at least: servd_model_ready) is a rank hung in
 * native code that the step timeout cannot interrupt; it does not recover, so the orchestrator
 * should restart the process. A draining server stays live (its models report not ready). */
static bool all_live(servd_api *a) {
  if (a->draining) return true;
  for (api_model *am = a->models; am; am = am->next)
    if (am->state == M_READY && !a->ops->ready(am->m) &&
        !(a->ops->restarting && a->ops->restarting(am->m, NULL, 0))) /* a crashed isolated model: it mends */
      return false;
  return true;
}

/* Both probes fail, with the reason, while quarantined interpreters hold the last interpreter
 * namespace and a model that needs one is not loaded: only a restart gives the namespaces back
 * (docs/interpreters.md), so the orchestrator should restart the process. */
static void answer(servd_http_req *r, const char *key, bool ok, servd_api *a) {
  char why[400];
  if (ok && api_interp_starved(a, why, sizeof why)) {
    api_json(r, 503, json_pack("{s:b, s:s}", key, false, "reason", why));
    return;
  }
  api_json(r, ok ? 200 : 503, json_pack("{s:b}", key, ok));
}

void api_health_live(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  answer(r, "live", all_live(a), a);
}

void api_health_ready(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  answer(r, "ready", api_all_ready(a), a);
}
