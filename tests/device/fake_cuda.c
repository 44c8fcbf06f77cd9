/* The CUDA runtime and servd's CUDA launchers, on the host: see fake_cuda.h. Test-only. */
#include "fake_cuda.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/cuda.h"
#include "servd/cuda_blocks.h"
#include "servd/ops.h"
#include "servd/tensor.h"

#define MAX_DEV 8

/* ---- state ----------------------------------------------------------------------------------- */
static pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER; /* every queue, allocation list and counter */
static int n_dev = 1;
static size_t dev_cap = (size_t)4 << 30;
static size_t dev_used[MAX_DEV];
static uint64_t generations[MAX_DEV];
static fake_cuda_stats stats;

/* ---- the executor property: only device executor threads call CUDA ------------------------------
 * With executors on (servd_device_executor_enabled), every stand-in CUDA, cuBLAS-launcher and NCCL
 * entry point checks that it runs on a native device thread (an executor, or the device layer's
 * short-lived side thread), i.e. never on a thread that runs interpreter code. */
bool servd_device_executor_enabled(void);
bool servd_device_thread_is_native(void);
static int thread_check_mode = 1; /* 0 off, 1 abort, 2 count */
static uint64_t thread_violations;
static char first_violation[200];

void fake_cuda_thread_check(int mode) { __atomic_store_n(&thread_check_mode, mode, __ATOMIC_RELEASE); }

uint64_t fake_cuda_thread_violations(char *first, size_t cap) {
  uint64_t n = __atomic_load_n(&thread_violations, __ATOMIC_ACQUIRE);
  if (first && cap) snprintf(first, cap, "%s", n ? first_violation : "");
  return n;
}

static void device_thread(const char *fn) {
  int mode = __atomic_load_n(&thread_check_mode, __ATOMIC_ACQUIRE);
  if (!mode || !servd_device_executor_enabled() || servd_device_thread_is_native()) return;
  char name[16] = "?";
  pthread_getname_np(pthread_self(), name, sizeof name);
  if (__atomic_fetch_add(&thread_violations, 1, __ATOMIC_ACQ_REL) == 0)
    snprintf(first_violation, sizeof first_violation, "%s called on thread \"%s\", not a device executor", fn, name);
  if (mode == 1) {
    fprintf(stderr, "fake cuda: %s called on thread \"%s\", which is not a device executor thread\n", fn, name);
    abort();
  }
}
#define FAKE_DEVICE_THREAD() device_thread(__func__)

static _Thread_local int cur_dev;
static _Thread_local cudaError_t last_err;
static _Thread_local enum cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;
static _Thread_local int thread_captures; /* captures this thread began and has not ended */

void fake_cuda_configure(int n_devices, size_t mem_bytes) {
  n_dev = n_devices < 0 ? 0 : n_devices > MAX_DEV ? MAX_DEV : n_devices;
  if (mem_bytes) dev_cap = mem_bytes;
}

static int fail_captures, fail_capture_launches, fail_graph_launches;

void fake_cuda_fail_launches_in_capture(int n) {
  pthread_mutex_lock(&G);
  fail_capture_launches = n;
  pthread_mutex_unlock(&G);
}

void fake_cuda_fail_graph_launches(int n) {
  pthread_mutex_lock(&G);
  fail_graph_launches = n;
  pthread_mutex_unlock(&G);
}

void fake_cuda_set_memory(size_t mem_bytes) {
  pthread_mutex_lock(&G);
  dev_cap = mem_bytes;
  pthread_mutex_unlock(&G);
}

void fake_cuda_fail_captures(int n) {
  pthread_mutex_lock(&G);
  fail_captures = n;
  pthread_mutex_unlock(&G);
}

void fake_cuda_get_stats(fake_cuda_stats *s) {
  pthread_mutex_lock(&G);
  *s = stats;
  pthread_mutex_unlock(&G);
}

/* Allocations, to tell device, pinned and pageable memory apart. */
typedef struct region {
  char *p;
  size_t n;
  int device; /* -1: pinned host */
  struct region *next;
} region;
static region *regions;

static region *find_region(const void *p) {
  for (region *r = regions; r; r = r->next)
    if ((const char *)p >= r->p && (const char *)p < r->p + (r->n ? r->n : 1)) return r;
  return NULL;
}

/* ---- deferred work ----------------------------------------------------------------------------- */
typedef struct fop {
  struct fop *next;
  void (*run)(const void *args);
  void *blob; /* owned: staged pageable bytes, freed after the run */
  size_t size;
  _Alignas(16) unsigned char args[];
} fop;

typedef struct fgraph fgraph;
struct CUstream_st {
  int device;
  fop *head, *tail;
  fgraph *capture; /* recording instead of queuing */
  bool invalid;    /* the capture was invalidated */
  bool busy;       /* a thread is running its work */
};
struct fgraph {
  fop *head, *tail;
};
struct CUevent_st {
  struct CUstream_st *stream; /* of the last record; NULL once that stream is gone (its work ran) */
  struct CUevent_st *next;    /* every event, to forget a destroyed stream */
};
static struct CUevent_st *events;

static fop *op_new(void (*run)(const void *), const void *args, size_t size, void *blob) {
  fop *o = calloc(1, sizeof *o + size);
  if (!o) abort();
  o->run = run;
  o->blob = blob;
  o->size = size;
  memcpy(o->args, args, size);
  return o;
}

static void append(fop **head, fop **tail, fop *o) {
  if (*tail) (*tail)->next = o;
  else *head = o;
  *tail = o;
}

static pthread_cond_t C = PTHREAD_COND_INITIALIZER; /* with G: streams done running, collectives */

/* Runs the queued work of s in order (under G). Work may wait (a collective for its peers, which
 * releases G): meanwhile s is busy and other flushes of it wait. */
static void flush_locked(struct CUstream_st *s) {
  while (s->busy) pthread_cond_wait(&C, &G);
  s->busy = true;
  while (s->head) {
    fop *o = s->head;
    s->head = s->tail = NULL;
    while (o) {
      fop *n = o->next;
      o->run(o->args);
      free(o->blob);
      free(o);
      o = n;
    }
  }
  s->busy = false;
  pthread_cond_broadcast(&C);
}

/* Every stream there is, to flush them all (cudaFree, device synchronize). */
typedef struct slink {
  struct CUstream_st *s;
  struct slink *next;
} slink;
static slink *streams;

void fake_cuda_flush_all(void) {
  pthread_mutex_lock(&G);
  for (slink *l = streams; l; l = l->next) flush_locked(l->s);
  pthread_mutex_unlock(&G);
}

static void invalidate_thread_captures_locked(void) {
  for (slink *l = streams; l; l = l->next)
    if (l->s->capture && !l->s->invalid) {
      l->s->invalid = true;
      stats.invalidations++;
    }
}

/* A call that cannot be captured on this thread while it captures (thread-local mode). */
static bool prohibited_locked(void) {
  if (thread_captures > 0 && thread_mode != cudaStreamCaptureModeRelaxed) {
    invalidate_thread_captures_locked();
    return true;
  }
  return false;
}

