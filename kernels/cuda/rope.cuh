// RoPE in place on x (m, n_heads, head_dim): one thread per rotated pair. Frequencies follow
// Hugging Face's Llama 3.1 scaling (f32 inv_freq, angle = position * inv_freq in f32).
#pragma once
#include "cuda_common.cuh"

struct rope_args {
  int layout; /* SERVD_ROPE_INTERLEAVED or SERVD_ROPE_HALF */
  int head_dim;
  float theta, factor, low_freq_factor, high_freq_factor;
  int original_max_positions;
};

__device__ __forceinline__ float rope_inv_freq(const rope_args &a, int i) {
  float inv = 1.0f / powf(a.theta, (2.0f * i) / a.head_dim);
  if (a.factor > 1.0f) {
    const float two_pi = 6.283185307179586f;
    float wavelen = two_pi / inv;
    float low_wavelen = a.original_max_positions / a.low_freq_factor;
    float high_wavelen = a.original_max_positions / a.high_freq_factor;
    if (wavelen > low_wavelen) {
      inv = inv / a.factor;
    } else if (wavelen >= high_wavelen) {
      float smooth = (a.original_max_positions / wavelen - a.low_freq_factor) /
                     (a.high_freq_factor - a.low_freq_factor);
      inv = (1.0f - smooth) * inv / a.factor + smooth * inv;
    }
  }
  return inv;
}

__global__ void rope_kernel(__nv_bfloat16 *__restrict__ x, const int32_t *__restrict__ pos, int m, int n_heads,
                            rope_args a) {
  const int half = a.head_dim / 2;
  const long long total = (long long)m * n_heads * half;
  long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int i = (int)(t % half);
  const long long row_head = t / half;
  const int row = (int)(row_head / n_heads);
  __nv_bfloat16 *h = x + row_head * a.head_dim;
  const float angle = (float)pos[row] * rope_inv_freq(a, i);
  float s, co;
  sincosf(angle, &s, &co);
  const int i0 = a.layout == SERVD_ROPE_INTERLEAVED ? 2 * i : i;
  const int i1 = a.layout == SERVD_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
  const float x0 = __bfloat162float(h[i0]), x1 = __bfloat162float(h[i1]);
  h[i0] = __float2bfloat16(x0 * co - x1 * s);
  h[i1] = __float2bfloat16(x0 * s + x1 * co);
}
