/* cuBLAS warm-up of a language model's matrix shapes on its GPUs, run on the main thread before any
 * interpreter namespace exists: see gpu_prewarm.c. */
#ifndef SERVD_ENGINE_GPU_PREWARM_H
#define SERVD_ENGINE_GPU_PREWARM_H

#include "engine/types.h"

/* Runs the bf16 GEMMs (bf16 and f32 outputs) of every weight shape of the package's model, sharded
 * over o->tp ranks on GPUs 0..tp-1, for the row counts that steps use (cuBLAS rows: 9 to
 * max_batch_tokens). Packages that are not Llama-like causal LMs are skipped (returns 0). */
int servd_gpu_prewarm(const servd_model_options *o);

/* Creates the calling thread's CUDA context on GPUs 0..gpus-1 (and so each GPU's primary context,
 * loading servd's kernels): call it on the main thread before any interpreter namespace exists. */
int servd_gpu_start_contexts(int gpus);

#endif
