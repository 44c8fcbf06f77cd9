/* servd's configuration: defaults, then a JSON file (--config), then command-line flags.
 * The file format is documented in docs/operations.md; configs/servd.example.json is an example.
 */
#ifndef SERVD_CONFIG_H
#define SERVD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "engine/engine.h"

typedef struct servd_model_config {
  char *path; /* owned */
  char *name; /* owned; NULL: the package's name */
  /* 0: inherit the server-wide value */
  int interpreters, tp, max_queue, max_batch_tokens, max_seqs, kv_blocks, block_size, max_batch_size;
  int max_batch_delay_ms;
  int isolation;      /* 0: inherit; else 1 + servd_isolation */
  int kv_cache_dtype; /* 0: inherit; else 1 + servd_dtype */
} servd_model_config;

typedef struct servd_config {
  char *host;
  int port;
  int grpc_port;                 /* gRPC listener; -1: none (0 picks a free port) */
  size_t grpc_max_message_bytes; /* largest gRPC request message */
  int threads;                   /* compute threads; 0: online CPUs */
  int activation_levels;         /* quantized matmuls' activations: 1 or 2 int8 levels; 0: the kernels' default */
  int gpus;                      /* GPUs required; 0: CPU backend */
  int tp;                        /* tensor-parallel ranks; 0 until parsed: then 1, or gpus with GPUs */
  int interpreters, max_queue, max_batch_tokens, max_seqs, kv_blocks, block_size;
  double gpu_memory_fraction; /* of the free memory after the weights, for the KV cache: (0, 1] */
  bool cuda_graphs;           /* decode steps as CUDA graphs */
  bool prefix_cache;          /* share the KV blocks of common prompt beginnings (--no-prefix-cache) */
  int max_step_ms;            /* target of a step that carries decodes (--max-step-ms); 0: no bound */
  int speculative;            /* servd_spec_mode (--speculative auto|off|ngram|suffix) */
  int num_speculative_tokens; /* drafts per verify row at most (--num-speculative-tokens); 0: default */
  int max_model_len;          /* cap on each language model's context and KV sizing (--max-model-len); 0: none */
  int cuda_graph_max_batch;   /* largest decode batch run as a graph */
  int kv_cache_dtype;         /* 0: each package's default (else f16); else 1 + servd_dtype (--kv-cache-dtype) */
  char *prefix_cache_dir;     /* NULL: the prefix cache in memory only; else also on disk here */
  int prefix_cache_dir_mb;    /* bound on each model's files there; 0: 4096 */
  char *api_key;
  bool metrics_public;      /* GET /metrics without the API key (Prometheus scrapers) */
  bool verify_weights;      /* hash the weights at load, not only the code and small entries */
  char *trusted_keys;       /* NULL, or a PEM public key or folder of them: only signed packages load */
  char *tls_cert, *tls_key; /* both or neither: HTTPS on the HTTP port (PEM files, re-read on SIGHUP) */
  char *tls_ca;             /* NULL, or PEM CAs: clients must present a certificate they signed */
  int access_log;           /* servd_access_log */
  double drain_timeout_s;
  double request_timeout_s;  /* default per-request deadline; 0: none */
  double step_timeout_s;     /* a language model's forward step is interrupted after this; 0: never */
  servd_isolation isolation; /* default of generic models (--isolation) */
  double load_timeout_s;     /* a model's package import must finish within this; 0: no limit */
  double read_timeout_s, idle_timeout_s;
  size_t max_body_bytes, max_header_bytes;
  int max_connections;
  int max_n;
  /* KV-cache events (engine/kv_events.h): PUB endpoint (NULL: none), replay ROUTER endpoint, topic. */
  char *kv_events_endpoint, *kv_events_replay_endpoint, *kv_events_topic;
  char *otlp_traces_endpoint; /* OTLP/HTTP collector for request spans; NULL: no traces */
  /* Unload a model idle this long until its next request (sleep level 2); 0: never. */
  double idle_unload_s;
  char *package_cache; /* NULL: the default; where GGUF and Hugging Face sources are packed (package_cache.h) */
  char **repository;   /* directories for the repository API */
  int n_repository;
  servd_model_config *models;
  int n_models;
  char **loras; /* --lora NAME=PATH[,base=MODEL] specs (lora_spec.h), registered once their base loads */
  int n_loras;
  int max_loras; /* LoRA adapters resident per language model (--max-loras); 0: the engine's default */
} servd_config;

void servd_config_init(servd_config *c);
void servd_config_free(servd_config *c); /* accepts a zeroed config */
/* Merges a JSON config file into c. Unknown keys are errors (typos must not pass silently). */
int servd_config_load_file(servd_config *c, const char *path);
/* Applies flags (and --config FILE first, wherever it appears), then checks the combination (--tp
 * with --gpus) and resolves tp. *exit_now is set for --help and --version, which print to stdout.
 * Errors name the flag and what was expected. */
int servd_config_parse_args(servd_config *c, int argc, char **argv, bool *exit_now);
/* Engine options of model i with server-wide values filled in; strings borrowed from c. */
void servd_config_model_options(const servd_config *c, int i, servd_model_options *o);
void servd_config_usage(FILE *f);

#endif
