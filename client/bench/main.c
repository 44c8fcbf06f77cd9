/* servd-bench: command line. See docs/benchmarking.md. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static void usage(FILE *f) {
  fprintf(f, "usage: servd-bench [options]\n"
             "Load generator for OpenAI-compatible servers (servd, llama.cpp's llama-server, vLLM) and KServe v2.\n"
             "\n"
             "target:\n"
             "  --url URL              http://host:port[/prefix] (default http://127.0.0.1:8000)\n"
             "  --host H, --port P     instead of --url\n"
             "  --api KIND             completions (default), chat, or kserve\n"
             "  --endpoint PATH        request path (default /v1/completions, /v1/chat/completions,\n"
             "                         or /v2/models/MODEL/infer)\n"
             "  --model NAME           model name sent in requests (needed by vLLM and for kserve)\n"
             "  --api-key KEY          sent as 'Authorization: Bearer KEY' (default: $SERVD_BENCH_API_KEY)\n"
             "  --timeout S            per-request timeout in seconds (default 300)\n"
             "load:\n"
             "  --concurrency N        N requests in flight at all times (default 1)\n"
             "  --request-rate R       Poisson arrivals at R requests/s instead\n"
             "  --max-concurrency N    with --request-rate: at most N in flight, others wait (default: no cap)\n"
             "  --num-requests N       measured requests (default 100)\n"
             "  --duration S           or: issue requests for S seconds, then wait for those in flight\n"
             "  --warmup N             requests before measuring, excluded from results (default 0)\n"
             "  --seed N               seeds prompts and arrivals; the same seed repeats the run (default 0)\n"
             "prompts (completions, chat):\n"
             "  --input-len N          random prompts of about N tokens (default 128)\n"
             "  --shared-prefix-len N  random prompts start with a shared prefix of about N tokens (default 0),\n"
             "                         then --input-len tokens of their own (prefix caching workloads)\n"
             "  --prefixes K           K distinct shared prefixes, request i takes prefix i mod K (default 1)\n"
             "  --output-len N         max_tokens (default 128; with --dataset: estimated from the reply)\n"
             "  --dataset FILE         ShareGPT conversations (JSONL or JSON array): first human turn\n"
             "  --no-ignore-eos        do not send ignore_eos: true (sent by default so outputs have their length)\n"
             "  --no-min-tokens        do not send min_tokens = max_tokens along with ignore_eos\n"
             "  --usage                ask for stream_options.include_usage; the server's count is shown beside ours\n"
             "  --temperature T        send this temperature (default: not sent)\n"
             "  --extra-body JSON      object merged into every request body\n"
             "  --count-tokens MODE    chunks (default): one token per non-empty stream chunk;\n"
             "                         tokenize: count the streamed text and prompt with the server's /tokenize\n"
             "multi-turn chat (completions, chat):\n"
             "  --conversations N      N conversations of --turns turns each (N x T measured requests); every\n"
             "                         turn resends the whole history: the shared prefix as system prompt,\n"
             "                         each earlier user turn (--input-len tokens) and the answer streamed\n"
             "  --turns T              turns per conversation (default 1)\n"
             "  --think-time S         pause between an answer and the conversation's next turn (default 0)\n"
             "kserve:\n"
             "  --shape D1,D2,...      input tensor shape (default 1,16)\n"
             "  --datatype T           FP32 (default), FP64, FP16, INT8..INT64, UINT8..UINT64, BOOL, BYTES\n"
             "  --input-name NAME      input tensor name (default input)\n"
             "output:\n"
             "  --json FILE            write results as JSON (schema: client/bench-result.schema.json)\n"
             "  --per-request          include every request (TTFT, ITL list, error) in the JSON\n"
             "  --json-format F        servd (default) or vllm: the flat keys of vLLM's benchmark_serving\n"
             "                         (mean_ttft_ms, p99_itl_ms, request_throughput, output_throughput, ...)\n"
             "  --metric-percentiles L percentiles written as p<P>_*_ms in the vllm format (default 99)\n"
             "  --goodput SLO...       goodput: requests/s of those meeting every objective, each ttft:MS,\n"
             "                         tpot:MS or e2el:MS (\"--goodput ttft:500 tpot:50\", as vLLM's bench)\n"
             "  --quiet                no table on stdout\n"
             "Ctrl-C stops issuing and reports what finished; a second Ctrl-C abandons requests in flight.\n"
             "exit status: 0 when the run finished and at least one request succeeded, 1 when none did,\n"
             "2 for bad options or setup failures.\n");
}

static int parse_long(const char *opt, const char *s, long min, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min) {
    fprintf(stderr, "servd-bench: %s expects an integer >= %ld, got '%s'\n", opt, min, s);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_double(const char *opt, const char *s, double min, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= min)) {
    fprintf(stderr, "servd-bench: %s expects a number >= %g, got '%s'\n", opt, min, s);
    return -1;
  }
  *out = v;
  return 0;
}

/* http://host[:port][/prefix]; https is not supported (put a TLS proxy in front). */
static int parse_url(bench_config *cfg, const char *url) {
  const char *p = url;
  if (strncmp(p, "http://", 7) == 0) {
    p += 7;
  } else if (strstr(p, "://")) {
    fprintf(stderr, "servd-bench: --url %s: only http:// is supported\n", url);
    return -1;
  }
  const char *slash = strchr(p, '/');
  size_t hostport = slash ? (size_t)(slash - p) : strlen(p);
  char hp[sizeof cfg->host];
  if (hostport == 0 || hostport >= sizeof hp) {
    fprintf(stderr, "servd-bench: --url %s: expected http://host[:port][/prefix]\n", url);
    return -1;
  }
  memcpy(hp, p, hostport);
  hp[hostport] = '\0';
  char *colon = NULL;
  if (hp[0] == '[') { /* [v6addr]:port */
    char *close = strchr(hp, ']');
    if (!close) {
      fprintf(stderr, "servd-bench: --url %s: unterminated [\n", url);
      return -1;
    }
    *close = '\0';
    snprintf(cfg->host, sizeof cfg->host, "%s", hp + 1);
    if (close[1] == ':') colon = close + 1;
  } else {
    colon = strrchr(hp, ':');
    if (colon) *colon = '\0';
    snprintf(cfg->host, sizeof cfg->host, "%s", hp);
  }
  if (colon) {
    long port;
    if (parse_long("--url port", colon + 1, 1, &port) || port > 65535) return -1;
    cfg->port = (int)port;
  } else {
    cfg->port = 80;
  }
  snprintf(cfg->base_path, sizeof cfg->base_path, "%s", slash ? slash : "");
  size_t bl = strlen(cfg->base_path);
  while (bl && cfg->base_path[bl - 1] == '/') cfg->base_path[--bl] = '\0';
  return 0;
}

