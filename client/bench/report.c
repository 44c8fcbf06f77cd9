/* Results as a table on stdout and as JSON (schema: client/bench-result.schema.json, described in
 * docs/benchmarking.md). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static const char *api_name(bench_api a) {
  return a == BENCH_API_CHAT ? "chat" : a == BENCH_API_KSERVE ? "kserve" : "completions";
}

static const char *count_name(bench_count_mode m) { return m == BENCH_COUNT_TOKENIZE ? "tokenize" : "chunks"; }

/* "ttft<=500 ms, tpot<=50 ms" */
static void slo_text(const bench_slo *g, char *buf, size_t cap) {
  int n = 0;
  buf[0] = '\0';
  const char *names[3] = {"ttft", "tpot", "e2el"};
  double v[3] = {g->ttft_ms, g->tpot_ms, g->e2el_ms};
  for (int i = 0; i < 3; i++)
    if (v[i] >= 0 && n >= 0 && (size_t)n < cap)
      n += snprintf(buf + n, cap - (size_t)n, "%s%s<=%g ms", n ? ", " : "", names[i], v[i]);
}

static void row(const char *name, const bench_summary *s) {
  if (s->count == 0) {
    printf("  %-6s %9s %9s %9s %9s %9s %9s %9s %7s\n", name, "-", "-", "-", "-", "-", "-", "-", "0");
    return;
  }
  printf("  %-6s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %7ld\n", name, s->mean, s->median, s->p75, s->p90, s->p95,
         s->p99, s->max, s->count);
}

void bench_report_table(const bench_config *cfg, const bench_results *res) {
  bool llm = cfg->api != BENCH_API_KSERVE;
  printf("==================== servd-bench ====================\n");
  printf("%-34s http://%s:%d%s\n", "Target:", cfg->host, cfg->port, cfg->endpoint);
  printf("%-34s %s%s%s\n", "API / model:", api_name(cfg->api), cfg->model ? " / " : "", cfg->model ? cfg->model : "");
  if (cfg->request_rate > 0) {
    printf("%-34s rate %.3g req/s (Poisson, seed %llu), max concurrency ", "Load:", cfg->request_rate,
           (unsigned long long)cfg->seed);
    if (cfg->max_concurrency > 0) printf("%d\n", cfg->max_concurrency);
    else printf("unlimited\n");
  } else {
    printf("%-34s concurrency %d\n", "Load:", cfg->concurrency);
  }
  if (cfg->conversations > 0)
    printf("%-34s %d conversations x %d turns, think time %.3g s\n", "Multi-turn:", cfg->conversations, cfg->turns,
           cfg->think_time_s);
  printf("%-34s %ld completed, %ld failed (%d warm-up excluded, %ld of them failed)\n", "Requests:", res->completed,
         res->failed, cfg->warmup, res->warmup_failed);
  if (res->interrupted) printf("%-34s %s\n", "Interrupted:", "yes, results cover what finished");
  printf("%-34s %.3f\n", "Duration (s):", res->duration_s);
  printf("%-34s %.3f\n", "Request throughput (req/s):", res->requests_per_s);
  if (cfg->has_goodput) {
    char slo[96];
    slo_text(&cfg->goodput, slo, sizeof slo);
    printf("%-34s %.3f (%ld requests met %s)\n", "Request goodput (req/s):", res->goodput_per_s, res->good, slo);
  }
  if (llm) {
    printf("%-34s %ld (%s)\n", "Input tokens:", res->input_tokens,
           res->counted_by == BENCH_COUNT_TOKENIZE ? "counted by /tokenize"
           : cfg->dataset                          ? "estimated, 4 characters per token"
                                                   : "requested");
    printf("%-34s %ld (%s; %ld non-empty chunks)\n", "Output tokens:", res->output_tokens,
           res->counted_by == BENCH_COUNT_TOKENIZE ? "counted by /tokenize" : "one per non-empty stream chunk",
           res->output_chunks);
    if (res->usage_output_tokens >= 0)
      printf("%-34s %ld\n", "Output tokens (server's usage):", res->usage_output_tokens);
    printf("%-34s %.2f\n", "Output token throughput (tok/s):", res->output_tokens_per_s);
    printf("%-34s %.2f\n", "Total token throughput (tok/s):", res->total_tokens_per_s);
    if (res->spec_seen) {
      const bench_spec_counts *c = &res->spec;
      printf("%-34s %.0f of %.0f drafts accepted (%.1f%%) in %.0f verify rows, %.2f tokens a row\n",
             "Speculation (server):", c->accepted, c->draft_tokens,
             c->draft_tokens > 0 ? 100.0 * c->accepted / c->draft_tokens : 0.0, c->drafts,
             c->drafts > 0 ? 1.0 + c->accepted / c->drafts : 0.0);
    }
  }
  printf("---------------------- latency (ms) ----------------\n");
  printf("  %-6s %9s %9s %9s %9s %9s %9s %9s %7s\n", "", "mean", "median", "p75", "p90", "p95", "p99", "max", "n");
  if (llm) {
    row("TTFT", &res->ttft);
    row("TPOT", &res->tpot);
    row("ITL", &res->itl);
  }
  row("E2E", &res->e2e);
  printf("---------------------- errors ----------------------\n");
  printf(" ");
  for (int e = 1; e < BENCH_ERR__COUNT; e++) printf(" %s %ld", bench_err_name(e), res->errors[e]);
  printf("\n");
  if (res->errors[BENCH_ERR_HTTP]) {
    printf("  by status:");
    for (int s = 0; s < 600; s++)
      if (res->http_status_count[s]) printf(" %d x%ld", s, res->http_status_count[s]);
    printf("\n");
  }
  if (res->first_error[0]) printf("  first: %s\n", res->first_error);
  if (res->tokenize_error[0]) printf("  /tokenize: %s (fell back to chunks)\n", res->tokenize_error);
  printf("====================================================\n");
  fflush(stdout);
}