/* Queues (or records) work on s; blob is owned by the op. */
static cudaError_t enqueue(struct CUstream_st *s, void (*run)(const void *), const void *args, size_t size,
                           void *blob) {
  pthread_mutex_lock(&G);
  if (s->capture) {
    if (s->invalid || blob) { /* pageable memory cannot be captured */
      if (!s->invalid) stats.invalidations++;
      s->invalid = true;
      pthread_mutex_unlock(&G);
      free(blob);
      return cudaErrorStreamCaptureInvalidated;
    }
    append(&s->capture->head, &s->capture->tail, op_new(run, args, size, NULL));
  } else {
    append(&s->head, &s->tail, op_new(run, args, size, blob));
  }
  pthread_mutex_unlock(&G);
  return cudaSuccess;
}

/* Waits for s (under G): fails while s is being captured. */
static cudaError_t wait_locked(struct CUstream_st *s) {
  if (s && s->capture) {
    if (!s->invalid) stats.invalidations++;
    s->invalid = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  if (prohibited_locked()) return cudaErrorStreamCaptureUnsupported;
  if (s) flush_locked(s);
  return cudaSuccess;
}

static cudaError_t set_err(cudaError_t e) {
  if (e != cudaSuccess) last_err = e;
  return e;
}

/* ---- the runtime API used by kernels/device ------------------------------------------------------ */
const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorMemoryAllocation: return "out of memory (fake)";
  case cudaErrorInvalidValue: return "invalid argument (fake)";
  case cudaErrorInvalidDevice: return "invalid device ordinal (fake)";
  case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (fake)";
  case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (fake)";
  default: return "fake CUDA error";
  }
}

cudaError_t cudaGetLastError(void) {
  FAKE_DEVICE_THREAD();
  cudaError_t e = last_err;
  last_err = cudaSuccess;
  return e;
}

cudaError_t cudaGetDeviceCount(int *count) {
  FAKE_DEVICE_THREAD();
  *count = n_dev;
  return n_dev ? cudaSuccess : set_err(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int *device) {
  FAKE_DEVICE_THREAD();
  *device = cur_dev;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  FAKE_DEVICE_THREAD();
  if (device < 0 || device >= n_dev) return set_err(cudaErrorInvalidDevice);
  cur_dev = device;
  return cudaSuccess;
}

static cudaError_t alloc_region(void **p, size_t n, int device) {
  *p = NULL;
  pthread_mutex_lock(&G);
  if (device >= 0 && prohibited_locked()) {
    pthread_mutex_unlock(&G);
    return set_err(cudaErrorStreamCaptureUnsupported);
  }
  if (device >= 0 && (dev_used[device] > dev_cap || n > dev_cap - dev_used[device])) {
    pthread_mutex_unlock(&G);
    return set_err(cudaErrorMemoryAllocation);
  }
  region *r = calloc(1, sizeof *r);
  void *mem = NULL;
  if (!r || posix_memalign(&mem, 256, n ? n : 1)) {
    free(r);
    pthread_mutex_unlock(&G);
    return set_err(cudaErrorMemoryAllocation);
  }
  /* Never-written device memory reads as NaN bf16/f32 (0xff bytes), as garbage would: code that
   * relies on zeroed memory it did not zero shows. */
  memset(mem, 0xff, n);
  r->p = mem;
  r->n = n;
  r->device = device;
  r->next = regions;
  regions = r;
  if (device >= 0) {
    dev_used[device] += n;
    stats.mallocs++;
    stats.device_bytes += n;
  }
  pthread_mutex_unlock(&G);
  *p = mem;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) {
  FAKE_DEVICE_THREAD();
  return alloc_region(p, n, cur_dev);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
  FAKE_DEVICE_THREAD();
  (void)flags;
  return alloc_region(p, n, -1);
}

static cudaError_t free_region(void *p, bool device) {
  if (!p) return cudaSuccess;
  pthread_mutex_lock(&G);
  if (device && prohibited_locked()) {
    pthread_mutex_unlock(&G);
    return set_err(cudaErrorStreamCaptureUnsupported);
  }
  /* cudaFree waits for the device (every stream that is not capturing) */
  for (slink *l = streams; l; l = l->next)
    if (!l->s->capture) flush_locked(l->s);
  for (region **pp = &regions; *pp; pp = &(*pp)->next) {
    region *r = *pp;
    if (r->p != p) continue;
    if ((r->device >= 0) != device) break;
    *pp = r->next;
    if (r->device >= 0) {
      dev_used[r->device] -= r->n;
      stats.frees++;
      stats.device_bytes -= r->n;
    }
    pthread_mutex_unlock(&G);
    free(r->p);
    free(r);
    return cudaSuccess;
  }
  pthread_mutex_unlock(&G);
  fprintf(stderr, "fake cuda: %s(%p) of memory it did not allocate\n", device ? "cudaFree" : "cudaFreeHost", p);
  abort();
}

cudaError_t cudaFree(void *p) {
  FAKE_DEVICE_THREAD();
  return free_region(p, true);
}
cudaError_t cudaFreeHost(void *p) {
  FAKE_DEVICE_THREAD();
  return free_region(p, false);
}

typedef struct memset_args {
  void *p;
  int v;
  size_t n;
} memset_args;
static void run_memset(const void *a) {
  const memset_args *m = a;
  memset(m->p, m->v, m->n);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  FAKE_DEVICE_THREAD();
  memset_args a = {p, v, n};
  return set_err(enqueue(s, run_memset, &a, sizeof a, NULL));
}

typedef struct copy2d_args {
  char *dst;
  const char *src; /* a staged copy (the op's blob) for pageable sources */
  size_t dpitch, spitch, width, rows;
} copy2d_args;
static void run_copy2d(const void *a) {
  const copy2d_args *c = a;
  for (size_t r = 0; r < c->rows; r++) memmove(c->dst + r * c->dpitch, c->src + r * c->spitch, c->width);
}

/* A 2D copy in any direction. Pageable sources are staged at the call (as CUDA does), pageable
 * destinations are written after the stream's earlier work (the call waits for it). */
static cudaError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                          struct CUstream_st *s) {
  if (!width || !rows) return cudaSuccess;
  if (dpitch < width || spitch < width) return set_err(cudaErrorInvalidPitchValue);
  pthread_mutex_lock(&G);
  region *dr = find_region(dst), *sr = find_region(src);
  pthread_mutex_unlock(&G);
  const bool dst_pageable = !dr, src_pageable = !sr;
  if (dst_pageable) { /* device -> pageable host: synchronous */
    pthread_mutex_lock(&G);
    cudaError_t e = wait_locked(s);
    if (e == cudaSuccess) {
      copy2d_args a = {dst, src, dpitch, spitch, width, rows};
      run_copy2d(&a);
    }
    pthread_mutex_unlock(&G);
    return set_err(e);
  }
  copy2d_args a = {dst, src, dpitch, spitch, width, rows};
  void *blob = NULL;
  if (src_pageable) {
    pthread_mutex_lock(&G);
    bool bad = s->capture != NULL;
    if (bad) {
      if (!s->invalid) stats.invalidations++;
      s->invalid = true;
    }
    pthread_mutex_unlock(&G);
    if (bad) return set_err(cudaErrorStreamCaptureUnsupported);
    blob = malloc(width * rows);
    if (!blob) return set_err(cudaErrorMemoryAllocation);
    for (size_t r = 0; r < rows; r++) memcpy((char *)blob + r * width, (const char *)src + r * spitch, width);
    a.src = blob;
    a.spitch = width;
  }
  return set_err(enqueue(s, run_copy2d, &a, sizeof a, blob));
}

