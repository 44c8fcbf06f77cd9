/* CUDA backend: device contexts, a caching memory pool, and the ops of a Llama forward pass in bf16
 * with f32 accumulation. Built only with SERVD_CUDA (nvcc found); the declarations are always
 * visible so callers can be compiled either way.
 *
 * All pointers passed to ops are device pointers owned by the caller (allocated from the context's
 * pool). Ops are asynchronous on the context's stream; servd_cuda_sync waits. Every CUDA, cuBLAS and
 * NCCL call is checked: failures return SERVD_EDEVICE with the file, line and the library's message
 * in servd_last_error(). Shapes follow the CPU ops in servd/ops.h. Every call that takes a context
 * runs on the context's device whatever device is current, and leaves the calling thread's current
 * device as it found it (as do servd_cuda_mem_info, ctx_create, ctx_destroy and the NCCL calls).
 */
#ifndef SERVD_CUDA_H
#define SERVD_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "servd/ops.h"
#include "servd/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t servd_bf16_t; /* raw bf16 bits on the host side */

/* Number of visible CUDA devices; 0 (and SERVD_OK) when there is no driver or no device. */
SERVD_API int servd_cuda_device_count(int *n);
/* "NVIDIA H200, 141 GB, sm_90" into buf. */
SERVD_API int servd_cuda_device_describe(int device, char *buf, size_t cap);

typedef struct servd_cuda_ctx servd_cuda_ctx;
/* One per (device, user thread): a stream, a cuBLAS handle and a caching pool. */
SERVD_API int servd_cuda_ctx_create(int device, servd_cuda_ctx **out);
SERVD_API void servd_cuda_ctx_destroy(servd_cuda_ctx *c); /* accepts NULL */
SERVD_API int servd_cuda_ctx_device(const servd_cuda_ctx *c);
SERVD_API void *servd_cuda_ctx_stream(servd_cuda_ctx *c); /* cudaStream_t */

/* Pool: blocks are rounded up to size classes and cached on free; cudaMalloc only on a miss. */
SERVD_API void *servd_cuda_alloc(servd_cuda_ctx *c, size_t bytes);
SERVD_API void servd_cuda_free(servd_cuda_ctx *c, void *p); /* accepts NULL */
SERVD_API size_t servd_cuda_pool_reserved(const servd_cuda_ctx *c);

SERVD_API int servd_cuda_upload(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes);
SERVD_API int servd_cuda_download(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes);
SERVD_API int servd_cuda_copy(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes); /* device->device */
SERVD_API int servd_cuda_sync(servd_cuda_ctx *c);
/* rows rows of width bytes from src (row pitch spitch) to dst (pitch dpitch), any direction (unified
 * addressing), async on the stream (host memory should be pinned for a truly async copy). */
SERVD_API int servd_cuda_copy_2d(servd_cuda_ctx *c, void *dst, size_t dpitch, const void *src, size_t spitch,
                                 size_t width, size_t rows);
SERVD_API int servd_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes);
/* Bumped whenever device memory a captured graph could reference is freed or moved: a context's
 * scratch growing or being freed, the pool giving its cache back. Other layers that free device
 * memory bump it too. */
SERVD_API uint64_t servd_cuda_generation(int device);
SERVD_API void servd_cuda_generation_bump(int device);
/* Fills n bf16 values with deterministic pseudo-random values uniform in [-scale, scale]. */
SERVD_API int servd_cuda_fill_random_bf16(servd_cuda_ctx *c, servd_bf16_t *x, size_t n, uint64_t seed, float scale);
SERVD_API int servd_cuda_f32_to_bf16(servd_cuda_ctx *c, servd_bf16_t *dst, const float *src, size_t n);
SERVD_API int servd_cuda_bf16_to_f32(servd_cuda_ctx *c, float *dst, const servd_bf16_t *src, size_t n);

/* ---- ops (bf16 tensors, f32 accumulation) ---- */
/* out (m,n) = x (m,k) @ w^T, w (n,k). Small m: a bandwidth-bound GEMV kernel; else cuBLAS. */
SERVD_API int servd_cuda_matmul(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *x, const servd_bf16_t *w,
                                int m, int n, int k);
/* out (m,n) f32 logits variant (for sampling precision). */
SERVD_API int servd_cuda_matmul_f32out(servd_cuda_ctx *c, float *out, const servd_bf16_t *x, const servd_bf16_t *w,
                                       int m, int n, int k);
/* out (m,n) (f32 if out_f32, else bf16) = x (m,k) @ w^T with w (n,k) q8_0, q4_k or q6_k blocks as packed
 * (gemv_quant.cu): m <= 8 reads the blocks in a GEMV; larger m dequantizes w to bf16 in c's scratch
 * (not during graph capture: the scratch may grow) and runs the bf16 matmul. */
