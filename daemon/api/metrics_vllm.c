/* vLLM's metric names beside servd's own: the same families, label (model_name) and buckets as
 * vLLM's Prometheus exporter (vllm/v1/metrics/loggers.py), so vLLM's Grafana dashboard and
 * autoscaling rules on vllm:num_requests_waiting work unchanged. Only language models have these
 * series; generic models have servd_inference_* (metrics_generic.c). */
#include "api/api-impl.h"

#include <stdio.h>
#include <string.h>

/* vLLM's buckets, seconds. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                     1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double request_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                        30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
#define N_OF(x) ((int)(sizeof(x) / sizeof((x)[0])))

_Static_assert(N_OF(ttft_bounds) <= API_HIST_MAX && N_OF(request_bounds) <= API_HIST_MAX, "API_HIST_MAX");

static const char *const reasons[3] = {"stop", "length", "abort"};

void api_vllm_init(api_vllm_stats *v) {
  memset(v, 0, sizeof(*v));
  api_hist_init(&v->ttft, ttft_bounds, N_OF(ttft_bounds));
  api_hist_init(&v->itl, itl_bounds, N_OF(itl_bounds));
  api_hist_init(&v->e2e, request_bounds, N_OF(request_bounds));
  api_hist_init(&v->queue, request_bounds, N_OF(request_bounds));
  api_hist_init(&v->prefill, request_bounds, N_OF(request_bounds));
  api_hist_init(&v->decode, request_bounds, N_OF(request_bounds));
  api_hist_init(&v->inference, request_bounds, N_OF(request_bounds));
  /* Token buckets depend on the context length: set once the model is loaded (token_bounds). */
  api_hist_init(&v->prompt_tokens, v->tok_bounds, 0);
  api_hist_init(&v->generation_tokens, v->tok_bounds, 0);
  api_hist_init(&v->max_tokens, v->tok_bounds, 0);
}

/* vLLM's build_1_2_5_buckets(max_model_len): 1, 2, 5, 10, 20, 50, ... up to the context length. */
static void token_bounds(servd_api *a, api_model *am) {
  api_vllm_stats *v = &am->vllm;
  if (v->prompt_tokens.n > 0 || !am->m) return;
  int ctx = a->ops->context_length(am->m);
  if (ctx <= 0) ctx = 1 << 20;
  int n = 0;
  for (double e = 1; n < API_HIST_MAX; e *= 10) {
    static const double mant[3] = {1, 2, 5};
    int k = 0;
    for (; k < 3 && n < API_HIST_MAX && mant[k] * e <= ctx; k++) v->tok_bounds[n++] = mant[k] * e;
    if (k < 3) break;
  }
  /* Nothing observed yet (n was 0): the buckets change before the first count. */
  v->prompt_tokens.n = v->generation_tokens.n = v->max_tokens.n = n;
}

void api_vllm_token(api_model *am, bool first, double secs) {
  api_hist_observe(first ? &am->vllm.ttft : &am->vllm.itl, secs);
}

void api_vllm_finished(servd_api *a, api_model *am, const api_event *ev, double e2e_s, int max_tokens) {
  api_vllm_stats *v = &am->vllm;
  token_bounds(a, am);
  api_hist_observe(&v->e2e, e2e_s);
  api_hist_observe(&v->queue, ev->queue_s);
  api_hist_observe(&v->prefill, ev->prefill_s);
  api_hist_observe(&v->decode, ev->decode_s);
  api_hist_observe(&v->inference, ev->prefill_s + ev->decode_s);
  api_hist_observe(&v->prompt_tokens, ev->prompt_tokens);
  api_hist_observe(&v->generation_tokens, ev->completion_tokens);
  /* No max_tokens: up to the context, as the engine bounds it. */
  if (max_tokens <= 0 && am->m) max_tokens = a->ops->context_length(am->m) - ev->prompt_tokens;
  api_hist_observe(&v->max_tokens, max_tokens);
  /* servd's cancelled, deadline and error endings are vLLM's abort. */
  bool ok = ev->kind == SERVD_EVENT_DONE;
  v->finished[ok && strcmp(ev->finish, "stop") == 0 ? 0 : ok && strcmp(ev->finish, "length") == 0 ? 1 : 2]++;
}

