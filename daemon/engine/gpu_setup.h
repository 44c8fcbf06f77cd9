/* Putting a causal LM on GPUs (internal to the engine): the checks before anything is allocated and
 * the KV cache sized from what the weights left free. */
#ifndef SERVD_ENGINE_GPU_SETUP_H
#define SERVD_ENGINE_GPU_SETUP_H

#include "engine/engine_impl.h"

/* gpus == tp, enough visible GPUs, a fraction in (0, 1]; fills m->devices (rank r on GPU r). */
int servd_gpu_check(servd_model *m);

/* The KV cache's size per rank (every rank holds the same blocks): each rank's free_bytes (after
 * the weights) times fraction, in whole blocks, the smallest over the ranks; capped by max_seqs full
 * contexts, or exactly kv_blocks when > 0. Fails (SERVD_ENOMEM, saying what was free) when
 * kv_blocks does not fit or not one full context does. Device r of the message is rank r. */
typedef struct servd_gpu_kv_in {
  const size_t *free_bytes; /* per rank */
  int n_ranks;
  double fraction;
  size_t per_block;         /* device bytes of one block (all layers, K and V) */
  int block_size, ctx_blocks, max_seqs, kv_blocks;
} servd_gpu_kv_in;
int servd_gpu_kv_plan(const servd_gpu_kv_in *in, int *blocks, const char **sized_by);

/* Sizes the KV cache from each rank's free device memory after the weights (times the fraction),
 * capped by what max_seqs full contexts need (or o.kv_blocks when given), creates each rank's device
 * cache and its host block bookkeeping (m->dkv, m->kv), and logs the capacity and the weights per
 * device. kv_heads: per rank. *blocks: the blocks of each rank's cache. */
int servd_gpu_kv_setup(servd_model *m, int n_layers, int kv_heads, int head_dim, int block_size, int *blocks);

/* Frees what the two above made (the NCCL communicator included); accepts a model without GPUs. */
void servd_gpu_teardown(servd_model *m);

#endif