static void count_h2d(enum cudaMemcpyKind kind, size_t bytes) {
  if (kind != cudaMemcpyHostToDevice) return;
  pthread_mutex_lock(&G);
  stats.h2d_bytes += bytes;
  pthread_mutex_unlock(&G);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s) {
  FAKE_DEVICE_THREAD();
  count_h2d(kind, width * height);
  return copy2d(dst, dpitch, src, spitch, width, height, s);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
  FAKE_DEVICE_THREAD();
  count_h2d(kind, n);
  return copy2d(dst, n, src, n, n, 1, s);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
  FAKE_DEVICE_THREAD();
  pthread_mutex_lock(&G);
  *status = !s->capture  ? cudaStreamCaptureStatusNone
            : s->invalid ? cudaStreamCaptureStatusInvalidated
                         : cudaStreamCaptureStatusActive;
  pthread_mutex_unlock(&G);
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  FAKE_DEVICE_THREAD();
  enum cudaStreamCaptureMode old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  FAKE_DEVICE_THREAD();
  (void)flags;
  *e = calloc(1, sizeof **e);
  if (!*e) return set_err(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&G);
  (*e)->next = events;
  events = *e;
  pthread_mutex_unlock(&G);
  return cudaSuccess;
}

static void run_nothing(const void *a) { (void)a; }

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  FAKE_DEVICE_THREAD();
  pthread_mutex_lock(&G);
  bool capturing = s && s->capture;
  pthread_mutex_unlock(&G);
  if (capturing) return set_err(cudaErrorStreamCaptureUnsupported); /* not used under capture here */
  pthread_mutex_lock(&G);
  e->stream = s;
  pthread_mutex_unlock(&G);
  int dummy = 0;
  return set_err(enqueue(s, run_nothing, &dummy, sizeof dummy, NULL));
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  FAKE_DEVICE_THREAD();
  pthread_mutex_lock(&G);
  cudaError_t r = wait_locked(e->stream);
  pthread_mutex_unlock(&G);
  return set_err(r);
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  FAKE_DEVICE_THREAD();
  pthread_mutex_lock(&G);
  for (struct CUevent_st **pp = &events; *pp; pp = &(*pp)->next)
    if (*pp == e) {
      *pp = e->next;
      break;
    }
  pthread_mutex_unlock(&G);
  free(e);
  return cudaSuccess;
}

/* ---- servd/cuda.h: contexts, memory, copies ---------------------------------------------------- */
struct servd_cuda_ctx {
  int device;
  struct CUstream_st *stream;
};

static int fail_cuda(cudaError_t e, const char *what) {
  cudaGetLastError();
  return servd_fail(SERVD_EDEVICE, "fake cuda: %s: %s", what, cudaGetErrorString(e));
}
#define CK(call, what) \
  do { \
    cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) return fail_cuda(e_, what); \
  } while (0)

int servd_cuda_device_count(int *n) {
  FAKE_DEVICE_THREAD();
  *n = n_dev;
  return SERVD_OK;
}

int servd_cuda_device_describe(int device, char *buf, size_t cap) {
  FAKE_DEVICE_THREAD();
  snprintf(buf, cap, "Fake GPU %d, %.0f GB (host memory)", device, (double)dev_cap / 1e9);
  return SERVD_OK;
}

/* Fused ops: the stand-in runs their parts, which is what the real ones must equal. */
int servd_cuda_add_rmsnorm(servd_cuda_ctx *c, servd_bf16_t *x, const servd_bf16_t *o, servd_bf16_t *out,
                           const servd_bf16_t *w, int m, int d, float eps) {
  FAKE_DEVICE_THREAD();
  if (out == x) return servd_fail(SERVD_EINVAL, "fake cuda add_rmsnorm: out must not be x");
  int rc = servd_cuda_add(c, x, x, o, (int64_t)m * d);
  return rc ? rc : servd_cuda_rmsnorm(c, out, x, w, m, d, eps);
}

int servd_cuda_matmul_many(servd_cuda_ctx *c, int count, servd_bf16_t *const *outs, const servd_bf16_t *x,
                           const servd_bf16_t *const *ws, const int *ns, int m, int k) {
  FAKE_DEVICE_THREAD();
  for (int i = 0; i < count; i++) {
    int rc = servd_cuda_matmul(c, outs[i], x, ws[i], m, ns[i], k);
    if (rc) return rc;
  }
  return SERVD_OK;
}

int servd_cuda_fused_check(servd_cuda_ctx *c, char *report, size_t cap) {
  FAKE_DEVICE_THREAD();
  (void)c;
  if (report && cap) snprintf(report, cap, "the parts run (fake)");
  return SERVD_OK;
}

/* The stand-in has one matmul: nothing to choose between. */
int servd_cuda_gemv_tune(servd_cuda_ctx *c, int n, int k, char *report, size_t cap) {
  FAKE_DEVICE_THREAD();
  (void)c;
  if (report && cap) snprintf(report, cap, "%d x %d: one kernel (fake)", n, k);
  return SERVD_OK;
}

int servd_cuda_ctx_create(int device, servd_cuda_ctx **out) {
  FAKE_DEVICE_THREAD();
  *out = NULL;
  if (device < 0 || device >= n_dev) return servd_fail(SERVD_EDEVICE, "fake cuda: ctx on device %d", device);
  servd_cuda_ctx *c = calloc(1, sizeof *c);
  struct CUstream_st *s = calloc(1, sizeof *s);
  slink *l = calloc(1, sizeof *l);
  if (!c || !s || !l) {
    free(c), free(s), free(l);
    return servd_fail(SERVD_ENOMEM, "fake cuda: ctx");
  }
  c->device = s->device = device;
  c->stream = s;
  l->s = s;
  pthread_mutex_lock(&G);
  l->next = streams;
  streams = l;
  stats.contexts++;
  pthread_mutex_unlock(&G);
  *out = c;
  return SERVD_OK;
}

void servd_cuda_ctx_destroy(servd_cuda_ctx *c) {
  FAKE_DEVICE_THREAD();
  if (!c) return;
  pthread_mutex_lock(&G);
  stats.contexts--;
  flush_locked(c->stream);
  for (struct CUevent_st *e = events; e; e = e->next)
    if (e->stream == c->stream) e->stream = NULL;
  for (slink **pp = &streams; *pp; pp = &(*pp)->next)
    if ((*pp)->s == c->stream) {
      slink *l = *pp;
      *pp = l->next;
      free(l);
      break;
    }
  pthread_mutex_unlock(&G);
  free(c->stream);
  free(c);
}

