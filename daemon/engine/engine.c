/* The engine of one loaded model: loading, requests, and the scheduler thread (continuous batching).
 *
 * Threads: callers submit/cancel from any thread; one scheduler thread per causal-lm model plans each
 * step, runs it on every tensor-parallel rank (model_runner), samples, detokenizes, applies stops and
 * calls back. The model mutex guards the inbox, the flags and the stats; the scheduler's lists are
 * touched by the scheduler thread only.
 */
#include "engine/engine_impl.h"
#include "engine/kv_dtype.h"
#include "engine/prefix_tier.h"
#include "engine/request.h"
#include "engine/step.h"
#include "engine/py_deps.h"
#include "engine/model_geometry.h"
#include "engine/gpu_setup.h"
#include "engine/model_error.h"
#include "engine/package_checks.h"
#include "engine/engine_lora.h"
#include "engine/kv_events.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STUCK_SECONDS 60.0

/* Set once at startup (servd_engine_set_gpu_defaults), before any model loads. */
static struct {
  int gpus;
  double fraction;
  bool graphs;
  int graph_max_batch;
} gpu_defaults = {0, 0.90, true, 64};

static double step_timeout_default = 120.0;
static double load_timeout_default = 300.0;

void servd_engine_set_step_timeout(double seconds) { step_timeout_default = seconds > 0 ? seconds : 0; }
void servd_engine_set_load_timeout(double seconds) { load_timeout_default = seconds > 0 ? seconds : 0; }
static bool prefix_cache_default = true;
void servd_engine_set_prefix_cache(bool on) { prefix_cache_default = on; }
static int max_step_ms_default = SERVD_DEFAULT_MAX_STEP_MS;
void servd_engine_set_max_step_ms(int ms) { max_step_ms_default = ms > 0 ? ms : 0; }
static servd_isolation isolation_default = SERVD_ISOLATION_AUTO;
static int speculative_default = SERVD_SPEC_AUTO, speculative_tokens_default = 0;
void servd_engine_set_speculation(int mode, int num_speculative_tokens) {
  speculative_default = mode;
  speculative_tokens_default = num_speculative_tokens;
}
void servd_engine_set_isolation(servd_isolation isolation) { isolation_default = isolation; }

void servd_engine_set_gpu_defaults(int gpus, double gpu_memory_fraction, bool cuda_graphs, int cuda_graph_max_batch) {
  gpu_defaults.gpus = gpus > 0 ? gpus : 0;
  gpu_defaults.fraction = gpu_memory_fraction;
  gpu_defaults.graphs = cuda_graphs;
  gpu_defaults.graph_max_batch = cuda_graph_max_batch;
}

void servd_model_options_default(servd_model_options *o) {
  memset(o, 0, sizeof *o);
  o->interpreters = 1;
  o->tp = gpu_defaults.gpus > 0 ? gpu_defaults.gpus : 1;
  o->max_queue = 256;
  o->max_batch_tokens = 512;
  o->max_seqs = 32;
  o->kv_blocks = 0;
  o->block_size = 16;
  o->max_batch_size = 1;
  o->max_batch_delay_ms = 0;
  o->kv_dtype = SERVD_DTYPE_COUNT; /* the package's default, else f16 */
  o->kv_budget_mb = 2048;
  o->gpus = gpu_defaults.gpus;
  o->gpu_memory_fraction = gpu_defaults.fraction;
  o->cuda_graphs = gpu_defaults.graphs;
  o->cuda_graph_max_batch = gpu_defaults.graph_max_batch;
  o->step_timeout_s = step_timeout_default;
  servd__package_checks_default(o);
  o->load_timeout_s = load_timeout_default;
  o->isolation = isolation_default;
  o->prefix_cache = prefix_cache_default;
  o->max_step_ms = max_step_ms_default;
  o->speculative = speculative_default;
  o->num_speculative_tokens = speculative_tokens_default;
  o->max_loras = servd__max_loras_default();
  o->kv_events = servd_kv_events_default();
  o->extra_sys_path = servd_py_deps_dir(); /* servd's own Python packages (llguidance), when installed */
}

void servd_gen_params_default(servd_gen_params *p) {
  memset(p, 0, sizeof *p);
  p->max_tokens = 0;
  p->temperature = 1.0f;
  p->top_p = 1.0f;
  p->repetition_penalty = 1.0f;
  p->logprobs = -1;
}

/* ---- helpers ------------------------------------------------------------------------------------ */

static void add_eos(servd_model *m, int64_t id) {
  if (id < 0 || id >= m->vocab) return;
  for (int i = 0; i < m->n_eos; i++)
    if (m->eos[i] == id) return;
  if (m->n_eos < SERVD_MAX_EOS) m->eos[m->n_eos++] = (int32_t)id;
}

static void add_eos_json(servd_model *m, json_t *v) {
  if (json_is_integer(v)) {
    add_eos(m, json_integer_value(v));
  } else if (json_is_array(v)) {
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) add_eos_json(m, e);
  } else if (json_is_string(v) && m->tok) {
    add_eos(m, servd_tokenizer_token_id(m->tok, json_string_value(v)));
  } else if (json_is_object(v)) { /* tokenizer_config.json AddedToken */
    add_eos_json(m, json_object_get(v, "content"));
  }
}

/* End-of-sequence ids: the model config's eos_token_id, the manifest's special tokens, and the
 * package's tokenizer_config.json / generation_config.json when present. */
static void find_eos(servd_model *m) {
  json_t *man = mpk_manifest(m->pkg), *cfg = mpk_config(m->pkg);
  add_eos_json(m, json_object_get(cfg, "eos_token_id"));
  add_eos_json(m, json_object_get(man, "eos_token_id"));
  json_t *sp = json_object_get(man, "special_tokens");
  add_eos_json(m, json_object_get(sp, "eos_token"));
  add_eos_json(m, json_object_get(sp, "eos_token_id"));
  /* The manifest names the tokenizer config entry (tokenizer.config); older layouts use the HF name. */
  json_t *tcfg = json_object_get(json_object_get(man, "tokenizer"), "config");
  const char *files[] = {json_is_string(tcfg) ? json_string_value(tcfg) : "tokenizer_config.json",
                         "generation_config.json"};
  for (int f = 0; f < 2; f++) {
    const void *data;
    size_t len;
    if (mpk_file(m->pkg, files[f], &data, &len)) continue;
    json_t *j = json_loadb(data, len, 0, NULL);
    if (!j) continue;
    add_eos_json(m, json_object_get(j, f == 0 ? "eos_token" : "eos_token_id"));
    json_decref(j);
  }
  servd_fail(0, "%s", ""); /* the look-ups above may have recorded harmless misses */
}

