// The scale of an RMSNorm row, shared by the RMSNorm kernels so that they agree to the bit.
#pragma once
#include "cuda_common.cuh"

// 1 / sqrt(mean of squares + eps) of a row of d values, from each thread's partial sum of squares;
// one block of up to 1024 threads, all of which must call it (it synchronizes the block).
__device__ __forceinline__ float block_rms_inv(float ss, int d, float eps) {
  __shared__ float partial[32];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = rsqrtf(v / d + eps);
  }
  __syncthreads();
  return partial[0];
}
