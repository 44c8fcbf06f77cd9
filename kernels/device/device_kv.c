/* The paged KV cache on a device: storage only (the host servd_kv_cache keeps the block bookkeeping).
 * One allocation holds every layer's K and V, each (n_blocks*block_size, kv_dim) bf16.
 *
 * Allocated with cudaMalloc and given back with cudaFree, outside the caching allocator: the engine
 * sizes the cache from the free memory measured after a warm-up run over a small cache of its own,
 * which must then really be free (a cached block would stay counted as used). */
#include <stdlib.h>

#include "device_internal.h"

struct servd_device_kv {
  int device, n_layers, kv_dim, block_size, n_blocks;
  void *mem;          /* cudaMalloc'd */
  size_t layer_bytes; /* bytes of K (or V) of one layer */
};

size_t servd_device_kv_bytes(int n_layers, int kv_dim, int block_size, int n_blocks) {
  if (n_layers < 1 || kv_dim < 1 || block_size < 1 || n_blocks < 1) return 0;
  return (size_t)n_layers * 2 * (size_t)kv_dim * (size_t)block_size * (size_t)n_blocks * 2;
}

typedef struct kv_create_args {
  int device;
  int n_layers;
  int kv_dim;
  int block_size;
  int n_blocks;
  servd_device_kv **out;
} kv_create_args;
SERVD__DEV_JOB(kv_create, servd_device_kv_create(a->device, a->n_layers, a->kv_dim, a->block_size, a->n_blocks, a->out))
typedef struct kv_destroy_args {
  servd_device_kv *kv;
} kv_destroy_args;
SERVD__DEV_JOB(kv_destroy, (servd_device_kv_destroy(a->kv), 0))
typedef struct kv_write_args {
  servd_device_kv *kv;
  int layer;
  const servd_tensor *k;
  const servd_tensor *v;
  const servd_tensor *slots;
} kv_write_args;
SERVD__DEV_JOB(kv_write, servd_device_kv_write(a->kv, a->layer, a->k, a->v, a->slots))

int servd_device_kv_create(int device, int n_layers, int kv_dim, int block_size, int n_blocks, servd_device_kv **out) {
  const char *op = "device_kv_create";
  *out = NULL;
  int rc = servd__dev_check_kv(op, n_layers, kv_dim, block_size, n_blocks);
  if (rc) return rc;
  rc = servd__dev_valid(op, device);
  if (rc) return rc;
  SERVD__DEV_SYNC(op, device, kv_create, 0, device, n_layers, kv_dim, block_size, n_blocks, out);
  servd_device_kv *kv = calloc(1, sizeof *kv);
  if (!kv) return servd_fail(SERVD_ENOMEM, "%s: out of host memory", op);
  kv->device = device;
  kv->n_layers = n_layers;
  kv->kv_dim = kv_dim;
  kv->block_size = block_size;
  kv->n_blocks = n_blocks;
  kv->layer_bytes = (size_t)kv_dim * (size_t)block_size * (size_t)n_blocks * 2;
  const size_t bytes = servd_device_kv_bytes(n_layers, kv_dim, block_size, n_blocks);
  servd_cuda_ctx *c;
  cudaError_t err = cudaSuccess;
  rc = servd__dev_ctx(op, device, &c); /* makes device current */
  if (!rc && (err = cudaMalloc(&kv->mem, bytes)) != cudaSuccess) {
    cudaGetLastError();
    kv->mem = NULL;
    rc = servd_fail(SERVD_ENOMEM, "%s: cudaMalloc(%zu) on cuda:%d: %s", op, bytes, device, cudaGetErrorString(err));
  }
  /* Zeroed so that nothing ever reads uninitialised bits as NaN. */
  if (!rc && (err = cudaMemsetAsync(kv->mem, 0, bytes, (cudaStream_t)servd__dev_stream(c))) != cudaSuccess)
    rc = servd_fail(SERVD_EDEVICE, "%s: cudaMemsetAsync: %s", op, cudaGetErrorString(err));
  /* Every rank thread's stream uses it next: the zeroing must be done. */
  if (!rc) rc = servd_device_sync(device);
  if (rc) {
    servd_device_kv_destroy(kv);
    return rc;
  }
  *out = kv;
  return SERVD_OK;
}

