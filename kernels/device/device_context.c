/* Discovery and this thread's CUDA context per device: a stream, a cuBLAS handle and scratch, made
 * on first use and destroyed when the thread exits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"

#define MAX_DEVICES 64

/* Visible devices, asked once: the set does not change while the process runs. */
static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int n_devices;
static char no_device_why[192];

static int count_job(void *unused) {
  (void)unused;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    snprintf(no_device_why, sizeof no_device_why, "no CUDA driver or device: %s", cudaGetErrorString(err));
    return SERVD_OK;
  }
  if (n == 0) snprintf(no_device_why, sizeof no_device_why, "no CUDA device visible");
  n_devices = n > MAX_DEVICES ? MAX_DEVICES : n;
  return SERVD_OK;
}

/* Asking initializes the driver: on a native thread, as every CUDA call. */
static void count_devices(void) {
  if (servd__dev_side("device_count", count_job, NULL)) {
    snprintf(no_device_why, sizeof no_device_why, "device discovery: %s", servd_last_error());
    n_devices = 0;
  }
}

int servd_device_count(int *n, char *why, size_t why_cap) {
  pthread_once(&count_once, count_devices);
  *n = n_devices;
  if (why && why_cap) snprintf(why, why_cap, "%s", n_devices ? "" : no_device_why);
  return SERVD_OK;
}

bool servd_device_built(void) { return true; }

int servd__dev_valid(const char *op, int device) {
  pthread_once(&count_once, count_devices);
  if (n_devices == 0) return servd_fail(SERVD_EDEVICE, "%s: device %d: %s", op, device, no_device_why);
  if (device < 0 || device >= n_devices)
    return servd_fail(SERVD_EINVAL, "%s: device %d is not one of the %d visible CUDA devices", op, device, n_devices);
  return SERVD_OK;
}

/* ---- per-thread contexts ---------------------------------------------------------------------- */
typedef struct thread_ctxs {
  servd_cuda_ctx *ctx[MAX_DEVICES];
} thread_ctxs;

static pthread_key_t ctx_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_rc;

static void destroy_thread_ctxs(void *p) {
  thread_ctxs *t = p;
  for (int d = 0; d < MAX_DEVICES; d++) {
    if (!t->ctx[d]) continue;
    void *stream = servd_cuda_ctx_stream(t->ctx[d]);
    servd_cuda_ctx_destroy(t->ctx[d]); /* waits for the stream's work */
    servd__dev_forget_stream(d, stream);
  }
  free(t);
}

static void make_key(void) { key_rc = pthread_key_create(&ctx_key, destroy_thread_ctxs); }

void servd_device_thread_release(void) {
  pthread_once(&key_once, make_key);
  if (key_rc) return;
  thread_ctxs *t = pthread_getspecific(ctx_key);
  if (!t) return;
  pthread_setspecific(ctx_key, NULL); /* first: the destructor must not see it again */
  destroy_thread_ctxs(t);
}

int servd__dev_ctx(const char *op, int device, servd_cuda_ctx **out) {
  *out = NULL;
  int rc = servd__dev_valid(op, device);
  if (rc) return rc;
  if (servd__dev_dry(device)) return SERVD__DEV_CHECKED; /* the caller's checks passed */
  /* The gate to every context: a device function that was not forwarded fails here, on a GPU too,
   * instead of calling CUDA from a thread that may run interpreter code. */
  if (servd_device_executor_enabled() && !servd_device_thread_is_native())
    return servd_fail(SERVD_EDEVICE, "%s: cuda:%d asked for on a thread that is no device executor", op, device);
  pthread_once(&key_once, make_key);
  if (key_rc) return servd_fail(SERVD_ENOMEM, "%s: pthread_key_create: %s", op, strerror(key_rc));
  thread_ctxs *t = pthread_getspecific(ctx_key);
  if (!t) {
    t = calloc(1, sizeof *t);
    if (!t) return servd_fail(SERVD_ENOMEM, "%s: out of host memory", op);
    if (pthread_setspecific(ctx_key, t) != 0) {
      free(t);
      return servd_fail(SERVD_ENOMEM, "%s: pthread_setspecific failed", op);
    }
  }
  if (!t->ctx[device]) {
    rc = servd_cuda_ctx_create(device, &t->ctx[device]);
    if (rc) return servd__dev_wrap(rc, op);
  }
  /* Other code on this thread (NCCL, mem_info, another device's context) may have changed the
   * current device; setting it only when it differs keeps this cheap and capture-safe. */
  int cur = -1;
  DEV_CHECK(op, cudaGetDevice(&cur));
  if (cur != device) DEV_CHECK(op, cudaSetDevice(device));
  *out = t->ctx[device];
  return SERVD_OK;
}

/* ---- queries ---------------------------------------------------------------------------------- */
typedef struct describe_args {
  int device;
  char *buf;
  size_t cap;
} describe_args;
SERVD__DEV_JOB(describe, servd_device_describe(a->device, a->buf, a->cap))
typedef struct mem_info_args {
  int device;
  size_t *free_bytes;
  size_t *total_bytes;
} mem_info_args;
SERVD__DEV_JOB(mem_info, servd_device_mem_info(a->device, a->free_bytes, a->total_bytes))
typedef struct sync_args {
  int device;
} sync_args;
SERVD__DEV_JOB(sync, servd_device_sync(a->device))

int servd_device_describe(int device, char *buf, size_t cap) {
  if (buf && cap) buf[0] = 0;
  if (!buf || !cap) return servd_fail(SERVD_EINVAL, "device_describe: no output buffer");
  int rc = servd__dev_valid("device_describe", device);
  if (rc) return rc;
  SERVD__DEV_SYNC("device_describe", device, describe, 0, device, buf, cap);
  rc = servd_cuda_device_describe(device, buf, cap);
  return servd__dev_wrap(rc, "device_describe");
}

int servd_device_mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
  *free_bytes = *total_bytes = 0;
  int rc = servd__dev_valid("device_mem_info", device);
  if (rc) return rc;
  SERVD__DEV_SYNC("device_mem_info", device, mem_info, 0, device, free_bytes, total_bytes);
  rc = servd_cuda_mem_info(device, free_bytes, total_bytes);
  return servd__dev_wrap(rc, "device_mem_info");
}

int servd_device_sync(int device) {
  int rc0 = servd__dev_valid("device_sync", device);
  if (rc0) return rc0;
  SERVD__DEV_SYNC("device_sync", device, sync, 0, device);
  servd_cuda_ctx *c;
  int rc = servd__dev_ctx("device_sync", device, &c);
  if (rc) return rc;
  rc = servd_cuda_sync(c);
  return servd__dev_wrap(rc, "device_sync");
}

uint64_t servd_device_generation(int device) { return servd_cuda_generation(device); }
