/* Device memory of tensors: a caching allocator per device that keeps CUDA graphs valid.
 *
 * Blocks are cached on release and reused by the same stream (stream order makes reuse safe without
 * events), so steady-state steps never call cudaMalloc or cudaFree. A captured graph names the
 * addresses its kernels used:
 *  - blocks allocated by a thread while it captures belong to that capture: released during the
 *    capture they are reused within it; released after it they stay reserved until the graph is
 *    destroyed, so a replay never writes memory that someone else now owns;
 *  - a block allocated before a capture began and released after it may be named by that graph, so
 *    its release bumps the device generation (graphs captured before are then stale).
 * Blocks allocated and released between captures (an eager step's activations) bump nothing. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "device_internal.h"

#define MAX_DEVICES 64

typedef struct dblock {
  void *ptr;
  size_t size;
  int device;
  void *stream;              /* the stream that last used it; NULL: idle, any stream may take it */
  uint64_t epoch;            /* the device's capture count when allocated */
  servd__dev_capture *owner; /* the capture that allocated it, until its graph is destroyed */
  bool released;             /* its storage was released while owned by a capture */
  struct dblock *next;       /* free list, or the owner's free list */
  struct dblock *cap_next;   /* the owner's list of blocks */
} dblock;

struct servd__dev_capture {
  int device;
  void *stream;
  bool active;    /* still capturing: released blocks are reused by the capture */
  dblock *blocks; /* every block it allocated (cap_next) */
  dblock *free;   /* released during the capture (next) */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dblock *free_list[MAX_DEVICES];
static uint64_t captures[MAX_DEVICES];
static _Thread_local servd__dev_capture *capturing[MAX_DEVICES];

/* Size classes: powers of two up to 2 MiB, then whole 2 MiB pages (what cudaMalloc hands out
 * anyway). Powers of two all the way to 32 MiB wasted up to half of every weight between 2 and 32 MiB
 * (a 3584 x 3584 bf16 matrix, 24.5 MiB, took 32), memory the KV cache is sized from. */
static size_t round_size(size_t n) {
  const size_t granule = (size_t)2 << 20;
  if (n <= 512) return 512;
  if (n >= granule) return n > SIZE_MAX - granule ? 0 : (n + granule - 1) / granule * granule;
  size_t s = 512;
  while (s < n) s <<= 1;
  return s;
}

/* Unlinks the first free block of `size` usable by `stream` from *head, or NULL. */
static dblock *take(dblock **head, size_t size, void *stream) {
  for (dblock **pp = head; *pp; pp = &(*pp)->next) {
    dblock *b = *pp;
    if (b->size == size && (b->stream == stream || !b->stream)) {
      *pp = b->next;
      b->next = NULL;
      return b;
    }
  }
  return NULL;
}

/* cudaMalloc is no stream operation; the capturing thread may allocate (the address then stays
 * with the graph), so the capture check is relaxed around it. */
static cudaError_t malloc_relaxed(void **ptr, size_t size) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t err = cudaMalloc(ptr, size);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return err;
}

/* Gives idle cached blocks of device back to CUDA (their addresses may be named by graphs). */
static void release_cached(int device) {
  pthread_mutex_lock(&lock);
  dblock *b = free_list[device];
  free_list[device] = NULL;
  pthread_mutex_unlock(&lock);
  if (!b) return;
  servd_cuda_generation_bump(device);
  while (b) {
    dblock *n = b->next;
    cudaFree(b->ptr);
    free(b);
    b = n;
  }
}