/* Request defaults from the package's generation_config.json (packs of Hugging Face models keep it),
 * the fields vLLM takes from it: a request that omits them gets the model's recommended sampling. */
static void read_gen_defaults(servd_model *m) {
  servd_gen_params_default(&m->gen_defaults);
  const void *data;
  size_t len;
  if (mpk_file(m->pkg, "generation_config.json", &data, &len)) {
    servd_fail(0, "%s", ""); /* most packages have none */
    return;
  }
  json_t *j = json_loadb(data, len, 0, NULL), *v;
  servd_gen_params *p = &m->gen_defaults;
  if ((v = json_object_get(j, "temperature")) && json_is_number(v) && json_number_value(v) >= 0 &&
      json_number_value(v) <= 2)
    p->temperature = (float)json_number_value(v);
  if ((v = json_object_get(j, "top_p")) && json_is_number(v) && json_number_value(v) > 0 && json_number_value(v) <= 1)
    p->top_p = (float)json_number_value(v);
  if ((v = json_object_get(j, "min_p")) && json_is_number(v) && json_number_value(v) >= 0 && json_number_value(v) <= 1)
    p->min_p = (float)json_number_value(v);
  if ((v = json_object_get(j, "top_k")) && json_is_integer(v) && json_integer_value(v) >= 0 &&
      json_integer_value(v) <= (1 << 20))
    p->top_k = (int)json_integer_value(v);
  if ((v = json_object_get(j, "repetition_penalty")) && json_is_number(v) && json_number_value(v) > 0 &&
      json_number_value(v) <= 10)
    p->repetition_penalty = (float)json_number_value(v);
  json_decref(j);
}

void servd_model_gen_params_default(const servd_model *m, servd_gen_params *p) {
  if (m && m->kind == SERVD_MODEL_CAUSAL_LM) *p = m->gen_defaults;
  else servd_gen_params_default(p);
}

int servd_model_vocab_size(const servd_model *m) { return m->vocab; }

/* ---- requests ----------------------------------------------------------------------------------- */

/* ---- the scheduler thread ----------------------------------------------------------------------- */

static bool has_work(servd_model *m) { return m->inbox_head || m->sched.waiting.n || m->sched.running.n; }

/* Cancels, deadlines and the drain deadline, over every request the scheduler holds. */
static void reap(servd_model *m, int64_t now, bool drain_expired) {
  sched_list *lists[2] = {&m->sched.waiting, &m->sched.running};
  for (int l = 0; l < 2; l++) {
    for (sched_seq *q = lists[l]->head; q;) {
      sched_seq *next = q->next;
      servd_request *r = q->owner;
      if (atomic_load(&r->cancel) || drain_expired) request_finish(m, r, "cancelled", 0, NULL);
      else if (r->deadline_ns && now > r->deadline_ns) request_finish(m, r, "deadline", 0, NULL);
      q = next;
    }
  }
}

static int scheduler_setup(servd_model *m);

static void scheduler_run(servd_model *m) {
  /* The setup that needs this thread (GPUs: rank 0's warm-up runs on the thread of its steps). */
  int src = scheduler_setup(m);
  pthread_mutex_lock(&m->mu);
  m->startup_rc = src;
  if (src) snprintf(m->startup_err, sizeof m->startup_err, "%s", servd_last_error());
  m->last_progress_ns = servd_now_ns();
  pthread_cond_broadcast(&m->wake);
  pthread_mutex_unlock(&m->mu);
  if (src) return;
  for (;;) {
    pthread_mutex_lock(&m->mu);
    while (!m->quit && !has_work(m)) {
      servd__kv_release_service(m); /* sleep, level 1 (engine_sleep.c) */
      pthread_cond_wait(&m->wake, &m->mu);
    }
    if (m->quit && !has_work(m)) {
      pthread_mutex_unlock(&m->mu);
      break;
    }
    servd_request *in = m->inbox_head;
    m->inbox_head = m->inbox_tail = NULL;
    m->n_waiting += m->n_inbox; /* they join the waiting queue below */
    m->n_inbox = 0;
    int64_t drain = m->drain_deadline_ns;
    pthread_mutex_unlock(&m->mu);

    for (servd_request *r = in; r;) {
      servd_request *next = r->inbox_next;
      sched_add(&m->sched, &r->seq);
      r = next;
    }
    int64_t now = servd_now_ns();
    reap(m, now, m->quit && drain && now > drain);

    step_plan_make(m, &m->plan);
    step_result res = {0};
    if (m->plan.n_tokens > 0 && !m->plan.error) step_run(m, &m->plan, &res);
    step_update(m, &m->plan, &res);
    servd_guides_flush(m); /* matchers of the requests that ended in this round */
    pthread_mutex_lock(&m->mu);
    m->n_waiting = m->sched.waiting.n;
    m->n_running = m->sched.running.n;
    m->kv_used = sched_used_blocks(&m->sched);
    m->preemptions = m->sched.preemptions;
    m->kv_cached = sched_cached_blocks(&m->sched);
    m->prefix_queries = m->sched.bm.pc.queries;
    m->prefix_hits = m->sched.bm.pc.hits;
    if (m->plan.n_tokens == 0 && !m->plan.error && has_work(m) && !m->inbox_head) {
      /* Work is pending but nothing can run (waiting for blocks that only a finishing request would
       * free cannot happen: then something runs). Sleep briefly to watch deadlines and cancels. */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 10 * 1000000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&m->wake, &m->mu, &ts);
    }
    pthread_mutex_unlock(&m->mu);
  }
}

static void *scheduler_main(void *arg) {
  pthread_setname_np(pthread_self(), "servd-sched"); /* names in crash reports, top -H, gdb */
  scheduler_run(arg);
  servd_device_thread_release(); /* rank 0 ran on a GPU here: its contexts go while the thread lives */
  return NULL;
}

/* ---- loading ------------------------------------------------------------------------------------ */

/* Jobs for the interpreter thread (interp_thread.h): the pool starts, renders and ends there. */

/* Creating the pool runs the package's import, under the load timeout. It holds what the import
 * uses (not the model): should the import block where TimeoutError cannot reach it, the job is
 * abandoned with its thread and must stay valid without the model. */
typedef struct pool_job {
  mpk_package *pkg;
  servd_pool_options po;
  servd_pool *pool;
} pool_job;

static _Atomic int quarantined_interpreters;

int servd_engine_quarantined_interpreters(void) { return atomic_load(&quarantined_interpreters); }

/* Past the load timeout TimeoutError is raised in the import; the thread is given this much more to
 * unwind and finalize the interpreters before the load is abandoned. */
#define LOAD_GRACE_MS 2000