int servd_cuda_ctx_device(const servd_cuda_ctx *c) {
  FAKE_DEVICE_THREAD();
  return c->device;
}
void *servd_cuda_ctx_stream(servd_cuda_ctx *c) {
  FAKE_DEVICE_THREAD();
  return c->stream;
}

int servd_cuda_upload(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes) {
  FAKE_DEVICE_THREAD();
  CK(copy2d(dst, bytes, src, bytes, bytes, 1, c->stream), "upload");
  return SERVD_OK;
}
int servd_cuda_download(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes) {
  FAKE_DEVICE_THREAD();
  CK(copy2d(dst, bytes, src, bytes, bytes, 1, c->stream), "download");
  pthread_mutex_lock(&G);
  cudaError_t e = wait_locked(c->stream);
  pthread_mutex_unlock(&G);
  CK(e, "download: sync");
  return SERVD_OK;
}
int servd_cuda_copy(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes) {
  FAKE_DEVICE_THREAD();
  CK(copy2d(dst, bytes, src, bytes, bytes, 1, c->stream), "copy");
  return SERVD_OK;
}
int servd_cuda_sync(servd_cuda_ctx *c) {
  FAKE_DEVICE_THREAD();
  pthread_mutex_lock(&G);
  cudaError_t e = wait_locked(c->stream);
  pthread_mutex_unlock(&G);
  CK(e, "cudaStreamSynchronize");
  return SERVD_OK;
}
int servd_cuda_copy_2d(servd_cuda_ctx *c, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t rows) {
  FAKE_DEVICE_THREAD();
  CK(copy2d(dst, dpitch, src, spitch, width, rows, c->stream), "copy_2d");
  return SERVD_OK;
}
int servd_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
  FAKE_DEVICE_THREAD();
  pthread_mutex_lock(&G);
  *total_bytes = dev_cap;
  *free_bytes = dev_used[device] < dev_cap ? dev_cap - dev_used[device] : 0;
  pthread_mutex_unlock(&G);
  return SERVD_OK;
}
uint64_t servd_cuda_generation(int device) {
  return __atomic_load_n(&generations[device & (MAX_DEV - 1)], __ATOMIC_ACQUIRE);
}
void servd_cuda_generation_bump(int device) {
  __atomic_fetch_add(&generations[device & (MAX_DEV - 1)], 1, __ATOMIC_ACQ_REL);
}

/* ---- kernels (run when their stream is flushed) -------------------------------------------------- */
static float bf(const servd_bf16_t *p, size_t i) { return servd_bf16_to_f32(p[i]); }

static int launch(servd_cuda_ctx *c, void (*run)(const void *), const void *args, size_t size) {
  pthread_mutex_lock(&G);
  stats.kernels++;
  bool fail = c->stream->capture && fail_capture_launches > 0;
  if (fail) {
    fail_capture_launches--;
    c->stream->invalid = true;
    stats.invalidations++;
  }
  pthread_mutex_unlock(&G);
  if (fail) return servd_fail(SERVD_EDEVICE, "fake cuda: kernel launch failed during capture (injected)");
  CK(enqueue(c->stream, run, args, size, NULL), "kernel launch");
  return SERVD_OK;
}

typedef struct mm_args {
  void *out;
  const servd_bf16_t *x, *w;
  int m, n, k, f32;
} mm_args;
static void run_matmul(const void *a_) {
  const mm_args *a = a_;
  int64_t xs[2] = {a->m, a->k}, ws[2] = {a->n, a->k}, os[2] = {a->m, a->n};
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, xs), *o = servd_tensor_new(SERVD_F32, 2, os);
  servd_storage *st = servd_storage_wrap((void *)a->w, (size_t)a->n * a->k * 2, NULL, NULL);
  servd_tensor *w = st ? servd_tensor_from_storage(st, 0, SERVD_BF16, 2, ws) : NULL;
  servd_storage_release(st);
  if (!x || !o || !w) abort();
  float *xf = servd_tensor_data(x), *of = servd_tensor_data(o);
  for (size_t i = 0; i < (size_t)a->m * a->k; i++) xf[i] = bf(a->x, i);
  if (servd_matmul(o, x, w)) {
    fprintf(stderr, "fake cuda matmul: %s\n", servd_last_error());
    abort();
  }
  for (size_t i = 0; i < (size_t)a->m * a->n; i++) {
    if (a->f32) ((float *)a->out)[i] = of[i];
    else ((servd_bf16_t *)a->out)[i] = servd_f32_to_bf16(of[i]);
  }
  servd_tensor_release(x), servd_tensor_release(o), servd_tensor_release(w);
}
static int matmul(servd_cuda_ctx *c, void *out, const servd_bf16_t *x, const servd_bf16_t *w, int m, int n, int k,
                  int f32) {
  if (m < 0 || n < 0 || k < 0 || k % 8) return servd_fail(SERVD_EINVAL, "fake cuda matmul: m %d n %d k %d", m, n, k);
  if (!m || !n) return SERVD_OK;
  mm_args a = {out, x, w, m, n, k, f32};
  return launch(c, run_matmul, &a, sizeof a);
}
int servd_cuda_matmul(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *x, const servd_bf16_t *w, int m, int n,
                      int k) {
  FAKE_DEVICE_THREAD();
  return matmul(c, out, x, w, m, n, k, 0);
}
int servd_cuda_matmul_f32out(servd_cuda_ctx *c, float *out, const servd_bf16_t *x, const servd_bf16_t *w, int m, int n,
                             int k) {
  FAKE_DEVICE_THREAD();
  return matmul(c, out, x, w, m, n, k, 1);
}

/* Quantized weights: the GPU kernel's own block decoding (servd/cuda_blocks.h), so the stand-in runs
 * its bit unpacking; f32 sums (in another order than its lanes). Above 8 rows the GPU multiplies a
 * bf16 copy of the weight: the decoded values are rounded to bf16 as that copy is. */
typedef struct mmq_args {
  void *out;
  const servd_bf16_t *x;
  const unsigned char *w;
  int dtype, m, n, k, f32;
} mmq_args;
static void run_matmul_quant(const void *a_) {
  const mmq_args *a = a_;
  const int64_t rb = servd_qb_row_bytes(a->dtype, a->k);
  for (int j = 0; j < a->n; j++)
    for (int r = 0; r < a->m; r++) {
      float acc = 0.0f, y[8];
      for (int v = 0; v < a->k; v += 8) {
        servd_qb_decode8(a->dtype, a->w + j * rb, v, y);
        for (int i = 0; i < 8; i++) {
          const float wv = a->m > 8 ? servd_bf16_to_f32(servd_f32_to_bf16(y[i])) : y[i];
          acc += wv * bf(a->x, (size_t)r * a->k + v + i);
        }
      }
      if (a->f32) ((float *)a->out)[(size_t)r * a->n + j] = acc;
      else ((servd_bf16_t *)a->out)[(size_t)r * a->n + j] = servd_f32_to_bf16(acc);
    }
}
int servd_cuda_matmul_quant(servd_cuda_ctx *c, void *out, int out_f32, const servd_bf16_t *x, const void *w, int dtype,
                            int m, int n, int k) {
  FAKE_DEVICE_THREAD();
  if (!servd_qb_supported(dtype) || m < 0 || n < 0 || k < 0 || k % (int)servd_dtype_block_elems((servd_dtype)dtype))
    return servd_fail(SERVD_EINVAL, "fake cuda matmul_quant: %s (%d,%d) x (%d,%d)",
                      servd_dtype_name((servd_dtype)dtype), n, k, m, k);
  mmq_args a = {out, x, w, dtype, m, n, k, out_f32};
  return m && n ? launch(c, run_matmul_quant, &a, sizeof a) : SERVD_OK;
}

