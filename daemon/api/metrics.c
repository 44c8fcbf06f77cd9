/* GET /metrics in the Prometheus text exposition format (version 0.0.4). */
#include "api/api-impl.h"
#include "api/handlers.h"
#include "api/respond.h"

#include <string.h>

/* Label values are model names and routes: escape backslash, quote and newline. */
static void label(servd_buf *b, const char *v) {
  for (const char *p = v; *p; p++) {
    if (*p == '\\') servd_buf_puts(b, "\\\\");
    else if (*p == '"') servd_buf_puts(b, "\\\"");
    else if (*p == '\n') servd_buf_puts(b, "\\n");
    else servd_buf_append(b, p, 1);
  }
}

static void head(servd_buf *b, const char *name, const char *type, const char *help) {
  servd_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist(servd_buf *b, const char *name, const char *model, const api_hist *h) {
  uint64_t cum = 0;
  for (int i = 0; i <= h->n; i++) {
    cum += h->counts[i];
    servd_buf_printf(b, "%s_bucket{model=\"", name);
    label(b, model);
    if (i < h->n) servd_buf_printf(b, "\",le=\"%g\"} %llu\n", h->bounds[i], (unsigned long long)cum);
    else servd_buf_printf(b, "\",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
  }
  servd_buf_printf(b, "%s_sum{model=\"", name);
  label(b, model);
  servd_buf_printf(b, "\"} %.9g\n%s_count{model=\"", h->sum, name);
  label(b, model);
  servd_buf_printf(b, "\"} %llu\n", (unsigned long long)h->count);
}

typedef enum { G_INT, G_U64, G_DBL } gkind;

/* One gauge or counter with a value per ready model, read from the engine's stats. */
static void per_model(servd_api *a, servd_buf *b, const servd_model_stats *st, const char *name, const char *type,
                      const char *help, size_t offset, gkind k) {
  head(b, name, type, help);
  int i = 0;
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state != M_READY && am->state != M_UNLOADING) continue;
    const char *p = (const char *)&st[i++] + offset;
    servd_buf_printf(b, "%s{model=\"", name);
    label(b, am->name);
    if (k == G_INT) servd_buf_printf(b, "\"} %d\n", *(const int *)p);
    else if (k == G_U64) servd_buf_printf(b, "\"} %llu\n", (unsigned long long)*(const uint64_t *)p);
    else servd_buf_printf(b, "\"} %.9g\n", *(const double *)p);
  }
}