void servd_device_kv_destroy(servd_device_kv *kv) {
  if (!kv) return;
  if (servd__dev_forwarding()) { /* after the ops queued before it; a failure stays for its step */
    kv_destroy_args a = {kv};
    servd__dev_forward("device_kv_destroy", kv->device, kv_destroy_job, &a, sizeof a,
                       SERVD__DEV_WAIT | SERVD__DEV_ALWAYS | SERVD__DEV_KEEP, NULL, 0);
    return;
  }
  if (kv->mem) {
    int prev = -1;
    bool switched =
        cudaGetDevice(&prev) == cudaSuccess && prev != kv->device && cudaSetDevice(kv->device) == cudaSuccess;
    cudaFree(kv->mem); /* waits for the device: no queued step still uses it */
    if (switched) cudaSetDevice(prev);
    cudaGetLastError();
    /* Graphs captured over this cache name its memory. */
    servd_cuda_generation_bump(kv->device);
  }
  free(kv);
}

int servd_device_kv_device(const servd_device_kv *kv) { return kv ? kv->device : -1; }

/* Internal accessors for attention (device_attention.c). */
int servd__dev_kv_geometry(const servd_device_kv *kv, int *kv_dim, int *block_size, int *n_blocks, int *n_layers) {
  *kv_dim = kv->kv_dim;
  *block_size = kv->block_size;
  *n_blocks = kv->n_blocks;
  *n_layers = kv->n_layers;
  return kv->device;
}

void *servd__dev_kv_layer(const servd_device_kv *kv, int layer, int which /* 0 K, 1 V */) {
  return (char *)kv->mem + ((size_t)layer * 2 + (size_t)which) * kv->layer_bytes;
}

int servd_device_kv_write(servd_device_kv *kv, int layer, const servd_tensor *k, const servd_tensor *v,
                          const servd_tensor *slots) {
  const char *op = "device kv_write";
  SERVD__DEV_ASYNC(op, kv_write, ((servd_tensor *)k, (servd_tensor *)v, (servd_tensor *)slots), kv, layer, k, v, slots);
  char a[128], b[128], c[128];
  if (!kv) return servd_fail(SERVD_EINVAL, "%s: NULL cache", op);
  if (layer < 0 || layer >= kv->n_layers)
    return servd_fail(SERVD_EINVAL, "%s: layer %d of %d", op, layer, kv->n_layers);
  int rc = servd__dev_check_tensor(op, "k", k, SERVD_BF16);
  if (!rc) rc = servd__dev_check_tensor(op, "v", v, SERVD_BF16);
  if (!rc) rc = servd__dev_check_tensor(op, "slots", slots, SERVD_I32);
  if (rc) return rc;
  if (k->device != kv->device || v->device != kv->device || slots->device != kv->device)
    return servd_fail(SERVD_EINVAL, "%s: k %s, v %s, slots %s must be on the cache's device cuda:%d", op,
                      servd__dev_describe(k, a, sizeof a), servd__dev_describe(v, b, sizeof b),
                      servd__dev_describe(slots, c, sizeof c), kv->device);
  if (k->ndim != 2 || v->ndim != 2 || slots->ndim != 1 || k->shape[1] != kv->kv_dim || v->shape[0] != k->shape[0] ||
      v->shape[1] != kv->kv_dim || slots->shape[0] != k->shape[0] || k->shape[0] > INT32_MAX)
    return servd_fail(SERVD_EINVAL, "%s: k %s, v %s, slots %s: expected k, v (t, %d) and slots (t)", op,
                      servd__dev_describe(k, a, sizeof a), servd__dev_describe(v, b, sizeof b),
                      servd__dev_describe(slots, c, sizeof c), kv->kv_dim);
  servd_cuda_ctx *ctx;
  rc = servd__dev_ctx(op, kv->device, &ctx);
  if (rc) return rc;
  rc = servd_cuda_kv_write(ctx, servd__dev_kv_layer(kv, layer, 0), servd__dev_kv_layer(kv, layer, 1),
                           servd_tensor_data(k), servd_tensor_data(v), servd_tensor_data(slots), (int)k->shape[0],
                           kv->kv_dim, (int64_t)kv->n_blocks * kv->block_size);
  return servd__dev_wrap(rc, op);
}
