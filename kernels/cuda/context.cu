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
};

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
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    free(c);
    return servd_fail(SERVD_EDEVICE, "cuda_ctx_create(device %d): %s", device, cudaGetErrorString(err));
  }
  cublasStatus_t st = cublasCreate(&c->blas);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(c->blas, c->stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(c->stream);
    free(c);
    return servd_fail(SERVD_EDEVICE, "cuda_ctx_create(device %d): cuBLAS: %s", device, cublasGetStatusString(st));
  }
  c->pool = servd__cuda_pool_create(device);
  if (!c->pool) {
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->stream);
    free(c);
    return servd_fail(SERVD_ENOMEM, "cuda_ctx_create: pool");
  }
  *out = c;
  return SERVD_OK;
}

extern "C" void servd_cuda_ctx_destroy(servd_cuda_ctx *c) {
  if (!c) return;
  cudaSetDevice(c->device);
  cudaStreamSynchronize(c->stream);
  servd__cuda_pool_destroy(c->pool);
  cublasDestroy(c->blas);
  cudaStreamDestroy(c->stream);
  free(c);
}

extern "C" int servd_cuda_ctx_device(const servd_cuda_ctx *c) { return c->device; }
extern "C" void *servd_cuda_ctx_stream(servd_cuda_ctx *c) { return c->stream; }
cublasHandle_t servd__cuda_blas(servd_cuda_ctx *c) { return c->blas; }

extern "C" void *servd_cuda_alloc(servd_cuda_ctx *c, size_t bytes) { return servd__cuda_pool_alloc(c->pool, bytes); }
extern "C" void servd_cuda_free(servd_cuda_ctx *c, void *p) {
  if (p) servd__cuda_pool_free(c->pool, p);
}
extern "C" size_t servd_cuda_pool_reserved(const servd_cuda_ctx *c) { return servd__cuda_pool_reserved(c->pool); }

extern "C" int servd_cuda_upload(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes) {
  SERVD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
  return SERVD_OK;
}
extern "C" int servd_cuda_download(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes) {
  SERVD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
  SERVD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  return SERVD_OK;
}
extern "C" int servd_cuda_copy(servd_cuda_ctx *c, void *dst, const void *src, size_t bytes) {
  SERVD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
  return SERVD_OK;
}
extern "C" int servd_cuda_sync(servd_cuda_ctx *c) {
  SERVD_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  return SERVD_OK;
}