typedef struct norm_args {
  servd_bf16_t *out;
  const servd_bf16_t *x, *w;
  int m, d;
  float eps;
} norm_args;
static void run_rmsnorm(const void *a_) {
  const norm_args *a = a_;
  for (int r = 0; r < a->m; r++) {
    const servd_bf16_t *x = a->x + (size_t)r * a->d;
    double ss = 0;
    for (int i = 0; i < a->d; i++) ss += (double)bf(x, i) * bf(x, i);
    const float inv = 1.0f / sqrtf((float)(ss / a->d) + a->eps);
    for (int i = 0; i < a->d; i++) a->out[(size_t)r * a->d + i] = servd_f32_to_bf16(bf(x, i) * inv * bf(a->w, i));
  }
}
int servd_cuda_rmsnorm(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *x, const servd_bf16_t *w, int m, int d,
                       float eps) {
  FAKE_DEVICE_THREAD();
  if (m < 0 || d <= 0) return servd_fail(SERVD_EINVAL, "fake cuda rmsnorm: (%d,%d)", m, d);
  norm_args a = {out, x, w, m, d, eps};
  return m ? launch(c, run_rmsnorm, &a, sizeof a) : SERVD_OK;
}

typedef struct rope_args {
  servd_bf16_t *x;
  const int32_t *pos;
  int m, n_heads;
  servd_rope_params p;
} rope_args;
static void run_rope(const void *a_) {
  const rope_args *a = a_;
  int64_t xs[2] = {a->m, (int64_t)a->n_heads * a->p.head_dim}, ps[1] = {a->m};
  servd_tensor *x = servd_tensor_new(SERVD_F32, 2, xs), *p = servd_tensor_new(SERVD_I32, 1, ps);
  if (!x || !p) abort();
  float *xf = servd_tensor_data(x);
  const size_t n = (size_t)xs[0] * xs[1];
  for (size_t i = 0; i < n; i++) xf[i] = bf(a->x, i);
  memcpy(servd_tensor_data(p), a->pos, sizeof(int32_t) * (size_t)a->m);
  if (servd_rope(x, p, &a->p)) {
    fprintf(stderr, "fake cuda rope: %s\n", servd_last_error());
    abort();
  }
  for (size_t i = 0; i < n; i++) a->x[i] = servd_f32_to_bf16(xf[i]);
  servd_tensor_release(x), servd_tensor_release(p);
}
int servd_cuda_rope(servd_cuda_ctx *c, servd_bf16_t *x, const int32_t *positions, int m, int n_heads,
                    const servd_rope_params *p) {
  FAKE_DEVICE_THREAD();
  if (m < 0 || n_heads <= 0 || p->head_dim <= 0 || p->head_dim % 2)
    return servd_fail(SERVD_EINVAL, "fake cuda rope: m %d heads %d", m, n_heads);
  rope_args a = {x, positions, m, n_heads, *p};
  return m ? launch(c, run_rope, &a, sizeof a) : SERVD_OK;
}

typedef struct ew_args {
  servd_bf16_t *out;
  const servd_bf16_t *a, *b;
  int64_t n;
  int swiglu;
} ew_args;
static void run_ew(const void *a_) {
  const ew_args *e = a_;
  for (int64_t i = 0; i < e->n; i++) {
    float x = bf(e->a, (size_t)i), y = bf(e->b, (size_t)i);
    e->out[i] = servd_f32_to_bf16(e->swiglu ? x / (1.0f + expf(-x)) * y : x + y);
  }
}
int servd_cuda_swiglu(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *gate, const servd_bf16_t *up,
                      int64_t n) {
  FAKE_DEVICE_THREAD();
  ew_args a = {out, gate, up, n, 1};
  return n > 0 ? launch(c, run_ew, &a, sizeof a) : SERVD_OK;
}
int servd_cuda_add(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *a_, const servd_bf16_t *b, int64_t n) {
  FAKE_DEVICE_THREAD();
  ew_args a = {out, a_, b, n, 0};
  return n > 0 ? launch(c, run_ew, &a, sizeof a) : SERVD_OK;
}

typedef struct emb_args {
  servd_bf16_t *out;
  const servd_bf16_t *table;
  const int32_t *ids;
  int m, d;
  int64_t rows, off;
} emb_args;
static void run_embedding(const void *a_) {
  const emb_args *a = a_;
  for (int i = 0; i < a->m; i++) {
    int64_t id = (int64_t)a->ids[i] - a->off;
    for (int j = 0; j < a->d; j++)
      a->out[(size_t)i * a->d + j] = id >= 0 && id < a->rows ? a->table[(size_t)id * a->d + j] : 0;
  }
}
int servd_cuda_embedding_rows(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *table, const int32_t *ids,
                              int m, int d, int64_t rows, int64_t row_offset) {
  FAKE_DEVICE_THREAD();
  if (m < 0 || d <= 0 || rows <= 0) return servd_fail(SERVD_EINVAL, "fake cuda embedding: m %d d %d", m, d);
  emb_args a = {out, table, ids, m, d, rows, row_offset};
  return m ? launch(c, run_embedding, &a, sizeof a) : SERVD_OK;
}
int servd_cuda_embedding(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *table, const int32_t *ids, int m,
                         int d, int64_t vocab) {
  FAKE_DEVICE_THREAD();
  return servd_cuda_embedding_rows(c, out, table, ids, m, d, vocab, 0);
}

typedef struct kvw_args {
  servd_bf16_t *kc, *vc;
  const servd_bf16_t *k, *v;
  const int32_t *slots;
  int t, kv_dim;
  int64_t n_slots;
} kvw_args;
static void run_kv_write(const void *a_) {
  const kvw_args *a = a_;
  for (int i = 0; i < a->t; i++) {
    int32_t s = a->slots[i];
    if (s < 0 || s >= a->n_slots) continue;
    memcpy(a->kc + (size_t)s * a->kv_dim, a->k + (size_t)i * a->kv_dim, sizeof(servd_bf16_t) * (size_t)a->kv_dim);
    memcpy(a->vc + (size_t)s * a->kv_dim, a->v + (size_t)i * a->kv_dim, sizeof(servd_bf16_t) * (size_t)a->kv_dim);
  }
}
int servd_cuda_kv_write(servd_cuda_ctx *c, servd_bf16_t *k_cache, servd_bf16_t *v_cache, const servd_bf16_t *k,
                        const servd_bf16_t *v, const int32_t *slots, int t, int kv_dim, int64_t n_slots) {
  FAKE_DEVICE_THREAD();
  if (t < 0 || kv_dim <= 0 || n_slots <= 0) return servd_fail(SERVD_EINVAL, "fake cuda kv_write: t %d", t);
  kvw_args a = {k_cache, v_cache, k, v, slots, t, kv_dim, n_slots};
  return t ? launch(c, run_kv_write, &a, sizeof a) : SERVD_OK;
}

