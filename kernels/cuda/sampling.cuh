// Token selection on the device, one block per row of logits: argmax, top-k by k rounds of a
// block-wide arg-max below the previous pick, and exact sampling from softmax(logits / T) by the
// Gumbel-max trick (argmax of logits/T + Gumbel noise), so logits never cross PCIe in full.
//
// Every selection ranks (value, index) pairs in one total order, the CPU ops' (kernels/src/argmax.c):
// larger values first, ties to the lower index, NaN below every number (-inf included), NaNs among
// themselves by index. Each row's answer is therefore always an index in [0, n): a row of -inf
// gives 0 (its lowest index), a row of NaN gives 0, a NaN never beats a number. The reduction starts
// from a sentinel (NaN, INT_MAX) that every real element outranks, and NaN is tested on the bits, so
// no compiler flag can fold the tests away.
#pragma once
#include <float.h>
#include "cuda_common.cuh"

#define SERVD_SEL_NONE 0x7fffffff /* sentinel index: ranks after every element of a row */

__device__ __forceinline__ bool is_nan_bits(float v) { return (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u; }

// (v at i) ranks before (bv at bi).
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  const bool vn = is_nan_bits(v), bn = is_nan_bits(bv);
  if (vn || bn) return vn && bn ? i < bi : bn;
  return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ float sel_none_value() { return __uint_as_float(0x7fc00000u); /* NaN */ }

__device__ __forceinline__ void block_argmax(float &v, int &i) {
  __shared__ float sv[32];
  __shared__ int si[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < (int)(blockDim.x / 32) ? sv[lane] : sel_none_value();
    i = lane < (int)(blockDim.x / 32) ? si[lane] : SERVD_SEL_NONE;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, v, o);
      int oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (better(ov, oi, v, i)) {
        v = ov;
        i = oi;
      }
    }
    if (lane == 0) {
      sv[0] = v;
      si[0] = i;
    }
  }
  __syncthreads();
  v = sv[0];
  i = si[0];
}

__global__ void argmax_kernel(int32_t *out, const float *logits, int n) {
  const float *row = logits + (long long)blockIdx.x * n;
  float bv = sel_none_value();
  int bi = SERVD_SEL_NONE;
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    if (better(row[j], j, bv, bi)) {
      bv = row[j];
      bi = j;
    }
  block_argmax(bv, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi; /* n >= 1: some element outranked the sentinel */
}

// Round r picks the best element ranked strictly after round r-1's pick; with k <= n there is one
// every round, so every index written is real (values may be -inf or NaN when the row holds them).
__global__ void topk_kernel(float *values, int32_t *indices, const float *logits, int n, int k) {
  const float *row = logits + (long long)blockIdx.x * n;
  float prev_v = 0.f;
  int prev_i = -1; /* -1: no pick yet */
  for (int r = 0; r < k; r++) {
    float bv = sel_none_value();
    int bi = SERVD_SEL_NONE;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = row[j];
      const bool after_prev = prev_i < 0 || better(prev_v, prev_i, v, j);
      if (after_prev && better(v, j, bv, bi)) {
        bv = v;
        bi = j;
      }
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

// Gumbel noise -log(-log(u)) for u uniform in (0,1) from a 64-bit hash of (seed, step, j). In double:
// u = (m + 0.5) / 2^52 with m the top 52 bits is exact, so 0 < u <= 1 - 2^-53 and never rounds to 0
// or 1 (an f32 u built from 24 bits could round to 1.0, giving infinite noise: a token drawn regardless
// of its probability, once in ~130 rows of a 128K vocabulary). The largest draws, which decide the
// winner, come from u near 1 where -log(u) ~ 1 - u must keep its relative precision: double log
// does; f32 __logf's absolute error there is as large as the value.
__device__ __forceinline__ float gumbel(unsigned long long seed, unsigned long long step, unsigned j) {
  unsigned long long z = seed ^ (step * 0xD1B54A32D192ED03ull) ^ ((unsigned long long)j * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = ((double)(z >> 12) + 0.5) * (1.0 / 4503599627370496.0); /* 2^-52 */
  return (float)-log(-log(u));
}

__global__ void sample_kernel(int32_t *out, const float *logits, int n, float inv_t, const uint64_t *seeds,
                              unsigned long long step) {
  const float *row = logits + (long long)blockIdx.x * n;
  const unsigned long long seed = seeds[blockIdx.x];
  float bv = sel_none_value();
  int bi = SERVD_SEL_NONE;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = row[j] * inv_t + gumbel(seed, step, (unsigned)j);
    if (better(v, j, bv, bi)) {
      bv = v;
      bi = j;
    }
  }
  block_argmax(bv, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi;
}