static json_t *summary_json(const bench_summary *s) {
  return json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "count", (json_int_t)s->count, "mean", s->mean,
                   "median", s->median, "p75", s->p75, "p90", s->p90, "p95", s->p95, "p99", s->p99, "min", s->min,
                   "max", s->max, "stddev", s->stddev);
}

static json_t *nullable_int(long v) { return v >= 0 ? json_integer(v) : json_null(); }
static json_t *nullable_str(const char *s) { return s ? json_string(s) : json_null(); }

static json_t *nullable_ms(double v) { return v >= 0 ? json_real(v) : json_null(); }

static json_t *slo_json(const bench_slo *g) {
  return json_pack("{s:o, s:o, s:o}", "ttft_ms", nullable_ms(g->ttft_ms), "tpot_ms", nullable_ms(g->tpot_ms), "e2el_ms",
                   nullable_ms(g->e2el_ms));
}

static json_t *config_json(const bench_config *cfg) {
  json_t *c = json_object();
  char url[1024];
  snprintf(url, sizeof url, "http://%s:%d%s", cfg->host, cfg->port, cfg->base_path);
  json_object_set_new(c, "url", json_string(url));
  json_object_set_new(c, "endpoint", json_string(cfg->endpoint));
  json_object_set_new(c, "api", json_string(api_name(cfg->api)));
  json_object_set_new(c, "model", nullable_str(cfg->model));
  json_object_set_new(c, "api_key_set", json_boolean(cfg->api_key != NULL));
  json_object_set_new(c, "load", json_string(cfg->request_rate > 0 ? "rate" : "concurrency"));
  json_object_set_new(c, "concurrency", cfg->request_rate > 0 ? json_null() : json_integer(cfg->concurrency));
  json_object_set_new(c, "request_rate", cfg->request_rate > 0 ? json_real(cfg->request_rate) : json_null());
  json_object_set_new(c, "max_concurrency",
                      cfg->max_concurrency > 0 ? json_integer(cfg->max_concurrency) : json_null());
  json_object_set_new(c, "num_requests", cfg->num_requests > 0 ? json_integer(cfg->num_requests) : json_null());
  json_object_set_new(c, "duration_s", cfg->duration_s > 0 ? json_real(cfg->duration_s) : json_null());
  json_object_set_new(c, "warmup", json_integer(cfg->warmup));
  json_object_set_new(c, "timeout_s", json_real(cfg->timeout_s));
  json_object_set_new(c, "seed", json_integer((json_int_t)cfg->seed));
  if (cfg->api == BENCH_API_KSERVE) {
    json_t *shape = json_array();
    for (int i = 0; i < cfg->ndim; i++) json_array_append_new(shape, json_integer(cfg->shape[i]));
    json_object_set_new(
        c, "kserve",
        json_pack("{s:o, s:s, s:s}", "shape", shape, "datatype", cfg->datatype, "input_name", cfg->input_name));
  } else {
    json_object_set_new(c, "prompts", json_string(cfg->dataset ? "dataset" : "random"));
    json_object_set_new(c, "dataset", nullable_str(cfg->dataset));
    json_object_set_new(c, "input_len", cfg->dataset ? json_null() : json_integer(cfg->input_len));
    json_object_set_new(c, "shared_prefix_len", json_integer(cfg->dataset ? 0 : cfg->shared_prefix_len));
    json_object_set_new(c, "prefixes", json_integer(cfg->prefixes));
    json_object_set_new(c, "output_len", cfg->output_len > 0 ? json_integer(cfg->output_len) : json_null());
    json_object_set_new(c, "ignore_eos", json_boolean(cfg->ignore_eos));
    json_object_set_new(c, "min_tokens", json_boolean(cfg->ignore_eos && cfg->min_tokens));
    json_object_set_new(c, "include_usage", json_boolean(cfg->include_usage));
    json_object_set_new(c, "temperature", cfg->temperature >= 0 ? json_real(cfg->temperature) : json_null());
    json_object_set_new(c, "extra_body", nullable_str(cfg->extra_body));
    json_object_set_new(c, "count_tokens", json_string(count_name(cfg->count_mode)));
    json_object_set_new(c, "multi_turn",
                        cfg->conversations > 0 ? json_pack("{s:i, s:i, s:f}", "conversations", cfg->conversations,
                                                           "turns", cfg->turns, "think_time_s", cfg->think_time_s)
                                               : json_null());
  }
  json_object_set_new(c, "goodput", cfg->has_goodput ? slo_json(&cfg->goodput) : json_null());
  return c;
}