static int parse_shape(bench_config *cfg, const char *s) {
  cfg->ndim = 0;
  const char *p = s;
  int64_t count = 1;
  while (*p) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (errno || end == p || v < 1 || v > (1LL << 30) || cfg->ndim == BENCH_MAX_DIMS) goto bad;
    cfg->shape[cfg->ndim++] = v;
    count *= v;
    if (count > (1LL << 26)) { /* 64 Mi elements: the JSON body would be gigabytes */
      fprintf(stderr, "servd-bench: --shape %s has more than 2^26 elements\n", s);
      return -1;
    }
    p = end;
    if (*p == ',' || *p == 'x') p++;
    else if (*p) goto bad;
  }
  if (cfg->ndim) return 0;
bad:
  fprintf(stderr,
          "servd-bench: --shape expects up to %d positive integers like 1,3,224,224, "
          "got '%s'\n",
          BENCH_MAX_DIMS, s);
  return -1;
}

/* "50,75,95,99": each in (0, 100]. */
static int parse_percentiles(bench_config *cfg, const char *s) {
  cfg->n_percentiles = 0;
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    double v = strtod(p, &end);
    if (errno || end == p || !(v > 0 && v <= 100) || cfg->n_percentiles == BENCH_MAX_PERCENTILES ||
        (*end && *end != ',')) {
      fprintf(stderr,
              "servd-bench: --metric-percentiles expects up to %d numbers in (0, 100] like 50,90,99, got '%s'\n",
              BENCH_MAX_PERCENTILES, s);
      return -1;
    }
    cfg->percentiles[cfg->n_percentiles++] = v;
    p = *end ? end + 1 : end;
  }
  if (cfg->n_percentiles == 0) {
    fprintf(stderr, "servd-bench: --metric-percentiles is empty\n");
    return -1;
  }
  return 0;
}

