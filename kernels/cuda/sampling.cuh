// Token selection on the device, one block per row of logits: argmax, top-k by k rounds of a
// block-wide arg-max below the previous pick, and exact sampling from softmax(logits / T) by the
// Gumbel-max trick (argmax of logits/T + Gumbel noise), so logits never cross PCIe in full.
#pragma once
#include <float.h>
#include "cuda_common.cuh"

// Orders (value, index): larger value first, then lower index (matches the CPU ops' tie rule).
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

__device__ __forceinline__ void block_argmax(float &v, int &i) {
  __shared__ float sv[32];
  __shared__ int si[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) { v = ov; i = oi; }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) { sv[warp] = v; si[warp] = i; }
  __syncthreads();
  if (warp == 0) {
    v = lane < (int)(blockDim.x / 32) ? sv[lane] : -FLT_MAX;
    i = lane < (int)(blockDim.x / 32) ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, v, o);
      int oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
    if (lane == 0) { sv[0] = v; si[0] = i; }
  }
  __syncthreads();
  v = sv[0];
  i = si[0];
}

__global__ void argmax_kernel(int32_t *out, const float *logits, int n) {
  const float *row = logits + (long long)blockIdx.x * n;
  float bv = -FLT_MAX;
  int bi = 0x7fffffff;
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    if (better(row[j], j, bv, bi)) { bv = row[j]; bi = j; }
  block_argmax(bv, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi;
}

__global__ void topk_kernel(float *values, int32_t *indices, const float *logits, int n, int k) {
  const float *row = logits + (long long)blockIdx.x * n;
  float prev_v = FLT_MAX;
  int prev_i = -1;
  for (int r = 0; r < k; r++) {
    float bv = -FLT_MAX;
    int bi = 0x7fffffff;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = row[j];
      const bool below_prev = better(prev_v, prev_i, v, j); /* strictly after the last pick */
      if (below_prev && better(v, j, bv, bi)) { bv = v; bi = j; }
    }
    block_argmax(bv, bi);
    if (threadIdx.x == 0) {
      values[(long long)blockIdx.x * k + r] = bv;
      indices[(long long)blockIdx.x * k + r] = bi;
    }
    prev_v = bv;
    prev_i = bi;
  }
}

__device__ __forceinline__ float uniform01(unsigned long long seed, unsigned long long step, unsigned j) {
  unsigned long long z = seed ^ (step * 0xD1B54A32D192ED03ull) ^ ((unsigned long long)j * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f); /* (0,1) */
}

__global__ void sample_kernel(int32_t *out, const float *logits, int n, float inv_t, const uint64_t *seeds,
                              unsigned long long step) {
  const float *row = logits + (long long)blockIdx.x * n;
  const unsigned long long seed = seeds[blockIdx.x];
  float bv = -FLT_MAX;
  int bi = 0x7fffffff;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float g = -__logf(-__logf(uniform01(seed, step, (unsigned)j)));
    const float v = row[j] * inv_t + g;
    if (better(v, j, bv, bi)) { bv = v; bi = j; }
  }
  block_argmax(bv, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi;
}
