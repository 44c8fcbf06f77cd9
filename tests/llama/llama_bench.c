/* Benchmark (not a test): batch-1 decode and 512-token prefill of a causal-LM package through the
 * engine, Python's share of a decode step, and llama.cpp's llama-bench on the same GGUF in the same
 * run as the anchor. Medians of several runs; the machine is shared and noisy.
 *
 *   llama_bench PKG [--gguf FILE --llama-bench BIN] [--threads N] [--runs R] [--decode N] [--compare-levels 1]
 *
 * --compare-levels 1 also runs each round with one activation level (servd_cpu_set_activation_levels)
 * and prints the same-run ratio: what the residual level costs prefill and decode.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/model_runner.h"
#include "mpk/package.h"
#include "servd/bench-util.h"
#include "servd/interp.h"
#include "servd/ops.h"
#include "servd/threadpool.h"

typedef struct run_state {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  int n;
  double t_submit, t_first, t_last;
  char err[512];
} run_state;

static void on_event(void *ud, const servd_event *ev) {
  run_state *s = ud;
  if (ev->kind == SERVD_EVENT_TOKEN) {
    if (ev->token < 0) return;
    double t = bench_now_s();
    if (s->n++ == 0) s->t_first = t;
    s->t_last = t;
    return;
  }
  pthread_mutex_lock(&s->mu);
  if (ev->kind == SERVD_EVENT_ERROR) snprintf(s->err, sizeof s->err, "%s", ev->error_message);
  s->done = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* One request; returns 0 and fills the state, or -1. */
static int run_one(servd_model *m, const int32_t *prompt, int n_prompt, int max_tokens, run_state *s) {
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  servd_gen_params p;
  servd_gen_params_default(&p);
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  servd_request *r;
  s->t_submit = bench_now_s();
  if (servd_model_submit(m, prompt, n_prompt, &p, on_event, s, &r)) {
    fprintf(stderr, "submit: %s\n", servd_last_error());
    return -1;
  }
  pthread_mutex_lock(&s->mu);
  while (!s->done) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  servd_request_release(r);
  if (s->err[0]) {
    fprintf(stderr, "request: %s\n", s->err);
    return -1;
  }
  return 0;
}

/* llama-bench's median tokens/s for pp512 and tg<decode> (-1 when unavailable). */
static void llama_bench(const char *bin, const char *gguf, int threads, int decode, int runs, double *pp, double *tg) {
  *pp = *tg = -1;
  if (!bin || !gguf) return;
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' -m '%s' -t %d -p 512 -n %d -r %d -o csv 2>/dev/null", bin, gguf, threads, decode,
           runs);
  FILE *f = popen(cmd, "r");
  if (!f) return;
  char line[8192];
  int col_p = -1, col_n = -1, col_ts = -1;
  while (fgets(line, sizeof line, f)) {
    /* CSV header first; then one row per test. Fields are quoted. */
    char *save = NULL, *tok = strtok_r(line, ",", &save);
    int i = 0;
    long np = -1, ng = -1;
    double ts = -1;
    bool header = col_ts < 0;
    for (; tok; tok = strtok_r(NULL, ",", &save), i++) {
      char *v = tok;
      if (*v == '"') v++;
      char *q = strchr(v, '"');
      if (q) *q = 0;
      if (header) {
        if (!strcmp(v, "n_prompt")) col_p = i;
        else if (!strcmp(v, "n_gen")) col_n = i;
        else if (!strcmp(v, "avg_ts")) col_ts = i;
      } else {
        if (i == col_p) np = atol(v);
        else if (i == col_n) ng = atol(v);
        else if (i == col_ts) ts = atof(v);
      }
    }
    if (header) continue;
    if (np > 0 && ng == 0) *pp = ts;
    if (ng > 0 && np == 0) *tg = ts;
  }
  pclose(f);
}

