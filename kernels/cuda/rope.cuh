// RoPE in place on x (m, n_heads, head_dim). Frequencies follow Hugging Face's Llama 3.1 scaling
// (f32 inv_freq, angle = position * inv_freq in f32), matching the CPU op kernels/src/rope.c.
#pragma once
#include "cuda_common.cuh"

struct rope_args {
  int layout; /* SERVD_ROPE_INTERLEAVED or SERVD_ROPE_HALF */
  int head_dim;
  float theta, factor, low_freq_factor, high_freq_factor;
  int original_max_positions;
  /* The model's per-pair inverse frequencies (servd_rope_params.inv_freq), copied by value into the
   * launch: has_table 0 means from theta. has_long: LongRoPE's second table, used by the whole call
   * when its largest position is >= long_from. */
  int has_table, has_long, long_from;
  float attn; /* cos and sin times this */
  float inv[SERVD_ROPE_TABLE_MAX], inv_long[SERVD_ROPE_TABLE_MAX];
};

// inv_freq_i as kernels/src/rope.c computes it on the host (Hugging Face transformers in f32),
// rounding for rounding: every f32 step uses an explicitly rounded intrinsic, so neither
// --use_fast_math (which scripts/gpu-check.sh passes to every .cu file) nor FMA contraction can
// change it. The power is taken in double and rounded once to f32: that is the correctly rounded
// f32 power (what glibc's powf returns) except at rare double-rounding ties, where CUDA's powf may
// be a few ulp off; at position 128K one ulp of inv_freq already moves the angle by ~0.008 rad.
__device__ __forceinline__ float rope_inv_freq(const rope_args &a, int i) {
  const float e = __fdiv_rn((float)(2 * i), (float)a.head_dim);
  const float inv = __fdiv_rn(1.0f, (float)pow((double)a.theta, (double)e));
  if (!(a.factor > 1.0f)) return inv;
  const float old = (float)a.original_max_positions;
  const float low_wl = __fdiv_rn(old, a.low_freq_factor), high_wl = __fdiv_rn(old, a.high_freq_factor);
  const float wavelen = __fdiv_rn(6.283185307179586f, inv); /* (float)(2*pi) / inv */
  float llama = wavelen > low_wl ? __fdiv_rn(inv, a.factor) : inv;
  if (!(wavelen < high_wl) && !(wavelen > low_wl)) {
    const float smooth = __fdiv_rn(__fsub_rn(__fdiv_rn(old, wavelen), a.low_freq_factor),
                                   __fsub_rn(a.high_freq_factor, a.low_freq_factor));
    llama = __fadd_rn(__fdiv_rn(__fmul_rn(__fsub_rn(1.0f, smooth), llama), a.factor), __fmul_rn(smooth, llama));
  }
  return llama;
}

#define SERVD_ROPE_HEADS_PER_THREAD 8

// One thread per (row, pair i, group of up to 8 heads): the angle and its sine and cosine are made
// once and applied to every head of the group. The angle is the f32 product inv_freq * position, as
// on the host and in transformers; its sine and cosine are taken in double and rounded to f32, which
// is exact to the f32 result for any angle (full range reduction) whatever the fast-math flags:
// __sinf-style approximations lose ~1e-2 absolute near 128K positions.
__global__ void rope_kernel(__nv_bfloat16 *__restrict__ x, const int32_t *__restrict__ pos, int m, int n_heads,
                            const __grid_constant__ rope_args a) {
  const int half = a.head_dim / 2;
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  bool use_long = false;
  if (a.has_long) { /* every thread of the block takes part, before any returns */
    int seen = 0;
    for (int r = threadIdx.x; r < m; r += blockDim.x) seen |= pos[r] >= a.long_from;
    use_long = __syncthreads_or(seen) != 0;
  }
  if (t >= (long long)m * half) return;
  const int i = (int)(t % half), row = (int)(t / half);
  const int h0 = blockIdx.y * SERVD_ROPE_HEADS_PER_THREAD, h1 = min(n_heads, h0 + SERVD_ROPE_HEADS_PER_THREAD);
  const float inv = use_long ? a.inv_long[i] : a.has_table ? a.inv[i] : rope_inv_freq(a, i);
  const float angle = __fmul_rn((float)pos[row], inv);
  double sd, cd;
  sincos((double)angle, &sd, &cd);
  float s = (float)sd, co = (float)cd;
  if (a.attn != 1.0f) s = __fmul_rn(s, a.attn), co = __fmul_rn(co, a.attn);
  const int i0 = a.layout == SERVD_ROPE_INTERLEAVED ? 2 * i : i;
  const int i1 = a.layout == SERVD_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
  for (int hh = h0; hh < h1; hh++) {
    __nv_bfloat16 *h = x + ((long long)row * n_heads + hh) * a.head_dim;
    const float x0 = __bfloat162float(h[i0]), x1 = __bfloat162float(h[i1]);
    h[i0] = __float2bfloat16(x0 * co - x1 * s);
    h[i1] = __float2bfloat16(x0 * s + x1 * co);
  }
}
