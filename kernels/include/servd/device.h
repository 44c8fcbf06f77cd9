/* Device tensors and the ops of a Llama forward pass on them: the layer between servd_tensor and the
 * CUDA launchers of kernels/cuda (its private servd/cuda.h), used by the interpreters' `servd` module and by the engine.
 *
 * A device tensor is a servd_tensor with device >= 0 (test t->device: its storage is device memory
 * from a caching allocator, wrapped as SERVD_STORAGE_BORROWED since servd_storage_wrap makes no
 * device kind; it goes back to the cache when the last reference goes). Activations are bf16 (f32
 * for logits), ids and positions i32; device ops take contiguous tensors only. Each calling thread
 * gets its own CUDA context per device (a stream, a cuBLAS handle and a scratch pool), created on
 * first use and destroyed when the thread exits: work a thread enqueues runs in order on its stream;
 * calls that return data to the host wait for it. A device tensor written on one thread's stream and
 * read on another's needs servd_device_sync in between (servd_device_weight syncs for its callers).
 *
 * Built without CUDA (SERVD_CUDA off), servd_device_count reports 0 devices and every other call
 * fails with SERVD_EDEVICE "servd was built without CUDA". Errors name the op, the shapes and the
 * dtypes, as the CPU ops do.
 */
#ifndef SERVD_DEVICE_H
#define SERVD_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "servd/ops.h"
#include "servd/status.h"
#include "servd/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- discovery ---------------------------------------------------------------------------------- */
/* Visible CUDA devices; 0 (and SERVD_OK) without the CUDA backend, a driver or a device. *why gets a
 * one-line reason when 0 ("built without CUDA", "no CUDA driver: ..."); why may be NULL. */
SERVD_API int servd_device_count(int *n, char *why, size_t why_cap);
SERVD_API bool servd_device_built(void); /* true when compiled with the CUDA backend */
/* "NVIDIA H200, 143 GB, sm_90, 132 SMs" */
SERVD_API int servd_device_describe(int device, char *buf, size_t cap);
SERVD_API int servd_device_mem_info(int device, size_t *free_bytes, size_t *total_bytes);

/* ---- tensors ------------------------------------------------------------------------------------ */
/* New contiguous zeroed device tensor (dtype bf16, f32 or i32). */
SERVD_API int servd_device_tensor_new(int device, servd_dtype dtype, int ndim, const int64_t *shape,
                                      servd_tensor **out);
/* New contiguous device copy of a host tensor of any layout, converted to `dtype`: bf16 or f32 from
 * f32, f16, bf16 and the block dtypes (dequantized); i32 from i32. */
SERVD_API int servd_device_upload(int device, const servd_tensor *host, servd_dtype dtype, servd_tensor **out);
/* A read-only bf16 copy of a host weight, shared: every caller asking for the same host bytes (same
 * data address, dtype, shape and strides) on the same device gets the same device tensor (a new
 * reference). The cache keeps the host storage alive, so the address cannot be reused by another
 * mapping while the entry exists. Thread-safe; concurrent first calls upload once. */
SERVD_API int servd_device_weight(int device, const servd_tensor *host, servd_tensor **out);
/* Drops cached weights that no tensor outside the cache references (after a model unloads). */
SERVD_API void servd_device_weights_trim(void);
/* Bytes of device memory held by the weight cache on `device`. */
SERVD_API size_t servd_device_weights_bytes(int device);
/* Copies src into dst: same dtype and shape, host<->device or device<->device, rows of either may be
 * strided (the innermost dimension contiguous). Waits for the copy when dst is on the host. */
SERVD_API int servd_device_copy(servd_tensor *dst, const servd_tensor *src);
/* Waits for the work enqueued on `device` (with executors: every caller's, in order). */
SERVD_API int servd_device_sync(int device);
/* Destroys the calling thread's CUDA contexts (streams, cuBLAS handles, scratch) after waiting for
 * their work. Threads that used a device call it before they end: otherwise the contexts go in a
 * thread-exit destructor, where CUDA calls are not safe (the driver tears down its own per-thread
 * state in destructors of its own). Safe to call more than once, and on threads that used none. */
SERVD_API void servd_device_thread_release(void);
/* Bumped whenever device memory that a captured graph could reference is freed or moved (tensor
 * storage, or scratch of this thread's context that grew); a graph captured at generation g is valid
 * while the generation is still g. */
SERVD_API uint64_t servd_device_generation(int device);