SERVD_API int servd_cuda_matmul_quant(servd_cuda_ctx *c, void *out, int out_f32, const servd_bf16_t *x, const void *w,
                                      int dtype, int m, int n, int k);
/* Times the GEMV variants (the kernels of matmuls with m <= 8) for a weight (n, k) on c's device,
 * refusing any whose products differ from the reference kernel's, and makes the fastest the one
 * every later matmul of that shape on this device uses. report (may be NULL) gets one line: each
 * variant's bandwidth and the choice. Call before capturing graphs (they keep the kernel they
 * captured). SERVD_GEMV_TUNE=0 in the environment turns it off. */
SERVD_API int servd_cuda_gemv_tune(servd_cuda_ctx *c, int n, int k, char *report, size_t cap);
/* x (m,d) += o, then out = rmsnorm(x) * w: what servd_cuda_add then servd_cuda_rmsnorm compute, in
 * one launch once servd_cuda_fused_check passed on the device (the two launches until then). out
 * must not be x; it may be o. */
SERVD_API int servd_cuda_add_rmsnorm(servd_cuda_ctx *c, servd_bf16_t *x, const servd_bf16_t *o, servd_bf16_t *out,
                                     const servd_bf16_t *w, int m, int d, float eps);
/* outs[i] (m, ns[i]) bf16 = x (m,k) @ ws[i]^T for 1..4 weights: for m <= 8 one launch once
 * servd_cuda_fused_check passed on the device; otherwise one matmul per weight. */
SERVD_API int servd_cuda_matmul_many(servd_cuda_ctx *c, int count, servd_bf16_t *const *outs, const servd_bf16_t *x,
                                     const servd_bf16_t *const *ws, const int *ns, int m, int k);
/* Runs the fused kernels against their parts on c's device (random data) and turns them on for that
 * device when they agree; report (may be NULL) gets one line. A disagreement is not an error: the
 * kernels stay off. SERVD_FUSED=0 keeps them off. */
SERVD_API int servd_cuda_fused_check(servd_cuda_ctx *c, char *report, size_t cap);
SERVD_API int servd_cuda_rmsnorm(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *x, const servd_bf16_t *w,
                                 int m, int d, float eps);
/* In place on x (m, n_heads*head_dim); positions (m) device i32. */
SERVD_API int servd_cuda_rope(servd_cuda_ctx *c, servd_bf16_t *x, const int32_t *positions, int m, int n_heads,
                              const servd_rope_params *p);
SERVD_API int servd_cuda_swiglu(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *gate, const servd_bf16_t *up,
                                int64_t n);
SERVD_API int servd_cuda_add(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *a, const servd_bf16_t *b,
                             int64_t n);
/* out (m,d) = table[ids[i]] for ids (m) device i32 in [0, vocab). */
SERVD_API int servd_cuda_embedding(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *table, const int32_t *ids,
                                   int m, int d, int64_t vocab);

/* out (m,d) = table[ids[i] - row_offset] for table (rows, d), zeros where that is outside [0, rows)
 * (vocabulary-parallel shards). */
SERVD_API int servd_cuda_embedding_rows(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *table,
                                        const int32_t *ids, int m, int d, int64_t rows, int64_t row_offset);

/* Paged KV cache of one layer on device: (n_blocks, block_size, kv_dim) bf16 for K and for V. */
SERVD_API int servd_cuda_kv_write(servd_cuda_ctx *c, servd_bf16_t *k_cache, servd_bf16_t *v_cache,
                                  const servd_bf16_t *k, const servd_bf16_t *v, const int32_t *slots, int t, int kv_dim,
                                  int64_t n_slots); /* slots < 0 or >= n_slots are skipped */

/* The batch layout of servd_attn_batch, with every array on the device. block_tables is
 * (n_seqs, max_blocks) row-major. Host copies of q_len and q_start are needed to plan the launch. */
typedef struct servd_cuda_attn_batch {
  int n_seqs;
  int max_blocks;
  const int32_t *q_start, *q_len, *kv_len, *block_tables; /* device */
  const int32_t *h_q_start, *h_q_len, *h_kv_len;          /* host */
} servd_cuda_attn_batch;

/* out (t, n_heads*head_dim) = causal attention of q over the cache; decode rows use split-K over
 * the context, prefill chunks a flash-attention tiling. head_dim 64, 96, 128 or 256.
 * Decode-only batches (every h_q_len 1) read only h_q_len and h_kv_len on the host (for checks): the
 * grid and the scratch depend on n_seqs, n_heads and max_blocks alone, and each block finds its part
 * of the context from the device kv_len, so the launch can be captured in a graph and replayed over
 * later contexts up to max_blocks * block_size. */