static json_t *request_json(const bench_config *cfg, const bench_record *rec) {
  json_t *o = json_object();
  bool ok = rec->err == BENCH_OK;
  json_object_set_new(o, "ok", json_boolean(ok));
  json_object_set_new(o, "error", ok ? json_null() : json_string(bench_err_name(rec->err)));
  json_object_set_new(o, "error_message", ok ? json_null() : json_string(rec->errmsg));
  json_object_set_new(o, "http_status", rec->http_status ? json_integer(rec->http_status) : json_null());
  json_object_set_new(o, "prompt_index", json_integer(rec->prompt_index));
  json_object_set_new(o, "e2e_ms", json_real((double)(rec->t_end - rec->t_start) / 1e6));
  if (cfg->api == BENCH_API_KSERVE) return o;
  json_object_set_new(o, "ttft_ms",
                      rec->t_first ? json_real((double)(rec->t_first - rec->t_start) / 1e6) : json_null());
  json_object_set_new(o, "input_tokens", json_integer(rec->in_tokens));
  if (rec->conversation >= 0) {
    json_object_set_new(o, "conversation", json_integer(rec->conversation));
    json_object_set_new(o, "turn", json_integer(rec->turn));
  }
  json_object_set_new(o, "output_tokens", json_integer(rec->out_tokens));
  json_object_set_new(o, "output_chunks", json_integer(rec->out_chunks));
  json_object_set_new(o, "usage_output_tokens", nullable_int(rec->usage_completion_tokens));
  json_t *itl = json_array();
  for (int i = 0; i < rec->n_itl; i++) json_array_append_new(itl, json_real(rec->itl_ms[i]));
  json_object_set_new(o, "itl_ms", itl);
  return o;
}