void api_metrics(servd_api *a, servd_http_req *r, const api_route_args *args) {
  (void)args;
  servd_buf b;
  servd_buf_init(&b);
  int n_live = 0;
  for (api_model *am = a->models; am; am = am->next) n_live += am->state == M_READY || am->state == M_UNLOADING;
  servd_model_stats *st = calloc((size_t)(n_live ? n_live : 1), sizeof(*st));
  if (!st) {
    api_kserve_error(r, 500, "out of memory");
    return;
  }
  int i = 0;
  for (api_model *am = a->models; am; am = am->next)
    if (am->state == M_READY || am->state == M_UNLOADING) a->ops->get_stats(am->m, &st[i++]);

  head(&b, "servd_http_requests_total", "counter", "HTTP requests by route and status code.");
  for (int k = 0; k < a->n_routes; k++) {
    servd_buf_puts(&b, "servd_http_requests_total{route=\"");
    label(&b, a->routes[k].route);
    servd_buf_printf(&b, "\",status=\"%d\"} %llu\n", a->routes[k].status, (unsigned long long)a->routes[k].n);
  }
  if (a->server) {
    head(&b, "servd_http_connections", "gauge", "Open client connections.");
    servd_buf_printf(&b, "servd_http_connections %d\n", servd_http_server_connections(a->server));
    head(&b, "servd_http_requests_in_progress", "gauge", "HTTP requests being handled.");
    servd_buf_printf(&b, "servd_http_requests_in_progress %d\n", servd_http_server_active_requests(a->server));
    head(&b, "servd_http_socket_writes_total", "counter", "Socket writes of response output.");
    servd_buf_printf(&b, "servd_http_socket_writes_total %llu\n",
                     (unsigned long long)servd_http_server_writes(a->server));
  }
  head(&b, "servd_engine_events_total", "counter", "Engine events (tokens, ends) handed to the HTTP loop.");
  servd_buf_printf(&b, "servd_engine_events_total %llu\n", (unsigned long long)a->n_events);
  head(&b, "servd_engine_event_batches_total", "counter", "Wake-ups of the HTTP loop that handled engine events.");
  servd_buf_printf(&b, "servd_engine_event_batches_total %llu\n", (unsigned long long)a->n_batches);
  head(&b, "servd_model_ready", "gauge", "1 when the model is loaded and its engine is making progress.");
  for (api_model *am = a->models; am; am = am->next) {
    servd_buf_puts(&b, "servd_model_ready{model=\"");
    label(&b, am->name);
    servd_buf_printf(&b, "\"} %d\n", api_model_ready(a, am) ? 1 : 0);
  }
  head(&b, "servd_time_to_first_token_seconds", "histogram", "Time from request received to first token.");
  for (api_model *am = a->models; am; am = am->next) hist(&b, "servd_time_to_first_token_seconds", am->name, &am->ttft);
  head(&b, "servd_inter_token_latency_seconds", "histogram", "Time between consecutive tokens of a request.");
  for (api_model *am = a->models; am; am = am->next) hist(&b, "servd_inter_token_latency_seconds", am->name, &am->itl);
  head(&b, "servd_e2e_request_latency_seconds", "histogram", "Time from request received to its last token.");
  for (api_model *am = a->models; am; am = am->next) hist(&b, "servd_e2e_request_latency_seconds", am->name, &am->e2e);

#define F(field) offsetof(servd_model_stats, field)
  per_model(a, &b, st, "servd_queue_depth", "gauge", "Requests waiting in the model's queue.", F(waiting), G_INT);
  per_model(a, &b, st, "servd_requests_running", "gauge", "Requests being generated in the running batch.", F(running),
            G_INT);
  per_model(a, &b, st, "servd_requests_waiting", "gauge", "Requests waiting to be scheduled.", F(waiting), G_INT);
  per_model(a, &b, st, "servd_kv_cache_blocks_capacity", "gauge", "KV cache blocks of the model.", F(kv_blocks_total),
            G_INT);
  per_model(a, &b, st, "servd_kv_cache_blocks_used", "gauge", "KV cache blocks in use.", F(kv_blocks_used), G_INT);
  per_model(a, &b, st, "servd_kv_cache_tokens_capacity", "gauge", "Tokens the KV cache holds (blocks x block size).",
            F(kv_cache_tokens), G_U64);
  per_model(a, &b, st, "servd_kv_cache_bytes", "gauge", "Memory of the KV cache, in its dtype's layout.",
            F(kv_cache_bytes), G_U64);
  per_model(a, &b, st, "servd_prompt_tokens_total", "counter", "Prompt tokens processed.", F(prompt_tokens), G_U64);
  per_model(a, &b, st, "servd_generation_tokens_total", "counter", "Tokens generated.", F(generation_tokens), G_U64);
  per_model(a, &b, st, "servd_preemptions_total", "counter", "Sequences preempted when KV blocks ran out.",
            F(preemptions), G_U64);
  per_model(a, &b, st, "servd_prefix_cache_queries_total", "counter",
            "Tokens looked up in the prefix cache when sequences were admitted.", F(prefix_cache_queries), G_U64);
  per_model(a, &b, st, "servd_prefix_cache_hits_total", "counter",
            "Tokens found in the prefix cache (their K/V reused, not computed).", F(prefix_cache_hits), G_U64);
  per_model(a, &b, st, "servd_kv_cache_blocks_cached", "gauge",
            "Full KV blocks in the prefix cache (shared or evictable).", F(kv_blocks_cached), G_INT);
  per_model(a, &b, st, "servd_prefix_cache_disk_blocks_written_total", "counter",
            "Full KV blocks the prefix cache wrote to its directory.", F(prefix_disk_written), G_U64);
  per_model(a, &b, st, "servd_prefix_cache_disk_blocks_read_total", "counter",
            "Full KV blocks read back from the prefix cache's directory instead of computed.", F(prefix_disk_read),
            G_U64);
  per_model(a, &b, st, "servd_prefix_cache_disk_rejected_total", "counter",
            "Block files found foreign, truncated or corrupt: removed, never used.", F(prefix_disk_rejected), G_U64);
  per_model(a, &b, st, "servd_prefix_cache_disk_evicted_total", "counter",
            "Block files removed to keep the directory within its bound.", F(prefix_disk_evicted), G_U64);
  per_model(a, &b, st, "servd_prefix_cache_disk_dropped_total", "counter",
            "Blocks not written: the writer was too far behind.", F(prefix_disk_dropped), G_U64);
  per_model(a, &b, st, "servd_prefix_cache_disk_bytes", "gauge", "Bytes of block files in the directory.",
            F(prefix_disk_bytes), G_U64);
  per_model(a, &b, st, "servd_guided_rows_total", "counter",
            "Token masks computed for constrained decoding (one per constrained sequence per step).", F(guided_rows),
            G_U64);
  per_model(a, &b, st, "servd_guided_mask_seconds_total", "counter",
            "Time spent in the grammar engine computing token masks (beside the forward steps).",
            F(guided_mask_seconds), G_DBL);
  per_model(a, &b, st, "servd_guided_wait_seconds_total", "counter",
            "Of that time, what the steps waited for after their forward (mask computation not overlapped).",
            F(guided_wait_seconds), G_DBL);
  per_model(a, &b, st, "servd_guided_sequences", "gauge", "Sequences holding a grammar matcher.", F(guided_sequences),
            G_INT);
  per_model(a, &b, st, "servd_scheduler_steps_total", "counter", "Scheduler steps run.", F(steps), G_U64);
  per_model(a, &b, st, "servd_scheduler_last_step_age_seconds", "gauge",
            "Seconds since the scheduler last finished a step while work was pending.", F(last_step_age_s), G_DBL);
#undef F
  head(&b, "servd_kv_cache_info", "gauge", "The KV cache's dtype and block size (value 1).");
  i = 0;
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state != M_READY && am->state != M_UNLOADING) continue;
    const servd_model_stats *s = &st[i++];
    if (!s->kv_cache_dtype[0]) continue;
    servd_buf_puts(&b, "servd_kv_cache_info{model=\"");
    label(&b, am->name);
    servd_buf_printf(&b, "\",dtype=\"%s\",block_size=\"%d\"} 1\n", s->kv_cache_dtype, s->kv_block_size);
  }
  head(&b, "servd_kv_cache_usage_ratio", "gauge", "Fraction of KV cache blocks in use.");
  i = 0;
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state != M_READY && am->state != M_UNLOADING) continue;
    const servd_model_stats *s = &st[i++];
    servd_buf_puts(&b, "servd_kv_cache_usage_ratio{model=\"");
    label(&b, am->name);
    servd_buf_printf(&b, "\"} %.6f\n", s->kv_blocks_total > 0 ? (double)s->kv_blocks_used / s->kv_blocks_total : 0.0);
  }
  head(&b, "servd_interpreter_busy_seconds_total", "counter", "Seconds each interpreter spent running model code.");
  i = 0;
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state != M_READY && am->state != M_UNLOADING) continue;
    const servd_model_stats *s = &st[i++];
    int n = s->n_interpreters < 0 ? 0 : s->n_interpreters > 16 ? 16 : s->n_interpreters;
    for (int k = 0; k < n; k++) {
      servd_buf_puts(&b, "servd_interpreter_busy_seconds_total{model=\"");
      label(&b, am->name);
      servd_buf_printf(&b, "\",interpreter=\"%d\"} %.6f\n", k, s->interp_busy_seconds[k]);
    }
  }
  head(&b, "servd_isolated_model_restarts_total", "counter",
       "Times the process of a process-isolated model was started again after it died.");
  i = 0;
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state != M_READY && am->state != M_UNLOADING) continue;
    const servd_model_stats *s = &st[i++];
    if (!s->isolated) continue;
    servd_buf_puts(&b, "servd_isolated_model_restarts_total{model=\"");
    label(&b, am->name);
    servd_buf_printf(&b, "\"} %d\n", s->isolated_restarts);
  }
  if (a->ops->quarantined_interpreters) {
    head(&b, "servd_engine_quarantined_interpreters", "gauge",
         "Interpreters of abandoned loads, never reused until servd restarts (at most 15 per process).");
    servd_buf_printf(&b, "servd_engine_quarantined_interpreters %d\n", a->ops->quarantined_interpreters());
  }
  if (a->ops->interpreter_namespaces_free) {
    head(&b, "servd_interpreter_namespaces_free", "gauge",
         "Interpreter namespaces a model load could still take (glibc: 15 per process; quarantined "
         "interpreters hold theirs until servd restarts).");
    servd_buf_printf(&b, "servd_interpreter_namespaces_free %d\n", a->ops->interpreter_namespaces_free());
    head(&b, "servd_interpreter_namespaces", "gauge", "Interpreter namespaces of this process, used or not.");
    servd_buf_printf(&b, "servd_interpreter_namespaces %d\n", API_INTERP_NAMESPACES);
  }
  head(&b, "servd_api_requests_in_flight", "gauge", "API requests holding engine work.");
  servd_buf_printf(&b, "servd_api_requests_in_flight %d\n", servd_api_inflight(a));
  api_metrics_generic(a, &b);
  api_metrics_vllm(a, &b, st);
  api_lora_metrics(a, &b);
  free(st);
  if (b.oom) api_kserve_error(r, 500, "out of memory");
  else servd_http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len);
  servd_buf_free(&b);
}