static int pool_create_job(void *arg) {
  pool_job *j = arg;
  return servd_pool_create(j->pkg, &j->po, &j->pool);
}

/* An abandoned pool creation returned after all: its interpreters stay quarantined (never finalized,
 * never reused: they ran code that would not stop), so only the job's own memory goes. */
static void pool_job_orphan(void *arg) { free(arg); }

/* Starts the interpreter thread and creates m->pool on it within the load timeout. An import that
 * cannot be interrupted is abandoned: the thread, the package, the communicators the interpreters
 * hold and the interpreters themselves are left to it (quarantined), and the load fails. */
static int create_pool(servd_model *m, const servd_pool_options *po) {
  int rc;
  if ((rc = servd_interp_thread_start(&m->ithread))) return rc;
  pool_job *j = calloc(1, sizeof *j);
  if (!j) return servd_fail(SERVD_ENOMEM, "model load: pool job");
  j->pkg = m->pkg;
  j->po = *po;
  double lt = m->o.load_timeout_s > 0 ? m->o.load_timeout_s : 0;
  j->po.load_timeout_ms = (int64_t)(lt * 1000.0 + 0.5);
  bool abandoned = false;
  rc = servd_interp_thread_run_for(m->ithread, pool_create_job, j,
                                   j->po.load_timeout_ms > 0 ? j->po.load_timeout_ms + LOAD_GRACE_MS : 0,
                                   pool_job_orphan, &abandoned);
  if (abandoned) {
    m->ithread = NULL;
    m->pkg = NULL; /* mapped by the quarantined interpreters */
    m->comm = NULL;
    m->dcomm = NULL;
    int n = po->n_interpreters;
    atomic_fetch_add(&quarantined_interpreters, n);
    fprintf(stderr,
            "servd: model '%s': the package's import did not end %d ms after the load timeout; "
            "the load is abandoned and its %d interpreter%s quarantined (never reused; %d in this process)\n",
            m->name, LOAD_GRACE_MS, n, n == 1 ? " is" : "s are", servd_engine_quarantined_interpreters());
    return servd_fail(SERVD_ETIMEDOUT,
                      "the package's import did not finish within the load timeout of %.3g s "
                      "(--load-timeout) and could not be interrupted (blocked outside Python code, e.g. in "
                      "native code or a sleep); the load was abandoned",
                      lt);
  }
  m->pool = j->pool;
  free(j);
  if (rc == SERVD_ETIMEDOUT) { /* interrupted in Python: the interpreters were finalized */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", servd_last_error());
    rc = servd_fail(rc, "load timeout (--load-timeout): %s", msg);
  }
  return rc;
}

static int pool_destroy_job(void *arg) {
  servd_model *m = arg;
  servd_pool_destroy(m->pool);
  m->pool = NULL;
  return 0;
}

/* KV cache in host memory, the pool, the runner. kv_heads: per rank. */
static int load_on_cpu(servd_model *m, int n_layers, int kv_heads, int head_dim, int bs) {
  int rc;
  int blocks = m->o.kv_blocks;
  if (blocks <= 0) {
    /* Enough for max_seqs full contexts, capped by the memory budget (both ranks together). */
    size_t per_block = servd_kv_cache_block_bytes(n_layers, kv_heads, head_dim, bs, m->o.kv_dtype) * m->tp;
    size_t budget = (size_t)(m->o.kv_budget_mb > 0 ? m->o.kv_budget_mb : 2048) << 20;
    size_t want = (size_t)m->o.max_seqs * ((m->context_length + bs - 1) / bs);
    size_t cap = budget / per_block;
    blocks = (int)(want < cap ? want : cap);
    if (blocks < (m->context_length + bs - 1) / bs) blocks = (m->context_length + bs - 1) / bs;
  }
  for (int r = 0; r < m->tp; r++)
    if ((rc = servd_kv_cache_create(&m->kv[r], n_layers, kv_heads, head_dim, bs, blocks, m->o.kv_dtype))) return rc;

  if (m->tp > 1 && (rc = servd_comm_create(&m->comm, m->tp))) return rc;
  /* One interpreter per rank, plus one (rank 0's code) that renders chat templates without waiting
   * for a step to finish. */
  servd_pool_options po = {.n_interpreters = m->tp + 1,
                           .world_size = m->tp,
                           .comm = m->comm,
                           .extra_sys_path = m->o.extra_sys_path};
  if (po.n_interpreters > SERVD_INTERP_MAX) po.n_interpreters = m->tp;
  if ((rc = create_pool(m, &po))) return rc;
  m->chat_interp = po.n_interpreters > m->tp ? m->tp : 0;
  return servd_runner_create(m->pool, m->kv, m->tp, m->comm, &m->runner);
}

/* Waits, on the interpreter thread, for the device work the model's code queued there as it started
 * (weight uploads, tensors it keeps): the ranks use them from their own threads and streams. */
static int sync_devices_job(void *arg) {
  servd_model *m = arg;
  for (int r = 0; r < m->tp; r++) {
    int rc = servd_device_sync(m->devices[r]);
    if (rc) return rc;
  }
  return 0;
}

/* Rank r on GPU r: the pool first (the model's code uploads its weights to each GPU as it starts),
 * then one-block warm-up caches and the runner; the scheduler thread then profiles the steps' memory
 * and sizes the real KV cache (scheduler_setup, gpu_setup.h). kv_heads: per rank. */
static int load_on_gpus(servd_model *m) {
  int rc;
  if ((rc = servd_gpu_check(m))) return rc;
  if (m->tp > 1 && (rc = servd_device_comm_create(m->tp, m->devices, &m->dcomm))) return rc;
  /* The template interpreter has rank 0's code, so it runs on GPU 0 too: it shares rank 0's
   * uploaded weights (servd_device_weight hands out one copy per GPU). */
  servd_pool_options po = {.n_interpreters = m->tp + 1,
                           .world_size = m->tp,
                           .dcomm = m->dcomm,
                           .rank_devices = m->devices,
                           .extra_sys_path = m->o.extra_sys_path};
  if (po.n_interpreters > SERVD_INTERP_MAX) po.n_interpreters = m->tp;
  if ((rc = create_pool(m, &po))) return rc;
  m->chat_interp = po.n_interpreters > m->tp ? m->tp : 0;
  if ((rc = servd_interp_thread_run(m->ithread, sync_devices_job, m))) return rc;
  if ((rc = servd_gpu_warmup_prepare(m))) return rc;
  int bs = m->block_size;
  servd_runner_gpu g = {.devices = m->devices,
                        .dkv = m->dkv,
                        .dcomm = m->dcomm,
                        .max_tokens = m->o.max_batch_tokens,
                        .max_seqs = m->o.max_seqs,
                        .max_blocks_per_seq = (m->context_length + bs - 1) / bs,
                        .block_size = bs,
                        .graphs = m->o.cuda_graphs,
                        .graph_max_batch = m->o.cuda_graph_max_batch};
  return servd_runner_create_gpu(m->pool, m->kv, m->tp, &g, &m->runner);
}

