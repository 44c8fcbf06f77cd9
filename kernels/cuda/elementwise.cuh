// Elementwise ops on bf16 with f32 math: SwiGLU (silu(gate) * up) and residual add.
#pragma once
#include "cuda_common.cuh"

__global__ void swiglu_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *gate, const __nv_bfloat16 *up, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = __bfloat162float(gate[i]);
  out[i] = __float2bfloat16(g / (1.0f + __expf(-g)) * __bfloat162float(up[i]));
}

__global__ void add_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *a, const __nv_bfloat16 *b, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

// Deterministic uniform [-scale, scale] from a 64-bit hash of (seed, index): splitmix64.
__global__ void fill_random_kernel(__nv_bfloat16 *x, long long n, unsigned long long seed, float scale) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long z = seed + (unsigned long long)i * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  float u = (float)(z >> 40) * (1.0f / 16777216.0f); /* [0,1) */
  x[i] = __float2bfloat16((2.0f * u - 1.0f) * scale);
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __float2bfloat16(src[i]);
}

__global__ void bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __bfloat162float(src[i]);
}
