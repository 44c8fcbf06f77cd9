/* A Llama forward pass driven from C on the CUDA ops (bf16, f32 accumulation) and, for reference,
 * the same pass on the CPU ops (f32 activations over the same bf16 weights). Used by gpu_check to
 * compare greedy tokens and to measure decode and prefill speed on a Llama-3.1-8B-shaped model with
 * synthesized weights. Mirrors models/llama (the Python model code) layer for layer. */
#ifndef SERVD_GPU_LLAMA_H
#define SERVD_GPU_LLAMA_H

#include <stdint.h>

#include "servd/cuda.h"
#include "servd/ops.h"

typedef struct llama_shape {
  int vocab, hidden, inter, layers, heads, kv_heads, head_dim;
  float eps;
  servd_rope_params rope;
} llama_shape;

/* Device weights: one allocation per tensor (bf16). */
typedef struct llama_weights {
  servd_bf16_t *embed, *norm, *lm_head;
  servd_bf16_t **attn_norm, **wq, **wk, **wv, **wo, **ffn_norm, **w1, **w2, **w3;
} llama_weights;

typedef struct gpu_llama gpu_llama;

/* Synthesizes weights on the device (uniform, std 0.02; norms 1) and a KV cache for max_seqs
 * sequences of up to max_ctx tokens. */
int gpu_llama_create(servd_cuda_ctx *c, const llama_shape *s, int max_seqs, int max_ctx, int max_tokens, uint64_t seed,
                     gpu_llama **out);
void gpu_llama_destroy(gpu_llama *m);
const llama_weights *gpu_llama_weights(const gpu_llama *m);

/* One step: n_seqs sequences, sequence i adds q_len[i] tokens (tokens laid out in order) on top of
 * its kv_len[i] - q_len[i] cached ones. Writes the greedy next token of each sequence to next[]
 * (host) unless next is NULL. Sequence i owns cache blocks [i*blocks_per_seq, (i+1)*blocks_per_seq). */
int gpu_llama_step(gpu_llama *m, int n_seqs, const int32_t *tokens, const int32_t *q_len, const int32_t *kv_len,
                   int32_t *next);
/* Captures the decode step for n_seqs (q_len 1 each) in a CUDA graph once, then replays it; the
 * inputs (tokens, kv_len) are uploaded before each replay. */
int gpu_llama_decode_graph(gpu_llama *m, int n_seqs, const int32_t *tokens, const int32_t *kv_len, int32_t *next);
/* Destroys the captured decode graphs: the next decode_graph captures anew (after a kernel choice
 * changed, servd_cuda_gemv_tune). */
void gpu_llama_drop_graphs(gpu_llama *m);
double gpu_llama_weight_bytes(const gpu_llama *m);

/* CPU reference over host copies of the same weights (f32 activations). */
typedef struct cpu_llama cpu_llama;
int cpu_llama_create(servd_cuda_ctx *c, const gpu_llama *g, int max_ctx, cpu_llama **out);
void cpu_llama_destroy(cpu_llama *m);
/* One sequence: appends n tokens at positions [pos, pos+n) and returns the greedy next token. */
int cpu_llama_step(cpu_llama *m, const int32_t *tokens, int n, int pos, int32_t *next, float *top2_margin);

#endif