static bool known_datatype(const char *t) {
  static const char *const types[] = {"BOOL",  "UINT8", "UINT16", "UINT32", "UINT64", "INT8",  "INT16", "INT32",
                                      "INT64", "FP16",  "BF16",   "FP32",   "FP64",   "BYTES", NULL};
  for (int i = 0; types[i]; i++)
    if (strcmp(t, types[i]) == 0) return true;
  return false;
}

enum {
  OPT_URL = 256,
  OPT_HOST,
  OPT_PORT,
  OPT_API,
  OPT_ENDPOINT,
  OPT_MODEL,
  OPT_KEY,
  OPT_TIMEOUT,
  OPT_CONC,
  OPT_RATE,
  OPT_MAXCONC,
  OPT_NUM,
  OPT_DUR,
  OPT_WARM,
  OPT_SEED,
  OPT_IN,
  OPT_OUT,
  OPT_PREFIX_LEN,
  OPT_PREFIXES,
  OPT_DATASET,
  OPT_NO_EOS,
  OPT_NO_MIN,
  OPT_USAGE,
  OPT_TEMP,
  OPT_EXTRA,
  OPT_COUNT,
  OPT_SHAPE,
  OPT_DTYPE,
  OPT_INAME,
  OPT_JSON,
  OPT_JSON_FORMAT,
  OPT_PERCENTILES,
  OPT_GOODPUT,
  OPT_CONVS,
  OPT_TURNS,
  OPT_THINK,
  OPT_PERREQ,
  OPT_QUIET,
  OPT_HELP
};

static const struct option kOptions[] = {
    {"url", required_argument, 0, OPT_URL},
    {"host", required_argument, 0, OPT_HOST},
    {"port", required_argument, 0, OPT_PORT},
    {"api", required_argument, 0, OPT_API},
    {"backend", required_argument, 0, OPT_API},
    {"endpoint", required_argument, 0, OPT_ENDPOINT},
    {"model", required_argument, 0, OPT_MODEL},
    {"api-key", required_argument, 0, OPT_KEY},
    {"timeout", required_argument, 0, OPT_TIMEOUT},
    {"concurrency", required_argument, 0, OPT_CONC},
    {"request-rate", required_argument, 0, OPT_RATE},
    {"max-concurrency", required_argument, 0, OPT_MAXCONC},
    {"num-requests", required_argument, 0, OPT_NUM},
    {"duration", required_argument, 0, OPT_DUR},
    {"warmup", required_argument, 0, OPT_WARM},
    {"seed", required_argument, 0, OPT_SEED},
    {"input-len", required_argument, 0, OPT_IN},
    {"shared-prefix-len", required_argument, 0, OPT_PREFIX_LEN},
    {"prefixes", required_argument, 0, OPT_PREFIXES},
    {"output-len", required_argument, 0, OPT_OUT},
    {"dataset", required_argument, 0, OPT_DATASET},
    {"no-ignore-eos", no_argument, 0, OPT_NO_EOS},
    {"no-min-tokens", no_argument, 0, OPT_NO_MIN},
    {"usage", no_argument, 0, OPT_USAGE},
    {"temperature", required_argument, 0, OPT_TEMP},
    {"extra-body", required_argument, 0, OPT_EXTRA},
    {"count-tokens", required_argument, 0, OPT_COUNT},
    {"shape", required_argument, 0, OPT_SHAPE},
    {"datatype", required_argument, 0, OPT_DTYPE},
    {"input-name", required_argument, 0, OPT_INAME},
    {"json", required_argument, 0, OPT_JSON},
    {"json-format", required_argument, 0, OPT_JSON_FORMAT},
    {"metric-percentiles", required_argument, 0, OPT_PERCENTILES},
    {"goodput", required_argument, 0, OPT_GOODPUT},
    {"conversations", required_argument, 0, OPT_CONVS},
    {"turns", required_argument, 0, OPT_TURNS},
    {"think-time", required_argument, 0, OPT_THINK},
    {"per-request", no_argument, 0, OPT_PERREQ},
    {"quiet", no_argument, 0, OPT_QUIET},
    {"help", no_argument, 0, OPT_HELP},
    {0, 0, 0, 0},
};

