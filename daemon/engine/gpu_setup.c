/* A causal LM on GPUs: checks, KV cache sizing and creation. See gpu_setup.h. */
#include "engine/gpu_setup.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_runner.h"
#include "engine/step_arrays.h"

static double gb(size_t bytes) { return (double)bytes / 1e9; }

int servd_gpu_check(servd_model *m) {
  const servd_model_options *o = &m->o;
  const char *pkg = mpk_path(m->pkg);
  if (o->tp != o->gpus)
    return servd_fail(SERVD_EINVAL,
                      "%s: tp %d on %d GPU%s: each tensor-parallel rank needs a GPU of its own (NCCL "
                      "runs one rank per GPU), so tp must equal gpus",
                      pkg, o->tp, o->gpus, o->gpus == 1 ? "" : "s");
  if (!(o->gpu_memory_fraction > 0 && o->gpu_memory_fraction <= 1))
    return servd_fail(SERVD_EINVAL, "%s: gpu_memory_fraction %g: expected a fraction in (0, 1]", pkg,
                      o->gpu_memory_fraction);
  if (o->cuda_graphs && o->cuda_graph_max_batch < 1)
    return servd_fail(SERVD_EINVAL, "%s: cuda_graph_max_batch %d: expected >= 1", pkg, o->cuda_graph_max_batch);
  int have = 0;
  char why[256] = "";
  servd_device_count(&have, why, sizeof why);
  if (have < o->gpus)
    return servd_fail(SERVD_EDEVICE, "%s: %d GPU%s asked for, %d visible%s%s", pkg, o->gpus, o->gpus == 1 ? "" : "s",
                      have, why[0] ? ": " : "", why);
  for (int r = 0; r < o->tp; r++) m->devices[r] = r;
  return 0;
}

int servd_gpu_kv_plan(const servd_gpu_kv_in *in, int *blocks, const char **sized_by) {
  *blocks = 0;
  if (in->per_block == 0 || in->n_ranks < 1 || in->ctx_blocks < 1 || !(in->fraction > 0 && in->fraction <= 1))
    return servd_fail(SERVD_EINVAL, "KV cache plan: %d ranks, blocks of %zu bytes, %d blocks a context, fraction %g",
                      in->n_ranks, in->per_block, in->ctx_blocks, in->fraction);
  /* What every rank can hold: the smallest of the ranks' shares of their free memory. */
  long long fit = -1;
  int tight = 0;
  for (int r = 0; r < in->n_ranks; r++) {
    double usable = (double)in->free_bytes[r] * in->fraction;
    double cap = in->free_bytes[r] > in->reserve ? (double)(in->free_bytes[r] - in->reserve) : 0.0;
    if (usable > cap) usable = cap;
    long long n = (long long)(usable / (double)in->per_block);
    if (fit < 0 || n < fit) {
      fit = n;
      tight = r;
    }
  }
  size_t tight_free = in->free_bytes[tight];
  if (in->kv_blocks > 0 && in->kv_blocks > fit)
    return servd_fail(SERVD_ENOMEM,
                      "kv_blocks %d need %.2f GB on cuda:%d, which has %.2f GB free after the weights "
                      "and the steps' memory (%.2f GB at --gpu-memory-fraction %g)",
                      in->kv_blocks, gb(in->per_block * (size_t)in->kv_blocks), tight, gb(tight_free),
                      gb((size_t)((double)tight_free * in->fraction)), in->fraction);
  long long want = in->kv_blocks > 0 ? in->kv_blocks : (long long)in->max_seqs * in->ctx_blocks;
  long long n = want < fit ? want : fit;
  *sized_by = in->kv_blocks > 0 ? "kv_blocks" : n < fit ? "max_seqs full contexts" : "the memory fraction";
  long long max_blocks = INT32_MAX / in->block_size; /* slots are i32: block * block_size must fit */
  if (n > max_blocks) n = max_blocks;
  if (n < in->ctx_blocks)
    return servd_fail(SERVD_ENOMEM,
                      "the KV cache fits %lld blocks of %d tokens on cuda:%d (%.2f GB free after the "
                      "weights and the steps' memory, --gpu-memory-fraction %g), fewer than one context of %d tokens "
                      "needs (%d blocks): "
                      "cap the context (max_context) or raise the fraction",
                      n, in->block_size, tight, gb(tight_free), in->fraction, in->ctx_blocks * in->block_size,
                      in->ctx_blocks);
  *blocks = (int)n;
  return 0;
}

