/* Putting a causal LM on GPUs (internal to the engine): the checks before anything is allocated and
 * the KV cache sized from what the weights left free. */
#ifndef SERVD_ENGINE_GPU_SETUP_H
#define SERVD_ENGINE_GPU_SETUP_H

#include "engine/engine_impl.h"

/* gpus == tp, enough visible GPUs, a fraction in (0, 1]; fills m->devices (rank r on GPU r). */
int servd_gpu_check(servd_model *m);

/* Sizes the KV cache from each rank's free device memory after the weights (times the fraction),
 * capped by what max_seqs full contexts need (or o.kv_blocks when given), creates each rank's device
 * cache and its host block bookkeeping (m->dkv, m->kv), and logs the capacity and the weights per
 * device. kv_heads: per rank. *blocks: the blocks of each rank's cache. */
int servd_gpu_kv_setup(servd_model *m, int n_layers, int kv_heads, int head_dim, int block_size, int *blocks);

/* Frees what the two above made (the NCCL communicator included); accepts a model without GPUs. */
void servd_gpu_teardown(servd_model *m);

#endif