typedef struct attn_args {
  servd_bf16_t *out;
  const servd_bf16_t *q, *kc, *vc;
  servd_cuda_attn_batch b; /* device arrays read at run time; the host ones are not kept */
  int n_heads, n_kv_heads, head_dim, block_size;
  float scale;
  int window;
} attn_args;
static void run_attention(const void *a_) {
  const attn_args *a = a_;
  const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads, kv_dim = a->n_kv_heads * hd;
  for (int s = 0; s < a->b.n_seqs; s++) {
    const int qs = a->b.q_start[s], ql = a->b.q_len[s], kl = a->b.kv_len[s];
    const int32_t *table = a->b.block_tables + (size_t)s * a->b.max_blocks;
    if (kl > a->b.max_blocks * a->block_size) abort(); /* what the launch checks on the host */
    float *sc = malloc(sizeof(float) * (size_t)(kl > 0 ? kl : 1));
    if (!sc) abort();
    for (int i = 0; i < ql; i++) {
      const int pos = kl - ql + i; /* attends to [lo, pos] */
      const int lo = a->window > 0 && pos + 1 > a->window ? pos + 1 - a->window : 0;
      for (int h = 0; h < a->n_heads; h++) {
        const servd_bf16_t *q = a->q + ((size_t)(qs + i) * a->n_heads + h) * hd;
        const size_t koff = (size_t)(h / group) * hd;
        float mx = -INFINITY;
        for (int t = lo; t <= pos; t++) {
          const size_t row = (size_t)table[t / a->block_size] * a->block_size + (size_t)(t % a->block_size);
          float d = 0;
          for (int e = 0; e < hd; e++) d += bf(q, e) * bf(a->kc, row * kv_dim + koff + e);
          sc[t] = d * a->scale;
          if (sc[t] > mx) mx = sc[t];
        }
        float l = 0;
        for (int t = lo; t <= pos; t++) l += sc[t] = expf(sc[t] - mx);
        servd_bf16_t *o = a->out + ((size_t)(qs + i) * a->n_heads + h) * hd;
        for (int e = 0; e < hd; e++) {
          float acc = 0;
          for (int t = lo; t <= pos; t++) {
            const size_t row = (size_t)table[t / a->block_size] * a->block_size + (size_t)(t % a->block_size);
            acc += sc[t] * bf(a->vc, row * kv_dim + koff + e);
          }
          o[e] = servd_f32_to_bf16(l > 0 ? acc / l : 0);
        }
      }
    }
    free(sc);
  }
}
int servd_cuda_attention(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *q, const servd_bf16_t *k_cache,
                         const servd_bf16_t *v_cache, const servd_cuda_attn_batch *b, int n_heads, int n_kv_heads,
                         int head_dim, int block_size, float scale) {
  FAKE_DEVICE_THREAD();
  return servd_cuda_attention_window(c, out, q, k_cache, v_cache, b, n_heads, n_kv_heads, head_dim, block_size, scale,
                                     0);
}
int servd_cuda_attention_window(servd_cuda_ctx *c, servd_bf16_t *out, const servd_bf16_t *q,
                                const servd_bf16_t *k_cache, const servd_bf16_t *v_cache,
                                const servd_cuda_attn_batch *b, int n_heads, int n_kv_heads, int head_dim,
                                int block_size, float scale, int window) {
  FAKE_DEVICE_THREAD();
  if (window < 0) return servd_fail(SERVD_EINVAL, "fake cuda attention: window %d", window);
  if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || block_size <= 0 || b->n_seqs < 0 || b->max_blocks <= 0)
    return servd_fail(SERVD_EINVAL, "fake cuda attention: heads %d/%d", n_heads, n_kv_heads);
  for (int s = 0; s < b->n_seqs; s++)
    if (b->h_q_len[s] < 0 || b->h_kv_len[s] < b->h_q_len[s] || b->h_kv_len[s] > b->max_blocks * block_size)
      return servd_fail(SERVD_EINVAL, "fake cuda attention: sequence %d has q_len %d, kv_len %d", s, b->h_q_len[s],
                        b->h_kv_len[s]);
  if (head_dim != 64 && head_dim != 96 && head_dim != 128 && head_dim != 256)
    return servd_fail(SERVD_EUNSUPPORTED, "fake cuda attention: head_dim %d", head_dim);
  if (!b->n_seqs) return SERVD_OK;
  attn_args a = {out, q, k_cache, v_cache, *b, n_heads, n_kv_heads, head_dim, block_size, scale, window};
  a.b.h_q_start = a.b.h_q_len = a.b.h_kv_len = NULL;
  return launch(c, run_attention, &a, sizeof a);
}

typedef struct sel_args {
  float *values;
  int32_t *idx;
  const float *x;
  int m, n, k;
} sel_args;
static bool above(float a, int ia, float b, int ib) { /* a ranks above b: larger, ties lower index, NaN last */
  if (isnan(a)) return false;
  if (isnan(b)) return true;
  return a > b || (a == b && ia < ib);
}
static void run_select(const void *a_) {
  const sel_args *a = a_;
  for (int r = 0; r < a->m; r++) {
    const float *x = a->x + (size_t)r * a->n;
    for (int j = 0; j < a->k; j++) { /* the j-th best not taken yet: O(k n), fine for tests */
      int best = -1;
      for (int i = 0; i < a->n; i++) {
        bool taken = false;
        for (int t = 0; t < j && !taken; t++) taken = a->idx[(size_t)r * a->k + t] == i;
        if (!taken && (best < 0 || above(x[i], i, x[best], best))) best = i;
      }
      a->idx[(size_t)r * a->k + j] = best;
      if (a->values) a->values[(size_t)r * a->k + j] = x[best];
    }
  }
}
int servd_cuda_argmax(servd_cuda_ctx *c, int32_t *out, const float *logits, int m, int n) {
  FAKE_DEVICE_THREAD();
  sel_args a = {NULL, out, logits, m, n, 1};
  return m > 0 && n > 0 ? launch(c, run_select, &a, sizeof a) : SERVD_OK;
}
int servd_cuda_topk(servd_cuda_ctx *c, float *values, int32_t *indices, const float *logits, int m, int n, int k) {
  FAKE_DEVICE_THREAD();
  if (k < 1 || k > 64 || k > n) return servd_fail(SERVD_EINVAL, "fake cuda topk: k %d of %d", k, n);
  sel_args a = {values, indices, logits, m, n, k};
  return m > 0 ? launch(c, run_select, &a, sizeof a) : SERVD_OK;
}

