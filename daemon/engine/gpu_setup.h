/* Putting a causal LM on GPUs (internal to the engine): the checks before anything is allocated and
 * the KV cache sized from what the weights and the steps leave free.
 *
 * Memory profiling at load: the weights are uploaded (the pool starts), then every rank gets a KV
 * cache of one block and the runner its device batches; on the thread that will run rank 0's steps
 * (the scheduler's: each thread has its own CUDA context, stream, scratch and cached blocks) the
 * runner runs warm-up steps on every rank: one prefill-shaped step of the most tokens a step can have
 * (with the most logit rows, so the all-gather of the logits reaches its final size; slots -1: no KV
 * write) and one decode step of padding rows at the most sequences (at least the largest graph
 * bucket: the attention's split-K scratch reaches its final size). Device memory the model code, the
 * kernels, cuBLAS and NCCL allocate at their first use is then taken; the one-block cache is freed,
 * free memory is read on every device and the real KV cache is sized from it. Nothing the later steps
 * and graph captures need grows any more, so no graph is dropped for that. */
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
  size_t per_block; /* device bytes of one block (all layers, K and V) */
  int block_size, ctx_blocks, max_seqs, kv_blocks;
  size_t reserve; /* bytes each rank keeps free whatever the fraction (0: none) */
} servd_gpu_kv_in;
int servd_gpu_kv_plan(const servd_gpu_kv_in *in, int *blocks, const char **sized_by);

/* What each rank keeps free beside the KV cache even at a fraction of 1: memory CUDA takes at first
 * use after the warm-up (kernels loaded lazily, graph instantiation). */
#define SERVD_GPU_RESERVE_BYTES ((size_t)256 << 20)

/* Before the warm-up (on the loading thread, after the pool started): reads each rank's free memory
 * (m->gpu_base_free) and creates the one-block warm-up caches (m->dkv, m->kv). Uses m->n_layers,
 * kv_heads (per rank), head_dim, block_size. */
int servd_gpu_warmup_prepare(servd_model *m);

/* On the thread that runs rank 0's steps, with m->runner made over the warm-up caches: runs the
 * warm-up steps, frees the warm-up caches, reads free memory, sizes the KV cache from it (times the
 * fraction, capped by max_seqs full contexts, or exactly o.kv_blocks), creates each rank's device
 * cache and host block bookkeeping, hands them to the runner and logs what each rank holds.
 * *blocks: the blocks of each rank's cache. */
int servd_gpu_profile_and_setup(servd_model *m, int *blocks);

/* Frees what the two above made (the NCCL communicator included); accepts a model without GPUs. */
void servd_gpu_teardown(servd_model *m);

#endif