int main(int argc, char **argv) {
  if (servd_interp_early_init(argc, argv)) return 1;
  if (argc < 2) {
    fprintf(stderr, "usage: llama_bench PKG [--gguf FILE --llama-bench BIN] [--threads N] [--runs R] [--decode N] "
                    "[--compare-levels 1]\n");
    return 2;
  }
  const char *pkg = argv[1], *gguf = NULL, *lb = NULL;
  int threads = 2, runs = 5, decode = 128, compare_levels = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--gguf")) gguf = argv[i + 1];
    else if (!strcmp(argv[i], "--llama-bench")) lb = argv[i + 1];
    else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--decode")) decode = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--compare-levels")) compare_levels = atoi(argv[i + 1]);
  }
  const int levels = servd_cpu_activation_levels();
  if (runs < 1 || runs > 50 || decode < 2) return 2;
  servd_threadpool_init(threads);

  /* Python's share of a decode step: the model code times its op calls (profile()), the C side
   * times the whole step. Every step must go through the Python, so this runner has no step plans. */
  char *plans_env = getenv("SERVD_PLANS") ? strdup(getenv("SERVD_PLANS")) : NULL;
  setenv("SERVD_PLANS", "off", 1);
  double share = -1, step_ms = -1, ops_ms = -1, calls = -1, fwd_ms = -1;
  {
    mpk_package *p = NULL;
    servd_kv_cache *kv = NULL;
    servd_pool *pool = NULL;
    servd_runner *rn = NULL;
    json_t *cfg;
    int orc = mpk_open(pkg, &p);
    if (orc) fprintf(stderr, "profile: %s\n", servd_last_error());
    if (orc == 0 && (cfg = mpk_config(p))) {
      int L = (int)json_integer_value(json_object_get(cfg, "num_hidden_layers"));
      int H = (int)json_integer_value(json_object_get(cfg, "num_attention_heads"));
      json_t *kvj = json_object_get(cfg, "num_key_value_heads");
      int KV = kvj ? (int)json_integer_value(kvj) : H;
      int D = (int)json_integer_value(json_object_get(cfg, "hidden_size"));
      json_t *hdj = json_object_get(cfg, "head_dim");
      int HD = hdj ? (int)json_integer_value(hdj) : D / H;
      servd_pool_options po = {.n_interpreters = 1, .world_size = 1};
      if (servd_kv_cache_create(&kv, L, KV, HD, 16, 64, SERVD_F16) == 0 && servd_pool_create(p, &po, &pool) == 0 &&
          servd_runner_create(pool, &kv, 1, NULL, &rn) == 0) {
        /* (profiling below) */
        int32_t blocks[64];
        servd_kv_cache_alloc(kv, 64, blocks);
        int32_t tok = 100, pos = 0, slot = 0, lrow = 0, qs = 0, ql = 1, kl = 1;
        const int32_t *tables[1] = {blocks};
        servd_forward_batch b = {
            .n_tokens = 1,
            .tokens = &tok,
            .positions = &pos,
            .slots = &slot,
            .n_logit_rows = 1,
            .logit_rows = &lrow,
            .attn = {.n_seqs = 1, .q_start = &qs, .q_len = &ql, .kv_len = &kl, .block_tables = tables}};
        servd_py_error err;
        /* Rounds alternate plain and profiled stretches of the same positions (same attention
         * cost); medians over rounds. */
        enum { ROUNDS = 7, STEPS = 64 };
        double plain[ROUNDS], opsv[ROUNDS], fwdv[ROUNDS];
        int ok = 1;
        for (int round = 0; round < ROUNDS && ok; round++) {
          for (int phase = 0; phase < 2 && ok; phase++) {
            json_t *res = NULL, *args = json_pack("[b]", phase == 1);
            if (servd_interp_call_json(servd_pool_get(pool, 0), "profile", args, &res, 0, &err)) {
              fprintf(stderr, "profile: %s: %s\n", err.type, err.message);
              ok = 0;
            }
            json_decref(args);
            json_decref(res);
            double t0 = bench_now_s();
            for (int i = 0; i < STEPS && ok; i++) {
              pos = i;
              kl = i + 1;
              slot = blocks[i / 16] * 16 + i % 16;
              servd_tensor *lg = NULL;
              if (servd_runner_step(rn, &b, &lg, &err, NULL)) {
                fprintf(stderr, "step: %s %s\n", err.type, err.message);
                ok = 0;
              }
              servd_tensor_release(lg);
            }
            if (phase == 0) {
              plain[round] = (bench_now_s() - t0) / STEPS;
              continue;
            }
            json_t *st = NULL, *none = json_array();
            if (servd_interp_call_json(servd_pool_get(pool, 0), "profile_stats", none, &st, 0, &err)) {
              fprintf(stderr, "profile_stats: %s: %s\n", err.type, err.message);
              ok = 0;
            } else {
              opsv[round] = json_number_value(json_object_get(st, "ops_ns")) / 1e9 / STEPS;
              fwdv[round] = json_number_value(json_object_get(st, "forward_ns")) / 1e9 / STEPS;
              calls = json_number_value(json_object_get(st, "op_calls")) / STEPS;
            }
            json_decref(none);
            json_decref(st);
          }
        }
        if (!ok) fprintf(stderr, "profiling failed\n");
        if (ok) {
          step_ms = bench_median(plain, ROUNDS) * 1e3;
          ops_ms = bench_median(opsv, ROUNDS) * 1e3;
          fwd_ms = bench_median(fwdv, ROUNDS) * 1e3;
          share = 1.0 - ops_ms / fwd_ms;
        }
      } else {
        fprintf(stderr, "profile setup: %s\n", servd_last_error());
      }
    }
    servd_runner_destroy(rn);
    servd_pool_destroy(pool);
    servd_kv_cache_destroy(kv);
    mpk_close(p);
  }

  if (plans_env) setenv("SERVD_PLANS", plans_env, 1);
  else unsetenv("SERVD_PLANS");
  free(plans_env);
  servd_model_options o;
  servd_model_options_default(&o);
  o.path = pkg;
  o.max_seqs = 1;
  o.max_batch_tokens = 512;
  o.max_context = 1024;
  o.prefix_cache = false; /* every run computes the 512-token prompt: a cached one would skip its prefill */
  o.max_step_ms = 0;      /* and in one step, as llama-bench's pp512 */
  servd_model *m;
  if (servd_model_load(&o, &m)) {
    fprintf(stderr, "load: %s\n", servd_last_error());
    return 1;
  }
  int32_t prompt[512];
  for (int i = 0; i < 512; i++) prompt[i] = 100 + (i * 7919) % 5000;
  double pp[50], tg[50], lpp[50], ltg[50], pp1[50], tg1[50];
  int n_l = 0;
  run_state s;
  run_one(m, prompt, 8, 4, &s); /* warm-up: page in the weights */
  /* servd and llama.cpp alternate run by run, so both see the same machine load. */
  for (int r = 0; r < runs; r++) {
    if (run_one(m, prompt, 512, 1, &s)) return 1;
    pp[r] = 512.0 / (s.t_first - s.t_submit);
    if (run_one(m, prompt, 8, decode, &s)) return 1;
    tg[r] = (s.n - 1) / (s.t_last - s.t_first);
    if (compare_levels) { /* the same runs with one activation level, the anchor of the residual's cost */
      servd_cpu_set_activation_levels(1);
      int rc = run_one(m, prompt, 512, 1, &s);
      pp1[r] = 512.0 / (s.t_first - s.t_submit);
      if (!rc) rc = run_one(m, prompt, 8, decode, &s);
      tg1[r] = (s.n - 1) / (s.t_last - s.t_first);
      servd_cpu_set_activation_levels(levels);
      if (rc) return 1;
    }
    double a, b;
    llama_bench(lb, gguf, threads, decode, 1, &a, &b);
    if (a > 0 && b > 0) {
      lpp[n_l] = a;
      ltg[n_l++] = b;
    }
  }
  double our_pp = bench_median(pp, runs), our_tg = bench_median(tg, runs);
  double l_pp = n_l ? bench_median(lpp, n_l) : -1, l_tg = n_l ? bench_median(ltg, n_l) : -1;
  servd_model_unload(m, 0);

  printf("threads %d, runs %d (medians)\n", threads, runs);
  printf("prefill 512 tokens: servd %.1f tok/s", our_pp);
  if (l_pp > 0) printf(", llama.cpp %.1f tok/s, ratio %.2fx", l_pp, our_pp / l_pp);
  printf("\ndecode batch 1 (%d tokens): servd %.1f tok/s", decode, our_tg);
  if (l_tg > 0) printf(", llama.cpp %.1f tok/s, ratio %.2fx", l_tg, our_tg / l_tg);
  printf("\n");
  if (compare_levels) {
    double r_pp[50], r_tg[50];
    for (int r = 0; r < runs; r++) r_pp[r] = pp[r] / pp1[r], r_tg[r] = tg[r] / tg1[r];
    printf("activation levels %d / 1, same runs: prefill %.3fx (1 level %.1f tok/s), decode %.3fx (1 level %.1f "
           "tok/s)\n",
           levels, bench_median(r_pp, runs), bench_median(pp1, runs), bench_median(r_tg, runs),
           bench_median(tg1, runs));
  }
  if (fwd_ms > 0)
    printf("decode step through the interpreter: %.3f ms; profiled: forward %.3f ms, of which %.0f op calls "
           "%.3f ms; Python's share outside ops: %.1f%% (upper bound: includes the timing wrappers)\n",
           step_ms, fwd_ms, calls, ops_ms, 100 * share);
  fflush(stdout);
  _exit(0);
}
