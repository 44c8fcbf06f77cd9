/* The shared weight cache: one bf16 device copy per (device, host bytes, layout), however many
 * interpreters ask for it. An entry holds a reference on the host storage, so the address it is
 * keyed by cannot be reused by another mapping while the entry lives. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"

typedef struct entry {
  int device;
  const void *data;
  servd_dtype dtype;
  int ndim;
  int64_t shape[SERVD_MAX_DIMS], strides[SERVD_MAX_DIMS];
  servd_storage *host; /* one reference */
  servd_tensor *dev;   /* one reference; NULL while the upload runs */
  struct entry *next;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t uploaded = PTHREAD_COND_INITIALIZER;
static entry *entries;

static bool same_key(const entry *e, int device, const servd_tensor *t) {
  if (e->device != device || e->data != servd_tensor_data(t) || e->dtype != t->dtype || e->ndim != t->ndim)
    return false;
  for (int i = 0; i < t->ndim; i++)
    if (e->shape[i] != t->shape[i] || e->strides[i] != t->strides[i]) return false;
  return true;
}

static entry *find(int device, const servd_tensor *t) {
  for (entry *e = entries; e; e = e->next)
    if (same_key(e, device, t)) return e;
  return NULL;
}

static void unlink_entry(entry *e) {
  for (entry **pp = &entries; *pp; pp = &(*pp)->next)
    if (*pp == e) {
      *pp = e->next;
      return;
    }
}

typedef struct weight_args {
  int device;
  const servd_tensor *host;
  servd_tensor **out;
} weight_args;
SERVD__DEV_JOB(weight, servd_device_weight(a->device, a->host, a->out))
typedef struct weights_trim_args {
  int unused;
} weights_trim_args;
SERVD__DEV_JOB(weights_trim, (servd_device_weights_trim(), 0))

int servd_device_weight(int device, const servd_tensor *host, servd_tensor **out) {
  const char *op = "device_weight";
  *out = NULL;
  int rc = servd__dev_check_upload(op, host, SERVD_BF16);
  if (rc) return rc;
  rc = servd__dev_valid(op, device);
  if (rc) return rc;
  SERVD__DEV_SYNC(op, device, weight, 0, device, host, out);
  pthread_mutex_lock(&lock);
  entry *e;
  /* Another thread uploading the same bytes: wait for it (it may fail; then try ourselves). */
  while ((e = find(device, host)) && !e->dev) pthread_cond_wait(&uploaded, &lock);
  if (e) {
    servd_tensor_retain(e->dev);
    *out = e->dev;
    pthread_mutex_unlock(&lock);
    return SERVD_OK;
  }
  e = calloc(1, sizeof *e);
  if (!e) {
    pthread_mutex_unlock(&lock);
    return servd_fail(SERVD_ENOMEM, "%s: out of host memory", op);
  }
  e->device = device;
  e->data = servd_tensor_data(host);
  e->dtype = host->dtype;
  e->ndim = host->ndim;
  memcpy(e->shape, host->shape, sizeof e->shape);
  memcpy(e->strides, host->strides, sizeof e->strides);
  e->host = host->storage;
  servd_storage_retain(e->host);
  e->next = entries;
  entries = e; /* pending: others wait */
  pthread_mutex_unlock(&lock);

  servd_tensor *t = NULL;
  rc = servd_device_upload(device, host, SERVD_BF16, &t);
  /* Other threads use it on their own streams: the copy must have landed. */
  if (!rc) rc = servd_device_sync(device);

  pthread_mutex_lock(&lock);
  if (rc) {
    unlink_entry(e);
  } else {
    e->dev = t;
    servd_tensor_retain(t);
    *out = t;
  }
  pthread_cond_broadcast(&uploaded);
  pthread_mutex_unlock(&lock);
  if (rc) {
    servd_tensor_release(t);
    servd_storage_release(e->host);
    free(e);
    return servd__dev_wrap(rc, op);
  }
  return SERVD_OK;
}

void servd_device_weights_trim(void) {
  if (servd__dev_forwarding()) { /* gives memory back to CUDA: on a native thread */
    weights_trim_args a = {0};
    servd__dev_side("device_weights_trim", weights_trim_job, &a);
    return;
  }
  entry *drop = NULL;
  bool devices[64] = {false};
  pthread_mutex_lock(&lock);
  for (entry **pp = &entries; *pp;) {
    entry *e = *pp;
    /* Unused: the cache holds the only reference on the tensor and no view holds its storage. */
    if (e->dev && __atomic_load_n(&e->dev->refcount, __ATOMIC_ACQUIRE) == 1 &&
        servd_storage_refs(e->dev->storage) == 1) {
      *pp = e->next;
      e->next = drop;
      drop = e;
      if (e->device < 64) devices[e->device] = true;
    } else {
      pp = &e->next;
    }
  }
  pthread_mutex_unlock(&lock);
  for (entry *e = drop, *n; e; e = n) {
    n = e->next;
    servd_tensor_release(e->dev);
    servd_storage_release(e->host);
    free(e);
  }
  /* After a model unloads: give the memory back so free device memory is measured right. */
  for (int d = 0; d < 64; d++)
    if (devices[d]) servd__dev_release_cached(d);
}

size_t servd_device_weights_bytes(int device) {
  size_t n = 0;
  pthread_mutex_lock(&lock);
  for (entry *e = entries; e; e = e->next)
    if (e->device == device && e->dev) n += servd_tensor_nbytes(e->dev);
  pthread_mutex_unlock(&lock);
  return n;
}
