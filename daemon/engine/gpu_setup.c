/* A causal LM on GPUs: checks, KV cache sizing and creation. See gpu_setup.h. */
#include "engine/gpu_setup.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static double gb(size_t bytes) { return (double)bytes / 1e9; }

int servd_gpu_check(servd_model *m) {
  const servd_model_options *o = &m->o;
  const char *pkg = mpk_path(m->pkg);
  if (o->tp != o->gpus)
    return servd_fail(SERVD_EINVAL, "%s: tp %d on %d GPU%s: each tensor-parallel rank needs a GPU of its own (NCCL "
                      "runs one rank per GPU), so tp must equal gpus", pkg, o->tp, o->gpus, o->gpus == 1 ? "" : "s");
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
    long long n = (long long)((double)in->free_bytes[r] * in->fraction / (double)in->per_block);
    if (fit < 0 || n < fit) {
      fit = n;
      tight = r;
    }
  }
  size_t tight_free = in->free_bytes[tight];
  if (in->kv_blocks > 0 && in->kv_blocks > fit)
    return servd_fail(SERVD_ENOMEM, "kv_blocks %d need %.2f GB on cuda:%d, which has %.2f GB free after the weights "
                      "(%.2f GB at --gpu-memory-fraction %g)", in->kv_blocks,
                      gb(in->per_block * (size_t)in->kv_blocks), tight, gb(tight_free),
                      gb((size_t)((double)tight_free * in->fraction)), in->fraction);
  long long want = in->kv_blocks > 0 ? in->kv_blocks : (long long)in->max_seqs * in->ctx_blocks;
  long long n = want < fit ? want : fit;
  *sized_by = in->kv_blocks > 0 ? "kv_blocks" : n < fit ? "max_seqs full contexts" : "the memory fraction";
  long long max_blocks = INT32_MAX / in->block_size; /* slots are i32: block * block_size must fit */
  if (n > max_blocks) n = max_blocks;
  if (n < in->ctx_blocks)
    return servd_fail(SERVD_ENOMEM, "the KV cache fits %lld blocks of %d tokens on cuda:%d (%.2f GB free after the "
                      "weights, --gpu-memory-fraction %g), fewer than one context of %d tokens needs (%d blocks): "
                      "cap the context (max_context) or raise the fraction", n, in->block_size, tight,
                      gb(tight_free), in->fraction, in->ctx_blocks * in->block_size, in->ctx_blocks);
  *blocks = (int)n;
  return 0;
}

int servd_gpu_kv_setup(servd_model *m, int n_layers, int kv_heads, int head_dim, int block_size, int *blocks) {
  const servd_model_options *o = &m->o;
  int kv_dim = kv_heads * head_dim, rc;
  size_t free_b[SERVD_INTERP_MAX];
  for (int r = 0; r < m->tp; r++) {
    size_t total_b = 0;
    if ((rc = servd_device_mem_info(m->devices[r], &free_b[r], &total_b))) return rc;
  }
  servd_gpu_kv_in in = {.free_bytes = free_b, .n_ranks = m->tp, .fraction = o->gpu_memory_fraction,
                        .per_block = servd_device_kv_bytes(n_layers, kv_dim, block_size, 1),
                        .block_size = block_size, .ctx_blocks = (m->context_length + block_size - 1) / block_size,
                        .max_seqs = o->max_seqs, .kv_blocks = o->kv_blocks};
  const char *why = "";
  if ((rc = servd_gpu_kv_plan(&in, blocks, &why))) {
    char msg[512]; /* servd_fail writes the buffer servd_last_error returns: copy it first */
    snprintf(msg, sizeof msg, "%s", servd_last_error());
    return servd_fail(rc, "%s: %s", mpk_path(m->pkg), msg);
  }
  for (int r = 0; r < m->tp; r++) {
    if ((rc = servd_device_kv_create(m->devices[r], n_layers, kv_dim, block_size, *blocks, &m->dkv[r]))) return rc;
    if ((rc = servd_kv_cache_create_blocks_only(&m->kv[r], n_layers, kv_heads, head_dim, block_size, *blocks)))
      return rc;
  }
  size_t kv_bytes = servd_device_kv_bytes(n_layers, kv_dim, block_size, *blocks);
  fprintf(stderr, "servd: model '%s': KV cache %d blocks x %d tokens = %lld tokens (%.2f GB) on each of %d GPU%s "
          "(sized by %s)\n", m->name, *blocks, block_size, (long long)*blocks * block_size, gb(kv_bytes), m->tp,
          m->tp == 1 ? "" : "s", why);
  for (int r = 0; r < m->tp; r++) {
    size_t free_now = 0, total_b = 0;
    servd_device_mem_info(m->devices[r], &free_now, &total_b);
    fprintf(stderr, "servd: model '%s': rank %d on cuda:%d: weights %.2f GB, %.2f GB of %.2f GB free\n", m->name, r,
            m->devices[r], gb(servd_device_weights_bytes(m->devices[r])), gb(free_now), gb(total_b));
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