/* vLLM's benchmark_serving result: flat keys, times in ms (per-request lists in seconds, as vLLM). */
static json_t *vllm_json(const bench_config *cfg, const bench_results *res) {
  json_t *o = json_object();
  json_object_set_new(o, "date", json_string(res->started_at));
  json_object_set_new(o, "backend", json_string(cfg->api == BENCH_API_CHAT ? "openai-chat" : "openai"));
  json_object_set_new(o, "model_id", nullable_str(cfg->model));
  json_object_set_new(o, "num_prompts", json_integer(cfg->num_requests > 0 ? cfg->num_requests : res->n_records));
  json_object_set_new(o, "request_rate", cfg->request_rate > 0 ? json_real(cfg->request_rate) : json_string("inf"));
  json_object_set_new(o, "max_concurrency",
                      cfg->concurrency > 0       ? json_integer(cfg->concurrency)
                      : cfg->max_concurrency > 0 ? json_integer(cfg->max_concurrency)
                                                 : json_null());
  json_object_set_new(o, "duration", json_real(res->duration_s));
  json_object_set_new(o, "completed", json_integer(res->completed));
  json_object_set_new(o, "failed", json_integer(res->failed));
  json_object_set_new(o, "total_input_tokens", json_integer(res->input_tokens));
  json_object_set_new(o, "total_output_tokens", json_integer(res->output_tokens));
  json_object_set_new(o, "request_throughput", json_real(res->requests_per_s));
  json_object_set_new(o, "request_goodput", cfg->has_goodput ? json_real(res->goodput_per_s) : json_null());
  json_object_set_new(o, "output_throughput", json_real(res->output_tokens_per_s));
  json_object_set_new(o, "total_token_throughput", json_real(res->total_tokens_per_s));
  const struct {
    const char *name;
    const bench_summary *s;
    bench_metric m;
  } metrics[] = {{"ttft", &res->ttft, BENCH_METRIC_TTFT},
                 {"tpot", &res->tpot, BENCH_METRIC_TPOT},
                 {"itl", &res->itl, BENCH_METRIC_ITL},
                 {"e2el", &res->e2e, BENCH_METRIC_E2E}};
  for (size_t m = 0; m < sizeof metrics / sizeof metrics[0]; m++) {
    const bench_summary *s = metrics[m].s;
    double *v;
    long n = bench_metric_samples(res, metrics[m].m, &v);
    bench_summary sorted;
    if (n > 0) bench_summarize(v, n, &sorted); /* sorts v */
    char key[64];
    snprintf(key, sizeof key, "mean_%s_ms", metrics[m].name);
    json_object_set_new(o, key, json_real(s->mean));
    snprintf(key, sizeof key, "median_%s_ms", metrics[m].name);
    json_object_set_new(o, key, json_real(s->median));
    snprintf(key, sizeof key, "std_%s_ms", metrics[m].name);
    json_object_set_new(o, key, json_real(s->stddev));
    for (int i = 0; i < cfg->n_percentiles; i++) {
      /* vLLM names p99 "p99" and p99.9 "p99.9" (Python's str of the number) */
      snprintf(key, sizeof key, "p%g_%s_ms", cfg->percentiles[i], metrics[m].name);
      json_object_set_new(o, key, json_real(n > 0 ? bench_percentile_sorted(v, n, cfg->percentiles[i]) : 0));
    }
    free(v);
  }
  json_t *in = json_array(), *out = json_array(), *ttfts = json_array(), *itls = json_array(), *errs = json_array();
  for (long i = 0; i < res->n_records; i++) {
    const bench_record *rec = &res->records[i];
    bool ok = rec->err == BENCH_OK;
    json_array_append_new(in, json_integer(rec->in_tokens));
    json_array_append_new(out, json_integer(ok ? rec->out_tokens : 0));
    json_array_append_new(ttfts, json_real(ok && rec->t_first ? (double)(rec->t_first - rec->t_start) / 1e9 : 0));
    json_t *gaps = json_array();
    for (int k = 0; ok && k < rec->n_itl; k++) json_array_append_new(gaps, json_real(rec->itl_ms[k] / 1e3));
    json_array_append_new(itls, gaps);
    json_array_append_new(errs, json_string(ok ? "" : rec->errmsg));
  }
  json_object_set_new(o, "input_lens", in);
  json_object_set_new(o, "output_lens", out);
  json_object_set_new(o, "ttfts", ttfts);
  json_object_set_new(o, "itls", itls);
  json_object_set_new(o, "errors", errs);
  return o;
}