/* ---- ANYT rows of servd/ops.def: the CPU op, run when the stream is flushed --------------------------
 * Each tensor is kept as a host view of the same (stand-in device) bytes: the caller may release its
 * tensor before the work runs, as with a real launch; the bytes stay until a wait (cudaFree flushes). */
static servd_tensor host_alias(const servd_tensor *t) {
  servd_tensor h = *t;
  h.storage = servd_storage_wrap(servd_tensor_data(t), servd_tensor_nbytes(t), NULL, NULL);
  if (!h.storage) abort();
  h.offset = 0;
  h.device = -1;
  h.refcount = 1;
  return h;
}
typedef struct anyt2_args {
  int (*fn)(servd_tensor *, const servd_tensor *);
  const char *name;
  servd_tensor t0, t1;
} anyt2_args;
static void run_anyt2(const void *a_) {
  const anyt2_args *a = a_;
  servd_tensor x = a->t0, y = a->t1;
  if (a->fn(&x, &y)) {
    fprintf(stderr, "fake cuda %s: %s\n", a->name, servd_last_error());
    abort();
  }
  servd_storage_release(x.storage), servd_storage_release(y.storage);
}
#define FAKE_ANYT_T2(name, p0_, p1_) \
  anyt2_args args_ = {servd_##name, #name, host_alias(p0_), host_alias(p1_)}; \
  int rc_ = launch(c, run_anyt2, &args_, sizeof args_); \
  if (rc_) servd_storage_release(args_.t0.storage), servd_storage_release(args_.t1.storage); \
  return rc_;
typedef struct anyt3_args {
  int (*fn)(servd_tensor *, const servd_tensor *, const servd_tensor *);
  const char *name;
  servd_tensor t0, t1, t2;
} anyt3_args;
static void run_anyt3(const void *a_) {
  const anyt3_args *a = a_;
  servd_tensor x = a->t0, y = a->t1, z = a->t2;
  if (a->fn(&x, &y, &z)) {
    fprintf(stderr, "fake cuda %s: %s\n", a->name, servd_last_error());
    abort();
  }
  servd_storage_release(x.storage), servd_storage_release(y.storage), servd_storage_release(z.storage);
}
#define FAKE_ANYT_T3(name, p0_, p1_, p2_) \
  anyt3_args args_ = {servd_##name, #name, host_alias(p0_), host_alias(p1_), host_alias(p2_)}; \
  int rc_ = launch(c, run_anyt3, &args_, sizeof args_); \
  if (rc_) \
    servd_storage_release(args_.t0.storage), servd_storage_release(args_.t1.storage), \
        servd_storage_release(args_.t2.storage); \
  return rc_;
typedef struct anyt3f_args {
  int (*fn)(servd_tensor *, const servd_tensor *, const servd_tensor *, float);
  const char *name;
  servd_tensor t0, t1, t2;
  float f;
} anyt3f_args;
static void run_anyt3f(const void *a_) {
  const anyt3f_args *a = a_;
  servd_tensor x = a->t0, y = a->t1, z = a->t2;
  if (a->fn(&x, &y, &z, a->f)) {
    fprintf(stderr, "fake cuda %s: %s\n", a->name, servd_last_error());
    abort();
  }
  servd_storage_release(x.storage), servd_storage_release(y.storage), servd_storage_release(z.storage);
}
#define FAKE_ANYT_T3F(name, p0_, p1_, p2_, f_) \
  anyt3f_args args_ = {servd_##name, #name, host_alias(p0_), host_alias(p1_), host_alias(p2_), f_}; \
  int rc_ = launch(c, run_anyt3f, &args_, sizeof args_); \
  if (rc_) \
    servd_storage_release(args_.t0.storage), servd_storage_release(args_.t1.storage), \
        servd_storage_release(args_.t2.storage); \
  return rc_;
/* A row of another signature kind needs its FAKE_ANYT_<kind> here (the build says which). */
#define SERVD_OP(name, dispatch, py, sig, names) \
  SERVD__IF_ANYT_##dispatch(int servd_cuda_##name(servd_cuda_ctx *c, SERVD__PARAMS(sig, names)) { \
    FAKE_DEVICE_THREAD(); \
    SERVD__CALL(FAKE_ANYT_##sig, name, SERVD__ARGS(names)) \
  })
#include "servd/ops.def"
#undef SERVD_OP

/* ---- graphs -------------------------------------------------------------------------------------- */
struct servd_cuda_graph {
  fgraph g;
};

int servd_cuda_graph_begin(servd_cuda_ctx *c) {
  FAKE_DEVICE_THREAD();
  pthread_mutex_lock(&G);
  if (c->stream->capture) {
    pthread_mutex_unlock(&G);
    return servd_fail(SERVD_EDEVICE, "fake cuda: the stream is capturing already");
  }
  c->stream->capture = calloc(1, sizeof(fgraph));
  c->stream->invalid = false;
  thread_captures++;
  pthread_mutex_unlock(&G);
  return c->stream->capture ? SERVD_OK : servd_fail(SERVD_ENOMEM, "fake cuda: graph");
}

static void free_ops(fop *o) {
  while (o) {
    fop *n = o->next;
    free(o->blob);
    free(o);
    o = n;
  }
}

int servd_cuda_graph_end(servd_cuda_ctx *c, servd_cuda_graph **out) {
  FAKE_DEVICE_THREAD();
  *out = NULL;
  pthread_mutex_lock(&G);
  fgraph *g = c->stream->capture;
  bool invalid = c->stream->invalid;
  if (g && !invalid && fail_captures > 0) {
    fail_captures--;
    invalid = true;
  }
  c->stream->capture = NULL;
  c->stream->invalid = false;
  if (g) thread_captures--;
  if (g && !invalid) stats.captures++;
  else stats.capture_failures++;
  pthread_mutex_unlock(&G);
  if (!g) return servd_fail(SERVD_EDEVICE, "fake cuda: the stream is not capturing");
  if (invalid) {
    free_ops(g->head);
    free(g);
    return servd_fail(SERVD_EDEVICE, "fake cuda graph capture: %s",
                      cudaGetErrorString(cudaErrorStreamCaptureInvalidated));
  }
  servd_cuda_graph *cg = calloc(1, sizeof *cg);
  if (!cg) abort();
  cg->g = *g;
  free(g);
  *out = cg;
  return SERVD_OK;
}

int servd_cuda_graph_launch(servd_cuda_ctx *c, servd_cuda_graph *g) {
  FAKE_DEVICE_THREAD();
  pthread_mutex_lock(&G);
  if (c->stream->capture) {
    pthread_mutex_unlock(&G);
    return servd_fail(SERVD_EDEVICE, "fake cuda: graph launch while capturing");
  }
  if (fail_graph_launches > 0) {
    fail_graph_launches--;
    pthread_mutex_unlock(&G);
    return servd_fail(SERVD_EDEVICE, "fake cuda: graph launch failed (injected)");
  }
  for (fop *o = g->g.head; o; o = o->next)
    append(&c->stream->head, &c->stream->tail, op_new(o->run, o->args, o->size, NULL));
  stats.graph_launches++;
  pthread_mutex_unlock(&G);
  return SERVD_OK;
}

void servd_cuda_graph_destroy(servd_cuda_graph *g) {
  FAKE_DEVICE_THREAD();
  if (!g) return;
  free_ops(g->g.head);
  free(g);
}

/* ---- NCCL: the ranks of one process ---------------------------------------------------------
 * A collective runs when every rank's stream reaches it: called outside a capture it runs at once on
 * the calling thread after the stream's earlier work (blocking like a host waiting for its peers);
 * recorded in a graph it runs when the replaying stream is flushed. Ranks meet by the count of
 * collectives each has run. An abort releases the waiting ranks; their collective fails (or, from a
 * graph, does nothing); a rebuild starts the counts again. */
#define RING 8
#define MAX_RANKS 8
typedef struct coll_slot {
  uint64_t seq; /* 0: free */
  int arrived, left;
  bool done;
  void *buf[MAX_RANKS], *out[MAX_RANKS];
} coll_slot;

struct servd_nccl {
  int n, aborted;
  int devices[MAX_RANKS];
  uint64_t epoch;          /* bumped by abort: work recorded before is void */
  uint64_t ran[MAX_RANKS]; /* collectives each rank has run since the last rebuild */
  coll_slot slots[RING];
};

typedef struct coll_args {
  servd_nccl *n;
  uint64_t epoch;
  int rank, kind; /* 0 allreduce bf16 (buf in place), 1 allgather f32 (buf -> out) */
  size_t count;
  void *buf, *out;
} coll_args;

/* Under G: this rank's part of the collective; false when aborted. */
static bool coll_run_locked(const coll_args *a) {
  servd_nccl *n = a->n;
  if (n->aborted || a->epoch != n->epoch) return false;
  const uint64_t seq = ++n->ran[a->rank];
  coll_slot *sl = &n->slots[seq % RING];
  while (sl->seq && sl->seq != seq && !n->aborted) pthread_cond_wait(&C, &G); /* a round before, leaving */
  if (n->aborted) return false;
  if (!sl->seq) {
    memset(sl, 0, sizeof *sl);
    sl->seq = seq;
  }
  sl->buf[a->rank] = a->buf;
  sl->out[a->rank] = a->out;
  if (++sl->arrived == n->n) {
    if (a->kind == 0) {
      for (size_t i = 0; i < a->count; i++) {
        float sum = 0;
        for (int r = 0; r < n->n; r++) sum += servd_bf16_to_f32(((servd_bf16_t *)sl->buf[r])[i]);
        for (int r = 0; r < n->n; r++) ((servd_bf16_t *)sl->buf[r])[i] = servd_f32_to_bf16(sum);
      }
    } else {
      for (int r = 0; r < n->n; r++)
        for (int q = 0; q < n->n; q++)
          memcpy((float *)sl->out[r] + (size_t)q * a->count, sl->buf[q], a->count * sizeof(float));
    }
    sl->done = true;
    pthread_cond_broadcast(&C);
  }
  while (!sl->done && !n->aborted) pthread_cond_wait(&C, &G);
  bool ok = sl->done;
  if (++sl->left == n->n || !ok) {
    if (sl->left == n->n) sl->seq = 0;
    pthread_cond_broadcast(&C);
  }
  return ok;
}

static void run_coll(const void *a) { coll_run_locked(a); /* from a graph: an aborted collective does nothing */ }

static int collective(servd_nccl *n, int rank, servd_cuda_ctx *c, int kind, void *buf, void *out, size_t count) {
  if (!n || rank < 0 || rank >= n->n) return servd_fail(SERVD_EINVAL, "fake nccl: rank %d", rank);
  pthread_mutex_lock(&G);
  if (n->aborted) {
    pthread_mutex_unlock(&G);
    return servd_fail(SERVD_ECANCELED, "fake nccl: aborted (a rank failed); rebuild");
  }
  coll_args a = {n, n->epoch, rank, kind, count, buf, out};
  if (c->stream->capture) {
    pthread_mutex_unlock(&G);
    CK(enqueue(c->stream, run_coll, &a, sizeof a, NULL), "nccl (capture)");
    return SERVD_OK;
  }
  flush_locked(c->stream); /* the stream's earlier work first */
  bool ok = coll_run_locked(&a);
  pthread_mutex_unlock(&G);
  return ok ? SERVD_OK : servd_fail(SERVD_ECANCELED, "fake nccl: aborted during the collective");
}

int servd_nccl_create(servd_nccl **out, int n_ranks, const int *devices) {
  FAKE_DEVICE_THREAD();
  *out = NULL;
  if (n_ranks < 1 || n_ranks > MAX_RANKS) return servd_fail(SERVD_EUNSUPPORTED, "fake nccl: %d ranks", n_ranks);
  servd_nccl *n = calloc(1, sizeof *n);
  if (!n) return servd_fail(SERVD_ENOMEM, "fake nccl");
  n->n = n_ranks;
  for (int r = 0; r < n_ranks; r++) n->devices[r] = devices[r];
  *out = n;
  return SERVD_OK;
}
void servd_nccl_destroy(servd_nccl *n) {
  FAKE_DEVICE_THREAD();
  if (!n) return;
  for (int r = 0; r < n->n; r++) servd_cuda_generation_bump(n->devices[r]);
  free(n);
}
int servd_nccl_allreduce_bf16(servd_nccl *n, int rank, servd_cuda_ctx *c, servd_bf16_t *x, size_t count) {
  FAKE_DEVICE_THREAD();
  return collective(n, rank, c, 0, x, NULL, count);
}
int servd_nccl_allgather_f32(servd_nccl *n, int rank, servd_cuda_ctx *c, const float *send, float *recv, size_t count) {
  FAKE_DEVICE_THREAD();
  return collective(n, rank, c, 1, (void *)send, recv, count);
}
void servd_nccl_abort(servd_nccl *n) {
  FAKE_DEVICE_THREAD();
  if (!n) return;
  pthread_mutex_lock(&G);
  n->aborted = 1;
  n->epoch++;
  pthread_cond_broadcast(&C);
  pthread_mutex_unlock(&G);
  for (int r = 0; r < n->n; r++) servd_cuda_generation_bump(n->devices[r]); /* as NCCL's abort frees buffers */
}
int servd_nccl_rebuild(servd_nccl *n) {
  FAKE_DEVICE_THREAD();
  pthread_mutex_lock(&G);
  n->aborted = 1; /* a rebuild aborts first */
  n->epoch++;
  pthread_cond_broadcast(&C);
  memset(n->ran, 0, sizeof n->ran);
  memset(n->slots, 0, sizeof n->slots);
  n->aborted = 0;
  pthread_mutex_unlock(&G);
  for (int r = 0; r < n->n; r++) servd_cuda_generation_bump(n->devices[r]);
  return SERVD_OK;
}
