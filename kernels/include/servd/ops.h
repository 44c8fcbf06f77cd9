/* CPU ops of a Llama forward pass.
 *
 * Conventions: activations are f32 and row-major; every op checks shapes and dtypes and returns 0 or
 * a negative SERVD_E* code with a message naming the op, the shapes and the dtypes (servd_last_error).
 * Outputs are preallocated by the caller; ops never allocate on the hot path. Each op picks, at run
 * time, the best implementation this CPU supports (scalar reference, AVX2+FMA, AVX-512 with VNNI/BF16);
 * servd_cpu_force_isa() pins one for tests and benchmarks.
 */
#ifndef SERVD_OPS_H
#define SERVD_OPS_H

#include "servd/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum servd_isa {
  SERVD_ISA_SCALAR = 0,
  SERVD_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
  SERVD_ISA_AVX512 = 2, /* AVX-512 F/BW/VL, plus VNNI and BF16 where present */
  SERVD_ISA_COUNT
} servd_isa;

SERVD_API servd_isa servd_cpu_best_isa(void); /* what this CPU supports */
SERVD_API const char *servd_isa_name(servd_isa isa);
/* Pins the implementation used by every op (SERVD_EUNSUPPORTED if the CPU lacks it);
 * pass SERVD_ISA_COUNT to return to automatic choice. Not thread-safe w.r.t. running ops. */
SERVD_API int servd_cpu_force_isa(servd_isa isa);
SERVD_API servd_isa servd_cpu_active_isa(void);
/* Batch invariance: on one ISA, every matmul gives a row the same floats whether it is computed
 * alone or with other rows (decode, batched decode, prefill chunks, speculation's verify rows), so a
 * request's logits do not depend on what else the step carries. Free, and always on, for every weight
 * dtype except q4_k and q5_k on AVX-512 VNNI, whose batch-1 kernel has a faster form that rounds
 * differently: on (SERVD_BATCH_INVARIANT=1 in the environment, or this call) they take their batch
 * form at batch 1 too, which costs those matmuls ~15-30% at batch 1 (docs/performance.md). */
SERVD_API void servd_cpu_set_batch_invariant(bool on);
SERVD_API bool servd_cpu_batch_invariant(void);
/* Activations of quantized matmuls: 1 level (the default) is ggml's q8 activations, each block of x
 * rounded to int8 with one scale d (x to ~8 bits). 2 levels also round what that leaves, x - q*d, with
 * scale d/128, so x is carried to ~15 bits and a quantized matmul lands within float rounding of the
 * exact product of x and the dequantized weights: ~100x closer to a float64 forward, and TP=N within
 * ~1e-3 nats of TP=1, for ~1.2x the batch-1 decode time and up to 2x the prompt GEMM's (docs/llama.md,
 * "Activation precision"). Set by servd's --activation-levels, SERVD_ACTIVATION_LEVELS=1|2 in the
 * environment or this call (1 or 2, else SERVD_EINVAL); not thread-safe w.r.t. running ops. */
SERVD_API int servd_cpu_set_activation_levels(int levels);
SERVD_API int servd_cpu_activation_levels(void);

/* outs[i] = x @ ws[i]^T for 1..SERVD_MATMUL_MANY_MAX weights sharing x (Q, K and V; gate and up):
 * what one servd_matmul per weight computes, to the bit. Weights of one dtype run as one split over
 * the thread pool, with x prepared (quantized) once. */
#define SERVD_MATMUL_MANY_MAX 4
SERVD_API int servd_matmul_many(int count, servd_tensor *const *outs, const servd_tensor *x,
                                const servd_tensor *const *ws);

typedef enum servd_rope_layout {
  SERVD_ROPE_INTERLEAVED = 0, /* pairs (x[2i], x[2i+1]): GGUF llama weights */
  SERVD_ROPE_HALF = 1,        /* pairs (x[i], x[i+d/2]): Hugging Face weights */
} servd_rope_layout;

typedef struct servd_rope_params {
  servd_rope_layout layout;
  int head_dim; /* rotary dims == head_dim */
  float theta;  /* base, e.g. 10000 or 500000 */
  /* Llama 3.1 scaling; factor <= 1 means none. */
  float scaling_factor;       /* e.g. 8 */
  float low_freq_factor;      /* e.g. 1 */
  float high_freq_factor;     /* e.g. 4 */
  int original_max_positions; /* e.g. 8192 */
  /* Per-pair inverse frequencies that the model code computed (YaRN, LongRoPE): NULL, or head_dim/2
   * values (head_dim <= 2 * SERVD_ROPE_TABLE_MAX) used instead of theta and the llama3 scaling.
   * Borrowed: valid while the op runs; a device launch copies them. */
  const float *inv_freq;
  /* LongRoPE's long table: a call whose largest position is >= long_from rotates every row with it,
   * else with inv_freq (transformers switches per forward the same way, at seq_len > original). */
  const float *inv_freq_long;
  int long_from;
  float attn_factor; /* cos and sin times this (YaRN mscale, LongRoPE attention factor); 0 means 1 */
} servd_rope_params;
#define SERVD_ROPE_TABLE_MAX 256

