/* Shared by the device_*.c files: this thread's CUDA context, device memory blocks and the argument
 * checks. Private to servd_device. */
#ifndef SERVD_DEVICE_INTERNAL_H
#define SERVD_DEVICE_INTERNAL_H

#include "servd/cuda.h"
#include "servd/device.h"

/* ---- argument checks (device_args.c; no CUDA, also used by device_none.c) ---------------------- */
/* dtype bf16/f32/i32 and 1..4 non-negative dims whose bytes do not overflow. */
int servd__dev_check_new(const char *op, servd_dtype dtype, int ndim, const int64_t *shape);
/* host tensor (device -1, valid dtype) and a supported conversion to dtype. */
int servd__dev_check_upload(const char *op, const servd_tensor *host, servd_dtype dtype);
/* t is a device tensor (device >= 0) of dtype `dtype` (or any when dtype < 0) and contiguous;
 * name is the argument's name in messages. */
int servd__dev_check_tensor(const char *op, const char *name, const servd_tensor *t, int dtype);
/* Every non-NULL tensor of ts[0..n) lies on the same device as ts[0]. */
int servd__dev_check_same(const char *op, const servd_tensor *const *ts, int n);
/* Prefixes the last error with op ("op: <message>") and returns rc; rc == 0 passes through. */
int servd__dev_wrap(int rc, const char *op);
/* "bf16[2,3] on cuda:0" for messages. */
const char *servd__dev_describe(const servd_tensor *t, char *buf, size_t cap);
/* Validation of each op's tensors before any CUDA call: servd__dev_check_<name> with the op's own
 * parameters for every ANY row of servd/ops.def (device_args.c); the no-CUDA stubs run them too. */
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANYH_##dispatch(int servd__dev_check_##name(SERVD__PARAMS(sig, names));)
#include "servd/ops.def"
#undef SERVD_OP
int servd__dev_check_binary(const char *op, const servd_tensor *out, const servd_tensor *a, const servd_tensor *b);
/* The checks of an ANYT row's device op: each tensor on a device and contiguous (any dtype the device
 * holds), all on one device, then the op's contract servd__check_<name> (servd/ops.h). */
#define SERVD__DEV_NAME_OF(t) #t,
#define SERVD__DEV_TENSOR_OF(t) t,
#define SERVD__DEV_CHECK_ANYT(name, sig, names) \
  do { \
    static const char *const names_[] = {SERVD__EACH(sig, SERVD__DEV_NAME_OF, names)}; \
    const servd_tensor *const ts_[] = {SERVD__EACH(sig, SERVD__DEV_TENSOR_OF, names)}; \
    int rc_ = servd__dev_check_tensors("device " #name, names_, ts_, (int)(sizeof ts_ / sizeof ts_[0])); \
    if (rc_ == 0) rc_ = servd__check_##name(SERVD__ARGS(names)); \
    if (rc_ != 0) return rc_; \
  } while (0)
int servd__dev_check_tensors(const char *op, const char *const *names, const servd_tensor *const *ts, int n);
int servd__dev_check_copy(const servd_tensor *dst, const servd_tensor *src);
int servd__dev_check_kv(const char *op, int n_layers, int kv_dim, int block_size, int n_blocks);
int servd__dev_check_batch(const char *op, int max_tokens, int max_seqs, int max_blocks_per_seq);
int servd__dev_check_comm(const char *op, int world_size, const int *devices);

#ifdef SERVD_DEVICE_CUDA
#include <cuda_runtime_api.h>

/* ---- device_executor.c: calls forwarded to the device's executor thread ------------------------ */
/* A job runs a public device function with its arguments on the executor (where forwarding is off). */
typedef int (*servd__dev_job)(void *args);
#define SERVD__DEV_ARGS_MAX 256
#define SERVD__DEV_HOLD_MAX 20
/* The caller waits for the result (args stay in its memory); otherwise args are copied. */
#define SERVD__DEV_WAIT 1u
/* Runs even after an earlier op failed (ends a capture, frees memory). */
#define SERVD__DEV_ALWAYS 2u
/* Leaves an earlier failure for the next waiting call (calls that return nothing). */
#define SERVD__DEV_KEEP 4u
/* Returned by a dry run that passed every check up to taking the CUDA context. */
#define SERVD__DEV_CHECKED 0x5e4d
/* This thread must forward its device calls: executors on and not a native thread or a dry run. */
bool servd__dev_forwarding(void);
/* In a dry run: records device and returns true (servd__dev_ctx then returns SERVD__DEV_CHECKED). */
bool servd__dev_dry(int device);
/* Queues job(args) on device's executor; device < 0: a dry run of job on this thread checks the
 * arguments and names the device. hold: tensors kept alive until the job ran (NULLs skipped). */
int servd__dev_forward(const char *op, int device, servd__dev_job job, void *args, size_t size, unsigned flags,
                       servd_tensor *const *hold, int n_hold);
/* Runs job(args) on a new native thread and waits (calls of no single device: discovery, NCCL
 * communicators, aborting a collective another executor waits in). */
int servd__dev_side(const char *op, servd__dev_job job, void *args);
/* The calling thread captures on device: other threads' calls to it wait until servd__dev_unclaim. */
int servd__dev_claim(const char *op, int device);
void servd__dev_unclaim(int device);
/* Benchmarks only: turns executors on or off for the calls from now on (no work may be pending). */
void servd__dev_executor_override(bool on);
/* Waits until device's queue ran dry; clear: forgets a failure not reported yet. */
int servd__dev_drain(int device, bool clear);

/* NAME_job runs `call` (a public function, with the fields of `NAME_args *a`) on the executor. */
#define SERVD__DEV_JOB(name, call) \
  static int name##_job(void *p_) { \
    name##_args *a = p_; \
    (void)a; \
    return call; \
  }
