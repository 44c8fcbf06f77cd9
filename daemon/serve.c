#include "serve.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "api/api.h"
#include "components.h"
#include "config.h"
#include "lora_spec.h"
#include "trust.h"
#include "package_cache.h"
#include "http/server.h"
#include "http/tls.h"
#include "grpc/grpc.h"
#include "engine/gpu_prewarm.h"
#include "engine/kv_events.h"
#include "servd/device.h"
#include "servd/ops.h"
#include "servd/status.h"
#include "servd/threadpool.h"

/* Checks the GPUs asked for and says which backend serves. Returns 0, or the exit status 2 when
 * fewer GPUs are visible than --gpus asks for. */
/* GPUs the NVIDIA kernel driver lists, without starting CUDA: a CPU-only servd never initializes the
 * CUDA driver, whose threads then have no part in the process (one crashed at exit beside the
 * interpreters' namespaces). */
static int nvidia_gpus_listed(void) {
  DIR *d = opendir("/proc/driver/nvidia/gpus");
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static int report_backend(const servd_config *c) {
  int have = 0;
  char why[256] = "";
  if (c->gpus == 0) {
    have = servd_device_built() ? nvidia_gpus_listed() : 0;
    if (have == 0)
      snprintf(why, sizeof why, "%s",
               servd_device_built() ? "no NVIDIA GPU listed by the driver" : "servd was built without CUDA");
  } else {
    servd_device_count(&have, why, sizeof why);
  }
  if (c->gpus == 0) {
    if (have > 0)
      fprintf(stderr, "servd: backend: CPU (no --gpus given; %d GPU%s visible: --gpus %d uses %s)\n", have,
              have == 1 ? "" : "s", have, have == 1 ? "it" : "them");
    else fprintf(stderr, "servd: backend: CPU (%s)\n", why[0] ? why : "no GPU visible");
    return 0;
  }
  if (have < c->gpus) {
    if (!why[0]) snprintf(why, sizeof why, "%d visible", have);
    fprintf(stderr,
            "servd: --gpus %d asks for %d GPU%s but %d %s available (%s). Run with --gpus 0 (or without "
            "--gpus) to serve on the CPU backend.\n",
            c->gpus, c->gpus, c->gpus == 1 ? "" : "s", have, have == 1 ? "is" : "are", why);
    return 2;
  }
  fprintf(stderr, "servd: backend: CUDA, %d GPU%s:", c->gpus, c->gpus == 1 ? "" : "s");
  for (int d = 0; d < c->gpus; d++) {
    char desc[256] = "";
    if (servd_device_describe(d, desc, sizeof desc) != 0) snprintf(desc, sizeof desc, "(%s)", servd_last_error());
    fprintf(stderr, "%s cuda:%d %s", d ? ";" : "", d, desc);
  }
  fprintf(stderr, " (tensor parallel %d, CUDA graphs %s", c->tp, c->cuda_graphs ? "on" : "off");
  if (c->cuda_graphs) fprintf(stderr, " up to batch %d", c->cuda_graph_max_batch);
  fprintf(stderr, ", KV cache %.0f%% of the free memory)\n", c->gpu_memory_fraction * 100);
  /* Create each GPU's CUDA context (and load every kernel: CUDA_MODULE_LOADING=EAGER, set in main)
   * now, on this thread, before any interpreter namespace exists: on an H200 with driver 580 the
   * driver crashed creating its first context from a thread inside an interpreter's call. */
  if (servd_gpu_start_contexts(c->gpus) != 0) {
    fprintf(stderr, "servd: %s\n", servd_last_error());
    return 2;
  }
  return 0;
}

/* Signals a process manager or an operator sends. The stopping ones drain (see begin_drain). SIGHUP
 * and SIGUSR1/2 ask daemons to reload or reopen their logs: SIGHUP reloads the TLS certificate when
 * servd serves TLS; otherwise servd has nothing to reload (it logs to stderr, which the supervisor
 * owns, and reads the model repository at each request), so it says so and serves on; their default action would end the process and cut every stream. SIGPIPE is
 * ignored (servd_serve_main). */
static const struct {
  int signum;
  bool drains;
} handled_signals[] = {
    {SIGTERM, true}, {SIGINT, true}, {SIGQUIT, true}, {SIGHUP, false}, {SIGUSR1, false}, {SIGUSR2, false},
};
#define N_SIGNALS (sizeof handled_signals / sizeof *handled_signals)

typedef struct server {
  uv_loop_t *loop;
  servd_config cfg;
  servd_api *api;
  servd_http_server *http;
  servd_grpc_server *grpc;     /* NULL without --grpc-port */
  servd_tls_ctx *tls;          /* NULL without --tls-cert; outlives the listener */
  servd_tls_ctx *grpc_tls;     /* the same files, ALPN h2: NULL without --tls-cert or --grpc-port */
  uv_signal_t sigs[N_SIGNALS]; /* handled_signals, in order */
  uv_timer_t drain_timer;
  uint64_t drain_deadline, cancel_deadline;
  bool draining, cancelled, unloading, closing, startup_done;
  int exit_code;
} server;

static void on_handle_closed(uv_handle_t *h) { (void)h; }

/* GGUF files and Hugging Face folders given as models become cached packages, before servd listens
 * (a first start packs them; later ones only check the key). Returns 0 or the exit status: 2 for a
 * path that is no model or a cache folder servd cannot use, 1 when packing fails. */
static int resolve_model_sources(servd_config *c) {
  for (int i = 0; i < c->n_models; i++) {
    char *pkg;
    int rc = servd_package_cache_resolve(c->package_cache, c->models[i].path, &pkg);
    if (rc) {
      fprintf(stderr, "servd: %s\n", servd_last_error());
      return rc == SERVD_EINVAL ? 2 : 1;
    }
    free(c->models[i].path);
    c->models[i].path = pkg;
  }
  return 0;
}

static void on_api_closed(void *ud) {
  server *s = ud;
  for (size_t i = 0; i < N_SIGNALS; i++) uv_close((uv_handle_t *)&s->sigs[i], on_handle_closed);
  uv_close((uv_handle_t *)&s->drain_timer, on_handle_closed);
}

static void on_grpc_closed(void *ud) {
  server *s = ud;
  s->grpc = NULL;
  servd_api_close(s->api, on_api_closed, s);
  s->api = NULL;
}

static void on_http_closed(void *ud) {
  server *s = ud;
  s->http = NULL;
  if (s->grpc) {
    servd_grpc_server_close(s->grpc, on_grpc_closed, s);
    return;
  }
  servd_api_close(s->api, on_api_closed, s);
  s->api = NULL;
}

static void on_unloaded(void *ud) {
  server *s = ud;
  uv_timer_stop(&s->drain_timer);
  int loading = servd_api_models_loading(s->api);
  if (loading > 0) {
    /* Its worker still runs the load (possibly an import that never returns): nothing to wait for. */
    fprintf(stderr, "servd: %d model load%s in progress abandoned; exiting with status %d\n", loading,
            loading == 1 ? "" : "s", s->exit_code);
    fflush(NULL);
    _exit(s->exit_code);
  }
  fprintf(stderr, "servd: all models unloaded; exiting with status %d\n", s->exit_code);
  servd_http_server_close(s->http, on_http_closed, s);
}

#define UNLOAD_LIMIT_MS 5000

static void unload_overdue(uv_timer_t *t) {
  server *s = t->data;
  fprintf(stderr, "servd: models did not unload within %d s; exiting with status %d anyway\n", UNLOAD_LIMIT_MS / 1000,
          s->exit_code);
  fflush(NULL);
  _exit(s->exit_code);
}

static void drain_tick(uv_timer_t *t) {
  server *s = t->data;
  uint64_t now = uv_now(s->loop);
  int active = (s->http ? servd_http_server_active_requests(s->http) : 0) + servd_grpc_server_active_calls(s->grpc);
  int inflight = s->api ? servd_api_inflight(s->api) : 0;
  if (s->unloading) return;
  if (active > 0 || inflight > 0) {
    if (!s->cancelled && now >= s->drain_deadline) {
      fprintf(stderr, "servd: drain deadline reached with %d requests running; cancelling them\n", active);
      servd_api_cancel_all(s->api);
      s->cancelled = true;
      s->cancel_deadline = now + 5000;
    }
    if (!s->cancelled || now < s->cancel_deadline) return;
    fprintf(stderr, "servd: %d requests did not end after cancellation; closing their connections\n", active);
  }
  s->unloading = true;
  uv_timer_stop(t);
  /* Unloading finalizes interpreters; should one hang, the process still ends (requests are over). */
  uv_timer_start(t, unload_overdue, UNLOAD_LIMIT_MS, 0);
  servd_api_unload_all(s->api, 0, on_unloaded, s);
}

static void begin_drain(server *s, const char *why) {
  if (s->draining) return;
  s->draining = true;
  fprintf(stderr, "servd: %s: no longer accepting connections; draining for up to %.0f s\n", why,
          s->cfg.drain_timeout_s);
  servd_api_set_draining(s->api, true);
  servd_api_drain_loads(s->api); /* a load in progress is abandoned, not waited for */
  servd_http_server_stop_accepting(s->http);
  servd_grpc_server_stop_accepting(s->grpc);
  s->drain_deadline = uv_now(s->loop) + (uint64_t)(s->cfg.drain_timeout_s * 1000.0);
  uv_timer_start(&s->drain_timer, drain_tick, 0, 50);
}

/* SIGHUP with TLS: connections accepted from now on get the certificate and key as they are on disk;
 * open ones keep theirs. A file that does not load leaves the old pair serving. */
static void reload_tls(server *s) {
  char desc[512];
  if (servd_tls_ctx_reload(s->tls) != 0 || (s->grpc_tls && servd_tls_ctx_reload(s->grpc_tls) != 0)) {
    fprintf(stderr, "servd: Hangup: TLS reload failed, still serving the previous certificate: %s\n",
            servd_last_error());
  } else {
    servd_tls_ctx_describe(s->tls, desc, sizeof desc);
    fprintf(stderr, "servd: Hangup: TLS certificate reloaded (%s); new connections use it\n", desc);
  }
  fflush(stderr);
}

static void on_signal(uv_signal_t *h, int signum) {
  server *s = h->data;
  if (signum == SIGHUP && s->tls) {
    reload_tls(s);
    return;
  }
  if (!handled_signals[h - s->sigs].drains) {
    fprintf(stderr,
            "servd: %s: nothing to reload (logs go to stderr, the model repository is read at each "
            "request); serving on\n",
            strsignal(signum));
    fflush(stderr);
    return;
  }
  if (s->draining) {
    /* A second signal: the operator wants out now. */
    fprintf(stderr, "servd: second %s; exiting without draining\n", strsignal(signum));
    fflush(NULL);
    _exit(1);
  }
  begin_drain(s, strsignal(signum));
}

/* servd --lora: every adapter on its base, once the models given at startup have loaded. */
static int register_loras(server *s) {
  for (int i = 0; i < s->cfg.n_loras; i++) {
    servd_lora_spec sp;
    char msg[1024] = "";
    if (servd_lora_spec_parse(s->cfg.loras[i], &sp) != 0) snprintf(msg, sizeof msg, "%s", servd_last_error());
    if (msg[0] || servd_api_lora_load(s->api, sp.base, sp.name, sp.path, msg, sizeof msg) != 200) {
      fprintf(stderr, "servd: startup failed: --lora %s: %s\n", s->cfg.loras[i], msg);
      return -1;
    }
  }
  return 0;
}

static void on_model_loaded(void *ud, const char *name, int rc, const char *msg) {
  server *s = ud;
  if (rc != 0 && !s->startup_done) {
    fprintf(stderr, "servd: startup failed: model '%s' could not be loaded: %s\n", name, msg);
    s->exit_code = 1;
    begin_drain(s, "startup failure");
    return;
  }
  if (!s->startup_done && servd_api_models_loading(s->api) == 0) {
    if (register_loras(s) != 0) {
      s->exit_code = 1;
      begin_drain(s, "startup failure");
      return;
    }
    s->startup_done = true;
    fprintf(stderr, "servd: all models loaded; ready\n");
  }
}

static void set_worker_threads(const servd_config *c) {
  /* libuv's worker pool runs template rendering, tokenization, predictions and loads; a generic
   * model's interpreters should all be reachable at once. Read by libuv at first use. */
  if (getenv("UV_THREADPOOL_SIZE")) return;
  int n = 4;
  for (int i = 0; i < c->n_models; i++) {
    int k = c->models[i].interpreters > 0 ? c->models[i].interpreters : c->interpreters;
    n += k;
  }
  if (n > 128) n = 128;
  char v[16];
  snprintf(v, sizeof v, "%d", n);
  setenv("UV_THREADPOOL_SIZE", v, 1);
}

/* --kv-events-endpoint: the publisher every language model's prefix cache reports to. A socket that
 * cannot be bound is a configuration error (exit status 2), before any model loads. */
static int start_kv_events(const servd_config *c, servd_kv_events **out) {
  if (!c->kv_events_endpoint) return 0;
  servd_kv_events_options o = {.endpoint = c->kv_events_endpoint,
                               .replay_endpoint = c->kv_events_replay_endpoint,
                               .topic = c->kv_events_topic};
  if (servd_kv_events_create(&o, out) != 0) {
    fprintf(stderr, "servd: %s\n", servd_last_error());
    return 2;
  }
  servd_engine_set_kv_events(*out);
  fprintf(stderr, "servd: KV-cache events on %s%s%s\n", c->kv_events_endpoint,
          c->kv_events_replay_endpoint ? ", replay on " : "",
          c->kv_events_replay_endpoint ? c->kv_events_replay_endpoint : "");
  return 0;
}

int servd_serve_main(int argc, char **argv) {
  server s;
  memset(&s, 0, sizeof s);
  servd_config_init(&s.cfg);
  bool exit_now = false;
  int rc = servd_config_parse_args(&s.cfg, argc, argv, &exit_now);
  if (rc != 0) {
    fprintf(stderr, "servd: %s\n", servd_last_error());
    servd_config_free(&s.cfg);
    return 2;
  }
  if (exit_now) {
    servd_config_free(&s.cfg);
    return 0;
  }
  if (s.cfg.tls_cert) {
    /* Before anything slow: a bad certificate or key is a configuration error naming the file. */
    static const char *const alpn[] = {"http/1.1"}; /* add "h2" once this listener speaks it */
    servd_tls_options to = {s.cfg.tls_cert, s.cfg.tls_key, s.cfg.tls_ca, alpn, 1};
    static const char *const h2[] = {"h2"};
    servd_tls_options gto = {s.cfg.tls_cert, s.cfg.tls_key, s.cfg.tls_ca, h2, 1};
    if (servd_tls_ctx_create(&to, &s.tls) != 0 ||
        (s.cfg.grpc_port >= 0 && servd_tls_ctx_create(&gto, &s.grpc_tls) != 0)) {
      fprintf(stderr, "servd: %s\n", servd_last_error());
      servd_tls_ctx_destroy(s.tls);
      servd_config_free(&s.cfg);
      return 2;
    }
  }
  if ((rc = resolve_model_sources(&s.cfg)) != 0) {
    servd_config_free(&s.cfg);
    return rc;
  }
  if ((rc = report_backend(&s.cfg)) != 0) {
    servd_config_free(&s.cfg);
    return rc;
  }
  servd_components_report(stderr);
  /* Every language model this process loads (also through the repository API) uses the GPUs. */
  servd_engine_set_gpu_defaults(s.cfg.gpus, s.cfg.gpu_memory_fraction, s.cfg.cuda_graphs, s.cfg.cuda_graph_max_batch);
  servd_engine_set_step_timeout(s.cfg.step_timeout_s);
  servd_engine_set_isolation(s.cfg.isolation);                               /* repository loads too */
  servd_engine_set_package_checks(s.cfg.verify_weights, s.cfg.trusted_keys); /* repository loads too */
  if (s.cfg.trusted_keys && (rc = servd_check_trusted_keys(s.cfg.trusted_keys)) != 0) {
    servd_config_free(&s.cfg);
    return rc;
  }
  servd_engine_set_load_timeout(s.cfg.load_timeout_s); /* repository loads too */
  servd_engine_set_prefix_cache(s.cfg.prefix_cache);
  servd_engine_set_max_step_ms(s.cfg.max_step_ms);
  servd_engine_set_speculation(s.cfg.speculative, s.cfg.num_speculative_tokens);
  servd_engine_set_kv_dtype(s.cfg.kv_cache_dtype ? (servd_dtype)(s.cfg.kv_cache_dtype - 1) : SERVD_DTYPE_COUNT);
  servd_kv_events *kv_events = NULL;
  if ((rc = start_kv_events(&s.cfg, &kv_events)) != 0) {
    servd_config_free(&s.cfg);
    return rc;
  }
  /* Before the first interpreter namespace exists: see gpu_prewarm.c. */
  for (int i = 0; s.cfg.gpus > 0 && i < s.cfg.n_models; i++) {
    servd_model_options mo;
    servd_config_model_options(&s.cfg, i, &mo);
    servd_gpu_prewarm(&mo);
  }
  if ((rc = servd_threadpool_init(s.cfg.threads)) != 0)
    fprintf(stderr, "servd: warning: compute threads: %s\n", servd_last_error());
  fprintf(stderr, "servd: %d compute threads\n", servd_threadpool_size());
  if (s.cfg.activation_levels) servd_cpu_set_activation_levels(s.cfg.activation_levels); /* 1..2: checked */
  set_worker_threads(&s.cfg);
  signal(SIGPIPE, SIG_IGN);

  s.loop = uv_default_loop();
  servd_api_options ao;
  servd_api_options_default(&ao);
  ao.ops = &servd_engine_model_ops;
  ao.api_key = s.cfg.api_key;
  ao.metrics_public = s.cfg.metrics_public;
  ao.access_log = (servd_access_log)s.cfg.access_log;
  ao.default_deadline_ms = (int)(s.cfg.request_timeout_s * 1000.0);
  ao.max_n = s.cfg.max_n;
  ao.repository = (const char *const *)s.cfg.repository;
  ao.n_repository = s.cfg.n_repository;
  ao.model_defaults.interpreters = s.cfg.interpreters;
  ao.model_defaults.tp = s.cfg.tp;
  ao.model_defaults.max_queue = s.cfg.max_queue;
  if (s.cfg.max_seqs > 0) ao.model_defaults.max_seqs = s.cfg.max_seqs;
  if (s.cfg.max_batch_tokens > 0) ao.model_defaults.max_batch_tokens = s.cfg.max_batch_tokens;
  ao.unload_timeout_ms = (int)(s.cfg.drain_timeout_s * 1000.0);
  ao.on_model_loaded = on_model_loaded;
  ao.ud = &s;
  if ((rc = servd_api_create(s.loop, &ao, &s.api)) != 0) {
    fprintf(stderr, "servd: %s\n", servd_last_error());
    servd_config_free(&s.cfg);
    return 1;
  }
  if (s.cfg.idle_unload_s > 0) servd_api_set_idle_unload(s.api, s.cfg.idle_unload_s);
  if (s.cfg.otlp_traces_endpoint && servd_api_set_otlp_traces(s.api, s.cfg.otlp_traces_endpoint) != 0) {
    fprintf(stderr, "servd: %s\n", servd_last_error());
    servd_api_close(s.api, NULL, NULL);
    uv_run(s.loop, UV_RUN_DEFAULT);
    servd_config_free(&s.cfg);
    return 2;
  }
  servd_http_limits lim;
  servd_http_limits_default(&lim);
  lim.max_body_bytes = s.cfg.max_body_bytes;
  lim.max_header_bytes = s.cfg.max_header_bytes;
  lim.request_timeout_ms = (int)(s.cfg.read_timeout_s * 1000.0);
  lim.idle_timeout_ms = (int)(s.cfg.idle_timeout_s * 1000.0);
  lim.max_connections = s.cfg.max_connections;
  servd_http_callbacks cb = servd_api_http_callbacks(s.api);
  if ((rc = servd_http_server_create(s.loop, &lim, &cb, &s.http)) == 0) servd_http_server_set_tls(s.http, s.tls);
  if (rc != 0 || (rc = servd_http_server_listen(s.http, s.cfg.host, s.cfg.port)) != 0) {
    fprintf(stderr, "servd: %s\n", servd_last_error());
    if (s.http) servd_http_server_close(s.http, NULL, NULL);
    servd_api_close(s.api, NULL, NULL);
    uv_run(s.loop, UV_RUN_DEFAULT);
    servd_config_free(&s.cfg);
    return rc == SERVD_EINVAL ? 2 : 1; /* a bad address is a configuration error; a taken port is not */
  }
  servd_api_set_server(s.api, s.http);
  if (s.cfg.grpc_port >= 0) {
    servd_grpc_limits gl;
    servd_grpc_limits_default(&gl);
    gl.max_message_bytes = s.cfg.grpc_max_message_bytes;
    gl.max_connections = s.cfg.max_connections;
    gl.handshake_timeout_ms = (int)(s.cfg.read_timeout_s * 1000.0); /* as the HTTP port's */
    if ((rc = servd_grpc_server_create(s.loop, s.api, &gl, &s.grpc)) == 0)
      servd_grpc_server_set_tls(s.grpc, s.grpc_tls);
    if (rc != 0 || (rc = servd_grpc_server_listen(s.grpc, s.cfg.host, s.cfg.grpc_port)) != 0) {
      fprintf(stderr, "servd: %s\n", servd_last_error());
      servd_grpc_server_close(s.grpc, NULL, NULL);
      servd_http_server_close(s.http, NULL, NULL);
      servd_api_close(s.api, NULL, NULL);
      uv_run(s.loop, UV_RUN_DEFAULT);
      servd_config_free(&s.cfg);
      return rc == SERVD_EINVAL ? 2 : 1;
    }
  }
  /* Before the port line: whoever waits for it may signal servd at once. */
  uv_timer_init(s.loop, &s.drain_timer);
  s.drain_timer.data = &s;
  for (size_t i = 0; i < N_SIGNALS; i++) {
    uv_signal_init(s.loop, &s.sigs[i]);
    s.sigs[i].data = &s;
    uv_signal_start(&s.sigs[i], on_signal, handled_signals[i].signum);
  }
  fprintf(stderr, "servd: listening on %s://%s:%d\n", s.tls ? "https" : "http", s.cfg.host,
          servd_http_server_port(s.http));
  /* A line tests and scripts can wait for when they asked for port 0. */
  if (s.grpc) {
    fprintf(stderr, "servd: gRPC (KServe v2%s) on %s:%d\n", s.grpc_tls ? ", TLS" : "", s.cfg.host,
            servd_grpc_server_port(s.grpc));
    fprintf(stdout, "servd: grpc port %d\n", servd_grpc_server_port(s.grpc));
  }
  fprintf(stdout, "servd: port %d\n", servd_http_server_port(s.http));
  fflush(stdout);

  for (int i = 0; i < s.cfg.n_models; i++) {
    servd_model_options mo;
    servd_config_model_options(&s.cfg, i, &mo);
    if ((rc = servd_api_load_model(s.api, &mo)) != 0) {
      fprintf(stderr, "servd: %s\n", servd_last_error());
      s.exit_code = 1;
      begin_drain(&s, "startup failure");
      break;
    }
  }
  if (s.cfg.n_models == 0) {
    s.startup_done = true;
    fprintf(stderr, "servd: no models given; serving none (load them through /v2/repository)\n");
  }
  fflush(stderr);
  uv_run(s.loop, UV_RUN_DEFAULT);
  uv_loop_close(s.loop);
  servd_kv_events_destroy(kv_events); /* after the models: their last events go out */
  int code = s.exit_code;
  servd_tls_ctx_destroy(s.tls);
  servd_tls_ctx_destroy(s.grpc_tls);
  servd_config_free(&s.cfg);
  return code;
}