/* One segment of a LoRA product over a batch (servd_lora_sgmv, punica's SGMV): rows [first, first+n)
 * get out += scale * (x A^T) B^T with ab (r, k+n_out) = [A_j | B column j] per row j (servd_lora). ab
 * NULL: the segment's rows have no adapter for this projection. Borrowed for the call. */
typedef struct servd_lora_seg {
  int64_t first, n;
  const servd_tensor *ab;
  float scale;
} servd_lora_seg;
#define SERVD_LORA_MAX_RANK 64

/* ---- the op registry (servd/ops.def) ----------------------------------------------------------------
 * Signature kinds: SERVD_SIG_<kind>(names...) is the parameter list of every function of an op
 * (CPU, device, dispatch, host table); SERVD_SIG_EACH_<kind>(M, names...) applies M to its tensor
 * parameters, which come first (device checks, dispatch). RAW rows spell out their parameters. */
#define SERVD_SIG_T2(a, b) servd_tensor *a, const servd_tensor *b
#define SERVD_SIG_EACH_T2(M, a, b) M(a) M(b)
#define SERVD_SIG_T3(a, b, c) servd_tensor *a, const servd_tensor *b, const servd_tensor *c
#define SERVD_SIG_EACH_T3(M, a, b, c) M(a) M(b) M(c)
#define SERVD_SIG_T3F(a, b, c, f) servd_tensor *a, const servd_tensor *b, const servd_tensor *c, float f
#define SERVD_SIG_EACH_T3F(M, a, b, c, f) M(a) M(b) M(c)
#define SERVD_SIG_T3L(a, b, c, l) servd_tensor *a, const servd_tensor *b, const servd_tensor *c, int64_t l
#define SERVD_SIG_EACH_T3L(M, a, b, c, l) M(a) M(b) M(c)
#define SERVD_SIG_T4F(a, b, c, d, f) \
  servd_tensor *a, const servd_tensor *b, const servd_tensor *c, const servd_tensor *d, float f
#define SERVD_SIG_EACH_T4F(M, a, b, c, d, f) M(a) M(b) M(c) M(d)
#define SERVD_SIG_T5(a, b, c, d, e) \
  servd_tensor *a, const servd_tensor *b, const servd_tensor *c, const servd_tensor *d, const servd_tensor *e
#define SERVD_SIG_EACH_T5(M, a, b, c, d, e) M(a) M(b) M(c) M(d) M(e)
#define SERVD_SIG_TOPK(a, b, c, k) servd_tensor *a, servd_tensor *b, const servd_tensor *c, int k
#define SERVD_SIG_EACH_TOPK(M, a, b, c, k) M(a) M(b) M(c)
#define SERVD_SIG_ROPE(x, pos, p) servd_tensor *x, const servd_tensor *pos, const servd_rope_params *p
#define SERVD_SIG_EACH_ROPE(M, x, pos, p) M(x) M(pos)
#define SERVD_SIG_RAW(...) __VA_ARGS__

/* Helpers for the files that expand the registry. */
#define SERVD__UNPAREN(...) __VA_ARGS__
#define SERVD__CALL(m, ...) m(__VA_ARGS__)
#define SERVD__PARAMS(sig, names) SERVD__CALL(SERVD_SIG_##sig, SERVD__UNPAREN names)
#define SERVD__ARGS(names) SERVD__UNPAREN names
#define SERVD__EACH(sig, M, names) SERVD__CALL(SERVD_SIG_EACH_##sig, M, SERVD__UNPAREN names)
/* SERVD__IF_<want>_<dispatch>(x): x when a row's dispatch kind is <want> (ANY: ANY or ANYT). */
#define SERVD__IF_ANY_ANY(...) __VA_ARGS__
#define SERVD__IF_ANY_ANYT(...) __VA_ARGS__
#define SERVD__IF_ANY_HAND(...)
#define SERVD__IF_ANYH_ANY(...) __VA_ARGS__
#define SERVD__IF_ANYH_ANYT(...)
#define SERVD__IF_ANYH_HAND(...)
#define SERVD__IF_ANYT_ANY(...)
#define SERVD__IF_ANYT_ANYT(...) __VA_ARGS__
#define SERVD__IF_ANYT_HAND(...)
#define SERVD__IF_HAND_ANY(...)
#define SERVD__IF_HAND_ANYT(...)
#define SERVD__IF_HAND_HAND(...) __VA_ARGS__
#define SERVD__IF_PY_PY(...) __VA_ARGS__
#define SERVD__IF_PY_PYHAND(...)
#define SERVD__IF_PY_NOPY(...)
#define SERVD__IF_PYHAND_PY(...)
#define SERVD__IF_PYHAND_PYHAND(...) __VA_ARGS__
#define SERVD__IF_PYHAND_NOPY(...)