/* ---- executors: one native thread per device makes every CUDA call (device_executor.c) -----------
 * A device call made on any other thread is queued to that device's executor: launches return once
 * queued, calls that return something wait. A queued op that fails makes the next waiting call on
 * that device fail, naming the op. SERVD_DEVICE_EXECUTOR=0 runs calls on the caller's thread. */
SERVD_API bool servd_device_executor_enabled(void);
/* true on an executor thread (or a device layer's short-lived native thread): the only threads that
 * call CUDA while executors are enabled. */
SERVD_API bool servd_device_thread_is_native(void);
/* Stops every executor: drain runs what is queued, otherwise queued ops are cancelled (waiting
 * callers get SERVD_ECANCELED). Each executor releases its contexts before it ends. A later call
 * starts a new executor. Also runs at exit. */
SERVD_API void servd_device_executors_stop(bool drain);
typedef struct servd_device_executor_figures {
  uint64_t enqueued, ran, waits;
  uint64_t skipped;    /* after a failed op, until a waiting call reported it */
  uint64_t cancelled;  /* by a stop without drain */
  uint64_t full_waits; /* enqueues that waited for room in the ring */
  uint64_t queued;     /* in the ring now */
} servd_device_executor_figures;
/* The figures of device's executor (zeros when none runs). */
SERVD_API int servd_device_executor_stats(int device, servd_device_executor_figures *out);

/* ---- ops: the CPU ops' contracts (servd/ops.h) with bf16 activations ---------------------------- */
/* servd_device_<name> of every ANY/ANYT row of servd/ops.def: the CPU op's contract with the device
 * dtypes its row names (bf16 activations and weights unless it says otherwise). */
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANY_##dispatch(SERVD_API int servd_device_##name(SERVD__PARAMS(sig, names));)
#include "servd/ops.def"
#undef SERVD_OP

/* Picks, by measuring on the device, the kernel that matmuls with up to 8 rows use for a weight
 * (n, k) from now on (servd_cuda_gemv_tune: variants that compute other products are refused).
 * report (may be NULL) gets one line of the measured bandwidths. Before graphs are captured. */
SERVD_API int servd_device_matmul_tune(int device, int n, int k, char *report, size_t cap);
/* x += o, then out = rmsnorm(x) * weight (the residual add and the norm after it): what
 * servd_device_add then servd_device_rmsnorm compute. out must not be x. */
SERVD_API int servd_device_add_rmsnorm(servd_tensor *x, const servd_tensor *o, servd_tensor *out,
                                       const servd_tensor *weight, float eps);
/* outs[i] (m, n_i) bf16 = x (m,k) @ ws[i]^T for 1..SERVD_DEVICE_MATMUL_MANY_MAX weights (Q, K, V; gate,
 * up): what one servd_device_matmul per weight computes, in one launch for decode steps. */
#define SERVD_DEVICE_MATMUL_MANY_MAX SERVD_MATMUL_MANY_MAX
SERVD_API int servd_device_matmul_many(int count, servd_tensor *const *outs, const servd_tensor *x,
                                       const servd_tensor *const *ws);
/* Checks the fused kernels (add_rmsnorm, matmul_many) against their parts on the device and turns
 * them on there when they agree (servd_cuda_fused_check); before that, the fused ops run their parts.
 * report (may be NULL) gets one line. */
SERVD_API int servd_device_fused_check(int device, char *report, size_t cap);

/* ---- paged KV cache on a device --------------------------------------------------------------------
 * Storage only: which blocks a sequence owns is kept by a host servd_kv_cache of the same geometry
 * (the scheduler's), whose block ids index this one. Per layer, K and V are (n_blocks*block_size,
 * kv_dim) bf16. */
typedef struct servd_device_kv servd_device_kv;
SERVD_API int servd_device_kv_create(int device, int n_layers, int kv_dim, int block_size, int n_blocks,
                                     servd_device_kv **out);
SERVD_API void servd_device_kv_destroy(servd_device_kv *kv); /* accepts NULL */
SERVD_API size_t servd_device_kv_bytes(int n_layers, int kv_dim, int block_size, int n_blocks);
SERVD_API int servd_device_kv_device(const servd_device_kv *kv);
/* k, v (t, kv_dim) bf16 device into slots i32 device (t); a negative slot is skipped (padding). */
SERVD_API int servd_device_kv_write(servd_device_kv *kv, int layer, const servd_tensor *k, const servd_tensor *v,
                                    const servd_tensor *slots);

/* ---- the inputs of one step on a device ---------------------------------------------------------------
 * Device copies of a step's token ids, positions, KV slots, logit rows and attention layout, in
 * buffers allocated once at their capacities: their addresses never change, so a CUDA graph captured
 * over one step replays over the next step's inputs. */