/* The argv recorded in the JSON, with the API key's value blanked out. */
static char **redacted_argv(int argc, char **argv) {
  char **out = calloc((size_t)argc + 1, sizeof *out);
  if (!out) return NULL;
  for (int i = 0; i < argc; i++) {
    out[i] = argv[i];
    if (i > 0 && strcmp(argv[i - 1], "--api-key") == 0) out[i] = "***";
    if (strncmp(argv[i], "--api-key=", 10) == 0) out[i] = "--api-key=***";
  }
  return out;
}

static int parse_args(bench_config *cfg, int argc, char **argv) {
  long l;
  double d;
  bool host_set = false, port_set = false, url_set = false;
  const char *endpoint_arg = NULL;
  bool out_set = false;
  int c;
  while ((c = getopt_long(argc, argv, "h", kOptions, NULL)) != -1) {
    const char *a = optarg;
    const char *name = NULL;
    for (const struct option *o = kOptions; o->name; o++)
      if (o->val == c) {
        name = o->name;
        break;
      }
    char opt[40];
    snprintf(opt, sizeof opt, "--%s", name ? name : "?");
    switch (c) {
    case OPT_URL:
      if (parse_url(cfg, a)) return -1;
      url_set = true;
      break;
    case OPT_HOST:
      snprintf(cfg->host, sizeof cfg->host, "%s", a);
      host_set = true;
      break;
    case OPT_PORT:
      if (parse_long(opt, a, 1, &l) || l > 65535) return -1;
      cfg->port = (int)l;
      port_set = true;
      break;
    case OPT_API:
      if (strcmp(a, "completions") == 0) cfg->api = BENCH_API_COMPLETIONS;
      else if (strcmp(a, "chat") == 0) cfg->api = BENCH_API_CHAT;
      else if (strcmp(a, "kserve") == 0) cfg->api = BENCH_API_KSERVE;
      else {
        fprintf(stderr, "servd-bench: --api expects completions, chat or kserve, got '%s'\n", a);
        return -1;
      }
      break;
    case OPT_ENDPOINT:
      if (a[0] != '/' || strlen(a) >= 1024) {
        fprintf(stderr, "servd-bench: --endpoint expects a path starting with '/', got '%s'\n", a);
        return -1;
      }
      endpoint_arg = a;
      break;
    case OPT_MODEL: cfg->model = a; break;
    case OPT_KEY: cfg->api_key = a; break;
    case OPT_TIMEOUT:
      if (parse_double(opt, a, 0.001, &d)) return -1;
      cfg->timeout_s = d;
      break;
    case OPT_CONC:
      if (parse_long(opt, a, 1, &l) || l > 100000) return -1;
      cfg->concurrency = (int)l;
      break;
    case OPT_RATE:
      if (parse_double(opt, a, 1e-6, &d)) return -1;
      cfg->request_rate = d;
      break;
    case OPT_MAXCONC:
      if (parse_long(opt, a, 1, &l) || l > 100000) return -1;
      cfg->max_concurrency = (int)l;
      break;
    case OPT_NUM:
      if (parse_long(opt, a, 1, &l)) return -1;
      cfg->num_requests = l;
      break;
    case OPT_DUR:
      if (parse_double(opt, a, 0.001, &d)) return -1;
      cfg->duration_s = d;
      break;
    case OPT_WARM:
      if (parse_long(opt, a, 0, &l) || l > 1000000) return -1;
      cfg->warmup = (int)l;
      break;
    case OPT_SEED:
      if (parse_long(opt, a, 0, &l)) return -1;
      cfg->seed = (uint64_t)l;
      break;
    case OPT_IN:
      if (parse_long(opt, a, 1, &l) || l > 10000000) return -1;
      cfg->input_len = (int)l;
      break;
    case OPT_PREFIX_LEN:
      if (parse_long(opt, a, 0, &l) || l > 10000000) return -1;
      cfg->shared_prefix_len = (int)l;
      break;
    case OPT_PREFIXES:
      if (parse_long(opt, a, 1, &l) || l > 1000000) return -1;
      cfg->prefixes = (int)l;
      break;
    case OPT_OUT:
      if (parse_long(opt, a, 1, &l) || l > 10000000) return -1;
      cfg->output_len = (int)l;
      out_set = true;
      break;
    case OPT_DATASET: cfg->dataset = a; break;
    case OPT_NO_EOS: cfg->ignore_eos = false; break;
    case OPT_NO_MIN: cfg->min_tokens = false; break;
    case OPT_USAGE: cfg->include_usage = true; break;
    case OPT_TEMP:
      if (parse_double(opt, a, 0, &d)) return -1;
      cfg->temperature = d;
      break;
    case OPT_EXTRA: {
      json_error_t jerr;
      json_t *j = json_loads(a, 0, &jerr);
      bool ok = json_is_object(j);
      json_decref(j);
      if (!ok) {
        fprintf(stderr, "servd-bench: --extra-body expects a JSON object: %s\n", j ? "not an object" : jerr.text);
        return -1;
      }
      cfg->extra_body = a;
      break;
    }
    case OPT_COUNT:
      if (strcmp(a, "chunks") == 0) cfg->count_mode = BENCH_COUNT_CHUNKS;
      else if (strcmp(a, "tokenize") == 0) cfg->count_mode = BENCH_COUNT_TOKENIZE;
      else {
        fprintf(stderr, "servd-bench: --count-tokens expects chunks or tokenize, got '%s'\n", a);
        return -1;
      }
      break;
    case OPT_SHAPE:
      if (parse_shape(cfg, a)) return -1;
      break;
    case OPT_DTYPE:
      if (!known_datatype(a)) {
        fprintf(stderr, "servd-bench: --datatype '%s' is not a KServe v2 datatype\n", a);
        return -1;
      }
      cfg->datatype = a;
      break;
    case OPT_INAME: cfg->input_name = a; break;
    case OPT_JSON: cfg->json_path = a; break;
    case OPT_JSON_FORMAT:
      if (strcmp(a, "servd") == 0) cfg->json_format = BENCH_JSON_SERVD;
      else if (strcmp(a, "vllm") == 0) cfg->json_format = BENCH_JSON_VLLM;
      else {
        fprintf(stderr, "servd-bench: --json-format expects servd or vllm, got '%s'\n", a);
        return -1;
      }
      break;
    case OPT_PERCENTILES:
      if (parse_percentiles(cfg, a)) return -1;
      break;
    case OPT_GOODPUT: {
      char err[160];
      if (bench_slo_parse(a, &cfg->goodput, err, sizeof err)) {
        fprintf(stderr, "servd-bench: --goodput: %s\n", err);
        return -1;
      }
      cfg->has_goodput = true;
      break;
    }
    case OPT_CONVS:
      if (parse_long(opt, a, 1, &l) || l > 1000000) return -1;
      cfg->conversations = (int)l;
      break;
    case OPT_TURNS:
      if (parse_long(opt, a, 1, &l) || l > 10000) return -1;
      cfg->turns = (int)l;
      break;
    case OPT_THINK:
      if (parse_double(opt, a, 0, &d) || d > 86400) return -1;
      cfg->think_time_s = d;
      break;
    case OPT_PERREQ: cfg->per_request = true; break;
    case OPT_QUIET: cfg->quiet = true; break;
    case OPT_HELP:
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); return -1;
    }
  }
  /* "--goodput ttft:500 tpot:50" as vLLM takes it: getopt leaves the later objectives as operands */
  for (; optind < argc; optind++) {
    char err[160];
    if (!cfg->has_goodput || !strchr(argv[optind], ':') ||
        bench_slo_parse(argv[optind], &cfg->goodput, err, sizeof err)) {
      fprintf(stderr, "servd-bench: unexpected argument '%s'\n", argv[optind]);
      return -1;
    }
  }
  if (cfg->turns > 1 && cfg->conversations == 0) {
    fprintf(stderr, "servd-bench: --turns goes with --conversations\n");
    return -1;
  }
  if (cfg->conversations > 0) {
    if (cfg->api == BENCH_API_KSERVE || cfg->dataset || cfg->request_rate > 0 || cfg->duration_s > 0 ||
        cfg->count_mode == BENCH_COUNT_TOKENIZE) {
      fprintf(stderr, "servd-bench: --conversations runs at a --concurrency with random prompts; it does "
                      "not go with --api kserve, --dataset, --request-rate, --duration or --count-tokens "
                      "tokenize\n");
      return -1;
    }
    if (cfg->num_requests > 0) {
      fprintf(stderr, "servd-bench: --conversations N --turns T makes N x T requests; leave out --num-requests\n");
      return -1;
    }
    cfg->num_requests = (long)cfg->conversations * cfg->turns;
  }
  if (url_set && (host_set || port_set)) {
    fprintf(stderr, "servd-bench: give either --url or --host/--port\n");
    return -1;
  }
  if (cfg->concurrency > 0 && cfg->request_rate > 0) {
    fprintf(stderr, "servd-bench: give either --concurrency or --request-rate\n");
    return -1;
  }
  if (cfg->max_concurrency > 0 && cfg->request_rate <= 0) {
    fprintf(stderr, "servd-bench: --max-concurrency goes with --request-rate\n");
    return -1;
  }
  if (cfg->concurrency == 0 && cfg->request_rate <= 0) cfg->concurrency = 1;
  if (cfg->num_requests > 0 && cfg->duration_s > 0) {
    fprintf(stderr, "servd-bench: give either --num-requests or --duration\n");
    return -1;
  }
  if (cfg->num_requests == 0 && cfg->duration_s <= 0) cfg->num_requests = 100;
  if (cfg->dataset && cfg->api == BENCH_API_KSERVE) {
    fprintf(stderr, "servd-bench: --dataset is for completions and chat, not kserve\n");
    return -1;
  }
  if (!out_set && cfg->dataset) cfg->output_len = 0; /* sized after each reply */
  if (cfg->api == BENCH_API_KSERVE && !cfg->model) {
    fprintf(stderr, "servd-bench: --api kserve needs --model\n");
    return -1;
  }
  if (!endpoint_arg) {
    if (cfg->api == BENCH_API_KSERVE)
      snprintf(cfg->endpoint, sizeof cfg->endpoint, "%s/v2/models/%s/infer", cfg->base_path, cfg->model);
    else
      snprintf(cfg->endpoint, sizeof cfg->endpoint, "%s%s", cfg->base_path,
               cfg->api == BENCH_API_CHAT ? "/v1/chat/completions" : "/v1/completions");
  } else {
    snprintf(cfg->endpoint, sizeof cfg->endpoint, "%s%.1024s", cfg->base_path, endpoint_arg);
  }
  return 0;
}