typedef enum servd_op_id {
#define SERVD_OP(name, dispatch, py, sig, names) SERVD_OP_##name,
#include "servd/ops.def"
#undef SERVD_OP
  SERVD_OP_COUNT
} servd_op_id;

/* The CPU op servd_<name> of every ANY/ANYT row (its contract is in servd/ops.def) and, for ANYT
 * rows, servd__check_<name>: the op's shape and dtype checks, which the device op runs too
 * (internal to servd's libraries, not API). */
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANY_##dispatch(SERVD_API int servd_##name(SERVD__PARAMS(sig, names));) \
      SERVD__IF_ANYT_##dispatch(int servd__check_##name(SERVD__PARAMS(sig, names));)
#include "servd/ops.def"
#undef SERVD_OP

/* servd_lora over segments of the rows of out (m,n) and x (m,k), in increasing, non-overlapping
 * order: one split of every segment's rows over the pool; a row's bits are servd_lora's. */
SERVD_API int servd_lora_sgmv(servd_tensor *out, const servd_tensor *x, int n_segs, const servd_lora_seg *segs);

/* Row-wise softmax in place over the last dim of x (m,n) f32, scaled: softmax(x*scale). */
SERVD_API int servd_softmax(servd_tensor *x, float scale);

/* ---- Paged KV cache ------------------------------------------------------------------------------
 * Per layer, K and V are pools of `n_blocks` blocks of `block_size` token slots, each slot holding
 * n_kv_heads*head_dim values (f32, f16, bf16, or q8_0 / q4_0 quantized per 32 dims as written). A sequence owns a block table (block ids in order); its
 * token at position p lives in slot table[p / block_size] * block_size + p % block_size. The cache
 * hands out and takes back blocks; which sequence owns what is the engine's business. */
typedef struct servd_kv_cache servd_kv_cache;

SERVD_API int servd_kv_cache_create(servd_kv_cache **out, int n_layers, int n_kv_heads, int head_dim, int block_size,
                                    int n_blocks, servd_dtype dtype /* f32, f16, bf16, q8_0 or q4_0 */);
/* Whether a cache can hold dtype (q8_0 and q4_0 also need head_dim a multiple of 32). */
SERVD_API bool servd_kv_cache_dtype_ok(servd_dtype t);
/* Bytes one block of block_size tokens takes over all layers, K and V, in the layout of dtype (what
 * sizes a pool in memory: q8_0 holds ~1.9x the tokens of f16); 0 for a geometry create refuses. */
SERVD_API size_t servd_kv_cache_block_bytes(int n_layers, int n_kv_heads, int head_dim, int block_size,
                                            servd_dtype dtype);
SERVD_API servd_dtype servd_kv_cache_dtype(const servd_kv_cache *c);
/* Block id's K/V of every layer and kv head, servd_kv_cache_block_bytes(...) bytes in this cache's
 * own layout, copied out to dst or in from src (a lower tier of the prefix cache keeps blocks so).
 * SERVD_EINVAL for an unknown block or a cache without storage. */
SERVD_API int servd_kv_cache_block_read(const servd_kv_cache *c, int32_t id, void *dst);
SERVD_API int servd_kv_cache_block_write(servd_kv_cache *c, int32_t id, const void *src);
/* A cache of block bookkeeping only (alloc/free, no K/V storage): the host side of a cache whose
 * K/V live on a device (servd/device.h). kv_write and attention on it fail with SERVD_EINVAL. */
SERVD_API int servd_kv_cache_create_blocks_only(servd_kv_cache **out, int n_layers, int n_kv_heads, int head_dim,
                                                int block_size, int n_blocks);