int servd_gpu_warmup_prepare(servd_model *m) {
  int rc;
  for (int r = 0; r < m->tp; r++)
    if ((rc = servd_device_mem_info(m->devices[r], &m->gpu_base_free[r], &m->gpu_total[r]))) return rc;
  /* One block: every block table of the warm-up names block 0, and no slot is written. */
  for (int r = 0; r < m->tp; r++) {
    if ((rc = servd_device_kv_create(m->devices[r], m->n_layers, m->kv_heads * m->head_dim, m->block_size, 1,
                                     &m->dkv[r])) ||
        (rc = servd_kv_cache_create_blocks_only(&m->kv[r], m->n_layers, m->kv_heads, m->head_dim, m->block_size, 1)))
      return rc;
  }
  return 0;
}

/* Host arrays of one warm-up step (at most cap tokens and seqs sequences). */
typedef struct warm_step {
  servd_step_arrays a;
  int32_t *zeros; /* (max_blocks) the block table of every sequence: block 0 */
  servd_forward_batch b;
} warm_step;

static void warm_free(warm_step *w) {
  servd_step_arrays_free(&w->a);
  free(w->zeros);
}

static int warm_alloc(warm_step *w, int cap, int seqs, int max_blocks) {
  memset(w, 0, sizeof *w);
  int rc = servd_step_arrays_init(&w->a, cap, seqs, "GPU warm-up");
  if (rc) return rc;
  if (!(w->zeros = calloc((size_t)max_blocks, sizeof(int32_t)))) {
    warm_free(w);
    return servd_fail(SERVD_ENOMEM, "GPU warm-up: a block table of %d blocks", max_blocks);
  }
  for (int i = 0; i < cap; i++) w->a.slots[i] = -1; /* kv_write skips: the cache is never written */
  for (int i = 0; i < seqs; i++) w->a.block_tables[i] = w->zeros;
  return 0;
}

/* n_tokens tokens in sequences of at most seq_len (query and context alike: a prompt's first
 * chunk), logits for the first n_rows token rows. seq_len 1 is a decode step of padding rows. */
static void warm_shape(warm_step *w, int n_tokens, int seq_len, int n_rows) {
  servd_step_arrays *a = &w->a;
  int n_seqs = 0;
  for (int t = 0; t < n_tokens; n_seqs++) {
    int len = n_tokens - t < seq_len ? n_tokens - t : seq_len;
    a->q_start[n_seqs] = t;
    a->q_len[n_seqs] = a->kv_len[n_seqs] = len;
    for (int i = 0; i < len; i++) a->positions[t + i] = i;
    t += len;
  }
  for (int i = 0; i < n_rows; i++) a->logit_rows[i] = i;
  servd_step_arrays_point(a, &w->b, n_tokens, n_rows, n_seqs);
}

static int warm_run(servd_model *m, const warm_step *w, const char *what) {
  servd_tensor *logits = NULL;
  servd_py_error err;
  memset(&err, 0, sizeof err);
  int failed = -1;
  int rc = servd_runner_eager(m->runner, &w->b, &logits, &err, &failed);
  servd_tensor_release(logits);
  if (rc) {
    char msg[1200];
    if (err.type[0] && m->tp > 1) snprintf(msg, sizeof msg, "%s (rank %d): %s", err.type, failed, err.message);
    else if (err.type[0]) snprintf(msg, sizeof msg, "%s: %s", err.type, err.message);
    else snprintf(msg, sizeof msg, "%s", servd_last_error());
    bool oom = rc == SERVD_ENOMEM || strcmp(err.type, "MemoryError") == 0 || strstr(msg, "out of memory");
    return servd_fail(rc, "%s: the warm-up %s of %d tokens (%d sequence%s) failed: %s%s", mpk_path(m->pkg), what,
                      w->b.n_tokens, w->b.attn.n_seqs, w->b.attn.n_seqs == 1 ? "" : "s", msg,
                      oom ? " (what a step needs does not fit beside the weights: lower --max-batch-tokens or "
                            "--max-seqs)"
                          : "");
  }
  return 0;
}