SERVD_API int servd_cuda_attention(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *q,
                                   const servd_bf16_t *k_cache, const servd_bf16_t *v_cache,
                                   const servd_cuda_attn_batch *b, int n_heads, int n_kv_heads, int head_dim,
                                   int block_size, float scale);
/* As servd_cuda_attention with a sliding window: the query at position p sees keys p - window + 1 ..
 * p (window 0: none; both kernels start at the oldest key a row sees). */
SERVD_API int servd_cuda_attention_window(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *q,
                                          const servd_bf16_t *k_cache, const servd_bf16_t *v_cache,
                                          const servd_cuda_attn_batch *b, int n_heads, int n_kv_heads, int head_dim,
                                          int block_size, float scale, int window);

/* Selection order (as the CPU ops): larger first, ties to the lower index, NaN below every number.
 * Every returned index is in [0, n): a row of -inf or of NaN gives 0. */
/* out (m) device i32 = argmax of each row of logits (m,n) f32. */
SERVD_API int servd_cuda_argmax(servd_cuda_ctx *c, int32_t *out, const float *logits, int m, int n);
/* Top k (k <= 64) of each row: values (m,k) f32 and indices (m,k) i32 on the device, descending. */
SERVD_API int servd_cuda_topk(servd_cuda_ctx *c, float *values, int32_t *indices, const float *logits, int m, int n,
                              int k);
/* Samples one token per row from softmax(logits/temperature) (Gumbel-max, exact), seeds per row;
 * temperature <= 0 is argmax. */
SERVD_API int servd_cuda_sample(servd_cuda_ctx *c, int32_t *out, const float *logits, int m, int n, float temperature,
                                const uint64_t *seeds /* device (m) */, uint64_t step);

/* ---- ops of the registry (servd/ops.def): one tensor-level launcher per ANYT row, in its own
 * <name>.cu. servd_device_<name> calls it on this context after checking that the tensors are on
 * c's device and contiguous and that they meet the op's contract (servd__check_<name>), so the
 * launcher only reads their shapes and launches. */
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANYT_##dispatch(SERVD_API int servd_cuda_##name(servd_cuda_ctx *c, SERVD__PARAMS(sig, names));)
#include "servd/ops.def"
#undef SERVD_OP

/* ---- CUDA graphs: capture a step once per batch-size bucket, replay it ---- */
typedef struct servd_cuda_graph servd_cuda_graph;
SERVD_API int servd_cuda_graph_begin(servd_cuda_ctx *c);
SERVD_API int servd_cuda_graph_end(servd_cuda_ctx *c, servd_cuda_graph **out);
SERVD_API int servd_cuda_graph_launch(servd_cuda_ctx *c, servd_cuda_graph *g);
SERVD_API void servd_cuda_graph_destroy(servd_cuda_graph *g); /* accepts NULL */

/* ---- NCCL: one communicator per rank, all in this process ---- */
typedef struct servd_nccl servd_nccl;
SERVD_API int servd_nccl_create(servd_nccl **out, int n_ranks, const int *devices);
SERVD_API void servd_nccl_destroy(servd_nccl *n); /* accepts NULL; no rank may be inside a collective */
/* Sum in place across ranks on rank's context stream; every rank calls it (from its own thread). */
SERVD_API int servd_nccl_allreduce_bf16(servd_nccl *n, int rank, servd_cuda_ctx *c, servd_bf16_t *x, size_t count);
/* recv (n_ranks * count) = every rank's send (count) in rank order. */
SERVD_API int servd_nccl_allgather_f32(servd_nccl *n, int rank, servd_cuda_ctx *c, const float *send, float *recv,
                                       size_t count);
/* Aborts every rank's communicator (any thread, any number of times, concurrently with the ranks'
 * collectives): ranks blocked in a collective return; later collectives fail with SERVD_ECANCELED
 * until servd_nccl_rebuild. A communicator a rank is using is aborted by that rank when its call
 * returns, never freed under it (the protocol is in nccl_comm.cu). Bumps the graph generation of
 * every rank's device: captured collectives name the aborted communicators' buffers. */
SERVD_API void servd_nccl_abort(servd_nccl *n);
/* New communicators for the same devices; call when no rank is inside a collective (SERVD_EBUSY
 * otherwise). */
SERVD_API int servd_nccl_rebuild(servd_nccl *n);

#ifdef __cplusplus
}
#endif
#endif
