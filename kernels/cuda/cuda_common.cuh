// Shared by every CUDA file: checking macros that turn CUDA/cuBLAS/NCCL failures into SERVD_EDEVICE
// with file and line (library code never aborts), bf16 helpers and warp reductions.
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "servd/cuda.h"
#include "servd/status.h"

#define SERVD_CUDA_CHECK(call) \
  do { \
    cudaError_t err_ = (call); \
    if (err_ != cudaSuccess) \
      return servd_fail(SERVD_EDEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here.
#define SERVD_CUDA_LAUNCH_CHECK() SERVD_CUDA_CHECK(cudaGetLastError())

// Grow-only scratch of a context (one buffer per context); growing it moves the buffer, which bumps
// the device's generation (graphs captured over the old address are stale).
void *servd__cuda_scratch(servd_cuda_ctx *c, size_t bytes);
// Streaming multiprocessors of the context's device (queried once when the context is made).
int servd__cuda_sm_count(const servd_cuda_ctx *c);

// Makes `device` current for the scope and restores the caller's current device when the scope ends,
// so no entry point leaves the current device changed. device < 0: only restore what the scope's
// calls (NCCL, cudaSetDevice) changed. The usual case (already current) costs one cudaGetDevice and
// sets nothing, which keeps it legal while a stream is being captured.
struct servd__device_scope {
  int prev = -1;
  cudaError_t err = cudaSuccess;
  explicit servd__device_scope(int device) {
    err = cudaGetDevice(&prev);
    if (err == cudaSuccess && device >= 0 && device != prev) err = cudaSetDevice(device);
    if (err != cudaSuccess) cudaGetLastError(); /* reported by the caller; later launch checks must not see it */
  }
  ~servd__device_scope() {
    int cur = -1;
    if (prev < 0) return;
    if (cudaGetDevice(&cur) != cudaSuccess || (cur != prev && cudaSetDevice(prev) != cudaSuccess)) cudaGetLastError();
  }
  servd__device_scope(const servd__device_scope &) = delete;
  servd__device_scope &operator=(const servd__device_scope &) = delete;
};

// At the top of an int entry point: the context's device is current until it returns.
#define SERVD_CUDA_DEVICE_SCOPE(ctx) \
  servd__device_scope device_scope_(servd_cuda_ctx_device(ctx)); \
  if (device_scope_.err != cudaSuccess) \
  return servd_fail(SERVD_EDEVICE, "%s:%d: making device %d current: %s", __FILE__, __LINE__, \
                    servd_cuda_ctx_device(ctx), cudaGetErrorString(device_scope_.err))

static inline cudaStream_t servd__stream(servd_cuda_ctx *c) { return (cudaStream_t)servd_cuda_ctx_stream(c); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Unpacks 8 bf16 held in a 16-byte vector into f32.
__device__ __forceinline__ void bf16x8_to_f32(const uint4 &v, float *f) {
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

static inline unsigned servd__div_up(long long a, long long b) { return (unsigned)((a + b - 1) / b); }