int servd_gpu_profile_and_setup(servd_model *m, int *blocks) {
  const servd_model_options *o = &m->o;
  *blocks = 0;
  int cap_tokens = 0, cap_seqs = 0, rc;
  servd_runner_capacity(m->runner, &cap_tokens, &cap_seqs);
  const int bs = m->block_size, ctx_blocks = (m->context_length + bs - 1) / bs;
  /* A step has at most cap_tokens tokens, in at most cap_seqs sequences of at most a context each. */
  long long most = (long long)cap_seqs * m->context_length;
  int n_prefill = most < cap_tokens ? (int)most : cap_tokens;
  int n_rows = cap_seqs < cap_tokens ? cap_seqs : cap_tokens; /* the most logit rows: one per sequence */
  warm_step w;
  if ((rc = warm_alloc(&w, cap_tokens, cap_seqs, ctx_blocks))) return rc;
  warm_shape(&w, n_prefill, m->context_length, n_rows);
  rc = warm_run(m, &w, "prefill step");
  if (!rc) {
    /* Decode rows as the graph buckets pad them; the most sequences, so at least the largest bucket. */
    warm_shape(&w, n_rows, 1, n_rows);
    rc = warm_run(m, &w, "decode step");
  }
  warm_free(&w);
  if (rc) return rc;

  /* The warm-up caches go back to CUDA; what the steps took stays (cached or held). */
  for (int r = 0; r < m->tp; r++) {
    servd_device_kv_destroy(m->dkv[r]);
    m->dkv[r] = NULL;
    servd_kv_cache_destroy(m->kv[r]);
    m->kv[r] = NULL;
  }
  size_t free_b[SERVD_INTERP_MAX], total_b[SERVD_INTERP_MAX];
  for (int r = 0; r < m->tp; r++) {
    if ((rc = servd_device_mem_info(m->devices[r], &free_b[r], &total_b[r]))) return rc;
    m->gpu_step_bytes[r] = m->gpu_base_free[r] > free_b[r] ? m->gpu_base_free[r] - free_b[r] : 0;
  }
  int kv_dim = m->kv_heads * m->head_dim;
  servd_gpu_kv_in in = {.free_bytes = free_b,
                        .n_ranks = m->tp,
                        .fraction = o->gpu_memory_fraction,
                        .per_block = servd_device_kv_bytes(m->n_layers, kv_dim, bs, 1),
                        .block_size = bs,
                        .ctx_blocks = ctx_blocks,
                        .max_seqs = o->max_seqs,
                        .kv_blocks = o->kv_blocks,
                        .reserve = SERVD_GPU_RESERVE_BYTES};
  const char *why = "";
  if ((rc = servd_gpu_kv_plan(&in, blocks, &why))) {
    char msg[512]; /* servd_fail writes the buffer servd_last_error returns: copy it first */
    snprintf(msg, sizeof msg, "%s", servd_last_error());
    return servd_fail(rc, "%s: %s", mpk_path(m->pkg), msg);
  }
  for (int r = 0; r < m->tp; r++) {
    if ((rc = servd_device_kv_create(m->devices[r], m->n_layers, kv_dim, bs, *blocks, &m->dkv[r]))) return rc;
    if ((rc = servd_kv_cache_create_blocks_only(&m->kv[r], m->n_layers, m->kv_heads, m->head_dim, bs, *blocks)))
      return rc;
  }
  if ((rc = servd_runner_set_device_kv(m->runner, m->dkv))) return rc;
  m->gpu_kv_bytes = servd_device_kv_bytes(m->n_layers, kv_dim, bs, *blocks);
  fprintf(stderr,
          "servd: model '%s': KV cache %d blocks x %d tokens = %lld tokens (%.2f GB) on each of %d GPU%s "
          "(sized by %s, after warm-up steps of %d and %d tokens)\n",
          m->name, *blocks, bs, (long long)*blocks * bs, gb(m->gpu_kv_bytes), m->tp, m->tp == 1 ? "" : "s", why,
          n_prefill, n_rows);
  for (int r = 0; r < m->tp; r++) {
    size_t free_now = 0, total_now = 0;
    servd_device_mem_info(m->devices[r], &free_now, &total_now);
    fprintf(stderr,
            "servd: model '%s': rank %d on cuda:%d: weights %.2f GB, steps %.3f GB (activations, scratch, "
            "collective buffers: measured), KV cache %.2f GB; %.2f GB of %.2f GB free\n",
            m->name, r, m->devices[r], gb(servd_device_weights_bytes(m->devices[r])), gb(m->gpu_step_bytes[r]),
            gb(m->gpu_kv_bytes), gb(free_now), gb(total_now));
  }
  return 0;
}

void servd_gpu_teardown(servd_model *m) {
  if (m->gpus <= 0) return;
  for (int r = 0; r < SERVD_INTERP_MAX; r++) {
    servd_device_kv_destroy(m->dkv[r]);
    m->dkv[r] = NULL;
  }
  servd_device_comm_destroy(m->dcomm);
  m->dcomm = NULL;
  servd_device_weights_trim(); /* the weights the interpreters no longer reference */
}
