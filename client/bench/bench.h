/* servd-bench: an HTTP load generator for OpenAI-compatible and KServe v2 servers.
 * Internal header shared by the files of client/bench/; nothing outside the client includes it.
 * The client speaks only the public wire protocol and includes nothing from the rest of servd. */
#ifndef SERVD_BENCH_H
#define SERVD_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_VERSION "0.1.0"
#define BENCH_MAX_DIMS 8

typedef enum bench_api {
  BENCH_API_COMPLETIONS = 0, /* POST /v1/completions, stream: true */
  BENCH_API_CHAT = 1,        /* POST /v1/chat/completions, stream: true */
  BENCH_API_KSERVE = 2,      /* POST /v2/models/{m}/infer, one JSON response */
} bench_api;

/* Why a request failed; BENCH_OK for success. Keep in step with bench_err_name(). */
typedef enum bench_err {
  BENCH_OK = 0,
  BENCH_ERR_CONNECT,    /* TCP connect failed or was refused */
  BENCH_ERR_TIMEOUT,    /* no complete response within --timeout */
  BENCH_ERR_HTTP,       /* a response status other than 2xx */
  BENCH_ERR_PARSE,      /* malformed HTTP, SSE or JSON, or a stream without [DONE] */
  BENCH_ERR_DISCONNECT, /* the server closed or reset the connection mid-response */
  BENCH_ERR_STREAM,     /* the server sent an error object inside a 200 stream */
  BENCH_ERR__COUNT
} bench_err;

const char *bench_err_name(int err);

typedef enum bench_count_mode {
  BENCH_COUNT_CHUNKS = 0,   /* one output token per SSE chunk with non-empty text */
  BENCH_COUNT_TOKENIZE = 1, /* after the run, POST the text to the server's /tokenize */
} bench_count_mode;

typedef enum bench_json_format {
  BENCH_JSON_SERVD = 0, /* client/bench-result.schema.json */
  BENCH_JSON_VLLM = 1,  /* the flat keys vLLM's benchmark_serving writes (mean_ttft_ms, p99_itl_ms, ...) */
} bench_json_format;

/* Service-level objectives for goodput (vLLM's --goodput): a request is good when it meets every
 * objective that is set. Milliseconds; < 0: not set. */
typedef struct bench_slo {
  double ttft_ms, tpot_ms, e2el_ms;
} bench_slo;

#define BENCH_MAX_PERCENTILES 16

typedef struct bench_config {
  /* target */
  char host[256];
  int port;
  char base_path[512]; /* URL prefix without trailing '/', often "" */
  char endpoint[1600]; /* full request path, derived from api unless --endpoint */
  bench_api api;
  const char *model;   /* borrowed from argv */
  const char *api_key; /* borrowed from argv or the environment; NULL: no header */
  double timeout_s;
  /* load shape: concurrency > 0 or request_rate > 0 */
  int concurrency;
  double request_rate; /* requests per second, Poisson arrivals */
  int max_concurrency; /* rate mode: cap on requests in flight; 0 = unlimited */
  long num_requests;   /* 0 when duration_s is used */
  double duration_s;   /* 0 when num_requests is used */
  int warmup;
  /* prompts */
  int input_len;         /* random prompts: about this many tokens (after the shared prefix) */
  int shared_prefix_len; /* random prompts: a shared prefix of about this many tokens first (0: none) */
  int prefixes;          /* distinct shared prefixes; request i uses prefix i % prefixes */
  int output_len;        /* max_tokens; 0 with a dataset: estimated from the reply */
  /* multi-turn chat: conversations x turns requests; each turn resends the whole history (the
   * shared prefix as a system prompt, then every user turn and answer) plus a new user turn */
  int conversations; /* 0: single requests */
  int turns;
  double think_time_s; /* pause between a turn's answer and the next turn */
  const char *dataset; /* ShareGPT JSONL or JSON array; NULL: random prompts */
  uint64_t seed;
  bool ignore_eos; /* send ignore_eos: true (and min_tokens unless no_min_tokens) */
  bool min_tokens;
  bool include_usage;     /* send stream_options.include_usage (server's count, for comparison only) */
  const char *extra_body; /* JSON object merged into every request body */
  double temperature;     /* < 0: not sent */
  bench_count_mode count_mode;
  /* KServe v2 */
  int64_t shape[BENCH_MAX_DIMS];
  int ndim;
  const char *datatype;
  const char *input_name;
  /* output */
  const char *json_path;
  bench_json_format json_format;
  bool per_request; /* include every request in the JSON */
  bool has_goodput;
  bench_slo goodput;
  double percentiles[BENCH_MAX_PERCENTILES]; /* --metric-percentiles, for the vLLM-format JSON */
  int n_percentiles;
  bool quiet;
  int argc;
  char **argv;
} bench_config;