SERVD_API void servd_kv_cache_destroy(servd_kv_cache *c); /* accepts NULL */
SERVD_API int servd_kv_cache_block_size(const servd_kv_cache *c);
SERVD_API int servd_kv_cache_n_blocks(const servd_kv_cache *c);
SERVD_API int servd_kv_cache_free_blocks(const servd_kv_cache *c);
/* Blocks are reference counted: alloc hands out blocks holding one reference, ref adds one to held
 * blocks (a second sequence sharing a prefix block, the engine's prefix cache), free drops one and
 * the block is free again when none is left. All thread-safe. */
/* Takes n free blocks into ids[]; SERVD_EBUSY (taking none) if fewer than n are free. */
SERVD_API int servd_kv_cache_alloc(servd_kv_cache *c, int n, int32_t *ids);
/* Adds a reference to each of n held blocks; SERVD_EINVAL (adding none) if one is free or unknown. */
SERVD_API int servd_kv_cache_ref(servd_kv_cache *c, int n, const int32_t *ids);
/* References held on block id (0: free or out of range). */
SERVD_API int servd_kv_cache_refcount(const servd_kv_cache *c, int32_t id);
/* Drops one reference of each of n blocks; ids that are free or unknown are ignored. */
SERVD_API void servd_kv_cache_free(servd_kv_cache *c, int n, const int32_t *ids);
/* Gives the K/V memory back to the system while no block is held (SERVD_EBUSY otherwise): the cache
 * stays usable, its pages come back zeroed as they are written. A blocks-only cache: nothing to do. */
SERVD_API int servd_kv_cache_discard(servd_kv_cache *c);

/* Writes k, v (t, n_kv_heads*head_dim) f32 of layer into slots i32 (t) (slot = block*block_size+off). */
SERVD_API int servd_kv_write(servd_kv_cache *c, int layer, const servd_tensor *k, const servd_tensor *v,
                             const servd_tensor *slots);

/* A batch of sequences in mixed phases. Sequence s owns query rows [q_start[s], q_start[s]+q_len[s])
 * of q; those are its newest tokens, at positions kv_len[s]-q_len[s] .. kv_len[s]-1, and its K/V for
 * positions [0, kv_len[s]) are already in the cache (written by servd_kv_write). A decode step is
 * q_len == 1; a prefill chunk is q_len > 1. */
typedef struct servd_attn_batch {
  int n_seqs;
  const int32_t *q_start;
  const int32_t *q_len;
  const int32_t *kv_len;
  const int32_t *const *block_tables; /* block_tables[s][i]: i-th block of sequence s */
} servd_attn_batch;

/* out (t, n_heads*head_dim) = causal softmax(q k^T * scale) v with grouped-query heads
 * (n_heads a multiple of the cache's n_kv_heads); q (t, n_heads*head_dim) f32. */
SERVD_API int servd_attention(servd_tensor *out, const servd_tensor *q, const servd_kv_cache *c, int layer,
                              const servd_attn_batch *b, int n_heads, float scale);
/* As servd_attention with a sliding window (Gemma 3's local layers): the query at position p sees
 * keys p - window + 1 .. p only. window 0: none (servd_attention). */
SERVD_API int servd_attention_window(servd_tensor *out, const servd_tensor *q, const servd_kv_cache *c, int layer,
                                     const servd_attn_batch *b, int n_heads, float scale, int window);

/* ---- Collectives between tensor-parallel ranks in one process ----------------------------------- */
typedef struct servd_comm servd_comm;
/* A group of world_size ranks, each rank served by its own thread. */
SERVD_API int servd_comm_create(servd_comm **out, int world_size);
SERVD_API void servd_comm_destroy(servd_comm *c); /* accepts NULL */
/* Sum in place across all ranks; every rank passes an f32 tensor of the same shape. Blocks until
 * all ranks have contributed. */
SERVD_API int servd_allreduce_sum(servd_comm *c, int rank, servd_tensor *x);
/* Gathers x (m, n_r) of every rank into out (m, sum n_r) in rank order (vocabulary-parallel logits). */
SERVD_API int servd_allgather_cols(servd_comm *c, int rank, servd_tensor *out, const servd_tensor *x);
/* Failure of one rank: makes every collective that is waiting for the group, and every later one,
 * return SERVD_ECANCELED on every rank, so that no rank waits for one that will never arrive. Any
 * thread may call it, any number of times. */
SERVD_API void servd_comm_abort(servd_comm *c); /* accepts NULL */
SERVD_API bool servd_comm_aborted(servd_comm *c);
/* Makes an aborted group usable again. Call it only when no rank is inside a collective (after every
 * rank's step has returned). */
SERVD_API void servd_comm_reset(servd_comm *c); /* accepts NULL */

#ifdef __cplusplus
}
#endif
#endif
