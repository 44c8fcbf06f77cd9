/* The API's calls for non-HTTP front ends (frontend.h): the checks the router and the KServe
 * handlers make, answered as statuses instead of HTTP responses. */
#include "api/frontend-impl.h"
#include "api/route.h" /* API_MODEL_VERSION */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "servd/tensor.h"

bool servd_api_server_ready(servd_api *a) { return api_all_ready(a); }

bool servd_api_authorized(servd_api *a, const char *h) {
  if (!a->api_key) return true;
  const char *tok = "";
  if (h && strncasecmp(h, "Bearer ", 7) == 0) {
    tok = h + 7;
    while (*tok == ' ') tok++;
  }
  return servd_api_key_equal(tok, strlen(tok), a->api_key, a->api_key_len);
}

int servd_api_default_deadline(const servd_api *a) { return a->o.default_deadline_ms; }

/* The served model named, or NULL with 404. */
static api_model *find(servd_api *a, const char *name, const char *version, char *msg, size_t cap) {
  api_model *am = name && name[0] ? api_model_find(a, name) : NULL;
  if (!am) {
    snprintf(msg, cap, "model '%s' is not served here", name ? name : "");
    return NULL;
  }
  if (version && version[0] && strcmp(version, API_MODEL_VERSION) != 0) {
    snprintf(msg, cap, "model '%s' has no version '%s' (its only version is '" API_MODEL_VERSION "')", name, version);
    return NULL;
  }
  return am;
}

int servd_api_model_status(servd_api *a, const char *name, const char *version, char *msg, size_t cap) {
  msg[0] = '\0';
  api_model *am = find(a, name, version, msg, cap);
  if (!am) return 404;
  int st = api_model_usable(a, am, msg, cap);
  if (st != 200) return st;
  if (!api_model_ready(a, am)) {
    snprintf(msg, cap, "model '%s' is not making progress", am->name);
    return 503;
  }
  return 200;
}

json_t *servd_api_model_metadata(servd_api *a, const char *name, const char *version, int *status, char *msg,
                                 size_t cap) {
  msg[0] = '\0';
  api_model *am = find(a, name, version, msg, cap);
  if (!am) {
    *status = 404;
    return NULL;
  }
  if ((*status = api_model_usable(a, am, msg, cap)) != 200) return NULL;
  return api_kserve_metadata(a, am);
}

int servd_api_predict(servd_api *a, const char *model, const char *version, servd_named_tensor *in, int n_in,
                      int64_t deadline_ms, api_predict_cb cb, void *ud, servd_api_prediction **out, char *msg,
                      size_t cap) {
  *out = NULL;
  msg[0] = '\0';
  int st;
  api_model *am = find(a, model, version, msg, cap);
  if (!am) st = 404;
  else if ((st = api_model_usable(a, am, msg, cap)) == 200 && a->ops->kind(am->m) != SERVD_MODEL_GENERIC) {
    snprintf(msg, cap, "model '%s' is a language model; use /v1/completions or /v1/chat/completions", am->name);
    st = 400;
  }
  if (st != 200) {
    for (int i = 0; i < n_in; i++) servd_tensor_release(in[i].tensor);
    free(in);
    return st;
  }
  struct infer_job *j;
  st = api_kserve_predict(a, am, in, n_in, deadline_ms, cb, ud, &j, msg, cap);
  if (st == 0) *out = (servd_api_prediction *)j;
  return st;
}

void servd_api_predict_abandon(servd_api_prediction *p) { api_kserve_predict_abandon((struct infer_job *)p); }