/* One measured request. Times are uv_hrtime() nanoseconds. */
typedef struct bench_record {
  int err;                      /* bench_err */
  int http_status;              /* 0 when no status line was read */
  uint64_t t_start;             /* when the request was issued (before connect on a new connection) */
  uint64_t t_first;             /* first non-empty content chunk; 0: none */
  uint64_t t_last;              /* latest non-empty content chunk */
  uint64_t t_end;               /* response complete or failure */
  int in_tokens;                /* requested or estimated prompt tokens; tokenize mode: counted */
  int out_chunks;               /* SSE chunks with non-empty text */
  int out_tokens;               /* counted output tokens (chunks, or /tokenize) */
  long usage_completion_tokens; /* server's claim from a usage object; -1 when absent */
  float *itl_ms;                /* gaps between successive non-empty chunks; owned, capacity itl_cap */
  int n_itl, itl_cap;
  char *text; /* generated text, kept in tokenize mode and for multi-turn histories; owned */
  size_t text_len, text_cap;
  long prompt_index; /* which prompt was sent (multi-turn: conversation x turns + turn) */
  int conversation;  /* multi-turn: which conversation and turn; -1 otherwise */
  int turn;
  char errmsg[128];
} bench_record;

/* Prompts: deterministic for a (seed, index) pair, whatever the scheduling. */
typedef struct bench_prompts bench_prompts;
/* Returns NULL and prints why on failure. */
bench_prompts *bench_prompts_create(const bench_config *cfg);
void bench_prompts_destroy(bench_prompts *p);
/* Prompt text for request number idx (borrowed, valid until the next call), with its estimated
 * input tokens and max_tokens. */
const char *bench_prompts_get(bench_prompts *p, uint64_t idx, int *in_tokens, int *out_tokens);
/* n random words seeded by seed, malloc'ed (about n tokens). */
char *bench_random_words(uint64_t seed, int n);
/* The seed of shared prefix number k (request i takes k = i mod --prefixes). */
uint64_t bench_prefix_seed(const bench_config *cfg, uint64_t k);
long bench_prompts_count(const bench_prompts *p); /* dataset entries; 0 for random prompts */

/* Request bodies. The caller frees the returned string with free(). NULL on failure. */
char *bench_body_openai(const bench_config *cfg, const char *prompt, int max_tokens);
struct json_t;
/* A chat request with this messages array (borrowed). */
char *bench_body_chat_messages(const bench_config *cfg, struct json_t *messages, int max_tokens);
char *bench_body_kserve(const bench_config *cfg, uint64_t seed);
char *bench_body_tokenize(const bench_config *cfg, const char *text, size_t len);

/* Seeded pseudo-random numbers (xoshiro256**, seeded with splitmix64). */
typedef struct bench_rng {
  uint64_t s[4];
} bench_rng;
void bench_rng_seed(bench_rng *r, uint64_t seed);
uint64_t bench_rng_next(bench_rng *r);
double bench_rng_uniform(bench_rng *r);                  /* [0, 1) */
double bench_rng_exponential(bench_rng *r, double rate); /* mean 1/rate */
uint64_t bench_mix(uint64_t a, uint64_t b);              /* a well-mixed seed from two numbers */

/* Incremental Server-Sent Events parser: feed bytes, get one callback per event's data. */
typedef struct bench_sse {
  char *line; /* current line; owned */
  size_t line_len, line_cap;
  char *data; /* data of the current event; owned */
  size_t data_len, data_cap;
  bool has_data;
  bool last_cr;   /* the previous byte was CR, so a following LF is not a new line */
  size_t max_len; /* a line or event longer than this is an error */
} bench_sse;
/* Called for each complete event with its data (NUL-terminated). Returns 0 or -1 to stop. */
typedef int (*bench_sse_cb)(void *ctx, const char *data, size_t len);
void bench_sse_init(bench_sse *s, size_t max_len);
void bench_sse_reset(bench_sse *s);
void bench_sse_free(bench_sse *s);
/* Returns 0, -1 when a line is too long or memory ran out, or the callback's -1. */
int bench_sse_feed(bench_sse *s, const char *buf, size_t len, bench_sse_cb cb, void *ctx);

/* What one OpenAI stream chunk carried. */
typedef struct bench_chunk {
  const char *text; /* borrowed from the parsed JSON; NULL or "" when no content */
  size_t text_len;
  bool is_error;
  long usage_completion_tokens; /* -1 when absent */
  char errmsg[128];
} bench_chunk;
/* Parses one data payload (not "[DONE]"). Returns 0, or -1 for malformed JSON. *json_out holds the
 * parsed document (the caller releases it with json_decref) so that text stays valid. */
struct json_t;
int bench_chunk_parse(const char *data, size_t len, bench_api api, bench_chunk *out, struct json_t **json_out);