/* ---- exposition ----------------------------------------------------------------------------- */

typedef struct live {
  api_model *am;
  const servd_model_stats *st;
} live;

static void head(servd_buf *b, const char *name, const char *type, const char *help) {
  servd_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{model_name="...",extra}: extra is "" or a label pair with its leading comma. */
static void series(servd_buf *b, const char *name, const api_model *am, const char *extra) {
  servd_buf_printf(b, "%s{model_name=\"", name);
  api_prom_label(b, am->name);
  servd_buf_printf(b, "\"%s}", extra);
}

static void hist(servd_buf *b, const char *name, const live *l, int n, size_t offset, const char *help) {
  head(b, name, "histogram", help);
  for (int k = 0; k < n; k++) {
    const api_hist *h = (const api_hist *)((const char *)&l[k].am->vllm + offset);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n; i++) {
      cum += h->counts[i];
      servd_buf_printf(b, "%s_bucket{model_name=\"", name);
      api_prom_label(b, l[k].am->name);
      if (i < h->n) servd_buf_printf(b, "\",le=\"%g\"} %llu\n", h->bounds[i], (unsigned long long)cum);
      else servd_buf_printf(b, "\",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    servd_buf_printf(b, "%s_sum{model_name=\"", name);
    api_prom_label(b, l[k].am->name);
    servd_buf_printf(b, "\"} %.9g\n%s_count{model_name=\"", h->sum, name);
    api_prom_label(b, l[k].am->name);
    servd_buf_printf(b, "\"} %llu\n", (unsigned long long)h->count);
  }
}

typedef enum {
  V_RUNNING,
  V_WAITING,
  V_KV_USAGE,
  V_PROMPT,
  V_GENERATION,
  V_PREEMPT,
  V_PC_QUERIES,
  V_PC_HITS,
  V_SPEC_DRAFTS,
  V_SPEC_DRAFT_TOKENS,
  V_SPEC_ACCEPTED
} vkind;

static void value(servd_buf *b, const char *name, const char *type, const char *help, const live *l, int n, vkind k) {
  head(b, name, type, help);
  for (int i = 0; i < n; i++) {
    const servd_model_stats *s = l[i].st;
    series(b, name, l[i].am, "");
    switch (k) {
    case V_RUNNING: servd_buf_printf(b, " %d\n", s->running); break;
    case V_WAITING: servd_buf_printf(b, " %d\n", s->waiting); break;
    case V_KV_USAGE:
      servd_buf_printf(b, " %.6f\n", s->kv_blocks_total > 0 ? (double)s->kv_blocks_used / s->kv_blocks_total : 0.0);
      break;
    case V_PROMPT: servd_buf_printf(b, " %llu\n", (unsigned long long)s->prompt_tokens); break;
    case V_GENERATION: servd_buf_printf(b, " %llu\n", (unsigned long long)s->generation_tokens); break;
    case V_PREEMPT: servd_buf_printf(b, " %llu\n", (unsigned long long)s->preemptions); break;
    case V_PC_QUERIES: servd_buf_printf(b, " %llu\n", (unsigned long long)s->prefix_cache_queries); break;
    case V_PC_HITS: servd_buf_printf(b, " %llu\n", (unsigned long long)s->prefix_cache_hits); break;
    case V_SPEC_DRAFTS: servd_buf_printf(b, " %llu\n", (unsigned long long)s->spec_drafts); break;
    case V_SPEC_DRAFT_TOKENS: servd_buf_printf(b, " %llu\n", (unsigned long long)s->spec_draft_tokens); break;
    case V_SPEC_ACCEPTED: servd_buf_printf(b, " %llu\n", (unsigned long long)s->spec_accepted_tokens); break;
    }
  }
}

/* Speculative decoding, vLLM's spec_decode families: verify rows ("drafts"), their draft tokens, the
 * accepted ones, and those by position in the row. */
static void speculation(servd_buf *b, const live *l, int n) {
  value(b, "vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", l, n, V_SPEC_DRAFTS);
  value(b, "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", l, n, V_SPEC_DRAFT_TOKENS);
  value(b, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", l, n,
        V_SPEC_ACCEPTED);
  const char *name = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
  head(b, name, "counter", "Accepted tokens per draft position.");
  for (int k = 0; k < n; k++)
    for (int pos = 0; pos < l[k].st->spec_max_draft && pos < 16; pos++) {
      char extra[32];
      snprintf(extra, sizeof extra, ",position=\"%d\"", pos);
      series(b, name, l[k].am, extra);
      servd_buf_printf(b, " %llu\n", (unsigned long long)l[k].st->spec_accepted_per_pos[pos]);
    }
}

void api_metrics_vllm(servd_api *a, servd_buf *b, const servd_model_stats *st) {
  int n_live = 0;
  for (api_model *am = a->models; am; am = am->next) n_live += am->state == M_READY || am->state == M_UNLOADING;
  live *l = calloc((size_t)(n_live ? n_live : 1), sizeof(*l));
  if (!l) {
    b->oom = true;
    return;
  }
  int n = 0, i = 0;
  for (api_model *am = a->models; am; am = am->next) {
    if (am->state != M_READY && am->state != M_UNLOADING) continue;
    const servd_model_stats *s = &st[i++];
    if (a->ops->kind(am->m) != SERVD_MODEL_CAUSAL_LM) continue;
    token_bounds(a, am);
    l[n++] = (live){am, s};
  }
  if (n == 0) { /* no language model: no vllm: families at all (no empty ones) */
    free(l);
    return;
  }
  value(b, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", l, n, V_RUNNING);
  value(b, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", l, n, V_WAITING);
  value(b, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", l, n, V_KV_USAGE);
  value(b, "vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage (vLLM's older name). 1 means 100 percent usage.", l, n,
        V_KV_USAGE);
  value(b, "vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.", l, n,
        V_PREEMPT);
  value(b, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", l, n, V_PROMPT);
  value(b, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", l, n, V_GENERATION);
  value(b, "vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
        l, n, V_PC_QUERIES);
  value(b, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", l, n,
        V_PC_HITS);
  speculation(b, l, n);
  api_vllm_cache_config_head(b);
  for (int k = 0; k < n; k++) api_vllm_cache_config(b, l[k].am, l[k].st);
  head(b, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (int k = 0; k < n; k++)
    for (int r = 0; r < 3; r++) {
      char extra[32];
      snprintf(extra, sizeof extra, ",finished_reason=\"%s\"", reasons[r]);
      series(b, "vllm:request_success_total", l[k].am, extra);
      servd_buf_printf(b, " %llu\n", (unsigned long long)l[k].am->vllm.finished[r]);
    }
#define H(field) offsetof(api_vllm_stats, field)
  hist(b, "vllm:time_to_first_token_seconds", l, n, H(ttft), "Histogram of time to first token in seconds.");
  hist(b, "vllm:inter_token_latency_seconds", l, n, H(itl), "Histogram of inter-token latency in seconds.");
  hist(b, "vllm:time_per_output_token_seconds", l, n, H(itl),
       "Histogram of time per output token in seconds (vLLM's older name of inter-token latency).");
  hist(b, "vllm:e2e_request_latency_seconds", l, n, H(e2e), "Histogram of e2e request latency in seconds.");
  hist(b, "vllm:request_queue_time_seconds", l, n, H(queue), "Histogram of time spent in WAITING phase for request.");
  hist(b, "vllm:request_inference_time_seconds", l, n, H(inference),
       "Histogram of time spent in RUNNING phase for request.");
  hist(b, "vllm:request_prefill_time_seconds", l, n, H(prefill),
       "Histogram of time spent in PREFILL phase for request.");
  hist(b, "vllm:request_decode_time_seconds", l, n, H(decode), "Histogram of time spent in DECODE phase for request.");
  hist(b, "vllm:request_prompt_tokens", l, n, H(prompt_tokens), "Number of prefill tokens processed.");
  hist(b, "vllm:request_generation_tokens", l, n, H(generation_tokens), "Number of generation tokens processed.");
  hist(b, "vllm:request_max_num_generation_tokens", l, n, H(max_tokens),
       "Histogram of maximum number of requested generation tokens.");
#undef H
  free(l);
}