/* On the scheduler thread, before its loop: GPUs: the warm-up and the KV cache; then the scheduler. */
static int scheduler_setup(servd_model *m) {
  int rc;
  if (m->gpus > 0) {
    int blocks = 0;
    if ((rc = servd_gpu_profile_and_setup(m, &blocks))) return rc;
  }
  servd_runner_set_step_timeout(m->runner, (int64_t)(m->o.step_timeout_s * 1000.0 + 0.5));
  sched_config sc = {.max_batch_tokens = m->o.max_batch_tokens,
                     .max_seqs = m->o.max_seqs,
                     .max_seq_len = m->context_length,
                     .prefix_cache = m->o.prefix_cache,
                     .cache_key = prefix_cache_key(m->name, m->o.path),
                     .max_step_ns = (int64_t)m->o.max_step_ms * 1000000,
                     .whole_embeddings = m->emb.bidirectional};
  if (m->gpus > 0) { /* the device step's logit buffers hold its capacity of sequences */
    int cap_tokens;
    servd_runner_capacity(m->runner, &cap_tokens, &sc.max_logit_rows);
  }
  if ((rc = sched_init(&m->sched, &sc, m->kv[0]))) return rc;
  /* Events first: blocks the disk tier brings back are announced too. */
  if ((rc = servd_kv_events_attach(m->o.kv_events, &m->sched.bm.pc, m->sched.bm.key, m->name, m->gpus > 0,
                                   &m->kv_events)))
    return rc;
  if ((rc = servd__prefix_tier_open(m))) return rc;
  if ((rc = servd_spec_init(&m->spec, (servd_spec_mode)m->o.speculative, m->o.num_speculative_tokens))) return rc;
  if ((rc = step_plan_init(&m->plan, m->o.max_seqs))) return rc;
  if ((rc = servd_guides_create(&m->guides))) return rc;
  return servd_sampler_scratch_create(m->vocab, &m->scratch);
}

/* A cross-encoder's labels: the rows of its "classifier.weight" (the canonical name of a
 * ForSequenceClassification head, package_format/src/arch_bert.c); 0: no classifier. */
static int classifier_labels(const mpk_package *p) {
  mpk_tensor_info ti;
  for (int i = 0; mpk_tensor_info_at(p, i, &ti) == 0; i++)
    if (!strcmp(ti.name, "classifier.weight")) return ti.ndim == 2 && ti.shape[0] <= INT32_MAX ? (int)ti.shape[0] : 0;
  return 0;
}

static int load_causal_lm(servd_model *m) {
  int rc;
  const void *tj;
  size_t tl;
  json_t *tf = json_object_get(json_object_get(mpk_manifest(m->pkg), "tokenizer"), "file");
  const char *tpath = json_is_string(tf) ? json_string_value(tf) : "tokenizer.json";
  if ((rc = mpk_file(m->pkg, tpath, &tj, &tl))) {
    char msg[512]; /* servd_fail writes the buffer servd_last_error returns: copy it first */
    snprintf(msg, sizeof msg, "%s", servd_last_error());
    return servd_fail(rc, "%s: causal-lm package: tokenizer file %s: %s", mpk_path(m->pkg), tpath, msg);
  }
  if ((rc = servd_tokenizer_load(tj, tl, &m->tok))) return rc;

  servd_model_geometry g;
  servd_model_geometry_read(mpk_config(m->pkg), &g);
  int n_layers = g.n_layers, n_heads = g.n_heads, n_kv = g.n_kv_heads, head_dim = g.head_dim;
  m->vocab = g.vocab ? g.vocab : servd_tokenizer_vocab_size(m->tok);
  m->context_length = g.context_length;
  if (m->o.max_context > 0 && m->o.max_context < m->context_length) m->context_length = m->o.max_context;
  if (n_layers <= 0 || n_heads <= 0 || n_kv <= 0 || head_dim <= 0 || m->vocab <= 0 || m->context_length <= 0)
    return servd_fail(SERVD_EFORMAT,
                      "%s: model config: num_hidden_layers=%d num_attention_heads=%d "
                      "num_key_value_heads=%d head_dim=%d vocab_size=%d max_position_embeddings=%d: "
                      "expected all > 0",
                      mpk_path(m->pkg), n_layers, n_heads, n_kv, head_dim, m->vocab, m->context_length);
  if (n_kv % m->tp || n_heads % m->tp)
    return servd_fail(SERVD_EINVAL,
                      "%s: --tp %d does not divide num_attention_heads=%d and "
                      "num_key_value_heads=%d",
                      mpk_path(m->pkg), m->tp, n_heads, n_kv);
  find_eos(m);
  read_gen_defaults(m);
  int n_labels = classifier_labels(m->pkg);
  if ((rc = servd_embedding_info_read(mpk_config(m->pkg), g.dim, &m->emb)) ||
      (n_labels > 0 && (rc = servd_score_info_read(mpk_config(m->pkg), n_labels, &m->emb)))) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", servd_last_error());
    return servd_fail(rc, "%s: %s", mpk_path(m->pkg), msg);
  }

  int bs = m->o.block_size > 0 ? m->o.block_size : 16;
  m->n_layers = n_layers;
  m->kv_heads = n_kv / m->tp;
  m->head_dim = head_dim;
  m->block_size = bs;
  m->gpus = m->o.gpus > 0 ? m->o.gpus : 0;
  if ((rc = servd__kv_dtype_resolve(m, head_dim))) return rc;
  if (m->gpus > 0) {
    if ((rc = load_on_gpus(m))) return rc;
  } else {
    if ((rc = load_on_cpu(m, n_layers, n_kv / m->tp, head_dim, bs))) return rc;
  }
  /* Warm-up steps (GPUs: on the scheduler thread, in scheduler_setup) are part of the load: the load
   * timeout bounds them, not the step timeout, which is sized for serving steps. */
  servd_runner_set_step_timeout(m->runner, (int64_t)(m->o.load_timeout_s * 1000.0 + 0.5));

  m->last_progress_ns = servd_now_ns();
  m->startup_rc = 1;
  if (pthread_create(&m->thread, NULL, scheduler_main, m))
    return servd_fail(SERVD_ENOMEM, "%s: starting the scheduler thread", mpk_path(m->pkg));
  m->thread_started = true;
  /* Wait for its setup (the GPU warm-up runs there); on failure it has ended. */
  pthread_mutex_lock(&m->mu);
  while (m->startup_rc == 1) pthread_cond_wait(&m->wake, &m->mu);
  rc = m->startup_rc;
  pthread_mutex_unlock(&m->mu);
  if (rc) return servd_fail(rc, "%s", m->startup_err);
  return 0;
}