/* Summary statistics; percentiles interpolate linearly between order statistics (numpy's default). */
typedef struct bench_summary {
  long count;
  double mean, median, p75, p90, p95, p99, min, max, stddev;
} bench_summary;
/* Sorts v in place. count 0 gives all zeros. */
void bench_summarize(double *v, long n, bench_summary *out);
double bench_percentile_sorted(const double *v, long n, double p);
/* Whether a request with these figures meets every objective set in slo. */
bool bench_slo_met(const bench_slo *slo, double ttft_ms, double tpot_ms, double e2e_ms);
/* Parses "ttft:MS", "tpot:MS" or "e2el:MS" (several may be joined by commas or spaces) into slo.
 * Returns 0, or -1 with the reason in err. */
int bench_slo_parse(const char *s, bench_slo *slo, char *err, size_t err_len);

/* Multi-turn conversations: the history one conversation has built so far. */
typedef struct bench_conv {
  int index;          /* conversation number: seeds its user turns and picks its shared prefix */
  int next_turn;      /* turns asked so far */
  char **answers;     /* the answer to each turn asked, as streamed ("" for a failed turn); owned */
  int *answer_tokens; /* output tokens counted for each answer */
  bool busy;          /* a turn is in flight or the conversation is thinking */
} bench_conv;
int bench_conv_init(bench_conv *c, const bench_config *cfg, int index);
void bench_conv_free(bench_conv *c, const bench_config *cfg);
/* The user message of turn `turn` of conversation `conv` (random words, a function of seed, conv and
 * turn), malloc'ed; its tokens in *tokens. */
char *bench_conv_user(const bench_config *cfg, int conv, int turn, int *tokens);
/* The request body of the conversation's next turn: the whole history so far plus the new user turn
 * (chat: a messages array; completions: a "User:/Assistant:" transcript). *in_tokens: the estimated
 * prompt tokens. The caller frees the string. NULL on failure. */
char *bench_body_turn(const bench_config *cfg, const bench_conv *c, int *in_tokens);
/* Records the answer to the turn just asked (text may be NULL for a failed turn). */
int bench_conv_answer(bench_conv *c, const char *text, size_t len, int tokens);

/* The run and its results. */
/* Speculative decoding's counters on the server (vLLM's spec_decode families in /metrics). */
typedef struct bench_spec_counts {
  double drafts, draft_tokens, accepted; /* verify rows, their draft tokens, drafts accepted */
} bench_spec_counts;

typedef struct bench_results {
  double duration_s;
  long completed, failed, warmup_failed;
  long errors[BENCH_ERR__COUNT];
  long http_status_count[600]; /* by status code, for BENCH_ERR_HTTP */
  long input_tokens, output_tokens, output_chunks;
  long usage_output_tokens; /* sum of the server's claims; -1 when none reported */
  double requests_per_s, output_tokens_per_s, total_tokens_per_s;
  bench_summary ttft, tpot, itl, e2e;
  long good;             /* completed requests that met every --goodput objective */
  double goodput_per_s;  /* good / duration; 0 without --goodput */
  bench_record *records; /* measured requests, n_records; owned */
  long n_records;
  char started_at[32];
  char first_error[160];       /* message of the first failed measured request */
  bench_count_mode counted_by; /* how output tokens were counted in the end */
  char tokenize_error[160];    /* why --count-tokens tokenize fell back to chunks, or "" */
  bool interrupted;            /* stopped early by SIGINT; the figures cover what finished */
  bool spec_seen;              /* the server exports speculative decoding's counters */
  bench_spec_counts spec;      /* their growth over the run (warm-up included) */
} bench_results;

/* Reads them (blocking, 5 s at most); false when the server exports none or cannot be reached. */
bool bench_spec_scrape(const bench_config *cfg, bench_spec_counts *out);

/* Runs the benchmark. Returns 0 when it ran (requests may have failed), -1 on setup failure. */
int bench_run(const bench_config *cfg, bench_prompts *prompts, bench_results *res);
void bench_results_free(bench_results *res);

/* The samples of one figure over the successful records, in ms, unsorted (*out malloc'ed, freed by
 * the caller even on failure). Returns their count, or -1 when out of memory. */
typedef enum bench_metric {
  BENCH_METRIC_TTFT,
  BENCH_METRIC_TPOT,
  BENCH_METRIC_ITL,
  BENCH_METRIC_E2E,
  BENCH_METRIC__COUNT
} bench_metric;
long bench_metric_samples(const bench_results *res, bench_metric m, double **out);

void bench_report_table(const bench_config *cfg, const bench_results *res);
/* Returns 0 or -1 (message printed). */
int bench_report_json(const bench_config *cfg, const bench_results *res, const char *path);

#endif