/* Forwards a launch (no result): checked here, queued, the tensors held. */
#define SERVD__DEV_ASYNC(op, name, hold, ...) \
  do { \
    if (servd__dev_forwarding()) { \
      name##_args a_ = {__VA_ARGS__}; \
      servd_tensor *const h_[] = {SERVD__UNPAREN hold}; \
      return servd__dev_forward(op, -1, name##_job, &a_, sizeof a_, 0, h_, (int)(sizeof h_ / sizeof h_[0])); \
    } \
  } while (0)
/* Forwards a call whose result the caller needs, to device's executor. */
#define SERVD__DEV_SYNC(op, device, name, flags, ...) \
  do { \
    if (servd__dev_forwarding()) { \
      name##_args a_ = {__VA_ARGS__}; \
      return servd__dev_forward(op, device, name##_job, &a_, sizeof a_, SERVD__DEV_WAIT | (flags), NULL, 0); \
    } \
  } while (0)

/* Turns a failed CUDA runtime call into SERVD_EDEVICE naming the op (inside an int function). */
#define DEV_CHECK(op, call) \
  do { \
    cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) return servd_fail(SERVD_EDEVICE, "%s: %s: %s", op, #call, cudaGetErrorString(e_)); \
  } while (0)

/* ---- device_context.c -------------------------------------------------------------------------- */
/* Checks that `device` is a visible ordinal (SERVD_EDEVICE with the reason when CUDA has no device). */
int servd__dev_valid(const char *op, int device);
/* This thread's context on `device` (created on first use, destroyed at thread exit), made current. */
int servd__dev_ctx(const char *op, int device, servd_cuda_ctx **out);
static inline void *servd__dev_stream(servd_cuda_ctx *c) { return servd_cuda_ctx_stream(c); }

/* ---- device_kv.c, device_batch.c: internals for attention ---------------------------------------- */
int servd__dev_kv_geometry(const servd_device_kv *kv, int *kv_dim, int *block_size, int *n_blocks, int *n_layers);
void *servd__dev_kv_layer(const servd_device_kv *kv, int layer, int which /* 0 K, 1 V */);
/* The uploaded step's layout; fails when no step was uploaded or its block size differs. */
int servd__dev_batch_layout(const servd_device_batch *db, const char *op, int block_size, int n_blocks,
                            servd_cuda_attn_batch *out, int *n_tokens);

/* ---- device_memory.c: a per-device caching allocator aware of graph capture --------------------- */
/* Device storage of `bytes` (zeroed on this thread's stream when zero is set), released to the cache
 * when the last reference goes; freeing memory that a captured graph could name bumps the device's
 * generation. */
int servd__dev_storage(const char *op, int device, size_t bytes, bool zero, servd_storage **out);
/* A contiguous device tensor over new storage. */
int servd__dev_tensor(const char *op, int device, servd_dtype dtype, int ndim, const int64_t *shape, bool zero,
                      servd_tensor **out);
/* Capture bookkeeping (device_graph.c): blocks allocated by this thread while it captures on device
 * belong to the graph until it is destroyed. */
typedef struct servd__dev_capture servd__dev_capture;
int servd__dev_capture_start(int device, servd__dev_capture **out);
void servd__dev_capture_stop(int device);                 /* this thread's capture on device ends */
void servd__dev_capture_release(servd__dev_capture *cap); /* graph destroyed: blocks go back */
/* A thread's stream on device is gone (its work finished): its cached blocks become idle. */
void servd__dev_forget_stream(int device, void *stream);
/* Gives the idle cached blocks of device back to CUDA (bumps the generation); not during capture. */
void servd__dev_release_cached(int device);
#endif

#endif