/* The isolation a generic package runs with: the operator's, or for AUTO a process when the package
 * declares native code (its ctypes/cffi calls are beyond what in-process guards contain). */
static servd_isolation isolation_of(const servd_model *m, const servd_model_options *o) {
  if (o->isolation != SERVD_ISOLATION_AUTO) return o->isolation;
  json_t *caps = json_object_get(mpk_manifest(m->pkg), "capabilities");
  for (size_t i = 0; i < json_array_size(caps); i++)
    if (!strcmp(json_string_value(json_array_get(caps, i)), "native")) {
      fprintf(stderr,
              "servd: model '%s' declares native code (capabilities: native): its interpreters run in a "
              "process of their own (isolation \"none\" in its config runs it in-process)\n",
              m->name);
      return SERVD_ISOLATION_PROCESS;
    }
  return SERVD_ISOLATION_NONE;
}

int servd_model_load(const servd_model_options *o, servd_model **out) {
  *out = NULL;
  if (!o || !o->path) return servd_fail(SERVD_EINVAL, "model load: no package path");
  if (o->tp < 1 || o->tp > SERVD_INTERP_MAX)
    return servd_fail(SERVD_EINVAL, "model load: tp=%d: expected 1..%d", o->tp, SERVD_INTERP_MAX);
  if (o->max_batch_tokens < 1 || o->max_seqs < 1 || o->max_queue < 0)
    return servd_fail(SERVD_EINVAL, "model load: max_batch_tokens=%d max_seqs=%d max_queue=%d: expected >= 1",
                      o->max_batch_tokens, o->max_seqs, o->max_queue);
  int64_t t0 = servd_now_ns();
  char checks[512] = "";
  servd_model *m = calloc(1, sizeof *m);
  if (!m) return servd_fail(SERVD_ENOMEM, "model load: allocation");
  m->o = *o;
  m->tp = o->tp;
  m->chat_interp = -1;
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->wake, NULL);
  pthread_mutex_init(&m->chat_mu, NULL);
  int rc;
  if ((rc = mpk_open(o->path, &m->pkg))) goto fail;
  if ((rc = servd__model_check_package(m, checks, sizeof checks))) goto fail; /* before its code runs */
  m->name = strdup(o->name ? o->name : mpk_name(m->pkg));
  if (!m->name) {
    rc = servd_fail(SERVD_ENOMEM, "model load: name");
    goto fail;
  }
  const char *kind = mpk_kind(m->pkg);
  if (kind && strcmp(kind, "lora-adapter") == 0) {
    rc = servd_fail(SERVD_EINVAL, "%s: a LoRA adapter package, not a model: serve it with --lora NAME=%s on its base",
                    o->path, o->path);
    goto fail;
  }
  if (kind && strcmp(kind, "causal-lm") == 0) {
    m->kind = SERVD_MODEL_CAUSAL_LM;
    servd__model_lora_init(m);
    if ((rc = load_causal_lm(m))) goto fail;
  } else {
    m->kind = SERVD_MODEL_GENERIC;
    int n = o->interpreters > 0 ? o->interpreters : 1;
    servd_pool_options po = {.n_interpreters = n, .world_size = 1, .extra_sys_path = o->extra_sys_path};
    if (isolation_of(m, o) == SERVD_ISOLATION_PROCESS) { /* its interpreters live in a child process */
      if ((rc = servd_isolated_start(o, m->name, &m->iso))) goto fail;
      goto loaded;
    }
    /* Started and finalized on one thread (interp_thread.h): module code that imports `threading`
     * (logging does) would otherwise leave Py_FinalizeEx waiting at unload. */
    if ((rc = create_pool(m, &po))) goto fail;
    if (o->max_batch_size > 1 &&
        (rc = servd_batcher_create(m->pool, o->max_batch_size, o->max_batch_delay_ms, &m->batcher)))
      goto fail;
  }
loaded:
  servd__model_log_loaded(m, t0, checks);
  *out = m;
  return 0;
fail : {
  /* Keep the message of the failure across the cleanup. */
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", servd_last_error());
  servd_model_unload(m, 0);
  servd_fail(rc, "%s", msg);
}
  return rc;
}

void servd_model_unload(servd_model *m, int deadline_ms) {
  if (!m) return;
  if (m->thread_started) {
    pthread_mutex_lock(&m->mu);
    m->stopping = true;
    m->quit = true;
    m->drain_deadline_ns = servd_now_ns() + (int64_t)(deadline_ms > 0 ? deadline_ms : 0) * 1000000 + 1;
    pthread_cond_broadcast(&m->wake);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
  }
  servd_runner_destroy(m->runner);
  servd_isolated_stop(m->iso, deadline_ms);
  servd_batcher_destroy(m->batcher);
  servd_guides_stop(m->guides); /* its thread calls into the chat interpreter */
  if (m->ithread) servd_interp_thread_run(m->ithread, pool_destroy_job, m); /* finalize where it rendered */
  servd_interp_thread_stop(m->ithread);
  servd_pool_destroy(m->pool);
  servd__prefix_tier_close(m); /* writes what is queued */
  servd_kv_events_detach(m->kv_events, &m->sched.bm.pc);
  sched_free(&m->sched);
  servd_spec_free(&m->spec);
  step_plan_free(&m->plan);
  lora_registry_free(&m->loras); /* after the scheduler: its requests held adapters */
  for (int r = 0; r < SERVD_INTERP_MAX; r++) servd_kv_cache_destroy(m->kv[r]);
  servd_comm_destroy(m->comm);
  servd_gpu_teardown(m); /* after the pool: the interpreters held device tensors */
  servd_tokenizer_free(m->tok);
  servd_sampler_scratch_free(m->scratch);
  servd_guides_free(m->guides);
  mpk_close(m->pkg);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->wake);
  pthread_mutex_destroy(&m->chat_mu);
  free(m->name);
  free(m);
}

const char *servd_model_name(const servd_model *m) { return m->name; }
servd_model_kind servd_model_get_kind(const servd_model *m) { return m->kind; }
int servd_model_context_length(const servd_model *m) { return m->context_length; }

