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
      if constexpr (sizeof(OutT) == 4) out[(size_t)r * n + col] = v;
      else out[(size_t)r * n + col] = __float2bfloat16(v);
    }
  }
}

// Streaming 16-byte load of weights: read once, so kept out of L1 (where the activations live).
__device__ __forceinline__ uint4 ldg_stream(const uint4 *p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The same product with more loads in flight: KS warps share one output column, each over a
// contiguous 1/KS of k, every lane keeping four 16-byte weight loads in flight; the KS partial sums
// meet in shared memory. Small n (the K/V projections: 1024 rows) then still fills the GPU with
// loads, which one warp per column cannot. 256 threads; KS in {1, 2, 4, 8}. The KS warps of a
// column are consecutive; every thread of the block must call this (it may __syncthreads), with
// col >= n for warps that have no column.
template <int M, typename OutT, int KS>
__device__ __forceinline__ void gemv_split_column(OutT *__restrict__ out, const __nv_bfloat16 *__restrict__ x,
                                                  const __nv_bfloat16 *__restrict__ w, int n, int k, int col) {
  constexpr int WARPS = 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, slice = warp % KS;
  const int chunks = k / 8, per = (chunks + KS - 1) / KS;
  const int c0 = slice * per, c1 = min(chunks, c0 + per);
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; r++) acc[r] = 0.f;
  if (col < n) {
    const uint4 *wrow = reinterpret_cast<const uint4 *>(w + (size_t)col * k);
    int i = c0 + lane;
    for (; i + 96 < c1; i += 128) {
      uint4 wv[4] = {ldg_stream(wrow + i), ldg_stream(wrow + i + 32), ldg_stream(wrow + i + 64),
                     ldg_stream(wrow + i + 96)};
#pragma unroll
      for (int u = 0; u < 4; u++) {
        float f[8];
        bf16x8_to_f32(wv[u], f);
#pragma unroll
        for (int r = 0; r < M; r++) {
          float xa[8];
          bf16x8_to_f32(__ldg(reinterpret_cast<const uint4 *>(x + (size_t)r * k) + i + 32 * u), xa);
#pragma unroll
          for (int j = 0; j < 8; j++) acc[r] += f[j] * xa[j];
        }
      }
    }
    for (; i < c1; i += 32) {
      float f[8];
      bf16x8_to_f32(ldg_stream(wrow + i), f);
#pragma unroll
      for (int r = 0; r < M; r++) {
        float xa[8];
        bf16x8_to_f32(__ldg(reinterpret_cast<const uint4 *>(x + (size_t)r * k) + i), xa);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[r] += f[j] * xa[j];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < M; r++) acc[r] = warp_sum(acc[r]);
  if constexpr (KS == 1) {
    if (lane == 0 && col < n) {
#pragma unroll
      for (int r = 0; r < M; r++) {
        if constexpr (sizeof(OutT) == 4) out[(size_t)r * n + col] = acc[r];
        else out[(size_t)r * n + col] = __float2bfloat16(acc[r]);
      }
    }
  } else {
    __shared__ float part[WARPS][M];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < M; r++) part[warp][r] = acc[r];
    }
    __syncthreads();
    if (slice == 0 && lane < M && col < n) {
      float v = 0.f;
#pragma unroll
      for (int s = 0; s < KS; s++) v += part[warp + s][lane];
      if constexpr (sizeof(OutT) == 4) out[(size_t)lane * n + col] = v;
      else out[(size_t)lane * n + col] = __float2bfloat16(v);
    }
  }
}

template <int M, typename OutT, int KS>
__global__ void __launch_bounds__(256)
    gemv_bf16_split_kernel(OutT *__restrict__ out, const __nv_bfloat16 *__restrict__ x,
                           const __nv_bfloat16 *__restrict__ w, int n, int k) {
  gemv_split_column<M, OutT, KS>(out, x, w, n, k, blockIdx.x * (8 / KS) + threadIdx.x / 32 / KS);
}

// Several weights against the same x in one launch (Q, K and V; gate and up): their columns are laid
// end to end, each warp finds its weight by its column, and computes exactly what the split kernel
// computes for that weight alone.
#define SERVD_GEMV_MAX_SEGMENTS 4
template <typename OutT> struct gemv_segments {
  const __nv_bfloat16 *w[SERVD_GEMV_MAX_SEGMENTS];
  OutT *out[SERVD_GEMV_MAX_SEGMENTS];
  int n[SERVD_GEMV_MAX_SEGMENTS];
  int start[SERVD_GEMV_MAX_SEGMENTS + 1]; /* start[i]: the first column of weight i; start[count]: all */
  int count;
};

template <int M, typename OutT, int KS>
__global__ void __launch_bounds__(256)
    gemv_bf16_many_kernel(const gemv_segments<OutT> sg, const __nv_bfloat16 *__restrict__ x, int k) {
  const int g = blockIdx.x * (8 / KS) + threadIdx.x / 32 / KS;
  int s = 0;
  while (s + 1 < sg.count && g >= sg.start[s + 1]) s++;
  gemv_split_column<M, OutT, KS>(sg.out[s], x, sg.w[s], sg.n[s], k, g - sg.start[s]);
}
