// out (m,d) = x / sqrt(mean(x^2) + eps) * w: one block per row, f32 statistics.
// out may be x (callers normalize in place), so neither is __restrict__: each thread reads x[i]
// before writing out[i] at the same i, and the sum over the row is complete (__syncthreads) before
// any write.
#pragma once
#include "rms.cuh"

__global__ void rmsnorm_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *x, const __nv_bfloat16 *__restrict__ w, int d,
                               float eps) {
  const __nv_bfloat16 *xr = x + (size_t)blockIdx.x * d;
  __nv_bfloat16 *outr = out + (size_t)blockIdx.x * d;
  float ss = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = __bfloat162float(xr[i]);
    ss += v * v;
  }
  const float inv = block_rms_inv(ss, d, eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x)
    outr[i] = __float2bfloat16(__bfloat162float(xr[i]) * inv * __bfloat162float(w[i]));
}