bool servd_model_ready(const servd_model *m) {
  if (m->iso) return servd_isolated_ready(m->iso);
  if (m->kind != SERVD_MODEL_CAUSAL_LM) return m->pool != NULL;
  servd_model_stats s;
  servd_model_get_stats(m, &s);
  /* A step the step timeout will still end is not stuck yet: wait for it, and a margin. */
  double stuck = STUCK_SECONDS;
  if (m->o.step_timeout_s > 0 && m->o.step_timeout_s + 30 > stuck) stuck = m->o.step_timeout_s + 30;
  return !m->stopping && s.last_step_age_s < stuck;
}

bool servd_model_restarting(const servd_model *m, char *why, size_t cap) {
  return m->iso && servd_isolated_down(m->iso, why, cap);
}

json_t *servd_model_metadata(const servd_model *m) {
  json_t *man = mpk_manifest(m->pkg);
  json_t *j = json_pack("{s:s, s:[s], s:s}", "name", m->name, "versions", "1", "platform", "servd");
  if (!j) return NULL;
  const char *keys[] = {"inputs", "outputs"};
  for (int i = 0; i < 2; i++) {
    json_t *v = json_object_get(man, keys[i]);
    json_object_set_new(j, keys[i], json_is_array(v) ? json_deep_copy(v) : json_array());
  }
  return j;
}

void servd_model_get_stats(const servd_model *m, servd_model_stats *s) {
  memset(s, 0, sizeof *s);
  servd_model *mm = (servd_model *)m; /* the mutex is logically const */
  pthread_mutex_lock(&mm->mu);
  s->waiting = m->n_waiting + m->n_inbox;
  s->running = m->n_running;
  s->prompt_tokens = m->prompt_tokens;
  s->generation_tokens = m->generation_tokens;
  s->preemptions = m->preemptions;
  s->steps = m->steps;
  s->pick_steps = m->pick_steps;
  s->spec_drafts = m->spec.c.drafts;
  s->spec_draft_tokens = m->spec.c.draft_tokens;
  s->spec_accepted_tokens = m->spec.c.accepted_tokens;
  for (int i = 0; i < SERVD_SPEC_MAX_DRAFT && i < 16; i++) s->spec_accepted_per_pos[i] = m->spec.c.accepted_per_pos[i];
  s->spec_max_draft = m->spec.mode == SERVD_SPEC_OFF ? 0 : m->spec.max_draft;
  s->kv_blocks_used = m->kv_used;
  s->kv_blocks_cached = m->kv_cached;
  s->prefix_cache_queries = m->prefix_queries;
  s->prefix_cache_hits = m->prefix_hits;
  servd_kv_events_source_stats(m->kv_events, &s->kv_events_queued, &s->kv_events_dropped);
  servd_guides_stats(m->guides, &s->guided_rows, &s->guided_mask_seconds, &s->guided_wait_seconds,
                     &s->guided_sequences);
  bool pending = m->inbox_head || m->n_waiting || m->n_running;
  s->last_step_age_s = pending ? (double)(servd_now_ns() - m->last_progress_ns) / 1e9 : 0.0;
  pthread_mutex_unlock(&mm->mu);
  s->kv_blocks_total = m->kv[0] ? servd_kv_cache_n_blocks(m->kv[0]) : 0;
  servd__kv_stats(m, s);
  servd__prefix_tier_stats(m, s);
  s->n_interpreters = m->pool ? servd_pool_size(m->pool) : 0;
  if (s->n_interpreters > 16) s->n_interpreters = 16;
  for (int i = 0; i < s->n_interpreters; i++)
    s->interp_busy_seconds[i] = servd_interp_busy_seconds(servd_pool_get(m->pool, i));
  s->isolated = m->iso != NULL;
  s->isolated_restarts = m->iso ? servd_isolated_restarts(m->iso) : 0;
  s->gpus = m->gpus;
  for (int r = 0; r < m->gpus && r < m->tp; r++) {
    s->gpu_step_bytes += m->gpu_step_bytes[r];
    s->gpu_base_bytes += m->gpu_total[r] - m->gpu_base_free[r];
    s->gpu_kv_bytes += m->gpu_kv_bytes;
  }
  if (m->runner) {
    servd_runner_stats rs;
    servd_runner_get_stats(m->runner, &rs);
    s->cuda_graph_replays = rs.graph_replays;
    s->cuda_graph_captures = rs.graph_captures;
    s->cuda_graph_capture_failures = rs.graph_capture_failures;
    s->eager_steps = rs.eager_steps;
  }
}

/* ---- causal-lm API ------------------------------------------------------------------------------ */

int servd_model_tokenize(servd_model *m, const char *text, size_t len, bool add_special, int32_t **ids, int *n) {
  if (!m->tok) return servd_fail(SERVD_EUNSUPPORTED, "tokenize: model %s has no tokenizer", m->name);
  return servd_tokenizer_encode(m->tok, text, len, add_special, ids, n);
}

int servd_model_tokenize_pair(servd_model *m, const char *a, size_t alen, const char *b, size_t blen, int max_len,
                              int32_t **ids, int *n, int *pair_split) {
  *pair_split = 0;
  if (!m->tok) return servd_fail(SERVD_EUNSUPPORTED, "tokenize: model %s has no tokenizer", m->name);
  int32_t *types = NULL;
  int rc = servd_tokenizer_encode_pair(m->tok, a, alen, b, blen, max_len, ids, &types, n);
  if (rc) return rc;
  for (int i = 0; i < *n && !*pair_split; i++)
    if (types[i]) *pair_split = i;
  free(types);
  return 0;
}

int servd_model_detokenize(servd_model *m, const int32_t *ids, int n, char **text) {
  if (!m->tok) return servd_fail(SERVD_EUNSUPPORTED, "detokenize: model %s has no tokenizer", m->name);
  return servd_tokenizer_decode(m->tok, ids, n, false, text, NULL);
}

typedef struct chat_job {
  servd_model *m;
  json_t *args, *res;
  servd_py_error err;
} chat_job;

static int chat_job_run(void *arg) {
  chat_job *j = arg;
  return servd_interp_call_json(servd_pool_get(j->m->pool, j->m->chat_interp), "chat_template", j->args, &j->res, 10000,
                                &j->err);
}

