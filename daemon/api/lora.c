/* LoRA adapters over HTTP: vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter (behind the
 * API key, off unless runtime updating is enabled: VLLM_ALLOW_RUNTIME_LORA_UPDATING, as vLLM), the
 * adapters' rows of /v1/models (with `parent`), vLLM's vllm:lora_requests_info gauge, and the
 * registration servd --lora makes once its base has loaded. Requests name an adapter as a model
 * (api_model_resolve). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api-impl.h"
#include "api/handlers.h"
#include "api/request_params.h"
#include "api/respond.h"
#include "servd/status.h"

#define MAX_LIST 256

/* The language model an adapter is for: base named, or else the only language model served. */
static api_model *base_for(servd_api *a, const char *base, char *msg, size_t cap) {
  if (base && base[0]) {
    api_model *am = api_model_find(a, base);
    if (!am || am->state != M_READY || !am->m || a->ops->kind(am->m) != SERVD_MODEL_CAUSAL_LM) {
      snprintf(msg, cap, "base model '%s' is not a language model served here", base);
      return NULL;
    }
    return am;
  }
  api_model *only = NULL;
  int n = 0;
  for (api_model *am = a->models; am; am = am->next)
    if (am->state == M_READY && am->m && a->ops->kind(am->m) == SERVD_MODEL_CAUSAL_LM) only = am, n++;
  if (n != 1) {
    snprintf(msg, cap, "%s language models are served: name the base (base_model_name)", n ? "several" : "no");
    return NULL;
  }
  return only;
}

int servd_api_lora_load(servd_api *a, const char *base, const char *name, const char *path, char *msg, size_t cap) {
  msg[0] = '\0';
  if (!a->ops->lora_load) {
    snprintf(msg, cap, "this server takes no LoRA adapters");
    return 400;
  }
  api_model *am = base_for(a, base, msg, cap);
  if (!am) return 400;
  if (api_model_resolve(a, name, NULL)) {
    snprintf(msg, cap, "The lora adapter '%s' has already been loaded (or a model has that name).", name);
    return 400;
  }
  int rc = a->ops->lora_load(am->m, name, path);
  if (rc) {
    snprintf(msg, cap, "%s", api_user_cause(servd_last_error()));
    return rc == SERVD_ENOMEM ? 500 : 400;
  }
  fprintf(a->o.log ? a->o.log : stderr, "servd: LoRA adapter '%s' (%s) loaded on model '%s'\n", name, path, am->name);
  return 200;
}

static bool runtime_updating(void) {
  const char *v = getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
  return v && (!strcasecmp(v, "true") || !strcmp(v, "1"));
}

/* The body's string field, or NULL after answering 400. */
static const char *field(servd_http_req *r, json_t *body, const char *key, bool required) {
  json_t *v = json_object_get(body, key);
  if (!v && !required) return NULL;
  if (!json_is_string(v) || !json_string_length(v)) {
    api_oai_error(r, 400, "invalid_request_error", key, NULL, "'%s' must be a non-empty string", key);
    return NULL;
  }
  return json_string_value(v);
}

