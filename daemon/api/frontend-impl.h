/* Internal to daemon/api: the prediction queue and the metadata of kserve.c as frontend.c and the
 * other KServe files (kserve_config.c, kserve_stats.c) use them. */
#ifndef SERVD_API_FRONTEND_IMPL_H
#define SERVD_API_FRONTEND_IMPL_H

#include "api/api-impl.h"
#include "api/frontend.h"

struct infer_job;

/* Queues a prediction of am (a generic model the caller checked is usable). Takes in[] and its
 * tensors. Returns 0 with *out set (cb runs once on the loop, unless abandoned first), or an HTTP
 * status (429, 500) with msg. */
int api_kserve_predict(servd_api *a, api_model *am, servd_named_tensor *in, int n_in, int64_t deadline_ms,
                       api_predict_cb cb, void *ud, struct infer_job **out, char *msg, size_t cap);
/* The metadata of am (a usable generic model): what its ops say, with "name" set and "versions" and
 * "platform" filled in when absent. The caller owns the result. */
json_t *api_kserve_metadata(servd_api *a, api_model *am);
/* 200 when am can answer now; else 404 (not loaded) or 503 (loading, unloading, draining) with msg. */
int api_model_usable(servd_api *a, api_model *am, char *msg, size_t cap);
/* Whether am can answer now; else answers r 404 (not loaded) or 503 (loading, unloading, draining). */
bool api_kserve_usable(servd_api *a, servd_http_req *r, api_model *am);
/* cb will not run; the prediction finishes (it cannot be stopped) and its result is dropped. */
void api_kserve_predict_abandon(struct infer_job *j);

#endif
