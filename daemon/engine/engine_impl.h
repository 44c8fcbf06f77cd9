/* Internal structures of the engine, shared by its files. */
#ifndef SERVD_ENGINE_IMPL_H
#define SERVD_ENGINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/batcher.h"
#include "engine/engine.h"
#include "engine/guide.h"
#include "engine/interp_thread.h"
#include "engine/isolated.h"
#include "engine/lora_registry.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "engine/speculate.h"
#include "engine/step.h"
#include "engine/step_rows.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "mpk/package.h"
#include "servd/clock.h"
#include "servd/interp.h"
#include "servd/tokenizer.h"

#define SERVD_MAX_EOS 8

struct servd_request {
  servd_model *m;
  sched_seq seq;
  int n_prompt;
  servd_gen_params p; /* stop/stop_token_ids point into the copies below */
  char **stop_copy;
  int32_t *stop_ids_copy;
  servd_event_cb cb;
  void *ud;
  pthread_mutex_t cb_mu; /* recursive: held while calling cb; release takes it */
  bool released;         /* the caller dropped its handle: no more callbacks */
  bool finished;         /* final event delivered (or suppressed) */
  atomic_bool cancel;
  atomic_int refs;     /* caller handle + engine */
  int64_t deadline_ns; /* CLOCK_MONOTONIC; 0: none */
  int n_generated;
  servd_detok *detok;
  servd_sampler *sampler;
  servd_stop_matcher *stopper;
  servd_guide_seq guide; /* constrained decoding (engine/guide.h) */
  struct servd_request *inbox_next;
  /* servd_now_ns() at submit, first scheduled, first and latest token (0: not yet): the final
   * event's queue, prefill and decode times. */
  int64_t t_queued_ns, t_scheduled_ns, t_first_ns, t_last_ns;
  servd_pool_sum pool; /* embeddings: the pooled hidden rows so far */
  float *embedding;    /* embeddings: the final vector (pool.dim floats), set when the prompt is done */
  int n_embedding;
  int lp_next;         /* prompt logprobs: the next prompt position to report (positions before it were) */
  servd_spec_seq spec; /* speculation: this step's drafts, the acceptance so far */
  lora_adapter *lora;  /* the LoRA adapter it holds (NULL: the base alone), released at its end */
};

struct servd_model {
  servd_model_options o;
  char *name;
  servd_model_kind kind;
  mpk_package *pkg;
  servd_pool *pool;
  int tp;
  servd_comm *comm;
  servd_batcher *batcher; /* generic packages with max_batch_size > 1 */
  servd_isolated *iso;    /* generic packages with isolation: the child serving them (no pool here) */

  /* causal-lm */
  servd_tokenizer *tok;
  servd_kv_cache *kv[SERVD_INTERP_MAX]; /* on GPUs: block bookkeeping only */
  servd_runner *runner;
  /* GPUs (gpus > 0): rank r runs on devices[r] */
  int gpus;
  int devices[SERVD_INTERP_MAX];
  servd_device_kv *dkv[SERVD_INTERP_MAX];
  servd_device_comm *dcomm;
  int n_layers, kv_heads, head_dim, block_size; /* KV geometry per rank (set before the GPU setup) */
  size_t gpu_base_free[SERVD_INTERP_MAX];       /* free device memory per rank after the weights */
  size_t gpu_total[SERVD_INTERP_MAX];           /* device memory per rank */
  size_t gpu_step_bytes[SERVD_INTERP_MAX];      /* measured by the warm-up, per rank */
  size_t gpu_kv_bytes;                          /* the KV cache of one rank */
  int startup_rc;                               /* the scheduler thread's setup (under mu); 1: still running */
  char startup_err[1024];
  servd_scheduler sched;
  struct prefix_disk *prefix_disk; /* the prefix cache's disk tier (--prefix-cache-dir); NULL: none */
  servd_spec spec;                 /* speculative decoding; its counters under mu */
  step_plan plan;                  /* the step being run (engine/step.h), its rows preallocated */
  int context_length;
  int vocab;
  int32_t eos[SERVD_MAX_EOS];
  int n_eos;
  servd_gen_params gen_defaults; /* servd_gen_params_default + the package's generation_config.json */
  pthread_mutex_t chat_mu;       /* serializes template rendering on the spare interpreter */
  int chat_interp;               /* index of the interpreter that renders templates (-1: none) */
  servd_interp_thread *ithread;  /* causal-lm: starts, renders templates on, and finalizes the pool */

  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  servd_request *inbox_head, *inbox_tail;
  int n_inbox;
  bool stopping; /* no more submits */
  bool quit;     /* scheduler thread exits */
  int64_t drain_deadline_ns;

  /* stats (under mu) */
  int n_waiting, n_running;
  uint64_t prompt_tokens, generation_tokens, steps, preemptions;
  uint64_t pick_steps; /* GPU steps that returned picks (servd_forward_batch.want_picks) */
  int64_t last_progress_ns;
  int kv_used;
  int kv_cached;                        /* full blocks in the prefix cache */
  uint64_t prefix_queries, prefix_hits; /* tokens */
  servd_sampler_scratch *scratch;       /* shared by the samplers: they all run on the scheduler thread */
  servd_guides *guides;                 /* constrained decoding (causal-lm) */
  /* Embeddings: the package's pooling and the vector's length. Prompt logprobs: one row's best
   * (scheduler thread). */
  servd_embedding_info emb;
  servd_top_logprob lp_top[SERVD_SAMPLER_MAX_TOP];
  lora_registry loras; /* causal-lm: its LoRA adapters (engine_lora.c) */
};

#endif
