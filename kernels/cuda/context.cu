// Device discovery, per-thread contexts (stream + cuBLAS handle + caching pool) and copies.
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_common.cuh"
#include "mem_pool.h"

struct servd_cuda_ctx {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  servd__cuda_pool *pool;
  void *blas_ws; /* cuBLAS workspace of our own: cuBLAS then allocates nothing while a graph is captured */
  void *scratch; /* grow-only, from pool */
  size_t scratch_bytes;
  int n_sms; /* streaming multiprocessors: sizes the split-K attention grid */
};

// Per-device generation: bumped whenever device memory a captured graph could reference is freed or
// moved. Devices past the table share the last slot (conservative: more bumps, never fewer).
#define GEN_SLOTS 64
static unsigned long long generations[GEN_SLOTS];
static int gen_slot(int device) { return device < 0 ? 0 : device >= GEN_SLOTS ? GEN_SLOTS - 1 : device; }
extern "C" uint64_t servd_cuda_generation(int device) {
  return __atomic_load_n(&generations[gen_slot(device)], __ATOMIC_ACQUIRE);
}
extern "C" void servd_cuda_generation_bump(int device) {
  __atomic_fetch_add(&generations[gen_slot(device)], 1ull, __ATOMIC_ACQ_REL);
}

extern "C" int servd_cuda_device_count(int *n) {
  *n = 0;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  // No driver or no device is not an error: the CPU backend serves.
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    return SERVD_OK;
  }
  SERVD_CUDA_CHECK(err);
  *n = count;
  return SERVD_OK;
}

extern "C" int servd_cuda_device_describe(int device, char *buf, size_t cap) {
  cudaDeviceProp prop;
  SERVD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  snprintf(buf, cap, "%s, %.0f GB, sm_%d%d, %d SMs", prop.name, prop.totalGlobalMem / 1e9, prop.major, prop.minor,
           prop.multiProcessorCount);
  return SERVD_OK;
}

extern "C" int servd_cuda_ctx_create(int device, servd_cuda_ctx **out) {
  *out = NULL;
  servd_cuda_ctx *c = (servd_cuda_ctx *)calloc(1, sizeof *c);
  if (!c) return servd_fail(SERVD_ENOMEM, "cuda_ctx_create: out of host memory");
  c->device = device;
  // The stream, cuBLAS handle and workspace belong to the device current while they are made; the
  // caller's current device comes back when this returns.
  servd__device_scope scope(-1);
  cudaError_t err = scope.err;
  if (err == cudaSuccess) err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&c->n_sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess && c->n_sms < 1) c->n_sms = 1;
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    cudaGetLastError();
    free(c);
    return servd_fail(SERVD_EDEVICE, "cuda_ctx_create(device %d): %s", device, cudaGetErrorString(err));
  }
  const size_t ws_bytes = (size_t)32 << 20; /* what cuBLAS asks for on sm_90 */
  cublasStatus_t st = cublasCreate(&c->blas);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(c->blas, c->stream);
  if (st == CUBLAS_STATUS_SUCCESS && cudaMalloc(&c->blas_ws, ws_bytes) != cudaSuccess) {
    cudaGetLastError();
    c->blas_ws = NULL;
    st = CUBLAS_STATUS_ALLOC_FAILED;
  }
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetWorkspace(c->blas, c->blas_ws, ws_bytes);
  if (st != CUBLAS_STATUS_SUCCESS) {
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaStreamDestroy(c->stream);
    free(c);
    return servd_fail(SERVD_EDEVICE, "cuda_ctx_create(device %d): cuBLAS: %s", device, cublasGetStatusString(st));
  }
  c->pool = servd__cuda_pool_create(device);
  if (!c->pool) {
    cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaStreamDestroy(c->stream);
    free(c);
    return servd_fail(SERVD_ENOMEM, "cuda_ctx_create: pool");
  }
  *out = c;
  return SERVD_OK;
}

extern "C" void servd_cuda_ctx_destroy(servd_cuda_ctx *c) {
  if (!c) return;
  servd__device_scope scope(c->device); /* restores the caller's device on return */
  cudaStreamSynchronize(c->stream);
  if (c->scratch) servd_cuda_generation_bump(c->device);
  servd__cuda_pool_destroy(c->pool);
  cublasDestroy(c->blas);
  cudaFree(c->blas_ws);
  cudaStreamDestroy(c->stream);
  free(c);
}

extern "C" int servd_cuda_ctx_device(const servd_cuda_ctx *c) { return c->device; }
int servd__cuda_sm_count(const servd_cuda_ctx *c) { return c->n_sms; }
extern "C" void *servd_cuda_ctx_stream(servd_cuda_ctx *c) { return c->stream; }
cublasHandle_t servd__cuda_blas(servd_cuda_ctx *c) { return c->blas; }

extern "C" void *servd_cuda_alloc(servd_cuda_ctx *c, size_t bytes) { return servd__cuda_pool_alloc(c->pool, bytes); }
extern "C" void servd_cuda_free(servd_cuda_ctx *c, void *p) {
  if (p) servd__cuda_pool_free(c->pool, p);
}
extern "C" size_t servd_cuda_pool_reserved(const servd_cuda_ctx *c) { return servd__cuda_pool_reserved(c->pool); }

extern "C" int servd_cuda_upload(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes) {
  SERVD_CUDA_DEVICE_SCOPE(c);
  SERVD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
  return SERVD_OK;
}
extern "C" int servd_cuda_download(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes) {
  SERVD_CUDA_DEVICE_SCOPE(c);
  SERVD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
  SERVD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  return SERVD_OK;
}
extern "C" int servd_cuda_copy(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes) {
  SERVD_CUDA_DEVICE_SCOPE(c);
  SERVD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
  return SERVD_OK;
}
extern "C" int servd_cuda_sync(servd_cuda_ctx *c) {
  SERVD_CUDA_DEVICE_SCOPE(c);
  SERVD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  return SERVD_OK;
}

void *servd__cuda_scratch(servd_cuda_ctx *c, size_t bytes) {
  if (c->scratch_bytes >= bytes) return c->scratch;
  void *p = servd_cuda_alloc(c, bytes);
  if (!p) return NULL;
  if (c->scratch) {
    servd_cuda_free(c, c->scratch);
    servd_cuda_generation_bump(c->device);
  }
  c->scratch = p;
  c->scratch_bytes = bytes;
  return p;
}

extern "C" int servd_cuda_copy_2d(servd_cuda_ctx *c, void *dst, size_t dpitch, const void *src, size_t spitch,
                                  size_t width, size_t rows) {
  if (width == 0 || rows == 0) return SERVD_OK;
  SERVD_CUDA_DEVICE_SCOPE(c);
  SERVD_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, c->stream));
  return SERVD_OK;
}

extern "C" int servd_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
  *free_bytes = *total_bytes = 0;
  servd__device_scope scope(device); /* cudaMemGetInfo reports the current device; restored on return */
  SERVD_CUDA_CHECK(scope.err);
  SERVD_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  return SERVD_OK;
}