int bench_report_json(const bench_config *cfg, const bench_results *res, const char *path) {
  if (cfg->json_format == BENCH_JSON_VLLM) {
    json_t *v = vllm_json(cfg, res);
    int rc = json_dump_file(v, path, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    json_decref(v);
    if (rc) fprintf(stderr, "servd-bench: cannot write --json %s\n", path);
    return rc ? -1 : 0;
  }
  json_t *root = json_object();
  json_object_set_new(root, "schema_version", json_integer(1));
  json_object_set_new(root, "tool", json_string("servd-bench"));
  json_object_set_new(root, "version", json_string(BENCH_VERSION));
  json_object_set_new(root, "started_at", json_string(res->started_at));
  json_t *argv = json_array();
  size_t cmd_len = 0;
  for (int i = 0; i < cfg->argc; i++) {
    json_array_append_new(argv, json_string(cfg->argv[i]));
    cmd_len += strlen(cfg->argv[i]) + 1;
  }
  json_object_set_new(root, "argv", argv);
  char cmd[8192];
  cmd[0] = '\0';
  for (int i = 0, off = 0; i < cfg->argc && (size_t)off < sizeof cmd; i++)
    off += snprintf(cmd + off, sizeof cmd - (size_t)off, "%s%s", i ? " " : "", cfg->argv[i]);
  (void)cmd_len;
  json_object_set_new(root, "command_line", json_string(cmd));
  json_object_set_new(root, "config", config_json(cfg));

  json_t *r = json_object();
  bool llm = cfg->api != BENCH_API_KSERVE;
  json_object_set_new(r, "interrupted", json_boolean(res->interrupted));
  json_object_set_new(r, "duration_s", json_real(res->duration_s));
  json_object_set_new(r, "completed", json_integer(res->completed));
  json_object_set_new(r, "failed", json_integer(res->failed));
  json_object_set_new(r, "warmup_requests", json_integer(cfg->warmup));
  json_object_set_new(r, "warmup_failed", json_integer(res->warmup_failed));
  json_object_set_new(r, "requests_per_s", json_real(res->requests_per_s));
  json_object_set_new(r, "goodput",
                      cfg->has_goodput ? json_pack("{s:I, s:f}", "good_requests", (json_int_t)res->good,
                                                   "requests_per_s", res->goodput_per_s)
                                       : json_null());
  if (llm) {
    json_object_set_new(r, "input_tokens", json_integer(res->input_tokens));
    json_object_set_new(r, "input_tokens_source",
                        json_string(res->counted_by == BENCH_COUNT_TOKENIZE ? "tokenize"
                                    : cfg->dataset                          ? "estimated"
                                                                            : "requested"));
    json_object_set_new(r, "output_tokens", json_integer(res->output_tokens));
    json_object_set_new(r, "output_chunks", json_integer(res->output_chunks));
    json_object_set_new(r, "output_tokens_counted_by", json_string(count_name(res->counted_by)));
    json_object_set_new(r, "usage_output_tokens", nullable_int(res->usage_output_tokens));
    json_object_set_new(
        r, "speculation",
        res->spec_seen ? json_pack("{s:f, s:f, s:f, s:f}", "drafts", res->spec.drafts, "draft_tokens",
                                   res->spec.draft_tokens, "accepted_tokens", res->spec.accepted, "acceptance_rate",
                                   res->spec.draft_tokens > 0 ? res->spec.accepted / res->spec.draft_tokens : 0.0)
                       : json_null());
    json_object_set_new(r, "output_tokens_per_s", json_real(res->output_tokens_per_s));
    json_object_set_new(r, "total_tokens_per_s", json_real(res->total_tokens_per_s));
    json_object_set_new(r, "ttft_ms", summary_json(&res->ttft));
    json_object_set_new(r, "tpot_ms", summary_json(&res->tpot));
    json_object_set_new(r, "itl_ms", summary_json(&res->itl));
  }
  json_object_set_new(r, "e2e_ms", summary_json(&res->e2e));
  json_t *errs = json_object();
  for (int e = 1; e < BENCH_ERR__COUNT; e++) json_object_set_new(errs, bench_err_name(e), json_integer(res->errors[e]));
  json_t *by_status = json_object();
  for (int s = 0; s < 600; s++)
    if (res->http_status_count[s]) {
      char k[8];
      snprintf(k, sizeof k, "%d", s);
      json_object_set_new(by_status, k, json_integer(res->http_status_count[s]));
    }
  json_object_set_new(errs, "http_status", by_status);
  json_object_set_new(r, "errors", errs);
  json_object_set_new(r, "first_error", res->first_error[0] ? json_string(res->first_error) : json_null());
  json_object_set_new(root, "results", r);
  if (cfg->per_request) {
    json_t *reqs = json_array();
    for (long i = 0; i < res->n_records; i++) json_array_append_new(reqs, request_json(cfg, &res->records[i]));
    json_object_set_new(root, "requests", reqs);
  }
  int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
  json_decref(root);
  if (rc) {
    fprintf(stderr, "servd-bench: cannot write --json %s\n", path);
    return -1;
  }
  return 0;
}