int main(int argc, char **argv) {
  bench_config cfg;
  memset(&cfg, 0, sizeof cfg);
  snprintf(cfg.host, sizeof cfg.host, "127.0.0.1");
  cfg.port = 8000;
  cfg.timeout_s = 300;
  cfg.input_len = 128;
  cfg.prefixes = 1;
  cfg.output_len = 128;
  cfg.ignore_eos = true;
  cfg.min_tokens = true;
  cfg.temperature = -1;
  cfg.shape[0] = 1;
  cfg.shape[1] = 16;
  cfg.ndim = 2;
  cfg.datatype = "FP32";
  cfg.input_name = "input";
  cfg.turns = 1;
  cfg.goodput = (bench_slo){-1, -1, -1};
  cfg.percentiles[0] = 99;
  cfg.n_percentiles = 1;
  const char *env_key = getenv("SERVD_BENCH_API_KEY");
  if (env_key && *env_key) cfg.api_key = env_key;
  if (parse_args(&cfg, argc, argv)) return 2;
  /* a write to a connection the server has closed must fail with EPIPE, not kill the process */
  signal(SIGPIPE, SIG_IGN);
  cfg.argc = argc;
  cfg.argv = redacted_argv(argc, argv);
  if (!cfg.argv) return 2;

  int rc = 2;
  bench_results res;
  memset(&res, 0, sizeof res);
  bench_prompts *prompts = NULL;
  if (cfg.api != BENCH_API_KSERVE) {
    prompts = bench_prompts_create(&cfg);
    if (!prompts) goto done;
  }
  bench_spec_counts spec0, spec1;
  bool spec = cfg.api != BENCH_API_KSERVE && bench_spec_scrape(&cfg, &spec0);
  if (bench_run(&cfg, prompts, &res)) goto done;
  if (spec && bench_spec_scrape(&cfg, &spec1)) {
    res.spec_seen = true;
    res.spec = (bench_spec_counts){spec1.drafts - spec0.drafts, spec1.draft_tokens - spec0.draft_tokens,
                                   spec1.accepted - spec0.accepted};
  }
  if (!cfg.quiet) bench_report_table(&cfg, &res);
  if (cfg.json_path && bench_report_json(&cfg, &res, cfg.json_path)) goto done;
  rc = res.completed > 0 ? 0 : 1;
done:
  bench_results_free(&res);
  bench_prompts_destroy(prompts);
  free(cfg.argv);
  return rc;
}
