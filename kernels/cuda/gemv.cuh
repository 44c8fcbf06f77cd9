// out (M,n) = x (M,k) @ w^T, w (n,k), for small M (decode): bandwidth bound on w, which is read once.
// One warp per output column; each lane streams 16-byte chunks of the weight row and multiplies
// them against the M activation rows (small, served from L1/L2). k % 8 == 0.
#pragma once
#include "cuda_common.cuh"

template <int M, typename OutT>
__global__ void gemv_bf16_kernel(OutT *__restrict__ out, const __nv_bfloat16 *__restrict__ x,
                                 const __nv_bfloat16 *__restrict__ w, int n, int k) {
  const int warps = blockDim.x / 32;
  const int col = blockIdx.x * warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (col >= n) return;
  const uint4 *wrow = reinterpret_cast<const uint4 *>(w + (size_t)col * k);
  const int chunks = k / 8;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; r++) acc[r] = 0.f;
  // Two chunks in flight per lane keep enough loads outstanding to saturate HBM.
  int i = lane;
  for (; i + 32 < chunks; i += 64) {
    uint4 wa = __ldg(wrow + i), wb = __ldg(wrow + i + 32);
    float fa[8], fb[8];
    bf16x8_to_f32(wa, fa);
    bf16x8_to_f32(wb, fb);
#pragma unroll
    for (int r = 0; r < M; r++) {
      const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)r * k);
      float xa[8], xb[8];
      bf16x8_to_f32(__ldg(xr + i), xa);
      bf16x8_to_f32(__ldg(xr + i + 32), xb);
#pragma unroll
      for (int j = 0; j < 8; j++) acc[r] += fa[j] * xa[j] + fb[j] * xb[j];
    }
  }
  for (; i < chunks; i += 32) {
    float fa[8];
    bf16x8_to_f32(__ldg(wrow + i), fa);
#pragma unroll
    for (int r = 0; r < M; r++) {
      float xa[8];
      bf16x8_to_f32(__ldg(reinterpret_cast<const uint4 *>(x + (size_t)r * k) + i), xa);
#pragma unroll
      for (int j = 0; j < 8; j++) acc[r] += fa[j] * xa[j];
    }
  }
#pragma unroll
  for (int r = 0; r < M; r++) {
    float v = warp_sum(acc[r]);
    if (lane == 0) {
      if constexpr (sizeof(OutT) == 4)
        out[(size_t)r * n + col] = v;
      else
        out[(size_t)r * n + col] = __float2bfloat16(v);
    }
  }
}