static json_t *body_of(servd_http_req *r) {
  if (!runtime_updating()) {
    api_oai_error(r, 404, "invalid_request_error", NULL, NULL,
                  "loading LoRA adapters at run time is off (set VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)");
    return NULL;
  }
  json_t *body = NULL;
  api_param_error perr;
  if (api_body_parse(r->body, r->body_len, &body, &perr) != 0) {
    api_oai_error(r, perr.status, "invalid_request_error", NULL, NULL, "%s", perr.message);
    return NULL;
  }
  if (!json_is_object(body)) {
    json_decref(body);
    api_oai_error(r, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON object");
    return NULL;
  }
  return body;
}

static void plain(servd_http_req *r, const char *fmt, const char *name) {
  char text[400];
  int n = snprintf(text, sizeof text, fmt, name);
  servd_http_respond(r, 200, "text/plain; charset=utf-8", text,
                     (size_t)(n < (int)sizeof text ? n : (int)sizeof text - 1));
}

void api_oai_load_lora(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  json_t *body = body_of(r);
  if (!body) return;
  const char *name = field(r, body, "lora_name", true), *path = name ? field(r, body, "lora_path", true) : NULL;
  const char *base = json_string_value(json_object_get(body, "base_model_name"));
  if (name && path) {
    char msg[1024];
    int st = servd_api_lora_load(a, base, name, path, msg, sizeof msg);
    if (st == 200) plain(r, "Success: LoRA adapter '%s' added successfully.", name);
    else api_oai_error(r, st, "invalid_request_error", "lora_path", NULL, "%s", msg);
  }
  json_decref(body);
}

void api_oai_unload_lora(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  json_t *body = body_of(r);
  if (!body) return;
  const char *name = field(r, body, "lora_name", true), *lora = NULL;
  api_model *am = name ? api_model_resolve(a, name, &lora) : NULL;
  if (name && (!am || !lora || !a->ops->lora_unload)) {
    api_oai_error(r, 404, "not_found_error", "lora_name", NULL, "The lora adapter '%s' cannot be found.", name);
  } else if (name) {
    if (a->ops->lora_unload(am->m, name) != 0)
      api_oai_error(r, 404, "not_found_error", "lora_name", NULL, "%s", api_user_cause(servd_last_error()));
    else plain(r, "Success: LoRA adapter '%s' removed successfully.", name);
  }
  json_decref(body);
}

static json_t *entry(const api_model *am, const servd_lora_info *i) {
  return json_pack("{s:s, s:s, s:I, s:s, s:s, s:s}", "id", i->name, "object", "model", "created",
                   (json_int_t)am->created, "owned_by", "servd", "root", i->path, "parent", am->name);
}

void api_lora_model_entries(servd_api *a, api_model *am, json_t *data) {
  if (!a->ops->lora_list || !am->m || a->ops->kind(am->m) != SERVD_MODEL_CAUSAL_LM) return;
  servd_lora_info *list = calloc(MAX_LIST, sizeof *list);
  if (!list) return;
  int n = a->ops->lora_list(am->m, list, MAX_LIST, NULL);
  for (int i = 0; i < n && i < MAX_LIST; i++) json_array_append_new(data, entry(am, &list[i]));
  free(list);
}

json_t *api_lora_model_entry(servd_api *a, api_model *am, const char *name) {
  if (!a->ops->lora_list) return NULL;
  servd_lora_info *list = calloc(MAX_LIST, sizeof *list);
  json_t *e = NULL;
  int n = list ? a->ops->lora_list(am->m, list, MAX_LIST, NULL) : 0;
  for (int i = 0; i < n && i < MAX_LIST && !e; i++)
    if (!strcmp(list[i].name, name)) e = entry(am, &list[i]);
  free(list);
  return e;
}

/* vLLM's gauge: one series per language model, the adapters with sequences in the latest step and
 * those held by requests not in it as comma-separated labels, the value the time of the reading. */
void api_lora_metrics(servd_api *a, servd_buf *b) {
  if (!a->ops->lora_list) return;
  servd_lora_info *list = calloc(MAX_LIST, sizeof *list);
  if (!list) {
    b->oom = true;
    return;
  }
  bool head = false;
  for (api_model *am = a->models; am; am = am->next) {
    if ((am->state != M_READY && am->state != M_UNLOADING) || !am->m || a->ops->kind(am->m) != SERVD_MODEL_CAUSAL_LM)
      continue;
    int max_loras = 0, n = a->ops->lora_list(am->m, list, MAX_LIST, &max_loras);
    if (!head) {
      servd_buf_printf(b, "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
                          "# TYPE vllm:lora_requests_info gauge\n");
      head = true;
    }
    servd_buf_printf(b, "vllm:lora_requests_info{model_name=\"");
    api_prom_label(b, am->name);
    servd_buf_printf(b, "\",running_lora_adapters=\"");
    for (int i = 0, first = 1; i < n && i < MAX_LIST; i++)
      if (list[i].running > 0) {
        if (!first) servd_buf_printf(b, ",");
        api_prom_label(b, list[i].name);
        first = 0;
      }
    servd_buf_printf(b, "\",waiting_lora_adapters=\"");
    for (int i = 0, first = 1; i < n && i < MAX_LIST; i++)
      if (list[i].users > list[i].running) {
        if (!first) servd_buf_printf(b, ",");
        api_prom_label(b, list[i].name);
        first = 0;
      }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    servd_buf_printf(b, "\",max_lora=\"%d\"} %.6f\n", max_loras, (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
  }
  free(list);
}
