#include <pthread.h>
#include <stdlib.h>

#include "cuda_common.cuh"
#include "mem_pool.h"

namespace {
struct block {
  void *ptr;
  size_t size;
  block *next;
};
} // namespace

struct servd__cuda_pool {
  int device;
  pthread_mutex_t lock;
  block *free_list; /* cached blocks, any size */
  block *live;      /* handed out */
  size_t reserved;
};

static size_t round_size(size_t n) {
  if (n <= 256) return 256;
  if (n >= ((size_t)32 << 20)) return (n + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
  size_t s = 256;
  while (s < n) s <<= 1;
  return s;
}

servd__cuda_pool *servd__cuda_pool_create(int device) {
  servd__cuda_pool *p = (servd__cuda_pool *)calloc(1, sizeof *p);
  if (!p) return NULL;
  p->device = device;
  pthread_mutex_init(&p->lock, NULL);
  return p;
}

// cudaMalloc is not a stream operation; the capturing thread may still allocate (the block then
// keeps its address for the graph), so the capture-safety check is relaxed around it.
static cudaError_t malloc_relaxed(void **ptr, size_t size) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t err = cudaMalloc(ptr, size);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return err;
}

static void free_chain(block *b) {
  while (b) {
    block *n = b->next;
    cudaFree(b->ptr);
    free(b);
    b = n;
  }
}

void servd__cuda_pool_destroy(servd__cuda_pool *p) {
  if (!p) return;
  servd__device_scope scope(p->device); /* the caller's current device comes back on return */
  free_chain(p->free_list);
  free_chain(p->live);
  pthread_mutex_destroy(&p->lock);
  free(p);
}

void *servd__cuda_pool_alloc(servd__cuda_pool *p, size_t bytes) {
  size_t size = round_size(bytes);
  pthread_mutex_lock(&p->lock);
  // Best fit among cached blocks of exactly this class (sizes are classes, so equality suffices).
  block **pp = &p->free_list;
  while (*pp && (*pp)->size != size) pp = &(*pp)->next;
  block *b = *pp;
  if (b) {
    *pp = b->next;
  } else {
    b = (block *)malloc(sizeof *b);
    void *ptr = NULL;
    // cudaMalloc allocates on the current device: make it the pool's for this block only.
    servd__device_scope scope(p->device);
    cudaError_t err = scope.err;
    if (err == cudaSuccess) err = b ? malloc_relaxed(&ptr, size) : cudaErrorMemoryAllocation;
    if (b && err == cudaErrorMemoryAllocation && p->free_list) {
      // Out of device memory: give the cache back and retry once. Cached blocks may still be named
      // by a captured graph, so this bumps the device's generation.
      cudaGetLastError();
      for (block *f = p->free_list; f; f = f->next) p->reserved -= f->size;
      free_chain(p->free_list);
      p->free_list = NULL;
      servd_cuda_generation_bump(p->device);
      err = malloc_relaxed(&ptr, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError(); /* not left for the next launch check to find */
      free(b);
      pthread_mutex_unlock(&p->lock);
      servd_fail(SERVD_ENOMEM, "cuda pool: cudaMalloc(%zu) on device %d: %s", size, p->device, cudaGetErrorString(err));
      return NULL;
    }
    b->ptr = ptr;
    b->size = size;
    p->reserved += size;
  }
  b->next = p->live;
  p->live = b;
  pthread_mutex_unlock(&p->lock);
  return b->ptr;
}

void servd__cuda_pool_free(servd__cuda_pool *p, void *ptr) {
  pthread_mutex_lock(&p->lock);
  block **pp = &p->live;
  while (*pp && (*pp)->ptr != ptr) pp = &(*pp)->next;
  block *b = *pp;
  if (b) {
    *pp = b->next;
    b->next = p->free_list;
    p->free_list = b;
  }
  pthread_mutex_unlock(&p->lock);
}

size_t servd__cuda_pool_reserved(const servd__cuda_pool *p) { return p->reserved; }