/* On the interpreter thread, never the caller's: see interp_thread.h. */
int servd_model_apply_chat_template(servd_model *m, json_t *messages, bool add_generation_prompt, char **text) {
  *text = NULL;
  if (m->kind != SERVD_MODEL_CAUSAL_LM || m->chat_interp < 0 || !m->ithread)
    return servd_fail(SERVD_EUNSUPPORTED, "chat template: model %s is not a language model", m->name);
  if (!json_is_array(messages)) return servd_fail(SERVD_EINVAL, "chat template: messages must be an array");
  json_t *args = json_pack("[O, b]", messages, add_generation_prompt);
  if (!args) return servd_fail(SERVD_ENOMEM, "chat template: arguments");
  chat_job j = {.m = m, .args = args};
  memset(&j.err, 0, sizeof j.err);
  pthread_mutex_lock(&m->chat_mu);
  int rc = servd_interp_thread_run(m->ithread, chat_job_run, &j);
  pthread_mutex_unlock(&m->chat_mu);
  json_t *res = j.res;
  servd_py_error err = j.err;
  json_decref(args);
  if (rc) {
    int code = servd_model_error_code(rc, &err, SERVD_CALL_TEMPLATE, NULL);
    if (!err.type[0]) {
      char msg[512]; /* servd_fail writes the buffer servd_last_error returns: copy it first */
      snprintf(msg, sizeof msg, "%s", servd_last_error());
      return servd_fail(code, "chat template: %s", msg);
    }
    return servd_fail(code, "chat template: %s: %s", err.type, err.message);
  }
  if (!json_is_string(res)) {
    json_decref(res);
    return servd_fail(SERVD_EFORMAT, "chat template: chat_template() returned a non-string");
  }
  *text = strdup(json_string_value(res));
  json_decref(res);
  return *text ? 0 : servd_fail(SERVD_ENOMEM, "chat template: result");
}

static int check_params(const servd_model *m, int n_prompt, const servd_gen_params *p) {
  if (n_prompt < 1) return servd_fail(SERVD_EINVAL, "submit: empty prompt");
  if (n_prompt >= m->context_length)
    return servd_fail(SERVD_EINVAL, "submit: prompt of %d tokens leaves no room in the context of %d", n_prompt,
                      m->context_length);
  if (!(p->temperature >= 0 && p->temperature <= 100))
    return servd_fail(SERVD_EINVAL, "submit: temperature %g: expected 0..100", p->temperature);
  if (!(p->top_p > 0 && p->top_p <= 1)) return servd_fail(SERVD_EINVAL, "submit: top_p %g: expected (0, 1]", p->top_p);
  if (!(p->min_p >= 0 && p->min_p <= 1)) return servd_fail(SERVD_EINVAL, "submit: min_p %g: expected [0, 1]", p->min_p);
  if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 10))
    return servd_fail(SERVD_EINVAL, "submit: repetition_penalty %g: expected (0, 10]", p->repetition_penalty);
  if (!(fabsf(p->presence_penalty) <= 2) || !(fabsf(p->frequency_penalty) <= 2))
    return servd_fail(SERVD_EINVAL, "submit: presence/frequency penalty: expected -2..2");
  if (p->logprobs > 20) return servd_fail(SERVD_EINVAL, "submit: logprobs %d: expected at most 20", p->logprobs);
  if (p->n_stop < 0 || p->n_stop > 16 || (p->n_stop && !p->stop))
    return servd_fail(SERVD_EINVAL, "submit: %d stop strings: expected at most 16", p->n_stop);
  if (p->n_stop_token_ids < 0 || p->n_stop_token_ids > 64 || (p->n_stop_token_ids && !p->stop_token_ids))
    return servd_fail(SERVD_EINVAL, "submit: %d stop token ids: expected at most 64", p->n_stop_token_ids);
  if (p->deadline_ms < 0) return servd_fail(SERVD_EINVAL, "submit: negative deadline");
  if (p->min_tokens < 0) return servd_fail(SERVD_EINVAL, "submit: min_tokens %d: expected >= 0", p->min_tokens);
  if (p->embed && p->dimensions != 0) {
    if (!m->emb.truncatable)
      return servd_fail(SERVD_EINVAL, "dimensions: this model's package does not allow truncated embeddings "
                                      "(its config has no matryoshka_dimensions)");
    if (p->dimensions < 1 || p->dimensions > m->emb.dim)
      return servd_fail(SERVD_EINVAL, "dimensions: %d: expected 1..%d", p->dimensions, m->emb.dim);
  }
  if (p->embed && m->emb.dim < 1)
    return servd_fail(SERVD_EUNSUPPORTED, "embeddings: the model config gives no hidden_size");
  if (p->score && m->emb.n_labels < 1)
    return servd_fail(SERVD_EUNSUPPORTED, "scores: model %s is not a cross-encoder (its package has no classifier)",
                      m->name);
  if (p->embed && !p->score && m->emb.n_labels > 0)
    return servd_fail(SERVD_EUNSUPPORTED,
                      "embeddings: model %s is a cross-encoder: it scores text pairs (/v1/rerank, /v1/score)", m->name);
  if (p->pair_split < 0 || (p->pair_split > 0 && !p->score))
    return servd_fail(SERVD_EINVAL, "submit: pair_split %d: expected 0, or a position of a score's prompt",
                      p->pair_split);
  return 0;
}

