/* `servd generate`: loads a package, submits one request to the engine and streams the answer. */
#include "generate.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "engine/gpu_prewarm.h"
#include "engine/speculate.h"
#include "package_cache.h"
#include "servd/ops.h"
#include "servd/threadpool.h"

#define MAX_STOPS 16

typedef struct gen_state {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  bool error;
  char message[1024];
  char reason[32];
  int prompt_tokens, completion_tokens;
  double t_first, t_last; /* seconds, monotonic */
  FILE *ids;              /* --ids-out: generated ids, one per line */
  bool quiet;
} gen_state;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_event(void *ud, const servd_event *ev) {
  gen_state *g = ud;
  if (ev->kind == SERVD_EVENT_TOKEN) {
    double t = now_s();
    if (ev->token >= 0) {
      if (g->completion_tokens == 0) g->t_first = t;
      g->t_last = t;
      g->completion_tokens++;
      if (g->ids) fprintf(g->ids, "%d\n", ev->token);
    }
    if (ev->text_len && !g->quiet) {
      fwrite(ev->text, 1, ev->text_len, stdout);
      fflush(stdout);
    }
    return;
  }
  pthread_mutex_lock(&g->mu);
  g->done = true;
  g->error = ev->kind == SERVD_EVENT_ERROR;
  g->prompt_tokens = ev->prompt_tokens;
  snprintf(g->reason, sizeof g->reason, "%s", ev->finish_reason ? ev->finish_reason : "");
  if (ev->error_message) snprintf(g->message, sizeof g->message, "%s", ev->error_message);
  pthread_cond_signal(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void usage(FILE *f) {
  fprintf(f, "usage: servd generate --model PKG --prompt TEXT [options]\n"
             "  --model PKG             a package, a GGUF file or a Hugging Face folder (packed once into the\n"
             "                          package cache and reused while it is unchanged)\n"
             "  --package-cache DIR     where those packages are kept (default ~/.cache/servd/packages)\n"
             "  --chat                  render the prompt as a user message with the package's chat template\n"
             "  --system TEXT           system message (with --chat)\n"
             "  --max-tokens N          tokens to generate (default 256)\n"
             "  --tp N                  tensor-parallel ranks (default 1; with --gpus N: N)\n"
             "  --gpus N                run on GPUs 0..N-1, one tensor-parallel rank each (default 0: CPU)\n"
             "  --gpu-memory-fraction F share of the free GPU memory after the weights for the KV cache (0.9)\n"
             "  --cuda-graphs on|off    decode steps as CUDA graphs (default on)\n"
             "  --cuda-graph-max-batch B  largest decode batch run as a graph (default 64)\n"
             "  --threads N             compute threads (default: all CPUs)\n"
             "  --activation-levels N   int8 levels of quantized matmuls' activations: 1 (default) or 2\n"
             "  --temperature T         0: greedy (default 0)\n"
             "  --top-p P --top-k K --min-p P --seed S\n"
             "  --repetition-penalty R --presence-penalty P --frequency-penalty F\n"
             "  --stop TEXT             stop string (repeatable)\n"
             "  --ignore-eos            keep going past end-of-sequence tokens\n"
             "  --no-special            do not add the tokenizer's special tokens (e.g. BOS) to the prompt\n"
             "  --max-context N         cap the context length (and the KV cache with it)\n"
             "  --kv-f32                keep the KV cache in f32 (default f16)\n"
             "  --kv-cache-dtype T      f16, bf16, q8_0, q4_0 or f32 (default: the package's, else f16)\n"
             "  --prefix-cache-dir DIR  keep the prompt's full KV blocks in files under DIR and find them\n"
             "                          there on a later run\n"
             "  --speculative MODE      auto (default), off, ngram or suffix: as servd --speculative\n"
             "  --num-speculative-tokens N  drafts per step at most (default 8)\n"
             "  --ids-out FILE          write the generated token ids, one per line\n"
             "  --prompt-ids-out FILE   write the prompt's token ids, one per line\n"
             "  --quiet                 do not print the text\n"
             "  --no-plan               run every decode step through Python (no step plans)\n"
             "  --trace-plan            print each decode step plan when it is captured (stderr)\n");
}

static int parse_int(const char *s, const char *what, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) {
    fprintf(stderr, "servd generate: %s: '%s' is not an integer in %d..%d\n", what, s, lo, hi);
    return -1;
  }
  *out = (int)v;
  return 0;
}

static int parse_float(const char *s, const char *what, float *out) {
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  if (errno || *end || v != v) {
    fprintf(stderr, "servd generate: %s: '%s' is not a number\n", what, s);
    return -1;
  }
  *out = v;
  return 0;
}

int servd_generate_main(int argc, char **argv) {
  enum {
    O_CHAT = 256,
    O_SYSTEM,
    O_MAXTOK,
    O_TP,
    O_THREADS,
    O_ACT_LEVELS,
    O_TEMP,
    O_TOPP,
    O_TOPK,
    O_MINP,
    O_SEED,
    O_REP,
    O_PRES,
    O_FREQ,
    O_STOP,
    O_IGNORE_EOS,
    O_NO_SPECIAL,
    O_MAXCTX,
    O_KVF32,
    O_SPEC,
    O_SPEC_N,
    O_IDS,
    O_PIDS,
    O_QUIET,
    O_HELP,
    O_GPUS,
    O_GPU_FRAC,
    O_GRAPHS,
    O_GRAPH_MAX,
    O_PKG_CACHE,
    O_NO_PLAN,
    O_TRACE_PLAN,
    O_KV_DTYPE,
    O_PREFIX_DIR
  };
  static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                       {"prompt", required_argument, 0, 'p'},
                                       {"chat", no_argument, 0, O_CHAT},
                                       {"system", required_argument, 0, O_SYSTEM},
                                       {"max-tokens", required_argument, 0, O_MAXTOK},
                                       {"tp", required_argument, 0, O_TP},
                                       {"threads", required_argument, 0, O_THREADS},
                                       {"activation-levels", required_argument, 0, O_ACT_LEVELS},
                                       {"temperature", required_argument, 0, O_TEMP},
                                       {"top-p", required_argument, 0, O_TOPP},
                                       {"top-k", required_argument, 0, O_TOPK},
                                       {"min-p", required_argument, 0, O_MINP},
                                       {"seed", required_argument, 0, O_SEED},
                                       {"repetition-penalty", required_argument, 0, O_REP},
                                       {"presence-penalty", required_argument, 0, O_PRES},
                                       {"frequency-penalty", required_argument, 0, O_FREQ},
                                       {"stop", required_argument, 0, O_STOP},
                                       {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
                                       {"no-special", no_argument, 0, O_NO_SPECIAL},
                                       {"max-context", required_argument, 0, O_MAXCTX},
                                       {"kv-f32", no_argument, 0, O_KVF32},
                                       {"kv-cache-dtype", required_argument, 0, O_KV_DTYPE},
                                       {"prefix-cache-dir", required_argument, 0, O_PREFIX_DIR},
                                       {"speculative", required_argument, 0, O_SPEC},
                                       {"num-speculative-tokens", required_argument, 0, O_SPEC_N},
                                       {"ids-out", required_argument, 0, O_IDS},
                                       {"prompt-ids-out", required_argument, 0, O_PIDS},
                                       {"quiet", no_argument, 0, O_QUIET},
                                       {"help", no_argument, 0, O_HELP},
                                       {"gpus", required_argument, 0, O_GPUS},
                                       {"gpu-memory-fraction", required_argument, 0, O_GPU_FRAC},
                                       {"cuda-graphs", required_argument, 0, O_GRAPHS},
                                       {"cuda-graph-max-batch", required_argument, 0, O_GRAPH_MAX},
                                       {"package-cache", required_argument, 0, O_PKG_CACHE},
                                       {"no-plan", no_argument, 0, O_NO_PLAN},
                                       {"trace-plan", no_argument, 0, O_TRACE_PLAN},
                                       {0, 0, 0, 0}};

  const char *model = NULL, *pkg_cache = NULL, *prompt = NULL, *system = NULL, *ids_path = NULL, *pids_path = NULL;
  bool chat = false, add_special = true, quiet = false;
  int threads = 0, act_levels = 0;
  bool tp_given = false;
  const char *stops[MAX_STOPS];
  servd_model_options mo;
  servd_model_options_default(&mo);
  mo.max_seqs = 1;
  servd_gen_params gp;
  servd_gen_params_default(&gp);
  gp.temperature = 0.0f;
  gp.max_tokens = 256;
  gp.stop = stops;

  /* Accept both `servd generate ...` (argv[0] == "generate") and a bare argument vector. */
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "m:p:h", opts, NULL)) != -1) {
    int bad = 0;
    switch (c) {
    case 'm': model = optarg; break;
    case O_PKG_CACHE: pkg_cache = optarg; break;
    /* step plans read these when the model loads (daemon/engine/plan_cache.h) */
    case O_NO_PLAN: setenv("SERVD_PLANS", "off", 1); break;
    case O_TRACE_PLAN: setenv("SERVD_TRACE_PLAN", "1", 1); break;
    case 'p': prompt = optarg; break;
    case O_CHAT: chat = true; break;
    case O_SYSTEM: system = optarg; break;
    case O_MAXTOK: bad = parse_int(optarg, "--max-tokens", 1, 1 << 24, &gp.max_tokens); break;
    case O_TP:
      bad = parse_int(optarg, "--tp", 1, 15, &mo.tp);
      tp_given = true;
      break;
    case O_GPUS: bad = parse_int(optarg, "--gpus", 0, 15, &mo.gpus); break;
    case O_GPU_FRAC: {
      float f = 0;
      bad = parse_float(optarg, "--gpu-memory-fraction", &f);
      if (!bad && !(f > 0 && f <= 1)) {
        fprintf(stderr, "servd generate: --gpu-memory-fraction: '%s' is not a fraction in (0, 1]\n", optarg);
        bad = -1;
      }
      mo.gpu_memory_fraction = f;
      break;
    }
    case O_GRAPHS:
      if (strcmp(optarg, "on") == 0 || strcmp(optarg, "off") == 0) {
        mo.cuda_graphs = strcmp(optarg, "on") == 0;
      } else {
        fprintf(stderr, "servd generate: --cuda-graphs: expected on or off, got '%s'\n", optarg);
        bad = -1;
      }
      break;
    case O_GRAPH_MAX: bad = parse_int(optarg, "--cuda-graph-max-batch", 1, 4096, &mo.cuda_graph_max_batch); break;
    case O_THREADS: bad = parse_int(optarg, "--threads", 1, 1024, &threads); break;
    case O_ACT_LEVELS: bad = parse_int(optarg, "--activation-levels", 1, 2, &act_levels); break;
    case O_TEMP: bad = parse_float(optarg, "--temperature", &gp.temperature); break;
    case O_TOPP: bad = parse_float(optarg, "--top-p", &gp.top_p); break;
    case O_TOPK: bad = parse_int(optarg, "--top-k", 0, 1 << 24, &gp.top_k); break;
    case O_MINP: bad = parse_float(optarg, "--min-p", &gp.min_p); break;
    case O_SEED: {
      char *end;
      errno = 0;
      gp.seed = strtoull(optarg, &end, 10);
      gp.has_seed = true;
      if (errno || *end) {
        fprintf(stderr, "servd generate: --seed: '%s' is not an unsigned integer\n", optarg);
        bad = -1;
      }
      break;
    }
    case O_REP: bad = parse_float(optarg, "--repetition-penalty", &gp.repetition_penalty); break;
    case O_PRES: bad = parse_float(optarg, "--presence-penalty", &gp.presence_penalty); break;
    case O_FREQ: bad = parse_float(optarg, "--frequency-penalty", &gp.frequency_penalty); break;
    case O_STOP:
      if (gp.n_stop == MAX_STOPS) {
        fprintf(stderr, "servd generate: at most %d --stop strings\n", MAX_STOPS);
        bad = -1;
      } else {
        stops[gp.n_stop++] = optarg;
      }
      break;
    case O_IGNORE_EOS: gp.ignore_eos = true; break;
    case O_NO_SPECIAL: add_special = false; break;
    case O_MAXCTX: bad = parse_int(optarg, "--max-context", 16, 1 << 24, &mo.max_context); break;
    case O_KVF32: mo.kv_dtype = SERVD_F32; break;
    case O_PREFIX_DIR: mo.prefix_cache_dir = optarg; break;
    case O_KV_DTYPE:
      if (servd_kv_dtype_parse(optarg, &mo.kv_dtype) != 0) {
        fprintf(stderr, "servd generate: --kv-cache-dtype: %s\n", servd_last_error());
        return 2;
      }
      break;
    case O_SPEC:
      mo.speculative = servd_spec_mode_parse(optarg);
      if ((bad = mo.speculative < 0)) fprintf(stderr, "--speculative must be auto, off, ngram or suffix\n");
      break;
    case O_SPEC_N:
      bad = parse_int(optarg, "--num-speculative-tokens", 1, SERVD_SPEC_MAX_DRAFT, &mo.num_speculative_tokens);
      break;
    case O_IDS: ids_path = optarg; break;
    case O_PIDS: pids_path = optarg; break;
    case O_QUIET: quiet = true; break;
    case 'h':
    case O_HELP: usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
    if (bad) return 2;
  }
  if (optind < argc || !model || !prompt) {
    if (optind < argc) fprintf(stderr, "servd generate: unexpected argument '%s'\n", argv[optind]);
    else fprintf(stderr, "servd generate: --model and --prompt are required\n");
    usage(stderr);
    return 2;
  }

  if (mo.gpus > 0 && !tp_given) mo.tp = mo.gpus;
  if (mo.gpus > 0 && mo.tp != mo.gpus) {
    fprintf(stderr,
            "servd generate: --tp %d with --gpus %d: on GPUs each tensor-parallel rank needs a GPU of its own "
            "(NCCL runs one rank per GPU), so --tp must equal --gpus\n",
            mo.tp, mo.gpus);
    return 2;
  }
  int status = 1, rc;
  servd_model *m = NULL;
  servd_request *req = NULL;
  int32_t *ids = NULL;
  int n_ids = 0;
  char *text = NULL, *pkg = NULL;
  gen_state g = {.quiet = quiet};
  pthread_mutex_init(&g.mu, NULL);
  pthread_cond_init(&g.cv, NULL);

  if ((rc = servd_threadpool_init(threads))) {
    fprintf(stderr, "servd generate: %s\n", servd_last_error());
    goto out;
  }
  if (act_levels) servd_cpu_set_activation_levels(act_levels); /* 1..2: checked */
  if ((rc = servd_package_cache_resolve(pkg_cache, model, &pkg))) {
    fprintf(stderr, "servd generate: %s\n", servd_last_error());
    if (rc == SERVD_EINVAL) status = 2;
    goto out;
  }
  mo.path = pkg;
  /* One sequence: the whole prompt in one chunk up to 2048 tokens. */
  mo.max_batch_tokens = 2048;
  /* CUDA contexts and the cuBLAS warm-up before any interpreter namespace exists (gpu_prewarm.c). */
  if (mo.gpus > 0 && (rc = servd_gpu_start_contexts(mo.gpus))) {
    fprintf(stderr, "servd generate: %s\n", servd_last_error());
    goto out;
  }
  if (mo.gpus > 0) servd_gpu_prewarm(&mo); /* a failure is only a warning: the load reports its own */
  double t0 = now_s();
  if ((rc = servd_model_load(&mo, &m))) {
    fprintf(stderr, "servd generate: loading %s: %s\n", model, servd_last_error());
    goto out;
  }
  if (servd_model_get_kind(m) != SERVD_MODEL_CAUSAL_LM) {
    fprintf(stderr, "servd generate: %s is not a causal-lm package\n", model);
    goto out;
  }
  double t_load = now_s() - t0;
  const char *input = prompt;
  if (chat) {
    json_t *msgs = json_array();
    if (system) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
    rc = servd_model_apply_chat_template(m, msgs, true, &text);
    json_decref(msgs);
    if (rc) {
      fprintf(stderr, "servd generate: %s\n", servd_last_error());
      goto out;
    }
    input = text;
    add_special = false; /* the template writes the special tokens itself */
  }
  if ((rc = servd_model_tokenize(m, input, strlen(input), add_special, &ids, &n_ids))) {
    fprintf(stderr, "servd generate: tokenizing the prompt: %s\n", servd_last_error());
    goto out;
  }
  if (pids_path) {
    FILE *f = fopen(pids_path, "w");
    if (!f) {
      fprintf(stderr, "servd generate: %s: %s\n", pids_path, strerror(errno));
      goto out;
    }
    for (int i = 0; i < n_ids; i++) fprintf(f, "%d\n", ids[i]);
    fclose(f);
  }
  if (ids_path && !(g.ids = fopen(ids_path, "w"))) {
    fprintf(stderr, "servd generate: %s: %s\n", ids_path, strerror(errno));
    goto out;
  }
  double t_submit = now_s();
  if ((rc = servd_model_submit(m, ids, n_ids, &gp, on_event, &g, &req))) {
    fprintf(stderr, "servd generate: %s\n", servd_last_error());
    goto out;
  }
  pthread_mutex_lock(&g.mu);
  while (!g.done) pthread_cond_wait(&g.cv, &g.mu);
  pthread_mutex_unlock(&g.mu);
  servd_request_release(req);
  if (!quiet) fputc('\n', stdout);
  fflush(stdout);
  if (g.error) {
    fprintf(stderr, "servd generate: %s\n", g.message);
    goto out;
  }
  double prefill = g.completion_tokens ? g.t_first - t_submit : 0;
  double decode = g.t_last - g.t_first;
  fprintf(stderr,
          "[load %.2f s] prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens, decode %.1f tok/s; "
          "finish: %s\n",
          t_load, n_ids, prefill, prefill > 0 ? n_ids / prefill : 0.0, g.completion_tokens,
          decode > 0 ? (g.completion_tokens - 1) / decode : 0.0, g.reason);
  status = 0;
out:
  if (g.ids) fclose(g.ids);
  servd_model_unload(m, 0);
  free(ids);
  free(text);
  free(pkg);
  pthread_mutex_destroy(&g.mu);
  pthread_cond_destroy(&g.cv);
  return status;
}