typedef struct servd_device_batch servd_device_batch;
SERVD_API int servd_device_batch_create(int device, int max_tokens, int max_seqs, int max_blocks_per_seq,
                                        servd_device_batch **out);
SERVD_API void servd_device_batch_destroy(servd_device_batch *db); /* accepts NULL */
/* Uploads one step (host arrays; block_tables[s] holds at least ceil(kv_len[s]/block_size) ids).
 * Fails with SERVD_ERANGE beyond the capacities. */
SERVD_API int servd_device_batch_upload(servd_device_batch *db, int n_tokens, const int32_t *tokens,
                                        const int32_t *positions, const int32_t *slots, int n_logit_rows,
                                        const int32_t *logit_rows, const servd_attn_batch *attn, int block_size);
typedef enum servd_device_batch_field {
  SERVD_DB_TOKENS,     /* i32 (n_tokens) */
  SERVD_DB_POSITIONS,  /* i32 (n_tokens) */
  SERVD_DB_SLOTS,      /* i32 (n_tokens) */
  SERVD_DB_LOGIT_ROWS, /* i32 (n_logit_rows) */
} servd_device_batch_field;
/* A view of the uploaded step's field (new reference). */
SERVD_API servd_tensor *servd_device_batch_tensor(const servd_device_batch *db, servd_device_batch_field f);
SERVD_API int servd_device_batch_capacity(const servd_device_batch *db, int *max_tokens, int *max_seqs);

/* out (t, n_heads*head_dim) bf16 = causal attention of q (t, n_heads*head_dim) bf16 over the cache,
 * for the layout of the step last uploaded to db. head_dim from q's width / n_heads. */
SERVD_API int servd_device_attention(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv, int layer,
                                     const servd_device_batch *db, int n_heads, float scale);
/* As servd_device_attention with a sliding window: the query at position p sees keys p - window + 1
 * .. p (0: none). */
SERVD_API int servd_device_attention_window(servd_tensor *out, const servd_tensor *q, const servd_device_kv *kv,
                                            int layer, const servd_device_batch *db, int n_heads, float scale,
                                            int window);

/* ---- collectives between ranks of one process (NCCL, one communicator per rank) -------------- */
typedef struct servd_device_comm servd_device_comm;
/* devices[r]: the GPU of rank r (distinct). */
SERVD_API int servd_device_comm_create(int world_size, const int *devices, servd_device_comm **out);
SERVD_API void servd_device_comm_destroy(servd_device_comm *c); /* accepts NULL */
/* Sum in place over the ranks; x bf16 device, same shape on every rank. */
SERVD_API int servd_device_allreduce_sum(servd_device_comm *c, int rank, servd_tensor *x);
/* out (m, N) f32 = columns of every rank's x (m, n_r) in rank order, where n_r = min(P, N - r*P),
 * P = ceil(N / world) (vocabulary-parallel logits). */
SERVD_API int servd_device_allgather_cols(servd_device_comm *c, int rank, servd_tensor *out, const servd_tensor *x);
/* A rank failed: aborts every rank's communicator so none waits forever; later collectives fail
 * until servd_device_comm_reset rebuilds them (call it when no rank is inside a collective). */
SERVD_API void servd_device_comm_abort(servd_device_comm *c);
SERVD_API int servd_device_comm_reset(servd_device_comm *c);

/* ---- CUDA graphs of this thread's work on a device -------------------------------------------------
 * Between begin and end only device ops, device-to-device copies and collectives may run on this
 * thread for that device (uploads, downloads, syncs and batch uploads fail the capture); always call
 * graph_end after graph_begin, also when the captured work failed. Device memory allocated during the
 * capture stays reserved for the graph until graph_destroy. Release the previous step's device
 * tensors before graph_begin: a tensor allocated before a capture and released after it bumps the
 * generation. graph_launch refuses (SERVD_ECANCELED) a graph whose device generation changed since
 * its capture ended. */
typedef struct servd_device_graph servd_device_graph;
/* Starts capturing the work this thread enqueues on `device` (ops then run at launch, not now). */
SERVD_API int servd_device_graph_begin(int device);
/* Ends the capture; on failure (an op that cannot be captured ran) returns the error and no graph. */
SERVD_API int servd_device_graph_end(int device, servd_device_graph **out);
SERVD_API int servd_device_graph_launch(servd_device_graph *g);
SERVD_API void servd_device_graph_destroy(servd_device_graph *g); /* accepts NULL */

#ifdef __cplusplus
}
#endif
#endif