static int block_alloc(const char *op, int device, void *stream, size_t bytes, dblock **out) {
  size_t size = round_size(bytes);
  if (size < bytes) return servd_fail(SERVD_ENOMEM, "%s: %zu bytes overflow", op, bytes);
  servd__dev_capture *cap = capturing[device];
  pthread_mutex_lock(&lock);
  dblock *b = cap ? take(&cap->free, size, stream) : NULL;
  bool listed = b != NULL; /* reused within the capture: on its list already */
  if (!b) b = take(&free_list[device], size, stream);
  uint64_t epoch = captures[device];
  pthread_mutex_unlock(&lock);
  if (!b) {
    b = calloc(1, sizeof *b);
    if (!b) return servd_fail(SERVD_ENOMEM, "%s: out of host memory", op);
    cudaError_t err = malloc_relaxed(&b->ptr, size);
    if (err == cudaErrorMemoryAllocation && !cap) {
      cudaGetLastError();
      release_cached(device);
      err = malloc_relaxed(&b->ptr, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      free(b);
      return servd_fail(SERVD_ENOMEM, "%s: cudaMalloc(%zu) on device %d: %s", op, size, device,
                        cudaGetErrorString(err));
    }
    b->size = size;
    b->device = device;
  }
  pthread_mutex_lock(&lock);
  b->stream = stream;
  b->epoch = epoch;
  b->released = false;
  b->owner = cap;
  if (cap && !listed) {
    b->cap_next = cap->blocks;
    cap->blocks = b;
  }
  pthread_mutex_unlock(&lock);
  *out = b;
  return SERVD_OK;
}

static void block_release(void *ctx) {
  dblock *b = ctx;
  pthread_mutex_lock(&lock);
  if (b->owner) {
    if (b->owner->active) {
      b->next = b->owner->free;
      b->owner->free = b;
    } else {
      b->released = true; /* the graph still names it; servd__dev_capture_release frees it */
    }
  } else {
    if (b->epoch != captures[b->device]) servd_cuda_generation_bump(b->device);
    b->next = free_list[b->device];
    free_list[b->device] = b;
  }
  pthread_mutex_unlock(&lock);
}

int servd__dev_storage(const char *op, int device, size_t bytes, bool zero, servd_storage **out) {
  *out = NULL;
  servd_cuda_ctx *c;
  int rc = servd__dev_ctx(op, device, &c);
  if (rc) return rc;
  void *stream = servd__dev_stream(c);
  dblock *b = NULL;
  rc = block_alloc(op, device, stream, bytes, &b);
  if (rc) return rc;
  if (zero && bytes) {
    cudaError_t err = cudaMemsetAsync(b->ptr, 0, bytes, (cudaStream_t)stream);
    if (err != cudaSuccess) {
      block_release(b);
      return servd_fail(SERVD_EDEVICE, "%s: cudaMemsetAsync: %s", op, cudaGetErrorString(err));
    }
  }
  servd_storage *s = servd_storage_wrap(b->ptr, bytes, block_release, b);
  if (!s) {
    block_release(b);
    return servd__dev_wrap(SERVD_ENOMEM, op);
  }
  *out = s;
  return SERVD_OK;
}

int servd__dev_tensor(const char *op, int device, servd_dtype dtype, int ndim, const int64_t *shape, bool zero,
                      servd_tensor **out) {
  *out = NULL;
  int rc = servd__dev_check_new(op, dtype, ndim, shape);
  if (rc) return rc;
  /* packed rows: block dtypes hold block_bytes per block_elems values of the innermost dimension */
  size_t bytes = ndim ? servd_dtype_row_bytes(dtype, shape[ndim - 1]) : servd_dtype_block_bytes(dtype);
  for (int i = 0; i + 1 < ndim; i++) bytes *= (size_t)shape[i];
  servd_storage *s;
  rc = servd__dev_storage(op, device, bytes, zero, &s);
  if (rc) return rc;
  servd_tensor *t = servd_tensor_from_storage(s, 0, dtype, ndim, shape);
  servd_storage_release(s); /* the tensor holds it now (or nothing does, and it is cached) */
  if (!t) return servd__dev_wrap(SERVD_ENOMEM, op);
  /* Storage made by servd_storage_wrap reads as host memory to servd_tensor_from_storage. */
  t->device = device;
  *out = t;
  return SERVD_OK;
}

typedef struct tensor_new_args {
  int device;
  servd_dtype dtype;
  int ndim;
  const int64_t *shape;
  servd_tensor **out;
} tensor_new_args;
SERVD__DEV_JOB(tensor_new, servd_device_tensor_new(a->device, a->dtype, a->ndim, a->shape, a->out))

int servd_device_tensor_new(int device, servd_dtype dtype, int ndim, const int64_t *shape, servd_tensor **out) {
  *out = NULL;
  int rc = servd__dev_check_new("device_tensor_new", dtype, ndim, shape);
  if (!rc) rc = servd__dev_valid("device_tensor_new", device);
  if (rc) return rc;
  /* Waits: the address comes from the executor's allocator (a capture's, while it captures). */
  SERVD__DEV_SYNC("device_tensor_new", device, tensor_new, 0, device, dtype, ndim, shape, out);
  return servd__dev_tensor("device_tensor_new", device, dtype, ndim, shape, true, out);
}

/* ---- capture bookkeeping ---------------------------------------------------------------------- */
int servd__dev_capture_start(int device, servd__dev_capture **out) {
  *out = NULL;
  if (capturing[device])
    return servd_fail(SERVD_EINVAL, "device_graph_begin: this thread already captures on device %d", device);
  servd__dev_capture *cap = calloc(1, sizeof *cap);
  if (!cap) return servd_fail(SERVD_ENOMEM, "device_graph_begin: out of host memory");
  cap->device = device;
  cap->active = true;
  pthread_mutex_lock(&lock);
  captures[device]++;
  pthread_mutex_unlock(&lock);
  capturing[device] = cap;
  *out = cap;
  return SERVD_OK;
}

void servd__dev_capture_stop(int device) {
  servd__dev_capture *cap = capturing[device];
  if (!cap) return;
  pthread_mutex_lock(&lock);
  cap->active = false;
  /* Released during the capture: still named by the graph, so held like later releases. */
  for (dblock *b = cap->free; b; b = b->next) b->released = true;
  cap->free = NULL;
  pthread_mutex_unlock(&lock);
  capturing[device] = NULL;
}

void servd__dev_capture_release(servd__dev_capture *cap) {
  if (!cap) return;
  pthread_mutex_lock(&lock);
  for (dblock *b = cap->blocks, *n; b; b = n) {
    n = b->cap_next;
    b->cap_next = NULL;
    b->owner = NULL;
    if (b->released) {
      b->released = false;
      b->next = free_list[b->device];
      free_list[b->device] = b;
    }
  }
  pthread_mutex_unlock(&lock);
  free(cap);
}

void servd__dev_forget_stream(int device, void *stream) {
  pthread_mutex_lock(&lock);
  for (dblock *b = free_list[device]; b; b = b->next)
    if (b->stream == stream) b->stream = NULL;
  pthread_mutex_unlock(&lock);
}

void servd__dev_release_cached(int device) { release_cached(device); }