int servd_model_submit(servd_model *m, const int32_t *prompt, int n_prompt, const servd_gen_params *p,
                       servd_event_cb cb, void *ud, servd_request **out) {
  *out = NULL;
  if (m->kind != SERVD_MODEL_CAUSAL_LM)
    return servd_fail(SERVD_EUNSUPPORTED, "submit: model %s is not a language model", m->name);
  if (!cb || !prompt) return servd_fail(SERVD_EINVAL, "submit: no callback or prompt");
  int rc = check_params(m, n_prompt, p);
  if (rc) return rc;
  for (int i = 0; i < n_prompt; i++)
    if (prompt[i] < 0 || prompt[i] >= m->vocab)
      return servd_fail(SERVD_EINVAL, "submit: prompt token %d at %d outside the vocabulary of %d", prompt[i], i,
                        m->vocab);

  servd_request *r = calloc(1, sizeof *r);
  if (!r) return servd_fail(SERVD_ENOMEM, "submit: request");
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&r->cb_mu, &ma);
  pthread_mutexattr_destroy(&ma);
  atomic_init(&r->refs, 2);
  atomic_init(&r->cancel, false);
  r->m = m;
  r->cb = cb;
  r->ud = ud;
  r->p = *p;
  r->n_prompt = n_prompt;
  r->t_queued_ns = servd_now_ns();
  int room = m->context_length - n_prompt;
  if (r->p.max_tokens <= 0 || r->p.max_tokens > room) r->p.max_tokens = room;
  if (p->deadline_ms > 0) r->deadline_ns = servd_now_ns() + p->deadline_ms * 1000000;
  r->p.stop = NULL;
  r->p.stop_token_ids = NULL;

  r->seq.tokens = malloc(sizeof(int32_t) * (size_t)m->context_length);
  if (!r->seq.tokens) {
    rc = servd_fail(SERVD_ENOMEM, "submit: token buffer of %d", m->context_length);
    goto fail;
  }
  memcpy(r->seq.tokens, prompt, sizeof(int32_t) * (size_t)n_prompt);
  r->seq.n_tokens = n_prompt;
  r->seq.owner = r;
  if ((rc = sched_seq_init(&m->sched, &r->seq))) goto fail;
  r->seq.priority = p->priority;
  if ((rc = servd__request_lora(m, r, p->lora))) goto fail;
  if (p->embed || p->score) {
    static const sched_rows pooled_rows[] =
        {[SERVD_POOL_LAST] = SCHED_ROWS_LAST, [SERVD_POOL_MEAN] = SCHED_ROWS_ALL, [SERVD_POOL_CLS] = SCHED_ROWS_FIRST};
    /* A score is an embedding whose one row (CLS, where BERT's pooler reads) comes back as the
     * classifier's n_labels outputs. */
    int dim = p->score ? m->emb.n_labels : m->emb.dim;
    r->seq.embed = true;
    r->seq.rows = p->score ? SCHED_ROWS_FIRST : pooled_rows[m->emb.pooling];
    r->seq.pair_split = p->pair_split < n_prompt ? p->pair_split : 0;
    r->pool.dim = dim;
    if (!(r->pool.sum = calloc((size_t)dim, sizeof(float)))) {
      rc = servd_fail(SERVD_ENOMEM, "submit: embedding of %d", dim);
      goto fail;
    }
  } else if (p->prompt_logprobs) {
    r->seq.rows = SCHED_ROWS_ALL;
    r->seq.no_cache_hits = true;
    r->lp_next = 1;
  }
  if (p->n_stop) {
    r->stop_copy = calloc((size_t)p->n_stop, sizeof *r->stop_copy);
    if (!r->stop_copy) {
      rc = servd_fail(SERVD_ENOMEM, "submit: stop strings");
      goto fail;
    }
    for (int i = 0; i < p->n_stop; i++)
      if (p->stop[i] && !(r->stop_copy[i] = strdup(p->stop[i]))) {
        rc = servd_fail(SERVD_ENOMEM, "submit: stop strings");
        goto fail;
      }
    r->p.stop = (const char *const *)r->stop_copy;
  }
  if (p->n_stop_token_ids) {
    r->stop_ids_copy = malloc(sizeof(int32_t) * (size_t)p->n_stop_token_ids);
    if (!r->stop_ids_copy) {
      rc = servd_fail(SERVD_ENOMEM, "submit: stop token ids");
      goto fail;
    }
    memcpy(r->stop_ids_copy, p->stop_token_ids, sizeof(int32_t) * (size_t)p->n_stop_token_ids);
    r->p.stop_token_ids = r->stop_ids_copy;
  }
  if ((rc = servd_stop_matcher_create(r->p.stop, r->p.n_stop, &r->stopper))) goto fail;
  servd_sampler_config sc = {.n_vocab = m->vocab,
                             .params = &r->p,
                             .eos_ids = m->eos,
                             .n_eos = m->n_eos,
                             .logprob_mode = SERVD_LOGPROBS_RAW,
                             .scratch = m->scratch,
                             .masked = p->guide != NULL};
  r->p.guide = NULL; /* the request's own copy is r->guide.grammar */
  if (p->guide && !(r->guide.grammar = strdup(p->guide))) {
    rc = servd_fail(SERVD_ENOMEM, "submit: grammar");
    goto fail;
  }
  if ((rc = servd_sampler_create(&sc, &r->sampler))) goto fail;
  r->p.logit_bias = NULL; /* the sampler keeps its own copy */
  r->p.n_logit_bias = 0;
  servd_sampler_add_prompt(r->sampler, prompt, n_prompt);
  if ((rc = servd_detok_create(m->tok, true, &r->detok))) goto fail;

  pthread_mutex_lock(&m->mu);
  if (m->stopping) {
    pthread_mutex_unlock(&m->mu);
    rc = servd_fail(SERVD_ECANCELED, "submit: model %s is unloading", m->name);
    goto fail;
  }
  if (m->n_waiting + m->n_inbox >= m->o.max_queue) {
    pthread_mutex_unlock(&m->mu);
    rc = servd_fail(SERVD_EBUSY, "submit: model %s: %d requests waiting (max_queue)", m->name, m->o.max_queue);
    goto fail;
  }
  if (!m->inbox_head) m->last_progress_ns = servd_now_ns(); /* idle time is not being stuck */
  if (m->inbox_tail) m->inbox_tail->inbox_next = r;
  else m->inbox_head = r;
  m->inbox_tail = r;
  m->n_inbox++;
  m->prompt_tokens += (uint64_t)n_prompt;
  pthread_cond_signal(&m->wake);
  pthread_mutex_unlock(&m->mu);
  *out = r;
  return 0;
fail:
  atomic_store(&r->refs, 1);
  request_unref(r);
  return rc;
}

int servd_model_embedding_info(const servd_model *m, servd_embedding_info *out) {
  memset(out, 0, sizeof *out);
  if (m->kind != SERVD_MODEL_CAUSAL_LM)
    return servd_fail(SERVD_EUNSUPPORTED, "model %s is not a language model: it has no embeddings", m->name);
  *out = m->emb;
  return 0;
}

void servd_request_cancel(servd_request *r) {
  if (!r) return;
  atomic_store(&r->cancel, true);
  servd_model *m = r->m;
  pthread_mutex_lock(&m->mu);
  pthread_cond_signal(&m->wake);
  pthread_mutex_unlock(&m->mu);
}

void servd_request_release(servd_request *r) {
  if (!r) return;
  pthread_mutex_lock(&r->cb_mu);
  r->released = true;
  pthread_mutex_unlock(&r->cb_mu);
  request_unref(r);
}

/* ---- generic ------------------------------------------------------------------------------------ */

int servd_model_predict(servd_model *m, const servd_named_tensor *inputs, int n_inputs, servd_named_tensor **outputs,
                        int *n_outputs, int64_t deadline_ms, servd_model_error *err) {
  *outputs = NULL;
  *n_outputs = 0;
  if (err) memset(err, 0, sizeof *err);
  if (m->kind != SERVD_MODEL_GENERIC)
    return servd_fail(SERVD_EUNSUPPORTED, "predict: model %s is a language model", m->name);
  if (m->iso) return servd_isolated_predict(m->iso, inputs, n_inputs, outputs, n_outputs, deadline_ms, err);
  if (m->batcher) return servd_batcher_predict(m->batcher, inputs, n_inputs, outputs, n_outputs, deadline_ms, err);
  return servd_predict_direct(m->pool, inputs, n_inputs, outputs, n_outputs, deadline_ms, err);
}
